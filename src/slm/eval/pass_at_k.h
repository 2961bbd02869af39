#pragma once
// The unbiased pass@k estimator of Chen et al. 2021 (HumanEval): with n samples of which c pass,
// pass@k = 1 - C(n-c, k) / C(n, k), the chance that k samples drawn without replacement hold a passing one.
namespace slm::eval {

// Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the (huge) binomials, with the product summed as
// logarithms (log1p, expm1) so that small values keep their digits. 1 when n - c < k (every draw of k holds a pass).
// Throws slm::Error unless 0 <= c <= n and 1 <= k <= n.
double pass_at_k(int n, int c, int k);

}  // namespace slm::eval
