#pragma once
// Server counters in the Prometheus text format (GET /metrics): requests by endpoint and status, tokens and
// requests per specialist, latency and time-to-first-token histograms, and the queue depth and running requests
// of every specialist's engine (read when scraped). Thread-safe.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "slm/workspace/workspace.h"

namespace slm::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds, increasing; +Inf is implicit
  void observe(double v);
  // Lines of a Prometheus histogram `name` with the given label set ("" or `a="b"`).
  std::string render(const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct EngineGauges {
  std::string specialist;
  int64_t queued = 0, running = 0;
  int64_t weight_bytes = 0;          // Specialist::weight_bytes
  int64_t reused_prompt_tokens = 0;  // engine::Stats::reused_prompt_tokens
  int64_t batched_prompts = 0;       // engine::Stats::batched_prompts
};

// Memory of this process: resident set (/proc/self/statm; 0 where unreadable) and, in CUDA builds with a GPU in use,
// what the CUDA caching allocator holds (allocated) and has reserved from the driver, summed over devices.
struct ProcessMemory {
  int64_t resident_bytes = 0, cuda_allocated_bytes = 0, cuda_reserved_bytes = 0;
};
ProcessMemory process_memory();

class Metrics {
 public:
  Metrics();
  void request(const std::string& endpoint, int status);
  // A finished generation on a specialist.
  void generation(const std::string& specialist, int64_t prompt_tokens, int64_t completion_tokens, double latency_s,
                  double first_token_s, const std::string& finish_reason);
  void cancelled(const std::string& specialist);
  // workspaces: the indexing progress of slm serve --workspace (families left out when there are none).
  std::string render(const std::vector<EngineGauges>& engines,
                     const std::vector<workspace::WorkspaceStatus>& workspaces = {}) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status)
  struct PerSpecialist {
    uint64_t requests = 0, prompt_tokens = 0, completion_tokens = 0, cancelled = 0;
    std::map<std::string, uint64_t> finish;
  };
  std::map<std::string, PerSpecialist> specialists_;
  Histogram latency_, first_token_;
};

}  // namespace slm::server
