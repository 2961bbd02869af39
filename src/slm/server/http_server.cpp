#include "slm/server/http_server.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "slm/server/llama_api.h"
#include "slm/server/metrics.h"
#include "slm/server/ollama_api.h"
#include "slm/server/openai.h"
#include "slm/server/openai_format.h"
#include "slm/server/prepare.h"
#include "slm/server/response_format.h"
#include "slm/server/session.h"
#include "slm/server/web_page.h"
#include "slm/util/error.h"

namespace slm::server {

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

// The socket of a request's connection. cpp-httplib 0.11 neither tells a handler whether its client is still there nor
// gives it the socket, so the server finds it once per generation: the open socket whose local port and peer
// address are the request's (a TCP connection is identified by them). -1 when none matches.
int connection_socket(const httplib::Request& req) {
  DIR* dir = ::opendir("/proc/self/fd");  // POSIX, not std::filesystem (README, "Known pitfall")
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = ::readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == ::dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0)
      continue;
    char host[NI_MAXHOST], port[NI_MAXSERV], lport[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&peer), pl, host, sizeof(host), port, sizeof(port),
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0 ||
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), ll, nullptr, 0, lport, sizeof(lport), NI_NUMERICSERV) != 0)
      continue;
    if (req.remote_addr == host && req.remote_port == std::atoi(port) && req.local_port == std::atoi(lport)) {
      found = fd;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

// True when the peer closed its end (an orderly close reads as 0 bytes) or the connection broke. Bytes already
// waiting (a pipelined request) mean the client is still there.
bool client_gone(int sock) {
  if (sock < 0) return false;
  pollfd p{sock, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  char c;
  const ssize_t n = ::recv(sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

std::string dump(const Json& j) {
  return dump_json(j);
}

void send_error(httplib::Response& res, const ApiError& e, const ErrorBody& body = openai_error_body) {
  res.status = e.status();
  res.set_content(dump(body(e)), "application/json");
}

// The error shape of a path's clients before its handler runs (the API key, an unknown path or method): Ollama's
// {"error": "..."} under /api/, which its clients print as they get it, OpenAI's object elsewhere.
const ErrorBody& error_body_of(const std::string& path) {
  static const ErrorBody ollama = ollama_error_body, openai = openai_error_body;
  return path.rfind("/api/", 0) == 0 ? ollama : openai;
}

// Methods whose body cpp-httplib reads before it routes the request.
bool has_body(const httplib::Request& req) {
  return req.method == "POST" || req.method == "PUT" || req.method == "PATCH" || req.method == "DELETE";
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Compares every byte of the longer string whatever the contents, so the time says nothing about the key.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < n; ++i)
    diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

struct Server::Impl {
  Impl(Specialists& s, ServerOptions o) : specialists(s), options(std::move(o)) {}

  Specialists& specialists;
  ServerOptions options;
  httplib::Server http;
  Metrics metrics;
  std::thread listener;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> counter{0};
  uint64_t id_salt = std::random_device{}();
  std::once_flag stopped;

  std::string new_id(const char* prefix) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%s-%016llx", prefix,
                  static_cast<unsigned long long>(id_salt ^ (++counter * 0x9e3779b97f4a7c15ULL)));
    return buf;
  }

  void log(const httplib::Request& req, int status, const std::string& extra = "") {
    if (options.log) options.log(req.method + " " + req.path + " " + std::to_string(status) + extra);
  }

  std::vector<EngineGauges> gauges() const {
    std::vector<EngineGauges> out;
    for (const auto& s : specialists.all()) {
      const auto st = s->engine->stats();
      out.push_back({s->name, st.queued, st.running, s->weight_bytes, st.reused_prompt_tokens, st.batched_prompts});
    }
    return out;
  }

  bool routable() const { return specialists.has_router() || specialists.all().size() == 1; }

  void models(httplib::Response& res) {
    Json data = Json::array();
    for (const auto& s : specialists.all())
      data.push_back({{"id", s->name},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "slm"},
                      {"description", s->description},
                      {"routes", s->routes},
                      {"context_length", s->engine->context_length()}});
    if (routable())
      data.push_back({{"id", "auto"},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "slm"},
                      {"description", "the router picks the specialist for each request"}});
    if (specialists.has_router() && specialists.all().size() >= 2)
      data.push_back({{"id", "auto-2"},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "slm"},
                      {"description",
                       "the router's top two specialists decode together, each token drawn from the mixture of their "
                       "next-token distributions weighted by the router (where they share a tokenizer)"}});
    res.set_content(dump({{"object", "list"}, {"data", data}}), "application/json");
  }

  void health(httplib::Response& res) {
    Json sp = Json::array();
    for (const auto& g : gauges()) sp.push_back({{"name", g.specialist}, {"queued", g.queued}, {"running", g.running}});
    res.set_content(dump({{"status", "ok"}, {"specialists", sp}, {"router", specialists.has_router()}}),
                    "application/json");
  }

  // The generation path of every generation endpoint: the plan's request goes to its engine, and the answer is
  // written by the plan's format, whole or streamed; a client that goes away, the request timeout or the server's
  // stop cancels it. endpoint: the metrics' label.
  void generate(const httplib::Request& req, httplib::Response& res, const std::string& endpoint, GenerationPlan plan) {
    const auto t0 = Clock::now();
    auto& prepared = plan.prepared;
    const std::string who = prepared.answered_by;  // a specialist, or "a+b" for a mixture
    const std::string note = plan.log_note;
    std::shared_ptr<Session> session;
    try {
      session = std::make_shared<Session>(*prepared.engine, *prepared.specialist->tokenizer,
                                          std::move(prepared.request), plan.stop, std::move(plan.limit));
    } catch (const engine::QueueFull& e) {
      res.set_header("Retry-After", "1");
      throw ApiError(503, std::string("specialist \"") + who + "\" is busy: " + e.what() + "; retry later", "",
                     "queue_full");
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
    std::shared_ptr<ResponseFormat> format = std::move(plan.format);
    auto c = std::make_shared<GenerationReport>();
    c->id = new_id(format->id_prefix().c_str());
    c->model = who;
    c->created = static_cast<int64_t>(std::time(nullptr));
    c->routing = prepared.routing;
    res.set_header("X-SLM-Specialist", who);
    const auto deadline =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.request_timeout_s));
    // Records the finished (or abandoned) generation; delivered is false when the client went away. An abandoned
    // generation is cancelled and waited for (one token at most), so its counts are the real ones.
    auto finish = [this, c, session, who, t0, endpoint](bool delivered) {
      if (!delivered) {
        session->cancel();
        for (bool done = false; !done;) session->next(std::chrono::milliseconds(50), done);
      }
      const auto r = session->result();
      c->finish_reason = r.finish_reason == "cancelled" ? "length" : r.finish_reason;  // a timeout
      c->stop_word = r.stop_word;
      c->text_limit = r.text_limit;
      c->prompt_tokens = r.prompt_tokens;
      c->completion_tokens = r.completion_tokens;
      c->cached_tokens = r.cached_tokens;
      const double total = std::chrono::duration<double>(Clock::now() - t0).count();
      c->prompt_s = r.first_token_s >= 0 ? r.first_token_s : total;
      c->predicted_s = total - c->prompt_s;
      if (!delivered) metrics.cancelled(who);
      metrics.generation(who, r.prompt_tokens, r.completion_tokens, total, r.first_token_s,
                         delivered ? c->finish_reason : "client_gone");
      metrics.request(endpoint, delivered ? 200 : 499);
    };
    const int sock = connection_socket(req);
    auto interrupted = [this, deadline, session, sock] {
      if (stopping || Clock::now() > deadline) session->cancel();
      return client_gone(sock);
    };

    if (!plan.stream) {
      bool done = false;
      while (!done) {
        c->text += session->next(std::chrono::milliseconds(50), done);
        if (!done && interrupted()) {
          // Cancelled and logged before finish() waits for the engine to let go: the log line tells that the
          // generation can produce nothing more.
          session->cancel();
          log(req, 499, " client went away");
          finish(false);
          res.status = 499;  // nobody is listening: the response is dropped with the connection
          res.set_content("client closed the request", "text/plain");
          return;
        }
      }
      const auto r = session->result();
      if (r.finish_reason == "error") throw ApiError(500, "generation failed: " + r.error, "", "generation_failed");
      finish(true);
      res.set_content(dump(format->whole(*c)), "application/json");
      log(req, 200, " " + who + " " + std::to_string(c->completion_tokens) + " tokens" + note);
      return;
    }

    res.set_header("Cache-Control", "no-cache");
    const std::string content_type = format->stream_content_type();
    res.set_chunked_content_provider(content_type, [this, c, session, format, interrupted, finish, note, &req](
                                                       size_t, httplib::DataSink& sink) {
      auto write = [&](const std::string& bytes) { return bytes.empty() || sink.write(bytes.data(), bytes.size()); };
      for (;;) {
        bool done = false;
        const std::string piece = session->next(std::chrono::milliseconds(50), done);
        if (!piece.empty() && !write(format->piece(*c, piece))) break;
        if (done) {
          const auto r = session->result();
          if (r.finish_reason == "error") {
            write(format->stream_error(ApiError(500, "generation failed: " + r.error, "", "generation_failed")));
          } else {
            finish(true);
            if (!write(format->end(*c))) return false;
          }
          sink.done();
          log(req, 200, " " + c->model + " stream " + std::to_string(c->completion_tokens) + " tokens" + note);
          return true;
        }
        if (!piece.empty()) return true;
        if (interrupted()) break;
      }
      session->cancel();  // as above: cancelled, logged, then waited for
      log(req, 499, " client went away");
      finish(false);
      return false;
    });
  }

  // Runs a handler, turning every failure into an error object (error_body's shape) so that no request can take the
  // server down.
  void guarded(const httplib::Request& req, httplib::Response& res, const std::string& endpoint,
               const std::function<void()>& fn, const ErrorBody& error_body = openai_error_body) {
    try {
      fn();
      return;
    } catch (const ApiError& e) {
      send_error(res, e, error_body);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("internal error: ") + e.what(), "", "internal_error"), error_body);
    }
    metrics.request(endpoint, res.status);
    log(req, res.status, std::string(" ") + res.body.substr(0, 200));
  }

  bool key_ok(const httplib::Request& req) const {
    if (options.api_key.empty() || req.path == "/health" || req.path == "/") return true;  // no data there
    const std::string h = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    const std::string given = h.rfind(prefix, 0) == 0 ? h.substr(prefix.size()) : "";
    return constant_time_equal(given, options.api_key);
  }
  static ApiError no_key() {
    return ApiError(401, "missing or wrong API key (send \"Authorization: Bearer KEY\")", "", "invalid_api_key");
  }

  // The body of a POST to a generation endpoint, through cpp-httplib's content reader: the library's own limit covers
  // a Content-Length only and would read a chunked body of any size into memory. A body is read whole even when it
  // is refused (what lies beyond the limit is dropped): a request left half read would have its rest parsed as the
  // connection's next request. error: why the body cannot be used (413, 411, 400), told after the API key and the
  // Content-Type are checked.
  std::string read_body(const httplib::Request& req, const httplib::ContentReader& reader,
                        std::optional<ApiError>& error) {
    std::string body;
    const bool chunked = ::strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") == 0;  // as httplib
    if (!chunked) {
      if (!req.has_header("Content-Length")) {  // HTTP/1.1: no body; cpp-httplib would wait for the connection to end
        error = ApiError(411, "a POST needs a Content-Length (or a chunked Transfer-Encoding)", "", "length_required");
        return body;
      }
      const std::string length = req.get_header_value("Content-Length");
      if (length.empty() || length.find_first_not_of("0123456789") != std::string::npos) {
        // cpp-httplib reads "-1" as 2^64 - 1 bytes to skip and "abc" as none: the body's end is not known.
        error = ApiError(400, "Content-Length \"" + length + "\" is not a number of bytes", "", "invalid_body");
        return body;
      }
    }
    bool over = false;
    auto keep = [&](const char* data, size_t n) {
      over = over || body.size() + n > options.max_body_bytes;
      if (!over) body.append(data, n);
      return true;
    };
    // A multipart body (refused below for its Content-Type) goes to the multipart reader: the plain one would hand
    // its parts to an empty callback (an exception, answered 500).
    const bool ok = req.is_multipart_form_data() ? reader([](const httplib::MultipartFormData&) { return true; },
                                                          [](const char*, size_t) { return true; })
                                                 : reader(keep);
    if (over || (!ok && req.get_header_value<uint64_t>("Content-Length") > options.max_body_bytes))
      error = ApiError(413, "the body is larger than " + std::to_string(options.max_body_bytes) + " bytes", "",
                       "body_too_large");
    else if (!ok)
      error = ApiError(400,
                       "the body did not arrive in full (fewer bytes than its Content-Length within the read timeout, "
                       "or a malformed chunk)",
                       "", "invalid_body");
    return body;
  }

  // The request body is JSON; a form or multipart body (curl -d or -F without a JSON Content-Type) is a client's
  // mistake better named than by a JSON parse error. No Content-Type is taken as JSON.
  static void require_json(const httplib::Request& req) {
    std::string type = req.get_header_value("Content-Type");
    type = type.substr(0, type.find(';'));
    while (!type.empty() && type.back() == ' ') type.pop_back();
    for (auto& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const bool json = type == "application/json" || (type.size() > 5 && type.ends_with("+json"));
    if (!type.empty() && !json)
      throw ApiError(415,
                     "Content-Type must be application/json (got \"" + req.get_header_value("Content-Type") + "\")", "",
                     "unsupported_media_type");
  }

  // The method each path answers (filled by get() and post()), for the 405 that another method gets (with Allow),
  // and the paths the metrics name (any other is "other": a label per unknown path would have no bound).
  std::map<std::string, std::string> methods;

  const std::string& endpoint_label(const std::string& path) const {
    static const std::string other = "other";
    const auto it = methods.find(path);
    return it == methods.end() ? other : it->first;
  }

  void get(const std::string& path, std::function<void(const httplib::Request&, httplib::Response&)> handler) {
    methods[path] = "GET";
    http.Get(path, std::move(handler));
  }

  // A POST endpoint with a JSON body: the body is read (within --max-body, chunked or not), the API key and the
  // Content-Type are checked, then handler(req, body, res) answers. Its errors, and those found before, are shaped by
  // error_body and counted under path in the metrics.
  using PostHandler = std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;
  void post(const std::string& path, PostHandler handler, ErrorBody error_body = openai_error_body) {
    methods[path] = "POST";
    http.Post(path, [this, path, handler = std::move(handler), error_body](
                        const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      guarded(
          req, res, path,
          [&] {
            std::optional<ApiError> body_error;
            const std::string body = read_body(req, reader, body_error);
            if (!key_ok(req)) throw no_key();
            require_json(
                req);  // before the body's own error: a multipart body the reader could not follow says no more
            if (body_error) throw *body_error;
            handler(req, body, res);
          },
          error_body);
    });
  }

  // A POST endpoint that generates: parse turns the body into a GenerationPlan (response_format.h), generate() does
  // the rest.
  void generation_endpoint(const std::string& path, GenerationParser parse, ErrorBody error_body = openai_error_body) {
    post(
        path,
        [this, path, parse = std::move(parse)](const httplib::Request& req, const std::string& body,
                                               httplib::Response& res) { generate(req, res, path, parse(body)); },
        std::move(error_body));
  }

  void routes() {
    // A request with a body is checked once the body is read (post(), or the error handler for the paths that have
    // none): refused before, its body would be read as the connection's next request.
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (has_body(req) || key_ok(req)) return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, no_key(), error_body_of(req.path));
      metrics.request(endpoint_label(req.path), 401);
      return httplib::Server::HandlerResponse::Handled;
    });
    get("/health", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, "/health", [&] { health(res); });
    });
    get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, "/v1/models", [&] {
        models(res);
        metrics.request("/v1/models", 200);
      });
    });
    get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, "/metrics", [&] {
        metrics.request("/metrics", 200);
        std::vector<workspace::WorkspaceStatus> ws;
        for (const auto* w : options.workspaces) ws.push_back(w->status());
        res.set_content(metrics.render(gauges(), ws), "text/plain; version=0.0.4");
      });
    });
    get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(web_page_html(), "text/html; charset=utf-8");
    });
    for (const bool chat : {true, false})
      generation_endpoint(chat ? "/v1/chat/completions" : "/v1/completions", [this, chat](const std::string& body) {
        return openai_plan(specialists, body, chat, options.default_max_tokens, options.workspaces);
      });
    // llama.cpp's API where editors use it (llama_api.h).
    generation_endpoint("/infill", [this](const std::string& body) {
      return infill_plan(specialists, body, options.default_max_tokens, options.workspaces);
    });
    for (const std::string path : {"/completion", "/completions"})  // llama.cpp serves both names
      generation_endpoint(path, [this](const std::string& body) {
        return completion_plan(specialists, body, options.default_max_tokens);
      });
    for (const bool encode : {true, false}) {
      const std::string path = encode ? "/tokenize" : "/detokenize";
      post(path, [this, encode, path](const httplib::Request&, const std::string& body, httplib::Response& res) {
        res.set_content(dump(encode ? tokenize_json(specialists, body) : detokenize_json(specialists, body)),
                        "application/json");
        metrics.request(path, 200);
      });
    }
    get("/props", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, "/props", [&] {
        res.set_content(dump(props_json(specialists, options.default_max_tokens)), "application/json");
        metrics.request("/props", 200);
      });
    });
    // Ollama's API (ollama_api.h), its errors {"error": "message"}.
    const OllamaClock clock = [] { return std::chrono::system_clock::now(); };
    for (const std::string path : {"/api/tags", "/api/ps", "/api/version"})
      get(path, [this, path](const httplib::Request& req, httplib::Response& res) {
        guarded(
            req, res, path,
            [&] {
              const auto models = ollama_models(specialists);
              res.set_content(dump(path == "/api/tags" ? ollama_tags_json(models)
                                   : path == "/api/ps" ? ollama_ps_json(models)
                                                       : Json{{"version", kOllamaVersion}}),
                              "application/json");
              metrics.request(path, 200);
            },
            ollama_error_body);
      });
    post(
        "/api/show",
        [this](const httplib::Request&, const std::string& body, httplib::Response& res) {
          res.set_content(dump(ollama_show_json(ollama_models(specialists), body)), "application/json");
          metrics.request("/api/show", 200);
        },
        ollama_error_body);
    for (const bool chat : {false, true}) {
      const std::string path = chat ? "/api/chat" : "/api/generate";
      post(
          path,
          [this, chat, path, clock](const httplib::Request& req, const std::string& body, httplib::Response& res) {
            const OllamaRequest r = parse_ollama_request(body, chat);
            if (!r.load_only()) {
              generate(req, res, path, ollama_plan(specialists, r, options.default_max_tokens, clock));
              return;
            }
            res.set_content(dump(ollama_load_json(ollama_models(specialists), r, clock)), "application/json");
            metrics.request(path, 200);
          },
          ollama_error_body);
    }
    // What cpp-httplib answers by itself (unknown path or method, body too large, a request line or headers
    // malformed or not sent in full within the read timeout) gets an error object too.
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      const auto known = methods.find(req.path);
      const char* allow = res.status == 404 && known != methods.end() ? known->second.c_str() : nullptr;
      const ErrorBody& shape = error_body_of(req.path);
      if (!key_ok(req) && res.status == 404) {
        send_error(res, no_key(), shape);
      } else if (allow) {
        res.set_header("Allow", allow);
        send_error(res,
                   ApiError(405, req.method + " " + req.path + ": method not allowed (use " + allow + ")", "",
                            "method_not_allowed"),
                   shape);
      } else {
        send_error(res, ApiError(res.status,
                                 res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
                                 : res.status == 413
                                     ? "the body is larger than " + std::to_string(options.max_body_bytes) + " bytes"
                                 : res.status == 400
                                     ? "the request is malformed, or its request line and headers did not arrive "
                                       "in full within the read timeout"
                                     : "the request was refused (HTTP " + std::to_string(res.status) + ")"),
                   shape);
      }
      metrics.request("other", res.status);
      return httplib::Server::HandlerResponse::Handled;
    }));
  }
};

Server::Server(Specialists& specialists, ServerOptions options)
    : impl_(std::make_unique<Impl>(specialists, std::move(options))) {
  if (specialists.all().empty()) throw Error("serve: no specialists to serve");
  if (impl_->options.threads < 1) throw Error("serve: threads must be at least 1");
  if (impl_->options.default_max_tokens < 1) throw Error("serve: the default max_tokens must be at least 1");
  if (!(impl_->options.read_timeout_s > 0)) throw Error("serve: the read timeout must be positive");
}

Server::~Server() {
  stop();
}

int Server::start() {
  // A client that disconnects makes the next write fail; without this the write's SIGPIPE would kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  auto& h = impl_->http;
  const size_t threads = static_cast<size_t>(impl_->options.threads);
  h.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  h.set_payload_max_length(impl_->options.max_body_bytes);
  // Without it, a small response written in pieces waits for the client's delayed ACK (40 ms per request on Linux).
  h.set_tcp_nodelay(true);
  h.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::duration<double>(impl_->options.read_timeout_s)));
  h.set_write_timeout(30);
  impl_->routes();
  int port = impl_->options.port;
  if (port == 0) {
    port = h.bind_to_any_port(impl_->options.host);
  } else if (!h.bind_to_port(impl_->options.host, port)) {
    port = -1;
  }
  if (port < 0)
    throw Error("serve: cannot listen on " + impl_->options.host + ":" + std::to_string(impl_->options.port) +
                " (in use, or not an address of this machine)");
  impl_->listener = std::thread([this] { impl_->http.listen_after_bind(); });
  return port;
}

void Server::stop() {
  std::call_once(impl_->stopped, [this] {
    impl_->stopping = true;
    impl_->http.stop();
    if (impl_->listener.joinable()) impl_->listener.join();
  });
}

}  // namespace slm::server
