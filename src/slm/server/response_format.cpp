#include "slm/server/response_format.h"

#include "slm/server/openai.h"

namespace slm::server {

nlohmann::json openai_error_body(const ApiError& e) {
  return e.to_json();
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

std::string ndjson_line(const nlohmann::json& j) {
  return dump_json(j) + "\n";
}

}  // namespace slm::server
