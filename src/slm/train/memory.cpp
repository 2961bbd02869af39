#include "slm/train/memory.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <new>
#include <sstream>

#include "slm/recipe/accounting.h"
#include "slm/train/flops.h"
#include "slm/train/optimizer.h"
#include "slm/util/format.h"

namespace slm::train {

TrainingMemory training_memory(const Recipe& recipe, int64_t batch, int64_t seq_len, bool bf16) {
  const Accounting acc = account(recipe, make_plan(recipe));
  const double k = recipe.moe ? recipe.moe->experts_per_token : 0;
  TrainingMemory m;
  double saved_per_token = 0;  // activation elements kept for the backward, per token
  for (const auto& p : acc.params) {
    const auto n = static_cast<double>(p.numel());
    m.parameters += 4 * n;
    // The optimizer's state per tensor (Optimizer::state_tensors): Muon one momentum, AdamW two moments and an
    // int64 step.
    m.optimizer += group_algorithm(param_group(p)) == Algorithm::Muon ? 4 * n : 8 * n + 8;
    if (!is_matmul(p.kind) || p.shape.size() < 2) continue;
    const auto in = static_cast<double>(p.shape.back()), out = static_cast<double>(p.shape[p.shape.size() - 2]);
    saved_per_token += (p.routed ? k : 1) * (in + out);
    if (p.kind == ParamKind::Head) saved_per_token += out;  // the loss keeps the softmax of the logits as well
  }
  m.gradients = m.parameters;
  m.activations = saved_per_token * static_cast<double>(batch) * static_cast<double>(seq_len) * (bf16 ? 2 : 4);
  return m;
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr || dynamic_cast<const std::bad_alloc*>(&e) != nullptr)
    return true;
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error != nullptr &&
         std::string(c10_error->what_without_backtrace()).find("DefaultCPUAllocator: can't allocate memory") !=
             std::string::npos;
}

std::string out_of_memory_message(const TrainingMemory& m, const OutOfMemoryContext& c) {
  std::ostringstream s;
  auto row = [&](const char* name, const char* approx, double bytes, const std::string& what) {
    std::string size = approx;
    size += human_bytes(bytes);
    char line[200];
    std::snprintf(line, sizeof line, "  %-16s %12s  %s\n", name, size.c_str(), what.c_str());
    s << line;
  };
  s << "out of memory " << c.where << " training " << c.recipe_file << " (micro-batch " << c.batch << " x " << c.seq_len
    << " tokens, --accum " << c.accum << "):\n";
  row("parameters", "", m.parameters, "FP32 master weights");
  row("gradients", "", m.gradients, "FP32");
  row("optimizer state", "", m.optimizer, "Muon momentum, AdamW moments");
  row("activations", "~", m.activations, "estimated for one micro-batch (at least)");
  row("total", "~", m.total(), c.capacity > 0 ? "of the device's " + human_bytes(c.capacity) : "");
  if (!c.allocator.empty()) s << "the allocator: " << c.allocator << "\n";

  // 10% of the device is left to the allocator's fragmentation and to what the estimate leaves out.
  const double fixed = m.parameters + m.gradients + m.optimizer, usable = 0.9 * c.capacity;
  if (c.capacity > 0 && fixed >= usable) {
    s << "The parameters, gradients and optimizer state alone need " << human_bytes(fixed) << " of the device's "
      << human_bytes(c.capacity) << ": train a smaller recipe (fewer layers, a narrower d_model, fewer experts).";
    return s.str();
  }
  const double per_sequence = m.activations / static_cast<double>(c.batch);
  // Without a known capacity, or when the estimate says the batch fits (it is low), halve the batch.
  double fit = c.capacity > 0 ? std::floor((usable - fixed) / per_sequence) : 0;
  if (c.capacity <= 0 || fit >= static_cast<double>(c.batch)) fit = std::floor(static_cast<double>(c.batch) / 2);
  if (fit < 1) {
    s << "Even one sequence of " << c.seq_len << " tokens does not fit: "
      << (c.recompute ? "" : "turn on --recompute (activation checkpointing: blocks keep only their inputs), ")
      << "lower --seq-len (activations grow with it) or train a smaller recipe.";
    return s.str();
  }
  const auto batch = static_cast<int64_t>(fit);
  const int64_t accum = (c.batch * c.accum + batch - 1) / batch;
  s << "To fit: lower --batch (activations grow with it), e.g. --batch " << batch * c.workers << " --accum " << accum
    << " for about the same tokens per step; " << (c.recompute ? "" : "or turn on --recompute; ")
    << "or lower --seq-len; or train a smaller recipe.";
  return s.str();
}

}  // namespace slm::train
