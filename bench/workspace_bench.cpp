// The context graph at the cursor (issue 45) on a large tree: how fast `slm serve --workspace` indexes it, what the
// index holds in memory, and what each /infill request adds to its latency.
//   workspace_bench DIR [--requests N] [--prefix-chars C] [--suffix-lines L] [--seed S]
// In one run, on one thread:
//   - Workspace(DIR).refresh() from cold (every file parsed and linked) with its resident memory growth (VmRSS),
//     then a refresh with nothing changed (the cost of one poll);
//   - the reference: data::build_call_graph over DIR (what `slm data graphs` does for one package, the same parser
//     and linker without the index's bookkeeping);
//   - context_at for N cursors picked by a seeded hash among the graph's function definitions (the cursor after the
//     indentation of the definition's middle line), each with the window an editor sends: the whole lines within C
//     characters before the cursor's line (llama.vim's 1,500 by default here) and L lines after it.
// Prints files/s and MiB/s of both, the index's time over the reference's, and the p50/p95/max of context_at.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "slm/data/callgraph.h"
#include "slm/data/hashing.h"
#include "slm/workspace/cursor_context.h"
#include "slm/workspace/workspace.h"

namespace {

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double rss_mib() {  // VmRSS of this process
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

double percentile(std::vector<double> v, double p) {  // nearest rank
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size()) + 0.999999);
  return v[std::min(v.size(), std::max<size_t>(k, 1)) - 1];
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr,
                 "usage: workspace_bench DIR [--requests N] [--prefix-chars C] [--suffix-lines L] [--seed S]\n");
    return 2;
  }
  const std::string dir = argv[1];
  size_t requests = 200, prefix_chars = 1500, suffix_lines = 16;
  uint64_t seed = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--requests"))
      requests = std::stoul(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--prefix-chars"))
      prefix_chars = std::stoul(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--suffix-lines"))
      suffix_lines = std::stoul(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seed"))
      seed = std::stoull(argv[i + 1]);
    else {
      std::fprintf(stderr, "workspace_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  const double mib = 1024.0 * 1024.0;

  const double rss1 = rss_mib();
  slm::workspace::Workspace ws(dir);
  const double cold_s = seconds([&] { ws.refresh(); });
  const double rss2 = rss_mib();
  const double warm_s = seconds([&] { ws.refresh(); });
  const auto st = ws.status();
  std::printf(
      "workspace  cold refresh: %llu files, %.1f MiB, %llu functions, %llu skipped in %.2f s: %.0f files/s, "
      "%.2f MiB/s; resident memory +%.0f MiB (%.0f MiB before)\n",
      static_cast<unsigned long long>(st.files), st.bytes / mib, static_cast<unsigned long long>(st.functions),
      static_cast<unsigned long long>(st.skipped), cold_s, st.files / cold_s, st.bytes / mib / cold_s, rss2 - rss1,
      rss1);
  std::printf("workspace  CMake files: %llu, %llu functions, macros and targets\n",
              static_cast<unsigned long long>(st.cmake_files), static_cast<unsigned long long>(st.cmake_definitions));
  std::printf("workspace  refresh with nothing changed (one poll): %.1f ms\n", 1e3 * warm_s);

  // The reference, after the index (so that the index's memory is measured on a fresh heap): the one-shot graph of
  // `slm data graphs` (it also enters hidden directories such as Debian's .pc).
  uint64_t ref_files = 0, ref_bytes = 0, ref_functions = 0;
  const double ref_s = seconds([&] {
    slm::data::CallGraphOptions o;
    o.src_dir = dir;
    const auto g = slm::data::build_call_graph(o);
    ref_files = g.files;
    ref_bytes = g.bytes;
    ref_functions = g.functions.size();
  });
  std::printf(
      "reference  build_call_graph: %llu files, %.1f MiB, %llu functions in %.2f s: %.0f files/s, %.2f MiB/s; "
      "the workspace's cold refresh took %.2fx its time\n",
      static_cast<unsigned long long>(ref_files), ref_bytes / mib, static_cast<unsigned long long>(ref_functions),
      ref_s, ref_files / ref_s, ref_bytes / mib / ref_s, cold_s / ref_s);

  // Cursors: a seeded pick of the graph's definitions, the cursor after the indentation of each one's middle line.
  const auto graph = ws.graph();
  if (!graph) {
    std::fprintf(stderr, "workspace_bench: %s: nothing indexed\n", dir.c_str());
    return 1;
  }
  const auto& fns = graph->graph().functions;
  std::vector<uint32_t> order(fns.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return slm::data::hash64(fns[a].file + ":" + std::to_string(fns[a].line), seed) <
           slm::data::hash64(fns[b].file + ":" + std::to_string(fns[b].line), seed);
  });
  std::vector<double> ms;
  size_t with_function = 0, chunks = 0;
  std::string last_file, text;
  for (uint32_t fi : order) {
    if (ms.size() == requests) break;
    const auto& f = fns[fi];
    const uint32_t last = f.last_line();
    if (last < f.line + 2) continue;
    if (f.file != last_file) text = read_all(dir + "/" + f.file), last_file = f.file;
    const uint32_t line = (f.line + last) / 2;  // 1-based
    size_t start = 0;
    for (uint32_t l = 1; l < line && start != std::string::npos; ++l) {
      start = text.find('\n', start);
      if (start != std::string::npos) ++start;
    }
    if (start == std::string::npos) continue;
    const size_t cursor = text.find_first_not_of(" \t", start);
    if (cursor == std::string::npos) continue;
    // The window: whole lines within prefix_chars before the cursor's line, then suffix_lines lines after it.
    size_t from = 0;
    if (start > prefix_chars) {
      const size_t nl = text.find('\n', start - prefix_chars - 1);
      from = nl == std::string::npos || nl >= start ? start : nl + 1;
    }
    size_t to = text.find('\n', cursor);
    for (size_t l = 0; l < suffix_lines && to != std::string::npos; ++l) to = text.find('\n', to + 1);
    const std::string before = text.substr(from, cursor - from);
    const std::string after = text.substr(cursor, to == std::string::npos ? std::string::npos : to + 1 - cursor);
    slm::workspace::CursorContext ctx;
    ms.push_back(1e3 * seconds([&] { ctx = slm::workspace::context_at(*graph, f.file, before, after); }));
    with_function += !ctx.function.empty();
    chunks += ctx.chunks.size();
  }
  std::printf(
      "context_at %zu cursors (%zu-char prefix, %zu suffix lines): p50 %.2f ms, p95 %.2f ms, max %.2f ms; a "
      "function found at %zu, %.1f chunks on average\n",
      ms.size(), prefix_chars, suffix_lines, percentile(ms, 50), percentile(ms, 95), percentile(ms, 100), with_function,
      ms.empty() ? 0.0 : static_cast<double>(chunks) / ms.size());
  return 0;
}
