#include "slm/eval/server_completions.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "slm/util/error.h"

namespace slm::eval {

namespace {

constexpr int kMaxRetryAfterS = 30;  // a longer Retry-After is waited for this long

// A client per call: one httplib::Client sends one request at a time, and the requests run on several threads.
httplib::Client client(const ServerSpec& s) {
  httplib::Client c(s.url);
  c.set_connection_timeout(10);
  c.set_read_timeout(static_cast<time_t>(s.timeout_s), 0);
  c.set_write_timeout(30);
  c.set_tcp_nodelay(true);
  if (!s.api_key.empty()) c.set_bearer_token_auth(s.api_key);
  return c;
}

// What the server said: its error message (OpenAI's {"error": {"message"}}), else the start of the body.
std::string server_message(const httplib::Response& r) {
  const auto j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  return r.body.substr(0, 300);
}

}  // namespace

bool is_server_url(const std::string& model) {
  return model.rfind("http://", 0) == 0 || model.rfind("https://", 0) == 0;
}

ServerCompletions::ServerCompletions(ServerSpec spec) : spec_(std::move(spec)) {
  while (!spec_.url.empty() && spec_.url.back() == '/') spec_.url.pop_back();
  if (!is_server_url(spec_.url)) throw Error(spec_.url + ": not a server URL (expected http://host:port)");
  if (spec_.parallel < 1) throw Error("--parallel must be at least 1 (got " + std::to_string(spec_.parallel) + ")");
  if (spec_.retries < 0) throw Error("--retries must be at least 0");
  if (spec_.sampling.max_tokens < 1) throw Error("--max-tokens must be at least 1");
  if (spec_.sampling.top_k > 0)
    throw Error("--top-k: the server's API (/v1/completions) has no top_k; leave it at 0 with a server URL");
  auto c = client(spec_);
  if (!c.is_valid()) throw Error(spec_.url + ": not a usable URL (expected http://host:port)");
  const auto res = c.Get("/v1/models");
  if (!res)
    throw Error(spec_.url + ": no answer from the server (" + httplib::to_string(res.error()) +
                "); is `slm serve` running there?");
  if (res->status != 200)
    throw Error(spec_.url + "/v1/models: HTTP " + std::to_string(res->status) + ": " + server_message(*res));
  const auto j = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array())
    throw Error(spec_.url + "/v1/models: not a model list (is this an OpenAI-compatible server?)");
  std::string names;
  for (const auto& m : j["data"]) {
    const std::string id = m.is_object() ? m.value("id", "") : "";
    if (id == spec_.model) return;
    names += (names.empty() ? "" : ", ") + id;
  }
  throw Error(spec_.url + ": the server has no model \"" + spec_.model + "\" (--server-model; it serves: " + names +
              ")");
}

std::string ServerCompletions::describe() const {
  return "server " + spec_.url + ", model " + spec_.model + ", " + std::to_string(spec_.parallel) +
         " requests at once, " + describe_sampling(spec_.sampling);
}

void ServerCompletions::complete(const std::vector<Problem>& problems, int n, const DeliverFn& deliver) {
  complete_concurrently(
      problems, n, spec_.parallel, [&](size_t pi, int j) { return request(problems[pi], j); }, deliver);
}

Completion ServerCompletions::request(const Problem& problem, int j) const {
  const auto& s = spec_.sampling;
  nlohmann::json stop = nlohmann::json::array();
  for (const auto& t : problem.stop_tokens)
    if (!t.empty() && stop.size() < kMaxRequestStops) stop.push_back(t);
  const nlohmann::json body = {{"model", spec_.model},
                               {"prompt", prompt_tail(problem.prompt, s.max_prompt_bytes)},
                               {"max_tokens", s.max_tokens},
                               {"temperature", s.temperature},
                               {"top_p", s.top_p},
                               // The seed's bits as a signed integer, which every JSON reader takes.
                               {"seed", static_cast<int64_t>(sample_seed(s.seed, problem, j))},
                               {"stop", stop}};
  const std::string where = spec_.url + "/v1/completions (" + problem.name + ", sample " + std::to_string(j) + ")";
  auto c = client(spec_);
  for (int attempt = 0;; ++attempt) {
    const auto res = c.Post("/v1/completions", body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                            "application/json");
    if (!res) throw Error(where + ": no answer from the server (" + httplib::to_string(res.error()) + ")");
    if (res->status == 503 && attempt < spec_.retries) {
      const int wait = std::clamp(std::atoi(res->get_header_value("Retry-After").c_str()), 1, kMaxRetryAfterS);
      std::this_thread::sleep_for(std::chrono::seconds(wait));
      continue;
    }
    if (res->status != 200)
      throw Error(where + ": HTTP " + std::to_string(res->status) + ": " + server_message(*res) +
                  (res->status == 503 ? " (still busy after " + std::to_string(spec_.retries) + " retries)" : ""));
    const auto j = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() || j["choices"].empty() ||
        !j["choices"][0].is_object() || !j["choices"][0].contains("text") || !j["choices"][0]["text"].is_string())
      throw Error(where + ": the answer has no choices[0].text: " + res->body.substr(0, 300));
    Completion out{j["choices"][0]["text"].get<std::string>(), res->get_header_value("X-SLM-Specialist")};
    if (out.specialist.empty() && j.contains("specialist") && j["specialist"].is_string())
      out.specialist = j["specialist"].get<std::string>();
    return out;
  }
}

}  // namespace slm::eval
