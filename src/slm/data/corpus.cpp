#include "slm/data/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "slm/data/debian_copyright.h"
#include "slm/data/decontam.h"
#include "slm/data/doc_text.h"
#include "slm/data/gen_patches.h"
#include "slm/data/hashing.h"
#include "slm/data/text.h"
#include "slm/data/tokenizer.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::data {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------- sources

const std::vector<std::string>& implemented_domains() {
  static const std::vector<std::string> d = {"cpp",    "cmake",  "shell",     "debug",
                                             "review", "design", "algorithm", "orchestration"};
  return d;
}

// The algorithm corpus, by rule: the sources and documentation of libraries whose subject is algorithms
// (Boost.Graph/Algorithm/Geometry algorithms/Heap/Sort and the intrusive tree algorithms, libstdc++'s algorithm,
// numeric, heap, tree and hash-table implementations and its parallel mode, LLVM's graph traversals, dominator
// trees and interval structures, Eigen's matrix decompositions, cppreference's algorithm pages, Boost's
// algorithm-library examples; in source packages, directories named algorithm(s), algo or sorting). Matched as path
// substrings; these files belong to no other domain.
const std::vector<std::string>& algorithm_paths() {
  static const std::vector<std::string> p = {
      "/usr/include/boost/graph/", "/usr/include/boost/algorithm/", "/usr/include/boost/geometry/algorithms/",
      "/usr/include/boost/heap/", "/usr/include/boost/sort/", "/usr/include/boost/intrusive/detail/tree_algorithms",
      "_algorithms.hpp", "/c++/12/bits/stl_algo.h", "/c++/12/bits/stl_algobase.h", "/c++/12/bits/stl_heap.h",
      "/c++/12/bits/ranges_algo.h", "/c++/12/bits/ranges_algobase.h", "/c++/12/bits/stl_numeric.h",
      "/c++/12/bits/stl_tree.h", "/c++/12/bits/hashtable.h", "/c++/12/bits/hashtable_policy.h",
      "/c++/12/bits/random.tcc", "/c++/12/pstl/", "/c++/12/parallel/", "/llvm/ADT/SCCIterator.h",
      "/llvm/ADT/PostOrderIterator.h", "/llvm/ADT/DepthFirstIterator.h", "/llvm/ADT/BreadthFirstIterator.h",
      "/llvm/ADT/EquivalenceClasses.h", "/llvm/ADT/IntEqClasses.h", "/llvm/ADT/IntervalMap.h",
      "/llvm/ADT/ImmutableSet.h", "/llvm/ADT/edit_distance.h", "/llvm/ADT/DirectedGraph.h",
      "/llvm/Support/GenericDomTree", "/llvm/Support/GenericIteratedDominanceFrontier.h", "/eigen3/Eigen/src/Cholesky/",
      "/eigen3/Eigen/src/LU/", "/eigen3/Eigen/src/QR/", "/eigen3/Eigen/src/SVD/", "/eigen3/Eigen/src/Eigenvalues/",
      "/eigen3/Eigen/src/Householder/", "/eigen3/Eigen/src/Jacobi/", "/eigen3/Eigen/src/SparseCholesky/",
      "/eigen3/Eigen/src/OrderingMethods/", "/cppreference/doc/html/en/cpp/algorithm",
      "/cppreference/doc/html/en/c/algorithm", "/libboost1.74-doc/doc/html/algorithm",
      "/libboost1.74-doc/doc/html/boost/algorithm/", "/libboost1.74-doc/doc/html/heap",
      "/libboost1.74-doc/examples/libs/graph/", "/libboost1.74-doc/examples/libs/algorithm/",
      "/libboost1.74-doc/examples/libs/geometry/", "/libboost1.74-doc/examples/libs/sort/",
      "/libboost1.74-doc/examples/libs/heap/",
      // The same rule in any project's tree (slm data fetch): directories
      // that a project names for its algorithms.
      "/algorithm/", "/algorithms/", "/algo/", "/sorting/"};
  return p;
}

namespace {

std::string cmake_share_dir() {
  // cmake-data installs /usr/share/cmake-X.Y; take the newest present (3.25 on bookworm).
  std::string best;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/share", ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("cmake-") && e.is_directory(ec) && e.path().string() > best) best = e.path().string();
  }
  return best.empty() ? "/usr/share/cmake-3.25" : best;
}

std::string lower_ext(const std::string& path) {
  std::string e = fs::path(path).extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e;
}

bool is_algorithm_path(const std::string& path) {
  const auto& ap = algorithm_paths();
  return std::any_of(ap.begin(), ap.end(), [&](const std::string& x) { return path.find(x) != std::string::npos; });
}

// The name and extension of a file, looking through a .gz suffix.
std::pair<std::string, std::string> doc_name_ext(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  if (name.ends_with(".gz")) name.resize(name.size() - 3);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const size_t dot = name.rfind('.');
  return {name, dot == std::string::npos ? "" : name.substr(dot)};
}

bool shell_shebang(std::string_view head) {
  if (!head.starts_with("#!")) return false;
  std::string_view first =
      head.substr(2, head.find('\n') == std::string_view::npos ? head.size() - 2 : head.find('\n') - 2);
  for (const char* sh : {"/sh", "/bash", "/dash", "/ksh", "/zsh", "env sh", "env bash", "env dash", "env zsh"}) {
    auto at = first.find(sh);
    if (at == std::string_view::npos) continue;
    const size_t end = at + std::string_view(sh).size();
    if (end == first.size() || first[end] == ' ' || first[end] == '\t' || first[end] == '\r') return true;
  }
  return false;
}

}  // namespace

std::vector<SourceRoot> default_roots(const std::string& domain) {
  const std::string cm = cmake_share_dir();
  const std::vector<std::string> boost_generated = {"/preprocessed/", "/boost/preprocessor/", "/typeof/", "/mpl/aux_/",
                                                    "/vmd/"};
  if (domain == "cpp") {
    std::vector<SourceRoot> roots = {
        {"/usr/include/c++/12", "libstdc++-12-dev", "", true, {}, ""},
        {"/usr/lib/llvm-14/include", "llvm-14-dev", "", false, {".inc", ".def"}, ""},
        {"/usr/src/googletest", "googletest", "", false, {}, ""},
        {"/usr/include/nlohmann", "nlohmann-json3-dev", "", false, {}, ""},
        {"/usr/include/CLI", "libcli11-dev", "", false, {}, ""},
        {"/usr/include/gtest", "libgtest-dev", "", false, {}, ""},
        {"/usr/include/gmock", "libgmock-dev", "", false, {}, ""},
        {"/usr/include/benchmark", "libbenchmark-dev", "", false, {}, ""},
        {"/usr/include/boost", "libboost1.74-dev", "", false, boost_generated, ""},
        {"/usr/include/eigen3", "libeigen3-dev", "", false, {}, ""},
        {"/usr/include/absl", "libabsl-dev", "", false, {}, ""},
        {"/usr/include/asio", "libasio-dev", "", false, {}, ""},
        {"/usr/include/fmt", "libfmt-dev", "", false, {}, ""},
        {"/usr/include/spdlog", "libspdlog-dev", "", false, {}, ""},
        {"/usr/include/x86_64-linux-gnu/qt5", "qtbase5-dev", "", false, {}, ""},
    };
    for (auto& r : roots) r.exclude.insert(r.exclude.end(), algorithm_paths().begin(), algorithm_paths().end());
    return roots;
  }
  if (domain == "algorithm") {
    return {
        {"/usr/include/c++/12", "libstdc++-12-dev", "", false, {}, ""},
        {"/usr/include/boost", "libboost1.74-dev", "", false, boost_generated, ""},
        {"/usr/lib/llvm-14/include/llvm", "llvm-14-dev", "", false, {}, ""},
        {"/usr/include/eigen3/Eigen/src", "libeigen3-dev", "", false, {}, ""},
        {"/usr/share/cppreference/doc/html/en", "cppreference-doc-en-html", "", false, {}, ""},
        {"/usr/share/doc/libboost1.74-doc", "libboost1.74-doc", "", false, {"/figs/"}, ""},
    };
  }
  if (domain == "design") {
    // Man pages of the commands, system calls, library functions, file formats and overviews (the
    // google-cloud-sdk's 16k generated gcloud pages left out), package documentation (README/Markdown/rST/text
    // and HTML: LLVM's and Boost's manuals among them) and the cppreference HTML reference.
    std::vector<std::string> doc_exclude = {"/_sources/",   "/_static/", "/examples/", "genindex",
                                            "/search.html", "/doc/pdf/", "/doc/src/",  "/cppreference/"};
    doc_exclude.insert(doc_exclude.end(), algorithm_paths().begin(), algorithm_paths().end());
    std::vector<SourceRoot> roots;
    for (const char* sec : {"1", "2", "3", "5", "7", "8"})
      roots.push_back({std::string("/usr/share/man/man") + sec, "", "", true, {"gcloud"}, "man"});
    roots.push_back({"/usr/share/doc", "", "", false, doc_exclude, ""});
    roots.push_back(
        {"/usr/share/cppreference/doc/html/en", "cppreference-doc-en-html", "", false, algorithm_paths(), ""});
    return roots;
  }
  if (domain == "debug" || domain == "review" || domain == "orchestration") return {};
  if (domain == "cmake") {
    return {
        {cm + "/Modules", "cmake-data", "", false, {}, ""},
        {cm + "/Help", "cmake-data", "", true, {}, ""},
        {"/usr/lib/x86_64-linux-gnu/cmake", "", "", false, {}, ""},
        {"/usr/lib/cmake", "", "", false, {}, ""},
        {"/usr/share/cmake", "", "", false, {}, ""},
        {"/usr/lib/llvm-14/lib/cmake", "llvm-14-dev", "", false, {}, ""},
        {"/usr/src/googletest", "googletest", "", false, {}, ""},
    };
  }
  if (domain == "shell") {
    return {
        {"/usr/share/bash-completion/completions", "bash-completion", "", true, {}, ""},
        {"/var/lib/dpkg/info", "", "", false, {}, ""},
        {"/usr/bin", "", "", false, {}, ""},
        {"/usr/sbin", "", "", false, {}, ""},
        {"/usr/lib/git-core", "git", "", false, {}, ""},
        {"/etc", "", "", false, {}, ""},
    };
  }
  throw Error("data build: unknown domain '" + domain +
              "' (domains: cpp, cmake, shell, debug, review, design, algorithm, orchestration)");
}

bool domain_accepts(const std::string& domain, const std::string& path, std::string_view head) {
  const std::string name = fs::path(path).filename().string();
  const std::string ext = lower_ext(path);
  if (domain == "cpp") {
    static const std::set<std::string> exts = {".h",   ".hh",  ".hpp", ".hxx", ".h++", ".cc", ".cpp",
                                               ".cxx", ".c++", ".ipp", ".tcc", ".inl", ".txx"};
    return exts.count(ext) > 0;
  }
  if (domain == "cmake") return name == "CMakeLists.txt" || ext == ".cmake" || name.ends_with(".cmake.in");
  if (domain == "shell") {
    if (ext == ".sh" || ext == ".bash" || ext == ".bats") return true;
    return shell_shebang(head);
  }
  if (domain == "design") {
    const auto [dname, dext] = doc_name_ext(path);
    if (dname.starts_with("changelog") || dname.starts_with("copyright") || dname.starts_with("news")) return false;
    return dext == ".html" || dext == ".htm" || dext == ".md" || dext == ".rst" || dext == ".txt" ||
           dname.starts_with("readme");
  }
  if (domain == "algorithm") {
    if (!is_algorithm_path(path)) return false;
    // Code (libstdc++'s parallel-mode headers have no extension) and HTML documentation.
    return domain_accepts("cpp", path, head) || ext == ".html" || ext == ".htm" || ext.empty();
  }
  return false;
}

namespace {

// dpkg's file lists: installed path -> package.
class PackageIndex {
 public:
  explicit PackageIndex(std::string info_dir) : dir_(std::move(info_dir)) {}
  std::string lookup(const std::string& path) {
    load();
    auto it = owner_.find(path);
    return it == owner_.end() ? "" : it->second;
  }

 private:
  void load() {
    if (loaded_) return;
    loaded_ = true;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      if (e.path().extension() != ".list") continue;
      std::string pkg = e.path().stem().string();
      pkg = pkg.substr(0, pkg.find(':'));
      std::ifstream in(e.path());
      std::string line;
      while (std::getline(in, line)) owner_.emplace(line, pkg);
    }
  }
  std::string dir_;
  bool loaded_ = false;
  std::unordered_map<std::string, std::string> owner_;
};

// The license named by a Debian copyright file (DebianCopyright::main_license), else a pointer to the file.
std::string license_from_copyright(const std::string& path) {
  std::string lic = DebianCopyright::read(path).main_license();
  if (lic.empty() && fs::exists(path)) lic = "see " + path;
  return lic;
}

class LicenseIndex {
 public:
  explicit LicenseIndex(std::string doc_dir) : dir_(std::move(doc_dir)) {}
  std::string lookup(const std::string& pkg) {
    if (pkg.empty()) return "unknown";
    auto it = cache_.find(pkg);
    if (it != cache_.end()) return it->second;
    std::string lic = license_from_copyright(dir_ + "/" + pkg + "/copyright");
    if (lic.empty()) lic = "unknown";
    cache_.emplace(pkg, lic);
    return lic;
  }

 private:
  std::string dir_;
  std::unordered_map<std::string, std::string> cache_;
};

// An unpacked Debian source package (apt-get source, slm data fetch): its Source name and main license.
bool debian_source_info(const std::string& root, std::string& package, std::string& license) {
  std::ifstream ctl(root + "/debian/control");
  if (!ctl) return false;
  std::string line;
  while (std::getline(ctl, line))
    if (line.starts_with("Source:")) {
      package = line.substr(7);
      package.erase(0, package.find_first_not_of(" \t"));
      break;
    }
  license = license_from_copyright(root + "/debian/copyright");
  return !package.empty();
}

struct Candidate {
  size_t domain;
  std::string path;
  uint64_t size;
  std::string package, license;
  std::string format;
  bool split_by_package = false;  // a Debian source package: the whole project lands in one split
  std::string relative;           // the path below its root: what the split hashes, wherever the root lies
};

struct Doc {
  size_t domain;
  DocumentMeta meta;
  std::string text;
  std::string split;
  std::string split_key;  // "" = package + the path below its root
  std::string relative;
  nlohmann::json extra = nlohmann::json::object();
};

std::string record_line(const Doc& d) {
  auto j = d.meta.to_json();
  for (const auto& [k, v] : d.extra.items()) j[k] = v;
  j["text"] = d.text;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string split_of(const std::string& package, const std::string& path, double validation, double test,
                     uint64_t seed) {
  const double u = unit_interval(hash64(package + "\n" + path, seed ^ 0x73706c6974ULL));
  if (u < test) return "test";
  if (u < test + validation) return "validation";
  return "train";
}

// ---------------------------------------------------------------------------------------------- report

nlohmann::json CorpusReport::to_json() const {
  nlohmann::json j;
  j["domains"] = nlohmann::json::array();
  for (const auto& d : domains) {
    j["domains"].push_back({{"domain", d.domain},
                            {"candidates", d.candidates},
                            {"dropped_unclean", d.dropped_unclean},
                            {"dropped_size", d.dropped_size},
                            {"exact_duplicates", d.exact_dups},
                            {"near_duplicates", d.near_dups},
                            {"cross_domain_duplicates", d.cross_domain_dups},
                            {"contaminated", d.contaminated},
                            {"documents", d.documents},
                            {"bytes", d.bytes},
                            {"tokens", d.tokens},
                            {"split_documents", d.split_docs},
                            {"split_bytes", d.split_bytes},
                            {"split_tokens", d.split_tokens},
                            {"generator", d.generator},
                            {"missing_roots", d.missing_roots}});
  }
  j["removed"] = removed;
  return j;
}

std::string CorpusReport::table() const {
  std::ostringstream o;
  o << "| domain | documents | bytes | exact dups | near dups | (cross-domain) | contaminated | tokens | train / val / "
       "test docs | test bytes/token |\n";
  o << "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n";
  for (const auto& d : domains) {
    auto sd = [&](const char* s) {
      auto it = d.split_docs.find(s);
      return it == d.split_docs.end() ? uint64_t{0} : it->second;
    };
    o << "| " << d.domain << " | " << d.documents << " | " << d.bytes << " | " << d.exact_dups << " | " << d.near_dups
      << " | " << d.cross_domain_dups << " | " << d.contaminated << " | " << (d.tokens ? std::to_string(d.tokens) : "-")
      << " | " << sd("train") << " / " << sd("validation") << " / " << sd("test") << " | ";
    const auto tb = d.split_bytes.find("test");
    const auto tt = d.split_tokens.find("test");
    if (tb != d.split_bytes.end() && tt != d.split_tokens.end() && tt->second > 0) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(tb->second) / static_cast<double>(tt->second));
      o << buf;
    } else
      o << "-";
    o << " |\n";
  }
  return o.str();
}

// ---------------------------------------------------------------------------------------------- build

CorpusReport build_corpus(const CorpusOptions& o, const CorpusProgress& progress) {
  if (o.domains.empty()) throw Error("data build: no domains");
  if (o.out_dir.empty()) throw Error("data build: no output directory");
  if (o.validation_fraction < 0 || o.test_fraction < 0 || o.validation_fraction + o.test_fraction >= 1)
    throw Error("data build: validation + test fractions must be in [0, 1)");
  auto report_progress = [&](const std::string& phase, uint64_t done, uint64_t total) {
    if (progress) progress(phase, done, total);
  };
  CorpusReport rep;
  PackageIndex packages(o.dpkg_info_dir);
  LicenseIndex licenses(o.doc_dir);

  // 1. Scan the roots for candidate files.
  std::vector<Candidate> cands;
  for (size_t di = 0; di < o.domains.size(); ++di) {
    const std::string& domain = o.domains[di];
    DomainSummary sum;
    sum.domain = domain;
    auto rit = o.roots.find(domain);
    const std::vector<SourceRoot> roots = rit != o.roots.end() ? rit->second : default_roots(domain);
    std::unordered_set<std::string> seen;
    std::vector<Candidate> mine;
    for (const auto& root : roots) {
      std::error_code ec;
      if (!fs::is_directory(root.path, ec)) {
        sum.missing_roots.push_back(root.path + (root.package.empty() ? "" : " (" + root.package + ")"));
        continue;
      }
      std::string root_pkg = root.package, root_lic = root.license;
      const bool source_package = debian_source_info(root.path, root_pkg, root_lic);
      // Each file's own license (DEP-5 "Files:" paragraphs), not only the package's main one.
      const DebianCopyright copyright =
          source_package ? DebianCopyright::read(root.path + "/debian/copyright") : DebianCopyright{};
      const bool maintainer_scripts = fs::path(root.path) == fs::path(o.dpkg_info_dir);
      const size_t root_begin = mine.size();
      for (auto it = fs::recursive_directory_iterator(root.path, fs::directory_options::skip_permission_denied, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) break;
        if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
        const std::string path = it->path().string();
        // An exclusion names part of the path below the root: a root that itself lies under, say, a directory
        // named "debian" (slm data fetch's default cache is out/debian) must not lose every file to "/debian/".
        if (std::any_of(root.exclude.begin(), root.exclude.end(), [&](const std::string& x) {
              for (size_t at = path.find(x); at != std::string::npos; at = path.find(x, at + 1))
                if (at + x.size() > root.path.size()) return true;
              return false;
            }))
          continue;
        const uint64_t size = it->file_size(ec);
        if (ec) continue;
        bool take = root.all_files;
        if (!take) {
          const bool by_name = domain_accepts(domain, path, "");
          take = by_name || (domain == "shell" && size > 2 && domain_accepts(domain, path, file_head(path, 128)));
        }
        if (!take || !seen.insert(path).second) continue;
        ++sum.candidates;
        if (size < o.min_file_bytes || size > o.max_file_bytes) {
          ++sum.dropped_size;
          continue;
        }
        std::string_view rel = std::string_view(path).substr(root.path.size());
        while (rel.starts_with('/')) rel.remove_prefix(1);
        Candidate c{di, path, size, root_pkg, root_lic, root.format, source_package, std::string(rel)};
        if (source_package) {
          if (std::string lic = copyright.license_of(rel); !lic.empty()) c.license = std::move(lic);
        } else if (maintainer_scripts) {
          std::string stem = it->path().stem().string();
          c.package = stem.substr(0, stem.find(':'));
        } else if (std::string owner = packages.lookup(path); !owner.empty()) {
          c.package = owner;
        }
        if (c.package.empty()) c.package = "unknown";
        mine.push_back(std::move(c));
        if (mine.size() % 256 == 0) report_progress("scan " + domain, mine.size(), 0);
      }
      // Directory order is the file system's: sort, so that the first copy of a duplicate is the same everywhere.
      std::sort(mine.begin() + static_cast<std::ptrdiff_t>(root_begin), mine.end(),
                [](const Candidate& a, const Candidate& b) { return a.path < b.path; });
    }
    // Sample down to the byte cap by a hash of the path (deterministic, spread over all roots).
    uint64_t total = 0;
    for (const auto& c : mine) total += c.size;
    if (o.max_bytes_per_domain && total > o.max_bytes_per_domain) {
      const double keep = static_cast<double>(o.max_bytes_per_domain) / static_cast<double>(total);
      std::erase_if(mine, [&](const Candidate& c) { return unit_interval(hash64(c.path, 0x63617021ULL)) >= keep; });
    }
    for (auto& c : mine) cands.push_back(std::move(c));
    rep.domains.push_back(std::move(sum));
  }

  // 2. Documents flow through in candidate order, a batch at a time: read (converting documentation to text) and
  // counted on o.jobs threads, then deduplicated (exact and near, across all domains; the first copy is kept),
  // decontaminated, split and written one by one, so that memory holds one batch of text, not the corpus. Each
  // debug and review generator's documents follow that domain's files: the order is part of the result.
  std::optional<Tokenizer> tok;
  if (!o.tokenizer.empty()) tok = Tokenizer::load(o.tokenizer);
  std::map<std::pair<size_t, std::string>, std::ofstream> outs;
  for (size_t di = 0; di < o.domains.size(); ++di) {
    make_dirs((fs::path(o.out_dir) / o.domains[di]).string());
    for (const char* s : {"train", "validation", "test"}) {
      auto p = fs::path(o.out_dir) / o.domains[di] / (std::string(s) + ".jsonl");
      auto& f = outs[{di, s}];
      f.open(p, std::ios::binary | std::ios::trunc);
      if (!f) throw Error(p.string() + ": cannot write");
    }
  }
  auto write = [&](Doc& d, std::optional<uint64_t> tokens) {
    auto& sum = rep.domains[d.domain];
    ++sum.documents;
    sum.bytes += d.text.size();
    ++sum.split_docs[d.split];
    sum.split_bytes[d.split] += d.text.size();
    if (tok) {
      const uint64_t n = tokens ? *tokens : tok->encode(d.text).size();
      sum.tokens += n;
      sum.split_tokens[d.split] += n;
    }
    outs[{d.domain, d.split}] << record_line(d) << "\n";
  };
  const auto orch = std::find(o.domains.begin(), o.domains.end(), "orchestration");
  const bool router = orch != o.domains.end();
  RouterSampler sampler(o.router);
  std::set<std::string> in_run;  // domains whose documents this run offered to the router
  Deduplicator dedup(o.minhash);
  std::optional<Decontaminator> dc;
  if (!o.eval_jsonl.empty()) dc.emplace(load_eval_problems(o.eval_jsonl), o.decontam_ngram);
  int64_t next_id = 0;  // the dedup id of the next document; kept_meta remembers the kept ones for the report
  std::unordered_map<int64_t, std::pair<size_t, std::string>> kept_meta;  // id -> domain, path
  auto held_out = [&](size_t di) {
    const bool few_sources = o.domains[di] == "debug" || o.domains[di] == "review";
    return few_sources ? std::max({o.validation_fraction, o.test_fraction, o.generated_held_out}) : -1.0;
  };
  // Dedup, decontamination, split (by source file, or by the generator's key: a bug case, a reviewed file),
  // then the router's sample and the file.
  auto take = [&](Doc& d, std::optional<uint64_t> tokens) {
    const int64_t id = next_id++;
    auto r = dedup.offer(id, d.text);
    auto& sum = rep.domains[d.domain];
    if (r.verdict != Deduplicator::Verdict::kUnique) {
      const auto& kept = kept_meta.at(r.duplicate_of);
      (r.verdict == Deduplicator::Verdict::kExact ? sum.exact_dups : sum.near_dups)++;
      if (kept.first != d.domain) ++sum.cross_domain_dups;
      rep.removed.push_back(
          {{"reason", r.verdict == Deduplicator::Verdict::kExact ? "exact-duplicate" : "near-duplicate"},
           {"domain", d.meta.domain},
           {"package", d.meta.package},
           {"path", d.meta.path},
           {"duplicate_of", kept.second},
           {"similarity", r.similarity}});
      return;
    }
    kept_meta[id] = {d.domain, d.meta.path};
    if (dc) {
      auto hit = dc->check(d.text);
      if (hit.contaminated) {
        ++sum.contaminated;
        rep.removed.push_back({{"reason", "contaminated"},
                               {"domain", d.meta.domain},
                               {"package", d.meta.package},
                               {"path", d.meta.path},
                               {"problem", hit.problem},
                               {"matching_ngrams", hit.matches}});
        return;
      }
    }
    const double h = held_out(d.domain);
    const double val = h >= 0 ? h : o.validation_fraction, test = h >= 0 ? h : o.test_fraction;
    // By the path below its root, not the absolute one: the same files split alike wherever they were unpacked.
    d.split = d.split_key.empty()
                  ? split_of(d.meta.package, d.relative.empty() ? d.meta.path : d.relative, val, test, o.split_seed)
                  : split_of(d.split_key, "", val, test, o.split_seed);
    if (router && o.domains[d.domain] != "orchestration") {
      sampler.offer({o.domains[d.domain], d.split, d.meta, d.text});
      in_run.insert(o.domains[d.domain]);
    }
    write(d, tokens);
  };

  uint64_t total_bytes = 0, read_bytes = 0;
  for (const auto& c : cands) total_bytes += c.size;
  constexpr uint64_t kBatchBytes = 64ull << 20;
  std::optional<PatchCorpus> patch_corpus;
  PatchStats patch_stats;
  size_t next_cand = 0;
  for (size_t di = 0; di < o.domains.size(); ++di) {
    while (next_cand < cands.size() && cands[next_cand].domain == di) {
      size_t end = next_cand;
      for (uint64_t bytes = 0;
           end < cands.size() && cands[end].domain == di && (end == next_cand || bytes < kBatchBytes); ++end)
        bytes += cands[end].size;
      struct Read {
        std::optional<Doc> doc;
        uint64_t tokens = 0;
        bool too_small = false;
      };
      std::vector<Read> batch(end - next_cand);
      std::mutex mu;
      parallel_for(batch.size(), o.jobs, [&](size_t j) {
        const auto& c = cands[next_cand + j];
        std::string text;
        try {
          const bool convert =
              !c.format.empty() || c.path.ends_with(".gz") || c.path.ends_with(".html") || c.path.ends_with(".htm");
          text = convert ? document_text(c.path, c.format) : read_file_bytes(c.path);
        } catch (const Error&) {
          text.clear();
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          read_bytes += c.size;
          report_progress("read", read_bytes, total_bytes);
        }
        if (text.empty() || !is_clean_text(text)) return;
        if (text.size() < o.min_file_bytes) {
          batch[j].too_small = true;
          return;
        }
        if (tok) batch[j].tokens = tok->encode(text).size();
        Doc d;
        d.domain = c.domain;
        d.meta = {c.package, c.path, c.license, o.domains[c.domain]};
        if (c.split_by_package) d.split_key = "package:" + c.package;
        d.relative = c.relative;
        d.text = std::move(text);
        batch[j].doc = std::move(d);
      });
      for (auto& b : batch) {
        if (!b.doc) {
          ++(b.too_small ? rep.domains[di].dropped_size : rep.domains[di].dropped_unclean);
          continue;
        }
        if (b.doc->meta.license.empty()) b.doc->meta.license = licenses.lookup(b.doc->meta.package);
        take(*b.doc, b.tokens);
      }
      next_cand = end;
    }
    const std::string& domain = o.domains[di];
    if (domain != "debug" && domain != "review") continue;
    std::vector<GeneratedDoc> gen;
    auto gen_progress = [&](uint64_t done, uint64_t total) { report_progress("generate " + domain, done, total); };
    if (!o.source_packages.empty() && !patch_corpus) {
      report_progress("patches", 0, o.source_packages.size());
      patch_corpus = generate_patch_corpus(o.source_packages, o.patch_licenses, 64000, &patch_stats);
    }
    if (domain == "debug") {
      DebugStats st;
      gen = generate_debug_corpus(o.debug, &st, gen_progress);
      rep.domains[di].generator = {{"programs", bug_catalogue().size()},  {"variants_per_program", o.debug.variants},
                                   {"samples_attempted", st.attempted},   {"samples_kept", st.kept},
                                   {"fixes_verified", st.fixes_verified}, {"not_reproduced", st.dropped}};
    } else {
      ReviewStats st;
      gen = generate_review_corpus(o.review, &st, gen_progress);
      rep.domains[di].generator = {{"files", st.files},
                                   {"files_reviewed", st.files_reviewed},
                                   {"files_unparsable", st.files_unparsable},
                                   {"diagnostics", st.diagnostics},
                                   {"excerpts", st.documents},
                                   {"excerpts_with_fix", st.with_fix}};
    }
    if (patch_corpus) {
      auto& from_patches = domain == "debug" ? patch_corpus->debug : patch_corpus->review;
      rep.domains[di].generator["debian_patches"] = patch_stats.to_json();
      for (auto& g : from_patches) gen.push_back(std::move(g));
      from_patches.clear();
    }
    rep.domains[di].candidates += gen.size();
    for (size_t i = 0; i < gen.size(); ++i) {
      auto& g = gen[i];
      Doc d;
      d.domain = di;
      d.meta = std::move(g.meta);
      if (d.meta.license.empty()) d.meta.license = licenses.lookup(d.meta.package);
      d.text = std::move(g.text);
      d.split_key = std::move(g.split_key);
      d.extra = std::move(g.extra);
      take(d, std::nullopt);
      if (i % 64 == 0 || i + 1 == gen.size()) report_progress("dedup " + domain, i + 1, gen.size());
    }
  }

  // 3. Router requests from the other domains' documents (this run's, else those already in out_dir), each in
  // its source document's split. Deduplicated among themselves only: they are windows of those documents.
  if (router) {
    const size_t oi = static_cast<size_t>(orch - o.domains.begin());
    for (const auto& dom : implemented_domains()) {
      if (dom == "orchestration" || in_run.count(dom)) continue;
      for (const char* sp : {"train", "validation", "test"}) {
        const std::string f = (fs::path(o.out_dir) / dom / (std::string(sp) + ".jsonl")).string();
        if (!fs::exists(f)) continue;
        for_each_text_document({f}, [&](const TextDocument& t) {
          sampler.offer({dom, sp, t.meta, t.text});
          in_run.insert(dom);
        });
      }
    }
    if (in_run.empty())
      throw Error(
          "data build: orchestration needs the other domains' documents: build them in the same run or "
          "earlier into " +
          o.out_dir);
    auto requests = sampler.requests();
    rep.domains[oi].candidates = requests.size();
    // Duplicates are removed first, then every label is trimmed to the smallest label's count in each split (but
    // train without router.balance_train), so the balance survives deduplication.
    Deduplicator rdedup(o.minhash);
    std::vector<GeneratedDoc> unique;
    for (auto& g : requests) {
      auto r = rdedup.offer(static_cast<int64_t>(unique.size()), g.text);
      if (r.verdict != Deduplicator::Verdict::kUnique) {
        (r.verdict == Deduplicator::Verdict::kExact ? rep.domains[oi].exact_dups : rep.domains[oi].near_dups)++;
        continue;
      }
      unique.push_back(std::move(g));
    }
    std::map<std::string, std::map<std::string, uint64_t>> available;  // split -> label -> requests
    for (const auto& g : unique) ++available[g.split][g.extra["label"].get<std::string>()];
    std::map<std::string, uint64_t> quota;
    for (const auto& [split, by_label] : available) {
      quota[split] = UINT64_MAX;
      for (const auto& [label, n] : by_label) quota[split] = std::min(quota[split], n);
    }
    std::map<std::string, uint64_t> per_label;
    uint64_t trimmed = 0;
    for (auto& g : unique) {
      uint64_t& n = per_label[g.extra["label"].get<std::string>() + "/" + g.split];
      if (n == quota[g.split] && (g.split != "train" || o.router.balance_train)) {
        ++trimmed;
        continue;
      }
      ++n;
      Doc d;
      d.domain = oi;
      d.meta = std::move(g.meta);
      d.text = std::move(g.text);
      d.split = g.split;
      d.extra = std::move(g.extra);
      if (dc && dc->check(d.text).contaminated) {
        ++rep.domains[oi].contaminated;
        continue;
      }
      write(d, std::nullopt);
    }
    rep.domains[oi].generator = {{"requests_per_label_and_split", per_label}, {"trimmed_for_balance", trimmed}};
  }

  for (auto& [k, f] : outs) {
    f.close();
    if (!f) throw Error(o.out_dir + ": write failed");
  }
  std::ofstream rj(fs::path(o.out_dir) / "report.json");
  rj << rep.to_json().dump(1) << "\n";
  return rep;
}

}  // namespace slm::data
