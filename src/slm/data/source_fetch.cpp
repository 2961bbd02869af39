#include "slm/data/source_fetch.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "slm/data/corpus.h"
#include "slm/data/text.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/process.h"

namespace slm::data {

namespace {

std::string last_lines(const std::string& s, size_t n = 6) {
  size_t pos = s.size();
  for (size_t i = 0; i < n && pos > 0; ++i) {
    pos = s.rfind('\n', pos - 1);
    if (pos == std::string::npos) {
      pos = 0;
      break;
    }
  }
  std::string t = s.substr(pos);
  while (!t.empty() && (t.front() == '\n')) t.erase(0, 1);
  while (!t.empty() && (t.back() == '\n')) t.pop_back();
  return t;
}

// Regular files under dir (relative paths), depth first; symlinks and other special files are listed in `others`.
void walk(const std::string& dir, const std::string& rel, std::vector<std::string>& files,
          std::vector<std::string>& others, std::vector<std::string>& dirs) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + name, r = rel.empty() ? name : rel + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      walk(path, r, files, others, dirs);
      dirs.push_back(path);
    } else if (S_ISREG(st.st_mode)) {
      files.push_back(r);
    } else {
      others.push_back(path);
    }
  }
  ::closedir(d);
}

uint64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// What the corpora read from debian/: the package's identity and licenses, its history and its patches.
bool debian_file_kept(const std::string& rel) {
  return rel == "debian/control" || rel == "debian/copyright" || rel == "debian/changelog" ||
         rel == "debian/source/format" ||
         (rel.starts_with("debian/patches/") && rel.find('/', 15) == std::string::npos);
}

}  // namespace

// ---------------------------------------------------------------------------------------------- outcomes

nlohmann::json PackageOutcome::to_json() const {
  return {{"package", name},
          {"version", version},
          {"status", status},
          {"reason", reason},
          {"download_bytes", download_bytes},
          {"kept_files", kept_files},
          {"kept_bytes", kept_bytes},
          {"cpp_files", cpp_files},
          {"dropped_license_files", dropped_license_files},
          {"dropped_other_files", dropped_other_files},
          {"kept_licenses", kept_licenses},
          {"dropped_licenses", dropped_licenses}};
}

PackageOutcome PackageOutcome::from_json(const nlohmann::json& j) {
  PackageOutcome o;
  o.name = j.value("package", "");
  o.version = j.value("version", "");
  o.status = j.value("status", "");
  o.reason = j.value("reason", "");
  o.download_bytes = j.value("download_bytes", uint64_t{0});
  o.kept_files = j.value("kept_files", uint64_t{0});
  o.kept_bytes = j.value("kept_bytes", uint64_t{0});
  o.cpp_files = j.value("cpp_files", uint64_t{0});
  o.dropped_license_files = j.value("dropped_license_files", uint64_t{0});
  o.dropped_other_files = j.value("dropped_other_files", uint64_t{0});
  if (j.contains("kept_licenses")) o.kept_licenses = j["kept_licenses"].get<std::map<std::string, uint64_t>>();
  if (j.contains("dropped_licenses")) o.dropped_licenses = j["dropped_licenses"].get<std::map<std::string, uint64_t>>();
  return o;
}

std::string FetchSummary::table() const {
  std::ostringstream o;
  o << "| packages | fetched | rejected | unavailable | failed | done before | downloaded | kept files | kept | files "
       "dropped by license |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char dl[32], kb[32];
  std::snprintf(dl, sizeof dl, "%.1f MB", static_cast<double>(download_bytes) / 1e6);
  std::snprintf(kb, sizeof kb, "%.1f MB", static_cast<double>(kept_bytes) / 1e6);
  o << "| " << packages << " | " << ok << " | " << rejected << " | " << unavailable << " | " << failed << " | "
    << skipped << " | " << dl << " | " << kept_files << " | " << kb << " | " << dropped_license_files << " |\n";
  if (!dropped_licenses.empty()) {
    std::vector<std::pair<uint64_t, std::string>> top;
    for (const auto& [l, n] : dropped_licenses) top.emplace_back(n, l);
    std::sort(top.rbegin(), top.rend());
    o << "\nlicenses dropped (files):";
    for (size_t i = 0; i < top.size() && i < 12; ++i) o << (i ? ", " : " ") << top[i].second << " " << top[i].first;
    o << "\n";
  }
  return o.str();
}

// ---------------------------------------------------------------------------------------------- fetcher

SourceFetcher::SourceFetcher(FetchOptions options) : options_(std::move(options)) {
  if (options_.cache_dir.empty()) throw Error("data fetch: no cache directory");
  make_dirs(options_.cache_dir);
  // Absolute: apt-get and dpkg-source run inside the per-package work directory.
  if (char* real = ::realpath(options_.cache_dir.c_str(), nullptr)) {
    options_.cache_dir = real;
    std::free(real);
  }
  const std::string apt = options_.cache_dir + "/apt";
  make_dirs(apt + "/sources.list.d");
  make_dirs(apt + "/preferences.d");
  make_dirs(apt + "/lists/partial");
  make_dirs(apt + "/cache/archives/partial");
  make_dirs(source_dir());
  std::ostringstream src;
  src << "Types: deb-src\nURIs: " << options_.mirror << "\nSuites: " << options_.suite << "\n";
  if (!options_.component.empty()) src << "Components: " << options_.component << "\n";
  if (options_.keyring.empty())
    src << "Trusted: yes\n";
  else
    src << "Signed-By: " << options_.keyring << "\n";
  write_file_atomic(apt + "/sources.list.d/slm.sources", src.str());
  write_file_atomic(apt + "/sources.list", "");
}

std::vector<std::string> SourceFetcher::apt_options() const {
  const std::string apt = options_.cache_dir + "/apt";
  std::vector<std::string> a = {"-o", "Dir::Etc::SourceList=" + apt + "/sources.list",
                                "-o", "Dir::Etc::SourceParts=" + apt + "/sources.list.d",
                                "-o", "Dir::Etc::Preferences=" + apt + "/preferences",
                                "-o", "Dir::Etc::PreferencesParts=" + apt + "/preferences.d",
                                "-o", "Dir::State::Lists=" + apt + "/lists",
                                "-o", "Dir::Cache=" + apt + "/cache",
                                "-o", "Acquire::Languages=none",
                                "-o", "Acquire::Retries=2"};
  // As root apt downloads as the _apt user, who cannot write into a private directory under /root or /work.
  if (::geteuid() == 0) a.insert(a.end(), {"-o", "APT::Sandbox::User=root"});
  if (options_.rate_mb_s > 0)
    a.insert(a.end(), {"-o", "Acquire::http::Dl-Limit=" + std::to_string(std::max<int64_t>(
                                                              1, static_cast<int64_t>(options_.rate_mb_s * 1000)))});
  return a;
}

void SourceFetcher::update_index() {
  if (!program_available("apt-get")) throw Error("data fetch: apt-get is not installed (a Debian machine is needed)");
  std::vector<std::string> argv = {"apt-get"};
  const auto opts = apt_options();
  argv.insert(argv.end(), opts.begin(), opts.end());
  argv.insert(argv.end(), {"-q", "update"});
  ProcessOptions po;
  po.timeout_s = 600;
  po.merge_stderr = true;
  const auto r = run_process(argv, po);
  // apt-get update exits 0 even when a source failed; its "E:"/"W: Failed" lines are the failure.
  if (!r.ok() || r.out.find("\nE: ") != std::string::npos || r.out.starts_with("E: ") ||
      r.out.find("Failed to fetch") != std::string::npos)
    throw Error("data fetch: apt-get update failed:\n" + last_lines(r.out));
  if (!has_index()) throw Error("data fetch: apt-get update wrote no Sources index:\n" + last_lines(r.out));
}

namespace {
std::vector<std::string> index_files(const std::string& lists) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(lists.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.find("_Sources") != std::string::npos) out.push_back(lists + "/" + n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

bool SourceFetcher::has_index() const {
  return !index_files(options_.cache_dir + "/apt/lists").empty();
}

std::vector<SourcePackage> SourceFetcher::index() const {
  const auto files = index_files(options_.cache_dir + "/apt/lists");
  if (files.empty()) throw Error("data fetch: no Sources index in " + options_.cache_dir + "/apt/lists (run update)");
  std::string text;
  for (const auto& f : files) {
    // apt stores indexes compressed (lz4, gz, xz ...); its helper reads any of them.
    ProcessOptions po;
    po.timeout_s = 300;
    po.max_output = size_t{1} << 31;
    const auto r = run_process({"/usr/lib/apt/apt-helper", "cat-file", f}, po);
    if (!r.ok()) throw Error("data fetch: cannot read " + f + ": " + last_lines(r.err));
    text += r.out;
    text += "\n\n";
  }
  std::istringstream in(text);
  return parse_sources_index(in);
}

std::vector<ListedPackage> SourceFetcher::select() const {
  std::vector<ListedPackage> out;
  for (const auto& p : index())
    if (selection_verdict(p, options_.rules).empty()) out.push_back({p.name, p.version, p.bytes});
  return out;
}

std::map<std::string, PackageOutcome> SourceFetcher::recorded() const {
  std::map<std::string, PackageOutcome> out;
  std::ifstream in(options_.cache_dir + "/fetch-state.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // A line cut short by an interruption is skipped: that package is simply fetched again.
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    auto o = PackageOutcome::from_json(j);
    out[o.name + " " + o.version] = std::move(o);
  }
  return out;
}

void SourceFetcher::prune(const std::string& root, PackageOutcome& out) const {
  const auto copyright = DebianCopyright::read(root + "/debian/copyright");
  std::vector<std::string> files, others, dirs;
  walk(root, "", files, others, dirs);
  for (const auto& o : others) ::unlink(o.c_str());
  for (const auto& rel : files) {
    const std::string path = root + "/" + rel;
    const uint64_t size = file_size(path);
    bool keep = false;
    bool cpp = false;
    if (rel.starts_with("debian/")) {
      keep = debian_file_kept(rel);
    } else if (size > 0 && size <= options_.max_file_bytes) {
      const std::string abs = "/" + rel;  // the classifiers look at path components
      cpp = domain_accepts("cpp", abs, "");
      keep = cpp || domain_accepts("cmake", abs, "") || domain_accepts("design", abs, "") ||
             domain_accepts("shell", abs, file_head(path, 128));
      if (keep) {
        const std::string lic = copyright.license_of(rel);
        const std::string shown = lic.empty() ? "(none)" : lic;
        if (!options_.licenses.allows(lic)) {
          keep = false;
          ++out.dropped_license_files;
          ++out.dropped_licenses[shown];
          ::unlink(path.c_str());
          continue;
        }
        ++out.kept_licenses[shown];
      }
    }
    if (!keep) {
      ++out.dropped_other_files;
      ::unlink(path.c_str());
      continue;
    }
    ++out.kept_files;
    out.kept_bytes += size;
    if (cpp) ++out.cpp_files;
  }
  for (const auto& d : dirs) ::rmdir(d.c_str());  // deepest first; non-empty ones stay
}

PackageOutcome SourceFetcher::fetch_one(const ListedPackage& p) {
  PackageOutcome out;
  out.name = p.name;
  out.version = p.version;
  const std::string work = options_.cache_dir + "/tmp/" + p.name;
  remove_tree(work);
  make_dirs(work + "/dl");
  ProcessOptions po;
  po.timeout_s = options_.timeout_s;
  po.merge_stderr = true;
  po.cwd = work + "/dl";
  std::vector<std::string> argv = {"apt-get"};
  const auto opts = apt_options();
  argv.insert(argv.end(), opts.begin(), opts.end());
  argv.insert(argv.end(), {"-q", "source", "--download-only", p.name + "=" + p.version});
  // A file the archive (or the proxy in front of it) does not have will not appear by asking again.
  auto missing = [](const std::string& log) {
    return log.find(" 404 ") != std::string::npos || log.find("File not found") != std::string::npos;
  };
  ProcessResult r;
  for (int attempt = 0; attempt < std::max(1, options_.attempts); ++attempt) {
    r = run_process(argv, po);
    if (r.ok() || missing(r.out)) break;
  }
  if (!r.ok()) {
    out.status = missing(r.out) ? "unavailable" : "failed";
    out.reason = "apt-get source: " + last_lines(r.out, 3);
    remove_tree(work);
    return out;
  }
  std::string dsc;
  if (DIR* d = ::opendir((work + "/dl").c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      out.download_bytes += file_size(work + "/dl/" + n);
      if (n.ends_with(".dsc")) dsc = n;
    }
    ::closedir(d);
  }
  if (dsc.empty()) {
    out.status = "failed";
    out.reason = "apt-get source left no .dsc";
    remove_tree(work);
    return out;
  }
  po.timeout_s = options_.timeout_s;
  // apt has checked every file against the signed index; dpkg-source checks them against the .dsc again.
  const auto x = run_process({"dpkg-source", "-x", dsc, work + "/unpacked"}, po);
  if (!x.ok()) {
    out.status = "failed";
    out.reason = "dpkg-source -x: " + last_lines(x.out, 3);
    remove_tree(work);
    return out;
  }
  remove_tree(work + "/dl");
  prune(work + "/unpacked", out);
  if (out.cpp_files < static_cast<uint64_t>(options_.rules.min_cpp_files)) {
    out.status = "rejected";
    out.reason = std::to_string(out.cpp_files) + " C++ files allowed by the license policy (fewer than " +
                 std::to_string(options_.rules.min_cpp_files) + ")";
    remove_tree(work);
    return out;
  }
  const std::string dest = source_dir() + "/" + p.name + "_" + p.version;
  remove_tree(dest);
  write_file_atomic(work + "/unpacked/.slm-package.json", out.to_json().dump(1) + "\n");
  if (std::rename((work + "/unpacked").c_str(), dest.c_str()) != 0)
    throw Error("data fetch: cannot move the unpacked " + p.name + " into " + dest);
  remove_tree(work);
  out.status = "ok";
  return out;
}

FetchSummary SourceFetcher::fetch(const std::vector<ListedPackage>& packages, bool retry_unavailable,
                                  const std::function<void(uint64_t, uint64_t)>& progress,
                                  const std::function<void(const PackageOutcome&)>& on_package) {
  if (!program_available("apt-get") || !program_available("dpkg-source"))
    throw Error("data fetch: apt-get and dpkg-source are needed (Debian: apt-get install dpkg-dev)");
  const auto done = recorded();
  FetchSummary s;
  uint64_t total = 0, so_far = 0;
  for (const auto& p : packages) total += p.bytes;
  const std::string state = options_.cache_dir + "/fetch-state.jsonl";
  for (const auto& p : packages) {
    ++s.packages;
    auto it = done.find(p.name + " " + p.version);
    // Done before: fetched (and still there), rejected or unavailable. Failed ones are tried again.
    if (it != done.end() &&
        (it->second.status == "rejected" || (it->second.status == "unavailable" && !retry_unavailable) ||
         (it->second.status == "ok" && exists(source_dir() + "/" + p.name + "_" + p.version)))) {
      ++s.skipped;
      so_far += p.bytes;
      if (progress) progress(so_far, total);
      continue;
    }
    const auto o = fetch_one(p);
    {
      std::ofstream st(state, std::ios::app);
      st << o.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      st.flush();
      if (!st) throw Error(state + ": cannot record the fetch state (disk full?)");
    }
    if (o.status == "ok")
      ++s.ok;
    else if (o.status == "rejected")
      ++s.rejected;
    else if (o.status == "unavailable")
      ++s.unavailable;
    else
      ++s.failed;
    s.download_bytes += o.download_bytes;
    s.kept_bytes += o.kept_bytes;
    s.kept_files += o.kept_files;
    s.dropped_license_files += o.dropped_license_files;
    for (const auto& [l, n] : o.dropped_licenses) s.dropped_licenses[l] += n;
    if (on_package) on_package(o);
    so_far += p.bytes;
    if (progress) progress(so_far, total);
  }
  return s;
}

}  // namespace slm::data
