// slm eval ablations: two arms of a tiny plan (a base recipe, and the same with an override) train on the same data
// and are scored on the same windows; each arm's scores equal `slm eval` of its own run, the outputs exist, a second
// invocation trains nothing again, and bad plans are refused with the reason.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "data/data_test_util.h"
#include "slm/eval/ablation.h"
#include "slm/recipe/recipe.h"
#include "slm/util/error.h"
#include "test_util.h"
#include "train/train_test_util.h"

namespace slm::test {
namespace {

nlohmann::json tiny_plan(const std::string& base) {
  return {{"name", "tiny"},
          {"base", base},
          {"train",
           {{"steps", 3},
            {"batch", 2},
            {"seq_len", 16},
            {"seed", 5},
            {"tokenizer", "none"},
            {"eval_every", 0},
            {"lr", {{"warmup_steps", 1}}}}},
          {"eval", {{"batch", 2}, {"seq_len", 16}, {"batches", 2}}},
          {"arms", {{{"name", "hybrid"}}, {{"name", "attention"}, {"overrides", {{"pattern", "AEAE"}}}}}}};
}

TEST(AblationCli, ArmsTrainAlikeAndScoreAsSlmEvalAlone) {
  const std::string dir = fresh_dir("ablation"), data = dir + "/shards";
  ::mkdir(data.c_str(), 0755);
  write_counting_shards(data, "count", 48, 48, 21);
  write_counting_shards(data, "other", 48, 48, 22);
  const std::string base = write_recipe(dir, micro_hybrid_json());
  // The schedule's keys as TrainConfig writes them (a partial "lr" would be refused): take them from a default.
  auto plan = tiny_plan(base);
  auto lr = train::TrainConfig{}.to_json()["lr"];
  lr["warmup_steps"] = 1;
  plan["train"]["lr"] = lr;
  write_file(dir + "/plan.json", plan.dump(2));
  const std::string out = dir + "/out";
  auto r = run_slm("eval ablations --plan " + dir + "/plan.json --data " + data + " --out " + out + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("| hybrid | " + base + " |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| attention | " + base + " + `{\"pattern\":\"AEAE\"}` |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| domain | hybrid | attention |"), std::string::npos) << r.out;
  for (const char* f : {"/ablations.md", "/ablations.json", "/domain-table.png", "/attention/recipe.json"}) {
    struct stat st {};
    EXPECT_EQ(::stat((out + f).c_str(), &st), 0) << f;
    EXPECT_GT(st.st_size, 0) << f;
  }
  const auto j = nlohmann::json::parse(read_file(out + "/ablations.json"));
  ASSERT_EQ(j["arms"].size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(read_file(out + "/attention/recipe.json"))["pattern"], "AEAE");
  for (const auto& arm : j["arms"]) {
    EXPECT_EQ(arm["steps"], 3);
    EXPECT_EQ(arm["tokens"], 3 * 2 * 16);
    const std::string run = arm["run_dir"].get<std::string>();
    auto alone =
        run_slm("eval --checkpoint " + run + " --data " + data +
                " --domains count,other --tokenizer none --batch 2 --seq-len 16 --batches 2 --threads 1 --json");
    ASSERT_EQ(alone.code, 0) << alone.out;
    const auto e = nlohmann::json::parse(alone.out.substr(alone.out.find('{')));
    for (const char* d : {"count", "other"})
      EXPECT_DOUBLE_EQ(arm["scores"][d]["loss"].get<double>(), e["domains"][d]["loss"].get<double>())
          << arm["name"] << " " << d;
  }
  // The two arms differ (one recipe has M and R layers, the other not): their parameter counts say so.
  EXPECT_NE(j["arms"][0]["params"], j["arms"][1]["params"]);
  // Again: every arm is done, nothing trains.
  auto again = run_slm("eval ablations --plan " + dir + "/plan.json --data " + data + " --out " + out + " --threads 1");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("hybrid (1/2): done earlier"), std::string::npos) << again.out;
  EXPECT_EQ(again.out.find("training "), std::string::npos) << again.out;
}

TEST(AblationPlan, BadPlansAreRefusedWithTheReason) {
  auto msg = [](const nlohmann::json& j) {
    try {
      eval::parse_ablation_plan(j, "p.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  auto p = tiny_plan("base.json");
  EXPECT_EQ(msg(p), "(accepted)");
  auto one = p;
  one["arms"].erase(1);
  EXPECT_NE(msg(one).find("at least two arms"), std::string::npos);
  auto twice = p;
  twice["arms"][1]["name"] = "hybrid";
  EXPECT_NE(msg(twice).find("\"hybrid\" appears twice"), std::string::npos);
  auto unknown = p;
  unknown["train"]["stepz"] = 4;
  EXPECT_NE(msg(unknown).find("unknown setting \"stepz\""), std::string::npos);
  auto runner = p;
  runner["train"]["data"] = "x";
  EXPECT_NE(msg(runner).find("\"data\" is set by the runner"), std::string::npos);
  auto no_recipe = p;
  no_recipe.erase("base");
  EXPECT_NE(msg(no_recipe).find("has no recipe and the plan no base"), std::string::npos);
  auto path = p;
  path["arms"][0]["name"] = "../x";
  EXPECT_NE(msg(path).find("names are letters"), std::string::npos);
}

// Every shipped plan parses, and every arm's recipe (its base with its overrides) is a valid recipe.
TEST(AblationPlan, ShippedPlansAndTheirArmsValidate) {
  int plans = 0;
  for (const auto& e : std::filesystem::directory_iterator(source_path("recipes/ablations"))) {
    SCOPED_TRACE(e.path().string());
    const auto plan = eval::load_ablation_plan(e.path());
    for (auto arm : plan.arms) {
      SCOPED_TRACE(arm.name);
      if (arm.recipe.empty()) arm.recipe = source_path(plan.base);
      EXPECT_NO_THROW(parse_recipe_text(eval::arm_recipe(plan, arm).dump(), arm.name));
    }
    ++plans;
  }
  EXPECT_GE(plans, 1);
}

}  // namespace
}  // namespace slm::test
