#pragma once
// The chat page served at GET /: one static HTML file with its script inline (no build step, nothing fetched
// from elsewhere). It lists the models, streams answers from /v1/chat/completions and shows which specialist
// answered.
#include <string>

namespace slm::server {
const std::string& web_page_html();
}
