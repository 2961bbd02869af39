#include "slm/quant/nvfp4_linear.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "slm/util/error.h"

namespace slm::nvfp4 {

namespace {

struct Tables {
  std::array<float, 512> pair;  // byte -> (value of the low nibble, value of the high nibble)
  std::array<float, 256> e4m3;  // byte -> block scale
  Tables() {
    for (int b = 0; b < 256; ++b) {
      pair[2 * b] = e2m1_decode(static_cast<uint8_t>(b & 15));
      pair[2 * b + 1] = e2m1_decode(static_cast<uint8_t>(b >> 4));
      e4m3[b] = e4m3_decode(static_cast<uint8_t>(b));
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

struct Args {
  const float* x;         // [M, Kp], zero-padded
  const uint8_t* codes;   // [N, Kp/2]
  const uint8_t* scales;  // [N, blocks]
  float s_dec;
  float* y;  // [M, N]
  int64_t M, N, kp, blocks;
  const float* pair;
  const float* e4m3;
};

// Portable version. Rows [n0, n1) of W against x rows [m0, m0 + MC): each 16-element block is decoded once (LUT, times
// its scale) into registers and multiplied into MC 16-wide accumulators, reduced once per output.
template <int MC>
[[gnu::always_inline]] inline void rows_impl(const Args& a, int64_t m0, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    float acc[MC][16] = {};
    const uint8_t* crow = a.codes + n * (a.kp / 2);
    const uint8_t* srow = a.scales + n * a.blocks;
    const float* xb = a.x + m0 * a.kp;
    for (int64_t b = 0; b < a.blocks; ++b) {
      const float S = a.e4m3[srow[b]];
      const uint8_t* cb = crow + b * 8;
      float w[16];
      for (int j = 0; j < 8; ++j) {
        const float* p = a.pair + 2 * cb[j];
        w[2 * j] = p[0] * S;
        w[2 * j + 1] = p[1] * S;
      }
      for (int mm = 0; mm < MC; ++mm) {
        const float* xr = xb + mm * a.kp + b * 16;
        for (int i = 0; i < 16; ++i) acc[mm][i] += w[i] * xr[i];
      }
    }
    for (int mm = 0; mm < MC; ++mm) {
      float s = 0.0f;
      for (int i = 0; i < 16; ++i) s += acc[mm][i];
      a.y[(m0 + mm) * a.N + n] = s * a.s_dec;
    }
  }
}

template <int MC>
void rows_default(const Args& a, int64_t m0, int64_t n0, int64_t n1) {
  rows_impl<MC>(a, m0, n0, n1);
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2 + FMA: a block's 8 code bytes become 16 int8 values (2x the E2M1 value) with one byte shuffle, then two
// vectors of 8 floats scaled by S/2; each x row takes two FMAs per block.
template <int MC>
[[gnu::target("avx2,fma")]] void rows_avx2(const Args& a, int64_t m0, int64_t n0, int64_t n1) {
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    __m256 acc[MC][2];
    for (int mm = 0; mm < MC; ++mm) acc[mm][0] = acc[mm][1] = _mm256_setzero_ps();
    const uint8_t* crow = a.codes + n * (a.kp / 2);
    const uint8_t* srow = a.scales + n * a.blocks;
    const float* xb = a.x + m0 * a.kp;
    for (int64_t b = 0; b < a.blocks; ++b) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(crow + b * 8));
      const __m128i lo = _mm_and_si128(bytes, low4);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
      const __m128i v = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));  // element order, values x2
      const __m256 half_s = _mm256_set1_ps(0.5f * a.e4m3[srow[b]]);
      const __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), half_s);
      const __m256 w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), half_s);
      for (int mm = 0; mm < MC; ++mm) {
        const float* xr = xb + mm * a.kp + b * 16;
        acc[mm][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), acc[mm][0]);
        acc[mm][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), acc[mm][1]);
      }
    }
    for (int mm = 0; mm < MC; ++mm) {
      const __m256 s8 = _mm256_add_ps(acc[mm][0], acc[mm][1]);
      __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
      s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
      s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
      a.y[(m0 + mm) * a.N + n] = _mm_cvtss_f32(s4) * a.s_dec;
    }
  }
}
bool have_avx2() {
  static const bool v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return v;
}

// AVX-512 with BF16 dot products (Zen 4, Sapphire Rapids): x is rounded to BF16 once per call (as the CUDA GEMV
// reads it), the weights become exact BF16 values, and vdpbf16ps multiplies 32 of them per instruction with FP32
// accumulation. Per 32-element chunk (two blocks, 16 code bytes): the bytes widened to 16 dwords, each dword d
// turned into the word pair (d, d >> 4) by d | d << 12, and one 32-entry word permute (which reads only the low 5
// bits of each index, so entry i holds the value of i & 15) gives the 32 weights in element order. The dot product's
// 16 lanes are lanes 0-7 block 2j and 8-15 block 2j+1, scaled by their block scales with one FMA. Block scales are
// decoded per row with F16C: an E4M3 byte b is the FP16 number ((b & 0x80) << 8) | ((b & 0x7F) << 7) times 2^8
// (both formats have 3 mantissa bits; the biases differ by 8, subnormals included), so the row's scales are
// widened, shifted and converted 16 at a time and 2^8 is folded into s_dec.
struct Bf16Args {
  const uint16_t* x;      // [M, kc] BF16 bits, zero-padded to whole chunks
  const uint8_t* codes;   // [N, Kp/2]
  const uint8_t* scales;  // [N, blocks]
  float s_dec;
  float* y;
  int64_t M, N, blocks, kc;
};

#define SLM_AVX512BF16 gnu::target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")
// GCC 12's AVX-512 headers start several intrinsics from _mm512_undefined_*(), which -Wmaybe-uninitialized reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// One 32-element chunk j of a row (its 16 code bytes in c) against MC rows of x, into acc[0..MC).
template <int MC>
[[SLM_AVX512BF16, gnu::always_inline]] inline void chunk_dot(const Bf16Args& a, __m512i lut, const float* sc,
                                                             int64_t m0, int64_t j, __m128i c, __m512* acc) {
  const __m512i d = _mm512_cvtepu8_epi32(c);
  const __m512i wv = _mm512_permutexvar_epi16(_mm512_or_si512(d, _mm512_slli_epi32(d, 12)), lut);
  const __m512 s = _mm512_mask_broadcastss_ps(_mm512_set1_ps(sc[2 * j]), 0xFF00, _mm_load_ss(sc + 2 * j + 1));
  for (int mm = 0; mm < MC; ++mm) {
    const __m512i xv = _mm512_loadu_si512(a.x + (m0 + mm) * a.kc + j * 32);
    const __m512 p = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)wv, (__m512bh)xv);
    acc[mm] = _mm512_fmadd_ps(p, s, acc[mm]);
  }
}

// The 16 E2M1 values as BF16 bits, twice (vpermw indexes 32 words), built once.
struct Bf16Lut {
  alignas(64) uint16_t words[32];
  Bf16Lut() {
    for (int i = 0; i < 32; ++i) {
      const float v = e2m1_decode(static_cast<uint8_t>(i & 15));
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      words[i] = static_cast<uint16_t>(bits >> 16);  // exact: E2M1 values have at most 2 significant bits
    }
  }
};

template <int MC>
[[SLM_AVX512BF16]] void rows_avx512bf16(const Bf16Args& a, int64_t m0, int64_t n0, int64_t n1) {
  static const Bf16Lut table;
  const __m512i lut = _mm512_load_si512(table.words);
  const int64_t chunks = (a.blocks + 1) / 2, full = a.blocks / 2;
  const int64_t sblocks = (a.blocks + 15) / 16 * 16;
  std::vector<float> scales(static_cast<size_t>(sblocks));  // the row's decoded block scales (times 2^-8)
  float* sc = scales.data();
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* crow = a.codes + n * a.blocks * 8;
    const uint8_t* srow = a.scales + n * a.blocks;
    for (int64_t b = 0; b < sblocks; b += 16) {
      const int64_t left = std::min<int64_t>(16, a.blocks - b);
      const __m128i bytes = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << left) - 1), srow + b);
      const __m256i w = _mm256_cvtepu8_epi16(bytes);
      const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                        _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7));
      _mm512_storeu_ps(sc + b, _mm512_cvtph_ps(h));
    }
    // Two accumulators per x row (even and odd chunks) so consecutive FMAs do not wait on each other.
    __m512 acc0[MC], acc1[MC];
    for (int mm = 0; mm < MC; ++mm) acc0[mm] = acc1[mm] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= full; j += 2) {
      chunk_dot<MC>(a, lut, sc, m0, j, _mm_loadu_si128(reinterpret_cast<const __m128i*>(crow + j * 16)), acc0);
      chunk_dot<MC>(a, lut, sc, m0, j + 1, _mm_loadu_si128(reinterpret_cast<const __m128i*>(crow + j * 16 + 16)), acc1);
    }
    for (; j < full; ++j)
      chunk_dot<MC>(a, lut, sc, m0, j, _mm_loadu_si128(reinterpret_cast<const __m128i*>(crow + j * 16)), acc0);
    if (chunks > full)  // an odd last block: its 8 code bytes; the missing half decodes to zero weights and scale
      chunk_dot<MC>(a, lut, sc, m0, full, _mm_loadl_epi64(reinterpret_cast<const __m128i*>(crow + full * 16)), acc1);
    for (int mm = 0; mm < MC; ++mm)
      a.y[(m0 + mm) * a.N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[mm], acc1[mm])) * a.s_dec;
  }
}

// x FP32 [M, kp] -> BF16 bits [M, kc] (kc >= kp, whole chunks), round to nearest even, zero-padded.
[[SLM_AVX512BF16]] void to_bf16_rows(const float* x, int64_t M, int64_t kp, uint16_t* out, int64_t kc) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * kp;
    uint16_t* o = out + m * kc;
    for (int64_t i = 0; i < kc; i += 32) {
      const int64_t l0 = std::clamp<int64_t>(kp - i, 0, 16), l1 = std::clamp<int64_t>(kp - i - 16, 0, 16);
      const __m512 v0 = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << l0) - 1), xr + i);
      const __m512 v1 = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << l1) - 1), xr + i + 16);
      _mm512_storeu_si512(o + i, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
    }
  }
}

#pragma GCC diagnostic pop

bool have_avx512bf16() {
  static const bool v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
                        __builtin_cpu_supports("f16c");
  return v;
}
#endif

std::atomic<CpuKernel> g_kernel{CpuKernel::Auto};

// SLM_NVFP4_CPU_KERNEL=portable|avx2|avx512-bf16 picks the kernel for the whole process (a name this CPU does not run
// is an error at the first product); unset or "auto", the fastest one that runs.
CpuKernel env_kernel() {
  static const CpuKernel k = [] {
    const char* v = std::getenv("SLM_NVFP4_CPU_KERNEL");
    const std::string name = v ? v : "auto";
    for (auto c : {CpuKernel::Portable, CpuKernel::Avx2, CpuKernel::Avx512Bf16})
      if (name == cpu_kernel_name(c)) {
        if (!cpu_kernel_available(c))
          throw Error("SLM_NVFP4_CPU_KERNEL=" + name + ": that NVFP4 kernel does not run on this CPU");
        return c;
      }
    if (name != "auto") throw Error("SLM_NVFP4_CPU_KERNEL=" + name + ": expected auto, portable, avx2 or avx512-bf16");
    return CpuKernel::Auto;
  }();
  return k;
}

CpuKernel pick_kernel() {
  CpuKernel want = g_kernel.load(std::memory_order_relaxed);
  if (want == CpuKernel::Auto) want = env_kernel();
  if (want != CpuKernel::Auto) return want;
  if (cpu_kernel_available(CpuKernel::Avx512Bf16)) return CpuKernel::Avx512Bf16;
  if (cpu_kernel_available(CpuKernel::Avx2)) return CpuKernel::Avx2;
  return CpuKernel::Portable;
}

template <int MC>
void rows(const Args& a, int64_t m0, int64_t n0, int64_t n1, CpuKernel k) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (k == CpuKernel::Avx2) return rows_avx2<MC>(a, m0, n0, n1);
#endif
  (void)k;
  rows_default<MC>(a, m0, n0, n1);
}

// run(std::integral_constant<int, MC>, m) over the rows of x in groups of MC = 4, then the 3, 2 or 1 left: the
// kernels keep MC accumulators per weight row in registers, so MC is a template argument.
template <typename Run>
void for_row_groups(int64_t M, Run&& run) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) run(std::integral_constant<int, 4>{}, m);
  switch (M - m) {
    case 3: run(std::integral_constant<int, 3>{}, m); break;
    case 2: run(std::integral_constant<int, 2>{}, m); break;
    case 1: run(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

void check_weight(const QTensor& w, int64_t K, const char* where) {
  if (w.shape.size() != 2)
    throw Error(std::string(where) + ": NVFP4 weight must be 2-D [N, K] (use matrix(i) for stacked tensors), got " +
                std::to_string(w.shape.size()) + "-D");
  if (w.k() != K)
    throw Error(std::string(where) + ": x has K = " + std::to_string(K) +
                " but the weight has K = " + std::to_string(w.k()));
}

}  // namespace

bool cpu_kernel_available(CpuKernel k) {
  switch (k) {
    case CpuKernel::Auto:
    case CpuKernel::Portable: return true;
#if defined(__x86_64__) && defined(__GNUC__)
    case CpuKernel::Avx2: return have_avx2();
    case CpuKernel::Avx512Bf16: return have_avx512bf16();
#endif
    default: return false;
  }
}

void set_cpu_kernel(CpuKernel k) {
  if (!cpu_kernel_available(k))
    throw Error(std::string("nvfp4: the ") + cpu_kernel_name(k) + " CPU kernel does not run on this CPU");
  g_kernel.store(k);
}

const char* cpu_kernel_name(CpuKernel k) {
  switch (k) {
    case CpuKernel::Auto: return cpu_kernel_name(pick_kernel());
    case CpuKernel::Portable: return "portable";
    case CpuKernel::Avx2: return "avx2";
    case CpuKernel::Avx512Bf16: return "avx512-bf16";
  }
  return "?";
}

torch::Tensor linear_cpu(const torch::Tensor& x_in, const QTensor& w) {
  if (x_in.dim() != 2) throw Error("nvfp4 linear_cpu: x must be [M, K]");
  const int64_t M = x_in.size(0), K = x_in.size(1);
  check_weight(w, K, "nvfp4 linear_cpu");
  validate(w, "nvfp4 linear_cpu weight", false);
  if (!w.codes.is_cpu() || !x_in.is_cpu()) throw Error("nvfp4 linear_cpu: x and the weight must be on the CPU");
  const int64_t N = w.shape[0], kp = w.k_padded();
  torch::Tensor y = torch::empty({M, N}, torch::kFloat);
  if (M == 0) return y;
  torch::Tensor x = x_in.to(torch::kFloat);
  if (kp != K) x = torch::constant_pad_nd(x, {0, kp - K}, 0.0);
  x = x.contiguous();
  const float s_dec = w.tensor_scale.item<float>();
  // About 64 KiB of weights per task keeps scheduling cheap and the split even.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(kp / 2 + w.blocks_per_row(), 1));
  const CpuKernel kernel = pick_kernel();
#if defined(__x86_64__) && defined(__GNUC__)
  if (kernel == CpuKernel::Avx512Bf16) {
    const int64_t blocks = w.blocks_per_row(), kc = (blocks + 1) / 2 * 32;
    torch::Tensor xb = torch::empty({M, kc}, torch::kInt16);
    auto* xbits = reinterpret_cast<uint16_t*>(xb.data_ptr<int16_t>());
    to_bf16_rows(x.data_ptr<float>(), M, kp, xbits, kc);
    // The kernel's scales are the E4M3 values times 2^-8 (their FP16 reading): 2^8 goes into s_dec.
    Bf16Args a{xbits,
               w.codes.data_ptr<uint8_t>(),
               w.scales.data_ptr<uint8_t>(),
               s_dec * 256.0f,
               y.data_ptr<float>(),
               M,
               N,
               blocks,
               kc};
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
      for_row_groups(M, [&](auto mc, int64_t m) { rows_avx512bf16<decltype(mc)::value>(a, m, n0, n1); });
    });
    return y;
  }
#endif
  const Tables& t = tables();
  Args a{x.data_ptr<float>(),
         w.codes.data_ptr<uint8_t>(),
         w.scales.data_ptr<uint8_t>(),
         s_dec,
         y.data_ptr<float>(),
         M,
         N,
         kp,
         w.blocks_per_row(),
         t.pair.data(),
         t.e4m3.data()};
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    for_row_groups(M, [&](auto mc, int64_t m) { rows<decltype(mc)::value>(a, m, n0, n1, kernel); });
  });
  return y;
}

ops::Nvfp4Stack as_stack(const QTensor& w) {
  if (w.shape.size() < 2) throw Error("nvfp4 as_stack: the weight must be a matrix or a stack of them");
  return {w.codes, w.scales, w.tensor_scale, w.matrices(), w.shape[w.shape.size() - 2], w.k()};
}

torch::Tensor linear(const torch::Tensor& x, const QTensor& w, torch::ScalarType out) {
  if (!x.defined() || x.dim() < 1) throw Error("nvfp4 linear: x must have at least one dimension");
  if (!x.is_floating_point()) throw Error("nvfp4 linear: x must be a floating tensor");
  const int64_t K = x.size(-1);
  check_weight(w, K, "nvfp4 linear");
  if (x.device() != w.codes.device())
    throw Error("nvfp4 linear: x is on " + x.device().str() + " but the weight is on " + w.codes.device().str());
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = w.shape[0];
  torch::Tensor x2 = x.reshape({-1, K});
  torch::Tensor y = x.is_cuda() ? linear_cuda(x2, w, out) : linear_cpu(x2, w).to(out);
  return y.reshape(out_shape);
}

}  // namespace slm::nvfp4

#ifdef SLM_WITH_CUDA
#include "slm/ops/aligned.h"
#include "slm/quant/cuda/nvfp4_gemv.h"
#if __has_include(<c10/cuda/CUDAStream.h>)
#include <c10/cuda/CUDAStream.h>
#define SLM_HAVE_C10_CUDA 1
#endif
#endif

namespace slm::nvfp4 {

bool cuda_kernels_built() {
#ifdef SLM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

#ifdef SLM_WITH_CUDA
namespace {
// x [rows, K] as the GEMV kernels read it: BF16, zero-padded to the weight's padded K, contiguous, 16-byte aligned.
torch::Tensor gemv_activations(const torch::Tensor& x_in, const QTensor& w) {
  torch::Tensor x = x_in.to(torch::kBFloat16);
  if (w.k_padded() != x.size(1)) x = torch::constant_pad_nd(x, {0, w.k_padded() - x.size(1)}, 0.0);
  return ops::contiguous_aligned16(x);
}

void* current_stream(const torch::Device& device) {
#ifdef SLM_HAVE_C10_CUDA
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
  return nullptr;
#endif
}
}  // namespace
#endif

torch::Tensor linear_cuda(const torch::Tensor& x_in, const QTensor& w, torch::ScalarType out) {
#ifndef SLM_WITH_CUDA
  (void)x_in;
  (void)w;
  (void)out;
  throw Error("nvfp4 linear: this build has no CUDA kernels (configure with -DSLM_CUDA=ON)");
#else
  if (x_in.dim() != 2) throw Error("nvfp4 linear_cuda: x must be [M, K]");
  const int64_t M = x_in.size(0), K = x_in.size(1);
  if (w.shape.size() != 2 || w.k() != K)
    throw Error("nvfp4 linear_cuda: weight must be 2-D [N, K] with K = " + std::to_string(K));
  validate(w, "nvfp4 linear_cuda weight", false);
  if (!x_in.is_cuda() || !w.codes.is_cuda() || x_in.device() != w.codes.device())
    throw Error("nvfp4 linear_cuda: x and the weight must be on the same CUDA device");
  const int64_t N = w.shape[0];
  const torch::Tensor x = gemv_activations(x_in, w);
  // The GEMV is for decode: it streams the 4-bit weight once per 16 rows of x (one tensor-core tile), which wins
  // while reading W is the cost. Beyond 16 rows it would read W again for every 16 rows, hundreds of times for a
  // prefill or evaluation batch, so there W is decoded once to BF16 (exact, see block_values) and one cuBLAS BF16
  // GEMM with FP32 accumulation and output does the product, then s_dec is applied: the GEMV's arithmetic in
  // another summation order. (Where between 17 rows and a few dozen the GEMM starts to win is not measured.)
  constexpr int64_t kGemvMaxRows = 16;
  if (M > kGemvMaxRows)
    return at::mm(x, block_values(w).to(torch::kBFloat16).t(), torch::kFloat).mul_(w.tensor_scale).to(out);
  const bool bf16_out = out == torch::kBFloat16;
  torch::Tensor codes = w.codes;
  const bool copied = reinterpret_cast<uintptr_t>(codes.data_ptr()) % 8 != 0;
  if (copied) codes = codes.clone();
  torch::Tensor y = torch::empty({M, N}, x.options().dtype(bf16_out ? torch::kBFloat16 : torch::kFloat));
  std::string err =
      cuda::gemv(codes.data_ptr<uint8_t>(), w.scales.data_ptr<uint8_t>(), w.tensor_scale.data_ptr<float>(),
                 x.data_ptr(), y.data_ptr(), M, N, w.blocks_per_row(), current_stream(x.device()),
                 /*pdl=*/!copied, bf16_out);  // loaded weights are read-only; a fresh copy is not
  if (!err.empty()) throw Error("nvfp4 linear_cuda: " + err);
  return y.to(out);
#endif
}

#ifdef SLM_WITH_CUDA
namespace {
// What gathered_linear_cuda and grouped_linear_cuda share: the checks, x in BF16 padded to the weight's K, one launch.
template <class Launch>
torch::Tensor routed_linear(const char* what, const torch::Tensor& x_in, const QTensor& w, const torch::Tensor& ids,
                            int64_t x_div, torch::ScalarType out, Launch launch) {
  const std::string name = std::string("nvfp4 ") + what;
  if (x_in.dim() != 2) throw Error(name + ": x must be [rows, K]");
  if (w.shape.size() != 3 || w.k() != x_in.size(1))
    throw Error(name + ": the weight must be a stack [E, N, K] with K = " + std::to_string(x_in.size(1)));
  if (ids.dim() != 1 || ids.scalar_type() != torch::kLong) throw Error(name + ": ids must be a 1-D int64 tensor");
  if (x_div < 1 || ids.size(0) > x_in.size(0) * x_div)
    throw Error(name + ": " + std::to_string(ids.size(0)) + " assignments need " +
                std::to_string((ids.size(0) + x_div - 1) / x_div) + " rows of x, it has " +
                std::to_string(x_in.size(0)));
  validate(w, name + " weight", false);
  if (!x_in.is_cuda() || x_in.device() != w.codes.device() || ids.device() != x_in.device())
    throw Error(name + ": x, ids and the weight must be on the same CUDA device");
  const torch::Tensor x = gemv_activations(x_in, w);
  torch::Tensor codes = w.codes;
  if (reinterpret_cast<uintptr_t>(codes.data_ptr()) % 8 != 0) codes = codes.clone();
  const torch::Tensor id = ids.contiguous();
  const bool bf16_out = out == torch::kBFloat16;
  torch::Tensor y =
      torch::empty({id.size(0), w.shape[1]}, x.options().dtype(bf16_out ? torch::kBFloat16 : torch::kFloat));
  const std::string err = launch(codes.data_ptr<uint8_t>(), x.data_ptr(), y.data_ptr(), bf16_out,
                                 id.data_ptr<int64_t>(), id.size(0), current_stream(x.device()));
  if (!err.empty()) throw Error(name + ": " + err);
  return y.to(out);
}
}  // namespace
#endif

torch::Tensor gathered_linear_cuda(const torch::Tensor& x, const QTensor& w, const torch::Tensor& ids, int64_t x_div,
                                   torch::ScalarType out) {
#ifndef SLM_WITH_CUDA
  (void)x;
  (void)w;
  (void)ids;
  (void)x_div;
  (void)out;
  throw Error("nvfp4 gathered_linear_cuda: this build has no CUDA kernels (configure with -DSLM_CUDA=ON)");
#else
  return routed_linear(
      "gathered_linear_cuda", x, w, ids, x_div, out,
      [&](const uint8_t* codes, const void* xp, void* y, bool bf16, const int64_t* id, int64_t n, void* stream) {
        return cuda::gemv_gathered(codes, w.scales.data_ptr<uint8_t>(), w.tensor_scale.data_ptr<float>(), xp, y, id, n,
                                   x_div, w.shape[0], w.shape[1], w.blocks_per_row(), stream, bf16);
      });
#endif
}

torch::Tensor grouped_linear_cuda(const torch::Tensor& x, const QTensor& w, const torch::Tensor& order,
                                  const torch::Tensor& ends, int64_t x_div, torch::ScalarType out) {
#ifndef SLM_WITH_CUDA
  (void)x;
  (void)w;
  (void)order;
  (void)ends;
  (void)x_div;
  (void)out;
  throw Error("nvfp4 grouped_linear_cuda: this build has no CUDA kernels (configure with -DSLM_CUDA=ON)");
#else
  if (ends.dim() != 1 || ends.scalar_type() != torch::kInt || ends.size(0) != w.shape.at(0) ||
      ends.device() != order.device())
    throw Error("nvfp4 grouped_linear_cuda: ends must be int32 [experts] on the ids' device");
  const torch::Tensor e = ends.contiguous();
  return routed_linear(
      "grouped_linear_cuda", x, w, order, x_div, out,
      [&](const uint8_t* codes, const void* xp, void* y, bool bf16, const int64_t* id, int64_t n, void* stream) {
        return cuda::gemv_grouped(codes, w.scales.data_ptr<uint8_t>(), w.tensor_scale.data_ptr<float>(), xp, y, id,
                                  e.data_ptr<int32_t>(), n, x_div, w.shape[0], w.shape[1], w.blocks_per_row(), stream,
                                  bf16);
      });
#endif
}

}  // namespace slm::nvfp4
