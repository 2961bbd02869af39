#pragma once
// An independent float64 model of NVFP4 for the tests: values are decoded from their definitions (ldexp of the
// fields) and rounding is a brute-force search over every representable value, not the library's bit tricks.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace slm::test::nvfp4ref {

// E4M3FN from its fields: subnormal man * 2^-9, normal (8 + man) * 2^(exp - 10); 0x7F/0xFF NaN.
inline double e4m3_value(int code) {
  int sign = (code >> 7) & 1, exp = (code >> 3) & 15, man = code & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<double>::quiet_NaN();
  double mag = exp == 0 ? std::ldexp(static_cast<double>(man), -9) : std::ldexp(8.0 + man, exp - 10);
  return sign ? -mag : mag;
}

inline double e2m1_value(int code) {
  static const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -mags[code & 7] : mags[code & 7];
}

// Nearest non-negative E4M3 code to t >= 0 (saturating at 448); ties to the even code.
inline int e4m3_nearest(double t) {
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    double d = std::fabs(e4m3_value(c) - t);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

// Nearest E2M1 magnitude index to m >= 0 (saturating at 6); ties to the even index.
inline int e2m1_nearest(double m) {
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 8; ++c) {
    double d = std::fabs(e2m1_value(c) - m);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

// Codes acceptable for scaled value v: the nearest one, plus its neighbour when v lies within rel of the
// midpoint between them (the library works in FP32, the reference in float64, so near-ties may differ).
inline std::vector<int> e2m1_acceptable(double v, double rel = 1e-5) {
  int sign = std::signbit(v) ? 8 : 0;
  double m = std::fabs(v);
  std::vector<int> out{e2m1_nearest(m) | sign};
  for (int c = 0; c < 7; ++c) {
    double mid = 0.5 * (e2m1_value(c) + e2m1_value(c + 1));
    if (std::fabs(m - mid) <= rel * mid) {
      out.push_back(c | sign);
      out.push_back((c + 1) | sign);
    }
  }
  if (m == 0.0) out.push_back(0), out.push_back(8);
  return out;
}

inline std::vector<int> e4m3_acceptable(double t, double rel = 1e-5) {
  std::vector<int> out{e4m3_nearest(t)};
  for (int c = 0; c < 0x7E; ++c) {
    double mid = 0.5 * (e4m3_value(c) + e4m3_value(c + 1));
    if (std::fabs(t - mid) <= rel * mid) {
      out.push_back(c);
      out.push_back(c + 1);
    }
  }
  return out;
}

// The tensor scale the format stores for a matrix with absolute maximum amax: s_enc = fp32(2688 / amax)
// (clamped to FLT_MAX), s_dec = fp32(1 / s_enc); 0 for an all-zero matrix.
inline float s_enc_of(double amax) {
  if (amax == 0.0) return 0.0f;
  double e = 2688.0 / amax;
  return e > std::numeric_limits<float>::max() ? std::numeric_limits<float>::max() : static_cast<float>(e);
}
inline float s_dec_of(double amax) {
  float e = s_enc_of(amax);
  return e == 0.0f ? 0.0f : static_cast<float>(1.0 / static_cast<double>(e));
}

}  // namespace slm::test::nvfp4ref
