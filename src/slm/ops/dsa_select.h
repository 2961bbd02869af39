#pragma once
// The keys a DSA layer's decode step attends to, as a mask, in one CUDA kernel (cuda/dsa_select_kernel.cu): the set
// that model::dsa_select_at lists for one query per row, without its order. Attention does not depend on the order
// of its keys, so the step attends through ops::decode_attention with this mask instead of sorting the whole cache,
// gathering the selected rows and running a dense attention over them.
#include <ATen/core/Tensor.h>

namespace slm::ops {

// Whether (with ops::fused_kernels_enabled()) dsa_keep_step runs here: a CUDA build, scores [B, S] on the GPU in
// FP32/BF16/FP16, no gradient wanted, local_window >= 1 (every row keeps its own position).
bool dsa_keep_fusable(const at::Tensor& scores, int64_t local_window);

// For the query at position positions[b] (int64 [B] on the scores' device) of each row: bool [B, S], true for the
// k(p) keys dsa_select_at selects. Visible keys are those at distance 0 <= p - j (< window when window > 0); the ones
// at distance < local_window are forced in; k(p) = model::dsa_keys_per_query(visible count, ratio, local_window); the
// rest are the highest scores, ties going to the lower position (the stable sort's order).
at::Tensor dsa_keep_step(const at::Tensor& scores, const at::Tensor& positions, double ratio, int64_t local_window,
                         int64_t window);

}  // namespace slm::ops
