#pragma once
// The router's classifier: multinomial logistic regression over hashed n-gram features (features.h).
//   logits_c = b_c + sum_f x_f W[f, c],   p = softmax(logits)
// Training minimises the mean cross entropy of a mini-batch plus (l2 / 2)·|W|^2 by plain gradient steps
// (train.h runs the epochs). Pure C++ on one core: a request costs one feature pass and about
// (features x classes) multiply-adds.
//
// File format (versioned, little-endian; docs/serving.md): the 8 bytes "SLMROUTR", u32 version (2; 1 is read too), u32
// n, n bytes of a JSON header {"labels": [...], "features": {...}}, then W as float32 [buckets][classes], b as float32
// [classes], and a u64 hash64 (data/hashing.h) of every byte before it. A wrong magic, version, size or checksum
// is refused with a message naming the file.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slm/router/features.h"

namespace slm::router {

struct Example {
  SparseVector x;
  size_t label = 0;     // index into the classifier's labels
  double weight = 1.0;  // the example's share of the batch loss (train.h: inverse label frequency)
};

class Classifier {
 public:
  // Zero weights. Throws slm::Error for fewer than two labels, duplicates or bad feature options.
  Classifier(std::vector<std::string> labels, FeatureOptions features);

  const std::vector<std::string>& labels() const { return labels_; }
  const FeatureOptions& features() const { return features_; }
  size_t classes() const { return labels_.size(); }
  // Index of a label; throws slm::Error naming the known labels when absent.
  size_t label_index(const std::string& label) const;

  // Class probabilities of a feature vector / a request text, in label order.
  std::vector<double> probabilities(const SparseVector& x) const;
  std::vector<double> classify(std::string_view text) const { return probabilities(extract_features(text, features_)); }

  // One gradient step on the batch's mean weighted cross entropy (1/n) sum_i weight_i CE_i + (l2 / 2)|W|^2 (the bias
  // is not penalised). Returns that mean weighted cross entropy before the step.
  double gradient_step(const std::vector<const Example*>& batch, double learning_rate, double l2);

  float weight(uint32_t feature, size_t cls) const { return w_[static_cast<size_t>(feature) * classes() + cls]; }
  float bias(size_t cls) const { return b_[cls]; }

  void save(const std::string& path) const;
  // Throws slm::Error naming the file for a missing file, wrong magic or version, a malformed header, a size
  // that does not match the header, or a checksum mismatch.
  static Classifier load(const std::string& path);

 private:
  std::vector<std::string> labels_;
  FeatureOptions features_;
  std::vector<float> w_;  // [buckets][classes]
  std::vector<float> b_;  // [classes]
};

// The indices of the k largest probabilities, largest first (ties: lower index first).
std::vector<size_t> top_k(const std::vector<double>& probabilities, size_t k);

}  // namespace slm::router
