#pragma once
// `slm serve`: the OpenAI-compatible HTTP front of the specialists (docs/serving.md), on cpp-httplib.
//   POST /v1/chat/completions, POST /v1/completions   (stream: true -> server-sent events)
//   GET  /v1/models, /health, /metrics
//   POST /infill, /completion, /tokenize, /detokenize, GET /props   (llama.cpp's, for editors: llama_api.h)
//   GET /api/tags, /api/ps, /api/version, POST /api/show, /api/generate, /api/chat   (Ollama's: ollama_api.h)
// Each request runs on an HTTP worker thread that waits on its Session; the generation itself runs on the
// specialist's engine thread. A client that disconnects cancels its generation; every bad request gets an error
// object (OpenAI's shape; {"error": "..."} under /api/, the Ollama routes, whatever refused it).
#include <functional>
#include <memory>
#include <string>

#include "slm/server/specialists.h"
#include "slm/server/workspace_context.h"

namespace slm::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8000;                 // 0: any free port (start() returns it)
  int threads = 32;                // HTTP worker threads: each open connection holds one while it is served
  size_t max_body_bytes = 4u << 20;
  int64_t default_max_tokens = 256;  // when a request gives none (capped by the context left)
  double request_timeout_s = 600;    // a generation still running after this long is cancelled
  // A client that sends nothing for this long while its request (headers or body) is read gets a 400 and loses its
  // HTTP worker thread, so a stalled client cannot hold one forever.
  double read_timeout_s = 30;
  std::string api_key;               // non-empty: required as "Authorization: Bearer KEY" (not on /health and the page)
  std::function<void(const std::string&)> log;  // one line per request (optional)
  // The repositories whose context graph /infill requests get (slm serve --workspace; workspace_context.h), indexed
  // by their own threads; owned by the caller, outliving the server. Their progress is in /metrics.
  Workspaces workspaces;
};

class Server {
 public:
  // The specialists must outlive the server.
  Server(Specialists& specialists, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  // Binds and serves on background threads; returns the port. Throws slm::Error when the address cannot be bound.
  int start();
  // Stops accepting, cancels running generations and joins the threads. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slm::server
