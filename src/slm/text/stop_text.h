#pragma once
// Stop sequences on streamed text: text arrives in pieces, and a stop string may straddle two pieces. push()
// returns the text that can be shown now: everything before a stop string once one appears, otherwise everything
// except a tail that could still grow into a stop string (held until the next piece or flush()).
#include <string>
#include <vector>

namespace slm::text {

class StopText {
 public:
  // Empty strings are ignored.
  explicit StopText(std::vector<std::string> stops);
  std::string push(const std::string& piece);
  // The held tail at the end of the stream ("" after a stop).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace slm::text
