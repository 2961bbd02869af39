#include "slm/server/chat_client.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "slm/server/openai.h"
#include "slm/server/openai_format.h"
#include "slm/server/session.h"
#include "slm/util/error.h"

namespace slm::server {

namespace {

nlohmann::json chat_body(const std::vector<text::ChatMessage>& history, const ChatOptions& o, bool stream) {
  nlohmann::json messages = nlohmann::json::array();
  for (const auto& m : history) messages.push_back({{"role", m.role}, {"content", m.content}});
  return {{"model", o.model},
          {"messages", messages},
          {"max_tokens", o.max_tokens},
          {"temperature", o.temperature},
          {"top_p", o.top_p},
          {"seed", o.seed},
          {"stream", stream}};
}

class InProcessChat final : public ChatBackend {
 public:
  InProcessChat(Specialists& s, Workspaces w) : specialists_(s), workspaces_(std::move(w)) {}

  ChatReply send(const std::vector<text::ChatMessage>& history, const ChatOptions& o,
                 const std::function<void(const std::string&)>& on_text) override {
    // The same parsing, checks and workspace context as a request to the server's /v1/chat/completions, so both ends
    // refuse the same things and see the same files.
    try {
      GenerationPlan plan =
          openai_plan(specialists_, chat_body(history, o, false).dump(), /*chat=*/true, o.max_tokens, workspaces_);
      auto& p = plan.prepared;
      Session session(*p.engine, *p.specialist->tokenizer, std::move(p.request), {});
      ChatReply reply{p.answered_by, "", "", plan.log_note};
      for (bool done = false; !done;) {
        const std::string piece = session.next(std::chrono::milliseconds(100), done);
        if (!piece.empty() && on_text) on_text(piece);
        reply.text += piece;
      }
      const auto r = session.result();
      if (r.finish_reason == "error") throw Error("generation failed: " + r.error);
      reply.finish_reason = r.finish_reason;
      return reply;
    } catch (const ApiError& e) {
      throw Error(e.what());
    }
  }

 private:
  Specialists& specialists_;
  Workspaces workspaces_;
};

// cpp-httplib throws std::invalid_argument for a scheme it does not know (ftp://...) and makes an invalid client for
// other URLs it cannot use; both are the user's URL, not an internal error.
httplib::Client http_client(const std::string& url) {
  try {
    return httplib::Client(url);
  } catch (const std::exception&) {
    throw Error("chat: cannot use the URL " + url + " (expected http://host:port)");
  }
}

class HttpChat final : public ChatBackend {
 public:
  HttpChat(const std::string& url, std::string api_key) : client_(http_client(url)), api_key_(std::move(api_key)) {
    if (!client_.is_valid()) throw Error("chat: cannot use the URL " + url + " (expected http://host:port)");
    client_.set_read_timeout(600);
  }

  ChatReply send(const std::vector<text::ChatMessage>& history, const ChatOptions& o,
                 const std::function<void(const std::string&)>& on_text) override {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = chat_body(history, o, true).dump();
    req.set_header("Content-Type", "application/json");
    if (!api_key_.empty()) req.set_header("Authorization", "Bearer " + api_key_);
    ChatReply reply;
    int status = 0;
    std::string raw, pending, failure;
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      reply.specialist = r.get_header_value("X-SLM-Specialist");
      return true;
    };
    // Server-sent events: "data: {...}\n\n" per chunk, "data: [DONE]" at the end.
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (status != 200) {
        raw.append(data, n);
        return true;
      }
      pending.append(data, n);
      for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
        const std::string ev = pending.substr(0, end);
        if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
        const auto j = nlohmann::json::parse(ev.substr(6), nullptr, false);
        if (j.contains("error")) {
          failure = "chat: the server failed: " + j["error"].value("message", ev);
          return false;  // ends the transfer; thrown below, outside cpp-httplib
        }
        if (!j.contains("choices") || j["choices"].empty()) continue;
        const auto& c = j["choices"][0];
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) reply.finish_reason = c["finish_reason"];
        if (c.contains("delta") && c["delta"].contains("content")) {
          const std::string piece = c["delta"]["content"];
          reply.text += piece;
          if (on_text) on_text(piece);
        }
      }
      return true;
    };
    auto res = client_.send(req);
    if (!failure.empty()) throw Error(failure);
    if (!res) throw Error("chat: no answer from the server (" + httplib::to_string(res.error()) + ")");
    if (status != 200) {
      const auto j = nlohmann::json::parse(raw, nullptr, false);
      throw Error("chat: the server answered HTTP " + std::to_string(status) + ": " +
                  (j.is_object() && j.contains("error") ? j["error"].value("message", raw) : raw));
    }
    return reply;
  }

 private:
  httplib::Client client_;
  std::string api_key_;
};

}  // namespace

std::unique_ptr<ChatBackend> in_process_chat(Specialists& specialists, Workspaces workspaces) {
  return std::make_unique<InProcessChat>(specialists, std::move(workspaces));
}

std::unique_ptr<ChatBackend> http_chat(const std::string& url, const std::string& api_key) {
  return std::make_unique<HttpChat>(url, api_key);
}

}  // namespace slm::server
