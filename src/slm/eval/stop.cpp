#include "slm/eval/stop.h"

namespace slm::eval {

std::string truncate_at_stop(std::string_view text, const std::vector<std::string>& stops) {
  size_t cut = text.size();
  for (const auto& s : stops)
    if (!s.empty()) cut = std::min(cut, text.find(s));  // npos when absent: larger than any position
  return std::string(text.substr(0, cut));
}

}  // namespace slm::eval
