// The per-domain table (slm/eval/domain_table.h): the oracle route, the pooled rows and the bold minimum against
// hand-computed values; refusals; and `slm eval domains` end to end on two tiny CPU runs, whose cells equal what
// `slm eval --json` reports for each run alone, with its Markdown, JSON and PNG outputs.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>

#include "data/data_test_util.h"
#include "slm/eval/domain_table.h"
#include "test_util.h"
#include "train/train_test_util.h"

namespace slm::test {
namespace {

// A score with loss (nats per token) over `tokens` targets that decode to `bytes` bytes: bpb follows from them.
train::DomainScore score(double loss, int64_t tokens, double bytes) {
  train::DomainScore s;
  s.loss = loss;
  s.tokens = tokens;
  s.bytes = bytes;
  s.bpb = loss * static_cast<double>(tokens) / std::log(2.0) / bytes;
  return s;
}

TEST(DomainTable, OracleRoutePooledRowsAndTheBestOfEachRow) {
  // cpp: 100 tokens, 400 bytes; cmake: 50 tokens, 150 bytes.
  const std::vector<std::pair<std::string, eval::DomainScores>> scores = {
      {"cpp-spec", {{"cpp", score(1.0, 100, 400)}, {"cmake", score(3.0, 50, 150)}}},
      {"cmake-spec", {{"cpp", score(2.0, 100, 400)}, {"cmake", score(0.5, 50, 150)}}},
      {"generalist", {{"cpp", score(1.2, 100, 400)}, {"cmake", score(1.0, 50, 150)}}},
  };
  const auto t = eval::make_domain_table(scores, {{"cpp-spec", {"cpp"}}, {"cmake-spec", {"cmake", "shell"}}});
  EXPECT_TRUE(t.bpb);
  EXPECT_EQ(t.domains, (std::vector<std::string>{"cmake", "cpp"}));
  EXPECT_EQ(t.oracle.at("cpp"), "cpp-spec");
  EXPECT_EQ(t.oracle.at("cmake"), "cmake-spec");
  EXPECT_EQ(t.oracle.count("shell"), 0u);  // no such domain in the data

  // The oracle pools cpp-spec on cpp and cmake-spec on cmake: (1.0*100 + 0.5*50) nats over 550 bytes.
  const double ln2 = std::log(2.0);
  EXPECT_NEAR(eval::oracle_pooled(t).bpb, 125.0 / ln2 / 550.0, 1e-12);
  // The generalist's pooled: (1.2*100 + 1.0*50) nats over 550 bytes.
  EXPECT_NEAR(eval::pooled_scores(t).at("generalist").bpb, 170.0 / ln2 / 550.0, 1e-12);

  const std::string md = eval::domain_table_markdown(t);
  char cpp_row[160], all_row[200];
  std::snprintf(cpp_row, sizeof cpp_row, "| cpp | **%.4f** | %.4f | %.4f | %.4f (cpp-spec) |", 100 / ln2 / 400,
                200 / ln2 / 400, 120 / ln2 / 400, 100 / ln2 / 400);
  EXPECT_NE(md.find(cpp_row), std::string::npos) << cpp_row << "\n" << md;
  // Pooled: cpp-spec (100 + 150) nats, cmake-spec (200 + 25), generalist (120 + 50): the generalist is lowest.
  std::snprintf(all_row, sizeof all_row, "| all (pooled) | %.4f | %.4f | **%.4f** | %.4f |", 250 / ln2 / 550,
                225 / ln2 / 550, 170 / ln2 / 550, 125 / ln2 / 550);
  EXPECT_NE(md.find(all_row), std::string::npos) << all_row << "\n" << md;
  EXPECT_NE(md.find("| domain | cpp-spec | cmake-spec | generalist | oracle route |"), std::string::npos) << md;

  const auto j = eval::domain_table_json(t);
  EXPECT_EQ(j["measure"], "bpb");
  EXPECT_EQ(j["oracle"]["cmake"], "cmake-spec");
  EXPECT_NEAR(j["oracle_pooled"]["bpb"].get<double>(), 125.0 / ln2 / 550.0, 1e-12);
}

TEST(DomainTable, WithoutBytesTheLossIsTheMeasureAndAMissingScoreIsADash) {
  auto a = score(1.0, 10, 40), b = score(2.0, 10, 40);
  b.bpb = std::nan("");
  const auto t = eval::make_domain_table({{"a", {{"x", a}, {"y", a}}}, {"b", {{"x", b}}}});
  EXPECT_FALSE(t.bpb);
  const std::string md = eval::domain_table_markdown(t);
  EXPECT_NE(md.find("| y | **1.0000** | — |"), std::string::npos) << md;
  EXPECT_NE(md.find("Loss in nats per token"), std::string::npos) << md;
  EXPECT_EQ(md.find("oracle"), std::string::npos) << "no routes, no oracle column\n" << md;
}

TEST(DomainTable, RefusesRepeatedModelsAndRoutesOfNoModel) {
  const auto s = score(1.0, 10, 40);
  EXPECT_THROW(eval::make_domain_table({{"a", {{"x", s}}}, {"a", {{"x", s}}}}), Error);
  EXPECT_THROW(eval::make_domain_table({{"a", {{"x", s}}}}, {{"b", {"x"}}}), Error);
}

// A score of `windows` windows of two targets each, with each window's NLL and bytes.
train::DomainScore windowed(const std::vector<double>& nll, const std::vector<double>& bytes) {
  train::DomainScore s;
  s.window_nll = nll;
  s.window_bytes = bytes;
  s.tokens = 2 * static_cast<int64_t>(nll.size());
  double n = 0;
  for (double x : nll) n += x;
  for (double b : bytes) s.bytes += b;
  s.loss = n / static_cast<double>(s.tokens);
  s.bpb = n / std::log(2.0) / s.bytes;
  s.batches = 1;
  return s;
}

TEST(DomainTable, RoutedColumnTakesEachWindowFromTheModelTheRouterPicked) {
  auto t = eval::make_domain_table(
      {{"a", {{"cpp", windowed({1, 2, 3}, {10, 10, 20})}}}, {"b", {{"cpp", windowed({4, 1, 1}, {10, 10, 20})}}}});
  eval::add_routed(t, {{"cpp", {0, 1, 1}}});
  // Window 0 from a (NLL 1), windows 1 and 2 from b (1 + 1): 3 nats over 6 targets and 40 bytes.
  const auto& r = t.routed.at("cpp");
  EXPECT_DOUBLE_EQ(r.loss, 3.0 / 6.0);
  EXPECT_DOUBLE_EQ(r.bpb, 3.0 / std::log(2.0) / 40.0);
  EXPECT_EQ(r.tokens, 6);
  EXPECT_EQ(t.routed_windows.at("cpp").at("a"), 1);
  EXPECT_EQ(t.routed_windows.at("cpp").at("b"), 2);
  const std::string md = eval::domain_table_markdown(t);
  EXPECT_NE(md.find("| domain | a | b | routed |"), std::string::npos) << md;
  // Bits per byte: either model alone 6 / ln 2 / 40 = 0.2164 (both the row's best), routed half of it.
  EXPECT_NE(md.find("| cpp | **0.2164** | **0.2164** | 0.1082 |"), std::string::npos) << md;
  const auto j = eval::domain_table_json(t);
  EXPECT_DOUBLE_EQ(j["routed"]["cpp"]["loss"].get<double>(), 0.5);
  EXPECT_EQ(j["routed_windows"]["cpp"]["b"], 2);
}

TEST(DomainTable, RoutedColumnRefusesChoicesThatDoNotFitTheScores) {
  auto t = eval::make_domain_table({{"a", {{"cpp", windowed({1, 2}, {10, 10})}}}});
  EXPECT_THROW(eval::add_routed(t, {{"cpp", {0, 1}}}), Error);     // no model #1
  EXPECT_THROW(eval::add_routed(t, {{"cpp", {0, 0, 0}}}), Error);  // three choices for two windows
  EXPECT_THROW(eval::add_routed(t, {{"cmake", {0, 0}}}), Error);   // a was not scored on cmake
  EXPECT_THROW(eval::add_routed(t, {{"cpp", {}}}), Error);         // no windows
}

TEST(DomainTable, RoutingCurveOfTheRouterAndTheOracleByHand) {
  // Three windows of 10, 20 and 30 bytes (two targets each). NLL per window:
  //   g (fallback) 5 8 9;  s1 3 9 9;  s2 6 4 10.
  // The oracle's savings over g: window 1 with s2 (4), window 0 with s1 (2), window 2 with s1 (0).
  // The router sends window 0 to s2 (confidence 0.9: a bad pick), window 1 to s2 (0.6), keeps window 2 on g.
  const std::vector<double> bytes = {10, 20, 30};
  const auto t = eval::make_domain_table({{"g", {{"x", windowed({5, 8, 9}, bytes)}}},
                                          {"s1", {{"x", windowed({3, 9, 9}, bytes)}}},
                                          {"s2", {{"x", windowed({6, 4, 10}, bytes)}}}});
  const auto c = eval::routing_curve(t, "g", {{"x", {{2, 0.9}, {2, 0.6}, {0, 0.8}}}});
  const double ln2 = std::log(2.0);
  EXPECT_EQ(c.windows, 3);
  ASSERT_EQ(c.router.size(), 3u);  // 0, 1 or 2 windows sent: the router never sends window 2
  EXPECT_NEAR(c.router[0].score.bpb, 22 / ln2 / 60, 1e-12);
  EXPECT_NEAR(c.router[1].score.bpb, 23 / ln2 / 60, 1e-12);  // window 0: 5 -> 6
  EXPECT_NEAR(c.router[2].score.bpb, 19 / ln2 / 60, 1e-12);  // window 1: 8 -> 4
  EXPECT_DOUBLE_EQ(c.router[2].share, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(c.router[2].score.loss, 19.0 / 6.0);
  ASSERT_EQ(c.oracle.size(), 4u);
  EXPECT_NEAR(c.oracle[1].score.bpb, 18 / ln2 / 60, 1e-12);
  EXPECT_NEAR(c.oracle[2].score.bpb, 16 / ln2 / 60, 1e-12);
  EXPECT_NEAR(c.oracle[3].score.bpb, 16 / ln2 / 60, 1e-12);
  // Shares 0, 25% (round(0.75) = 1 window) and the router's largest, 2 windows; random halfway at 1: (22 + 19) / 2.
  const std::string md = eval::routing_curve_markdown(t, c);
  char row[160];
  std::snprintf(row, sizeof row, "| 33%% (1) | %.4f | %.4f | %.4f |", 23 / ln2 / 60, 20.5 / ln2 / 60, 18 / ln2 / 60);
  EXPECT_NE(md.find(row), std::string::npos) << row << "\n" << md;
  std::snprintf(row, sizeof row, "| 67%% (2) | %.4f | %.4f | %.4f |", 19 / ln2 / 60, 19 / ln2 / 60, 16 / ln2 / 60);
  EXPECT_NE(md.find(row), std::string::npos) << row << "\n" << md;
  EXPECT_EQ(md.find("| 0% (0) |", md.find("| 0% (0) |") + 1), std::string::npos) << "a share repeated\n" << md;
  const auto j = eval::routing_curve_json(t, c);
  EXPECT_EQ(j["fallback"], "g");
  EXPECT_EQ(j["oracle"].size(), 4u);
  EXPECT_NEAR(j["router"][2]["value"].get<double>(), 19 / ln2 / 60, 1e-12);

  EXPECT_THROW(eval::routing_curve(t, "nobody", {{"x", {{0, 1}, {0, 1}, {0, 1}}}}), Error);
  EXPECT_THROW(eval::routing_curve(t, "g", {{"x", {{3, 1}, {0, 1}, {0, 1}}}}), Error);  // no model #3
  EXPECT_THROW(eval::routing_curve(t, "g", {{"y", {{0, 1}}}}), Error);                  // g not scored on y
}

TEST(DomainTableCli, TwoRunsScoredOnTheSameWindowsAsSlmEvalAlone) {
  const std::string dir = fresh_dir("domain_table"), data = dir + "/shards";
  ::mkdir(data.c_str(), 0755);
  write_counting_shards(data, "count", 48, 48, 11);
  write_counting_shards(data, "other", 48, 48, 12);
  const std::string recipe = write_recipe(dir, micro_hybrid_json());
  for (const char* run : {"a", "b"}) {
    auto r = run_slm("train --recipe " + recipe + " --data " + data + " --out " + dir + "/" + run +
                     " --steps 3 --batch 2 --seq-len 16 --seed " + (std::string(run) == "a" ? "1" : "2") +
                     " --warmup 1 --eval-every 0 --threads 1 --tokenizer none");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  const std::string out = dir + "/report";
  auto r = run_slm("eval domains --model a=" + dir + "/a --model b=" + dir + "/b --routes a=count --data " + data +
                   " --tokenizer none --batch 2 --seq-len 16 --batches 2 --threads 1 --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("| domain | a | b | oracle route |"), std::string::npos) << r.out;
  for (const char* f : {"/domain-table.md", "/domain-table.json", "/domain-table.png"}) {
    struct stat st {};
    EXPECT_EQ(::stat((out + f).c_str(), &st), 0) << f;
    EXPECT_GT(st.st_size, 0) << f;
  }
  const auto table = nlohmann::json::parse(read_file(out + "/domain-table.json"));
  EXPECT_EQ(table["measure"], "loss");
  EXPECT_EQ(table["oracle"]["count"], "a");
  for (const char* run : {"a", "b"}) {
    auto alone =
        run_slm("eval --checkpoint " + dir + "/" + run + " --data " + data +
                " --domains count,other --tokenizer none --batch 2 --seq-len 16 --batches 2 --threads 1 --json");
    ASSERT_EQ(alone.code, 0) << alone.out;
    const auto j = nlohmann::json::parse(alone.out.substr(alone.out.find('{')));
    for (const char* d : {"count", "other"})
      EXPECT_DOUBLE_EQ(table["scores"][run][d]["loss"].get<double>(), j["domains"][d]["loss"].get<double>())
          << run << " " << d;
  }
}

}  // namespace
}  // namespace slm::test
