#include "slm/engine/engine.h"

namespace slm::engine {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kLength: return "length";
    case Finish::kStop: return "stop";
    case Finish::kCancelled: return "cancelled";
    case Finish::kError: return "error";
  }
  return "error";
}

}  // namespace slm::engine
