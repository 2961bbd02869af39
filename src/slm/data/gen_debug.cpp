#include "slm/data/gen_debug.h"

#include <signal.h>
#include <sys/stat.h>

#include <cstring>
#include <mutex>
#include <regex>

#include "slm/data/hashing.h"
#include "slm/util/error.h"
#include "slm/util/process.h"

namespace slm::data {

namespace {

const std::vector<std::string> kTypes = {"int", "long", "double", "float", "short", "unsigned"};
const std::vector<std::string> kSignedTypes = {"int", "long", "long long"};
const std::vector<std::string> kSizes = {"4", "5", "6", "8", "10", "12", "16", "20", "32", "64"};
const std::vector<std::string> kSmall = {"2", "3", "5", "7", "9", "11"};
const std::vector<std::string> kNames = {"scores", "samples", "prices", "weights", "pixels",  "readings",
                                         "counts", "buffer",  "values", "offsets", "temps",   "ids",
                                         "ages",   "delays",  "votes",  "depths",  "volumes", "ranks"};
const std::vector<std::string> kFunctions = {"fill",    "load",    "compute", "process", "update",  "collect",
                                             "scan",    "build",   "tally",   "refresh", "measure", "resolve",
                                             "advance", "analyze", "ingest",  "reduce"};
const std::vector<std::string> kStructs = {"Order", "Packet", "Node",   "Account", "Session", "Widget",
                                           "Job",   "Sensor", "Player", "Record",  "Ticket",  "Frame"};
const std::vector<std::string> kMembers = {"count",  "total", "level", "port",  "priority",
                                           "weight", "score", "depth", "width", "rank"};

std::string pick(const std::vector<std::string>& pool, uint64_t key, uint64_t salt) {
  return pool[mix64(key ^ mix64(salt)) % pool.size()];
}

std::string tool_name(DebugTool t, const std::string& compiler) {
  switch (t) {
    case DebugTool::kSanitizer: return "AddressSanitizer + UndefinedBehaviorSanitizer";
    case DebugTool::kThreadSanitizer: return "ThreadSanitizer";
    case DebugTool::kValgrind: return "valgrind (memcheck)";
    case DebugTool::kDebugMode: return "libstdc++ debug mode (_GLIBCXX_DEBUG)";
    case DebugTool::kGdb: return "gdb (batch backtrace)";
    case DebugTool::kCompiler: return compiler + " (compile)";
    case DebugTool::kLinker: return compiler + " (link)";
  }
  return "";
}

std::string join_command(const std::vector<std::string>& env, const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& e : env) s += e + " ";
  for (size_t i = 0; i < argv.size(); ++i) {
    const bool quote = argv[i].find(' ') != std::string::npos;
    s += (i ? " " : "") + (quote ? "'" + argv[i] + "'" : argv[i]);
  }
  return s;
}

// Makes the captured output independent of where and when it ran: the private build directory becomes ".",
// process/thread ids are renumbered from a per-sample base, and ASan's 20-line shadow-byte legend (the same in
// every report) is dropped. Nothing else is changed.
std::string normalize_output(std::string out, const std::string& dir, uint64_t base_pid) {
  {
    std::string replaced;
    size_t from = 0;
    for (size_t at; (at = out.find(dir, from)) != std::string::npos; from = at + dir.size())
      replaced.append(out, from, at - from).append(".");
    out = replaced.append(out, from, std::string::npos);
  }
  const size_t legend = out.find("Shadow byte legend");
  if (legend != std::string::npos) {
    const size_t line_start = out.rfind('\n', legend) == std::string::npos ? 0 : out.rfind('\n', legend) + 1;
    const size_t abort_at = out.find("ABORTING", legend);
    size_t end = abort_at == std::string::npos ? out.size() : out.rfind('\n', abort_at);
    end = end == std::string::npos || end < line_start ? out.size() : end + 1;
    out.erase(line_start, end - line_start);
  }
  static const std::regex pid_re(R"((==|pid=|process |LWP |\[New Thread 0x[0-9a-f]+ \(LWP )(\d+))");
  std::map<std::string, std::string> renumber;
  std::string result;
  auto begin = std::sregex_iterator(out.begin(), out.end(), pid_re);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    const std::string id = m[2].str();
    auto [pos, fresh] = renumber.emplace(id, "");
    if (fresh) pos->second = std::to_string(base_pid + renumber.size() - 1);
    result.append(out, last, static_cast<size_t>(m.position(0)) - last);
    result += m[1].str() + pos->second;
    last = static_cast<size_t>(m.position(0) + m.length(0));
  }
  result.append(out, last, std::string::npos);
  return result;
}

std::string exit_description(const ProcessResult& r) {
  if (r.timed_out) return "timed out";
  if (r.signal) return std::string("killed by signal ") + sigabbrev_np(r.signal);
  return "exit status " + std::to_string(r.exit_code);
}

bool reports_error(const std::string& out) {
  for (const char* marker : {"Sanitizer", "runtime error:", "Error: attempt", "error:", "ERROR SUMMARY: 1",
                             "terminate called", "Assertion", "Program received signal"})
    if (out.find(marker) != std::string::npos) return true;
  return false;
}

struct Build {
  std::vector<std::string> compile;  // argv
  std::vector<std::string> run;      // argv ("" = compile/link only)
  std::vector<std::string> env;
};

Build plan(DebugTool tool, const std::string& cxx, const std::string& name) {
  const std::string src = name + ".cpp", exe = "./" + name;
  switch (tool) {
    case DebugTool::kSanitizer:
      return {
          {cxx, "-std=c++20", "-g", "-O0", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", src, "-o", name},
          {exe},
          {"ASAN_OPTIONS=detect_stack_use_after_return=1", "UBSAN_OPTIONS=print_stacktrace=1"}};
    case DebugTool::kThreadSanitizer:
      return {{cxx, "-std=c++20", "-g", "-O1", "-fsanitize=thread", src, "-o", name, "-pthread"},
              {exe},
              {"TSAN_OPTIONS=detect_deadlocks=1:second_deadlock_stack=1"}};
    case DebugTool::kValgrind:
      return {{cxx, "-std=c++20", "-g", "-O0", src, "-o", name},
              {"valgrind", "--track-origins=yes", "--error-exitcode=99", exe},
              {}};
    case DebugTool::kDebugMode:
      return {{cxx, "-std=c++20", "-g", "-O0", "-D_GLIBCXX_DEBUG", src, "-o", name}, {exe}, {}};
    case DebugTool::kGdb:
      return {{cxx, "-std=c++20", "-g", "-O0", src, "-o", name},
              {"gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 8", exe},
              {}};
    case DebugTool::kCompiler: return {{cxx, "-std=c++20", "-c", src, "-o", name + ".o"}, {}, {}};
    case DebugTool::kLinker: return {{cxx, "-std=c++20", src, "-o", name}, {}, {}};
  }
  return {};
}

}  // namespace

std::map<std::string, std::string> debug_slots(const BugCase& c, int variant) {
  const uint64_t key = hash64(c.id + "#" + std::to_string(variant), 0x6465627567ULL);
  std::map<std::string, std::string> s;
  s["T"] = pick(kTypes, key, 1);
  s["I"] = pick(kSignedTypes, key, 2);
  s["N"] = pick(kSizes, key, 3);
  s["K"] = pick(kSmall, key, 4);
  s["A"] = pick(kNames, key, 5);
  s["B"] = pick(kNames, key, 6);
  for (uint64_t salt = 7; s["B"] == s["A"]; ++salt) s["B"] = pick(kNames, key, salt);
  s["F"] = pick(kFunctions, key, 8) + "_" + s["A"];
  s["S"] = pick(kStructs, key, 9);
  s["M"] = pick(kMembers, key, 10);
  if (!c.alternatives.empty())
    for (const auto& [k, v] : c.alternatives[static_cast<size_t>(variant) % c.alternatives.size()]) s[k] = v;
  return s;
}

std::string fill_slots(const std::string& templ, const std::map<std::string, std::string>& slots) {
  std::string out = templ;
  // Slot values may themselves hold slots (a case's alternatives use ${T}, ${A}, ...): substitute to a fixpoint.
  for (int pass = 0; pass < 4; ++pass) {
    std::string next;
    bool changed = false;
    for (size_t i = 0; i < out.size();) {
      if (out.compare(i, 2, "${") == 0) {
        const size_t end = out.find('}', i);
        if (end != std::string::npos) {
          auto it = slots.find(out.substr(i + 2, end - i - 2));
          if (it == slots.end()) throw Error("debug corpus: unknown slot " + out.substr(i, end - i + 1));
          next += it->second;
          i = end + 1;
          changed = true;
          continue;
        }
      }
      next += out[i++];
    }
    out = std::move(next);
    if (!changed) break;
  }
  return out;
}

DebugSample run_bug_case(const BugCase& c, int variant, const DebugOptions& o) {
  const auto slots = debug_slots(c, variant);
  DebugSample s;
  s.case_id = c.id;
  s.variant = variant;
  // Two compilers: their diagnostics and sanitizer runtimes word the same fault differently.
  s.compiler = variant % 2 == 0 && !c.clang_only ? "g++" : "clang++";
  const std::string name = slots.at("F");
  s.file = name + ".cpp";
  s.code = fill_slots(c.code, slots);
  const std::string fixed = c.fixed.empty() ? "" : fill_slots(c.fixed, slots);
  const Build b = plan(c.tool, s.compiler, name);
  const uint64_t base_pid = 1000 + hash64(c.id + std::to_string(variant)) % 60000;

  const std::string dir = make_temp_dir(o.work_dir, "slm-debug-");
  struct Cleanup {
    std::string d;
    ~Cleanup() { remove_dir_tree(d); }
  } cleanup{dir};
  ProcessOptions po;
  po.timeout_s = o.timeout_s;
  po.merge_stderr = true;
  po.env = {"LC_ALL=C"};

  // Runs `code` in dir/sub: compile, then the tool. Returns the output the user would see.
  auto attempt = [&](const std::string& sub, const std::string& code, bool& clean, std::string& shown,
                     ProcessResult& last) {
    const std::string d = dir + "/" + sub;
    if (mkdir(d.c_str(), 0755) != 0) throw Error(d + ": cannot create");
    write_text_file(d + "/" + s.file, code);
    po.cwd = d;
    auto cr = run_process(b.compile, po);
    shown = cr.out;
    last = cr;
    clean = cr.ok() && cr.out.find("error") == std::string::npos;
    if (!cr.ok() || b.run.empty()) {
      if (cr.ok() && (c.tool == DebugTool::kCompiler || c.tool == DebugTool::kLinker) && sub == "fix") {
        // A fixed compile/link case must also link and run.
        auto link = run_process({s.compiler, "-std=c++20", s.file, "-o", name}, po);
        auto run = link.ok() ? run_process({"./" + name}, po) : link;
        clean = clean && link.ok() && run.ok();
        shown = run.out;
      }
      return;
    }
    ProcessOptions ro = po;
    ro.no_aslr = true;
    for (const auto& e : b.env) ro.env.push_back(e);
    // The fix of a gdb case is run as a plain program: exit 0 is the proof.
    const bool plain = sub == "fix" && c.tool == DebugTool::kGdb;
    auto rr = run_process(plain ? std::vector<std::string>{"./" + name} : b.run, ro);
    shown = cr.out + rr.out;
    last = rr;
    clean = rr.ok() && !reports_error(rr.out);
  };

  bool bug_clean = false;
  ProcessResult bug_last;
  std::string raw;
  attempt("bug", s.code, bug_clean, raw, bug_last);
  s.output = clip_lines(normalize_output(raw, dir + "/bug", base_pid), o.max_output_bytes);
  s.reproduced = !bug_clean && raw.find(c.expect) != std::string::npos;
  if (!s.reproduced) {
    s.why_dropped = "the output lacks \"" + c.expect + "\" (" + exit_description(bug_last) + ")";
    return s;
  }
  if (!fixed.empty()) {
    bool fix_clean = false;
    ProcessResult fix_last;
    std::string fix_raw;
    attempt("fix", fixed, fix_clean, fix_raw, fix_last);
    if (fix_clean) {
      s.fix_verified = true;
      s.fixed = fixed;
      s.fixed_output = clip_lines(normalize_output(fix_raw, dir + "/fix", base_pid), 2000);
    }
  }
  s.command = join_command({}, b.compile);
  if (!b.run.empty()) s.command += " && " + join_command(b.env, b.run);

  std::string t = "# " + c.title + "\n\nTool: " + tool_name(c.tool, s.compiler) + ". Program `" + s.file +
                  "`:\n\n```cpp\n" + s.code + "```\n\n```console\n$ " + s.command + "\n" + s.output;
  if (!s.output.empty() && s.output.back() != '\n') t += "\n";
  t += "```\n(" + exit_description(bug_last) + ")\n";
  if (s.fix_verified) {
    t += "\nFix: " + c.fix_note + "\n\n```cpp\n" + s.fixed + "```\n\nWith the fix the same build " +
         std::string(b.run.empty() ? "succeeds, and the program links and runs" : "runs") +
         " cleanly (exit status 0, no report)";
    t += s.fixed_output.empty() ? ".\n" : "; it prints:\n\n```\n" + s.fixed_output + "```\n";
  }
  s.text = std::move(t);
  return s;
}

std::vector<GeneratedDoc> generate_debug_corpus(const DebugOptions& o, DebugStats* stats, const ProgressFn& progress) {
  if (o.variants <= 0) return {};  // off: e.g. only the source packages' patches are wanted
  for (const char* tool : {"g++", "clang++", "gdb", "valgrind"})
    if (!program_available(tool))
      throw Error(std::string("debug corpus: ") + tool + " is not installed (scripts/data-deps.sh installs it)");
  const auto& cases = bug_catalogue();
  const size_t n = cases.size() * static_cast<size_t>(o.variants);
  std::vector<DebugSample> samples(n);
  std::mutex mu;
  uint64_t done = 0;
  parallel_for(n, o.jobs, [&](size_t i) {
    samples[i] = run_bug_case(cases[i / static_cast<size_t>(o.variants)], static_cast<int>(i % o.variants), o);
    std::lock_guard<std::mutex> lock(mu);
    if (progress) progress(++done, n);
  });
  std::vector<GeneratedDoc> docs;
  DebugStats st;
  for (const auto& s : samples) {
    ++st.attempted;
    if (!s.reproduced) {
      ++st.dropped[s.case_id];
      continue;
    }
    ++st.kept;
    st.fixes_verified += s.fix_verified;
    GeneratedDoc d;
    d.meta = {"slm-ensemble", "generated/debug/" + s.case_id + "/v" + std::to_string(s.variant) + "/" + s.file,
              "generated by slm-ensemble (programs written for the corpus; output of gcc/clang/gdb/valgrind)", "debug"};
    d.text = s.text;
    d.split_key = "debug:" + s.case_id;
    d.extra = {{"case", s.case_id}, {"compiler", s.compiler}, {"fix_verified", s.fix_verified}};
    docs.push_back(std::move(d));
  }
  if (stats) *stats = st;
  return docs;
}

}  // namespace slm::data
