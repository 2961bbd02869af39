#pragma once
// Shared by the fuzz targets (fuzz/README.md): a private scratch directory for parsers that read files, and the
// rule every target follows: the library's documented error for bad input (slm::Error; ApiError for requests) is an
// expected outcome, anything else escaping a parser (a nlohmann or std exception, a crash, a leak, UB) is a bug,
// which libFuzzer reports as a crash ("deadly signal" after an uncaught exception).
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include "slm/util/files.h"

namespace slm::fuzz {

// One directory per fuzzing process, under $TMPDIR (/dev/shm when writable: no disk writes), removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    if (const char* t = std::getenv("TMPDIR"); t && *t) base = t;
    std::string tmpl = base + "/slm-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
      std::perror("slm fuzz: mkdtemp");
      std::abort();
    }
    static std::string keep = tmpl;
    // slm::remove_tree, not std::filesystem::remove_all: libtorch exports its own std::filesystem (util/files.h).
    std::atexit([] { slm::remove_tree(keep); });
    return tmpl;
  }();
  return dir;
}

// Writes bytes to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (bytes.size() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) || std::fclose(f) != 0) {
    std::perror(("slm fuzz: writing " + path).c_str());
    std::abort();
  }
  return path;
}

// Empties scratch_dir()/name (a directory the parser writes into) and returns its path.
inline std::string fresh_scratch_dir(const std::string& name) {
  const std::string path = scratch_dir() + "/" + name;
  slm::remove_tree(path);
  return path;
}

// The expected error of a rejected input, printed when SLM_FUZZ_VERBOSE is set (to see why a seed is refused).
inline void rejected(const std::exception& e) {
  static const bool verbose = std::getenv("SLM_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "rejected: %s\n", e.what());
}

// Splits "A<sep>B" at the first separator: a target whose parser reads two files (a shard and its sidecar) takes
// both from one input.
inline std::pair<std::string_view, std::string_view> split_input(std::string_view in, std::string_view sep) {
  const size_t at = in.find(sep);
  if (at == std::string_view::npos) return {in, {}};
  return {in.substr(0, at), in.substr(at + sep.size())};
}

}  // namespace slm::fuzz
