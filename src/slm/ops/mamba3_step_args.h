#pragma once
// The fused Mamba-3 SISO decode step's shape and arguments, shared by the CUDA kernel (cuda/mamba3_step_kernel.h) and
// the CPU loop (mamba3_step_cpu.h). Plain C++: the .cu includes it without torch.
#include <cstdint>

namespace slm::ops {

// Where the step's inputs sit in one row of in_proj's output ([B, width], row stride `width`): z (unused here) at 0,
// x at d_inner, B at 2·d_inner (groups × N), C after it, then dd_dt, dd_a and trap (heads each) and the angles.
struct Mamba3StepShape {
  int64_t batch, heads, headdim, groups, d_state, angles, d_inner, width;
  float a_floor, norm_eps;
};

// proj [B, width] and the weights (dt_bias [H], b_bias, c_bias [H, N], b_norm, c_norm [N], d [H]) in the step's
// input dtype; the state (angle [B, H, S], ssm [B, H, P, N], k [B, H, N], x [B, H, P]) FP32, read from the *_in
// pointers and written to the *_out ones (which must not alias them); y [B, H, P] FP32 (without the gate).
struct Mamba3StepArgs {
  const void *proj, *dt_bias, *b_bias, *c_bias, *b_norm, *c_norm, *d;
  const float *angle_in, *ssm_in, *k_in, *x_in;
  float *angle_out, *ssm_out, *k_out, *x_out, *y;
};

}  // namespace slm::ops
