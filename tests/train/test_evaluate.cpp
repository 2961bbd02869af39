// Held-out evaluation of checkpoints (`slm eval`): the same numbers as the trainer's validation, a naive float64
// recount, NVFP4 checkpoints against their dequantized twin and the dense model, and clear errors for bad inputs.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <sstream>

#include "model/model_test_util.h"
#include "slm/data/loader.h"
#include "slm/data/shards.h"
#include "slm/data/tokenizer.h"
#include "slm/io/run_dir.h"
#include "slm/io/safetensors.h"
#include "slm/model/weights.h"
#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_store.h"
#include "slm/quant/quantize_checkpoint.h"
#include "slm/train/checkpoint.h"
#include "slm/train/evaluate.h"
#include "train/train_test_util.h"

namespace slm::test {
namespace {

const char* kTokenizer = "tokenizer/slm-code-512.model";

// Two domains of counting data, a micro hybrid recipe with the 512-id vocabulary (bits per byte from the real
// tokenizer) and a short training run that ends with a checkpoint.
struct EvalFixture : ::testing::Test {
  void SetUp() override {
    single_threaded();
    dir = fresh_dir("eval");
    data = dir + "/shards";
    ::mkdir(data.c_str(), 0755);
    write_counting_shards(data, "count", 512, 64, 11);
    write_counting_shards(data, "stride", 512, 64, 12);
    auto j = micro_hybrid_json();
    j["vocab_size"] = 512;
    recipe = write_recipe(dir, j);
  }
  train::TrainConfig config(const std::string& name, int64_t steps) {
    auto c = micro_config(recipe, data, dir + "/" + name);
    c.tokenizer = source_path(kTokenizer);
    c.steps = steps;
    c.eval_batches = 2;
    c.checkpoint_every = 0;
    return c;
  }
  std::string dir, data, recipe;
  std::ostringstream log;
};

// Mean NLL of the targets, from the logits by a plain float64 log-sum-exp loop.
double naive_mean_nll(const torch::Tensor& logits, const torch::Tensor& targets) {
  auto l = logits.reshape({-1, logits.size(-1)}).to(torch::kDouble).contiguous();
  auto y = targets.reshape({-1});
  auto a = l.accessor<double, 2>();
  double sum = 0;
  for (int64_t i = 0; i < l.size(0); ++i) {
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < l.size(1); ++v) mx = std::max(mx, a[i][v]);
    for (int64_t v = 0; v < l.size(1); ++v) z += std::exp(a[i][v] - mx);
    sum += mx + std::log(z) - a[i][y[i].item<int64_t>()];
  }
  return sum / static_cast<double>(l.size(0));
}

TEST_F(EvalFixture, CheckpointScoresEqualTheTrainersValidation) {
  auto c = config("run", 20);
  train::Trainer t(c, log);
  t.run();
  const auto trainer_scores = t.evaluate();

  train::CheckpointEval req;
  req.checkpoint = c.out;  // the run directory: its latest checkpoint, the run's data, windows and tokenizer
  req.keep_tokens = true;
  auto r = train::evaluate_checkpoint(req);
  EXPECT_EQ(r.step, 20);
  EXPECT_EQ(r.nvfp4_weights, 0);
  EXPECT_EQ(r.windows.batch, c.batch);
  EXPECT_EQ(r.windows.seq_len, c.seq_len);
  EXPECT_EQ(r.windows.batches, c.eval_batches);
  ASSERT_EQ(r.domains.size(), 2u);
  ASSERT_EQ(trainer_scores.size(), 2u);
  for (const auto& [d, lb] : trainer_scores) {
    SCOPED_TRACE(d);
    EXPECT_DOUBLE_EQ(r.domains.at(d).loss, lb.first);
    EXPECT_DOUBLE_EQ(r.domains.at(d).bpb, lb.second);
    EXPECT_EQ(r.domains.at(d).tokens, c.batch * c.seq_len * c.eval_batches);
  }
  // Pooled over the domains by token count.
  const auto& a = r.domains.at("count");
  const auto& b = r.domains.at("stride");
  EXPECT_NEAR(r.all.loss, (a.loss * a.tokens + b.loss * b.tokens) / (a.tokens + b.tokens), 1e-12);
  EXPECT_NEAR(r.all.bpb, (a.loss * a.tokens + b.loss * b.tokens) / std::log(2.0) / (a.bytes + b.bytes), 1e-12);

  // An independent recount on the same windows: the validation loader's first two batches (seed 0), the model
  // loaded from the checkpoint's weights file, NLL by a float64 loop and bytes from the tokenizer.
  auto tok = data::Tokenizer::load(source_path(kTokenizer));
  model::HybridLM m(load_recipe(recipe));
  model::load_weights(m, io::latest_checkpoint(c.out) + "/model.safetensors");
  m.eval();
  torch::NoGradGuard no_grad;
  data::LoaderOptions lo;
  lo.batch_size = c.batch;
  lo.seq_len = c.seq_len;
  lo.seed = 0;
  data::TokenLoader loader({{"count", {data + "/count/validation-00000.slmtok"}, 1.0}}, lo);
  double nll = 0, bytes = 0;
  for (int b = 0; b < 2; ++b) {
    auto batch = loader.next();
    auto y = batch.tokens.narrow(1, 1, c.seq_len);
    // Packed documents are scored each alone: run every document of every row by itself.
    std::vector<torch::Tensor> rows;
    for (int64_t r = 0; r < c.batch; ++r) {
      std::vector<torch::Tensor> parts;
      auto ids = batch.doc_ids[r];
      for (int64_t from = 0; from < c.seq_len;) {
        int64_t to = from + 1;
        while (to < c.seq_len && ids[to].item<int>() == ids[from].item<int>()) ++to;
        parts.push_back(m.forward(batch.tokens.narrow(0, r, 1).narrow(1, from, to - from)).logits);
        from = to;
      }
      rows.push_back(torch::cat(parts, 1));
      // Each window's own NLL, bytes and input ids (what the routed column of slm eval domains reads).
      const size_t w = static_cast<size_t>(b * c.batch + r);
      ASSERT_LT(w, a.window_nll.size());
      double row_bytes = 0;
      for (int64_t i = 0; i < c.seq_len; ++i)
        row_bytes += static_cast<double>(tok.decode({static_cast<uint32_t>(y[r][i].item<int64_t>())}).size());
      const double row_nll = naive_mean_nll(rows.back(), y[r]) * static_cast<double>(c.seq_len);
      EXPECT_NEAR(a.window_nll[w], row_nll, 1e-6 * row_nll) << "window " << w;
      EXPECT_DOUBLE_EQ(a.window_bytes[w], row_bytes) << "window " << w;
      auto inputs = batch.tokens[r].narrow(0, 0, c.seq_len);
      ASSERT_EQ(a.window_tokens[w].size(), static_cast<size_t>(c.seq_len));
      for (int64_t i = 0; i < c.seq_len; ++i) EXPECT_EQ(a.window_tokens[w][i], inputs[i].item<int64_t>());
    }
    nll += naive_mean_nll(torch::cat(rows, 0), y) * static_cast<double>(y.numel());
    auto flat = y.reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i)
      bytes += static_cast<double>(tok.decode({static_cast<uint32_t>(flat[i].item<int64_t>())}).size());
  }
  EXPECT_EQ(a.window_nll.size(), static_cast<size_t>(2 * c.batch));
  EXPECT_NEAR(a.loss, nll / static_cast<double>(a.tokens), 1e-6 * a.loss);
  EXPECT_NEAR(a.bpb, nll / std::log(2.0) / bytes, 1e-6 * a.bpb);
}

TEST_F(EvalFixture, Nvfp4CheckpointScoresLikeItsDequantizedTwinAndCloseToTheDenseModel) {
  auto c = config("run", 60);
  train::Trainer(c, log).run();
  const std::string dense = io::latest_checkpoint(c.out) + "/model.safetensors";
  const std::string q = dir + "/nvfp4.safetensors";
  auto report = nvfp4::quantize_checkpoint(dense, q, load_recipe(recipe), {});
  ASSERT_GT(report.total.quantized, 0);

  // The same quantized values as ordinary dense tensors: what the NVFP4 model must compute, up to float rounding.
  auto file = nvfp4::load_checkpoint(q);
  std::map<std::string, torch::Tensor> twin = file.dense;
  for (const auto& [name, qt] : file.quantized) twin[name] = nvfp4::dequantize(qt, torch::kFloat);
  const std::string twin_path = dir + "/dequantized.safetensors";
  safetensors::save(twin_path, twin, {});

  auto eval = [&](const std::string& checkpoint) {
    train::CheckpointEval req;
    req.checkpoint = checkpoint;
    req.recipe = recipe;
    req.data = data;
    req.tokenizer = source_path(kTokenizer);
    req.batch = 4;
    req.seq_len = 24;
    req.batches = 3;
    return train::evaluate_checkpoint(req);
  };
  auto rd = eval(dense), rq = eval(q), rt = eval(twin_path);
  EXPECT_GT(rq.nvfp4_weights, 0);
  EXPECT_EQ(rt.nvfp4_weights, 0);
  for (const auto& [d, sd] : rd.domains) {
    SCOPED_TRACE(d);
    const auto& sq = rq.domains.at(d);
    EXPECT_NEAR(sq.loss, rt.domains.at(d).loss, 1e-4 * sd.loss);
    EXPECT_NE(sq.loss, sd.loss) << "quantization changed nothing";
    EXPECT_LT(std::abs(sq.loss - sd.loss), 0.01 * sd.loss) << "dense " << sd.loss << ", NVFP4 " << sq.loss;
    EXPECT_LT(sd.loss, std::log(512.0) - 1.0) << "the model has learned something";
  }
}

TEST_F(EvalFixture, Bf16AutocastMovesTheLossSlightly) {
  auto c = config("run", 20);
  train::Trainer(c, log).run();
  train::CheckpointEval req;
  req.checkpoint = c.out;
  auto fp32 = train::evaluate_checkpoint(req);
  req.bf16 = true;
  auto bf16 = train::evaluate_checkpoint(req);
  EXPECT_TRUE(bf16.bf16);
  for (const auto& [d, s] : fp32.domains) {
    SCOPED_TRACE(d);
    EXPECT_NE(bf16.domains.at(d).loss, s.loss) << "autocast changed nothing";
    EXPECT_NEAR(bf16.domains.at(d).loss, s.loss, 0.01 * s.loss);
  }
  // Autocast is off again afterwards: FP32 numbers come back exactly.
  req.bf16 = false;
  EXPECT_EQ(train::evaluate_checkpoint(req).all.loss, fp32.all.loss);
}

TEST_F(EvalFixture, BadInputsAreClearErrors) {
  auto c = config("run", 2);
  train::Trainer(c, log).run();
  auto error = [](const train::CheckpointEval& req) { return error_of([&] { train::evaluate_checkpoint(req); }); };
  auto expect_in = [](const std::string& msg, const std::string& fragment) {
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  };
  train::CheckpointEval req;
  req.checkpoint = dir + "/missing";
  expect_in(error(req), dir + "/missing: no such checkpoint");

  // A weights file does not know its recipe.
  req.checkpoint = io::latest_checkpoint(c.out) + "/model.safetensors";
  req.data = data;
  expect_in(error(req), "--recipe");

  // A recipe of another shape: the loader names the tensor that does not fit.
  auto other = micro_hybrid_json();
  other["vocab_size"] = 512;
  other["d_model"] = 32;
  ::mkdir((dir + "/other").c_str(), 0755);
  req.recipe = write_recipe(dir + "/other", other);
  auto msg = error(req);
  expect_in(msg, "model.safetensors: tensor ");
  expect_in(msg, "shape");

  // The counting shards have train and validation splits only.
  req = {};
  req.checkpoint = c.out;
  req.split = "test";
  msg = error(req);
  expect_in(msg, "test-*.slmtok");
  expect_in(msg, "'test' is missing");

  req.split = "validation";
  req.domains = {"count", "nothing"};
  expect_in(error(req), "domain 'nothing' has no validation");

  // Shards of a larger vocabulary than the recipe's cannot be what it was trained on.
  req.domains = {};
  auto small = micro_hybrid_json();
  ::mkdir((dir + "/small").c_str(), 0755);
  req.recipe = write_recipe(dir + "/small", small);
  expect_in(error(req), "shard vocabulary exceeds the vocab_size 48");
}

TEST_F(EvalFixture, CliPrintsTheTableAndTheSameNumbersAsJson) {
  auto c = config("run", 4);
  train::Trainer(c, log).run();
  train::CheckpointEval req;
  req.checkpoint = c.out;
  auto want = train::evaluate_checkpoint(req);

  auto r = run_slm("eval --checkpoint " + c.out + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["step"].get<int64_t>(), 4);
  EXPECT_EQ(j["nvfp4_weights"].get<int64_t>(), 0);
  for (const auto& [d, s] : want.domains) {
    EXPECT_DOUBLE_EQ(j["domains"][d]["loss"].get<double>(), s.loss) << d;
    EXPECT_DOUBLE_EQ(j["domains"][d]["bpb"].get<double>(), s.bpb) << d;
  }
  r = run_slm("eval --checkpoint " + c.out);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* word : {"count", "stride", "all", "bpb", "step 4"})
    EXPECT_NE(r.out.find(word), std::string::npos) << word << "\n" << r.out;

  r = run_slm("eval --checkpoint " + dir + "/nowhere");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("nowhere: no such checkpoint"), std::string::npos) << r.out;
}

// A request for more batches than a split holds reports what was scored: ceil(windows / batch) per domain, with
// windows = (tokens - 1) / seq_len of the split's shard, and the most of those at the top (JSON too).
TEST_F(EvalFixture, BatchesReportWhatWasScored) {
  auto c = config("run", 2);
  train::Trainer(c, log).run();
  train::CheckpointEval req;
  req.checkpoint = c.out;
  req.batches = 1000;
  auto r = train::evaluate_checkpoint(req);
  int64_t most = 0, sum = 0;
  for (const char* d : {"count", "stride"}) {
    const auto tokens =
        static_cast<int64_t>(data::Shard::open(data + "/" + d + "/validation-00000.slmtok")->token_count());
    const int64_t windows = (tokens - 1) / c.seq_len, want = (windows + c.batch - 1) / c.batch;
    ASSERT_LT(want, 1000) << d;
    EXPECT_EQ(r.domains.at(d).batches, want) << d;
    EXPECT_EQ(r.domains.at(d).tokens, want * c.batch * c.seq_len) << d;
    most = std::max(most, want);
    sum += want;
  }
  EXPECT_EQ(r.windows.batches, most);
  EXPECT_EQ(r.all.batches, sum);
  auto cli = run_slm("eval --checkpoint " + c.out + " --batches 1000 --json");
  ASSERT_EQ(cli.code, 0) << cli.out;
  auto j = nlohmann::json::parse(cli.out);
  EXPECT_EQ(j["batches"].get<int64_t>(), most);
  EXPECT_EQ(j["domains"]["count"]["batches"].get<int64_t>(), r.domains.at("count").batches);
  EXPECT_EQ(j["all"]["batches"].get<int64_t>(), sum);
}

// The rule slm eval and slm generate share: the run's own setting first ("none" included), else the tokenizer the
// shards' sidecar names when tokenizer/<name> is readable from the working directory, else "".
TEST_F(EvalFixture, RunTokenizerPrefersTheRunsSettingThenTheShards) {
  const nlohmann::json unset = nlohmann::json::object();
  EXPECT_EQ(train::run_tokenizer({{"tokenizer", "a.model"}}, data, "train"), "a.model");
  EXPECT_EQ(train::run_tokenizer({{"tokenizer", "none"}}, data, "train"), "none");
  EXPECT_EQ(train::run_tokenizer(unset, data, "train"), "");  // these shards name no tokenizer
  EXPECT_EQ(train::run_tokenizer(unset, dir + "/nowhere", "train"), "");

  const std::string named = dir + "/named";
  write_file(named + "/tokenizer/fake.model", "not read, only looked up");
  ::mkdir((named + "/shards").c_str(), 0755);
  ::mkdir((named + "/shards/c").c_str(), 0755);
  {
    data::ShardWriter w(named + "/shards/c/validation-00000.slmtok", 512, {{"tokenizer", "fake.model"}});
    w.add_document(std::vector<uint32_t>{2, 5, 6, 7}, {"synthetic", "doc0", "none", "c"});
    w.close();
  }
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(::chdir(named.c_str()), 0);
  EXPECT_EQ(train::run_tokenizer(unset, "shards", "validation"), "tokenizer/fake.model");
  EXPECT_EQ(train::run_tokenizer({{"tokenizer", ""}}, "shards", "validation"), "tokenizer/fake.model");
  EXPECT_EQ(train::run_tokenizer(unset, "shards", "train"), "");  // no train split here
  EXPECT_EQ(train::run_tokenizer({{"tokenizer", "b.model"}}, "shards", "validation"), "b.model");
  ::unlink("tokenizer/fake.model");
  EXPECT_EQ(train::run_tokenizer(unset, "shards", "validation"), "");  // named, but not there
  ASSERT_EQ(::chdir(cwd), 0);
}

// Documents of the given lengths (ids 4, 5, ...) in one shard at `path`.
void write_documents(const std::string& path, const std::vector<int>& lengths, const std::string& tokenizer = "") {
  data::ShardWriter w(path, 48,
                      tokenizer.empty() ? nlohmann::json::object() : nlohmann::json{{"tokenizer", tokenizer}});
  for (size_t d = 0; d < lengths.size(); ++d)
    w.add_document(std::vector<uint32_t>(static_cast<size_t>(lengths[d]), 4 + d % 40),
                   {"synthetic", "doc" + std::to_string(d), "none", "x"});
  w.close();
}

// The held-out tail, by hand: want = max(ceil(1% of the tokens), one window); it starts at the last document start
// that leaves `want`, unless that holds out more than twice `want`.
TEST(HeldOutStart, WholeDocumentsAtTheEndAtLeastAWindow) {
  const std::string dir = fresh_dir("h");
  write_documents(dir + "/a-00000.slmtok", std::vector<int>(50, 10));
  write_documents(dir + "/a-00001.slmtok", std::vector<int>(50, 10));
  const std::vector<std::string> two = {dir + "/a-00000.slmtok", dir + "/a-00001.slmtok"};  // 1000 tokens
  EXPECT_EQ(train::held_out_start(two, 11), 980u);  // want 11: latest start 989, in the document at 980 (20 <= 22)
  EXPECT_EQ(train::held_out_start(two, 5), 990u);   // want 10 (1%): 990 starts a document
  // want 21 (a window past 1%): latest start 979, in the document at 970 (30 <= 42).
  EXPECT_EQ(train::held_out_start(two, 21), 970u);
  // want 31: latest start 969, in the document at 960 (40 <= 62).
  EXPECT_EQ(train::held_out_start(two, 31), 960u);

  write_documents(dir + "/long.slmtok", [] {
    std::vector<int> l(9, 10);
    l.push_back(910);  // the last document would hold out 910 tokens: cut inside it instead
    return l;
  }());
  EXPECT_EQ(train::held_out_start({dir + "/long.slmtok"}, 11), 989u);

  write_documents(dir + "/big.slmtok", std::vector<int>(1000, 10));  // 10,000 tokens: 1% = 100
  EXPECT_EQ(train::held_out_start({dir + "/big.slmtok"}, 11), 9900u);

  write_documents(dir + "/small.slmtok", {7, 7, 7});  // 21 tokens: no room for two windows of 11
  EXPECT_EQ(train::held_out_start({dir + "/small.slmtok"}, 11), 0u);
  write_documents(dir + "/two.slmtok", {11, 11});  // exactly two windows
  EXPECT_EQ(train::held_out_start({dir + "/two.slmtok"}, 11), 11u);
}

// Plain shards (slm data shard of files) are one domain named after their prefix, whose training shards lend their
// tail to validation; a domain directory with its own validation split keeps it; the layouts mix.
TEST(SplitSources, PlainShardsAreADomainWithAHeldOutTail) {
  const std::string dir = fresh_dir("s");
  write_documents(dir + "/data-00000.slmtok", std::vector<int>(60, 10));
  write_documents(dir + "/data-00001.slmtok", std::vector<int>(60, 10));
  ::mkdir((dir + "/cpp").c_str(), 0755);
  write_documents(dir + "/cpp/train-00000.slmtok", std::vector<int>(30, 10));
  write_documents(dir + "/cpp/validation-00000.slmtok", std::vector<int>(3, 10));
  write_file(dir + "/report.json", "{}");  // not a shard: ignored

  const auto domains = train::find_domains(dir, {});
  ASSERT_EQ(domains.size(), 2u);
  EXPECT_EQ(domains[0].name, "cpp");
  EXPECT_EQ(domains[1].name, "data");
  EXPECT_EQ(domains[1].splits.at("train"),
            (std::vector<std::string>{dir + "/data-00000.slmtok", dir + "/data-00001.slmtok"}));

  const auto train = train::split_sources(dir, "train", {}, 17);
  const auto val = train::split_sources(dir, "validation", {}, 17);
  ASSERT_EQ(train.size(), 2u);
  ASSERT_EQ(val.size(), 2u);
  EXPECT_EQ(train[0].begin, 0u);  // cpp: its own validation shards
  EXPECT_EQ(train[0].end, data::ShardSource::kToEnd);
  EXPECT_EQ(val[0].shards, (std::vector<std::string>{dir + "/cpp/validation-00000.slmtok"}));
  // data: 1200 tokens, want 17: latest start 1183, in the document at 1180.
  EXPECT_EQ(train[1].shards, domains[1].splits.at("train"));
  EXPECT_EQ(train[1].begin, 0u);
  EXPECT_EQ(train[1].end, 1180u);
  EXPECT_EQ(val[1].shards, domains[1].splits.at("train"));
  EXPECT_EQ(val[1].begin, 1180u);
  EXPECT_EQ(val[1].end, data::ShardSource::kToEnd);
  EXPECT_TRUE(train::split_sources(dir, "test", {"data"}, 17).empty()) << "plain shards have no test split";
  EXPECT_EQ(train::split_sources(dir, "train", {"data"}, 17).size(), 1u);

  ::mkdir((dir + "/data").c_str(), 0755);
  write_documents(dir + "/data/train-00000.slmtok", {10});
  auto e = error_of([&] { train::find_domains(dir, {}); });
  EXPECT_NE(e.find(dir + "/data-00000.slmtok and the domain directory " + dir + "/data would both be domain 'data'"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace slm::test
