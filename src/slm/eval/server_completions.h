#pragma once
// Completions from a running `slm serve` (or another OpenAI-compatible server) over HTTP: one POST /v1/completions
// per sample with the problem's prompt, the sampling options, a per-sample seed (sample_seed, as the in-process
// source uses) and the problem's stop sequences, up to `parallel` requests at once, so the server's continuous
// batching generates them together. Each completion records the specialist that answered (X-SLM-Specialist).
#include <string>

#include "slm/eval/completions.h"

namespace slm::eval {

struct ServerSpec {
  std::string url;             // http://host:port (https:// too)
  std::string model = "auto";  // the request's model: a specialist's name, or "auto" (the router picks)
  std::string api_key;         // sent as "Authorization: Bearer KEY" when non-empty
  int parallel = 8;            // requests in flight at once
  double timeout_s = 600;      // per request
  int retries = 5;             // a 503 (queue full) is retried this often, after its Retry-After
  SamplingSpec sampling;       // top_k must be 0: the API has no such field
};

// The stop sequences a request carries (the OpenAI API's limit, which slm serve keeps); the harness cuts the
// completion at the rest.
constexpr size_t kMaxRequestStops = 4;

// Whether --model names a server (http:// or https://) rather than a checkpoint.
bool is_server_url(const std::string& model);

class ServerCompletions : public CompletionSource {
 public:
  // Asks the server for its models (GET /v1/models) and checks that spec.model is among them. Throws slm::Error
  // naming the URL for a malformed URL, a server that does not answer or refuses, an unknown model, top_k > 0 or
  // parallel < 1.
  explicit ServerCompletions(ServerSpec spec);
  std::string describe() const override;
  int count(const Problem&, int n) const override { return n; }
  using CompletionSource::complete;
  // Throws slm::Error naming the URL, the problem and the server's message for a failed request.
  void complete(const std::vector<Problem>& problems, int n, const DeliverFn& deliver) override;

 private:
  Completion request(const Problem& problem, int j) const;

  ServerSpec spec_;
};

}  // namespace slm::eval
