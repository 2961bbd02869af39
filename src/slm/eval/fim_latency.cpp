// measure_fim_latency (fim_eval.h): the HTTP client part, apart from the rest so that only it includes httplib.h.
#include <httplib.h>

#include <chrono>
#include <set>

#include "slm/eval/fim_eval.h"
#include "slm/util/error.h"

namespace slm::eval {

FimLatency measure_fim_latency(const std::vector<FimCase>& cases, const FimLatencyOptions& o,
                               const std::function<void(size_t, size_t)>& progress) {
  FimLatency r;
  r.url = o.url;
  while (!r.url.empty() && r.url.back() == '/') r.url.pop_back();
  httplib::Client client(r.url);
  if (!client.is_valid()) throw Error("--server " + o.url + ": not a usable URL (expected http://host:port)");
  client.set_connection_timeout(10);
  client.set_read_timeout(static_cast<time_t>(o.timeout_s), 0);
  client.set_tcp_nodelay(true);
  if (!o.api_key.empty()) client.set_bearer_token_auth(o.api_key);
  // The first line case of each file, up to max_files of them.
  std::vector<const FimCase*> chosen;
  std::set<size_t> files;
  for (const auto& c : cases)
    if (c.kind == FimKind::kLine && files.size() < o.max_files && files.insert(c.file).second) chosen.push_back(&c);
  const size_t total = chosen.size() * (1 + o.warm);
  size_t done = 0;
  for (const auto* c : chosen)
    for (size_t step = 0; step <= o.warm; ++step) {
      const std::string body = llama_vim_request(*c, step * o.step_chars, o).dump();
      const auto start = std::chrono::steady_clock::now();
      const auto res = client.Post("/infill", body, "application/json");
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (!res) throw Error(r.url + "/infill: no answer (" + httplib::to_string(res.error()) + ")");
      const auto j = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
      if (res->status != 200 || !j.is_object())
        throw Error(r.url + "/infill: HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 300));
      // response_fields flattens the nested names, as llama.cpp does.
      const double cached = j.value("tokens_cached", 0.0), prompt_n = j.value("timings/prompt_n", 0.0);
      (step == 0 ? r.cold_ms : r.warm_ms).push_back(ms);
      (step == 0 ? r.cold_cached : r.warm_cached) += cached;
      (step == 0 ? r.cold_prompt_n : r.warm_prompt_n) += prompt_n;
      if (progress) progress(++done, total);
    }
  return r;
}

}  // namespace slm::eval
