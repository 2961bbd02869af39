// AutocastScope: the thread-local autocast state is what the scope says inside it and what it was after it, however
// the scope ends. Checked against ATen's own getters (on the CPU device type, which has the same state as CUDA's).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "slm/util/autocast.h"

namespace slm {
namespace {

struct State {
  bool enabled, cache;
  at::ScalarType dtype;
  bool operator==(const State&) const = default;
};

State now() {
  return {at::autocast::is_autocast_enabled(at::kCPU), at::autocast::is_autocast_cache_enabled(),
          at::autocast::get_autocast_dtype(at::kCPU)};
}

TEST(AutocastScope, SetsItsStateAndPutsThePreviousOneBack) {
  const State before = now();
  ASSERT_FALSE(before.enabled);
  {
    const AutocastScope bf16(at::kCPU, true, at::kBFloat16);
    EXPECT_EQ(now(), (State{true, true, at::kBFloat16}));
    // BF16 autocast is really on: a matrix product of FP32 tensors comes out in BF16.
    EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kBFloat16);
    {
      const AutocastScope off(at::kCPU, false);  // a scan's kernels inside a BF16 forward
      EXPECT_EQ(now(), (State{false, true, at::kBFloat16}));
      EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kFloat);
    }
    EXPECT_EQ(now(), (State{true, true, at::kBFloat16}));
  }
  EXPECT_EQ(now(), before);
}

TEST(AutocastScope, AnExceptionLeavesTheStateAsItWas) {
  const State before = now();
  EXPECT_THROW(
      {
        const AutocastScope bf16(at::kCPU, true, at::kHalf, /*cache=*/false);
        EXPECT_EQ(now(), (State{true, false, at::kHalf}));
        throw std::runtime_error("a forward failed");
      },
      std::runtime_error);
  EXPECT_EQ(now(), before);
}

TEST(AutocastScope, OffLeavesTheDtypeAndTheCacheAlone) {
  const AutocastScope half(at::kCPU, true, at::kHalf, /*cache=*/false);
  {
    const AutocastScope off(at::kCPU, false);
    EXPECT_EQ(now(), (State{false, false, at::kHalf}));
  }
  EXPECT_EQ(now(), (State{true, false, at::kHalf}));
}

}  // namespace
}  // namespace slm
