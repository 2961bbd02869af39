// The shipped lineup's manifest fields (checksums, training tokens, held-out bpb), `slm ensemble verify` against
// files whose SHA-256 is known independently (FIPS 180-4 test vectors, checked with sha256sum), and where the
// shipped manifest is looked for.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "slm/recipe/ensemble.h"
#include "slm/util/files.h"
#include "slm/util/sha256.h"
#include "test_util.h"

namespace slm {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// FIPS 180-4 / NIST examples: SHA-256 of "abc", of the empty message and of the 448-bit message.
const std::string kAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
const std::string kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const std::string k448 = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
const std::string k448Message = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
// `printf abd | sha256sum`: "abc" with its last byte flipped from 0x63 to 0x64.
const std::string kAbd = "a52d159f262b2c6ddb724a61840befc36eb30c88877a4030b65cbe86298449c9";

// A fresh directory of this test's own (ctest runs test cases in parallel processes).
fs::path fresh_dir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  fs::path d =
      fs::path(testing::TempDir()) / ("ensemble_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
  remove_tree(d.string());  // not fs::remove_all: libtorch.so's copy crashes (README, "Known pitfall")
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

// A manifest in the shipped layout: two specialists with weights and checksums, a router, the repository's
// recipe and tokenizer (absolute paths, which the manifest's directory does not change).
Json shipped_manifest() {
  return Json::parse(R"({"name": "shipped", "description": "test lineup", "router": "router.bin",
    "router_sha256": ")" +
                     kEmpty + R"(", "specialists": [
    {"name": "cpp", "domain": "C++ code", "recipe": ")" +
                     test::source_path("recipes/tiny-hybrid.json") + R"(",
     "checkpoint": "cpp/model.safetensors", "sha256": ")" +
                     kAbc + R"(",
     "tokenizer": ")" +
                     test::source_path("tokenizer/slm-code-512.model") + R"(", "routes": ["cpp"],
     "training_tokens": 123, "heldout_bpb": 0.85},
    {"name": "cmake", "domain": "CMake", "recipe": ")" +
                     test::source_path("recipes/tiny-hybrid.json") + R"(",
     "checkpoint": "cmake/model.safetensors", "sha256": ")" +
                     k448 + R"(",
     "tokenizer": ")" +
                     test::source_path("tokenizer/slm-code-512.model") + R"("}]})");
}

// The manifest and the files its checksums describe.
fs::path write_shipped(const fs::path& dir, const Json& manifest = shipped_manifest()) {
  write_file(dir / "models/cpp/model.safetensors", "abc");
  write_file(dir / "models/cmake/model.safetensors", k448Message);
  write_file(dir / "models/router.bin", "");
  write_file(dir / "models/ensemble.json", manifest.dump(2));
  return dir / "models/ensemble.json";
}

TEST(EnsembleManifest, ShippedFieldsAreReadAndPathsResolveAgainstTheManifest) {
  const fs::path dir = fresh_dir();
  Json m = shipped_manifest();
  m["specialists"][0]["sha256"] =
      "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";  // as some tools print
  const Ensemble e = load_ensemble(write_shipped(dir, m).string());
  EXPECT_EQ(e.router, (dir / "models/router.bin").string());
  EXPECT_EQ(e.router_sha256, kEmpty);
  ASSERT_EQ(e.specialists.size(), 2u);
  const auto& cpp = e.specialists[0];
  EXPECT_EQ(cpp.checkpoint, (dir / "models/cpp/model.safetensors").string());
  EXPECT_EQ(cpp.sha256, kAbc);  // lowercased, as sha256_file writes it
  ASSERT_TRUE(cpp.training_tokens.has_value());
  EXPECT_EQ(*cpp.training_tokens, 123);
  ASSERT_TRUE(cpp.heldout_bpb.has_value());
  EXPECT_DOUBLE_EQ(*cpp.heldout_bpb, 0.85);
  EXPECT_EQ(cpp.tokenizer, test::source_path("tokenizer/slm-code-512.model"));
  const auto& cmake = e.specialists[1];  // the optional fields absent
  EXPECT_EQ(cmake.sha256, k448);
  EXPECT_FALSE(cmake.training_tokens.has_value());
  EXPECT_FALSE(cmake.heldout_bpb.has_value());
  // Manifests without the new fields still read.
  for (const auto& s : load_ensemble(test::source_path("recipes/ensembles/product.json")).specialists) {
    EXPECT_TRUE(s.sha256.empty());
    EXPECT_FALSE(s.training_tokens.has_value());
  }
}

TEST(EnsembleManifest, EachWrongTypeIsAnErrorNamingTheFileAndField) {
  const fs::path dir = fresh_dir();
  struct Case {
    std::string pointer;  // JSON pointer of the field set to value
    Json value;
    std::string field, fragment;
  };
  const std::vector<Case> cases = {
      {"/specialists/0/sha256", 42, "specialists[0].sha256", "expected a string, got"},
      {"/specialists/0/sha256", "ba7816bf", "specialists[0].sha256", "64 hex digits"},
      {"/specialists/0/sha256", std::string(64, 'g'), "specialists[0].sha256", "64 hex digits"},
      {"/router_sha256", true, "router_sha256", "expected a string, got"},
      {"/router_sha256", kAbc + "0", "router_sha256", "64 hex digits"},
      {"/specialists/0/training_tokens", "123", "specialists[0].training_tokens", "expected an integer, got"},
      {"/specialists/0/training_tokens", 1.5, "specialists[0].training_tokens", "expected an integer, got"},
      {"/specialists/0/training_tokens", -1, "specialists[0].training_tokens", "0 or more"},
      {"/specialists/0/heldout_bpb", "0.85", "specialists[0].heldout_bpb", "expected a number, got"},
      {"/specialists/0/heldout_bpb", Json::array({0.85}), "specialists[0].heldout_bpb", "expected a number, got"},
      {"/specialists/0/heldout_bpb", -0.5, "specialists[0].heldout_bpb", "0 or more"},
  };
  for (const auto& c : cases) {
    Json m = shipped_manifest();
    m[Json::json_pointer(c.pointer)] = c.value;
    const std::string path = write_shipped(dir, m).string();
    try {
      load_ensemble(path);
      ADD_FAILURE() << "accepted " << c.pointer << " = " << c.value.dump();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path + ": " + c.field + ": "), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.fragment), std::string::npos) << msg;
    }
  }
  // A checksum of nothing: sha256 without a checkpoint, router_sha256 without a router.
  Json m = shipped_manifest();
  m["specialists"][1].erase("checkpoint");
  EXPECT_THROW(
      {
        try {
          load_ensemble(write_shipped(dir, m).string());
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("specialists[1].sha256: given, but the specialist has no checkpoint"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  m = shipped_manifest();
  m.erase("router");
  EXPECT_THROW(load_ensemble(write_shipped(dir, m).string()), Error);
}

TEST(EnsembleVerify, Sha256FileMatchesTheKnownTestVectors) {
  const fs::path dir = fresh_dir();
  write_file(dir / "abc", "abc");
  write_file(dir / "empty", "");
  write_file(dir / "448", k448Message);
  EXPECT_EQ(sha256_file((dir / "abc").string()), kAbc);
  EXPECT_EQ(sha256_file((dir / "empty").string()), kEmpty);
  EXPECT_EQ(sha256_file((dir / "448").string()), k448);
}

TEST(EnsembleVerify, AGoodManifestPassesEveryFile) {
  const fs::path dir = fresh_dir();
  const Ensemble e = read_ensemble_manifest(write_shipped(dir).string());
  const auto files = verify_ensemble_files(e);
  // Two weights files, the router, the recipe and the tokenizer the two specialists share (each listed once).
  ASSERT_EQ(files.size(), 5u);
  for (const auto& f : files) {
    EXPECT_EQ(f.status, ManifestFile::Status::ok) << f.path << ": " << f.detail;
    EXPECT_FALSE(verification_failed(f, /*strict=*/true)) << f.path;
  }
  EXPECT_EQ(files[0].role, "weights of cpp");
  EXPECT_EQ(files[0].actual_sha256, kAbc);
  EXPECT_EQ(files[0].bytes, 3);
  EXPECT_EQ(files[2].role, "router");
  EXPECT_EQ(files[3].role, "recipe of cpp, cmake");
  EXPECT_EQ(files[4].role, "tokenizer of cpp, cmake");

  const auto r = test::run_slm("ensemble verify --strict " + (dir / "models/ensemble.json").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find((dir / "models/cpp/model.safetensors").string() + " (weights of cpp): sha256 " + kAbc),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("5 files: 5 ok, 0 mismatched, 0 missing, 0 invalid, 0 without a checksum"), std::string::npos)
      << r.out;
}

TEST(EnsembleVerify, AFlippedByteFailsNamingTheFileAndBothHashes) {
  const fs::path dir = fresh_dir();
  const fs::path manifest = write_shipped(dir);
  const fs::path weights = dir / "models/cpp/model.safetensors";
  write_file(weights, "abd");
  const auto files = verify_ensemble_files(read_ensemble_manifest(manifest.string()));
  EXPECT_EQ(files[0].status, ManifestFile::Status::mismatch);
  EXPECT_EQ(files[0].expected_sha256, kAbc);
  EXPECT_EQ(files[0].actual_sha256, kAbd);
  EXPECT_EQ(files[1].status, ManifestFile::Status::ok);

  const auto r = test::run_slm("ensemble verify " + manifest.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("MISMATCH"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(weights.string() + " (weights of cpp): sha256 mismatch: the manifest expects " + kAbc +
                       ", the file has " + kAbd),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("slm: error: ensemble verify: " + manifest.string() + ": " + weights.string() +
                       " (checksum mismatch)"),
            std::string::npos)
      << r.out;
}

TEST(EnsembleVerify, MissingFilesFailAndEachIsNamed) {
  const fs::path dir = fresh_dir();
  Json m = shipped_manifest();
  m["specialists"][1]["recipe"] = "../recipes/nosuch.json";  // a missing recipe is one failure among the others
  const fs::path manifest = write_shipped(dir, m);
  fs::remove(dir / "models/router.bin");
  const auto r = test::run_slm("ensemble verify " + manifest.string());
  EXPECT_EQ(r.code, 2) << r.out;
  const std::string router = (dir / "models/router.bin").string(), recipe = (dir / "recipes/nosuch.json").string();
  EXPECT_NE(r.out.find("MISSING"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(router + " (router): no such file"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(recipe + " (recipe of cmake): no such file"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(router + " (missing), " + recipe + " (missing)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 missing"), std::string::npos) << r.out;
}

TEST(EnsembleVerify, AFileWithoutAChecksumFailsOnlyWhenStrict) {
  const fs::path dir = fresh_dir();
  Json m = shipped_manifest();
  m.erase("router_sha256");
  const std::string manifest = write_shipped(dir, m).string();
  const auto lenient = test::run_slm("ensemble verify " + manifest);
  EXPECT_EQ(lenient.code, 0) << lenient.out;
  EXPECT_NE(lenient.out.find("(router): no checksum in the manifest (sha256 " + kEmpty + ")"), std::string::npos)
      << lenient.out;
  const auto strict = test::run_slm("ensemble verify --strict " + manifest);
  EXPECT_EQ(strict.code, 2) << strict.out;
  EXPECT_NE(strict.out.find((dir / "models/router.bin").string() + " (no checksum in the manifest)"), std::string::npos)
      << strict.out;
}

TEST(EnsembleShow, PrintsTheShippedFieldsInTextAndJson) {
  const fs::path dir = fresh_dir();
  const std::string manifest = write_shipped(dir).string();
  const auto text = test::run_slm("ensemble show " + manifest);
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("training tokens"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("123"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("0.8500"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("(" + kAbc + ")"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("router: " + (dir / "models/router.bin").string() + " (" + kEmpty + ")"), std::string::npos)
      << text.out;
  const auto json = test::run_slm("ensemble show --json " + manifest);
  ASSERT_EQ(json.code, 0) << json.out;
  const Json j = Json::parse(json.out);
  EXPECT_EQ(j["router_sha256"], kEmpty);
  EXPECT_EQ(j["specialists"][0]["sha256"], kAbc);
  EXPECT_EQ(j["specialists"][0]["training_tokens"], 123);
  EXPECT_DOUBLE_EQ(j["specialists"][0]["heldout_bpb"].get<double>(), 0.85);
  EXPECT_FALSE(j["specialists"][1].contains("training_tokens"));
}

TEST(EnsembleDefault, TheWorkingDirectoryFirstThenBesideTheBuildDirectoryThenNone) {
  const fs::path dir = fresh_dir();
  const fs::path repo = dir / "repo", work = dir / "work", exe = repo / "build" / "slm";
  fs::create_directories(work);
  EXPECT_EQ(default_ensemble_path(exe, work), "");
  EXPECT_EQ(
      default_ensemble_candidates(exe, work),
      (std::vector<std::string>{(work / "models/ensemble.json").string(), (repo / "models/ensemble.json").string()}));
  write_file(repo / "models/ensemble.json", "{}");
  EXPECT_EQ(default_ensemble_path(exe, work), (repo / "models/ensemble.json").string());
  write_file(work / "models/ensemble.json", "{}");
  EXPECT_EQ(default_ensemble_path(exe, work), (work / "models/ensemble.json").string());
  // A directory of that name is no manifest.
  fs::remove(work / "models/ensemble.json");
  fs::create_directories(work / "models/ensemble.json");
  EXPECT_EQ(default_ensemble_path(exe, work), (repo / "models/ensemble.json").string());
}

}  // namespace
}  // namespace slm
