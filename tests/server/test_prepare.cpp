// server/prepare.h: from a parsed request to the engine request, without HTTP and without generating. Which
// specialist answers (named, "auto" through the router, "auto-2" as a mixture of the router's top two), the prompt
// ids through the chat template, max_tokens against the context, and every refusal with its status, message, param
// and code. Prompts of bytes that are never valid UTF-8 (0xFF) encode to one byte-fallback id each (<0xFF> is id
// 281, tokenizer/README.md), so their token counts are known exactly and the context edges can be hit on purpose.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "serving_test_util.h"
#include "slm/server/prepare.h"

namespace slm::server {
namespace {

constexpr int64_t kContext = 40;  // every micro model's seq_len here

std::unique_ptr<data::Tokenizer> tokenizer(const std::string& file = "tokenizer/slm-code-512.model") {
  return std::make_unique<data::Tokenizer>(data::Tokenizer::load(test::source_path(file)));
}

// A micro model over the 8,192-id tokenizer: a specialist that can never mix with the 512-id ones.
std::shared_ptr<model::HybridLM> model_8k(uint64_t seed) {
  auto j = nlohmann::json::parse(R"({
    "name": "serve-8k", "vocab_size": 8192, "d_model": 32, "depth": 2, "pattern": "AE", "seq_len": 40,
    "attention": {"heads": 2, "kv_heads": 1, "head_dim": 16},
    "moe": {"routed_experts": 4, "experts_per_token": 2, "expert_hidden": 32}
  })");
  auto m = std::make_shared<model::HybridLM>(parse_recipe_text(j.dump(), "serve-8k.json"));
  test::randomize(*m, seed);
  m->eval();
  return m;
}

const std::string kCmakeText = "add_library target_link_libraries find_package";
const std::string kShellText = "grep sed awk xargs";

class Prepare : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::single_threaded();
    const LoadOptions lo;
    duo_ = new Specialists();  // alpha answers cmake, beta shell; one tokenizer; a router
    duo_->add("alpha", test::serving_model(21, kContext), tokenizer(), {"cmake"}, lo);
    duo_->add("beta", test::serving_model(22, kContext), tokenizer(), {"shell"}, lo);
    duo_->set_router(test::toy_router());
    plain_ = new Specialists();  // two specialists, no router
    plain_->add("alpha", test::serving_model(23, kContext), tokenizer(), {"cmake"}, lo);
    plain_->add("beta", test::serving_model(24, kContext), tokenizer(), {"shell"}, lo);
    solo_ = new Specialists();  // one specialist, no router
    solo_->add("only", test::serving_model(25, kContext), tokenizer(), {"cmake"}, lo);
    solo_routed_ = new Specialists();  // one specialist and a router
    solo_routed_->add("only", test::serving_model(26, kContext), tokenizer(), {"cmake"}, lo);
    solo_routed_->set_router(test::toy_router());
    mixed_ = new Specialists();  // alpha on the 512-id tokenizer, gamma on the 8k one
    mixed_->add("alpha", test::serving_model(27, kContext), tokenizer(), {"cmake"}, lo);
    mixed_->add("gamma", model_8k(28), tokenizer("tokenizer/slm-code-8k.model"), {"shell"}, lo);
    mixed_->set_router(test::toy_router());
  }
  static void TearDownTestSuite() {
    for (Specialists* s : {duo_, plain_, solo_, solo_routed_, mixed_}) delete s;
  }

  static GenerationRequest chat(const std::string& model, const std::string& text) {
    GenerationRequest g;
    g.model = model;
    g.messages = {{"user", text}};
    return g;
  }
  static GenerationRequest completion(const std::string& model, const std::string& prompt) {
    GenerationRequest g;
    g.chat = false;
    g.model = model;
    g.prompt = prompt;
    return g;
  }

  static inline Specialists *duo_ = nullptr, *plain_ = nullptr, *solo_ = nullptr, *solo_routed_ = nullptr,
                            *mixed_ = nullptr;
};

void expect_refused(const std::function<void()>& f, int status, const std::string& message, const std::string& param,
                    const std::string& code) {
  try {
    f();
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), status);
    EXPECT_EQ(std::string(e.what()), message);
    EXPECT_EQ(e.param(), param);
    EXPECT_EQ(e.code(), code);
  }
}

// <|bos|> and n ids of <0xFF>.
std::vector<int64_t> ff_completion_ids(size_t n) {
  std::vector<int64_t> ids(n + 1, 281);
  ids[0] = 2;
  return ids;
}

TEST_F(Prepare, ANamedSpecialistGetsTheRequestAsGiven) {
  auto g = chat("beta", "How do I grep?");
  g.max_tokens = 5;
  g.sampling.temperature = 0.5;
  g.sampling.top_p = 0.9;
  g.sampling.top_k = 7;
  g.sampling.seed = 42;
  g.sampling.repetition_penalty = 1.2;
  g.sampling.presence_penalty = 0.5;
  g.sampling.frequency_penalty = -0.25;
  g.stop = {"END"};  // stop strings stay with the caller (Session), not in the engine request
  const auto p = prepare_generation(*duo_, g, 16);
  Specialist* beta = duo_->find("beta");
  EXPECT_EQ(p.specialist, beta);
  EXPECT_EQ(p.engine, beta->engine.get());
  EXPECT_EQ(p.answered_by, "beta");
  EXPECT_TRUE(p.routing.is_null());
  EXPECT_EQ(p.request.prompt, test::user_prompt("How do I grep?"));
  EXPECT_EQ(p.request.max_tokens, 5);
  EXPECT_EQ(p.request.stop_ids, std::vector<int64_t>({9, 3}));  // <|end|>, <|eos|>
  EXPECT_TRUE(p.request.mixture_weights.empty());
  const auto& s = p.request.sampling;
  EXPECT_EQ(s.temperature, 0.5);
  EXPECT_EQ(s.top_p, 0.9);
  EXPECT_EQ(s.top_k, 7);
  EXPECT_EQ(s.seed, 42u);
  EXPECT_EQ(s.repetition_penalty, 1.2);
  EXPECT_EQ(s.presence_penalty, 0.5);
  EXPECT_EQ(s.frequency_penalty, -0.25);
}

TEST_F(Prepare, CompletionPromptIsBosAndTheText) {
  const auto p = prepare_generation(*duo_, completion("alpha", std::string(5, '\xFF')), 16);
  EXPECT_EQ(p.answered_by, "alpha");
  EXPECT_EQ(p.request.prompt, ff_completion_ids(5));
  EXPECT_EQ(p.request.max_tokens, 16);  // the default: well inside the context
  EXPECT_EQ(p.request.stop_ids, std::vector<int64_t>({9, 3}));
}

TEST_F(Prepare, DefaultMaxTokensIsCappedByTheContextLeft) {
  // 30 prompt tokens leave 10 of the 40.
  EXPECT_EQ(prepare_generation(*duo_, completion("alpha", std::string(29, '\xFF')), 16).request.max_tokens, 10);
  // 39 leave 1.
  EXPECT_EQ(prepare_generation(*duo_, completion("alpha", std::string(38, '\xFF')), 16).request.max_tokens, 1);
  // Chat: <|bos|> <|user|> text <|end|> <|assistant|> is 4 ids around the text.
  const auto p = prepare_generation(*duo_, chat("alpha", std::string(30, '\xFF')), 16);
  EXPECT_EQ(p.request.prompt.size(), 34u);
  EXPECT_EQ(p.request.max_tokens, 6);
}

TEST_F(Prepare, APromptThatFillsTheContextIsRefused) {
  expect_refused([&] { prepare_generation(*duo_, completion("alpha", std::string(39, '\xFF')), 16); }, 400,
                 "the prompt is 40 tokens, and the model's context is 40 tokens (prompt and completion together)",
                 "prompt", "context_length_exceeded");
  expect_refused([&] { prepare_generation(*duo_, chat("alpha", std::string(50, '\xFF')), 16); }, 400,
                 "the prompt is 54 tokens, and the model's context is 40 tokens (prompt and completion together)",
                 "messages", "context_length_exceeded");
}

TEST_F(Prepare, MaxTokensMustFitTheContextLeft) {
  auto g = completion("alpha", std::string(29, '\xFF'));  // 30 tokens
  g.max_tokens = 10;
  EXPECT_EQ(prepare_generation(*duo_, g, 16).request.max_tokens, 10);  // exactly the 40
  for (int64_t too_many : {int64_t{11}, int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
    g.max_tokens = too_many;
    expect_refused([&] { prepare_generation(*duo_, g, 16); }, 400,
                   "the prompt (30 tokens) plus max_tokens (" + std::to_string(too_many) +
                       ") exceeds the model's context of 40 tokens",
                   "max_tokens", "context_length_exceeded");
  }
}

TEST_F(Prepare, UnknownModelsAre404) {
  for (Specialists* s : {duo_, plain_, solo_})
    expect_refused([&] { prepare_generation(*s, chat("gpt-4o", "hi"), 16); }, 404,
                   "the model \"gpt-4o\" does not exist (GET /v1/models lists them)", "model", "model_not_found");
  // Names are exact: no case folding.
  expect_refused([&] { prepare_generation(*duo_, completion("Alpha", "x"), 16); }, 404,
                 "the model \"Alpha\" does not exist (GET /v1/models lists them)", "model", "model_not_found");
}

TEST_F(Prepare, AutoAsksTheRouter) {
  for (const auto& [text, expected] : {std::pair{kCmakeText, "alpha"}, std::pair{kShellText, "beta"}}) {
    const auto p = prepare_generation(*duo_, chat("auto", text), 16);
    EXPECT_EQ(p.answered_by, expected) << text;
    EXPECT_EQ(p.specialist, duo_->find(expected));
    EXPECT_EQ(p.engine, duo_->find(expected)->engine.get());
    // The router's probabilities, one per specialist, copied as they came.
    const auto route = duo_->route(text);
    ASSERT_TRUE(p.routing.is_object());
    ASSERT_EQ(p.routing.size(), 2u);
    double sum = 0;
    for (const auto& [name, prob] : route.probabilities) {
      EXPECT_EQ(p.routing.at(name).get<double>(), prob) << name;
      sum += prob;
    }
    EXPECT_NEAR(sum, 1.0, 1e-9);
    EXPECT_GT(p.routing.at(expected).get<double>(), 0.5);
    EXPECT_EQ(p.request.prompt, test::user_prompt(text));
  }
  // The completion prompt is what the router reads there.
  EXPECT_EQ(prepare_generation(*duo_, completion("auto", kShellText), 16).answered_by, "beta");
}

TEST_F(Prepare, AutoWithoutARouter) {
  expect_refused([&] { prepare_generation(*plain_, chat("auto", kCmakeText), 16); }, 404,
                 "model \"auto\" needs a router model, and none is loaded: name a specialist instead", "model",
                 "model_not_found");
  // With one specialist there is nothing to choose.
  const auto p = prepare_generation(*solo_, chat("auto", kShellText), 16);
  EXPECT_EQ(p.answered_by, "only");
  EXPECT_EQ(p.specialist, solo_->all()[0].get());
  EXPECT_TRUE(p.routing.is_null());
}

TEST_F(Prepare, Auto2MixesTheRoutersTopTwo) {
  engine::Engine* mixture = duo_->mixture(0, 1);
  ASSERT_NE(mixture, nullptr);
  for (const auto& [text, first, answered] :
       {std::tuple{kCmakeText, "alpha", "alpha+beta"}, std::tuple{kShellText, "beta", "beta+alpha"}}) {
    const auto p = prepare_generation(*duo_, chat("auto-2", text), 16);
    EXPECT_EQ(p.engine, mixture) << text;
    EXPECT_EQ(p.specialist, duo_->find(first));  // its template and tokenizer
    EXPECT_EQ(p.answered_by, answered);
    const auto route = duo_->route(text);
    const double pa = p.routing.at("alpha").get<double>(), pb = p.routing.at("beta").get<double>();
    EXPECT_EQ(p.routing.size(), 2u);
    for (const auto& [name, prob] : route.probabilities) EXPECT_EQ(p.routing.at(name).get<double>(), prob);
    // The weights follow the specialists' order (alpha first), whichever the router put on top.
    EXPECT_EQ(p.request.mixture_weights, std::vector<double>({pa, pb})) << text;
    EXPECT_EQ(p.request.prompt, test::user_prompt(text));
    EXPECT_EQ(p.request.stop_ids, std::vector<int64_t>({9, 3}));
  }
}

TEST_F(Prepare, Auto2NeedsARouterAndTwoSpecialists) {
  for (Specialists* s : {plain_, solo_, solo_routed_})
    expect_refused([&] { prepare_generation(*s, chat("auto-2", kCmakeText), 16); }, 404,
                   "model \"auto-2\" needs a router model and at least two specialists", "model", "model_not_found");
}

TEST_F(Prepare, Auto2WithDifferentTokenizersAnswersWithTheTopOneAlone) {
  const auto p = prepare_generation(*mixed_, chat("auto-2", kShellText), 16);
  Specialist* gamma = mixed_->find("gamma");
  EXPECT_EQ(p.specialist, gamma);
  EXPECT_EQ(p.engine, gamma->engine.get());
  EXPECT_EQ(p.answered_by, "gamma");
  EXPECT_EQ(p.routing.at("auto-2"), "the top two specialists use different tokenizers; gamma answered alone");
  EXPECT_EQ(p.routing.size(), 3u);  // gamma, alpha and the note
  EXPECT_TRUE(p.request.mixture_weights.empty());
  // The prompt is gamma's own tokenizer's: the same control ids around its pieces.
  std::vector<int64_t> expected = {2, 5};
  for (uint32_t id : gamma->tokenizer->encode(kShellText)) expected.push_back(id);
  expected.push_back(9);
  expected.push_back(6);
  EXPECT_EQ(p.request.prompt, expected);
  EXPECT_NE(p.request.prompt, test::user_prompt(kShellText));  // not the 512-id tokenizer's
}

TEST_F(Prepare, ConversationsTheTemplateRefusesAre400) {
  GenerationRequest empty;
  empty.model = "alpha";
  expect_refused([&] { prepare_generation(*duo_, empty, 16); }, 400, "messages must hold at least one message",
                 "messages", "invalid_value");
  GenerationRequest narrator = chat("alpha", "hi");
  narrator.messages.insert(narrator.messages.begin(), text::ChatMessage{"narrator", "once upon a time"});
  expect_refused([&] { prepare_generation(*duo_, narrator, 16); }, 400,
                 "messages[0].role: unknown role \"narrator\" (system, developer, user, assistant, tool)", "messages",
                 "invalid_value");
}

}  // namespace
}  // namespace slm::server
