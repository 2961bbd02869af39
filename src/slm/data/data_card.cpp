#include "slm/data/data_card.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "slm/data/text.h"
#include "slm/util/error.h"

namespace slm::data {
namespace {

namespace fs = std::filesystem;

const char* const kSplits[] = {"train", "validation", "test"};

// The largest `top` entries by bytes; the rest as one "(N others)" entry.
std::vector<std::pair<std::string, uint64_t>> largest(const std::unordered_map<std::string, uint64_t>& by, size_t top) {
  std::vector<std::pair<std::string, uint64_t>> v(by.begin(), by.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (v.size() > top) {
    uint64_t rest = 0;
    for (size_t i = top; i < v.size(); ++i) rest += v[i].second;
    const size_t others = v.size() - top;
    v.resize(top);
    v.emplace_back("(" + std::to_string(others) + " others)", rest);
  }
  return v;
}

// The first lines of text: at most `lines` lines and `bytes` bytes. A line that does not fit ends the excerpt; a first
// line longer than `bytes` is cut, at a UTF-8 character boundary.
std::string excerpt(const std::string& text, size_t lines, size_t bytes) {
  size_t end = 0;
  for (size_t n = 0; n < lines && end < text.size(); ++n) {
    const size_t nl = text.find('\n', end);
    const size_t next = nl == std::string::npos ? text.size() : nl + 1;
    if (next > bytes) {
      if (n == 0) {
        end = bytes;
        while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
      }
      break;
    }
    end = next;
  }
  std::string out = text.substr(0, end);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Code usually opens with a license header: for the code domains the example starts after the leading comment and
// blank lines (a shell script keeps its shebang line out too), unless nothing follows them.
std::string_view past_header(std::string_view text, const std::string& domain) {
  const bool hash = domain == "cmake" || domain == "shell";
  const bool slash = domain == "cpp" || domain == "algorithm";
  if (!hash && !slash) return text;
  size_t at = 0;
  bool in_block = false;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    const size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    std::string_view line = text.substr(at, next - at);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    bool comment = line.empty() || line == "\n";
    if (slash) {
      if (in_block) {
        comment = true;
        if (line.find("*/") != std::string_view::npos) in_block = false;
      } else if (line.starts_with("//")) {
        comment = true;
      } else if (line.starts_with("/*")) {
        comment = true;
        in_block = line.find("*/", 2) == std::string_view::npos;
      }
    } else if (line.starts_with("#")) {
      comment = true;
    }
    if (!comment) break;
    at = next;
  }
  return at < text.size() ? text.substr(at) : text;
}

std::string percent(uint64_t part, uint64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%",
                whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

std::string megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

std::string fence_language(const std::string& domain) {
  if (domain == "cpp" || domain == "algorithm" || domain == "cpp-graphs") return "cpp";
  if (domain == "cmake") return "cmake";
  if (domain == "shell") return "sh";
  return "text";
}

}  // namespace

std::vector<DomainCard> data_cards(const DataCardOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.corpus_dir, ec)) throw Error("data card: corpus directory not found: " + o.corpus_dir);
  nlohmann::json report;
  if (std::ifstream rf(fs::path(o.corpus_dir) / "report.json"); rf) {
    try {
      report = nlohmann::json::parse(rf);
    } catch (const nlohmann::json::exception& e) {
      throw Error(o.corpus_dir + "/report.json: " + e.what());
    }
  }
  std::vector<std::string> domains;
  if (report.contains("domains"))
    for (const auto& d : report["domains"]) domains.push_back(d.value("domain", ""));
  std::vector<std::string> extra;
  for (const auto& e : fs::directory_iterator(o.corpus_dir, ec))
    if (e.is_directory() && fs::exists(e.path() / "train.jsonl") &&
        std::find(domains.begin(), domains.end(), e.path().filename().string()) == domains.end())
      extra.push_back(e.path().filename().string());
  std::sort(extra.begin(), extra.end());
  domains.insert(domains.end(), extra.begin(), extra.end());

  std::vector<DomainCard> cards;
  for (const auto& domain : domains) {
    DomainCard c;
    c.domain = domain;
    if (report.contains("domains"))
      for (const auto& d : report["domains"])
        if (d.value("domain", "") == domain) c.report = d;
    std::unordered_map<std::string, uint64_t> packages, licenses;
    bool any = false;
    for (const char* split : {"validation", "test", "train"}) {  // held-out first: the example comes from there
      const fs::path f = fs::path(o.corpus_dir) / domain / (std::string(split) + ".jsonl");
      if (!fs::exists(f)) continue;
      any = true;
      for_each_text_document(
          {f.string()},
          [&](const TextDocument& d) {
            ++c.documents;
            c.bytes += d.text.size();
            ++c.split_documents[split];
            c.split_bytes[split] += d.text.size();
            packages[d.meta.package] += d.text.size();
            licenses[d.meta.license.empty() ? "(none recorded)" : d.meta.license] += d.text.size();
            if (c.example.empty() && std::count(d.text.begin(), d.text.end(), '\n') >= 2) {
              c.example = excerpt(std::string(past_header(d.text, domain)), o.example_lines, o.example_bytes);
              c.example_from =
                  std::string(split) + ": " + d.meta.package + ", " + d.meta.path + " (" + d.meta.license + ")";
            }
          },
          UINT64_MAX);
    }
    if (!any) continue;
    c.packages = packages.size();
    c.licenses = licenses.size();
    c.top_packages = largest(packages, o.top);
    c.top_licenses = largest(licenses, o.top);
    cards.push_back(std::move(c));
  }
  if (cards.empty()) throw Error("data card: no domain (<domain>/train.jsonl) under " + o.corpus_dir);
  return cards;
}

std::string data_cards_markdown(const std::vector<DomainCard>& cards) {
  std::ostringstream o;
  for (const auto& c : cards) {
    auto split = [&](const std::map<std::string, uint64_t>& m, const char* s) {
      auto it = m.find(s);
      return it == m.end() ? uint64_t{0} : it->second;
    };
    o << "### " << c.domain << "\n\n";
    o << "- **Size:** " << c.documents << " documents, " << megabytes(c.bytes);
    if (c.report.contains("tokens") && c.report["tokens"].get<uint64_t>() > 0)
      o << ", " << c.report["tokens"].get<uint64_t>() << " tokens";
    o << "; train / validation / test: " << split(c.split_documents, "train") << " / "
      << split(c.split_documents, "validation") << " / " << split(c.split_documents, "test") << " documents ("
      << megabytes(split(c.split_bytes, "train")) << " / " << megabytes(split(c.split_bytes, "validation")) << " / "
      << megabytes(split(c.split_bytes, "test")) << ").\n";
    o << "- **Sources:** " << c.packages << " packages; by bytes: ";
    for (size_t i = 0; i < c.top_packages.size(); ++i)
      o << (i ? ", " : "") << c.top_packages[i].first << " " << percent(c.top_packages[i].second, c.bytes);
    o << ".\n- **Licenses** (" << c.licenses << "; by bytes): ";
    for (size_t i = 0; i < c.top_licenses.size(); ++i)
      o << (i ? ", " : "") << c.top_licenses[i].first << " " << percent(c.top_licenses[i].second, c.bytes);
    o << ".\n";
    if (!c.report.is_null()) {
      o << "- **Removed by the build:** " << c.report.value("exact_duplicates", uint64_t{0}) << " exact and "
        << c.report.value("near_duplicates", uint64_t{0}) << " near duplicates ("
        << c.report.value("cross_domain_duplicates", uint64_t{0}) << " of another domain's document), "
        << c.report.value("contaminated", uint64_t{0}) << " contaminated, "
        << c.report.value("dropped_size", uint64_t{0}) << " too small or large, "
        << c.report.value("dropped_unclean", uint64_t{0}) << " not clean UTF-8 text; of "
        << c.report.value("candidates", uint64_t{0}) << " candidates.\n";
      if (c.report.contains("generator") && !c.report["generator"].empty())
        o << "- **Generator:** `" << c.report["generator"].dump() << "`\n";
    }
    if (!c.example.empty()) {
      const std::string fence = c.example.find("```") != std::string::npos ? "````" : "```";
      o << "- **Example** (" << c.example_from << "), its first lines:\n\n"
        << fence << fence_language(c.domain) << "\n"
        << c.example << "\n"
        << fence << "\n";
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace slm::data
