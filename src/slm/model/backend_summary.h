#pragma once
// What the layers of a model run, for logs: each family's backend name once, in layer order, with the number of
// layers that run it ("moe.gathered_decode (up to 8 assignments) / moe.grouped x4; mamba3.fused_scan+fused_step x2").
#include <string>

#include "slm/model/hybrid_lm.h"

namespace slm::model {

std::string backend_summary(HybridLM& model);

}  // namespace slm::model
