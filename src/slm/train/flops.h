#pragma once
// Model FLOPs per trained token, for MFU. The formula (docs/training.md, "MFU"):
//   6 x (active matmul parameters)        forward 2 + backward 4 FLOPs per weight per token; routed experts count
//                                         k of N, the LM head counts, the embedding (a gather) does not
// + 3 x attention forward FLOPs          per A layer: 2 x heads x (qk_dim + v_dim) x (mean keys attended), the mean
//                                         over a causal sequence of T being (T + 1) / 2, capped by the window and, on
//                                         DSA layers, by the selected keys (plus the indexer's scores)
// + 3 x scan forward FLOPs               Mamba-3: 2 x 2 x heads x headdim x d_state x rank (state update and readout);
//                                         M2RNN: 2 x heads x k x v x (v + 2) (H W, the k v^T update, the readout)
// MTP modules count like main layers (they are trained). Engram tables are gathers (0 FLOPs); their projections count.
#include <cstdint>

#include "slm/recipe/accounting.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm::train {

struct FlopCount {
  double matmul = 0;     // 6 x active matmul parameters
  double attention = 0;  // 3 x forward score/value FLOPs
  double scan = 0;       // 3 x forward recurrent-state FLOPs
  double total() const { return matmul + attention + scan; }
};

FlopCount flops_per_token(const Recipe& recipe, const ModelPlan& plan, int64_t seq_len);

// Parameters a token is multiplied with (Head, Linear, Expert, Router, Indexer, Mixing): the matmul FLOPs above and
// the activation estimate (memory.h) count these.
bool is_matmul(ParamKind kind);

}  // namespace slm::train
