#include "slm/router/classifier.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "slm/data/hashing.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::router {

namespace {

constexpr char kMagic[8] = {'S', 'L', 'M', 'R', 'O', 'U', 'T', 'R'};
// Version 2 added the word_trigrams and line_shapes feature options: a version 1 program would ignore them and
// compute other features, so it must refuse the file; version 1 files load with both off.
constexpr uint32_t kVersion = 2;
constexpr uint64_t kChecksumSeed = 0x726f75746572ULL;

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void softmax_in_place(std::vector<double>& z) {
  const double m = *std::max_element(z.begin(), z.end());
  double s = 0;
  for (auto& v : z) s += (v = std::exp(v - m));
  for (auto& v : z) v /= s;
}

}  // namespace

Classifier::Classifier(std::vector<std::string> labels, FeatureOptions features)
    : labels_(std::move(labels)), features_(features) {
  validate(features_);
  if (labels_.size() < 2) throw Error("router: a classifier needs at least two labels");
  std::set<std::string> seen;
  for (const auto& l : labels_)
    if (l.empty() || !seen.insert(l).second)
      throw Error("router: labels must be non-empty and distinct (\"" + l + "\")");
  w_.assign(static_cast<size_t>(features_.buckets()) * labels_.size(), 0.0f);
  b_.assign(labels_.size(), 0.0f);
}

size_t Classifier::label_index(const std::string& label) const {
  for (size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] == label) return i;
  std::string known;
  for (const auto& l : labels_) known += (known.empty() ? "" : ", ") + l;
  throw Error("router: unknown label \"" + label + "\" (labels: " + known + ")");
}

std::vector<double> Classifier::probabilities(const SparseVector& x) const {
  const size_t c = classes();
  std::vector<double> z(b_.begin(), b_.end());
  for (size_t i = 0; i < x.size(); ++i) {
    if (x.index[i] >= features_.buckets()) throw Error("router: feature index past the classifier's buckets");
    const float* row = &w_[static_cast<size_t>(x.index[i]) * c];
    for (size_t k = 0; k < c; ++k) z[k] += static_cast<double>(x.value[i]) * row[k];
  }
  softmax_in_place(z);
  return z;
}

double Classifier::gradient_step(const std::vector<const Example*>& batch, double lr, double l2) {
  if (batch.empty()) throw Error("router: empty training batch");
  const size_t c = classes();
  const double scale = 1.0 / static_cast<double>(batch.size());
  // Every example's error (p - onehot) from the weights before the step: the gradient of the batch mean.
  std::vector<std::vector<double>> err;
  err.reserve(batch.size());
  double loss = 0;
  for (const Example* e : batch) {
    if (e->label >= c) throw Error("router: example label past the classifier's labels");
    auto p = probabilities(e->x);
    loss -= e->weight * std::log(std::max(p[e->label], 1e-300));
    p[e->label] -= 1.0;
    for (auto& v : p) v *= e->weight;
    err.push_back(std::move(p));
  }
  if (l2 > 0) {
    const auto decay = static_cast<float>(1.0 - lr * l2);
    for (auto& w : w_) w *= decay;
  }
  for (size_t n = 0; n < batch.size(); ++n) {
    const auto& x = batch[n]->x;
    for (size_t i = 0; i < x.size(); ++i) {
      float* row = &w_[static_cast<size_t>(x.index[i]) * c];
      const double g = lr * scale * x.value[i];
      for (size_t k = 0; k < c; ++k) row[k] -= static_cast<float>(g * err[n][k]);
    }
    for (size_t k = 0; k < c; ++k) b_[k] -= static_cast<float>(lr * scale * err[n][k]);
  }
  return loss * scale;
}

void Classifier::save(const std::string& path) const {
  const nlohmann::json features = {{"bucket_bits", features_.bucket_bits},     {"word_bigrams", features_.word_bigrams},
                                   {"word_trigrams", features_.word_trigrams}, {"line_shapes", features_.line_shapes},
                                   {"char_min", features_.char_min},           {"char_max", features_.char_max},
                                   {"max_bytes", features_.max_bytes}};
  const std::string header = nlohmann::json{{"labels", labels_}, {"features", features}}.dump();
  std::string out(kMagic, sizeof(kMagic));
  put(out, kVersion);
  put(out, static_cast<uint32_t>(header.size()));
  out += header;
  out.append(reinterpret_cast<const char*>(w_.data()), w_.size() * sizeof(float));
  out.append(reinterpret_cast<const char*>(b_.data()), b_.size() * sizeof(float));
  put(out, data::hash64(out, kChecksumSeed));
  make_parent_dirs(path);
  write_file_atomic(path, out);
}

Classifier Classifier::load(const std::string& path) {
  const std::string bytes = read_file(path);
  auto bad = [&](const std::string& why) { return Error(path + ": not a usable router model: " + why); };
  if (bytes.size() < sizeof(kMagic) + 8 + 8 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    throw bad("it does not start with \"SLMROUTR\" (make one with `slm router train`)");
  uint32_t version = 0, header_len = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&header_len, bytes.data() + 12, 4);
  if (version != 1 && version != kVersion)
    throw bad("format version " + std::to_string(version) + ", this program reads versions 1 to " +
              std::to_string(kVersion));
  if (16 + static_cast<uint64_t>(header_len) + 8 > bytes.size()) throw bad("truncated header");
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  if (data::hash64(std::string_view(bytes).substr(0, bytes.size() - 8), kChecksumSeed) != stored)
    throw bad("checksum mismatch (the file is damaged or truncated)");
  auto header = nlohmann::json::parse(bytes.substr(16, header_len), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object() || !header.contains("labels") || !header["labels"].is_array() ||
      !header.contains("features") || !header["features"].is_object())
    throw bad("malformed JSON header");
  FeatureOptions fo;
  std::vector<std::string> labels;
  try {
    const auto& f = header["features"];
    // get<uint32_t>() of a float or a negative number converts without a check (1e30: undefined behaviour).
    auto u32 = [&](const char* key) {
      const auto& v = f.at(key);
      if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX)
        throw bad(std::string("malformed JSON header: features.") + key + " is not a 32-bit unsigned integer");
      return v.get<uint32_t>();
    };
    fo.bucket_bits = u32("bucket_bits");
    fo.word_bigrams = f.at("word_bigrams").get<bool>();
    if (version >= 2) {
      fo.word_trigrams = f.at("word_trigrams").get<bool>();
      fo.line_shapes = f.at("line_shapes").get<bool>();
    }
    fo.char_min = u32("char_min");
    fo.char_max = u32("char_max");
    fo.max_bytes = u32("max_bytes");
    labels = header["labels"].get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("malformed JSON header: ") + e.what());
  }
  // The size the header implies, checked before the weights are allocated: 2^26 buckets of 200 labels would be 50 GB.
  try {
    validate(fo);
  } catch (const Error& e) {
    throw bad(e.what());
  }
  const uint64_t implied = 16 + uint64_t{header_len} + (uint64_t{fo.buckets()} + 1) * labels.size() * sizeof(float) + 8;
  if (bytes.size() != implied)
    throw bad("size " + std::to_string(bytes.size()) + " bytes does not match its header (" + std::to_string(implied) +
              " expected)");
  Classifier c = [&] {
    try {
      return Classifier(labels, fo);
    } catch (const Error& e) {
      throw bad(e.what());
    }
  }();
  const size_t payload = (c.w_.size() + c.b_.size()) * sizeof(float);
  if (bytes.size() != 16 + header_len + payload + 8)
    throw bad("size " + std::to_string(bytes.size()) + " bytes does not match its header (" +
              std::to_string(16 + header_len + payload + 8) + " expected)");
  const char* p = bytes.data() + 16 + header_len;
  std::memcpy(c.w_.data(), p, c.w_.size() * sizeof(float));
  std::memcpy(c.b_.data(), p + c.w_.size() * sizeof(float), c.b_.size() * sizeof(float));
  return c;
}

std::vector<size_t> top_k(const std::vector<double>& p, size_t k) {
  std::vector<size_t> idx(p.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  idx.resize(std::min(k, idx.size()));
  return idx;
}

}  // namespace slm::router
