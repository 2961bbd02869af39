// Every validation rule of the recipe language, with the message it must give.
#include "slm/recipe/recipe.h"
#include "test_util.h"

using namespace slm;
using namespace slm::test;

TEST(RecipeValidation, BaseRecipeIsValid) { EXPECT_NO_THROW(parse(base_recipe())); }

TEST(RecipeValidation, UnknownPatternLetter) {
  auto j = base_recipe();
  j["pattern"] = "AEXM";
  expect_error(j, {"test.json: pattern", "unknown pattern letter 'X' at position 2"});
}

TEST(RecipeValidation, ReservedLetterC) {
  auto j = base_recipe();
  j["pattern"] = "AC";
  expect_error(j, {"pattern", "'C'", "reserved"});
}

TEST(RecipeValidation, UnknownLetterInMtpPattern) {
  auto j = base_recipe();
  j["mtp"] = {{"depth", 1}, {"pattern", "AQ"}};
  expect_error(j, {"mtp.pattern", "unknown pattern letter 'Q'"});
}

TEST(RecipeValidation, HeadsNotDivisibleByKvHeads) {
  auto j = base_recipe();
  j["attention"]["kv_heads"] = 3;
  expect_error(j, {"attention.kv_heads", "heads (4) must be divisible by kv_heads (3)"});
}

TEST(RecipeValidation, KvHeadsExceedHeads) {
  auto j = base_recipe();
  j["attention"]["kv_heads"] = 8;
  expect_error(j, {"attention.kv_heads", "must not exceed heads"});
}

TEST(RecipeValidation, MambaInnerNotDivisibleByHeaddim) {
  auto j = base_recipe();
  j["mamba3"]["headdim"] = 5;
  expect_error(j, {"mamba3.headdim", "d_model*expand (32) must be divisible by headdim (5)"});
}

TEST(RecipeValidation, MambaExplicitHeadsMustAgree) {
  auto j = base_recipe();
  j["mamba3"]["heads"] = 4;  // 16*2/8 = 4: agrees
  EXPECT_NO_THROW(parse(j));
  j["mamba3"]["heads"] = 6;
  expect_error(j, {"mamba3.heads", "explicit head count 6 disagrees with d_model*expand/headdim = 4"});
}

TEST(RecipeValidation, ExpertsPerTokenExceedsRoutedExperts) {
  auto j = base_recipe();
  j["moe"]["experts_per_token"] = 5;
  expect_error(j, {"moe.experts_per_token", "experts_per_token (5) must not exceed routed_experts (4)"});
}

TEST(RecipeValidation, UnknownWindowLetter) {
  auto j = base_recipe();
  j["attention"]["window_pattern"] = "SLX";
  expect_error(j, {"attention.window_pattern", "unknown window letter 'X' at position 2"});
}

TEST(RecipeValidation, ShortWindowRequiredWithS) {
  auto j = base_recipe();
  j["attention"]["window_pattern"] = "SL";
  expect_error(j, {"attention.short_window", "required field is missing"});
}

TEST(RecipeValidation, DsaStartLayerBeyondDepth) {
  auto j = base_recipe();
  j["attention"]["dsa_enabled"] = true;
  j["attention"]["dsa_start_layer"] = 12;
  expect_error(j, {"attention.dsa_start_layer", "beyond the model's depth (12 layers"});
}

TEST(RecipeValidation, DsaWithoutAttentionLayerAfterStart) {
  auto j = base_recipe();
  j["attention"]["dsa_enabled"] = true;
  j["attention"]["dsa_start_layer"] = 9;  // A layers are 0, 4, 8
  expect_error(j, {"dsa_start_layer", "no A layer is at or after layer 9"});
}

TEST(RecipeValidation, DsaLayersMustBeAttention) {
  auto j = base_recipe();
  j["attention"]["dsa_enabled"] = true;
  j["attention"]["dsa_layers"] = {4, 5};
  expect_error(j, {"attention.dsa_layers", "layer 5 is an E layer", "A (attention) layers only"});
}

TEST(RecipeValidation, ZeroSize) {
  auto j = base_recipe();
  j["d_model"] = 0;
  expect_error(j, {"test.json: d_model", "must be a positive integer, got 0"});
}

TEST(RecipeValidation, NegativeSize) {
  auto j = base_recipe();
  j["moe"]["expert_hidden"] = -8;
  expect_error(j, {"moe.expert_hidden", "must be a positive integer, got -8"});
}

TEST(RecipeValidation, UnknownTopLevelKeySuggestsClosest) {
  auto j = base_recipe();
  j["seq_lenn"] = 4;
  expect_error(j, {"test.json: seq_lenn", "unknown key", "did you mean 'seq_len'"});
}

TEST(RecipeValidation, UnknownNestedKeyIsRejected) {
  auto j = base_recipe();
  j["attention"]["rope_thetta"] = 5;
  expect_error(j, {"attention.rope_thetta", "unknown key", "did you mean 'rope_theta'"});
}

TEST(RecipeValidation, WrongTypeNamesTheField) {
  auto j = base_recipe();
  j["attention"]["heads"] = "4";
  expect_error(j, {"attention.heads", "expected an integer, got \"4\""});
}

TEST(RecipeValidation, MissingSectionForLetter) {
  auto j = base_recipe();
  j.erase("mamba3");
  expect_error(j, {"mamba3", "section is required because the pattern has M layers"});
}

TEST(RecipeValidation, MlaOnlyOnAttentionLayers) {
  auto j = base_recipe();
  j["attention"]["mla_layers"] = {0, 2};
  expect_error(j, {"attention.mla_layers", "layer 2 is an M layer"});
}

TEST(RecipeValidation, LayerIndexOutsideModel) {
  auto j = base_recipe();
  j["attention"]["mla_layers"] = {0, 12};
  expect_error(j, {"attention.mla_layers", "layer 12 is outside the model (depth 12)"});
}

TEST(RecipeValidation, EngramOnlyOnAttentionLayers) {
  auto j = base_recipe();
  j["engram"] = {{"enabled", true}, {"layers", {1}}, {"table_rows", 100}, {"embed_dim", 4}};
  expect_error(j, {"engram.layers", "layer 1 is an E layer", "Engram"});
}

TEST(RecipeValidation, MhcNeedsTwoStreams) {
  auto j = base_recipe();
  j["mhc"] = {{"enabled", true}, {"streams", 1}};
  expect_error(j, {"mhc.streams", "at least 2"});
}

TEST(RecipeValidation, OnlySigmoidGate) {
  auto j = base_recipe();
  j["moe"]["gate"] = "softmax";
  expect_error(j, {"moe.gate", "only \"sigmoid\""});
}

TEST(RecipeValidation, MalformedJsonGivesLineAndColumn) {
  const std::string text = "{\n  \"name\": \"x\",\n  \"depth\": 4,,\n}\n";
  try {
    parse_recipe_text(text, "bad.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    // The stray comma is line 3, column 14.
    EXPECT_NE(msg.find("bad.json:3:14: malformed JSON"), std::string::npos) << msg;
  }
}

TEST(RecipeValidation, MissingFileIsNamed) {
  try {
    load_recipe("/nonexistent/recipe.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/recipe.json: cannot open file"), std::string::npos) << e.what();
  }
}
