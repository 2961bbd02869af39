// slm nvfp4 encode/decode as a user runs them: JSON shape, the hand-computed block, round trip, exit code 2.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "test_util.h"

using slm::test::CliResult;
using slm::test::run_slm;

namespace {


const char* kBlock = "0 0.6 -1.2 2.0 2.4 -3.6 4.4 5.4\n-6.2 7.2 9.0 -10.6 12.0 0.2 -0.9 11.0";

}  // namespace

// The hand-computed block of test_nvfp4.cpp (amax 12: tensor scale fp32(1/224), block scale 0x7E = 448).
TEST(Nvfp4Cli, EncodePrintsTheHandComputedBlock) {
  CliResult r = run_slm("nvfp4 encode --json", kBlock);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.size(), 3u);
  EXPECT_EQ(j["tensor_scale"].get<double>(), static_cast<double>(static_cast<float>(1.0 / 224.0)));
  EXPECT_EQ(j["block_scales"], nlohmann::json::array({126}));
  EXPECT_EQ(j["codes"], nlohmann::json::parse("[0,1,9,2,2,12,4,5,13,6,6,15,7,0,9,7]"));
}

TEST(Nvfp4Cli, DecodeReversesEncode) {
  CliResult e = run_slm("nvfp4 encode --json", "1 -2 3.3 0 1e-3 5 6 7 8 9 10 11 12 13 14 15 16 -40 0.5");
  ASSERT_EQ(e.code, 0) << e.out;
  auto j = nlohmann::json::parse(e.out);
  EXPECT_EQ(j["codes"].size(), 19u);
  EXPECT_EQ(j["block_scales"].size(), 2u);
  CliResult d = run_slm("nvfp4 decode --json", e.out);
  ASSERT_EQ(d.code, 0) << d.out;
  std::istringstream in(d.out);
  std::vector<double> v;
  double x;
  while (in >> x) v.push_back(x);
  ASSERT_EQ(v.size(), 19u) << d.out;
  // Decoded values: code value * block scale * tensor scale, recomputed here from the JSON.
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (size_t i = 0; i < v.size(); ++i) {
    int c = j["codes"][i];
    int s = j["block_scales"][i / 16];
    int e4 = (s >> 3) & 15, m = s & 7;
    double S = e4 == 0 ? std::ldexp(m, -9) : std::ldexp(8.0 + m, e4 - 10);
    double want = (c & 8 ? -1 : 1) * mags[c & 7] * S * j["tensor_scale"].get<double>();
    EXPECT_NEAR(v[i], want, 1e-6 * std::fabs(want) + 1e-12) << i;
  }
  // Re-encoding the decoded values reproduces the codes.
  CliResult e2 = run_slm("nvfp4 encode --json", d.out);
  ASSERT_EQ(e2.code, 0) << e2.out;
  EXPECT_EQ(nlohmann::json::parse(e2.out)["codes"], j["codes"]);
}

TEST(Nvfp4Cli, BadInputExitsWithCode2AndAClearMessage) {
  CliResult r = run_slm("nvfp4 encode --json", "1 2 abc");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("'abc' is not a number"), std::string::npos) << r.out;
  r = run_slm("nvfp4 encode --json", "");
  EXPECT_EQ(r.code, 2) << r.out;
  r = run_slm("nvfp4 encode --json", "1 nan");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("flat index 1"), std::string::npos) << r.out;
  r = run_slm("nvfp4 decode --json", R"({"tensor_scale": 1, "block_scales": [56, 56], "codes": [1, 2]})");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("block_scales"), std::string::npos) << r.out;
  r = run_slm("nvfp4 decode --json", R"({"tensor_scale": 1, "block_scales": [56], "codes": [1, 16]})");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("codes[1]"), std::string::npos) << r.out;
  r = run_slm("nvfp4 decode --json", R"({"tensor_scale": 1, "block_scales": [127], "codes": [1]})");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("NaN"), std::string::npos) << r.out;
  r = run_slm("nvfp4 decode --json", R"({"tensor_scale": 1, "block_scale": [56], "codes": [1]})");
  EXPECT_EQ(r.code, 2) << r.out;
  r = run_slm("nvfp4 decode --json", "not json");
  EXPECT_EQ(r.code, 2) << r.out;
}
