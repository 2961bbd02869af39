// Packs (data/pack.cpp), as `slm train --data X.slmpack` reads one: the header, then every member decompressed,
// checked against its size and SHA-256 and written under a fresh directory. Bad input must be refused with
// slm::Error, and nothing may be written outside that directory.
#include <dirent.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <string_view>

#include "fuzz_util.h"
#include "slm/data/pack.h"
#include "slm/util/error.h"

namespace {
std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) out.insert(e->d_name);
    ::closedir(d);
  }
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      slm::fuzz::write_scratch("p.slmpack", std::string_view(reinterpret_cast<const char*>(data), size));
  const std::string dest = slm::fuzz::fresh_scratch_dir("out");
  try {
    const slm::data::PackHeader h = slm::data::read_pack_header(path);
    slm::data::extract_pack(path, dest);
    std::map<std::string, uint64_t> bytes;  // the last member of a name wins
    for (const auto& m : h.members) bytes[m.name] = m.bytes;
    for (const auto& [name, n] : bytes) {
      struct stat st {};
      if (::stat((dest + "/" + name).c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != n) std::abort();
    }
  } catch (const slm::Error& e) {
    slm::fuzz::rejected(e);
  }
  auto left = entries(slm::fuzz::scratch_dir());
  left.erase("out");
  if (left != std::set<std::string>{".", "..", "p.slmpack"}) std::abort();
  return 0;
}
