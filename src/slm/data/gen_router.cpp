#include "slm/data/gen_router.h"

#include <algorithm>
#include <map>
#include <set>

#include "slm/data/hashing.h"

namespace slm::data {

namespace {

const std::vector<std::string>& generic_instructions() {
  static const std::vector<std::string> g = {"Can you take a look at this?",
                                             "Help me with this:",
                                             "What's going on here?",
                                             "I need help with the following.",
                                             "Please look at this and tell me what to do.",
                                             "Thoughts on this?",
                                             "I'm stuck on this, any idea?",
                                             "Here is what I have so far:"};
  return g;
}

std::vector<std::string> domain_instructions(const std::string& domain, const std::string& window) {
  if (domain == "cpp")
    return {"Explain what this C++ code does.",         "Can you refactor this for readability?",
            "Write unit tests for this code.",          "Is there a way to make this faster?",
            "Add documentation comments to this code:", "How would I use this API?"};
  if (domain == "cmake")
    return {"Write CMake for a project that uses this.", "Explain what this CMake code does.",
            "Why would this fail to configure?", "Convert this to modern target-based CMake.",
            "How do I use this from my CMakeLists.txt?"};
  if (domain == "shell")
    return {"What does this script do?", "Make this shell script more robust.",
            "Explain this shell snippet line by line.", "Port this to POSIX sh.",
            "Why does this script fail when a path contains spaces?"};
  if (domain == "debug") {
    if (window.find("AddressSanitizer") != std::string::npos)
      return {"Fix this ASan error:", "ASan reports this, what is wrong?"};
    if (window.find("ThreadSanitizer") != std::string::npos)
      return {"Fix this data race report:", "TSan says this, how do I fix it?"};
    if (window.find("runtime error:") != std::string::npos)
      return {"UBSan reports this; what's wrong?", "Fix this undefined behaviour:"};
    if (window.find("SIGSEGV") != std::string::npos || window.find("SIGABRT") != std::string::npos)
      return {"My program crashes; here is the gdb backtrace.", "Help me debug this crash:"};
    if (window.find("error:") != std::string::npos) return {"Why does this not compile?", "Fix this compiler error:"};
    if (window.find("uninitialised") != std::string::npos) return {"valgrind complains about this, why?"};
    return {"This program misbehaves at run time. Find the bug:", "Debug this:",
            "Where is the memory bug in this program?"};
  }
  if (domain == "review")
    return {"Review this code.", "What would clang-tidy complain about here?",
            "Apply the clang-tidy suggestions to this:", "Any bugs or style problems in this?",
            "Please do a code review of this change."};
  if (domain == "design")
    return {"Summarize this documentation.", "How do I use this, according to its documentation?",
            "Explain this section of the manual:", "Write a short design note based on this:",
            "What are the options here?"};
  if (domain == "algorithm")
    return {"What is the time complexity of this algorithm?", "Explain how this algorithm works.",
            "Implement this more efficiently.", "Which standard algorithm does this correspond to?",
            "Prove this algorithm correct or find a counterexample."};
  return {};
}

// The text a window is cut from: debug documents offer their tool output (even k) or their program (odd k);
// review documents their code excerpt without the "NN | " line numbers; others the whole document.
std::string window_source(const RouterSource& s, int k) {
  auto fenced = [&](const std::string& open) -> std::string {
    const size_t a = s.text.find(open);
    if (a == std::string::npos) return "";
    const size_t b = s.text.find("\n```", a + open.size());
    return s.text.substr(a + open.size(), (b == std::string::npos ? s.text.size() : b + 1) - a - open.size());
  };
  if (s.domain == "debug") {
    std::string part = fenced(k % 2 == 0 ? "```console\n" : "```cpp\n");
    return part.empty() ? s.text : part;
  }
  if (s.domain == "review") {
    const std::string code = fenced("```cpp\n");
    if (code.empty()) return s.text;
    std::string out;
    size_t start = 0;
    while (start < code.size()) {
      size_t end = code.find('\n', start);
      if (end == std::string::npos) end = code.size();
      const std::string line = code.substr(start, end - start);
      const size_t bar = line.find(" | ");
      out += (bar != std::string::npos ? line.substr(bar + 3) : line) + "\n";
      start = end + 1;
    }
    return out;
  }
  return s.text;
}

}  // namespace

std::string router_request(const RouterSource& s, int k, const RouterOptions& o) {
  const std::string src = window_source(s, k);
  const uint64_t key = hash64(s.meta.package + "\n" + s.meta.path + "\n" + std::to_string(k), 0x726f75746572ULL);
  std::vector<size_t> starts = {0};
  for (size_t i = 0; i + 1 < src.size(); ++i)
    if (src[i] == '\n') starts.push_back(i + 1);
  std::string window;
  if (src.size() <= o.min_window) {
    window = src;
  } else {
    // Start early enough that the window can still reach min_window bytes.
    size_t last_ok = 0;
    for (size_t i = 0; i < starts.size(); ++i)
      if (src.size() - starts[i] >= o.min_window) last_ok = i;
    const size_t first = starts[mix64(key) % (last_ok + 1)];
    size_t end = first;
    while (end < src.size() && end - first < o.min_window) {
      const size_t nl = src.find('\n', end);
      end = nl == std::string::npos ? src.size() : nl + 1;
    }
    window = src.substr(first, std::min(end - first, o.max_window));
  }
  while (!window.empty() && (window.back() == '\n' || window.back() == ' ')) window.pop_back();
  const bool generic = (mix64(key ^ 1) & 1) != 0;
  const auto specific = domain_instructions(s.domain, window);
  const auto& pool = generic || specific.empty() ? generic_instructions() : specific;
  const std::string& instruction = pool[mix64(key ^ 2) % pool.size()];
  return (mix64(key ^ 3) % 4 == 0) ? window + "\n\n" + instruction : instruction + "\n\n" + window;
}

namespace {
bool before(uint64_t ha, uint64_t sa, uint64_t hb, uint64_t sb) {
  return ha != hb ? ha < hb : sa < sb;
}
}  // namespace

void RouterSampler::offer(const RouterSource& s) {
  const uint64_t h = hash64(s.meta.package + "\n" + s.meta.path, 0x726f7574ULL), seq = seq_++;
  Group& g = groups_[s.split][s.domain];
  ++g.offered;
  auto cmp = [](const Kept& a, const Kept& b) { return before(a.hash, a.seq, b.hash, b.seq); };
  if (g.heap.size() < o_.max_per_domain) {
    g.heap.push_back({h, seq, s});
    std::push_heap(g.heap.begin(), g.heap.end(), cmp);
  } else if (!g.heap.empty() && before(h, seq, g.heap.front().hash, g.heap.front().seq)) {
    std::pop_heap(g.heap.begin(), g.heap.end(), cmp);
    g.heap.back() = {h, seq, s};
    std::push_heap(g.heap.begin(), g.heap.end(), cmp);
  }
}

std::vector<GeneratedDoc> RouterSampler::requests() const {
  std::vector<GeneratedDoc> out;
  for (const auto& [split, by_domain] : groups_) {
    uint64_t smallest = o_.max_per_domain;
    for (const auto& [domain, g] : by_domain)
      smallest = std::min<uint64_t>(smallest, g.offered * static_cast<uint64_t>(o_.max_windows_per_doc));
    for (const auto& [domain, g] : by_domain) {
      const uint64_t per_domain =
          split == "train" && !o_.balance_train
              ? std::min<uint64_t>(o_.max_per_domain, g.offered * static_cast<uint64_t>(o_.max_windows_per_doc))
              : smallest;
      // The kept sources in hash order (a deterministic sample, spread over packages); round-robin over them:
      // window 0 of every document, then window 1, ... until the quota is met.
      std::vector<const Kept*> idx;
      for (const auto& k : g.heap) idx.push_back(&k);
      std::sort(idx.begin(), idx.end(),
                [](const Kept* a, const Kept* b) { return before(a->hash, a->seq, b->hash, b->seq); });
      uint64_t made = 0;
      for (int k = 0; k < o_.max_windows_per_doc && made < per_domain; ++k)
        for (size_t n = 0; n < idx.size() && made < per_domain; ++n, ++made) {
          const auto& s = idx[n]->source;
          GeneratedDoc d;
          d.meta = {s.meta.package, s.meta.path, s.meta.license, "orchestration"};
          d.text = router_request(s, k, o_);
          d.split = split;
          d.extra = {{"label", domain}, {"window", k}};
          out.push_back(std::move(d));
        }
    }
  }
  return out;
}

std::vector<GeneratedDoc> make_router_requests(const std::vector<RouterSource>& sources, const RouterOptions& o) {
  RouterSampler sampler(o);
  for (const auto& s : sources) sampler.offer(s);
  return sampler.requests();
}

}  // namespace slm::data
