// The slm program as a user runs it: exit codes, JSON output, errors on stderr.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "recipe/shipped_recipes.h"
#include "slm/recipe/accounting.h"
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
  // Exact, against the hand count from the recipe's dimensions (recipe/shipped_recipes.h).
  constexpr auto hand = slm::test::nam56r_by_hand();
  EXPECT_EQ(j["params"]["total"].get<long long>(), hand.total);
  EXPECT_TRUE(j["params"].contains("active"));
  ASSERT_TRUE(j["params"].contains("by_family"));
  long long families = 0;
  for (const auto& [name, n] : j["params"]["by_family"].items()) families += n.get<long long>();
  EXPECT_EQ(families, hand.total) << "the families must add up to the total";
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
  // The sums against each specialist's own recipe file (recipes/specialists/<name>.json, as the manifest names them)
  // counted on its own in this process (one `slm recipe show` per specialist would cost a second each), not against
  // the per-specialist figures of this same output.
  long long total = 0, active = 0, stored = 0, bf16 = 0, nvfp4 = 0;
  for (const auto& s : j["specialists"]) {
    const std::string name = s["name"];
    const slm::Recipe recipe = slm::load_recipe(slm::test::source_path("recipes/specialists/" + name + ".json"));
    const slm::Accounting a = slm::account(recipe, slm::make_plan(recipe));
    EXPECT_EQ(s["total"].get<long long>(), a.total) << name;
    EXPECT_EQ(s["active"].get<long long>(), a.active) << name;
    total += a.total, active += a.active, stored += a.stored, bf16 += a.bytes_bf16, nvfp4 += a.bytes_nvfp4;
  }
  EXPECT_EQ(j["total"].get<long long>(), total);
  EXPECT_EQ(j["active"].get<long long>(), active);
  EXPECT_EQ(j["stored"].get<long long>(), stored);
  EXPECT_EQ(j["bytes_bf16"].get<long long>(), bf16);
  EXPECT_EQ(j["bytes_nvfp4"].get<long long>(), nvfp4);
  // The README's figures for this lineup: 54.4B total, 32.8 GiB in NVFP4.
  EXPECT_EQ(std::llround(total / 1e8), 544) << total;
  EXPECT_EQ(std::llround(nvfp4 / double(1LL << 30) * 10), 328) << nvfp4;
  EXPECT_GT(j["bytes_bf16"].get<long long>(), 3 * j["bytes_nvfp4"].get<long long>());
}
