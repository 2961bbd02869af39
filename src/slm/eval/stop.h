#pragma once
// Cutting a completion at the problem's stop sequences (MultiPL-E's "\n}" ends the function body).
#include <string>
#include <string_view>
#include <vector>

namespace slm::eval {

// The text before the earliest occurrence of any stop sequence; the whole text when none occurs. Empty stop
// sequences are ignored.
std::string truncate_at_stop(std::string_view text, const std::vector<std::string>& stops);

}  // namespace slm::eval
