#pragma once
#include <string>

namespace slm {
std::string human_count(long long n);     // 4734567890 -> "4.73B", 96100000 -> "96.1M"
std::string human_bytes(long long bytes);  // binary units: "8.81 GiB"
}  // namespace slm
