#pragma once
// Device decode of NVFP4 weights, shared by the GEMV (quant/cuda/nvfp4_gemv.cu) and the MoE combine kernel
// (gathered_linear_kernel.cu). It sits with the kernels, below quant/, which builds on ops/ (never the reverse).
//
// Exactness: an E2M1 code s e1 e0 m placed as BF16 bits s<<15 | e1 e0 m << 6 is the E2M1 value times 2^-126
// (subnormal codes included). Multiplying by the block scale times 2^118 (a BF16) gives value * scale * 2^-8
// exactly: at most 6 significant bits, far inside BF16's range.
#include <cuda_bf16.h>

#include <cstdint>

namespace slm::ops::cuda {

__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  const uint32_t exp = (b >> 3) & 0xF, man = b & 0x7;
  const float mag =
      exp == 0 ? static_cast<float>(man) * 0.001953125f : __uint_as_float(((exp + 120u) << 23) | (man << 20));
  return (b & 0x80) ? -mag : mag;
}

// An E4M3 scale byte as BF16x2 (both halves) of scale * 2^118: the multiplier of decode_word's outputs.
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t b) {
  const uint32_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(e4m3_to_float(b) * 0x1p118f));
  return bits | (bits << 16);
}

// One 32-bit word of codes (nibbles n0..n7, n_i = element k0 + i) -> o[j] = BF16x2 (n_j, n_{j+4}) * 2^-126.
// Per output: mask one nibble per 16-bit half, one multiply that places the sign at bit 15 and the magnitude at
// bits 6..8 (two shifted copies whose bits never overlap, so the sum is an OR), one mask of the target bits.
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t (&o)[4]) {
  constexpr uint32_t kKeep = 0x81C081C0u;  // sign bit and e1 e0 m of each BF16 half
  const uint32_t w2 = w >> 8;
  o[0] = ((w & 0x000F000Fu) * 4160u) & kKeep;  // << 12 (sign) + << 6 (magnitude)
  o[1] = ((w & 0x00F000F0u) * 260u) & kKeep;   // << 8 + << 2
  o[2] = ((w2 & 0x000F000Fu) * 4160u) & kKeep;
  o[3] = ((w2 & 0x00F000F0u) * 260u) & kKeep;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

}  // namespace slm::ops::cuda
