#include "slm/util/format.h"

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdio>

namespace slm {

std::string human_count(long long n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  double v = static_cast<double>(n);
  int u = 0;
  while (std::fabs(v) >= 1000.0 && u < 4) v /= 1000.0, ++u;
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%lld", n);
  else std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f%s" : v >= 10 ? "%.1f%s" : "%.2f%s", v, units[u]);
  return buf;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  double v = bytes;
  int u = 0;
  while (v >= 1024.0 && u < 8) v /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string shape_text(c10::ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string shape_text(const at::Tensor& t) { return t.defined() ? shape_text(t.sizes()) : "undefined"; }

}  // namespace slm
