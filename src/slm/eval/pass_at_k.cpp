#include "slm/eval/pass_at_k.h"

#include <cmath>
#include <string>

#include "slm/util/error.h"

namespace slm::eval {

double pass_at_k(int n, int c, int k) {
  if (n < 1 || c < 0 || c > n || k < 1 || k > n)
    throw Error("pass@k needs 0 <= c <= n and 1 <= k <= n (n=" + std::to_string(n) + ", c=" + std::to_string(c) +
                ", k=" + std::to_string(k) + ")");
  if (n - c < k) return 1.0;
  // C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i), summed in log space: 1 - prod would cancel when pass@k is
  // small (n = 100000, c = 1 keeps 5 digits that way, 16 this way).
  double log_fail = 0;
  for (int i = n - c + 1; i <= n; ++i) log_fail += std::log1p(-static_cast<double>(k) / i);
  return -std::expm1(log_fail);
}

}  // namespace slm::eval
