#pragma once
#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace slm::test {

// rm -rf. (Not std::filesystem::remove_all: the torch wheel's libtorch.so exports its own copy of some
// std::filesystem functions, and calling its remove_all crashes.)
inline void remove_tree(const std::string& path) {
  nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

// A fresh, empty directory under the test temp dir, unique per test case and process: two runs of one test at the
// same time (two ctest runs, two clones' CI on one machine) must not share it. The directories of this test case
// that earlier processes left (their process is gone) are removed, so that repeated runs do not fill the disk.
inline std::string fresh_dir(const std::string& tag) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string base = "slm_data_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + tag + "_";
  const std::string tmp = testing::TempDir();
  if (DIR* d = ::opendir(tmp.c_str())) {  // POSIX, not std::filesystem (remove_tree's comment)
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind(base, 0) != 0 || name.find_first_not_of("0123456789", base.size()) != std::string::npos) continue;
      const long pid = std::atol(name.c_str() + base.size());
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) remove_tree(tmp + "/" + name);
    }
    ::closedir(d);
  }
  std::filesystem::path p = std::filesystem::path(tmp) / (base + std::to_string(::getpid()));
  remove_tree(p.string());
  std::filesystem::create_directories(p);
  return p.string();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// A C++-looking file of `lines` functions with random names: distinct files share almost no shingles.
inline std::string random_code(uint64_t seed, int lines = 40) {
  std::mt19937_64 rng(seed);
  auto ident = [&] {
    std::string s;
    for (int i = 0; i < 8; ++i) s += static_cast<char>('a' + rng() % 26);
    return s;
  };
  std::string out = "#include <vector>\n\n";
  for (int i = 0; i < lines; ++i)
    out += "int " + ident() + "(int " + ident() + ") { return " + ident() + " * " + std::to_string(rng() % 1000) +
           " + " + ident() + "; }\n";
  return out;
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace slm::test
