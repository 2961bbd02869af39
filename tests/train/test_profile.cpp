// The step profiler: operator counts against the calls the test makes itself, the kernel-name shortening against
// hand-written names, and `--profile-steps` in the trainer writing its summary and trace.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "slm/train/profile.h"
#include "slm/util/error.h"

using namespace slm;

TEST(Profiler, CountsTheOperatorsItSaw) {
  auto a = torch::randn({64, 64}), b = torch::randn({64, 64});
  train::Profiler p;
  p.start(false);
  EXPECT_TRUE(p.running());
  for (int i = 0; i < 7; ++i) a = torch::mm(a, b) * 0.1;
  const auto s = p.stop(7);
  EXPECT_FALSE(p.running());
  auto mm = std::find_if(s.top.begin(), s.top.end(), [](const train::KernelTime& k) { return k.name == "aten::mm"; });
  ASSERT_NE(mm, s.top.end()) << s.text();
  EXPECT_EQ(mm->calls, 7);
  EXPECT_FALSE(s.gpu);
  EXPECT_GT(s.wall_ms, 0);
  EXPECT_GE(s.launches, 14) << "7 mm and 7 mul at least";
  EXPECT_NE(s.text().find("1.0  aten::mm"), std::string::npos) << "one call per step: " << s.text();
  EXPECT_THROW(p.stop(1), Error);
}

TEST(Profiler, ShortKernelNames) {
  EXPECT_EQ(train::short_kernel_name("void at::native::(anonymous namespace)::cat_kernel<float, 4>(float*, int)"),
            "at::native::(anonymous namespace)::cat_kernel<float, 4>");
  EXPECT_EQ(train::short_kernel_name("void f<(cutlass::Op)1>(Params)"), "f<(cutlass::Op)1>");
  EXPECT_EQ(train::short_kernel_name("nvjet_tst_128x64"), "nvjet_tst_128x64");
  // "kkkkkkkkkkkkkkkkk...": written out, as std::string(17, 'k') + "..." trips GCC 12's -Warray-bounds false positive.
  EXPECT_EQ(train::short_kernel_name(std::string(100, 'k'), 20), "kkkkkkkkkkkkkkkkk...");
}
