#pragma once
// The fused Mamba-3 SISO decode step on the CPU: the CUDA kernel's arithmetic (cuda/mamba3_step_kernel.cu; the row
// layout and the argument contract are in mamba3_step_args.h) as one loop over (row, head), FP32 throughout. The
// libtorch step it replaces is ~100 small operators per layer, most of a recurrent layer's decode time on a CPU core.
#include "slm/ops/mamba3_step_args.h"

namespace slm::ops {

// proj and the weights FP32 (the args' void pointers point to floats); the same state and output contract as
// cuda::mamba3_step.
void mamba3_step_cpu(const Mamba3StepShape& s, const Mamba3StepArgs& a);

}  // namespace slm::ops
