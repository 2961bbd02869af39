#include "slm/server/openai_format.h"

namespace slm::server {

namespace {

class OpenAiFormat : public ResponseFormat {
 public:
  OpenAiFormat(bool chat, bool include_usage) : chat_(chat), include_usage_(include_usage) {}
  std::string id_prefix() const override { return chat_ ? "chatcmpl" : "cmpl"; }
  nlohmann::json whole(const GenerationReport& r) override { return completion_json(completion(r), chat_); }
  std::string piece(const GenerationReport& r, const std::string& text) override {
    std::string out = sse_event(chunk_json(completion(r), chat_, text, first_, false));
    first_ = false;  // the first chunk also carries the role
    return out;
  }
  std::string end(const GenerationReport& r) override {
    const Completion c = completion(r);
    std::string out = sse_event(chunk_json(c, chat_, "", first_, true));
    if (include_usage_) out += sse_event(chunk_json(c, chat_, "", false, false, true));
    return out + kDone;
  }
  std::string stream_error(const ApiError& e) override { return sse_event(e.to_json()) + kDone; }

 private:
  static constexpr const char* kDone = "data: [DONE]\n\n";
  static Completion completion(const GenerationReport& r) {
    Completion c;
    c.id = r.id;
    c.model = r.model;
    c.specialist = r.model;
    c.created = r.created;
    c.text = r.text;
    c.finish_reason = r.finish_reason;
    c.prompt_tokens = r.prompt_tokens;
    c.completion_tokens = r.completion_tokens;
    c.routing = r.routing;
    return c;
  }
  bool chat_, include_usage_;
  bool first_ = true;
};

}  // namespace

std::unique_ptr<ResponseFormat> openai_format(bool chat, bool include_usage) {
  return std::make_unique<OpenAiFormat>(chat, include_usage);
}

GenerationPlan openai_plan(const Specialists& specialists, const std::string& body, bool chat,
                           int64_t default_max_tokens, const Workspaces& workspaces) {
  const GenerationRequest g = parse_generation_request(body, chat);
  GenerationPlan plan;
  plan.prepared = prepare_generation(specialists, g, default_max_tokens);
  if (chat && (!workspaces.empty() || !g.files.empty()))
    if (const auto chunks = chat_files_context(workspaces, g.files, g.routing_text()); !chunks.empty()) {
      auto& prep = plan.prepared;
      const text::ChatTemplate& tmpl = *prep.specialist->chat;
      const int64_t ctx = prep.engine->context_length();
      const int64_t room = prep.request.max_tokens;  // the completion keeps what it had without the files
      size_t user = g.messages.size() - 1;
      while (user > 0 && g.messages[user].role != "user") --user;
      // The most chunks (best first) whose prompt leaves that room: the prompt grows with the chunk count, so a
      // binary search tokenizes the conversation about log2(chunks) times.
      auto prompt_with = [&](size_t k) {
        auto messages = g.messages;
        messages[user].content = chat_context_block({chunks.begin(), chunks.begin() + static_cast<std::ptrdiff_t>(k)}) +
                                 messages[user].content;
        return tmpl.chat_prompt(messages);
      };
      auto fits = [&](const std::vector<int64_t>& ids) { return static_cast<int64_t>(ids.size()) + room <= ctx; };
      size_t lo = 0, hi = chunks.size();  // lo chunks fit (none: the request as it came)
      std::vector<int64_t> best;
      while (lo < hi) {
        const size_t mid = (lo + hi + 1) / 2;
        if (auto ids = prompt_with(mid); fits(ids)) {
          lo = mid;
          best = std::move(ids);
        } else {
          hi = mid - 1;
        }
      }
      if (lo > 0) {
        prep.request.prompt = std::move(best);
        std::string names;
        for (size_t i = 0; i < lo; ++i)
          names += std::string(i ? ", " : "") + workspace::chunk_kind_name(chunks[i].kind) + " " + chunks[i].name;
        plan.log_note =
            " context: " + std::to_string(lo) + " of " + std::to_string(chunks.size()) + " chunk(s) (" + names + ")";
      }
      if (plan.log_note.empty())
        plan.log_note = " context: the workspace's files did not fit the context beside the completion";
    }
  plan.stop = g.stop;
  plan.stream = g.stream;
  plan.format = openai_format(chat, g.include_usage);
  return plan;
}

}  // namespace slm::server
