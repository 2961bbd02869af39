// The body of POST /v1/chat/completions and /v1/completions (server/openai.cpp): every input is parsed both ways.
// A malformed body must come back as ApiError 400 (the server answers it as the client's error); anything else
// escaping the parser would be a 500. A parsed request's strings and the error objects must serialise as the
// server sends them back (server/http_server.cpp's dump: invalid UTF-8, which a parse error quotes, is replaced).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "slm/server/openai.h"

namespace {
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (const bool chat : {true, false}) {
    try {
      const slm::server::GenerationRequest r = slm::server::parse_generation_request(body, chat);
      if (r.model.empty() || (chat && r.messages.empty()) || r.stop.size() > 4) std::abort();
      if (r.max_tokens && *r.max_tokens < 1) std::abort();
      slm::server::Completion c;
      c.model = c.specialist = r.model;
      c.text = r.routing_text();
      c.finish_reason = "stop";
      (void)dump(slm::server::completion_json(c, chat));
      (void)dump(slm::server::chunk_json(c, chat, r.stop.empty() ? "" : r.stop[0], true, false));
    } catch (const slm::server::ApiError& e) {
      if (e.status() != 400) std::abort();
      slm::fuzz::rejected(e);
      (void)dump(e.to_json());
    }
  }
  return 0;
}
