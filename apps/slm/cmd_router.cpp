#include <chrono>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "slm/router/train.h"
#include "slm/util/error.h"

namespace slm::cli {

namespace {

// "DIR" (an orchestration corpus domain directory) means DIR/<split>.jsonl; a file is read as is.
std::string split_file(const std::string& data, const std::string& split) {
  if (data.size() > 6 && data.compare(data.size() - 6, 6, ".jsonl") == 0) return data;
  return data + "/" + split + ".jsonl";
}

void print_evaluation(const router::Evaluation& ev, double mean_ms, bool json) {
  if (json) {
    std::cout << nlohmann::json{{"labels", ev.labels},       {"examples", ev.examples},
                                {"accuracy", ev.accuracy()}, {"top2_accuracy", ev.top2_accuracy()},
                                {"confusion", ev.confusion}, {"mean_ms_per_request", mean_ms}}
                     .dump(2)
              << "\n";
    return;
  }
  std::printf("examples %llu  accuracy %.2f%%  top-2 accuracy %.2f%%  %.3f ms per request (one core)\n",
              static_cast<unsigned long long>(ev.examples), 100 * ev.accuracy(), 100 * ev.top2_accuracy(), mean_ms);
  std::printf("\nconfusion matrix (rows: true label, columns: predicted)\n%-10s", "");
  for (const auto& l : ev.labels) std::printf(" %9.9s", l.c_str());
  std::printf("\n");
  for (size_t i = 0; i < ev.labels.size(); ++i) {
    std::printf("%-10.10s", ev.labels[i].c_str());
    for (uint64_t n : ev.confusion[i]) std::printf(" %9llu", static_cast<unsigned long long>(n));
    std::printf("\n");
  }
}

}  // namespace

void add_router_command(CLI::App& app) {
  auto* r = app.add_subcommand("router", "Train, evaluate and run the request router (docs/serving.md)");
  r->require_subcommand(1);

  struct TrainFlags {
    std::string data, out;
    router::TrainOptions o;
  };
  auto t = std::make_shared<TrainFlags>();
  auto* train = r->add_subcommand("train", "Train the router on an orchestration corpus (slm data build)");
  train
      ->add_option("--data", t->data,
                   "orchestration corpus directory (holding train/validation.jsonl), e.g. out/corpus/orchestration")
      ->required();
  train->add_option("--out", t->out, "router model file to write")
      ->capture_default_str()
      ->default_val("out/router/router.bin");
  train->add_option("--epochs", t->o.epochs, "passes over the training split")->capture_default_str();
  train->add_option("--batch", t->o.batch, "examples per gradient step")->capture_default_str();
  train->add_option("--lr", t->o.learning_rate, "initial learning rate (decays linearly to a tenth)")
      ->capture_default_str();
  train->add_option("--l2", t->o.l2, "L2 penalty on the weights")->capture_default_str();
  train->add_option("--bucket-bits", t->o.features.bucket_bits, "feature table of 2^bits buckets")
      ->capture_default_str();
  train->add_option("--char-min", t->o.features.char_min, "shortest byte n-gram")->capture_default_str();
  train->add_option("--char-max", t->o.features.char_max, "longest byte n-gram (0: no byte n-grams)")
      ->capture_default_str();
  train->add_flag("--word-trigrams", t->o.features.word_trigrams, "add word trigram features");
  train->add_flag("--line-shapes", t->o.features.line_shapes,
                  "add line shape features (a line's first two bytes, first word, last two bytes)");
  train->add_option("--seed", t->o.seed, "example order")->capture_default_str();
  train->callback([t] {
    const auto tr = router::read_labelled(split_file(t->data, "train"));
    std::vector<router::LabelledText> val;
    if (t->data.find(".jsonl") == std::string::npos) val = router::read_labelled(split_file(t->data, "validation"));
    std::cerr << "slm: router: " << tr.size() << " training and " << val.size() << " validation requests\n";
    const auto start = std::chrono::steady_clock::now();
    auto model = router::train_router(tr, val, t->o, [&](const router::EpochReport& e) {
      std::cerr << "epoch " << std::setw(3) << e.epoch << "/" << t->o.epochs << "  train loss " << std::fixed
                << std::setprecision(4) << e.train_loss;
      if (e.validation_accuracy >= 0)
        std::cerr << "  validation accuracy " << std::setprecision(2) << 100 * e.validation_accuracy << "%";
      std::cerr << "\n";
    });
    model.save(t->out);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cerr << "slm: router: " << model.classes() << " labels, wrote " << t->out << " in " << std::setprecision(1)
              << s << " s (the best validation epoch's weights)\n";
  });

  struct EvalFlags {
    std::string model, data, split = "test";
    bool json = false;
  };
  auto e = std::make_shared<EvalFlags>();
  auto* eval = r->add_subcommand("eval", "Held-out accuracy, top-2 accuracy, confusion matrix and latency");
  eval->add_option("--model", e->model, "router model file (slm router train)")->required();
  eval->add_option("--data", e->data, "orchestration corpus directory or a .jsonl file")->required();
  eval->add_option("--split", e->split, "split of a corpus directory: test or validation")->capture_default_str();
  eval->add_flag("--json", e->json, "print one JSON object");
  eval->callback([e] {
    const auto model = router::Classifier::load(e->model);
    const auto data = router::read_labelled(split_file(e->data, e->split));
    if (data.empty()) throw Error(split_file(e->data, e->split) + ": no requests");
    const auto start = std::chrono::steady_clock::now();
    const auto ev = router::evaluate(model, data);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    print_evaluation(ev, ms / static_cast<double>(data.size()), e->json);
  });

  struct ClassifyFlags {
    std::string model, text;
    bool json = false;
  };
  auto c = std::make_shared<ClassifyFlags>();
  auto* classify = r->add_subcommand("classify", "Route one request: its labels by probability");
  classify->add_option("--model", c->model, "router model file (slm router train)")->required();
  classify->add_option("text", c->text, "request text (default: standard input)");
  classify->add_flag("--json", c->json, "print one JSON object");
  classify->callback([c] {
    const auto model = router::Classifier::load(c->model);
    if (c->text.empty()) {
      std::ostringstream ss;
      ss << std::cin.rdbuf();
      c->text = ss.str();
    }
    const auto start = std::chrono::steady_clock::now();
    const auto p = model.classify(c->text);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const auto order = router::top_k(p, p.size());
    if (c->json) {
      nlohmann::json j = nlohmann::json::array();
      for (size_t i : order) j.push_back({{"label", model.labels()[i]}, {"probability", p[i]}});
      std::cout << nlohmann::json{{"label", model.labels()[order[0]]}, {"ranking", j}, {"ms", ms}}.dump(2) << "\n";
      return;
    }
    for (size_t i : order) std::printf("%-14s %.4f\n", model.labels()[i].c_str(), p[i]);
    std::fprintf(stderr, "slm: classified in %.3f ms\n", ms);
  });
}

}  // namespace slm::cli
