// The pass@k estimator against binomials computed by hand and, for large n, through lgamma.
#include <gtest/gtest.h>

#include <cmath>

#include "slm/eval/pass_at_k.h"
#include "slm/util/error.h"

using slm::eval::pass_at_k;

TEST(PassAtK, HandComputedValues) {
  EXPECT_NEAR(pass_at_k(5, 2, 1), 0.4, 1e-15);                        // c/n
  EXPECT_NEAR(pass_at_k(5, 2, 2), 1.0 - 3.0 / 10.0, 1e-15);           // 1 - C(3,2)/C(5,2)
  EXPECT_NEAR(pass_at_k(10, 3, 5), 1.0 - 21.0 / 252.0, 1e-15);        // 1 - C(7,5)/C(10,5)
  EXPECT_NEAR(pass_at_k(200, 1, 10), 10.0 / 200.0, 1e-15);            // 1 - C(199,10)/C(200,10) = k/n
  EXPECT_NEAR(pass_at_k(20, 4, 10), 1.0 - 8008.0 / 184756.0, 1e-15);  // 1 - C(16,10)/C(20,10)
}

TEST(PassAtK, EdgeCases) {
  EXPECT_EQ(pass_at_k(5, 0, 1), 0.0);
  EXPECT_EQ(pass_at_k(5, 0, 5), 0.0);
  EXPECT_EQ(pass_at_k(5, 4, 2), 1.0);  // n - c = 1 < k: every pair holds a pass
  EXPECT_EQ(pass_at_k(5, 5, 1), 1.0);
  EXPECT_EQ(pass_at_k(1, 1, 1), 1.0);
  EXPECT_EQ(pass_at_k(3, 1, 3), 1.0);  // k = n draws every sample
  EXPECT_THROW(pass_at_k(5, 6, 1), slm::Error);
  EXPECT_THROW(pass_at_k(5, 1, 6), slm::Error);
  EXPECT_THROW(pass_at_k(5, 1, 0), slm::Error);
  EXPECT_THROW(pass_at_k(0, 0, 1), slm::Error);
}

TEST(PassAtK, LargeNStaysAccurate) {
  // C(n-c,k)/C(n,k) through log-gamma: binomials of this size overflow any integer type.
  auto reference = [](int n, int c, int k) {
    return 1.0 - std::exp(std::lgamma(n - c + 1.0) - std::lgamma(n - c - k + 1.0) - std::lgamma(n + 1.0) +
                          std::lgamma(n - k + 1.0));
  };
  EXPECT_NEAR(pass_at_k(1000, 500, 100), reference(1000, 500, 100), 1e-12);
  EXPECT_NEAR(pass_at_k(1000, 3, 10), reference(1000, 3, 10), 1e-12);
  EXPECT_NEAR(pass_at_k(100000, 1, 1), 1e-5, 1e-17);
}
