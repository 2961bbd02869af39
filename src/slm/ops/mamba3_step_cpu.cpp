#include "slm/ops/mamba3_step_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace slm::ops {

void mamba3_step_cpu(const Mamba3StepShape& s, const Mamba3StepArgs& a) {
  const int64_t N = s.d_state, P = s.headdim, S = s.angles, H = s.heads;
  const int64_t bc = s.groups * N, scal = 2 * s.d_inner + 2 * bc, heads_per_group = H / s.groups;
  const auto* proj = static_cast<const float*>(a.proj);
  const auto* dt_bias = static_cast<const float*>(a.dt_bias);
  const auto* b_bias = static_cast<const float*>(a.b_bias);
  const auto* c_bias = static_cast<const float*>(a.c_bias);
  const auto* wb = static_cast<const float*>(a.b_norm);
  const auto* wc = static_cast<const float*>(a.c_norm);
  const auto* d = static_cast<const float*>(a.d);
  constexpr float kPi = std::numbers::pi_v<float>, kTwoPi = 2 * std::numbers::pi_v<float>;
  at::parallel_for(0, s.batch * H, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> k(N), q(N), phase(S);
    for (int64_t bh = i0; bh < i1; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / heads_per_group;
      const float* row = proj + b * s.width;
      // The scalars.
      const float u_dt = row[scal + h] + dt_bias[h];
      const float dt = u_dt > 20.f ? u_dt : std::log1p(std::exp(u_dt));
      const float lambda = 1.f / (1.f + std::exp(-row[scal + 2 * H + h]));
      const float u_a = row[scal + H + h];
      const float tail = std::max(u_a, 0.f) + 1.f / (1.f - std::min(u_a, 0.f));
      const float alpha = std::exp(-std::max(tail, s.a_floor) * dt);
      const float gamma = lambda * dt, beta = (1.f - lambda) * dt * alpha;
      for (int64_t i = 0; i < S; ++i) {
        float ph = a.angle_in[bh * S + i] + dt * (kPi * std::tanh(row[scal + 3 * H + i]));
        ph -= kTwoPi * std::floor(ph / kTwoPi);
        phase[i] = ph;
        a.angle_out[bh * S + i] = ph;
      }
      // RMSNorm of the group's B and C, gain and the head's bias, then the rotation of the first S pairs.
      const float* rb_in = row + 2 * s.d_inner + g * N;
      const float* rc_in = row + 2 * s.d_inner + bc + g * N;
      float sb = 0.f, sc = 0.f;
      for (int64_t n = 0; n < N; ++n) sb += rb_in[n] * rb_in[n], sc += rc_in[n] * rc_in[n];
      const float rb = 1.f / std::sqrt(sb / static_cast<float>(N) + s.norm_eps);
      const float rc = 1.f / std::sqrt(sc / static_cast<float>(N) + s.norm_eps);
      for (int64_t n = 0; n < N; ++n) {
        k[n] = rb_in[n] * rb * wb[n] + b_bias[h * N + n];
        q[n] = rc_in[n] * rc * wc[n] + c_bias[h * N + n];
      }
      for (int64_t j = 0; j < S && 2 * j + 1 < N; ++j) {
        const float sn = std::sin(phase[j]), cs = std::cos(phase[j]);
        const float k0 = k[2 * j], k1 = k[2 * j + 1], q0 = q[2 * j], q1 = q[2 * j + 1];
        k[2 * j] = k0 * cs - k1 * sn, k[2 * j + 1] = k0 * sn + k1 * cs;
        q[2 * j] = q0 * cs - q1 * sn, q[2 * j + 1] = q0 * sn + q1 * cs;
      }
      const float* x = row + s.d_inner + h * P;
      const float* xp = a.x_in + bh * P;
      const float* kp = a.k_in + bh * N;
      std::copy(k.begin(), k.end(), a.k_out + bh * N);
      std::copy(x, x + P, a.x_out + bh * P);
      // S = α S + β x_prev k_prevᵀ + γ x kᵀ;  y = S q + D x.
      const float* in = a.ssm_in + bh * P * N;
      float* out = a.ssm_out + bh * P * N;
      for (int64_t p = 0; p < P; ++p) {
        const float bx = beta * xp[p], gx = gamma * x[p];
        float dot = 0.f;
        for (int64_t n = 0; n < N; ++n) {
          const float v = alpha * in[p * N + n] + bx * kp[n] + gx * k[n];
          out[p * N + n] = v;
          dot += v * q[n];
        }
        a.y[bh * P + p] = dot + d[h] * x[p];
      }
    }
  });
}

}  // namespace slm::ops
