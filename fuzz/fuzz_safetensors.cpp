// Safetensors files (io/safetensors.cpp), as `slm generate --checkpoint` and the trainer read them: the header and
// then the whole file. Bad input must be refused with slm::Error; a file that reads must give exactly the tensors
// its header describes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz_util.h"
#include "slm/io/safetensors.h"
#include "slm/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      slm::fuzz::write_scratch("model.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const slm::safetensors::Header h = slm::safetensors::read_header(path);
    const slm::safetensors::File f = slm::safetensors::load(path);
    if (f.tensors.size() != h.tensors.size() || f.metadata != h.metadata) std::abort();
    for (const auto& t : h.tensors) {
      const auto& x = f.tensors.at(t.name);
      if (x.scalar_type() != t.dtype || x.sizes().vec() != t.shape ||
          static_cast<uint64_t>(x.nbytes()) != t.end - t.begin)
        std::abort();
    }
  } catch (const slm::Error& e) {
    slm::fuzz::rejected(e);
  }
  return 0;
}
