// Encoding speed of the code tokenizer on one thread: sentencepiece's own encoder against the library's
// encoder (Tokenizer::encode, the exact fast BPE of bpe_encoder.h), on the same documents read once into memory.
//   tokenizer_bench [--model M] [--mb N] [inputs...]
// Defaults: tokenizer/slm-code-32k.model, 24 MB of out/corpus-v1/cpp/train.jsonl (files, directories and corpus
// .jsonl files are accepted, as by `slm tokenizer train`). Each document is encoded by one call, as
// `slm data shard` does. Reports MB/s by wall clock and by the thread's CPU time (the machine may be shared), and
// checks that every variant's ids equal sentencepiece's.
#include <sentencepiece_processor.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "slm/data/text.h"
#include "slm/data/tokenizer.h"

namespace {

double thread_cpu_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Timing {
  double wall_s, cpu_s;
};

Timing timed(const std::function<void()>& fn) {
  const auto w0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_s();
  fn();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count(), thread_cpu_s() - c0};
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = std::string(SLM_SOURCE_DIR) + "/tokenizer/slm-code-32k.model";
  double mb = 24;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc)
      model = argv[++i];
    else if (!std::strcmp(argv[i], "--mb") && i + 1 < argc)
      mb = std::stod(argv[++i]);
    else
      inputs.push_back(argv[i]);
  }
  if (inputs.empty()) inputs.push_back(std::string(SLM_SOURCE_DIR) + "/out/corpus-v1/cpp/train.jsonl");

  // Documents sentencepiece keeps intact (clean UTF-8 without U+2581), so that its ids are the reference as is.
  std::vector<std::string> docs;
  size_t bytes = 0;
  slm::data::for_each_text_document(inputs, [&](const slm::data::TextDocument& d) {
    if (bytes >= mb * 1e6 || !slm::data::is_clean_text(d.text) || d.text.find("\xe2\x96\x81") != std::string::npos)
      return;
    bytes += d.text.size();
    docs.push_back(d.text);
  });
  std::printf("%s\n%zu documents, %.1f MB, one thread\n", model.c_str(), docs.size(), bytes / 1e6);

  sentencepiece::SentencePieceProcessor sp;
  if (!sp.Load(model).ok()) {
    std::fprintf(stderr, "%s: cannot load\n", model.c_str());
    return 1;
  }
  std::vector<std::vector<uint32_t>> reference(docs.size());
  auto report = [&](const char* what, Timing t, double base_cpu_s) {
    std::printf("%-46s %7.2f MB/s wall %7.2f MB/s cpu  x%.1f\n", what, bytes / 1e6 / t.wall_s, bytes / 1e6 / t.cpu_s,
                base_cpu_s / t.cpu_s);
  };
  auto mismatches = [&](const std::vector<std::vector<uint32_t>>& ids) {
    size_t n = 0;
    for (size_t i = 0; i < docs.size(); ++i) n += ids[i] != reference[i];
    return n;
  };

  const Timing plain = timed([&] {
    std::vector<int> ids;
    for (size_t i = 0; i < docs.size(); ++i) {
      sp.Encode(docs[i], &ids);
      reference[i].assign(ids.begin(), ids.end());
    }
  });
  report("sentencepiece Encode (EncodeAsIds)", plain, plain.cpu_s);

  // The library's encoder before the fast path: sentencepiece on pieces of <= 4000 bytes cut after a newline.
  std::vector<std::vector<uint32_t>> ids(docs.size());
  const Timing chunked = timed([&] {
    std::vector<int> part;
    for (size_t i = 0; i < docs.size(); ++i) {
      ids[i].clear();
      for (const auto& s : slm::data::split_sentences(docs[i], 4000)) {
        sp.Encode(s, &part);
        ids[i].insert(ids[i].end(), part.begin(), part.end());
      }
    }
  });
  report("sentencepiece on 4000-byte line pieces (old)", chunked, plain.cpu_s);
  std::printf("  documents whose ids differ from sentencepiece's: %zu\n", mismatches(ids));

  const auto tok = slm::data::Tokenizer::load(model);
  for (const char* pass : {"Tokenizer::encode, first pass (cold table)", "Tokenizer::encode, second pass"}) {
    const Timing fast = timed([&] {
      for (size_t i = 0; i < docs.size(); ++i) ids[i] = tok.encode(docs[i]);
    });
    report(pass, fast, plain.cpu_s);
    std::printf("  documents whose ids differ from sentencepiece's: %zu\n", mismatches(ids));
  }
  return 0;
}
