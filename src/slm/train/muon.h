#pragma once
// Muon's building blocks: Newton-Schulz orthogonalisation and the matrix-to-rank assignment for distributed
// Muon (whole-matrix ownership, notes §6.5 A). The optimizer (optimizer.h) drives them.
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace slm::train {

// Odd quintic polynomials p(x) = a x + b x^3 + c x^5 applied to the singular values of the normalised update.
enum class NsCoefficients {
  // Polar Express (arXiv 2505.16932; nanochat's default): 5 per-step-optimised tuples, input normalised by
  // 1.01·||X||_F + 1e-6. Singular values s/||G||_F in [1e-3, 1] end in [0.853, 1.141] after 5 steps (float64
  // map). At most 5 steps: the tuples are a sequence whose last one finishes (p(1) != 1), so more steps of
  // it would not converge; fewer steps use the first ones (nanochat).
  PolarExpress,
  // Classic Muon quintic (Jordan, modded-nanogpt): (3.4445, -4.7750, 2.0315) every step, input normalised by
  // ||X||_F + 1e-7. Singular values s/||G||_F in [2e-3, 1] end in [0.68, 1.21] after 5 steps (the often-quoted
  // "roughly U(0.5, 1.5)"): it trades accuracy for a fast rise of small singular values.
  Quintic,
};

NsCoefficients parse_ns_coefficients(const std::string& name);  // "polar-express" | "quintic"; slm::Error otherwise
const char* ns_coefficients_name(NsCoefficients c);

// The (a, b, c) used at NS step `step` (0-based), and the normalisation X / (scale·||X||_F + eps).
std::array<double, 3> ns_step_coefficients(NsCoefficients c, int step);
int ns_max_steps(NsCoefficients c);  // 5 for Polar Express, effectively unbounded for the quintic
struct NsNormalisation {
  double scale, eps;
};
NsNormalisation ns_normalisation(NsCoefficients c);

// Approximate polar factor of g [..., m, n] (leading dims are a batch of independent matrices): normalise each
// matrix by its Frobenius norm (in float32 or wider), then `steps` iterations X <- a X + (b A + c A^2) X with
// A = X X^T, computed in `compute` (OptimizerConfig::ns_dtype: bfloat16 on GPUs, float32 on CPUs without native BF16,
// float64 for reference checks) on the wide orientation
// (tall matrices are transposed so A is the smaller Gram matrix, then transposed back). Returns g's shape in
// float32 (float64 when g is float64). Deterministic: the same input gives the same bits.
torch::Tensor newton_schulz(const torch::Tensor& g, int steps, NsCoefficients coefficients,
                            torch::ScalarType compute = torch::kBFloat16);

// One Muon matrix: slice `index` of parameter `param` (index 0 of a 2-D parameter; expert e of a stacked
// [experts, rows, cols] tensor).
struct MuonMatrix {
  size_t param = 0;
  int64_t index = 0;
  int64_t rows = 0, cols = 0;
  double ns_flops() const;  // one NS iteration on the wide orientation: 4 m^2 n + 2 m^3 (m = min side)
};

// Distributed Muon by whole-matrix ownership: owner rank of each matrix, so rank r orthogonalises only its
// own and the updated matrices are all-gathered afterwards. Largest-first greedy onto the least-loaded rank
// by NS FLOPs (ties: lower index, lower rank), which keeps the per-rank NS time within one matrix of even.
// Deterministic: every rank computes the same assignment from the same list.
std::vector<int> assign_muon_owners(const std::vector<MuonMatrix>& matrices, int world_size);

}  // namespace slm::train
