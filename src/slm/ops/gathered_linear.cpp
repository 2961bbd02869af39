#include "slm/ops/gathered_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "slm/ops/aligned.h"
#include "slm/ops/decode_dtype.h"
#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/gathered_linear_kernel.h"
#endif

namespace slm::ops {

bool gathered_linear_fusable(const at::Tensor& x, const at::Tensor& w) {
#ifdef SLM_WITH_CUDA
  const auto dt = x.scalar_type();
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad());
  return fused_kernels_enabled() && x.is_cuda() && !grad && decode_dtype_supported(dt) && w.scalar_type() == dt &&
         w.dim() == 3 && w.is_contiguous() && w.device() == x.device() && x.dim() == 2 &&
         (w.size(2) * w.element_size()) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0;
#else
  (void)x, (void)w;
  return false;
#endif
}

at::Tensor gathered_linear(const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& ids_in, int64_t x_div,
                           bool float_out) {
  if (!gathered_linear_fusable(x_in, w))
    throw Error("gathered_linear: no fused kernel for x " + shape_text(x_in) + " and w " + shape_text(w) +
                " here (check gathered_linear_fusable)");
  if (x_in.size(1) != w.size(2))
    throw Error("gathered_linear: x " + shape_text(x_in) + " does not match the matrices' inputs " + shape_text(w));
  if (x_div < 1 || (ids_in.defined() &&
                    (ids_in.dim() != 1 || ids_in.device() != x_in.device() || ids_in.size(0) > x_in.size(0) * x_div)))
    throw Error("gathered_linear: ids must be [A] on x's device with A <= rows * x_div");
#ifdef SLM_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = contiguous_aligned16(x_in);  // rows are whole 16-byte runs from here
  const auto ids = ids_in.defined() ? ids_in.to(at::kLong).contiguous() : at::Tensor();
  const int64_t a = ids.defined() ? ids.size(0) : x.size(0) * x_div, out = w.size(1), in = w.size(2);
  auto y = at::empty({a, out}, float_out ? x.options().dtype(at::kFloat) : x.options());
  const auto dtype = decode_dtype(x.scalar_type());
  const std::string err =
      cuda::gathered_linear(dtype, x.data_ptr(), w.data_ptr(), ids.defined() ? ids.data_ptr<int64_t>() : nullptr,
                            y.data_ptr(), float_out, a, x_div, out, in, current_stream(x));
  if (!err.empty()) throw Error("gathered_linear: " + err);
  return y;
#else
  (void)float_out;
  throw Error("gathered_linear: a CPU build has no fused kernel");
#endif
}

namespace {

// x [..., in] times w [out, in] transposed through the gathered kernel where it applies, else `otherwise()`.
template <class Otherwise>
at::Tensor one_row_linear(const at::Tensor& x, const at::Tensor& w, bool float_out, Otherwise&& otherwise) {
  const int64_t in = x.size(-1), rows = in > 0 ? x.numel() / in : 0;
  if (rows < 1 || rows > kGemvMaxRows || w.dim() != 2 || w.size(1) != in) return otherwise();
  const auto flat = x.reshape({rows, in});
  const auto stacked = w.unsqueeze(0);
  if (!gathered_linear_fusable(flat, stacked)) return otherwise();
  auto shape = x.sizes().vec();
  shape.back() = w.size(0);
  return gathered_linear(flat, stacked, at::Tensor(), 1, float_out).view(shape);
}

}  // namespace

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w) {
  return one_row_linear(x, w, false, [&] { return at::linear(x, w); });
}

at::Tensor small_batch_linear_float(const at::Tensor& x, const at::Tensor& w) {
  return one_row_linear(x, w, true, [&] { return at::linear(x.to(at::kFloat), w.to(at::kFloat)); });
}

bool gathered_swiglu_combine_fusable(const at::Tensor& x, const at::Tensor& w, int64_t k, const at::Tensor& w_shared) {
#ifdef SLM_WITH_CUDA
  if (!gathered_linear_fusable(x, w) || k < 1) return false;
  int64_t shared_hidden = 0;
  if (w_shared.defined()) {
    if (!gathered_linear_fusable(x, w_shared.unsqueeze(0)) || w_shared.size(0) != w.size(1)) return false;
    shared_hidden = w_shared.size(1);
  }
  return cuda::combine_shared_bytes(k, w.size(2), shared_hidden) <= cuda::kMaxCombineSharedBytes;
#else
  (void)x, (void)w, (void)k, (void)w_shared;
  return false;
#endif
}

at::Tensor gathered_swiglu_combine(const at::Tensor& h_in, const at::Tensor& w, const at::Tensor& ids_in,
                                   const at::Tensor& gates_in, const at::Tensor& h_shared_in,
                                   const at::Tensor& w_shared) {
  const int64_t k = gates_in.dim() == 2 ? gates_in.size(1) : 0, tokens = gates_in.dim() == 2 ? gates_in.size(0) : 0;
  if (!gathered_swiglu_combine_fusable(h_in, w, k, w_shared) || h_shared_in.defined() != w_shared.defined())
    throw Error("gathered_swiglu_combine: no fused kernel for h " + shape_text(h_in) + " and w " + shape_text(w) +
                " here (check gathered_swiglu_combine_fusable)");
  if (h_in.dim() != 2 || h_in.size(0) != tokens * k || h_in.size(1) != 2 * w.size(2) || ids_in.numel() != tokens * k ||
      ids_in.device() != h_in.device() || gates_in.device() != h_in.device() ||
      (h_shared_in.defined() && h_shared_in.sizes() != at::IntArrayRef{tokens, 2 * w_shared.size(1)}))
    throw Error("gathered_swiglu_combine: h " + shape_text(h_in) + ", w " + shape_text(w) + ", ids " +
                shape_text(ids_in) + ", gates " + shape_text(gates_in) +
                " and the shared rows do not describe the same tokens, slots and hidden size");
#ifdef SLM_WITH_CUDA
  const c10::cuda::CUDAGuard guard(h_in.device());
  const auto h = contiguous_aligned16(h_in),
             h_shared = h_shared_in.defined() ? contiguous_aligned16(h_shared_in) : at::Tensor();
  const auto ids = ids_in.to(at::kLong).contiguous(), gates = gates_in.to(at::kFloat).contiguous();
  const int64_t out = w.size(1), hidden = w.size(2), shared_hidden = w_shared.defined() ? w_shared.size(1) : 0;
  auto y = at::empty({tokens, out}, h.options());
  const std::string err = cuda::gathered_swiglu_combine(
      decode_dtype(h.scalar_type()), h.data_ptr(), w.data_ptr(), ids.data_ptr<int64_t>(), gates.data_ptr<float>(),
      h_shared.defined() ? h_shared.data_ptr() : nullptr, w_shared.defined() ? w_shared.data_ptr() : nullptr,
      y.data_ptr(), tokens, k, out, hidden, shared_hidden, current_stream(h));
  if (!err.empty()) throw Error("gathered_swiglu_combine: " + err);
  return y;
#else
  throw Error("gathered_swiglu_combine: a CPU build has no fused kernel");
#endif
}

#ifdef SLM_WITH_CUDA
namespace {
bool nvfp4_stack_fits(const Nvfp4Stack& w, const at::Device& device) {
  return w.matrices >= 1 && w.in >= 32 && w.in % 32 == 0 && w.codes.device() == device &&
         w.codes.scalar_type() == at::kByte && w.codes.is_contiguous() &&
         w.codes.sizes() == at::IntArrayRef{w.matrices * w.out, w.in / 2} &&
         reinterpret_cast<uintptr_t>(w.codes.data_ptr()) % 16 == 0 && w.scales.device() == device &&
         w.scales.scalar_type() == at::kByte && w.scales.is_contiguous() &&
         w.scales.sizes() == at::IntArrayRef{w.matrices * w.out, w.in / 16} &&
         reinterpret_cast<uintptr_t>(w.scales.data_ptr()) % 2 == 0 && w.tensor_scale.device() == device &&
         w.tensor_scale.scalar_type() == at::kFloat && w.tensor_scale.numel() == w.matrices;
}
}  // namespace
#endif

bool gathered_swiglu_combine_nvfp4_fusable(const at::Tensor& x, const Nvfp4Stack& w, int64_t k,
                                           const Nvfp4Stack& w_shared) {
#ifdef SLM_WITH_CUDA
  const bool shared = w_shared.matrices > 0;
  return fused_kernels_enabled() && x.is_cuda() && decode_dtype_supported(x.scalar_type()) &&
         !(at::GradMode::is_enabled() && x.requires_grad()) && k >= 1 && nvfp4_stack_fits(w, x.device()) &&
         (!shared || (w_shared.matrices == 1 && w_shared.out == w.out && nvfp4_stack_fits(w_shared, x.device()))) &&
         cuda::combine_shared_bytes(k, w.in, shared ? w_shared.in : 0) <= cuda::kMaxCombineSharedBytes;
#else
  (void)x, (void)w, (void)k, (void)w_shared;
  return false;
#endif
}

at::Tensor gathered_swiglu_combine_nvfp4(const at::Tensor& h_in, const Nvfp4Stack& w, const at::Tensor& ids_in,
                                         const at::Tensor& gates_in, const at::Tensor& h_shared_in,
                                         const Nvfp4Stack& w_shared) {
  const int64_t k = gates_in.dim() == 2 ? gates_in.size(1) : 0, tokens = gates_in.dim() == 2 ? gates_in.size(0) : 0;
  const bool shared = w_shared.matrices > 0;
  if (!gathered_swiglu_combine_nvfp4_fusable(h_in, w, k, w_shared) || h_shared_in.defined() != shared)
    throw Error("gathered_swiglu_combine_nvfp4: no fused kernel for h " + shape_text(h_in) +
                " here (check gathered_swiglu_combine_nvfp4_fusable)");
  if (h_in.dim() != 2 || h_in.size(0) != tokens * k || h_in.size(1) != 2 * w.in || ids_in.numel() != tokens * k ||
      ids_in.device() != h_in.device() || gates_in.device() != h_in.device() ||
      (shared && h_shared_in.sizes() != at::IntArrayRef{tokens, 2 * w_shared.in}))
    throw Error("gathered_swiglu_combine_nvfp4: h " + shape_text(h_in) + ", ids " + shape_text(ids_in) + ", gates " +
                shape_text(gates_in) + " and the shared rows do not describe the same tokens, slots and hidden size");
#ifdef SLM_WITH_CUDA
  const c10::cuda::CUDAGuard guard(h_in.device());
  const auto h = contiguous_aligned16(h_in), h_shared = shared ? contiguous_aligned16(h_shared_in) : at::Tensor();
  const auto ids = ids_in.to(at::kLong).contiguous(), gates = gates_in.to(at::kFloat).contiguous();
  const auto matrices = [](const Nvfp4Stack& s) {
    return s.matrices > 0 ? cuda::Nvfp4Matrices{s.codes.data_ptr<uint8_t>(), s.scales.data_ptr<uint8_t>(),
                                                s.tensor_scale.data_ptr<float>()}
                          : cuda::Nvfp4Matrices{};
  };
  auto y = at::empty({tokens, w.out}, h.options());
  const std::string err = cuda::gathered_swiglu_combine_nvfp4(
      decode_dtype(h.scalar_type()), h.data_ptr(), matrices(w), ids.data_ptr<int64_t>(), gates.data_ptr<float>(),
      shared ? h_shared.data_ptr() : nullptr, matrices(w_shared), y.data_ptr(), tokens, k, w.out, w.in,
      shared ? w_shared.in : 0, current_stream(h));
  if (!err.empty()) throw Error("gathered_swiglu_combine_nvfp4: " + err);
  return y;
#else
  throw Error("gathered_swiglu_combine_nvfp4: a CPU build has no fused kernel");
#endif
}

}  // namespace slm::ops
