#pragma once
// Launcher of the split-key decode attention kernel (src/slm/ops/cuda/decode_attention_kernels.cu); plain C++ so the
// .cu needs no torch. The computation is ops::decode_attention's (src/slm/ops/decode_attention.h), which the CUDA
// tests compare against a float64 loop.
#include <cstdint>
#include <string>

namespace slm::ops::cuda {

enum class DecodeDtype { kFloat, kBFloat16, kHalf };

struct DecodeAttentionShape {
  int64_t batch, heads, kv_heads, head_dim, capacity;
  int64_t window;  // 0: every key below the length
  int64_t splits;  // key ranges of ceil(capacity / splits) keys, one CTA each per (row, head)
  float scale;
};

// The most key ranges (DecodeAttentionShape::splits) one launch takes.
constexpr int64_t kMaxSplits = 256;

// Whether the kernel is compiled for this head dim (32, 64, 128 or 256).
bool decode_attention_supported(int64_t head_dim);

// q [B, H, D]; k, v [B, KV, capacity, D] (contiguous); lengths [B] int64, the keys each row holds (1..capacity);
// keep: nullptr, or [B, capacity] bytes, non-zero for the keys that take part (each row keeps at least one key of
// its range); out [B, H, D]; partial_ml [B, H, splits, 2] and partial_acc [B, H, splits, D] FP32 scratch. stream: a
// cudaStream_t. Returns "" or the CUDA error text.
std::string decode_attention(const DecodeAttentionShape& s, DecodeDtype dtype, const void* q, const void* k,
                             const void* v, const int64_t* lengths, const uint8_t* keep, void* out, float* partial_ml,
                             float* partial_acc, void* stream);

}  // namespace slm::ops::cuda
