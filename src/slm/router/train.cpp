#include "slm/router/train.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "slm/util/error.h"

namespace slm::router {

std::vector<LabelledText> read_labelled(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot be read");
  std::vector<LabelledText> out;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string() || !j.contains("label") ||
        !j["label"].is_string())
      throw Error(path + ":" + std::to_string(n) +
                  ": expected a JSON object with string \"text\" and \"label\" (an orchestration corpus record)");
    out.push_back({j["text"].get<std::string>(), j["label"].get<std::string>()});
  }
  return out;
}

namespace {

std::vector<Example> featurize(const Classifier& c, const std::vector<LabelledText>& data) {
  std::vector<Example> out;
  out.reserve(data.size());
  for (const auto& d : data) out.push_back({extract_features(d.text, c.features()), c.label_index(d.label)});
  return out;
}

double accuracy(const Classifier& c, const std::vector<Example>& data) {
  size_t ok = 0;
  for (const auto& e : data) ok += top_k(c.probabilities(e.x), 1)[0] == e.label;
  return data.empty() ? 0 : static_cast<double>(ok) / data.size();
}

}  // namespace

Classifier train_router(const std::vector<LabelledText>& train, const std::vector<LabelledText>& validation,
                        const TrainOptions& o, const std::function<void(const EpochReport&)>& on_epoch) {
  if (train.empty()) throw Error("router train: no training examples");
  if (o.epochs < 1 || o.batch < 1 || !(o.learning_rate > 0) || o.l2 < 0)
    throw Error("router train: need epochs >= 1, batch >= 1, learning_rate > 0 and l2 >= 0");
  std::set<std::string> label_set;
  for (const auto& t : train) label_set.insert(t.label);
  Classifier model({label_set.begin(), label_set.end()}, o.features);
  auto train_x = featurize(model, train);
  // Each label carries the same total weight (weights n / (labels x count), mean 1), so a label with fewer
  // requests (a corpus built with --router-unbalanced-train) is not outvoted by the larger ones.
  std::vector<size_t> count(model.classes(), 0);
  for (const auto& e : train_x) ++count[e.label];
  for (auto& e : train_x)
    e.weight = static_cast<double>(train_x.size()) / (static_cast<double>(model.classes()) * count[e.label]);
  const auto val_x = featurize(model, validation);

  std::vector<size_t> order(train_x.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(o.seed);
  Classifier best = model;
  double best_acc = -1;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    // Linear decay to a tenth over the run: large steps early, fine ones at the end.
    const double lr = o.learning_rate * (1.0 - 0.9 * (epoch - 1) / std::max(1, o.epochs - 1));
    double loss = 0;
    size_t batches = 0;
    std::vector<const Example*> batch;
    for (size_t i = 0; i < order.size(); i += o.batch) {
      batch.clear();
      for (size_t j = i; j < std::min(order.size(), i + o.batch); ++j) batch.push_back(&train_x[order[j]]);
      loss += model.gradient_step(batch, lr, o.l2);
      ++batches;
    }
    EpochReport rep{epoch, loss / batches, val_x.empty() ? -1.0 : accuracy(model, val_x)};
    if (on_epoch) on_epoch(rep);
    if (val_x.empty() || rep.validation_accuracy > best_acc) {
      best_acc = rep.validation_accuracy;
      best = model;
    }
  }
  return best;
}

Evaluation evaluate(const Classifier& c, const std::vector<LabelledText>& data) {
  Evaluation ev;
  ev.labels = c.labels();
  ev.confusion.assign(c.classes(), std::vector<uint64_t>(c.classes(), 0));
  for (const auto& d : data) {
    const size_t truth = c.label_index(d.label);
    const auto top = top_k(c.classify(d.text), 2);
    ++ev.examples;
    ++ev.confusion[truth][top[0]];
    ev.correct += top[0] == truth;
    ev.top2_correct += std::find(top.begin(), top.end(), truth) != top.end();
  }
  return ev;
}

}  // namespace slm::router
