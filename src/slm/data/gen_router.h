#pragma once
// The orchestration corpus: the router's training data. Each example is a request made from one document of
// another domain and labelled with that domain:
//   1. a window of the document: whole lines, starting at a line picked by a hash of (path, k), grown until it
//      holds min_window bytes (capped at max_window; a shorter document is taken whole). For debug documents the
//      window comes from the tool output (even k) or the program (odd k); for review documents from the code
//      excerpt, without its line numbers.
//   2. an instruction, half of the time one that names the task of the domain ("Fix this ASan error:",
//      "Write CMake for ...") and half of the time a generic one ("Can you take a look at this?") shared by
//      all domains, so the label must be read from the content and not only from the wording;
//   3. instruction and window joined (instruction first or last, by hash).
// Balance: in every held-out split each domain contributes the same number of requests: the smallest domain's
// capacity (documents x max_windows_per_doc), capped at max_per_domain. The train split does too with balance_train;
// without it each domain keeps its own capacity (capped), so the large domains are not cut to the smallest one's few
// hundred requests, and the trainer weights the labels by inverse frequency instead (router/train.h).
// Split: a request is in its source document's split.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "slm/data/generated.h"

namespace slm::data {

struct RouterSource {
  std::string domain, split;
  DocumentMeta meta;
  std::string text;
};

struct RouterOptions {
  uint64_t max_per_domain = 4000;  // per split, per domain (validation/test are bounded by their documents)
  int max_windows_per_doc = 4;
  size_t min_window = 240, max_window = 1600;
  bool balance_train = true;
};

std::vector<GeneratedDoc> make_router_requests(const std::vector<RouterSource>& sources, const RouterOptions& o);

// The same requests from sources offered one at a time: per (split, domain) it keeps the count offered and the
// max_per_domain sources of lowest hash, the only ones make_router_requests ever cuts windows from, so a corpus
// build need not hold every document in memory. Offer order breaks hash ties as the index order does above.
class RouterSampler {
 public:
  explicit RouterSampler(RouterOptions o) : o_(o) {}
  void offer(const RouterSource& s);
  std::vector<GeneratedDoc> requests() const;

 private:
  struct Kept {
    uint64_t hash, seq;
    RouterSource source;
  };
  struct Group {
    uint64_t offered = 0;
    std::vector<Kept> heap;  // a max-heap on (hash, seq): its top is the first to give way
  };
  RouterOptions o_;
  uint64_t seq_ = 0;
  std::map<std::string, std::map<std::string, Group>> groups_;  // split -> domain
};

// One request (exposed for tests): window k of a source document with its instruction.
std::string router_request(const RouterSource& s, int k, const RouterOptions& o);

}  // namespace slm::data
