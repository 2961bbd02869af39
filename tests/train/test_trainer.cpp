#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <sstream>
#include <thread>

#include "model/model_test_util.h"
#include "slm/data/loader.h"
#include "slm/data/tokenizer.h"
#include "slm/io/run_dir.h"
#include "slm/model/weights.h"
#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_store.h"
#include "slm/quant/quantize_checkpoint.h"
#include "slm/recipe/recipe.h"
#include "slm/train/checkpoint.h"
#include "slm/train/evaluate.h"
#include "slm/train/flops.h"
#include "slm/train/plot.h"
#include "slm/util/files.h"
#include "train/train_test_util.h"

namespace slm::test {
namespace {

struct TrainerFixture : ::testing::Test {
  void SetUp() override {
    single_threaded();
    dir = fresh_dir("run");
    data = dir + "/shards";
    ::mkdir(data.c_str(), 0755);
    write_counting_shards(data, "count", 48, 64, 11);
    recipe = write_recipe(dir, micro_hybrid_json());
  }
  train::TrainConfig config(const std::string& name) { return micro_config(recipe, data, dir + "/" + name); }
  std::string dir, data, recipe;
  std::ostringstream log;
};

TEST_F(TrainerFixture, LossFallsBelowHalfOfItsStart) {
  auto c = config("learn");
  c.steps = 150;
  c.checkpoint_every = 0;
  c.log_every = 1;
  train::Trainer t(c, log);
  t.run();
  auto losses = train_losses(c.out);
  ASSERT_EQ(losses.size(), 150u);
  EXPECT_FALSE(read_metrics(c.out).front().contains("indexer_grad_norm")) << "no DSA, no indexer norm";
  const double first = losses.begin()->second;
  double last = 0;
  for (int64_t s = 141; s <= 150; ++s) last += losses.at(s) / 10;
  EXPECT_NEAR(first, std::log(48.0), 0.3) << "a fresh model predicts nearly uniformly";
  EXPECT_LT(last, 0.5 * first) << log.str();
}

TEST_F(TrainerFixture, ResumeIsBitwiseIdenticalToAnUninterruptedRun) {
  auto a = config("a");
  train::Trainer(a, log).run();

  auto b = config("b");
  {
    train::Trainer first(b, log);
    EXPECT_EQ(first.run(nullptr, 7), 7);
  }
  auto resumed = train::Trainer::resume(b.out, nlohmann::json::object(), log);
  EXPECT_EQ(resumed.step(), 7);
  resumed.run();

  auto la = train_losses(a.out), lb = train_losses(b.out);
  ASSERT_EQ(la.size(), 12u);
  ASSERT_EQ(lb.size(), 12u);
  for (const auto& [step, loss] : la) EXPECT_EQ(lb.at(step), loss) << "step " << step;
  auto wa = safetensors::load(io::latest_checkpoint(a.out) + "/model.safetensors").tensors;
  auto wb = safetensors::load(io::latest_checkpoint(b.out) + "/model.safetensors").tensors;
  for (const auto& [name, t] : wa) EXPECT_TRUE(torch::equal(t, wb.at(name))) << name;
}

TEST_F(TrainerFixture, KeepsTheLastCheckpointsAndPointsLatestAtTheNewest) {
  auto c = config("keep");
  train::Trainer(c, log).run();
  auto all = train::list_checkpoints(c.out);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], c.out + "/ckpt-00000008");
  EXPECT_EQ(all[1], c.out + "/ckpt-00000012");
  EXPECT_EQ(io::latest_checkpoint(c.out), all[1]);
  auto meta = train::load_checkpoint(c.out).meta;
  EXPECT_EQ(meta["step"], 12);
  EXPECT_EQ(meta["tokens_seen"], 12 * 4 * 24);
}

TEST_F(TrainerFixture, RefusesToStartOverAnExistingRun) {
  auto c = config("twice");
  c.steps = 2;
  train::Trainer(c, log).run();
  try {
    train::Trainer again(c, log);
    FAIL() << "a second fresh run into the same directory must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
}

// --init: a new run starts from another run's weights with a fresh optimizer, schedule and data order (a specialist
// branched from a shared base).
TEST_F(TrainerFixture, InitStartsFromAnotherRunsWeightsWithAFreshOptimizer) {
  auto base = config("base");
  base.steps = 40;
  base.checkpoint_every = 0;
  train::Trainer(base, log).run();
  const auto base_weights = safetensors::load(io::latest_checkpoint(base.out) + "/model.safetensors").tensors;

  auto branch = config("branch");
  branch.init = base.out;
  branch.steps = 3;
  train::Trainer t(branch, log);
  EXPECT_EQ(t.step(), 0);
  const std::string start = t.save();  // the state before any step
  auto start_weights = safetensors::load(start + "/model.safetensors").tensors;
  ASSERT_EQ(start_weights.size(), base_weights.size());
  for (const auto& [name, w] : base_weights) EXPECT_TRUE(torch::equal(w, start_weights.at(name))) << name;
  auto meta = train::load_checkpoint(start).meta;
  EXPECT_EQ(meta["tokens_seen"], 0);
  for (const auto& [name, m] : safetensors::load(start + "/optimizer.safetensors").tensors)
    if (name.rfind("rng/", 0) != 0) {
      EXPECT_EQ(m.abs().max().item<double>(), 0.0) << name << " must start at zero";
    }
  EXPECT_NE(log.str().find("weights: initialised from " + io::latest_checkpoint(base.out)), std::string::npos);
  t.run();
  // The base had learnt the counting data: the branch's first loss is far below a fresh model's log(48).
  EXPECT_LT(train_losses(branch.out).at(1), 0.6 * std::log(48.0));
  EXPECT_EQ(nlohmann::json::parse(read_file(branch.out + "/config.json"))["init"], base.out);
}

// --init from a weights file, here slm quantize's NVFP4 output: the run starts from the dequantized weights.
TEST_F(TrainerFixture, InitFromAnNvfp4WeightsFileStartsFromItsDequantizedWeights) {
  auto base = config("base");
  base.steps = 2;
  train::Trainer(base, log).run();
  const std::string q = dir + "/base.nvfp4.safetensors";
  nvfp4::quantize_checkpoint(io::latest_checkpoint(base.out) + "/model.safetensors", q, load_recipe(recipe), {});
  const auto file = nvfp4::load_checkpoint(q);
  ASSERT_GT(file.quantized.size(), 3u);

  auto branch = config("branch");
  branch.init = q;
  train::Trainer t(branch, log);
  auto start = safetensors::load(t.save() + "/model.safetensors").tensors;
  for (const auto& [name, w] : file.dense) EXPECT_TRUE(torch::equal(w.to(torch::kFloat), start.at(name))) << name;
  for (const auto& [name, qt] : file.quantized)
    EXPECT_TRUE(torch::equal(nvfp4::dequantize(qt, torch::kFloat), start.at(name))) << name;
  EXPECT_EQ(start.size(), file.dense.size() + file.quantized.size());
  EXPECT_NE(log.str().find("weights: initialised from " + q + " (NVFP4 tensors dequantized)"), std::string::npos);
}

TEST_F(TrainerFixture, InitFromAnotherRecipeNamesTheTensor) {
  auto base = config("base");
  base.steps = 1;
  train::Trainer(base, log).run();
  auto other = micro_hybrid_json();
  other["d_model"] = 24;
  auto branch = config("branch");
  ::mkdir((dir + "/other").c_str(), 0755);
  branch.recipe = write_recipe(dir + "/other", other);
  branch.init = base.out;
  try {
    train::Trainer t(branch, log);
    FAIL() << "weights of another shape were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embed.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("wrong shape"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(io::latest_checkpoint(branch.out).empty()) << "a refused run writes no checkpoint";
}

// Damaged checkpoints: the error names the file (and the tensor), and nothing in the run directory changes.
struct DamagedCheckpoint : TrainerFixture {
  void SetUp() override {
    TrainerFixture::SetUp();
    auto c = config("damaged");
    c.steps = 4;
    train::Trainer(c, log).run();
    run = c.out;
    ckpt = io::latest_checkpoint(run);
  }
  std::map<std::string, std::string> snapshot() {
    std::map<std::string, std::string> out;
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "meta.json"})
      out[f] = read_file(ckpt + "/" + f);
    out["metrics.jsonl"] = read_file(run + "/metrics.jsonl");
    out["latest"] = read_file(run + "/latest");
    return out;
  }
  void expect_resume_error(std::initializer_list<std::string> fragments) {
    auto before = snapshot();
    try {
      train::Trainer::resume(run, nlohmann::json::object(), log);
      ADD_FAILURE() << "resume accepted a damaged checkpoint";
    } catch (const Error& e) {
      for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
    EXPECT_EQ(snapshot(), before) << "a failed resume must not change the run directory";
  }
  std::string run, ckpt;
};

TEST_F(DamagedCheckpoint, TruncatedWeightsNameTheFile) {
  auto bytes = read_file(ckpt + "/model.safetensors");
  write_file(ckpt + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
  expect_resume_error({"model.safetensors"});
}

TEST_F(DamagedCheckpoint, FlippedByteNamesTheTensor) {
  auto bytes = read_file(ckpt + "/optimizer.safetensors");
  auto header = safetensors::read_header(ckpt + "/optimizer.safetensors");
  const auto& victim = header.tensors.front();
  bytes[header.data_start + victim.begin] ^= 0x40;
  write_file(ckpt + "/optimizer.safetensors", bytes);
  expect_resume_error({"optimizer.safetensors", victim.name, "corrupt"});
}

TEST_F(DamagedCheckpoint, WrongRecipeNamesTheTensor) {
  auto meta = nlohmann::json::parse(read_file(ckpt + "/meta.json"));
  auto other = micro_hybrid_json();
  other["d_model"] = 24;
  meta["recipe_text"] = other.dump();
  write_file(ckpt + "/meta.json", meta.dump());
  expect_resume_error({"model.safetensors", "embed.weight", "wrong shape"});
}

TEST_F(DamagedCheckpoint, CorruptMetadataNamesTheFile) {
  write_file(ckpt + "/meta.json", "{\"step\": 4, \"checks");
  expect_resume_error({"meta.json"});
}

TEST_F(TrainerFixture, NonFiniteStepsAreSkippedThenTrainingStops) {
  auto c = config("nan");
  c.optim.matrix_lr = 1e30;
  c.optim.embed_lr = 1e30;
  c.grad_clip = 0;
  c.max_bad_steps = 3;
  c.checkpoint_every = 0;
  train::Trainer t(c, log);
  try {
    t.run();
    FAIL() << "training with an exploding LR must stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 consecutive steps"), std::string::npos) << e.what();
  }
  int skipped = 0;
  for (const auto& j : read_metrics(c.out)) skipped += j.value("skipped", false) ? 1 : 0;
  EXPECT_EQ(skipped, 3);
  EXPECT_NE(log.str().find("step skipped"), std::string::npos);
}

TEST_F(TrainerFixture, BitsPerByteIsNatsPerTokenOverBytesPerToken) {
  // With a real tokenizer each id stands for a known number of bytes; bpb = sum NLL / ln 2 / sum bytes over the
  // same target tokens. Every id of the counting data decodes to a fixed byte count under the 512-id tokenizer.
  auto tok = data::Tokenizer::load(source_path("tokenizer/slm-code-512.model"));
  auto c = config("bpb");
  c.tokenizer = source_path("tokenizer/slm-code-512.model");
  auto j = micro_hybrid_json();
  j["vocab_size"] = 512;
  c.recipe = write_recipe(dir, j);
  train::Trainer t(c, log);
  auto res = t.evaluate();
  ASSERT_EQ(res.size(), 1u);
  const auto [loss, bpb] = res.at("count");
  // The same windows, counted independently: the validation loader with seed 0.
  data::LoaderOptions lo;
  lo.batch_size = c.batch;
  lo.seq_len = c.seq_len;
  lo.seed = 0;
  data::TokenLoader loader({{"count", {data + "/count/validation-00000.slmtok"}, 1.0}}, lo);
  auto batch = loader.next();
  double bytes = 0;
  auto targets = batch.tokens.narrow(1, 1, c.seq_len).reshape({-1});
  for (int64_t i = 0; i < targets.numel(); ++i)
    bytes += static_cast<double>(tok.decode({static_cast<uint32_t>(targets[i].item<int64_t>())}).size());
  ASSERT_GT(bytes, 0);
  EXPECT_NEAR(bpb, loss * static_cast<double>(targets.numel()) / std::log(2.0) / bytes, 1e-9);
}

TEST_F(TrainerFixture, DsaWarmupTrainsOnlyTheIndexers) {
  auto j = micro_hybrid_json();
  j["attention"]["dsa_enabled"] = true;
  j["attention"]["dsa_local_window"] = 4;
  j["attention"]["dsa_indexer_heads"] = 2;
  j["attention"]["dsa_indexer_dim"] = 4;
  auto c = config("dsa");
  c.recipe = write_recipe(dir, j);
  c.steps = 3;
  c.dsa_warmup_steps = 2;
  c.checkpoint_every = 0;
  train::Trainer t(c, log);
  auto initial = train::load_checkpoint(t.save()).model;
  t.run(nullptr, 2);
  auto warm = train::load_checkpoint(c.out).model;
  t.run();
  auto trained = train::load_checkpoint(c.out).model;
  int indexer_tensors = 0;
  for (const auto& [name, w] : initial) {
    if (name.find("balancing") != std::string::npos || name.find("expert_bias") != std::string::npos) continue;
    const bool is_indexer = name.find(".indexer.") != std::string::npos;
    indexer_tensors += is_indexer;
    if (is_indexer) {
      if (name.find("norm") == std::string::npos) {
        EXPECT_FALSE(torch::equal(w, warm.at(name))) << name;
      }
    } else {
      EXPECT_TRUE(torch::equal(w, warm.at(name))) << name << " changed during the indexer warm-up";
    }
  }
  EXPECT_GT(indexer_tensors, 0);
  EXPECT_FALSE(torch::equal(warm.at("layers.0.attn.wq.weight"), trained.at("layers.0.attn.wq.weight")))
      << "after the warm-up the whole model trains";
  // The LM and the indexers are clipped and logged apart: in the warm-up the LM has no gradient at all.
  int steps = 0;
  for (const auto& m : read_metrics(c.out)) {
    if (!m.contains("loss")) continue;  // evaluation lines
    ++steps;
    ASSERT_TRUE(m.contains("indexer_grad_norm")) << m.dump();
    EXPECT_GT(m["indexer_grad_norm"].get<double>(), 0) << m.dump();
    if (m["step"] <= 2)
      EXPECT_EQ(m["grad_norm"].get<double>(), 0) << m.dump();
    else
      EXPECT_GT(m["grad_norm"].get<double>(), 0) << m.dump();
  }
  EXPECT_EQ(steps, 3);
}

// Issue 5's acceptance: the tiny recipe with every feature on (DSA, MLA, Engram, mHC, MTP) takes 20 optimizer steps
// without a non-finite loss, and its trained weights decode exactly like the full forward.
TEST_F(TrainerFixture, EveryFeatureRecipeTrainsAndDecodes) {
  auto c = config("full");
  c.recipe = source_path("recipes/tiny-full.json");
  c.steps = 20;
  c.batch = 2;
  c.seq_len = 32;
  c.checkpoint_every = 0;
  c.dsa_warmup_steps = 5;
  train::Trainer(c, log).run();
  auto losses = train_losses(c.out);
  ASSERT_EQ(losses.size(), 20u);
  for (const auto& [step, loss] : losses) EXPECT_TRUE(std::isfinite(loss)) << "step " << step;
  for (const auto& j : read_metrics(c.out)) EXPECT_FALSE(j.value("skipped", false)) << j.dump();

  model::HybridLM m(load_recipe(c.recipe));
  model::load_weights(m, model::weights_path(io::latest_checkpoint(c.out)));
  m.eval();
  auto tokens = random_tokens(1, 24, 48, 3);
  torch::NoGradGuard no_grad;
  auto full = m.forward(tokens).logits;
  auto state = m.new_state(1, 24);
  auto pre = m.prefill(tokens.narrow(1, 0, 16), state);
  std::vector<torch::Tensor> steps = {pre};
  for (int64_t t = 16; t < 24; ++t) steps.push_back(m.decode(tokens.select(1, t), state).unsqueeze(1));
  EXPECT_LT(max_abs_diff(torch::cat(steps, 1), full), 1e-4);
}

TEST(Flops, HandCountedForAttentionAndDenseLayers) {
  auto j = nlohmann::json::parse(R"({
    "name": "f", "vocab_size": 100, "d_model": 8, "depth": 2, "pattern": "AF", "seq_len": 16,
    "attention": {"heads": 2, "kv_heads": 1, "head_dim": 4, "qk_norm": false},
    "mlp": {"hidden": 12}
  })");
  auto r = parse(j);
  auto f = train::flops_per_token(r, make_plan(r), 16);
  // Matmul weights: wq 8x8, wk 4x8, wv 4x8, wo 8x8, w13 24x8, w2 8x12, lm_head 100x8.
  const double weights = 64 + 32 + 32 + 64 + 192 + 96 + 800;
  EXPECT_DOUBLE_EQ(f.matmul, 6 * weights);
  // One full-context layer over 16 tokens: mean keys (16 + 1) / 2, q.k and p.v over 4 dims for 2 heads.
  EXPECT_DOUBLE_EQ(f.attention, 3 * 2 * 2 * (4 + 4) * 8.5);
  EXPECT_DOUBLE_EQ(f.scan, 0);
}

TEST(Flops, HandCountedForM2rnn) {
  auto j = nlohmann::json::parse(R"({
    "name": "f", "vocab_size": 100, "d_model": 8, "depth": 1, "pattern": "R", "seq_len": 16,
    "m2rnn": {"heads": 2, "k_head_dim": 4, "v_head_dim": 3}
  })");
  auto r = parse(j);
  // Per head and token: H W is a 4x3 by 3x3 product (36 multiply-adds), k v^T and the readout 12 each; x2 FLOPs
  // per multiply-add, 2 heads, x3 for forward + backward.
  EXPECT_DOUBLE_EQ(train::flops_per_token(r, make_plan(r), 16).scan, 3.0 * 2 * 2 * (36 + 12 + 12));
}

TEST_F(TrainerFixture, ProfileStepsWriteASummaryAndATrace) {
  auto c = config("profile");
  c.steps = 5;
  c.eval_every = 0;
  c.profile_steps = 2;  // steps 3 and 4, after two warm-up steps
  train::Trainer(c, log).run();
  const std::string summary = read_file(c.out + "/profile/summary.txt");
  EXPECT_NE(summary.find("profile of 2 step(s)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("aten::"), std::string::npos) << summary;
  EXPECT_GT(read_file(c.out + "/profile/trace.json").size(), 100u);
  EXPECT_NE(log.str().find("profile of 2 step(s)"), std::string::npos);
}

TEST_F(TrainerFixture, PlotWritesPngCurves) {
  auto c = config("plot");
  c.steps = 4;
  c.eval_every = 2;
  train::Trainer(c, log).run();
  auto files = train::plot_run(c.out);
  ASSERT_EQ(files.size(), 2u);  // loss and lr (no tokenizer: no bits per byte)
  for (const auto& f : files) {
    auto png = read_file(f);
    ASSERT_GT(png.size(), 8u) << f;
    EXPECT_EQ(png.substr(1, 3), "PNG") << f;
  }
  try {
    train::plot_run(dir + "/missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl"), std::string::npos);
  }
}

// Runs of different speed compare at equal time: the x value of each loss is the minutes spent in training steps so
// far, each record's new tokens over its tokens/s (hand-computed below), with evaluation lines ignored.
TEST_F(TrainerFixture, PlotComparesRunsAgainstTrainingMinutes) {
  make_dirs(dir + "/fast");
  make_dirs(dir + "/slow");
  write_file_atomic(dir + "/fast/metrics.jsonl",
                    "{\"step\":1,\"loss\":9.0,\"tokens\":600,\"tokens_per_s\":20}\n"
                    "{\"step\":1,\"eval\":{\"cpp\":{\"loss\":8.5}}}\n"
                    "{\"step\":3,\"loss\":7.0,\"tokens\":1800,\"tokens_per_s\":10}\n");
  write_file_atomic(dir + "/slow/metrics.jsonl", "{\"step\":1,\"loss\":9.5,\"tokens\":600,\"tokens_per_s\":5}\n");
  const auto png = train::plot_runs_by_time({dir + "/fast", dir + "/slow/"}, dir + "/cmp.png");
  EXPECT_EQ(read_file(png).substr(1, 3), "PNG");
  // fast: 600 / 20 = 30 s = 0.5 min, then (1800 - 600) / 10 = 120 s more: 2.5 min. slow: 600 / 5 = 120 s = 2 min.
  EXPECT_EQ(read_file(dir + "/cmp.png.plot/loss-fast.dat"), "0.5 9\n2.5 7\n");
  EXPECT_EQ(read_file(dir + "/cmp.png.plot/loss-slow.dat"), "2 9.5\n");
  // Two runs of the same directory name stay two lines: the second is named by its whole path.
  make_dirs(dir + "/again/fast");
  write_file_atomic(dir + "/again/fast/metrics.jsonl",
                    "{\"step\":1,\"loss\":8.0,\"tokens\":100,\"tokens_per_s\":100}\n");
  train::plot_runs_by_time({dir + "/fast", dir + "/again/fast"}, dir + "/same.png");
  EXPECT_EQ(read_file(dir + "/same.png.plot/loss-fast.dat"), "0.5 9\n2.5 7\n");
  const auto script = read_file(dir + "/same.png.plot/loss.gp");
  EXPECT_NE(script.find("title 'fast'"), std::string::npos) << script;
  EXPECT_NE(script.find("title '" + dir + "/again/fast'"), std::string::npos) << script;
  make_dirs(dir + "/empty");
  write_file_atomic(dir + "/empty/metrics.jsonl", "{\"step\":1,\"eval\":{}}\n");
  try {
    train::plot_runs_by_time({dir + "/fast", dir + "/empty"}, dir + "/cmp2.png");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no training steps"), std::string::npos) << e.what();
  }
}

// The CLI: a run killed with SIGKILL between checkpoints and resumed gives the same losses as an uninterrupted run;
// SIGTERM saves a checkpoint and exits with 128 + 15.
struct TrainCli : TrainerFixture {
  std::string args(const std::string& out, int steps) {
    return "train --recipe " + recipe + " --data " + data + " --out " + out + " --steps " + std::to_string(steps) +
           " --batch 4 --seq-len 24 --seed 7 --warmup 2 --eval-every 0 --checkpoint-every 3 --keep-last 3 --threads 1";
  }
  // Starts slm in the background; returns its pid.
  pid_t spawn(const std::string& a) {
    pid_t pid = fork();
    if (pid == 0) {
      const std::string cmd = "exec " + std::string(SLM_BINARY) + " " + a + " >/dev/null 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }
  // The step of the run's latest checkpoint ("step-00000006" in <run>/latest); 0 when it has none yet.
  static int latest_step(const std::string& run) {
    const std::string latest = read_file(run + "/latest");  // the tests' read_file: "" while there is none
    return latest.size() >= 13 ? std::stoi(latest.substr(5, 8)) : 0;
  }
  // Waits (up to 60 s) until the run's latest checkpoint is at least `step`; false when the process ended first.
  // Polls every 2 ms, so that a kill right after it lands well before the run's end.
  bool wait_for_checkpoint(const std::string& run, int step, pid_t pid) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (latest_step(run) >= step) return true;
      if (waitpid(pid, nullptr, WNOHANG) == pid) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
};

TEST_F(TrainCli, SigkillThenResumeMatchesAnUninterruptedRun) {
  const std::string a = dir + "/cli-a", b = dir + "/cli-b";
  ASSERT_EQ(run_slm(args(a, 40)).code, 0);
  pid_t pid = spawn(args(b, 40));
  ASSERT_TRUE(wait_for_checkpoint(b, 6, pid)) << "the background run never reached its second checkpoint";
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  // The kill interrupted the run: slm died of SIGKILL (a run that had finished would have exited 0), and its
  // latest checkpoint is one of the periodic ones, short of the 40-step end.
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the run was not killed by SIGKILL (wait status " << status << "): it ended before the kill";
  const int killed_at = latest_step(b);
  EXPECT_GE(killed_at, 6);
  EXPECT_LT(killed_at, 40);
  EXPECT_EQ(killed_at % 3, 0) << "not a --checkpoint-every 3 checkpoint";
  auto r = run_slm("train --resume " + b + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("at step " + std::to_string(killed_at) + " of 40"), std::string::npos)
      << "the resumed run must continue from the checkpoint the kill left: " << r.out;
  EXPECT_EQ(latest_step(b), 40);
  auto la = train_losses(a), lb = train_losses(b);
  ASSERT_EQ(la.size(), 40u);
  ASSERT_EQ(lb.size(), 40u);
  for (const auto& [step, loss] : la) EXPECT_EQ(lb.at(step), loss) << "step " << step;
}

TEST_F(TrainCli, SigtermSavesACheckpointAndExits) {
  const std::string run = dir + "/cli-term";
  pid_t pid = spawn(args(run, 100000));
  ASSERT_TRUE(wait_for_checkpoint(run, 3, pid));
  ::kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  auto meta = train::load_checkpoint(run).meta;
  auto losses = train_losses(run);
  EXPECT_EQ(meta["step"].get<int64_t>(), losses.rbegin()->first) << "the stop checkpoint holds the last step taken";
}

TEST_F(TrainCli, BadFlagsAreClearErrors) {
  auto r = run_slm("train --recipe " + recipe + " --data " + dir + "/nowhere --out " + dir + "/x --steps 2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("nowhere"), std::string::npos) << r.out;
  r = run_slm("train --resume " + dir + "/nothing-here");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("nothing-here"), std::string::npos) << r.out;
  r = run_slm("train --recipe " + recipe + " --data " + data + " --out " + dir + "/y --steps 2 --optim bogus=1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("bogus"), std::string::npos) << r.out;
}

// Plain shards (slm data shard of files: <dir>/data-NNNNN.slmtok) train as one domain "data"; the log says how
// much of them is held out, validation reads exactly that tail, and the loss falls.
TEST_F(TrainerFixture, PlainShardsTrainWithAHeldOutTail) {
  const std::string plain = dir + "/plain";
  write_counting_shards(dir, "tmp", 48, 64, 5);  // <dir>/tmp/{train,validation}-00000.slmtok
  ::mkdir(plain.c_str(), 0755);
  ASSERT_EQ(::rename((dir + "/tmp/train-00000.slmtok").c_str(), (plain + "/data-00000.slmtok").c_str()), 0);
  ASSERT_EQ(::rename((dir + "/tmp/train-00000.slmtok.json").c_str(), (plain + "/data-00000.slmtok.json").c_str()), 0);
  const auto shard = data::Shard::open(plain + "/data-00000.slmtok");
  const uint64_t total = shard->token_count(), cut = train::held_out_start({shard->path()}, 25);
  ASSERT_GT(cut, 0u);

  auto c = micro_config(recipe, plain, dir + "/plain-run");
  c.steps = 40;
  c.eval_every = 40;
  c.checkpoint_every = 0;
  train::Trainer t(c, log);
  char pct[16];
  std::snprintf(pct, sizeof pct, "%.1f%%", 100.0 * static_cast<double>(total - cut) / static_cast<double>(total));
  EXPECT_NE(log.str().find("data: domain 'data' has no validation split: its last " + std::to_string(total - cut) +
                           " of " + std::to_string(total) + " tokens (" + pct + ") are held out for validation"),
            std::string::npos)
      << log.str();
  t.run();
  auto losses = train_losses(c.out);
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_LT(losses.at(40), losses.at(1)) << log.str();

  // The validation loss the trainer logged is the model's loss on the held-out tail (seed-0 windows, as evaluate).
  double logged = 0;
  for (const auto& j : read_metrics(c.out))
    if (j.contains("eval")) logged = j["eval"]["data"]["loss"].get<double>();
  model::HybridLM m(parse(micro_hybrid_json()));
  model::load_weights(m, model::weights_path(io::latest_checkpoint(c.out)));
  const auto scores = train::evaluate_model(m, {{"data", {shard->path()}, 1.0, cut}}, {c.batch, c.seq_len, 1},
                                            torch::Tensor(), torch::kCPU);
  EXPECT_NEAR(scores.at("data").loss, logged, 1e-9);
}

TEST_F(TrainerFixture, ShardsOfALargerVocabularyNameTheirTokenizerAndTheRecipe) {
  const std::string big = dir + "/big";
  ::mkdir(big.c_str(), 0755);
  {
    data::ShardWriter w(big + "/data-00000.slmtok", 1000, {{"tokenizer", "big-1000.model"}});
    w.add_document(std::vector<uint32_t>(200, 999), {"synthetic", "doc", "none", "data"});
    w.close();
  }
  auto e = error_of([&] { train::Trainer(micro_config(recipe, big, dir + "/big-run"), log); });
  EXPECT_NE(e.find(big +
                   "/data-00000.slmtok: tokenized with big-1000.model (vocabulary 1000), which does not fit "
                   "recipe " +
                   recipe + " (vocab_size 48); shard the data with a tokenizer of at most 48 ids"),
            std::string::npos)
      << e;
  EXPECT_EQ(::access((dir + "/big-run").c_str(), F_OK), -1) << "a refused run leaves nothing behind";
}

TEST(DefaultRunDir, IsNamedAfterTheRecipeFileAndNeverReused) {
  const std::string root = fresh_dir("runs");
  EXPECT_EQ(train::default_run_dir("recipes/tiny-hybrid.json", root), root + "/tiny-hybrid");
  ::mkdir((root + "/tiny-hybrid").c_str(), 0755);
  EXPECT_EQ(train::default_run_dir("recipes/tiny-hybrid.json", root), root + "/tiny-hybrid-2");
  ::mkdir((root + "/tiny-hybrid-2").c_str(), 0755);
  EXPECT_EQ(train::default_run_dir("/abs/tiny-hybrid.json", root), root + "/tiny-hybrid-3");
  EXPECT_EQ(train::default_run_dir("my-recipe", root), root + "/my-recipe");
}

// The newcomer's path on the command line: slm data shard of plain source files into nested, missing directories,
// then slm train with neither --out nor a validation split, from a fresh working directory.
TEST(TrainCliPlainShards, ShardThenTrainWithoutOutOrValidation) {
  single_threaded();
  const std::string cwd = fresh_dir("cwd");
  const std::string recipe = source_path("recipes/tiny-hybrid.json");
  auto r = run_slm("data shard --input " + source_path("src/slm/util") + " --tokenizer " +
                       source_path("tokenizer/slm-code-512.model") + " --out shards/of/my/code",
                   std::nullopt, cwd);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(::access((cwd + "/shards/of/my/code/data-00000.slmtok").c_str(), R_OK), 0) << r.out;

  const std::string train = "train --recipe " + recipe +
                            " --data shards/of/my/code --steps 2 --batch 2 --seq-len 32 "
                            "--eval-every 0 --eval-batches 1 --threads 1";
  r = run_slm(train, std::nullopt, cwd);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no --out given: the run goes to out/runs/tiny-hybrid\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("data: domain 'data' has no validation split: its last "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eval step 2: data loss"), std::string::npos) << r.out;
  EXPECT_FALSE(io::latest_checkpoint(cwd + "/out/runs/tiny-hybrid").empty());
  r = run_slm(train, std::nullopt, cwd);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the run goes to out/runs/tiny-hybrid-2\n"), std::string::npos) << r.out;

  // A run directory that cannot be made names the path in the way; nothing is trained.
  write_file(cwd + "/taken", "a file");
  r = run_slm(train + " --out taken/run", std::nullopt, cwd);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("slm: error: taken/run: cannot create the directory: taken exists and is not a directory"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(read_file(cwd + "/taken"), "a file");
}

}  // namespace
}  // namespace slm::test
