#pragma once
// Every model recipe the repository ships (recipes/**/*.json except the ensemble manifests, the data pipeline's
// configuration under recipes/data and the ablation plans under recipes/ablations), sorted.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace slm::test {

inline std::vector<std::string> shipped_recipes() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(source_path("recipes")))
    if (e.path().extension() == ".json" && e.path().parent_path().filename() != "ensembles" &&
        e.path().parent_path().filename() != "data" && e.path().parent_path().filename() != "ablations")
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// NAM56R's parameter counts by hand from the dimensions in recipes/nam56r.json: the tensors each block family holds
// (docs/recipes.md), multiplied out here and never taken from the accounting code under test. The layer plan:
// layer i is "AEMEAEMEAEMR"[i % 12] for i < 52, so 13 A (MLA on 0, 16, 32, 48; GQA with a DSA indexer on the
// other nine: 4, 8, 12, 20, 24, 28, 36, 40, 44), 22 E (MoE), 13 M (Mamba-3) and 4 R (M2RNN); Engram on the A layers
// 0 and 4; mHC with 4 streams on layers 0-6.
struct Nam56rCounts {
  long long total;                      // the main model, MTP and Engram tables apart
  long long active_without_embeddings;  // per token, without the input embedding and the LM head
  long long mtp;                        // the two MTP modules
  long long engram_tables;
};
constexpr Nam56rCounts nam56r_by_hand() {
  constexpr long long D = 4096, V = 65536;
  constexpr long long norm = D;  // every layer's pre-norm gain
  // GQA: wq [32*128, D], wk and wv [8*128, D], wo [D, 32*128], q and k norms of 128.
  constexpr long long gqa = 32 * 128 * D + 2 * (8 * 128 * D) + D * 32 * 128 + 2 * 128;
  // DSA lightning indexer: wq [32*64, D], wk [64, D], a LayerNorm of 64 (gain and bias), weights_proj [32, D].
  constexpr long long dsa = 32 * 64 * D + 64 * D + 2 * 64 + 32 * D;
  // MLA (32 heads): wq_a [64, D] + its norm, wq_b [32*(64+64), 64], wkv_a [64+64, D] + the kv norm of 64,
  // wkv_b [32*(64+64), 64], wo [D, 32*64].
  constexpr long long mla = 64 * D + 64 + 32 * (64 + 64) * 64 + (64 + 64) * D + 64 + 32 * (64 + 64) * 64 + D * 32 * 64;
  // MoE: router [16, D]; 16 routed SwiGLU experts of hidden 352 (w13 [2*352, D], w2 [D, 352]); one shared of 1024.
  constexpr long long routed = 16 * (2 * 352) * D + 16 * D * 352;
  constexpr long long moe = 16 * D + routed + 2 * 1024 * D + D * 1024;
  // Mamba-3 MIMO: d_inner 2*D = 8192, 128 heads of 64, d_state 128, 8 groups, rank 4, 32 rotary angles
  // (d_state * 0.5 / 2). in_proj [2*8192 + 2*8*4*128 + 3*128 + 32, D]; dt_bias and D [128]; B and C biases
  // [128, 4, 128]; B and C norms [128]; mimo x, z, o [128, 4, 64]; out_proj [D, 8192] (no out norm).
  constexpr long long mamba = (2 * 8192 + 2 * 8 * 4 * 128 + 3 * 128 + 32) * D + 128 + 2 * (128 * 4 * 128) + 2 * 128 +
                              3 * (128 * 4 * 64) + 128 + D * 8192;
  // M2RNN: 128 heads, k 64 with one q/k head, v 16; the short conv (kernel 4, with bias) runs over q, k and v:
  // 2*64 + 128*16 = 2176 channels. in_proj [2176 + 128 + 128*16, D]; A_log, dt_bias [128]; state_weight
  // [128, 16, 16]; D [128, 16]; out norm [128*16]; out_proj [D, 128*16].
  constexpr long long conv = 2 * 64 + 128 * 16;
  constexpr long long m2rnn =
      (conv + 128 + 128 * 16) * D + conv * 4 + conv + 128 + 128 + 128 * 16 * 16 + 128 * 16 + 128 * 16 + D * 128 * 16;
  // Engram without its tables: memory width 2 orders * 8 heads * 32 = 512; wv [D, 512], wk [4*D, 512], three norms
  // [4, D], the depthwise conv [4*D, 1, 4].
  constexpr long long engram = D * 512 + 4 * D * 512 + 3 * (4 * D) + 4 * D * 4;
  // mHC (n = 4): phi [n*n + 2n, n*D], its bias and 3 alphas; the head's phi [n, n*D], bias [n], one alpha.
  constexpr long long mhc = (16 + 8) * (4 * D) + 24 + 3;
  constexpr long long mhc_head = 4 * (4 * D) + 4 + 1;
  constexpr long long total = 2 * V * D /* embedding and LM head */ + D /* final norm */ + 9 * (norm + gqa + dsa) +
                              4 * (norm + mla) + 22 * (norm + moe) + 13 * (norm + mamba) + 4 * (norm + m2rnn) +
                              2 * engram + 7 * mhc + mhc_head;
  // Active: 4 of the 16 routed experts per token.
  constexpr long long active = total - 22 * routed / 16 * (16 - 4) - 2 * V * D;
  // MTP, twice: enorm and hnorm [D], proj [D, 2D], an MLA attention layer and a dense SwiGLU layer of the profile's
  // 21504 (w13 [2*21504, D], w2 [D, 21504]), each with its pre-norm, and the module's final norm.
  constexpr long long mtp = 2 * (2 * D + D * 2 * D + (norm + mla) + (norm + 3 * 21504 * D) + D);
  // Engram tables [Σ primes, 32]: one table per (layer, order, head), 2 * 2 * 8 = 32 of them, sized by the
  // consecutive primes from table_rows = 500000 on.
  constexpr long long primes[] = {500009, 500029, 500041, 500057, 500069, 500083, 500107, 500111,
                                  500113, 500119, 500153, 500167, 500173, 500177, 500179, 500197,
                                  500209, 500231, 500233, 500237, 500239, 500249, 500257, 500287,
                                  500299, 500317, 500321, 500333, 500341, 500363, 500369, 500389};
  long long rows = 0;
  for (long long p : primes) rows += p;
  return {total, active, mtp, rows * 32};
}
// The figures the recipe's notes and the README state: 4.732B total, 3.05B active without the embeddings, MTP
// 0.62B, Engram tables 0.51B.
static_assert(nam56r_by_hand().total == 4'732'250'178);
static_assert(nam56r_by_hand().active_without_embeddings == 3'053'480'002);
static_assert(nam56r_by_hand().mtp == 615'031'040);
static_assert(nam56r_by_hand().engram_tables == 512'206'656);

}  // namespace slm::test
