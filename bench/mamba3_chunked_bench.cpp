// CPU time of the Mamba-3 chunked scan against the sequential recurrence on one recipe's layer sizes.
//   mamba3_chunked_bench [recipe.json] [tokens] [batch]   (defaults: recipes/tiny-hybrid.json, 1024, 1)
// Both scans get the same preprocessed inputs (random projections, the layer's initial parameters), run
// forward-only in float32, and the median of several repetitions is reported with the ratio of the two.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "median_timer.h"
#include "slm/model/layers/mamba3.h"
#include "slm/ops/mamba3_scan.h"
#include "slm/recipe/recipe.h"
#include "slm/util/error.h"

namespace {

using slm::bench::median_ms;

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : std::string(SLM_SOURCE_DIR) + "/recipes/tiny-hybrid.json";
  const int64_t tokens = argc > 2 ? std::stoll(argv[2]) : 1024;
  const int64_t batch = argc > 3 ? std::stoll(argv[3]) : 1;
  try {
    const slm::Recipe recipe = slm::load_recipe(path);
    if (!recipe.mamba3) throw slm::Error(path + ": no \"mamba3\" section");
    torch::manual_seed(0);
    torch::NoGradGuard no_grad;
    slm::model::Mamba3Impl layer(recipe, torch::TensorOptions().dtype(torch::kFloat));
    const auto& m = *recipe.mamba3;
    const int64_t h = layer.heads, p = layer.headdim, n = layer.d_state, r = layer.rank, g = layer.groups;
    const int64_t s = layer.angles;
    slm::ops::Mamba3Projections proj{torch::randn({batch, tokens, h, p}),    torch::randn({batch, tokens, r, g, n}),
                                     torch::randn({batch, tokens, r, g, n}), torch::randn({batch, tokens, h}),
                                     torch::randn({batch, tokens, h}),       torch::randn({batch, tokens, h}),
                                     torch::randn({batch, tokens, s})};
    auto state = layer.zero_state(batch);
    auto seq = slm::ops::mamba3_preprocess(proj, layer.weights(), state.angle);

    torch::Tensor y_seq, y_chunk;
    const double seq_ms = median_ms([&] { y_seq = slm::ops::mamba3_scan_sequential(seq, state).first; }, 5);
    const double chunk_ms =
        median_ms([&] { y_chunk = slm::ops::mamba3_scan_chunked(seq, state, layer.chunk_size).first; }, 21);
    const double diff = ((y_chunk - y_seq).abs().max() / y_seq.abs().max()).item<double>();

    std::printf("recipe %s: H=%lld P=%lld N=%lld R=%lld G=%lld %s, chunk %lld, batch %lld, T=%lld, %d threads\n",
                recipe.name.c_str(), (long long)h, (long long)p, (long long)n, (long long)r, (long long)g,
                m.is_mimo ? "MIMO" : "SISO", (long long)layer.chunk_size, (long long)batch, (long long)tokens,
                torch::get_num_threads());
    std::printf("sequential %.2f ms  chunked %.2f ms  ratio %.1fx  (max rel diff %.1e)\n", seq_ms, chunk_ms,
                seq_ms / chunk_ms, diff);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mamba3_chunked_bench: %s\n", e.what());
    return 2;
  }
}
