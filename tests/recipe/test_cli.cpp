// The slm program as a user runs it: exit codes, JSON output, errors on stderr.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include "test_util.h"

using slm::test::CliResult;
using slm::test::run_slm;

namespace {


}  // namespace

TEST(Cli, RecipeShowJsonNam56r) {
  CliResult r = run_slm("recipe show " + slm::test::source_path("recipes/nam56r.json") + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["depth"], 52);
  EXPECT_EQ(j["composition"]["A"], 13);
  EXPECT_EQ(j["composition"]["E"], 22);
  EXPECT_EQ(j["composition"]["M"], 13);
  EXPECT_EQ(j["composition"]["R"], 4);
  EXPECT_EQ(j["layers"].size(), 52u);
  double total = j["params"]["total"].get<double>();
  EXPECT_NEAR(total / 4.73e9, 1.0, 0.03) << total;
  EXPECT_TRUE(j["params"].contains("active"));
  EXPECT_TRUE(j["params"].contains("by_family"));
}

TEST(Cli, RecipeShowTextListsEveryLayer) {
  CliResult r = run_slm("recipe show " + slm::test::source_path("recipes/tiny-hybrid.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("composition  A 3  E 5  M 3  R 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("   11  R      m2rnn"), std::string::npos) << r.out;
}

TEST(Cli, InvalidRecipeExitsWithCode2AndNamesTheField) {
  std::string path = testing::TempDir() + "/bad_recipe.json";
  auto j = slm::test::base_recipe();
  j["attention"]["kv_heads"] = 3;
  std::ofstream(path) << j.dump();
  CliResult r = run_slm("recipe show " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("slm: error: " + path + ": attention.kv_heads"), std::string::npos) << r.out;
}

TEST(Cli, MissingFileExitsWithCode2) {
  CliResult r = run_slm("recipe validate /nonexistent.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("/nonexistent.json: cannot open file"), std::string::npos) << r.out;
}

TEST(Cli, UnknownSubcommandExitsWithCode2) { EXPECT_EQ(run_slm("frobnicate").code, 2); }

TEST(Cli, HelpListsSubcommands) {
  CliResult r = run_slm("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("recipe"), std::string::npos);
  EXPECT_NE(r.out.find("ensemble"), std::string::npos);
}

TEST(Cli, EnsembleShowJsonHasSums) {
  CliResult r = run_slm("ensemble show " + slm::test::source_path("recipes/ensembles/product.json") + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["specialists"].size(), 8u);
  long long total = 0;
  for (const auto& s : j["specialists"]) total += s["total"].get<long long>();
  EXPECT_EQ(j["total"].get<long long>(), total);
  EXPECT_GT(j["bytes_bf16"].get<long long>(), 3 * j["bytes_nvfp4"].get<long long>());
}
