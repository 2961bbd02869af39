#include "slm/server/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace slm::server {

namespace {

std::string num(double v) {
  std::ostringstream ss;
  ss.precision(10);
  ss << v;
  return ss.str();
}

// A label value in Prometheus's text format: backslash, double quote and line feed escaped. Values can come from
// clients (the path of a request refused for its API key), and a raw quote or newline would end the sample early.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string join_labels(const std::string& a, const std::string& b) {
  return a.empty() ? b : b.empty() ? a : a + "," + b;
}

const std::vector<double>& latency_bounds() {
  static const std::vector<double> b = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return b;
}

}  // namespace

ProcessMemory process_memory() {
  ProcessMemory m;
  // statm: total and resident pages.
  if (std::ifstream statm("/proc/self/statm"); statm) {
    int64_t total = 0, resident = 0;
    if (statm >> total >> resident) m.resident_bytes = resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }
#ifdef SLM_WITH_CUDA
  // Only devices this process already uses: asking about an untouched device would create a context on it.
  if (c10::cuda::CUDACachingAllocator::get() && c10::cuda::CUDACachingAllocator::get()->initialized()) {
    const auto n = c10::cuda::device_count();
    for (c10::DeviceIndex d = 0; d < n; ++d) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d);
      const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      m.cuda_allocated_bytes += stats.allocated_bytes[all].current;
      m.cuda_reserved_bytes += stats.reserved_bytes[all].current;
    }
  }
#endif
  return m;
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& labels) const {
  std::string out;
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    const std::string le = i < bounds_.size() ? num(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + join_labels(labels, "le=\"" + le + "\"") + "} " + std::to_string(cum) + "\n";
  }
  const std::string l = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + l + " " + num(sum_) + "\n";
  out += name + "_count" + l + " " + std::to_string(count_) + "\n";
  return out;
}

Metrics::Metrics() : latency_(latency_bounds()), first_token_(latency_bounds()) {}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::generation(const std::string& specialist, int64_t prompt_tokens, int64_t completion_tokens,
                         double latency_s, double first_token_s, const std::string& finish_reason) {
  std::lock_guard lock(mu_);
  auto& s = specialists_[specialist];
  ++s.requests;
  s.prompt_tokens += prompt_tokens;
  s.completion_tokens += completion_tokens;
  ++s.finish[finish_reason];
  latency_.observe(latency_s);
  if (first_token_s >= 0) first_token_.observe(first_token_s);
}

void Metrics::cancelled(const std::string& specialist) {
  std::lock_guard lock(mu_);
  ++specialists_[specialist].cancelled;
}

std::string Metrics::render(const std::vector<EngineGauges>& engines,
                            const std::vector<workspace::WorkspaceStatus>& workspaces) const {
  std::lock_guard lock(mu_);
  std::string o;
  o += "# HELP slm_http_requests_total HTTP requests by endpoint and status.\n# TYPE slm_http_requests_total counter\n";
  for (const auto& [k, n] : requests_)
    o += "slm_http_requests_total{endpoint=\"" + label(k.first) + "\",status=\"" + std::to_string(k.second) + "\"} " +
         std::to_string(n) + "\n";
  auto per = [&](const char* name, const char* help, const char* type, auto get) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const auto& [sp, s] : specialists_)
      o += std::string(name) + "{specialist=\"" + label(sp) + "\"} " + std::to_string(get(s)) + "\n";
  };
  per("slm_generations_total", "Finished generations by specialist.", "counter",
      [](const PerSpecialist& s) { return s.requests; });
  per("slm_prompt_tokens_total", "Prompt tokens by specialist.", "counter",
      [](const PerSpecialist& s) { return s.prompt_tokens; });
  per("slm_completion_tokens_total", "Generated tokens by specialist.", "counter",
      [](const PerSpecialist& s) { return s.completion_tokens; });
  per("slm_cancelled_total", "Generations cancelled because the client went away.", "counter",
      [](const PerSpecialist& s) { return s.cancelled; });
  o += "# HELP slm_finish_total Finished generations by specialist and finish reason.\n# TYPE slm_finish_total "
       "counter\n";
  for (const auto& [sp, s] : specialists_)
    for (const auto& [reason, n] : s.finish)
      o += "slm_finish_total{specialist=\"" + label(sp) + "\",reason=\"" + label(reason) + "\"} " +
           std::to_string(n) + "\n";
  o += "# HELP slm_request_latency_seconds Time from a generation request's arrival to its last token.\n"
       "# TYPE slm_request_latency_seconds histogram\n" +
       latency_.render("slm_request_latency_seconds", "");
  o += "# HELP slm_time_to_first_token_seconds Time from a generation request's arrival to its first token.\n"
       "# TYPE slm_time_to_first_token_seconds histogram\n" +
       first_token_.render("slm_time_to_first_token_seconds", "");
  o += "# HELP slm_queue_depth Requests waiting in a specialist's queue.\n# TYPE slm_queue_depth gauge\n";
  for (const auto& e : engines)
    o += "slm_queue_depth{specialist=\"" + label(e.specialist) + "\"} " + std::to_string(e.queued) + "\n";
  o += "# HELP slm_running Requests being generated by a specialist.\n# TYPE slm_running gauge\n";
  for (const auto& e : engines)
    o += "slm_running{specialist=\"" + label(e.specialist) + "\"} " + std::to_string(e.running) + "\n";
  o += "# HELP slm_prompt_tokens_reused_total Prompt tokens whose state came from the prefix cache instead of a "
       "prefill.\n# TYPE slm_prompt_tokens_reused_total counter\n";
  for (const auto& e : engines)
    o += "slm_prompt_tokens_reused_total{specialist=\"" + label(e.specialist) + "\"} " +
         std::to_string(e.reused_prompt_tokens) + "\n";
  o += "# HELP slm_prompts_batched_total Prompts whose first chunk ran in one prefill forward with other prompts.\n"
       "# TYPE slm_prompts_batched_total counter\n";
  for (const auto& e : engines)
    o += "slm_prompts_batched_total{specialist=\"" + label(e.specialist) + "\"} " +
         std::to_string(e.batched_prompts) + "\n";
  o += "# HELP slm_specialist_weight_bytes Bytes a specialist's weights occupy (NVFP4 matrices packed).\n"
       "# TYPE slm_specialist_weight_bytes gauge\n";
  for (const auto& e : engines)
    o += "slm_specialist_weight_bytes{specialist=\"" + label(e.specialist) + "\"} " +
         std::to_string(e.weight_bytes) + "\n";
  auto per_workspace = [&](const char* name, const char* help, const char* type, auto get) {
    if (workspaces.empty()) return;
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const auto& w : workspaces) o += std::string(name) + "{workspace=\"" + label(w.root) + "\"} " + get(w) + "\n";
  };
  using WS = workspace::WorkspaceStatus;
  auto n = [](uint64_t v) { return std::to_string(v); };
  per_workspace("slm_workspace_ready", "1 once the workspace's first scan is indexed.", "gauge",
                [](const WS& w) { return std::string(w.ready ? "1" : "0"); });
  per_workspace("slm_workspace_files", "C++ files of the workspace in its index.", "gauge",
                [&](const WS& w) { return n(w.files); });
  per_workspace("slm_workspace_bytes", "Bytes of the indexed files.", "gauge", [&](const WS& w) { return n(w.bytes); });
  per_workspace("slm_workspace_functions", "Function definitions in the workspace's call graph.", "gauge",
                [&](const WS& w) { return n(w.functions); });
  per_workspace("slm_workspace_cmake_files", "CMake files of the workspace in its CMake index.", "gauge",
                [&](const WS& w) { return n(w.cmake_files); });
  per_workspace("slm_workspace_cmake_definitions", "Functions, macros and targets the CMake files define.", "gauge",
                [&](const WS& w) { return n(w.cmake_definitions); });
  per_workspace("slm_workspace_skipped_files",
                "C++ and CMake files left out (too large, binary, unparsable, over a budget).", "gauge",
                [&](const WS& w) { return n(w.skipped); });
  per_workspace("slm_workspace_pending_files", "C++ files waiting for the next scan (over a scan's time budget).",
                "gauge", [&](const WS& w) { return n(w.pending); });
  per_workspace("slm_workspace_scans_total", "Scans of the workspace's tree.", "counter",
                [&](const WS& w) { return n(w.refreshes); });
  per_workspace("slm_workspace_index_seconds_total", "Time spent parsing and linking the workspace.", "counter",
                [](const WS& w) { return std::to_string(w.index_seconds); });
  const ProcessMemory pm = process_memory();
  o += "# HELP slm_process_resident_bytes Resident memory of the server process.\n"
       "# TYPE slm_process_resident_bytes gauge\nslm_process_resident_bytes " +
       std::to_string(pm.resident_bytes) + "\n";
  o += "# HELP slm_cuda_allocated_bytes GPU memory held by tensors (CUDA caching allocator, all devices).\n"
       "# TYPE slm_cuda_allocated_bytes gauge\nslm_cuda_allocated_bytes " +
       std::to_string(pm.cuda_allocated_bytes) + "\n";
  o += "# HELP slm_cuda_reserved_bytes GPU memory the CUDA caching allocator reserved from the driver.\n"
       "# TYPE slm_cuda_reserved_bytes gauge\nslm_cuda_reserved_bytes " +
       std::to_string(pm.cuda_reserved_bytes) + "\n";
  return o;
}

}  // namespace slm::server
