// The serving fields of ensemble manifests, and loading specialists from one.
#include <gtest/gtest.h>

#include <fstream>

#include "slm/recipe/ensemble.h"
#include "slm/server/specialists.h"
#include "test_util.h"

namespace slm::server {
namespace {

TEST(ServerManifest, ServingFieldsResolveAgainstTheManifestAndOldManifestsStillRead) {
  const Ensemble e = load_ensemble(test::source_path("recipes/ensembles/tiny-serve.json"));
  ASSERT_EQ(e.specialists.size(), 2u);
  EXPECT_EQ(e.router, test::source_path("out/router/router.bin"));
  EXPECT_EQ(e.specialists[0].tokenizer, test::source_path("tokenizer/slm-code-512.model"));
  EXPECT_EQ(e.specialists[1].routes, (std::vector<std::string>{"cmake", "shell", "debug"}));
  const Ensemble old = load_ensemble(test::source_path("recipes/ensembles/product.json"));
  EXPECT_TRUE(old.router.empty());
  for (const auto& s : old.specialists) {
    EXPECT_EQ(s.routes, std::vector<std::string>{s.name});
    EXPECT_TRUE(s.tokenizer.empty());
  }
}

TEST(ServerManifest, LoadingRefusesWhatCannotBeServed) {
  const std::string dir = testing::TempDir();
  const std::string path = dir + "/serve_manifest.json";
  auto write = [&](const std::string& specialist_extra) {
    std::ofstream(path) << R"({"name": "t", "specialists": [{"name": "a", "domain": "d", "recipe": ")" +
                               test::source_path("recipes/tiny-hybrid.json") + "\"" + specialist_extra + "}]}";
  };
  auto refused = [&](const LoadOptions& o, const std::string& fragment) {
    try {
      Specialists::from_manifest(load_ensemble(path), o);
      ADD_FAILURE() << "loaded; expected: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  write("");
  refused({}, "no tokenizer");
  write(R"(, "tokenizer": ")" + test::source_path("tokenizer/slm-code-512.model") + "\"");
  refused({}, "no checkpoint");
  LoadOptions random;
  random.allow_random_weights = true;
  const auto s = Specialists::from_manifest(load_ensemble(path), random);
  EXPECT_EQ(s.all().size(), 1u);
  EXPECT_EQ(s.all()[0]->weights, "random");
  EXPECT_FALSE(s.has_router());
  write(R"(, "tokenizer": ")" + test::source_path("tokenizer/slm-code-32k.model") + "\"");
  refused(random, "do not fit the recipe's vocabulary of 512");
  write(R"(, "routes": "cpp")");
  refused(random, "routes");
}

}  // namespace
}  // namespace slm::server
