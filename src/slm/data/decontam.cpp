#include "slm/data/decontam.h"

#include <fstream>
#include <unordered_set>
#include <nlohmann/json.hpp>

#include "slm/data/dedup.h"
#include "slm/data/hashing.h"
#include "slm/util/error.h"

namespace slm::data {

namespace {

// Rolling n-gram hashes over token hashes: h = sum t_k * B^(n-1-k) (mod 2^64), then mixed.
std::vector<uint64_t> ngram_hashes(const std::vector<uint64_t>& toks, int n) {
  std::vector<uint64_t> out;
  const auto N = static_cast<size_t>(n);
  if (toks.size() < N) return out;
  constexpr uint64_t kBase = 0x100000001b3ULL;
  uint64_t pow = 1;
  for (size_t i = 1; i < N; ++i) pow *= kBase;
  uint64_t h = 0;
  for (size_t i = 0; i < N; ++i) h = h * kBase + toks[i];
  out.push_back(mix64(h));
  for (size_t i = N; i < toks.size(); ++i) {
    h = (h - toks[i - N] * pow) * kBase + toks[i];
    out.push_back(mix64(h));
  }
  return out;
}

std::string strip_boilerplate(const std::string& code) {
  std::string out;
  size_t p = 0;
  while (p < code.size()) {
    size_t e = code.find('\n', p);
    if (e == std::string::npos) e = code.size();
    std::string_view line(code.data() + p, e - p);
    size_t f = line.find_first_not_of(" \t");
    bool skip = f != std::string_view::npos &&
                (line[f] == '#' || line.substr(f).starts_with("using namespace"));
    if (!skip) {
      out.append(line);
      out += '\n';
    }
    p = e + 1;
  }
  return out;
}

// Tokens of `text` in the order code_token_hashes sees them, as views (to tell informative words apart).
std::vector<std::string_view> code_tokens(std::string_view text) {
  std::vector<std::string_view> out;
  auto word = [](unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; };
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      ++i;
      continue;
    }
    size_t j = i + 1;
    if (word(c))
      while (j < text.size() && word(static_cast<unsigned char>(text[j]))) ++j;
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

bool informative(std::string_view t) {
  static const std::unordered_set<std::string_view> common = {
      "std", "vector", "string", "map", "tuple", "optional", "pair", "int", "long", "float", "double", "bool",
      "char", "auto", "return", "const", "void", "size_t", "true", "false", "assert", "candidate", "main",
      "for", "while", "if", "else", "nullopt", "make_tuple", "make_pair", "unsigned", "size", "push_back",
      "begin", "end", "the", "and", "of", "to", "is", "in", "a", "an"};
  if (t.size() < 3) return false;
  const auto c = static_cast<unsigned char>(t[0]);
  if (!(std::isalpha(c) || c == '_' || c >= 0x80)) return false;
  return !common.count(t);
}

}  // namespace

std::vector<EvalProblem> load_eval_problems(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read evaluation problems");
  std::vector<EvalProblem> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    try {
      auto j = nlohmann::json::parse(line);
      EvalProblem p;
      p.name = j.value("name", "line" + std::to_string(lineno));
      p.text = j.value("prompt", "") + "\n" + j.value("tests", "");
      out.push_back(std::move(p));
    } catch (const nlohmann::json::exception& e) {
      throw Error(path + ":" + std::to_string(lineno) + ": not a JSON problem: " + e.what());
    }
  }
  if (out.empty()) throw Error(path + ": no evaluation problems");
  return out;
}

Decontaminator::Decontaminator(const std::vector<EvalProblem>& problems, int ngram, int min_informative)
    : n_(ngram) {
  if (ngram < 4) throw Error("decontamination: n-gram length must be at least 4");
  for (size_t i = 0; i < problems.size(); ++i) {
    names_.push_back(problems[i].name);
    const std::string text = strip_boilerplate(problems[i].text);
    const auto toks = code_tokens(text);
    const auto hashes = ngram_hashes(code_token_hashes(text), n_);
    // Sliding count of informative tokens per n-gram.
    int count = 0;
    for (size_t t = 0; t < toks.size(); ++t) {
      count += informative(toks[t]);
      if (t >= static_cast<size_t>(n_)) count -= informative(toks[t - n_]);
      if (t + 1 >= static_cast<size_t>(n_) && count >= min_informative)
        grams_.emplace(hashes[t + 1 - n_], static_cast<uint32_t>(i));
    }
  }
}

Decontaminator::Hit Decontaminator::check(std::string_view text) const {
  Hit hit;
  for (uint64_t h : ngram_hashes(code_token_hashes(text), n_)) {
    auto it = grams_.find(h);
    if (it == grams_.end()) continue;
    if (!hit.contaminated) hit.problem = names_[it->second];
    hit.contaminated = true;
    ++hit.matches;
  }
  return hit;
}

}  // namespace slm::data
