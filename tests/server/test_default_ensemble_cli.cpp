// `slm chat` and `slm generate` through an ensemble manifest in the shipped layout (models/ensemble.json: two
// tiny-hybrid specialists on seeded random weights, the toy router): the default manifest when no model is given,
// piped and one-shot chat, and generate's router pick. Answers are checked against the model's own greedy loop.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "serving_test_util.h"
#include "slm/model/hybrid_lm.h"
#include "slm/recipe/recipe.h"
#include "slm/util/files.h"

namespace slm {
namespace {

namespace fs = std::filesystem;

const std::string kCmakeText = "add_library target_link_libraries find_package";
const std::string kShellText = "grep sed awk xargs";

class DefaultEnsembleCli : public testing::Test {
 protected:
  // dir_/models/ensemble.json: specialist 0 "cmake" and 1 "shell", each answering its own router label.
  static void SetUpTestSuite() {
    test::single_threaded();
    dir_ = fs::path(testing::TempDir()) / ("default_ensemble_" + std::to_string(::getpid()));
    remove_tree(dir_.string());  // not fs::remove_all: libtorch.so's copy crashes (README, "Known pitfall")
    fs::create_directories(dir_ / "models");
    test::toy_router().save((dir_ / "models/router.bin").string());
    std::ofstream(dir_ / "models/ensemble.json")
        << R"({"name": "shipped-test", "router": "router.bin", "specialists": [
      {"name": "cmake", "domain": "CMake", "recipe": ")"
        << test::source_path("recipes/tiny-hybrid.json") << R"(", "tokenizer": ")"
        << test::source_path("tokenizer/slm-code-512.model") << R"("},
      {"name": "shell", "domain": "shell", "recipe": ")"
        << test::source_path("recipes/tiny-hybrid.json") << R"(", "tokenizer": ")"
        << test::source_path("tokenizer/slm-code-512.model") << R"("}]})";
  }
  static void TearDownTestSuite() { remove_tree(dir_.string()); }

  static std::string manifest() { return (dir_ / "models/ensemble.json").string(); }

  // Specialist i's weights as the loader makes them without a checkpoint: tiny-hybrid built after seeding with
  // the run's --seed (0) + i.
  static std::unique_ptr<model::HybridLM> specialist(uint64_t i) {
    torch::manual_seed(i);
    auto m = std::make_unique<model::HybridLM>(load_recipe(test::source_path("recipes/tiny-hybrid.json")));
    m->eval();
    return m;
  }

  // A completion's greedy ids as `slm generate` must produce them: <|bos|> and the prompt's ids, every control id
  // but <|eos|> (3) banned, the <|eos|> that ends it kept.
  static std::vector<int64_t> completion_ids(uint64_t i, const std::string& prompt, int64_t n) {
    std::vector<int64_t> ids = {2};
    for (uint32_t id : test::code512().encode(prompt)) ids.push_back(id);
    std::vector<int64_t> banned;
    for (uint32_t id = 0; id < 512; ++id)
      if (test::code512().is_special(id) && id != 3) banned.push_back(id);
    auto out = test::greedy_reference(*specialist(i), ids, n, banned, {3});
    if (static_cast<int64_t>(out.size()) < n) out.push_back(3);
    return out;
  }

  static std::string ids_line(const std::vector<int64_t>& ids) {
    std::ostringstream s;
    s << "slm: generated " << ids.size() << " tokens:";
    for (int64_t id : ids) s << " " << id;
    return s.str() + "\n";
  }

  // The program copied where no models/ directory is beside it, so only the working directory can provide one
  // (the repository's own models/ensemble.json must not leak into these cases once it is shipped).
  static std::string lone_binary() {
    const fs::path bin = dir_ / "lone" / "bin" / "slm";
    if (!fs::exists(bin)) {
      fs::create_directories(bin.parent_path());
      fs::copy_file(SLM_BINARY, bin);
    }
    return bin.string();
  }

  static inline fs::path dir_;
};

TEST_F(DefaultEnsembleCli, ChatWithNoOptionsRunsTheShippedEnsembleAndAnswersEachPipedLine) {
  const std::string expected = test::text_of(
      test::greedy_reference(*specialist(0), test::user_prompt(kCmakeText), 6, test::chat_banned(), {3, 9}));
  const auto r = test::run_slm("chat --random-weights --temperature 0 --max-tokens 6",
                               kCmakeText + "\n\n" + kShellText + "\n", dir_.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("slm chat: no model given: the shipped ensemble " + manifest() + "\n"), std::string::npos)
      << r.out;
  // Each message answered, in order, by the specialist the router picks for it, the first with the greedy text.
  const size_t first = r.out.find("(answered by cmake, finish ");
  const size_t second = r.out.find("(answered by shell, finish ");
  ASSERT_NE(first, std::string::npos) << r.out;
  ASSERT_NE(second, std::string::npos) << r.out;
  EXPECT_LT(first, second) << r.out;
  EXPECT_NE(r.out.find(expected + "\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("commands: /reset"), std::string::npos) << "piped input gets no help text:\n" << r.out;
}

TEST_F(DefaultEnsembleCli, ChatPromptAnswersOneMessageAndExits) {
  const auto r = test::run_slm("chat --ensemble " + manifest() + " --random-weights --temperature 0 --max-tokens 6 " +
                                   "--prompt '" + kShellText + "'",
                               std::string(kCmakeText + "\n"));  // not read
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(answered by shell, finish "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("answered by cmake"), std::string::npos) << r.out;
  const auto refused = test::run_slm("chat --ensemble " + manifest() + " --random-weights --model nosuch --prompt hi");
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("the model \"nosuch\" does not exist"), std::string::npos) << refused.out;
}

TEST_F(DefaultEnsembleCli, GenerateAutoLetsTheRouterPickAndSaysWhichSpecialistAnswered) {
  const auto shell = test::run_slm("generate --ensemble " + manifest() +
                                   " --random-weights --temperature 0 --max-tokens 6 --prompt '" + kShellText + "'");
  ASSERT_EQ(shell.code, 0) << shell.out;
  EXPECT_NE(shell.out.find("slm: answered by shell (weights random; router: shell 0."), std::string::npos) << shell.out;
  EXPECT_NE(shell.out.find(ids_line(completion_ids(1, kShellText, 6))), std::string::npos) << shell.out;
  // With no model given, from the working directory's models/ensemble.json.
  const auto cmake =
      test::run_slm("generate --random-weights --temperature 0 --max-tokens 6 --prompt '" + kCmakeText + "'",
                    std::nullopt, dir_.string());
  ASSERT_EQ(cmake.code, 0) << cmake.out;
  EXPECT_NE(cmake.out.find("slm: no model given: the shipped ensemble " + manifest()), std::string::npos) << cmake.out;
  EXPECT_NE(cmake.out.find("slm: answered by cmake (weights random; router: cmake 0."), std::string::npos) << cmake.out;
  EXPECT_NE(cmake.out.find(ids_line(completion_ids(0, kCmakeText, 6))), std::string::npos) << cmake.out;
}

TEST_F(DefaultEnsembleCli, GenerateModelNamesTheSpecialist) {
  const auto r =
      test::run_slm("generate --ensemble " + manifest() + " --model cmake --random-weights --temperature 0 " +
                    "--max-tokens 5 --prompt '" + kShellText + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("slm: answered by cmake (weights random)\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(ids_line(completion_ids(0, kShellText, 5))), std::string::npos) << r.out;
  const auto unknown =
      test::run_slm("generate --ensemble " + manifest() + " --model nosuch --random-weights --prompt x");
  EXPECT_EQ(unknown.code, 2) << unknown.out;
  EXPECT_NE(unknown.out.find("has no specialist \"nosuch\" (it has cmake, shell, or auto)"), std::string::npos)
      << unknown.out;
  const auto mixed = test::run_slm("generate --recipe " + test::source_path("recipes/tiny-hybrid.json") +
                                   " --ensemble " + manifest() + " --prompt x");
  EXPECT_EQ(mixed.code, 2) << mixed.out;
  EXPECT_NE(mixed.out.find("give --recipe or --ensemble, not both"), std::string::npos) << mixed.out;
}

TEST_F(DefaultEnsembleCli, WithoutShippedModelsEachCommandSaysTheyAreMissing) {
  const std::string bin = lone_binary();
  const fs::path empty = dir_ / "empty";
  fs::create_directories(empty);
  const std::string tried = "looked for " + (empty / "models/ensemble.json").string() + " or " +
                            (dir_ / "lone/models/ensemble.json").string();
  // Standard input is an empty file: chat's piped mode then ends at once instead of waiting on the terminal.
  auto lone = [&](const std::string& args) { return test::run_slm(args, std::string(), empty.string(), bin); };
  const auto generate = lone("generate --prompt x");
  EXPECT_EQ(generate.code, 2) << generate.out;
  EXPECT_NE(generate.out.find("the shipped models are missing (no models/ensemble.json: " + tried + ")"),
            std::string::npos)
      << generate.out;
  const auto serve = lone("serve");
  EXPECT_EQ(serve.code, 2) << serve.out;
  EXPECT_NE(serve.out.find("the shipped models are missing"), std::string::npos) << serve.out;
  // chat keeps its old default: a server at 127.0.0.1:8000 (whether one answers there is not this test's business).
  const auto chat = lone("chat --max-tokens 1");
  EXPECT_NE(chat.out.find("the shipped models are missing (no models/ensemble.json: " + tried +
                          "); talking to a server at http://127.0.0.1:8000"),
            std::string::npos)
      << chat.out;
}

}  // namespace
}  // namespace slm
