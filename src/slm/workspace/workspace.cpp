#include "slm/workspace/workspace.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "slm/data/text.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::workspace {

namespace fs = std::filesystem;

namespace {

struct Entry {
  int64_t mtime_ns = 0;
  uint64_t size = 0;
  std::shared_ptr<const data::ParsedFile> parsed;  // a C++ file (parsed or skipped)
  std::shared_ptr<const CMakeFile> cmake;          // a CMake file (null when skipped)
};

struct Seen {
  std::string rel;
  int64_t mtime_ns = 0;
  uint64_t size = 0;
};

// lstat: a symlink is reported as one, never followed.
bool stat_file(const std::string& path, int64_t& mtime_ns, uint64_t& size) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  size = static_cast<uint64_t>(st.st_size);
  return true;
}

std::shared_ptr<const data::ParsedFile> skipped(const std::string& rel, uint64_t size, std::string why) {
  auto p = std::make_shared<data::ParsedFile>();
  p->path = rel;
  p->bytes = size;
  p->skipped = std::move(why);
  return p;
}

}  // namespace

struct Workspace::State {
  mutable std::mutex mu;  // guards graph and status
  std::shared_ptr<const data::LinkedGraph> graph;
  std::shared_ptr<const CMakeIndex> cmake;
  WorkspaceStatus status;

  std::mutex refresh_mu;                 // one refresh at a time
  std::map<std::string, Entry> entries;  // by relative path: what the graph was linked from

  std::mutex wake_mu;
  std::condition_variable wake;
  bool stop = false, poked = false;
  std::thread thread;
};

Workspace::Workspace(const std::string& root, WorkspaceLimits limits, Log log)
    : limits_(limits), log_(std::move(log)), state_(std::make_unique<State>()) {
  // realpath(3), not std::filesystem::canonical: libtorch exports its own copies of some std::filesystem functions
  // (README, "Pitfalls").
  const std::string resolved = real_path(root);
  struct stat st {};
  if (resolved.empty() || ::stat(resolved.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error("--workspace: not a directory: " + root);
  root_ = resolved;
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  state_->status.root = root_;
}

Workspace::~Workspace() {
  {
    std::lock_guard<std::mutex> lock(state_->wake_mu);
    state_->stop = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

size_t Workspace::refresh() {
  State& s = *state_;
  std::lock_guard<std::mutex> one(s.refresh_mu);
  const auto t0 = std::chrono::steady_clock::now();

  // The C++ and CMake files under the root, without following symlinks or entering hidden directories.
  std::vector<Seen> seen;
  std::error_code ec;
  const fs::path root(root_);
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_symlink(ec)) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory(ec)) {
      if (!name.empty() && name[0] == '.') it.disable_recursion_pending();
      continue;
    }
    // The iterator's paths start with the root's: cut it off (fs::relative canonicalizes both paths, a stat of each
    // component of every file: 0.83 s of a poll of CMake's 9,662 files, bench/RESULTS.md).
    const std::string full = it->path().generic_string();
    if (full.size() <= root_.size() + 1) continue;
    const std::string rel = full.substr(root_.size() + 1);
    if (!(data::is_cpp_source_name(rel) || is_cmake_name(rel))) continue;
    Seen f{rel};
    if (stat_file(it->path().string(), f.mtime_ns, f.size)) seen.push_back(std::move(f));
  }
  std::sort(seen.begin(), seen.end(), [](const Seen& a, const Seen& b) { return a.rel < b.rel; });

  data::CallGraphOptions o;
  o.max_file_bytes = limits_.max_file_bytes;
  o.parse_ms_base = limits_.parse_ms_base;
  o.parse_ms_per_mb = limits_.parse_ms_per_mb;
  data::CppFileParser parser(o);
  std::map<std::string, Entry> next;
  size_t changed = 0;
  uint64_t files = 0, bytes = 0, pending = 0;  // files and bytes kept, C++ and CMake
  for (const Seen& f : seen) {
    auto old = s.entries.find(f.rel);
    if (old != s.entries.end() && old->second.mtime_ns == f.mtime_ns && old->second.size == f.size) {
      if (old->second.cmake || (old->second.parsed && old->second.parsed->skipped.empty())) {
        ++files;
        bytes += f.size;
      }
      next.emplace(f.rel, old->second);
      continue;
    }
    if (is_cmake_name(f.rel)) {  // small files, read whole: no parse budget
      Entry e{f.mtime_ns, f.size, nullptr, nullptr};
      std::string why;
      if (files >= limits_.max_files || bytes + f.size > limits_.max_bytes)
        why = "over the workspace's limits";
      else if (f.size > limits_.max_file_bytes)
        why = "larger than " + std::to_string(limits_.max_file_bytes) + " bytes";
      else
        try {
          e.cmake = std::make_shared<CMakeFile>(parse_cmake_file(f.rel, data::read_file_bytes(root_ + "/" + f.rel)));
          ++files;
          bytes += f.size;
        } catch (const Error&) {
          why = "cannot read";
        }
      if (!why.empty() && log_) log_("workspace " + root_ + ": " + f.rel + ": skipped: " + why);
      next.emplace(f.rel, std::move(e));
      ++changed;
      continue;
    }
    const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Entry e{f.mtime_ns, f.size, nullptr, nullptr};
    if (files >= limits_.max_files) {
      e.parsed =
          skipped(f.rel, f.size, "over the workspace's limit of " + std::to_string(limits_.max_files) + " files");
    } else if (bytes + f.size > limits_.max_bytes && f.size <= limits_.max_file_bytes) {
      e.parsed =
          skipped(f.rel, f.size, "over the workspace's limit of " + std::to_string(limits_.max_bytes) + " bytes");
    } else if (f.size > limits_.max_file_bytes) {
      e.parsed = skipped(f.rel, f.size, "larger than " + std::to_string(limits_.max_file_bytes) + " bytes");
    } else if (limits_.refresh_budget_s > 0 && spent > limits_.refresh_budget_s) {
      ++pending;  // the next refresh takes it (it is not in `next`, so it counts as new then)
      continue;
    } else {
      try {
        e.parsed = std::make_shared<data::ParsedFile>(parser.parse(f.rel, data::read_file_bytes(root_ + "/" + f.rel)));
      } catch (const Error&) {
        e.parsed = skipped(f.rel, f.size, "cannot read");
      }
    }
    if (!e.parsed->skipped.empty() && log_)
      log_("workspace " + root_ + ": " + f.rel + ": skipped: " + e.parsed->skipped);
    if (e.parsed->skipped.empty()) {
      ++files;
      bytes += f.size;
    }
    next.emplace(f.rel, std::move(e));
    ++changed;
  }
  for (const auto& [rel, e] : s.entries)
    if (!next.count(rel)) ++changed;  // removed (or left pending)

  std::shared_ptr<const data::LinkedGraph> linked;
  std::shared_ptr<const CMakeIndex> cmake;
  uint64_t cmake_skipped = 0;
  if (changed || !graph()) {
    std::vector<std::shared_ptr<const data::ParsedFile>> parsed;
    std::vector<std::shared_ptr<const CMakeFile>> cmake_files;
    for (const auto& [rel, e] : next)
      if (e.parsed)
        parsed.push_back(e.parsed);
      else if (e.cmake)
        cmake_files.push_back(e.cmake);
      else
        ++cmake_skipped;
    linked = std::make_shared<data::LinkedGraph>(std::move(parsed));
    cmake = std::make_shared<CMakeIndex>(std::move(cmake_files));
  }
  s.entries = std::move(next);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(s.mu);
  if (linked) {
    s.graph = linked;
    s.cmake = cmake;
    s.status.cmake_files = cmake->files().size();
    s.status.cmake_definitions = cmake->definitions();
    const auto& g = linked->graph();
    s.status.files = g.files;
    s.status.bytes = g.bytes;
    s.status.skipped = g.files_skipped + cmake_skipped;
    s.status.functions = g.functions.size();
  }
  s.status.pending = pending;
  s.status.ready = s.status.ready || pending == 0;
  ++s.status.refreshes;
  s.status.index_seconds += took;
  if (changed && log_) {
    char line[256];
    std::snprintf(line, sizeof line,
                  ": %zu files changed; %llu files (%.1f MiB), %llu functions, %llu CMake files (%llu definitions), "
                  "%llu skipped, %llu pending; %.2f s",
                  changed, static_cast<unsigned long long>(s.status.files), s.status.bytes / 1048576.0,
                  static_cast<unsigned long long>(s.status.functions),
                  static_cast<unsigned long long>(s.status.cmake_files),
                  static_cast<unsigned long long>(s.status.cmake_definitions),
                  static_cast<unsigned long long>(s.status.skipped), static_cast<unsigned long long>(pending), took);
    log_("workspace " + root_ + line);
  }
  return changed;
}

void Workspace::start(double poll_s) {
  State& s = *state_;
  if (s.thread.joinable()) return;
  s.thread = std::thread([this, poll_s] {
    State& st = *state_;
    for (;;) {
      try {
        refresh();
      } catch (const std::exception& e) {
        if (log_) log_("workspace " + root_ + ": indexing failed: " + e.what());
      }
      std::unique_lock<std::mutex> lock(st.wake_mu);
      // Pending files (over a refresh's time budget) go on at once.
      const bool more = status().pending > 0;
      st.wake.wait_for(lock, std::chrono::duration<double>(more ? 0.0 : poll_s), [&] { return st.stop || st.poked; });
      if (st.stop) return;
      st.poked = false;
    }
  });
}

void Workspace::poke() {
  {
    std::lock_guard<std::mutex> lock(state_->wake_mu);
    state_->poked = true;
  }
  state_->wake.notify_all();
}

std::shared_ptr<const data::LinkedGraph> Workspace::graph() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->graph;
}

std::shared_ptr<const CMakeIndex> Workspace::cmake() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->cmake;
}

WorkspaceStatus Workspace::status() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->status;
}

std::string Workspace::relative(const std::string& filename, std::string* why) const {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return std::string();
  };
  if (filename.empty()) return refuse("no file name");
  std::string rel;
  if (filename[0] == '/') {
    const fs::path p = fs::path(filename).lexically_normal();
    const std::string abs = p.generic_string();
    if (abs.compare(0, root_.size() + 1, root_ + "/") != 0) return refuse("outside the workspace " + root_);
    rel = abs.substr(root_.size() + 1);
  } else {
    rel = fs::path(filename).lexically_normal().generic_string();
  }
  // Every component must stay below the root and none may be a symlink (lstat each one that exists).
  std::string at = root_;
  size_t begin = 0;
  while (begin <= rel.size()) {
    const size_t end = std::min(rel.find('/', begin), rel.size());
    const std::string part = rel.substr(begin, end - begin);
    if (part == "..") return refuse("outside the workspace " + root_);
    if (part.empty() || part == ".") return refuse("not a file path: " + filename);
    at += "/" + part;
    struct stat st {};
    if (::lstat(at.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      return refuse("a symlink in the workspace (not followed): " + filename);
    begin = end + 1;
  }
  return rel;
}

}  // namespace slm::workspace
