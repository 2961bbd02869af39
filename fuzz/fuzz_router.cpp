// Router model files (router/classifier.cpp), as `slm serve` loads models/router.bin. The file ends in a 64-bit
// checksum of every byte before it, which random mutations would never match, so the input is the file without
// its checksum and the harness appends the right one (a wrong checksum is one comparison, tried by the corpus).
// Bad input must be refused with slm::Error; a model that loads must classify.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz_util.h"
#include "slm/data/hashing.h"
#include "slm/router/classifier.h"
#include "slm/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  const uint64_t sum = slm::data::hash64(bytes, 0x726f75746572ULL);  // classifier.cpp's kChecksumSeed
  bytes.append(reinterpret_cast<const char*>(&sum), sizeof sum);
  const std::string path = slm::fuzz::write_scratch("router.bin", bytes);
  try {
    const slm::router::Classifier c = slm::router::Classifier::load(path);
    const auto p = c.classify("How do I add a library to a CMake target?\n  target_link_libraries(app PRIVATE m)");
    if (p.size() != c.classes()) std::abort();
    (void)slm::router::top_k(p, 2);
  } catch (const slm::Error& e) {
    slm::fuzz::rejected(e);
  }
  return 0;
}
