// The router classifier against hand computations and toy data it must separate, its file format, and the CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "slm/data/hashing.h"
#include "slm/router/route.h"
#include "slm/router/train.h"
#include "slm/util/files.h"
#include "test_util.h"

namespace slm::router {
namespace {

FeatureOptions small_features() {
  FeatureOptions f;
  f.bucket_bits = 12;
  return f;
}

// Three classes of made-up requests, each drawn from its own words (plus shared filler), so a linear model over
// word features separates them exactly.
std::vector<LabelledText> toy_requests(size_t per_class, uint64_t seed) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> classes = {
      {"cmake", {"add_library", "target_link_libraries", "find_package", "CMAKE_CXX_STANDARD", "project"}},
      {"shell", {"grep", "sed", "awk", "xargs", "fi", "esac"}},
      {"debug", {"AddressSanitizer", "heap-use-after-free", "SIGSEGV", "backtrace", "frame"}}};
  const std::vector<std::string> filler = {"please", "help", "this", "the", "with", "code", "here"};
  std::mt19937_64 rng(seed);
  std::vector<LabelledText> out;
  for (size_t n = 0; n < per_class; ++n)
    for (const auto& [label, words] : classes) {
      std::string text;
      for (int w = 0; w < 8; ++w) {
        const auto& pool = rng() % 2 ? words : filler;
        text += pool[rng() % pool.size()] + " ";
      }
      text += words[rng() % words.size()];
      out.push_back({text, label});
    }
  return out;
}

// A label counts once, for the first model that lists it; labels no model lists count for none.
TEST(RouteMass, FirstModelListingALabelTakesItsProbability) {
  const std::vector<std::string> labels = {"a", "b", "c", "d"};
  const std::vector<double> p = {0.4, 0.3, 0.2, 0.1};
  auto r = router::route_mass(p, labels, {{"b"}, {"a", "b"}, {"c"}});
  ASSERT_EQ(r.mass.size(), 3u);
  EXPECT_DOUBLE_EQ(r.mass[0], 0.3);  // b, listed first by model 0
  EXPECT_DOUBLE_EQ(r.mass[1], 0.4);  // a only: b went to model 0
  EXPECT_DOUBLE_EQ(r.mass[2], 0.2);
  EXPECT_DOUBLE_EQ(r.total, 0.9);  // nobody answers d
  EXPECT_EQ(r.best, 1u);
  // Listing b first in model 1 instead moves its mass: the manifest's order decides.
  r = router::route_mass(p, labels, {{"a", "b"}, {"b"}, {"c"}});
  EXPECT_DOUBLE_EQ(r.mass[0], 0.7);
  EXPECT_DOUBLE_EQ(r.mass[1], 0.0);
  EXPECT_EQ(r.best, 0u);
  // A tie goes to the first model; a model with no labels gets nothing.
  r = router::route_mass({0.5, 0.5}, {"a", "b"}, {{}, {"b"}, {"a"}});
  EXPECT_DOUBLE_EQ(r.mass[0], 0.0);
  EXPECT_EQ(r.best, 1u);
  EXPECT_THROW(router::route_mass(p, labels, {}), Error);
}

TEST(RouterClassifier, GradientStepMatchesHandComputation) {
  FeatureOptions f;
  f.bucket_bits = 4;
  Classifier c({"a", "b"}, f);
  Example e{{{1, 3}, {1.0f, 2.0f}}, 0};
  // Zero weights: p = (1/2, 1/2), loss ln 2; error p - onehot = (-1/2, 1/2); W[f, k] -= lr x_f err_k.
  EXPECT_NEAR(c.gradient_step({&e}, 0.1, 0.0), std::log(2.0), 1e-12);
  EXPECT_NEAR(c.weight(1, 0), 0.05, 1e-7);
  EXPECT_NEAR(c.weight(3, 0), 0.10, 1e-7);
  EXPECT_NEAR(c.weight(1, 1), -0.05, 1e-7);
  EXPECT_NEAR(c.weight(3, 1), -0.10, 1e-7);
  EXPECT_NEAR(c.bias(0), 0.05, 1e-7);
  EXPECT_NEAR(c.bias(1), -0.05, 1e-7);
  EXPECT_EQ(c.weight(2, 0), 0.0f);
  // Second step, by hand: z0 = 0.05 + 1(0.05) + 2(0.10) = 0.3, z1 = -0.3, p0 = 1 / (1 + e^-0.6).
  const double p0 = 1.0 / (1.0 + std::exp(-0.6));
  const auto p = c.probabilities(e.x);
  EXPECT_NEAR(p[0], p0, 1e-6);
  // With l2 = 0.5 the weights first shrink by (1 - 0.1 * 0.5) = 0.95; the bias does not.
  EXPECT_NEAR(c.gradient_step({&e}, 0.1, 0.5), -std::log(p0), 1e-6);
  EXPECT_NEAR(c.weight(1, 0), 0.05 * 0.95 + 0.1 * (1 - p0) * 1.0, 1e-6);
  EXPECT_NEAR(c.weight(3, 1), -0.10 * 0.95 - 0.1 * (1 - p0) * 2.0, 1e-6);
  EXPECT_NEAR(c.bias(0), 0.05 + 0.1 * (1 - p0), 1e-6);
}

TEST(RouterClassifier, BatchStepIsTheMeanOfItsExamples) {
  FeatureOptions f;
  f.bucket_bits = 4;
  Classifier c({"a", "b", "c"}, f);
  Example e1{{{2}, {1.0f}}, 0}, e2{{{2}, {1.0f}}, 2};
  c.gradient_step({&e1, &e2}, 1.0, 0.0);
  // p = 1/3 each; errors (-2/3, 1/3, 1/3) and (1/3, 1/3, -2/3): mean (-1/6, 1/3, -1/6).
  EXPECT_NEAR(c.weight(2, 0), 1.0 / 6, 1e-7);
  EXPECT_NEAR(c.weight(2, 1), -1.0 / 3, 1e-7);
  EXPECT_NEAR(c.weight(2, 2), 1.0 / 6, 1e-7);
}

TEST(RouterFeatures, UnitLengthSortedAndBounded) {
  FeatureOptions f = small_features();
  const auto v = extract_features("target_link_libraries(app PRIVATE fmt::fmt) # link it\n", f);
  ASSERT_GT(v.size(), 10u);
  double n2 = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    n2 += v.value[i] * v.value[i];
    EXPECT_LT(v.index[i], f.buckets());
    if (i) {
      EXPECT_LT(v.index[i - 1], v.index[i]);
    }
  }
  EXPECT_NEAR(n2, 1.0, 1e-5);
  EXPECT_EQ(extract_features("", f).size(), 0u);
  // Only the first max_bytes are read.
  f.max_bytes = 8;
  EXPECT_EQ(extract_features("abcdefgh", f).index, extract_features("abcdefgh and much more text", f).index);
}

// A weight scales the example's loss and error: weight 3 on the hand-computed step above triples every change.
TEST(RouterClassifier, WeightedStepScalesTheExamplesError) {
  FeatureOptions f;
  f.bucket_bits = 4;
  Classifier c({"a", "b"}, f);
  Example e{{{1, 3}, {1.0f, 2.0f}}, 0, 3.0};
  EXPECT_NEAR(c.gradient_step({&e}, 0.1, 0.0), 3 * std::log(2.0), 1e-12);
  EXPECT_NEAR(c.weight(1, 0), 0.15, 1e-7);
  EXPECT_NEAR(c.weight(3, 1), -0.30, 1e-7);
  EXPECT_NEAR(c.bias(0), 0.15, 1e-7);
}

// Counted by hand (2^26 buckets: no collisions among a dozen features), each feature occurring once, so every
// value is 1/sqrt(count).
TEST(RouterFeatures, LineShapesAndTrigramsAddHandCountedFeatures) {
  FeatureOptions f;
  f.bucket_bits = 26;
  // "+ a": words "+", "a", bigram "+ a", byte 3-gram "+ a".
  EXPECT_EQ(extract_features("+ a", f).size(), 4u);
  f.line_shapes = true;  // + first two bytes "+ ", first word "+", last two bytes " a"
  const auto v = extract_features("+ a", f);
  ASSERT_EQ(v.size(), 7u);
  for (float x : v.value) EXPECT_NEAR(x, 1 / std::sqrt(7.0), 1e-6);
  f.line_shapes = false;
  // "a b c": 3 words, 2 bigrams, byte n-grams 3 + 2 + 1; trigrams add "a b c".
  EXPECT_EQ(extract_features("a b c", f).size(), 11u);
  f.word_trigrams = true;
  EXPECT_EQ(extract_features("a b c", f).size(), 12u);
}

TEST(RouterTrain, SeparableToyDataReachesFullAccuracy) {
  TrainOptions o;
  o.features = small_features();
  o.epochs = 10;
  const auto model = train_router(toy_requests(40, 1), toy_requests(10, 2), o);
  EXPECT_EQ(model.labels(), (std::vector<std::string>{"cmake", "debug", "shell"}));
  const auto ev = evaluate(model, toy_requests(20, 3));
  EXPECT_EQ(ev.examples, 60u);
  EXPECT_EQ(ev.correct, 60u);
  EXPECT_EQ(ev.top2_correct, 60u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ev.confusion[i][i], 20u);
}

TEST(RouterTrain, UnknownValidationLabelIsRefused) {
  TrainOptions o;
  o.features = small_features();
  o.epochs = 1;
  try {
    train_router(toy_requests(5, 1), {{"some text", "review"}}, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown label \"review\""), std::string::npos) << e.what();
  }
}

TEST(RouterFile, RoundTripKeepsEveryProbability) {
  TrainOptions o;
  o.features = small_features();
  o.epochs = 3;
  const auto model = train_router(toy_requests(20, 4), {}, o);
  const std::string path = testing::TempDir() + "/router_roundtrip.bin";
  model.save(path);
  const auto back = Classifier::load(path);
  EXPECT_EQ(back.labels(), model.labels());
  EXPECT_EQ(back.features().bucket_bits, 12u);
  for (const auto& t : toy_requests(5, 5)) EXPECT_EQ(back.classify(t.text), model.classify(t.text));
}

// A version 1 file (written here byte by byte as that format was: no word_trigrams or line_shapes in its header)
// loads with both off and gives the weights it holds.
TEST(RouterFile, VersionOneFileLoadsWithTheNewFeaturesOff) {
  const std::string header =
      R"({"features":{"bucket_bits":4,"char_max":0,"char_min":3,"max_bytes":4096,"word_bigrams":false},)"
      R"("labels":["x","y"]})";
  std::string bytes = "SLMROUTR";
  const uint32_t version = 1, n = static_cast<uint32_t>(header.size());
  bytes.append(reinterpret_cast<const char*>(&version), 4);
  bytes.append(reinterpret_cast<const char*>(&n), 4);
  bytes += header;
  std::vector<float> wb(16 * 2 + 2, 0.0f);
  wb[16 * 2] = std::log(3.0f);  // bias x: p(x) = 3 / 4 for any text
  bytes.append(reinterpret_cast<const char*>(wb.data()), wb.size() * sizeof(float));
  const uint64_t sum = data::hash64(bytes, 0x726f75746572ULL);
  bytes.append(reinterpret_cast<const char*>(&sum), 8);
  const std::string path = testing::TempDir() + "/router_v1.bin";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  const auto c = Classifier::load(path);
  EXPECT_FALSE(c.features().word_trigrams);
  EXPECT_FALSE(c.features().line_shapes);
  EXPECT_NEAR(c.classify("anything")[0], 0.75, 1e-6);
}

TEST(RouterFile, CorruptFilesAreRefusedWithTheirName) {
  Classifier c({"x", "y"}, small_features());
  const std::string path = testing::TempDir() + "/router_corrupt.bin";
  c.save(path);
  const std::string good = read_file(path);
  auto expect_refused = [&](const std::string& bytes, const std::string& why) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      Classifier::load(path);
      ADD_FAILURE() << "accepted a file with " << why;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << msg;
    }
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x40;
  expect_refused(flipped, "checksum mismatch");
  expect_refused(good.substr(0, good.size() - 100), "checksum mismatch");
  expect_refused("GGUF" + good.substr(4), "SLMROUTR");
  std::string v3 = good;
  v3[8] = 3;
  expect_refused(v3, "format version 3");
  expect_refused("", "SLMROUTR");
}

TEST(RouterCli, TrainEvalClassify) {
  const std::string dir = testing::TempDir() + "/router_cli_" + std::to_string(getpid());
  make_dirs(dir);
  auto write = [&](const std::string& split, const std::vector<LabelledText>& data) {
    std::ofstream out(dir + "/" + split + ".jsonl");
    for (const auto& d : data) out << nlohmann::json{{"text", d.text}, {"label", d.label}}.dump() << "\n";
  };
  write("train", toy_requests(40, 11));
  write("validation", toy_requests(5, 12));
  write("test", toy_requests(10, 13));
  auto r = test::run_slm("router train --data " + dir + " --out " + dir + "/r.bin --epochs 8 --bucket-bits 12");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("validation accuracy"), std::string::npos) << r.out;
  r = test::run_slm("router eval --model " + dir + "/r.bin --data " + dir + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["examples"], 30);
  EXPECT_EQ(j["accuracy"], 1.0);
  EXPECT_EQ(j["confusion"][1][1], 10);
  r = test::run_slm("router classify --model " + dir + "/r.bin --json 'AddressSanitizer: heap-use-after-free'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["label"], "debug");
  r = test::run_slm("router classify --model " + dir + "/train.jsonl hello");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("not a usable router model"), std::string::npos) << r.out;
  remove_tree(dir);
}

}  // namespace
}  // namespace slm::router
