// The generating completion sources: the in-process model through the batching engine against the model's own
// one-sequence loop (text::generate_text / generate_byte_text), and a running `slm serve` (in-process, on a free
// loopback port) over HTTP against the in-process source, through the harness; errors of a dead or refusing server.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "data/data_test_util.h"
#include "engine/engine_test_util.h"
#include "eval/eval_test_util.h"
#include "slm/data/detokenizer.h"
#include "slm/engine/generation.h"
#include "slm/eval/humaneval.h"
#include "slm/eval/model_completions.h"
#include "slm/eval/server_completions.h"
#include "slm/eval/stop.h"
#include "slm/server/http_server.h"
#include "slm/text/text_generation.h"

namespace slm::eval {
namespace {

// Small C++-shaped problems; their prompts differ in length, so the engine's rows join and leave at different steps.
std::vector<Problem> toy_problems() {
  std::vector<Problem> out;
  const std::vector<std::string> bodies = {
      "int add(int a, int b) {\n", "#include <vector>\nlong sum(std::vector<long> v) {\n", "bool odd(int x) {\n",
      "// Reverse a string.\nstd::string rev(std::string s) {\n"};
  for (size_t i = 0; i < bodies.size(); ++i) {
    Problem p;
    p.name = "toy_" + std::to_string(i);
    p.prompt = "#include <cassert>\n#include <string>\n" + bodies[i];
    p.tests = "\n}\nint main() { return 0; }\n";
    p.stop_tokens = {"\n}", "\nint ", "\n#", "\n//", "\nvoid "};  // five: one more than a request carries
    out.push_back(std::move(p));
  }
  return out;
}

// The model of the server tests, with <|end|> (9) never the greedy pick: the server's completion ends there (its chat
// template's stop ids) while the evaluation's text generation, as `slm generate`, never samples it.
std::shared_ptr<model::HybridLM> micro_model(uint64_t seed) {
  auto m = test::serving_model(seed);
  torch::NoGradGuard ng;
  m->lm_head->weight.dense()[9].zero_();
  return m;
}

data::Tokenizer code_tokenizer() {
  return data::Tokenizer::load(test::source_path("tokenizer/slm-code-512.model"));
}

ModelSpec spec(int slots, double temperature, int64_t max_tokens = 20) {
  ModelSpec s;
  s.slots = slots;
  s.sampling.temperature = temperature;
  s.sampling.top_p = temperature > 0 ? 0.95 : 1.0;
  s.sampling.max_tokens = max_tokens;
  s.sampling.seed = 7;
  return s;
}

std::vector<std::vector<Completion>> all_completions(CompletionSource& source, const std::vector<Problem>& problems,
                                                     int n) {
  std::vector<std::vector<Completion>> out(problems.size());
  size_t expected = 0;
  source.complete(problems, n, [&](size_t pi, std::vector<Completion> c) {
    EXPECT_EQ(pi, expected++) << "delivered out of problem order";
    out[pi] = std::move(c);
    return true;
  });
  EXPECT_EQ(expected, problems.size());
  return out;
}

// The sequential path: the model's own loop, one sample at a time.
std::string sequential(model::HybridLM& m, const data::Tokenizer* tok, const Problem& p, const SamplingSpec& s, int j) {
  engine::GenerationOptions o;
  o.max_tokens = s.max_tokens;
  o.sampling = {s.temperature, s.top_k, s.top_p, sample_seed(s.seed, p, j)};
  o.stop_texts = p.stop_tokens;
  std::string text;
  if (tok)
    text::generate_text(m, *tok, p.prompt, o, [&](const std::string& t) { text += t; });
  else
    text::generate_byte_text(m, p.prompt, o, /*stop_at_eos=*/true, [&](int64_t id) {
      if (id < 256) text += static_cast<char>(id);
    });
  return text;
}

// Each problem also stops at a piece from the middle of its free-running greedy text, so the samples end at
// different lengths by a stop sequence as well as by max_tokens.
std::vector<Problem> with_stops_met(model::HybridLM& m, const data::Tokenizer* tok, std::vector<Problem> problems,
                                    const SamplingSpec& s) {
  for (size_t i = 0; i < problems.size(); i += 2) {
    const std::string free_run = sequential(m, tok, problems[i], s, 0);
    if (free_run.size() >= 8) problems[i].stop_tokens.insert(problems[i].stop_tokens.begin(), free_run.substr(5, 2));
  }
  return problems;
}

TEST(ModelCompletionsBatched, GreedyEqualsTheSequentialLoop) {
  test::single_threaded();
  auto m = micro_model(11);
  for (const data::Tokenizer* tok : {&test::code512(), static_cast<const data::Tokenizer*>(nullptr)}) {
    SCOPED_TRACE(tok ? "code tokenizer" : "byte-level");
    const auto s = spec(3, 0.0);  // fewer slots than samples: rows are reused
    const auto problems = with_stops_met(*m, tok, toy_problems(), s.sampling);
    ModelCompletions source(m, tok ? std::optional<data::Tokenizer>(code_tokenizer()) : std::nullopt, s);
    const auto got = all_completions(source, problems, 2);
    for (size_t i = 0; i < problems.size(); ++i) {
      const std::string expected = sequential(*m, tok, problems[i], s.sampling, 0);
      ASSERT_EQ(got[i].size(), 2u);
      EXPECT_EQ(got[i][0].text, expected) << problems[i].name;
      EXPECT_EQ(got[i][1].text, expected) << problems[i].name;
      EXPECT_TRUE(got[i][0].specialist.empty());
    }
  }
}

TEST(ModelCompletionsBatched, SampledCompletionsRepeatFromTheSeed) {
  test::single_threaded();
  auto m = micro_model(12);
  const auto problems = toy_problems();
  const auto s = spec(8, 0.8);
  ModelCompletions batched(m, code_tokenizer(), s);
  const auto got = all_completions(batched, problems, 3);
  // Alone, one at a time, and through the sequential loop: the same text per (problem, sample).
  ModelCompletions one_at_a_time(m, code_tokenizer(), spec(1, 0.8));
  EXPECT_EQ(all_completions(one_at_a_time, {problems[1], problems[3]}, 3),
            (std::vector<std::vector<Completion>>{got[1], got[3]}));
  for (int j = 0; j < 3; ++j)
    EXPECT_EQ(got[2][static_cast<size_t>(j)].text, sequential(*m, &test::code512(), problems[2], s.sampling, j));
  EXPECT_NE(got[0][0].text, got[0][1].text);  // each sample its own seed
}

// slm serve with one specialist, on a free loopback port.
class ServerSource : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::single_threaded();
    model_ = micro_model(11);
    specialists_ = new server::Specialists();
    server::LoadOptions lo;
    lo.slots = 4;
    specialists_->add("alpha", model_, std::make_unique<data::Tokenizer>(code_tokenizer()), {"cmake"}, lo);
    server::ServerOptions so;
    so.port = 0;
    server_ = new server::Server(*specialists_, so);
    url_ = "http://127.0.0.1:" + std::to_string(server_->start());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete specialists_;
    model_.reset();
  }
  static ServerSpec server_spec(double temperature, int64_t max_tokens = 20) {
    ServerSpec s;
    s.url = url_;
    s.parallel = 4;
    s.sampling = spec(1, temperature, max_tokens).sampling;
    return s;
  }

  static inline std::shared_ptr<model::HybridLM> model_;
  static inline server::Specialists* specialists_ = nullptr;
  static inline server::Server* server_ = nullptr;
  static inline std::string url_;
};

// An independent path to the same tokens: the server's own engine, chat template and stop handling. The server sends
// the text cut before a stop sequence and with ill-formed UTF-8 replaced (JSON cannot carry it), so both are
// compared as the harness judges them.
TEST_F(ServerSource, GreedyCompletionsEqualTheInProcessSource) {
  const auto problems = with_stops_met(*model_, &test::code512(), toy_problems(), server_spec(0).sampling);
  ServerCompletions served(server_spec(0));
  ModelCompletions local(model_, code_tokenizer(), spec(4, 0.0));
  const auto got = all_completions(served, problems, 2), expected = all_completions(local, problems, 2);
  for (size_t i = 0; i < problems.size(); ++i) {
    ASSERT_EQ(got[i].size(), 2u);
    for (size_t j = 0; j < 2; ++j) {
      EXPECT_EQ(truncate_at_stop(got[i][j].text, problems[i].stop_tokens),
                data::replace_invalid_utf8(truncate_at_stop(expected[i][j].text, problems[i].stop_tokens)))
          << problems[i].name << " sample " << j;
      EXPECT_EQ(got[i][j].specialist, "alpha");
    }
  }
}

TEST_F(ServerSource, SampledCompletionsRepeatFromTheSeed) {
  const auto problems = toy_problems();
  ServerCompletions served(server_spec(0.8));
  const auto first = all_completions(served, problems, 3);
  EXPECT_EQ(all_completions(served, {problems[2]}, 3)[0], first[2]);
  EXPECT_NE(first[0][0].text, first[0][1].text);
}

TEST_F(ServerSource, TheHarnessJudgesNSamplesPerProblemAndCountsTheSpecialists) {
  const auto problems = toy_problems();
  ServerCompletions served(server_spec(0.8, 8));
  HumanEvalOptions o;
  o.n = 3;
  o.ks = {1, 3};
  o.jobs = 2;
  o.compile.pch = false;
  o.compile.syntax_only = true;  // the verdicts do not matter here, only that every sample is judged
  o.isolation = Isolation::kNone;
  o.results_path = test::write_temp("server_results.jsonl", "");
  const auto rep = run_humaneval("toy", problems, served, o);
  ASSERT_EQ(rep.problems.size(), problems.size());
  for (const auto& p : rep.problems) EXPECT_EQ(p.samples.size(), 3u) << p.name;
  EXPECT_EQ(rep.samples, 12);
  EXPECT_EQ(rep.specialists, (std::map<std::string, int>{{"alpha", 12}}));
  EXPECT_EQ(rep.summary_json()["specialists"]["alpha"], 12);
  EXPECT_NE(rep.table().find("answered by: alpha 12 samples"), std::string::npos) << rep.table();
  EXPECT_NE(rep.source.find(url_), std::string::npos);
  std::ifstream in(o.results_path);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines)
    for (const auto& s : nlohmann::json::parse(line)["samples"]) EXPECT_EQ(s["specialist"], "alpha");
  EXPECT_EQ(lines, 4);
}

TEST_F(ServerSource, RefusalsAndADeadServerGiveClearErrors) {
  auto spec_with = [](auto change) {
    auto s = server_spec(0);
    change(s);
    return s;
  };
  std::string m = test::error_of([&] { ServerCompletions(spec_with([](ServerSpec& s) { s.model = "gamma"; })); });
  EXPECT_NE(m.find(url_ + ": the server has no model \"gamma\""), std::string::npos) << m;
  EXPECT_NE(m.find("alpha"), std::string::npos) << m;
  m = test::error_of([&] { ServerCompletions(spec_with([](ServerSpec& s) { s.sampling.top_k = 40; })); });
  EXPECT_NE(m.find("--top-k"), std::string::npos) << m;
  // A 400 from the server: the prompt plus max_tokens past the model's context.
  ServerCompletions too_long(spec_with([](ServerSpec& s) { s.sampling.max_tokens = 5000; }));
  m = test::error_of([&] { too_long.complete(toy_problems()[0], 1); });
  EXPECT_NE(m.find(url_ + "/v1/completions (toy_0, sample 0): HTTP 400: "), std::string::npos) << m;
  EXPECT_NE(m.find("exceeds the model's context"), std::string::npos) << m;

  // A port nobody listens on: bound, then closed.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  const std::string dead = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  m = test::error_of([&] { ServerCompletions(spec_with([&](ServerSpec& s) { s.url = dead; })); });
  EXPECT_NE(m.find(dead + ": no answer from the server"), std::string::npos) << m;
  m = test::error_of([&] { ServerCompletions(spec_with([](ServerSpec& s) { s.url = "127.0.0.1:8000"; })); });
  EXPECT_NE(m.find("not a server URL"), std::string::npos) << m;
}

// A stand-in server: busy (503, Retry-After: 1) for the first requests, then one fixed answer; a 500 for one prompt.
TEST(ServerCompletionsRetry, A503IsRetriedAfterItsRetryAfterAndA500Fails) {
  httplib::Server fake;
  std::atomic<int> posts{0};
  fake.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"object": "list", "data": [{"id": "auto"}]})", "application/json");
  });
  fake.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    const auto j = nlohmann::json::parse(req.body);
    if (j["prompt"] == "broken") {
      res.status = 500;
      res.set_content(R"({"error": {"message": "generation failed: out of memory"}})", "application/json");
    } else if (posts++ < 2) {
      res.status = 503;
      res.set_header("Retry-After", "1");
      res.set_content(R"({"error": {"message": "busy"}})", "application/json");
    } else {
      EXPECT_EQ(j["stop"].size(), kMaxRequestStops);
      res.set_header("X-SLM-Specialist", "beta");
      res.set_content(R"({"choices": [{"text": "  return 1;\n}"}]})", "application/json");
    }
  });
  const int port = fake.bind_to_any_port("127.0.0.1");
  std::thread listener([&] { fake.listen_after_bind(); });
  ServerSpec s;
  s.url = "http://127.0.0.1:" + std::to_string(port);
  s.parallel = 1;
  ServerCompletions source(s);
  auto problem = toy_problems()[0];
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(source.complete(problem, 1), (std::vector<Completion>{{"  return 1;\n}", "beta"}}));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1900));  // two waits of 1 s
  problem.prompt = "broken";
  const std::string m = test::error_of([&] { source.complete(problem, 1); });
  EXPECT_NE(m.find("HTTP 500: generation failed: out of memory"), std::string::npos) << m;
  posts = -100;  // busy from now on: the retries run out
  s.retries = 1;
  problem = toy_problems()[0];
  ServerCompletions impatient(s);
  EXPECT_NE(test::error_of([&] { impatient.complete(problem, 1); }).find("HTTP 503: busy (still busy after 1 retries)"),
            std::string::npos);
  fake.stop();
  listener.join();
}

}  // namespace
}  // namespace slm::eval
