#include "slm/quant/nvfp4.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::nvfp4 {

namespace {

constexpr float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Magnitude index (0-7) of the nearest grid point, ties to the even index. m >= 0, not NaN.
uint8_t e2m1_magnitude_rne(float m) {
  // Midpoints between consecutive grid points: .25 .75 1.25 1.75 2.5 3.5 5; at a midpoint the even index wins.
  if (m <= 0.25f) return 0;
  if (m < 0.75f) return 1;
  if (m <= 1.25f) return 2;
  if (m < 1.75f) return 3;
  if (m <= 2.5f) return 4;
  if (m < 3.5f) return 5;
  if (m <= 5.0f) return 6;
  return 7;
}

// Counter-based uniform sample in [0, 1): splitmix64 of (seed, index).
float uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0xD1B54A32D192ED03ull + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

struct MatrixScales {
  float s_enc = 0.0f;
  float s_dec = 0.0f;
};

MatrixScales matrix_scales(float amax) {
  MatrixScales s;
  if (amax > 0.0f) {
    double enc = 2688.0 / static_cast<double>(amax);  // 6 * 448; correctly rounded when cast to float
    s.s_enc = enc > FLT_MAX ? FLT_MAX : static_cast<float>(enc);
    s.s_dec = static_cast<float>(1.0 / static_cast<double>(s.s_enc));
    // Near FLT_MAX the largest decoded value 6 * 448 * s_dec could round past FLT_MAX; step s_dec down.
    while (2688.0 * static_cast<double>(s.s_dec) > FLT_MAX) s.s_dec = std::nextafter(s.s_dec, 0.0f);
  }
  return s;
}

// Encodes n <= 16 values of one block; writes the block scale and n codes.
void encode_block(const float* x, int64_t n, const MatrixScales& ms, Rounding rounding, uint64_t seed,
                  uint64_t first_index, uint8_t* scale_out, uint8_t* codes) {
  float amax_b = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax_b = std::max(amax_b, std::fabs(x[i]));
  uint8_t S = e4m3_encode_rne((amax_b / 6.0f) * ms.s_enc);
  *scale_out = S;
  float Sf = e4m3_decode(S);
  if (!(Sf > 0.0f)) {  // the block is zero, or negligible next to the matrix amax
    for (int64_t i = 0; i < n; ++i) codes[i] = std::signbit(x[i]) ? 8 : 0;
    return;
  }
  double inv = 1.0 / (static_cast<double>(Sf) * static_cast<double>(ms.s_dec));
  bool in_float = inv <= FLT_MAX;
  float invf = in_float ? static_cast<float>(inv) : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float v = in_float ? x[i] * invf : static_cast<float>(static_cast<double>(x[i]) * inv);
    codes[i] = rounding == Rounding::Nearest ? e2m1_encode_rne(v)
                                             : e2m1_encode_stochastic(v, uniform(seed, first_index + i));
  }
}

}  // namespace

float e2m1_decode(uint8_t code) {
  float m = kE2M1[code & 7];
  return (code & 8) ? -m : m;
}

uint8_t e2m1_encode_rne(float v) {
  if (std::isnan(v)) return 0;
  uint8_t mag = e2m1_magnitude_rne(std::fabs(v));
  return static_cast<uint8_t>(mag | (std::signbit(v) ? 8 : 0));
}

uint8_t e2m1_encode_stochastic(float v, float u) {
  if (std::isnan(v)) return 0;
  float m = std::min(std::fabs(v), kE2M1Max);
  uint8_t lo = 0;
  while (lo < 7 && kE2M1[lo + 1] <= m) ++lo;
  uint8_t mag = lo;
  if (lo < 7 && m > kE2M1[lo]) {
    float p = (m - kE2M1[lo]) / (kE2M1[lo + 1] - kE2M1[lo]);
    if (u < p) mag = lo + 1;
  }
  return static_cast<uint8_t>(mag | (std::signbit(v) ? 8 : 0));
}

float e4m3_decode(uint8_t byte) {
  uint32_t sign = byte >> 7;
  uint32_t exp = (byte >> 3) & 0xF;
  uint32_t man = byte & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  float mag;
  if (exp == 0) {
    mag = static_cast<float>(man) * 0.001953125f;  // man/8 * 2^-6 = man * 2^-9
  } else {
    // Build the FP32 directly: exponent exp - 7 + 127, mantissa bits at the top of the 23-bit field.
    uint32_t bits = ((exp + 120u) << 23) | (man << 20);
    std::memcpy(&mag, &bits, sizeof mag);
  }
  return sign ? -mag : mag;
}

uint8_t e4m3_encode_rne(float v) {
  if (std::isnan(v)) return 0x7F;
  uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  float a = std::fabs(v);
  if (a >= 448.0f) return sign | 0x7E;  // saturate (also +-inf)
  if (a < 0.015625f) {                  // below 2^-6: subnormal grid of step 2^-9
    float q = a * 512.0f;               // exact (power-of-two scaling)
    float fl = std::floor(q);
    float frac = q - fl;
    uint32_t n = static_cast<uint32_t>(fl);
    if (frac > 0.5f || (frac == 0.5f && (n & 1))) ++n;
    return sign | static_cast<uint8_t>(n);  // n == 8 is the smallest normal, code 0x08
  }
  uint32_t bits = float_bits(a);
  int32_t exp = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 7;  // 1..15
  uint32_t man = bits & 0x7FFFFF;
  uint32_t m3 = man >> 20;
  uint32_t rest = man & 0xFFFFF;
  if (rest > 0x80000 || (rest == 0x80000 && (m3 & 1))) ++m3;
  if (m3 == 8) {
    m3 = 0;
    ++exp;
  }
  uint32_t code = (static_cast<uint32_t>(exp) << 3) | m3;
  if (exp > 15 || code > 0x7E) code = 0x7E;
  return sign | static_cast<uint8_t>(code);
}

int64_t QTensor::rows() const {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
  return r;
}

int64_t QTensor::matrices() const { return rows() / std::max<int64_t>(rows_per_matrix(), 1); }

int64_t QTensor::numel() const { return rows() * k(); }

int64_t QTensor::storage_bytes() const { return rows() * blocks_per_row() * (kBlock / 2 + 1) + 4 * matrices(); }

QTensor QTensor::matrix(int64_t i) const {
  if (i < 0 || i >= matrices())
    throw Error("NVFP4 matrix index " + std::to_string(i) + " out of range for shape " + shape_text(shape));
  QTensor m;
  int64_t rpm = rows_per_matrix();
  m.shape = {rpm, k()};
  m.dtype = dtype;
  m.codes = codes.narrow(0, i * rpm, rpm);
  m.scales = scales.narrow(0, i * rpm, rpm);
  m.tensor_scale = tensor_scale.narrow(0, i, 1);
  return m;
}

QTensor QTensor::to(const torch::Device& device) const {
  QTensor m = *this;
  m.codes = codes.to(device);
  m.scales = scales.to(device);
  m.tensor_scale = tensor_scale.to(device);
  return m;
}

void validate(const QTensor& q, const std::string& what, bool check_values) {
  auto fail = [&](const std::string& msg) { throw Error(what + ": NVFP4 " + msg); };
  if (q.shape.empty()) fail("shape must have at least one dimension");
  for (int64_t d : q.shape)
    if (d <= 0) fail("shape " + shape_text(q.shape) + " has a dimension <= 0");
  auto check = [&](const torch::Tensor& t, const char* name, torch::ScalarType dt, std::vector<int64_t> want) {
    if (!t.defined()) fail(std::string(name) + " is missing");
    if (t.scalar_type() != dt)
      fail(std::string(name) + " has dtype " + std::string(c10::toString(t.scalar_type())) + ", expected " +
           std::string(c10::toString(dt)));
    if (t.sizes().vec() != want)
      fail(std::string(name) + " has shape " + shape_text(t) + ", expected " + shape_text(want) + " for shape " +
           shape_text(q.shape));
    if (!t.is_contiguous()) fail(std::string(name) + " is not contiguous");
  };
  check(q.codes, "codes", torch::kUInt8, {q.rows(), q.k_padded() / 2});
  check(q.scales, "block scales", torch::kUInt8, {q.rows(), q.blocks_per_row()});
  check(q.tensor_scale, "tensor scale", torch::kFloat, {q.matrices()});
  if (q.codes.device() != q.scales.device() || q.codes.device() != q.tensor_scale.device())
    fail("buffers are on different devices");
  if (check_values && q.scales.is_cpu()) {
    const uint8_t* s = q.scales.data_ptr<uint8_t>();
    int64_t n = q.scales.numel();
    for (int64_t i = 0; i < n; ++i)
      if (s[i] & 0x80 || s[i] == 0x7F)
        fail("block scale " + std::to_string(i) + " is byte " + std::to_string(s[i]) +
             " (negative or NaN in E4M3; block scales are non-negative)");
    const float* ts = q.tensor_scale.data_ptr<float>();
    for (int64_t i = 0; i < q.matrices(); ++i)
      if (!std::isfinite(ts[i]) || ts[i] < 0.0f)
        fail("tensor scale " + std::to_string(i) + " is " + std::to_string(ts[i]) + " (must be finite and >= 0)");
  }
}

QTensor quantize(const torch::Tensor& x_in, const EncodeOptions& options, const std::string& what) {
  if (!x_in.defined()) throw Error(what + ": cannot quantize an undefined tensor");
  if (!x_in.is_floating_point())
    throw Error(what + ": cannot quantize dtype " + std::string(c10::toString(x_in.scalar_type())) +
                " (floating tensors only)");
  if (x_in.dim() < 1) throw Error(what + ": cannot quantize a 0-d tensor (need at least one dimension)");
  for (int64_t d : x_in.sizes())
    if (d <= 0) throw Error(what + ": cannot quantize shape " + shape_text(x_in) + " (zero-sized dimension)");
  torch::Tensor x = x_in.detach().to(torch::kCPU).to(torch::kFloat).contiguous();

  QTensor q;
  q.shape = x.sizes().vec();
  q.dtype = x_in.scalar_type();
  const int64_t K = q.k(), rows = q.rows(), blocks = q.blocks_per_row(), rpm = q.rows_per_matrix();
  const int64_t mats = q.matrices();
  const float* xp = x.data_ptr<float>();
  {
    int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(xp[i]))
        throw Error(what + ": value at flat index " + std::to_string(i) + " is " + std::to_string(xp[i]) +
                    " (NVFP4 encodes finite values only)");
  }
  q.codes = torch::zeros({rows, q.k_padded() / 2}, torch::kUInt8);
  q.scales = torch::zeros({rows, blocks}, torch::kUInt8);
  q.tensor_scale = torch::zeros({mats}, torch::kFloat);

  std::vector<MatrixScales> ms(mats);
  torch::Tensor amax = x.reshape({mats, rpm * K}).abs().amax(1).contiguous();
  const float* ap = amax.data_ptr<float>();
  float* tsp = q.tensor_scale.data_ptr<float>();
  for (int64_t m = 0; m < mats; ++m) {
    ms[m] = matrix_scales(ap[m]);
    tsp[m] = ms[m].s_dec;
  }

  uint8_t* cp = q.codes.data_ptr<uint8_t>();
  uint8_t* sp = q.scales.data_ptr<uint8_t>();
  const int64_t row_bytes = q.k_padded() / 2;
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    uint8_t codes[kBlock];
    for (int64_t r = begin; r < end; ++r) {
      const MatrixScales& s = ms[r / rpm];
      for (int64_t b = 0; b < blocks; ++b) {
        int64_t k0 = b * kBlock, n = std::min(kBlock, K - k0);
        std::fill(codes, codes + kBlock, uint8_t{0});
        encode_block(xp + r * K + k0, n, s, options.rounding, options.seed, static_cast<uint64_t>(r * K + k0),
                     sp + r * blocks + b, codes);
        uint8_t* out = cp + r * row_bytes + k0 / 2;
        for (int64_t j = 0; j < kBlock / 2; ++j) out[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
      }
    }
  });
  return q;
}

torch::Tensor dequantize(const QTensor& q) { return dequantize(q, q.dtype); }

namespace {

// The decode tables as tensors on `device`: each code byte's two E2M1 values [256, 2] and each scale byte's E4M3
// value [256]. Made once per device, because a host-to-device copy on every call would make the host wait for the
// GPU. Never freed: CUDA tensors must not be released after the CUDA runtime has shut down at exit.
const std::pair<torch::Tensor, torch::Tensor>& decode_tables(const torch::Device& device) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, std::pair<torch::Tensor, torch::Tensor>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(device.str());
  if (it != cache->end()) return it->second;
  torch::Tensor pair = torch::empty({256, 2}, torch::kFloat), scale = torch::empty({256}, torch::kFloat);
  auto pa = pair.accessor<float, 2>();
  auto sa = scale.accessor<float, 1>();
  for (int b = 0; b < 256; ++b) {
    pa[b][0] = e2m1_decode(static_cast<uint8_t>(b & 15));
    pa[b][1] = e2m1_decode(static_cast<uint8_t>(b >> 4));
    sa[b] = e4m3_decode(static_cast<uint8_t>(b));
  }
  return cache->emplace(device.str(), std::make_pair(pair.to(device), scale.to(device))).first->second;
}

}  // namespace

torch::Tensor block_values(const QTensor& q) {
  validate(q, "block_values", false);
  const auto& [pair, scale] = decode_tables(q.codes.device());
  const int64_t rows = q.rows(), blocks = q.blocks_per_row();
  // Byte j of a row holds elements 2j (low nibble) and 2j + 1, so the gathered pairs are in element order.
  torch::Tensor v = pair.index_select(0, q.codes.reshape({-1}).to(torch::kLong)).view({rows, blocks, kBlock});
  torch::Tensor s = scale.index_select(0, q.scales.reshape({-1}).to(torch::kLong)).view({rows, blocks, 1});
  return (v * s).view({rows, blocks * kBlock});
}

torch::Tensor dequantize(const QTensor& q, torch::ScalarType dtype) {
  validate(q, "dequantize");
  const int64_t K = q.k();
  torch::Tensor v = block_values(q).narrow(1, 0, K).reshape({q.matrices(), q.rows_per_matrix(), K});
  return (v * q.tensor_scale.view({-1, 1, 1})).reshape(q.shape).to(dtype);
}

torch::Tensor unpack_codes(const QTensor& q) {
  validate(q, "unpack_codes");
  torch::Tensor c = q.codes.to(torch::kCPU);
  const int64_t rows = q.rows(), K = q.k(), row_bytes = q.k_padded() / 2;
  torch::Tensor out = torch::empty({rows, K}, torch::kUInt8);
  const uint8_t* cp = c.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) {
      uint8_t byte = cp[r * row_bytes + k / 2];
      op[r * K + k] = (k & 1) ? (byte >> 4) : (byte & 0xF);
    }
  return out;
}

torch::Tensor pack_codes(const torch::Tensor& codes_in) {
  if (codes_in.dim() != 2 || codes_in.scalar_type() != torch::kUInt8)
    throw Error("pack_codes: expected uint8 [rows, K], got " + shape_text(codes_in));
  torch::Tensor c = codes_in.to(torch::kCPU).contiguous();
  const int64_t rows = c.size(0), K = c.size(1), row_bytes = (K + kBlock - 1) / kBlock * (kBlock / 2);
  torch::Tensor out = torch::zeros({rows, row_bytes}, torch::kUInt8);
  const uint8_t* cp = c.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) {
      uint8_t v = cp[r * K + k];
      if (v > 15) throw Error("pack_codes: code " + std::to_string(v) + " at row " + std::to_string(r) + ", element " +
                              std::to_string(k) + " is not a 4-bit value");
      op[r * row_bytes + k / 2] |= static_cast<uint8_t>((k & 1) ? v << 4 : v);
    }
  return out;
}

}  // namespace slm::nvfp4
