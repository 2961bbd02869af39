#pragma once
// NVFP4: 4-bit E2M1 elements, one FP8 E4M3 scale per 16 consecutive elements of the reduction (last) dim,
// one FP32 scale per matrix. docs/formats.md describes the numbers and the on-disk layout; the encoding is the
// two-level rule of the NVFP4 paper:
//
//   s_enc = fp32(6*448 / amax)          amax over the matrix; s_dec = fp32(1 / s_enc) is the stored tensor scale
//   S_b   = e4m3_RNE(fp32(amax_b / 6) * s_enc)                  stored block scale (byte)
//   q_i   = E2M1_round(fp32(x_i * fp32(1 / (S_b * s_dec))))    clamped to +-6; RNE or stochastic
//   x^_i  = (q_i * S_b) * s_dec                                  decode, FP32
//
// Guards: an all-zero matrix stores s_dec = 0; a block whose scale rounds to zero stores zero codes; s_enc is
// clamped to FLT_MAX (denormal inputs), and the element scale is applied in double when it exceeds FLT_MAX, so no
// step produces NaN or Inf. Non-finite inputs are rejected (slm::Error).
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace slm::nvfp4 {

inline constexpr int64_t kBlock = 16;     // elements per block scale
inline constexpr float kE2M1Max = 6.0f;   // largest element magnitude
inline constexpr float kE4M3Max = 448.0f; // largest block scale

// E2M1: bits 0-2 magnitude index into {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 sign. Only the low 4 bits are read.
float e2m1_decode(uint8_t code);
// Round-to-nearest-even onto the E2M1 grid (ties go to the even code), magnitudes above 6 saturate to 6; the
// sign bit follows the input's sign (so -0.1 gives code 8, "-0"). NaN is not accepted (returns 0).
uint8_t e2m1_encode_rne(float v);
// Stochastic rounding between the two neighbouring grid points lo <= |v| <= hi: rounds away from zero with
// probability (|v| - lo) / (hi - lo); u is a uniform sample in [0, 1). Saturates at 6.
uint8_t e2m1_encode_stochastic(float v, float u);

// FP8 E4M3FN (OCP "E4M3", as in CUDA __nv_fp8_e4m3): sign bit 7, exponent bits 3-6 with bias 7, mantissa
// bits 0-2; subnormals when the exponent field is 0; no infinities; 0x7F and 0xFF are NaN; max 448.
float e4m3_decode(uint8_t byte);
// Round-to-nearest-even with saturation: finite values beyond 448 give 448 (0x7E / 0xFE); NaN gives 0x7F.
uint8_t e4m3_encode_rne(float v);

enum class Rounding { Nearest, Stochastic };

struct EncodeOptions {
  Rounding rounding = Rounding::Nearest;
  uint64_t seed = 0;  // stochastic rounding: the same seed and tensor give the same codes
};

// A tensor in NVFP4. Rows are all dims but the last (the reduction dim K); each row is padded with zero codes
// to Kp = ceil(K/16)*16. A "matrix" is the last two dims (a 1-D tensor is one matrix of one row); stacked
// tensors such as experts [E, out, in] get one tensor scale per matrix.
struct QTensor {
  std::vector<int64_t> shape;              // original (logical) shape
  torch::ScalarType dtype = torch::kFloat; // dtype of the source tensor; dequantize() returns it by default
  torch::Tensor codes;                     // uint8 [rows, Kp/2]: element 2j in the low nibble of byte j
  torch::Tensor scales;                    // uint8 [rows, Kp/16]: E4M3 block scales
  torch::Tensor tensor_scale;              // float32 [matrices]: s_dec

  int64_t k() const { return shape.back(); }
  int64_t blocks_per_row() const { return (k() + kBlock - 1) / kBlock; }
  int64_t k_padded() const { return blocks_per_row() * kBlock; }
  int64_t rows() const;
  int64_t rows_per_matrix() const { return shape.size() >= 2 ? shape[shape.size() - 2] : 1; }
  int64_t matrices() const;
  int64_t numel() const;
  // Bytes of codes + block scales + tensor scales (what accounting's nvfp4_bytes() predicts).
  int64_t storage_bytes() const;
  // Matrix i of a stacked tensor as a 2-D QTensor [out, K] sharing storage.
  QTensor matrix(int64_t i) const;
  // The same tensor with its three buffers on device (e.g. torch::kCUDA).
  QTensor to(const torch::Device& device) const;
};

// Throws slm::Error (naming `what`) unless shape, dtypes, buffer shapes, contiguity and scale values agree
// (no NaN block scales, finite non-negative tensor scales; values are checked only for CPU buffers and only
// when check_values is set: kernels skip that O(size) scan).
void validate(const QTensor& q, const std::string& what, bool check_values = true);

// Quantizes a floating tensor (any float dtype, CPU; at least one dim, no zero-sized dims). Non-finite values
// are an slm::Error naming `what`.
QTensor quantize(const torch::Tensor& x, const EncodeOptions& options = {}, const std::string& what = "tensor");

// FP32 decode of every element, in the original shape, cast to dtype (default: q.dtype), on q's device.
torch::Tensor dequantize(const QTensor& q);
torch::Tensor dequantize(const QTensor& q, torch::ScalarType dtype);

// The element values before the tensor scale, q_i * S_b, as FP32 [rows, Kp] on q's device (the padding decodes to
// zero). Each is a product of a 2-bit and a 4-bit significand, so it is exact in FP32 and in BF16: a BF16 copy of
// this matrix loses nothing, and a BF16 matmul with it, scaled by s_dec afterwards, computes with the exact weights.
torch::Tensor block_values(const QTensor& q);

// Unpacked codes [rows, K] (one 4-bit code per uint8, padding dropped) and packing back.
torch::Tensor unpack_codes(const QTensor& q);
torch::Tensor pack_codes(const torch::Tensor& codes_rows_k);  // uint8 [rows, K] -> [rows, Kp/2]

}  // namespace slm::nvfp4
