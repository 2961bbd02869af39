// Tiling the pattern to the depth, the ownership table, and feature placement.
#include "slm/recipe/plan.h"
#include "test_util.h"

using namespace slm;
using namespace slm::test;

TEST(PatternTiling, DepthShorterThanPattern) { EXPECT_EQ(tile_pattern("AEMEAEMEAEMR", 5), "AEMEA"); }

TEST(PatternTiling, DepthNotAMultiple) {
  EXPECT_EQ(tile_pattern("AEM", 7), "AEMAEMA");
  EXPECT_EQ(tile_pattern("AEMEAEMEAEMR", 14), "AEMEAEMEAEMRAE");
}

TEST(PatternTiling, DepthAMultiple) { EXPECT_EQ(tile_pattern("AM", 6), "AMAMAM"); }

TEST(PatternTiling, Nam56rComposition) {
  auto j = base_recipe();
  j["depth"] = 52;
  ModelPlan p = make_plan(parse(j));
  EXPECT_EQ(p.composition['A'], 13);
  EXPECT_EQ(p.composition['E'], 22);
  EXPECT_EQ(p.composition['M'], 13);
  EXPECT_EQ(p.composition['R'], 4);
  std::vector<int> r_layers;  // 1-based 12, 24, 36, 48 in the product documents
  for (const auto& l : p.layers)
    if (l.letter == 'R') r_layers.push_back(l.index + 1);
  EXPECT_EQ(r_layers, (std::vector<int>{12, 24, 36, 48}));
}

TEST(PatternTiling, ShortDepthPlan) {
  auto j = base_recipe();
  j["depth"] = 3;
  ModelPlan p = make_plan(parse(j));
  EXPECT_EQ(p.expanded, "AEM");
  EXPECT_EQ(p.layers.size(), 3u);
  EXPECT_EQ(p.composition.count('R'), 0u);
}

TEST(Ownership, EachLetterHasItsFamily) {
  EXPECT_EQ(family_of('A'), Family::Attention);
  EXPECT_EQ(family_of('E'), Family::MoE);
  EXPECT_EQ(family_of('M'), Family::Mamba3);
  EXPECT_EQ(family_of('R'), Family::M2RNN);
  EXPECT_EQ(family_of('F'), Family::MLP);
  EXPECT_THROW(family_of('C'), Error);
}

// The letter table against the product documents' letters, written out here: each row's family, its recipe section
// (whether `configured` sees exactly that section) and its place in the message that lists the known letters.
TEST(Ownership, TheLetterTableNamesEachLettersSectionAndNoOther) {
  const std::vector<std::pair<char, std::string>> expected = {
      {'A', "attention"}, {'E', "moe"}, {'M', "mamba3"}, {'R', "m2rnn"}, {'F', "mlp"}};
  ASSERT_EQ(pattern_letters().size(), expected.size());
  auto j = base_recipe();
  j["mlp"] = {{"hidden", 8}};
  for (const auto& [letter, section] : expected) {
    const PatternLetter& row = pattern_letter(letter);
    EXPECT_EQ(row.name, section);
    EXPECT_EQ(&pattern_letter(row.family), &row) << letter;
    EXPECT_TRUE(row.configured(parse(j))) << letter;
    auto without = j;
    without.erase(section);
    without["pattern"] = letter == 'A' ? "M" : "A";  // a stack that does not need the removed section
    EXPECT_FALSE(row.configured(parse(without))) << letter;
    EXPECT_NE(std::string(known_letters_text()).find(std::string(1, letter) + " ("), std::string::npos) << letter;
  }
  EXPECT_EQ(find_pattern_letter('C'), nullptr);  // reserved by the product documents, not built
  EXPECT_THROW(pattern_letter('x'), Error);
}

TEST(Placement, WindowPatternTilesOverAttentionLayersAndLastIsFull) {
  auto j = base_recipe();
  j["depth"] = 24;  // A layers at 0,4,...,20: six of them
  j["attention"]["window_pattern"] = "SSSL";
  j["attention"]["short_window"] = 8;
  ModelPlan p = make_plan(parse(j));
  std::string windows;
  for (const auto& l : p.layers)
    if (l.letter == 'A') windows.push_back(l.window);
  EXPECT_EQ(windows, "SSSLSL");  // the sixth would be S by tiling; the last A layer is always L
  EXPECT_EQ(p.layers[0].window_tokens, 8);
  EXPECT_EQ(p.layers[20].window_tokens, 0);
}

TEST(Placement, DsaFromStartLayer) {
  auto j = base_recipe();
  j["attention"]["dsa_enabled"] = true;
  j["attention"]["dsa_start_layer"] = 3;
  ModelPlan p = make_plan(parse(j));
  EXPECT_FALSE(p.layers[0].dsa);
  EXPECT_TRUE(p.layers[4].dsa);
  EXPECT_TRUE(p.layers[8].dsa);
  for (const auto& l : p.layers)
    if (l.letter != 'A') {
      EXPECT_FALSE(l.dsa);
    }
}

TEST(Placement, ExplicitDsaLayers) {
  auto j = base_recipe();
  j["attention"]["dsa_enabled"] = true;
  j["attention"]["dsa_layers"] = {8};
  ModelPlan p = make_plan(parse(j));
  EXPECT_FALSE(p.layers[4].dsa);
  EXPECT_TRUE(p.layers[8].dsa);
}

TEST(Placement, MoeLayerFreqTurnsSkippedSlotsIntoDenseLayers) {
  auto j = base_recipe();
  j["moe"]["layer_freq"] = 2;
  j["mlp"] = {{"hidden", 8}};
  ModelPlan p = make_plan(parse(j));
  // E slots at 1,3,5,7,9: ranks 0..4; ranks 1 and 3 (layers 3, 7) become F.
  EXPECT_EQ(p.expanded, "AEMFAEMFAEMR");
  EXPECT_EQ(p.layers[3].declared, 'E');
  EXPECT_EQ(p.layers[3].family, Family::MLP);
  EXPECT_EQ(p.composition['E'], 3);
  EXPECT_EQ(p.composition['F'], 2);
}

TEST(Placement, MoeLayerFreqNeedsMlpSection) {
  auto j = base_recipe();
  j["moe"]["layer_freq"] = 2;
  expect_error(j, {"mlp", "section is required because the pattern has F layers"});
}

TEST(Placement, MhcLayerListAndEngramOnAttention) {
  auto j = base_recipe();
  j["mhc"] = {{"enabled", true}, {"streams", 4}, {"layers", {0, 1, 2}}};
  j["engram"] = {{"enabled", true}, {"layers", {0, 4}}, {"table_rows", 101}, {"embed_dim", 4}};
  ModelPlan p = make_plan(parse(j));
  EXPECT_TRUE(p.layers[1].mhc);
  EXPECT_FALSE(p.layers[3].mhc);
  EXPECT_TRUE(p.layers[4].engram);
  EXPECT_FALSE(p.layers[8].engram);
}

TEST(Placement, MtpModuleLayers) {
  auto j = base_recipe();
  j["mtp"] = {{"depth", 2}, {"pattern", "AE"}, {"mla", false}};
  ModelPlan p = make_plan(parse(j));
  EXPECT_EQ(p.mtp_depth, 2);
  ASSERT_EQ(p.mtp_layers.size(), 2u);
  EXPECT_EQ(p.mtp_layers[0].family, Family::Attention);
  EXPECT_EQ(p.mtp_layers[0].window, 'L');
  EXPECT_EQ(p.mtp_layers[1].family, Family::MoE);
}
