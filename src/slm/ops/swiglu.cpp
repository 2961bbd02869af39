#include "slm/ops/swiglu.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "slm/ops/decode_dtype.h"
#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/swiglu_kernel.h"
#endif

namespace slm::ops {

#ifdef SLM_WITH_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor forward_kernel(const at::Tensor& h) {
  const int64_t hidden = h.size(-1) / 2;
  auto sizes = h.sizes().vec();
  sizes.back() = hidden;
  auto out = at::empty(sizes, h.options());
  check_launch(cuda::swiglu_forward(decode_dtype(h.scalar_type()), h.data_ptr(), out.data_ptr(),
                                    h.numel() / (2 * hidden), hidden, current_stream(h)));
  return out;
}

// Keeps h (the projection's output, which the tensor ops keep too) and no activation temporaries.
class FusedSwiGLU : public torch::autograd::Function<FusedSwiGLU> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h) {
    const c10::cuda::CUDAGuard guard(h.device());
    ctx->save_for_backward({h});
    return forward_kernel(h);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto h = ctx->get_saved_variables()[0];
    const c10::cuda::CUDAGuard guard(h.device());
    const auto g = grads[0].to(h.scalar_type()).contiguous();
    auto dh = at::empty_like(h);
    const int64_t hidden = h.size(-1) / 2;
    check_launch(cuda::swiglu_backward(decode_dtype(h.scalar_type()), g.data_ptr(), h.data_ptr(), dh.data_ptr(),
                                       h.numel() / (2 * hidden), hidden, current_stream(h)));
    return {dh};
  }
};

// z's elements between rows (b, t) and the next: rows are t-major, so [b, t] with stride(0) = T stride(1).
int64_t z_row_stride(const at::Tensor& z) {
  return z.size(1) > 1 ? z.stride(1) : z.stride(0);
}

// Keeps y and z (the tensor ops keep FP32 copies of z and of its silu besides).
class FusedSiluGate : public torch::autograd::Function<FusedSiluGate> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& z) {
    const c10::cuda::CUDAGuard guard(y.device());
    const int64_t b = z.size(0), t = z.size(1), cols = z.size(2) * z.size(3);
    auto out = at::empty({b, t, cols}, z.options().memory_format(at::MemoryFormat::Contiguous));
    check_launch(cuda::silu_gate_forward(decode_dtype(z.scalar_type()), y.data_ptr<float>(), z.data_ptr(),
                                         out.data_ptr(), b * t, cols, z_row_stride(z), current_stream(y)));
    ctx->save_for_backward({y, z});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &y = saved[0], &z = saved[1];
    const c10::cuda::CUDAGuard guard(y.device());
    const auto g = grads[0].to(z.scalar_type()).contiguous();
    auto dy = at::empty_like(y);
    auto dz = at::empty(z.sizes(), z.options().memory_format(at::MemoryFormat::Contiguous));
    const int64_t rows = z.size(0) * z.size(1), cols = z.size(2) * z.size(3);
    check_launch(cuda::silu_gate_backward(decode_dtype(z.scalar_type()), g.data_ptr(), y.data_ptr<float>(),
                                          z.data_ptr(), dy.data_ptr<float>(), dz.data_ptr(), rows, cols,
                                          z_row_stride(z), current_stream(y)));
    return {dy, dz};
  }
};

bool fusable(const at::Tensor& h) {
  return fused_kernels_enabled() && h.is_cuda() && h.dim() >= 1 && h.size(-1) % 2 == 0 && h.size(-1) > 0 &&
         h.numel() > 0 && h.is_contiguous() && decode_dtype_supported(h.scalar_type());
}

}  // namespace
#endif

at::Tensor swiglu(const at::Tensor& h) {
#ifdef SLM_WITH_CUDA
  if (fusable(h)) {
    if (at::GradMode::is_enabled() && h.requires_grad()) return FusedSwiGLU::apply(h);
    const c10::cuda::CUDAGuard guard(h.device());
    return forward_kernel(h);
  }
#endif
  auto parts = h.chunk(2, -1);
  return at::silu(parts[0]) * parts[1];
}

bool silu_gate_fusable(const at::Tensor& y, const at::Tensor& z) {
#ifdef SLM_WITH_CUDA
  if (!fused_kernels_enabled() || !y.defined() || !z.defined() || !z.is_cuda() || y.device() != z.device() ||
      y.scalar_type() != at::kFloat || !y.is_contiguous() || !decode_dtype_supported(z.scalar_type()) || y.dim() != 5 ||
      z.dim() != 4 || y.size(3) != 1 || z.numel() == 0)
    return false;
  const int64_t b = z.size(0), t = z.size(1), h = z.size(2), p = z.size(3);
  return y.size(0) == b && y.size(1) == t && y.size(2) == h && y.size(4) == p && z.stride(3) == 1 && z.stride(2) == p &&
         (b == 1 || t == 1 || z.stride(0) == t * z.stride(1)) && z_row_stride(z) >= h * p;
#else
  (void)y, (void)z;
  return false;
#endif
}

at::Tensor silu_gate(const at::Tensor& y, const at::Tensor& z) {
  if (!silu_gate_fusable(y, z))
    throw Error("silu_gate: no fused kernel for y " + shape_text(y) + " and z " + shape_text(z) +
                " here (check silu_gate_fusable)");
#ifdef SLM_WITH_CUDA
  return FusedSiluGate::apply(y, z);
#else
  return {};
#endif
}

}  // namespace slm::ops
