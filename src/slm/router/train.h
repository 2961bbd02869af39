#pragma once
// Training and evaluating the router on the orchestration corpus (`slm data build --domain orchestration`:
// records with "text" and "label", one JSON object a line, split into train/validation/test.jsonl).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "slm/router/classifier.h"

namespace slm::router {

struct LabelledText {
  std::string text, label;
};

// The records of one .jsonl file. Throws slm::Error naming the file and line for a record without a string
// "text" and "label".
std::vector<LabelledText> read_labelled(const std::string& jsonl_path);

struct TrainOptions {
  FeatureOptions features;
  int epochs = 20;
  size_t batch = 16;
  double learning_rate = 2.0;  // features have unit length, so steps of this size are stable
  double l2 = 1e-5;
  uint64_t seed = 0;  // the example order of every epoch
};

struct EpochReport {
  int epoch = 0;                    // 1-based
  double train_loss = 0;            // mean cross entropy over the epoch's batches
  double validation_accuracy = -1;  // -1 without validation data
};

// Trains on `train` (the labels are those seen there, sorted; each label's examples weighted by the inverse of its
// count, so every label weighs the same) for options.epochs epochs and returns the weights
// of the epoch with the best validation accuracy (the last epoch without validation data). on_epoch sees each
// epoch's report. Throws slm::Error for an empty training set, fewer than two labels, or validation labels that
// training never saw.
Classifier train_router(const std::vector<LabelledText>& train, const std::vector<LabelledText>& validation,
                        const TrainOptions& options, const std::function<void(const EpochReport&)>& on_epoch = {});

struct Evaluation {
  std::vector<std::string> labels;
  uint64_t examples = 0, correct = 0, top2_correct = 0;
  std::vector<std::vector<uint64_t>> confusion;  // [true label][predicted label]
  double accuracy() const { return examples ? static_cast<double>(correct) / examples : 0; }
  double top2_accuracy() const { return examples ? static_cast<double>(top2_correct) / examples : 0; }
};

// Throws slm::Error for a label the classifier does not know.
Evaluation evaluate(const Classifier& classifier, const std::vector<LabelledText>& data);

}  // namespace slm::router
