#pragma once
#include <c10/util/ArrayRef.h>

#include <string>

namespace at {
class Tensor;
}

namespace slm {
std::string human_count(long long n);     // 4734567890 -> "4.73B", 96100000 -> "96.1M"
std::string human_bytes(double bytes);  // binary units: "8.81 GiB" (double: estimates may pass 2^63)
std::string shape_text(c10::ArrayRef<int64_t> shape);  // "[2, 3]", for error messages
std::string shape_text(const at::Tensor& t);           // its shape, or "undefined"
}  // namespace slm
