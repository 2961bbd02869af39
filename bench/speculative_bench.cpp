// Speculative decoding (engine::GenerationOptions::speculative, the MTP modules drafting) against plain decoding, batch
// 1, on a trained checkpoint and real text.
//   speculative_bench --recipe R --checkpoint C --tokenizer T --prompt FILE... [--prompt-chars 1500] [--max-tokens 128]
//                     [--speculative 1] [--temperature 0] [--top-k 0] [--top-p 1] [--seed 0] [--repeats 3]
//                     [--device cpu]
// Each file gives one prompt: the --prompt-chars characters before the line at the middle of the file (so the
// model continues code, not a license header). Every repeat runs each prompt plain and speculative back to back,
// the order alternating between repeats (the machine may be shared: interleaved runs see the same load). Through
// text::generate_text, as `slm generate` runs it: decode tok/s = the tokens after the first over their time
// (GenerationStats; the prompt's prefill excluded). Reported per prompt and over all: the median decode tok/s of
// each mode, the speedup of the medians, the acceptance rate (accepted / drafted drafts) and, when greedy, whether the
// speculative tokens equal the plain ones.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "slm/data/tokenizer.h"
#include "slm/engine/generation.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/weights.h"
#include "slm/recipe/recipe.h"
#include "slm/text/text_generation.h"
#include "slm/util/device.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace {

struct Options {
  std::string recipe, checkpoint, tokenizer, device = "cpu";
  std::vector<std::string> prompts;
  int64_t prompt_chars = 1500, max_tokens = 128, speculative = 1, top_k = 0, repeats = 3;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 0;
};

std::string prompt_of(const std::string& path, int64_t chars) {
  const std::string text = slm::read_file(path);
  size_t mid = text.rfind('\n', text.size() / 2);
  mid = mid == std::string::npos ? text.size() / 2 : mid + 1;
  const size_t from = mid > static_cast<size_t>(chars) ? mid - static_cast<size_t>(chars) : 0;
  return text.substr(from, mid - from);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Tally {
  std::vector<double> plain, spec;  // decode tok/s per run
  int64_t drafted = 0, accepted = 0, runs = 0, identical = 0;
  void add(const Tally& o) {
    plain.insert(plain.end(), o.plain.begin(), o.plain.end());
    spec.insert(spec.end(), o.spec.begin(), o.spec.end());
    drafted += o.drafted;
    accepted += o.accepted;
    runs += o.runs;
    identical += o.identical;
  }
  void print(const std::string& name, bool greedy) const {
    const double p = median(plain), s = median(spec);
    std::printf("%-28s %10.1f %10.1f %8.2fx %10.3f", name.c_str(), p, s, s / p,
                drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0);
    if (greedy) std::printf(" %6lld/%lld", static_cast<long long>(identical), static_cast<long long>(runs));
    std::printf("\n");
  }
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"speculative decoding (MTP drafts) against plain decoding, batch 1, on a checkpoint and real text"};
  app.add_option("--recipe", o.recipe, "recipe JSON")->required();
  app.add_option("--checkpoint", o.checkpoint, "safetensors file or checkpoint directory")->required();
  app.add_option("--tokenizer", o.tokenizer, "tokenizer .model")->required();
  app.add_option("--prompt", o.prompts, "text file: one prompt each (repeatable)")->required();
  app.add_option("--prompt-chars", o.prompt_chars, "characters before the middle line of each file")
      ->capture_default_str();
  app.add_option("--max-tokens", o.max_tokens, "tokens generated per run")->capture_default_str();
  app.add_option("--speculative", o.speculative, "draft tokens per step")->capture_default_str();
  app.add_option("--temperature", o.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", o.top_k, "sampling: the k most likely ids (0 = all)")->capture_default_str();
  app.add_option("--top-p", o.top_p, "sampling: nucleus mass")->capture_default_str();
  app.add_option("--seed", o.seed, "sampler seed of the first run (repeat r uses seed + r)")->capture_default_str();
  app.add_option("--repeats", o.repeats, "runs of each prompt and mode")->capture_default_str();
  app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.repeats < 1 || o.max_tokens < 2) throw slm::Error("--repeats must be >= 1 and --max-tokens >= 2");
    const torch::Device device = slm::parse_device(o.device);
    slm::model::HybridLM m(slm::load_recipe(o.recipe));
    m.eval();
    m.to(device);
    slm::model::load_weights(m, slm::model::weights_path(o.checkpoint));
    const auto tokenizer = slm::data::Tokenizer::load(o.tokenizer);
    const bool greedy = o.temperature == 0.0;
    std::printf("device %s, %d intra-op threads, %s, %lld tokens per run, %lld draft(s), %s, %lld repeats\n",
                o.device.c_str(), torch::get_num_threads(), m.recipe().name.c_str(),
                static_cast<long long>(o.max_tokens), static_cast<long long>(o.speculative),
                greedy ? "greedy"
                       : ("temperature " + std::to_string(o.temperature) + " top-k " + std::to_string(o.top_k) +
                          " top-p " + std::to_string(o.top_p))
                             .c_str(),
                static_cast<long long>(o.repeats));
    std::printf("%-28s %10s %10s %9s %10s%s\n", "prompt", "plain t/s", "spec t/s", "speedup", "accepted",
                greedy ? " same" : "");
    Tally all;
    for (const auto& path : o.prompts) {
      const std::string prompt = prompt_of(path, o.prompt_chars);
      Tally t;
      for (int64_t r = 0; r < o.repeats; ++r) {
        std::vector<int64_t> outputs[2];
        for (int i = 0; i < 2; ++i) {
          const bool spec = (i + r) % 2 == 1;
          slm::engine::GenerationOptions go;
          go.max_tokens = o.max_tokens;
          go.sampling = {o.temperature, o.top_k, o.top_p, o.seed + static_cast<uint64_t>(r)};
          go.speculative = spec ? o.speculative : 0;
          slm::engine::GenerationStats stats;
          outputs[spec] = slm::text::generate_text(m, tokenizer, prompt, go, {}, &stats);
          if (stats.decode_steps < 1) continue;  // ended at the first token: no decode to time
          (spec ? t.spec : t.plain).push_back(static_cast<double>(stats.decode_steps) / stats.decode_s);
          t.drafted += stats.drafted;
          t.accepted += stats.accepted;
        }
        ++t.runs;
        t.identical += outputs[0] == outputs[1];
      }
      const auto slash = path.rfind('/');
      t.print(slash == std::string::npos ? path : path.substr(slash + 1), greedy);
      all.add(t);
    }
    all.print("all", greedy);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speculative_bench: %s\n", e.what());
    return 2;
  }
}
