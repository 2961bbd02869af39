#pragma once
// The one error type library code throws for bad input (recipes, manifests, checkpoints, requests).
// Its message names the file / field / tensor and the rule that was broken; the CLI maps it to exit code 2.
#include <stdexcept>
#include <string>

namespace slm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace slm
