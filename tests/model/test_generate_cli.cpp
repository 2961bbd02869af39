// `slm generate` and `slm model summary` as a user runs them.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "model_test_util.h"
#include "slm/data/tokenizer.h"
#include "slm/recipe/accounting.h"

using namespace slm::test;

namespace {

struct SplitCliResult {
  int code;
  std::string out, err;
};

SplitCliResult run(const std::string& args) {
  static int counter = 0;
  std::string err_path =
      testing::TempDir() + "/slm_model_cli_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".err";
  std::string cmd = "OMP_NUM_THREADS=1 " + std::string(SLM_BINARY) + " " + args + " 2>" + err_path;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  std::ifstream f(err_path);
  std::stringstream err;
  err << f.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, err.str()};
}

std::vector<long long> generated_ids(const std::string& err) {
  const std::string marker = "tokens:";
  auto at = err.find(marker);
  std::vector<long long> ids;
  if (at == std::string::npos) return ids;
  std::istringstream line(err.substr(at + marker.size(), err.find('\n', at) - at - marker.size()));
  long long id;
  while (line >> id) ids.push_back(id);
  return ids;
}

}  // namespace

TEST(GenerateCli, PrintsSixteenTokensDeterministically) {
  const std::string args =
      "generate --recipe " + source_path("recipes/tiny-ae.json") + " --prompt \"int main(\" --max-tokens 16 --seed 1";
  // One intra-op thread: two test processes share two cores, and oversubscribed threads make the
  // binary ~8x slower without changing its output.
  SplitCliResult a = run(args), b = run(args);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.err.find("RANDOM"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("generated 16 tokens"), std::string::npos) << a.err;
  auto ids = generated_ids(a.err);
  ASSERT_EQ(ids.size(), 16u) << a.err;
  for (auto id : ids) EXPECT_TRUE((id >= 0 && id < 256) || id == 257) << id;  // bytes or <eos>
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(ids, generated_ids(b.err));
  SplitCliResult c = run("generate --recipe " + source_path("recipes/tiny-ae.json") +
                         " --prompt \"int main(\" --max-tokens 16 --seed 1 --temperature 0");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(generated_ids(c.err).size(), 16u);
}

// With the code tokenizer the printed text is exactly the decoding of the printed ids, and no special other than
// <eos> is ever sampled.
TEST(GenerateCli, CodeTokenizerPrintsTheDecodedIds) {
  const std::string model = source_path("tokenizer/slm-code-512.model");
  auto a = run("generate --recipe " + source_path("recipes/tiny-hybrid.json") + " --tokenizer " + model +
               " --prompt \"int main(\" --max-tokens 24 --seed 3");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.err.find("slm-code-512.model"), std::string::npos) << a.err;
  auto ids = generated_ids(a.err);
  ASSERT_FALSE(ids.empty()) << a.err;
  ASSERT_LE(ids.size(), 24u);
  auto tok = slm::data::Tokenizer::load(model);
  std::vector<uint32_t> text_ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_LT(ids[i], static_cast<long long>(tok.vocab_size()));
    const auto id = static_cast<uint32_t>(ids[i]);
    if (id == tok.eos_id()) {
      EXPECT_EQ(i + 1, ids.size()) << "generation goes on after <eos>";
      continue;
    }
    EXPECT_FALSE(tok.is_special(id)) << id;
    text_ids.push_back(id);
  }
  EXPECT_EQ(a.out, tok.decode(text_ids) + "\n");
}

// --device: the CPU gives the default run's tokens and reports its speed; a device that is not there is refused.
TEST(GenerateCli, DeviceFlagRunsWhereAskedAndRefusesWhatIsMissing) {
  const std::string args = "generate --recipe " + source_path("recipes/tiny-ae.json") +
                           " --prompt \"int main(\" --max-tokens 8 --seed 2 --temperature 0";
  SplitCliResult plain = run(args), cpu = run(args + " --device cpu");
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_EQ(generated_ids(cpu.err), generated_ids(plain.err));
  EXPECT_EQ(generated_ids(cpu.err).size(), 8u);
  EXPECT_NE(cpu.err.find("cpu: prefill of 10 tokens"), std::string::npos) << cpu.err;  // BOS + 9 bytes
  EXPECT_NE(cpu.err.find("decode 7 tokens in"), std::string::npos) << cpu.err;
  EXPECT_NE(cpu.err.find("tokens/s"), std::string::npos) << cpu.err;
  SplitCliResult bogus = run(args + " --device tpu");
  EXPECT_EQ(bogus.code, 2);
  EXPECT_NE(bogus.err.find("--device must be cpu or cuda (got 'tpu')"), std::string::npos) << bogus.err;
  SplitCliResult cuda = run(args + " --device cuda");
  if (torch::cuda::is_available()) {
    EXPECT_EQ(cuda.code, 0) << cuda.err;
    EXPECT_EQ(generated_ids(cuda.err).size(), 8u) << cuda.err;
  } else {
    EXPECT_EQ(cuda.code, 2);
    EXPECT_NE(cuda.err.find("--device cuda: "), std::string::npos) << cuda.err;
  }
}

TEST(GenerateCli, RunsTheEveryFeatureRecipe) {
  // DSA, MLA, Engram, mHC and MTP on at once (recipes/tiny-full.json): prefill and cached decode through all of them.
  auto args = "generate --recipe " + source_path("recipes/tiny-full.json") +
              " --prompt \"int main(\" --max-tokens 6 --seed 2 --temperature 0";
  SplitCliResult a = run(args), b = run(args);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(generated_ids(a.err).size(), 6u);
  EXPECT_EQ(generated_ids(a.err), generated_ids(b.err));
}

// A libtorch error (here its CPU allocator refusing the decode cache of 10^15 tokens) is one line, not libtorch's C++
// stack; --verbose, before or after the subcommand, keeps the stack.
TEST(GenerateCli, ALibtorchErrorIsItsMessageWithoutTheBacktrace) {
  const auto args =
      "generate --recipe " + source_path("recipes/tiny-hybrid.json") + " --prompt x --max-tokens 1000000000000000";
  const SplitCliResult plain = run(args);
  EXPECT_EQ(plain.code, 1) << plain.err;
  EXPECT_NE(plain.err.find("slm: internal error: [enforce fail at alloc_cpu.cpp"), std::string::npos) << plain.err;
  EXPECT_NE(plain.err.find("DefaultCPUAllocator: can't allocate memory"), std::string::npos) << plain.err;
  EXPECT_NE(plain.err.find("(--verbose adds libtorch's backtrace)"), std::string::npos) << plain.err;
  EXPECT_EQ(plain.err.find("frame #"), std::string::npos) << plain.err;
  EXPECT_EQ(plain.err.find("Exception raised from"), std::string::npos) << plain.err;
  for (const auto& verbose : {"--verbose " + args, args + " --verbose"}) {
    const SplitCliResult v = run(verbose);
    EXPECT_EQ(v.code, 1) << v.err;
    EXPECT_NE(v.err.find("DefaultCPUAllocator: can't allocate memory"), std::string::npos) << v.err;
    EXPECT_NE(v.err.find("frame #0: "), std::string::npos) << v.err;
  }
}

TEST(ModelSummaryCli, JsonCountsEqualAccounting) {
  SplitCliResult r = run("model summary --recipe " + source_path("recipes/tiny-ae.json") + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  slm::Recipe recipe = tiny_ae();
  auto acc = slm::account(recipe, slm::make_plan(recipe));
  EXPECT_EQ(j["total"].get<long long>(), acc.total);
  EXPECT_EQ(j["active"].get<long long>(), acc.active);
  EXPECT_EQ(j["mtp_total"].get<long long>(), acc.mtp_total);
  ASSERT_EQ(j["layers"].size(), 6u);
  EXPECT_EQ(j["layers"][1]["class"], "MoELayer");
  EXPECT_EQ(j["layers"][1]["params"].get<long long>(), acc.layers[1].total);
  EXPECT_EQ(j["memory"]["fp32_bytes"].get<long long>(), 4 * (acc.total + acc.mtp_total) + 4 * 3 * 8);
  EXPECT_TRUE(j["matches_accounting"].get<bool>());
  SplitCliResult text = run("model summary --recipe " + source_path("recipes/tiny-ae.json"));
  ASSERT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("MoELayer"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("accounting agrees"), std::string::npos) << text.out;
}
