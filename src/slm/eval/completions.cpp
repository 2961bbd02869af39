#include "slm/eval/completions.h"

#include <condition_variable>
#include <cstdio>
#include <exception>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "slm/data/hashing.h"
#include "slm/util/error.h"

namespace slm::eval {

std::string prompt_tail(const std::string& prompt, size_t max_bytes) {
  if (max_bytes == 0 || prompt.size() <= max_bytes) return prompt;
  const size_t from = prompt.size() - max_bytes;
  if (prompt[from - 1] == '\n') return prompt.substr(from);
  const size_t newline = prompt.find('\n', from);
  // A prompt whose last max_bytes hold no line start: its last max_bytes.
  return newline == std::string::npos || newline + 1 == prompt.size() ? prompt.substr(from)
                                                                      : prompt.substr(newline + 1);
}

uint64_t sample_seed(uint64_t seed, const Problem& problem, int j) {
  return data::hash64(problem.name + "#" + std::to_string(j), seed);
}

std::string describe_sampling(const SamplingSpec& s) {
  char buf[160];
  if (s.temperature == 0)
    std::snprintf(buf, sizeof buf, "greedy, up to %lld tokens", static_cast<long long>(s.max_tokens));
  else
    std::snprintf(buf, sizeof buf, "temperature %g, top-p %g%s, seed %llu, up to %lld tokens", s.temperature, s.top_p,
                  s.top_k > 0 ? (", top-k " + std::to_string(s.top_k)).c_str() : "",
                  static_cast<unsigned long long>(s.seed), static_cast<long long>(s.max_tokens));
  return buf;
}

std::vector<Completion> CompletionSource::complete(const Problem& problem, int n) {
  std::vector<Completion> out;
  complete(std::vector<Problem>{problem}, n, [&](size_t, std::vector<Completion> c) {
    out = std::move(c);
    return true;
  });
  return out;
}

void complete_concurrently(const std::vector<Problem>& problems, int n, int parallel,
                           const std::function<Completion(size_t, int)>& sample, const DeliverFn& deliver) {
  if (parallel < 1) throw Error("parallel requests must be at least 1 (got " + std::to_string(parallel) + ")");
  if (n < 1 || problems.empty()) return;
  const size_t total = problems.size() * static_cast<size_t>(n);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<Completion>> done(problems.size(), std::vector<Completion>(static_cast<size_t>(n)));
  std::vector<int> remaining(problems.size(), n);
  size_t next = 0;
  bool stop = false;
  std::exception_ptr failure;
  auto work = [&] {
    for (;;) {
      size_t task;
      {
        std::lock_guard lock(mu);
        if (stop || failure || next == total) return;
        task = next++;
      }
      const size_t pi = task / static_cast<size_t>(n);
      const int j = static_cast<int>(task % static_cast<size_t>(n));
      try {
        Completion c = sample(pi, j);
        std::lock_guard lock(mu);
        done[pi][static_cast<size_t>(j)] = std::move(c);
        if (--remaining[pi] == 0) cv.notify_all();
      } catch (...) {
        std::lock_guard lock(mu);
        if (!failure) failure = std::current_exception();
        cv.notify_all();
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < std::min(total, static_cast<size_t>(parallel)); ++t) threads.emplace_back(work);
  auto join = [&] {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    for (auto& t : threads) t.join();
  };
  try {
    for (size_t pi = 0; pi < problems.size(); ++pi) {
      std::vector<Completion> ready;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return remaining[pi] == 0 || failure; });
        if (failure) break;
        ready = std::move(done[pi]);
      }
      if (!deliver(pi, std::move(ready))) break;
    }
  } catch (...) {
    join();
    throw;
  }
  join();
  if (failure) std::rethrow_exception(failure);
}

CompletionsFile::CompletionsFile(const std::string& path, const std::vector<Problem>& problems) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the completions file");
  std::set<std::string> known;
  for (const auto& p : problems) known.insert(p.name);
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw Error(where + ": not a JSON value (one completion object per line)");
    if (!j.is_object()) throw Error(where + ": expected a JSON object");
    const char* id_key = j.contains("task_id") ? "task_id" : "name";
    if (!j.contains(id_key) || !j[id_key].is_string())
      throw Error(where + ": needs a string \"task_id\" (or \"name\") naming the problem");
    if (!j.contains("completion") || !j["completion"].is_string())
      throw Error(where + ": needs a string \"completion\"");
    const auto task = j[id_key].get<std::string>();
    if (!known.count(task)) throw Error(where + ": task \"" + task + "\" is not in the problem file");
    by_task_[task].push_back(j["completion"].get<std::string>());
    ++lines_;
  }
  if (lines_ == 0) throw Error(path + ": no completions in the file");
}

std::string CompletionsFile::describe() const {
  return path_ + " (" + std::to_string(lines_) + " completions of " + std::to_string(by_task_.size()) + " problems)";
}

int CompletionsFile::count(const Problem& problem, int) const {
  const auto it = by_task_.find(problem.name);
  return it == by_task_.end() ? 0 : static_cast<int>(it->second.size());
}

void CompletionsFile::complete(const std::vector<Problem>& problems, int, const DeliverFn& deliver) {
  for (size_t pi = 0; pi < problems.size(); ++pi) {
    const auto it = by_task_.find(problems[pi].name);
    if (it == by_task_.end()) continue;
    std::vector<Completion> out;
    for (const auto& text : it->second) out.push_back({text, ""});
    if (!deliver(pi, std::move(out))) return;
  }
}

}  // namespace slm::eval
