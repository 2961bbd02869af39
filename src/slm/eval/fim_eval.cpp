#include "slm/eval/fim_eval.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "slm/data/callgraph.h"
#include "slm/data/hashing.h"
#include "slm/engine/generation.h"
#include "slm/eval/context_adherence.h"
#include "slm/eval/stop.h"
#include "slm/text/text_generation.h"
#include "slm/util/edit_distance.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/gnuplot.h"
#include "slm/workspace/cursor_context.h"

namespace slm::eval {

namespace {

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

std::string rtrim(std::string s) {
  while (!s.empty() && (is_blank(s.back()) || s.back() == '\n')) s.pop_back();
  return s;
}

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

// Code points of UTF-8 text; a byte that starts no valid sequence is one unit of its own.
std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (!ok) {
      out.push_back(0x110000u + b);  // outside Unicode: never equal to a real code point
      ++i;
      continue;
    }
    uint32_t cp = n == 1 ? b : b & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += n;
  }
  return out;
}

// The n items first under a seeded hash of their names (all of them when there are no more), in their given order.
template <class T>
std::vector<T> keep_by_hash(std::vector<T> items, size_t n, uint64_t seed,
                            const std::function<std::string(const T&)>& name) {
  if (items.size() <= n) return items;
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t i = 0; i < items.size(); ++i) order.push_back({data::hash64(name(items[i]), seed), i});
  std::sort(order.begin(), order.end());
  order.resize(n);
  std::vector<size_t> keep;
  for (const auto& o : order) keep.push_back(o.second);
  std::sort(keep.begin(), keep.end());
  std::vector<T> kept;
  for (size_t i : keep) kept.push_back(std::move(items[i]));
  return kept;
}

std::string dirname_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? std::string() : path.substr(0, slash);
}

// A path as the call graph keys it: relative (a corpus records absolute paths of the files it read).
std::string graph_path(const std::string& path) {
  return path.substr(path.find_first_not_of('/'));
}

}  // namespace

std::vector<HeldOutFile> read_held_out(const std::string& corpus, const std::string& domain, const std::string& split) {
  const std::string path = corpus + "/" + domain + "/" + split + ".jsonl";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the " + split + " split of domain " + domain + " (slm data build --out)");
  std::vector<HeldOutFile> files;
  size_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string() || !j.contains("path") ||
        !j["path"].is_string())
      throw Error(path + ":" + std::to_string(n) + ": not a corpus record (a JSON object with text and path)");
    HeldOutFile f;
    f.path = j["path"].get<std::string>();
    if (!data::is_cpp_source_name(f.path)) continue;
    f.package = j.value("package", std::string());
    f.text = j["text"].get<std::string>();
    files.push_back(std::move(f));
  }
  return files;
}

const char* fim_kind_name(FimKind kind) {
  return kind == FimKind::kLine ? "line" : "body";
}

std::vector<FimCase> line_cases(const std::string& path, const std::string& text, size_t file, size_t min_line_chars) {
  std::vector<FimCase> cases;
  bool in_comment = false;  // inside a /* */ comment begun on an earlier line
  size_t number = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++number;
    const std::string line = text.substr(start, end - start);
    size_t indent = 0;
    while (indent < line.size() && (line[indent] == ' ' || line[indent] == '\t')) ++indent;
    const std::string rest = line.substr(indent);
    const bool was_in_comment = in_comment;
    // Where this line leaves the comment state: the last "/*" or "*/" on it decides (strings are not looked at:
    // simple, and a "/*" inside a string is rare in a line's text).
    const size_t open = line.rfind("/*"), close = line.rfind("*/");
    if (open != std::string::npos && (close == std::string::npos || close < open)) in_comment = true;
    if (close != std::string::npos && (open == std::string::npos || close > open)) in_comment = false;
    const bool comment_only =
        was_in_comment || rest.rfind("//", 0) == 0 || rest.rfind("/*", 0) == 0 || rest.rfind("*", 0) == 0;
    if (!comment_only && rtrim(rest).size() >= min_line_chars) {
      FimCase c;
      c.kind = FimKind::kLine;
      c.file = file;
      c.line = number;
      c.cursor = start + indent;
      c.prefix = text.substr(0, start);
      c.prompt = line.substr(0, indent);
      c.suffix = text.substr(end);
      c.truth = rest;
      c.name = path + ":" + std::to_string(number);
      cases.push_back(std::move(c));
    }
    start = end + 1;
  }
  return cases;
}

std::vector<FimCase> body_cases(const std::string& path, const std::string& text, size_t file,
                                const BodyCutOptions& cut, const std::string& quote_dir) {
  std::vector<FimCase> cases;
  for (auto& b : cut_function_bodies(path, text, quote_dir, cut)) {
    FimCase c;
    c.kind = FimKind::kBody;
    c.file = file;
    c.cursor = b.problem.prompt.size();
    c.line = static_cast<size_t>(std::count(b.problem.prompt.begin(), b.problem.prompt.end(), '\n')) + 1;
    c.prefix = b.problem.prompt;  // through the '{' line: the cursor is at column 0 of the next
    c.suffix = "\n" + b.problem.tests;
    c.truth = b.body;
    c.name = path + ":" + std::to_string(c.line);
    c.problem = std::move(b.problem);
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<FimCase> make_fim_cases(const std::vector<HeldOutFile>& files, const FimCaseOptions& o) {
  const std::function<std::string(const FimCase&)> name = [](const FimCase& c) { return c.name; };
  std::vector<FimCase> lines, bodies;
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    if (o.line_cases > 0)
      for (auto& c : keep_by_hash(line_cases(f.path, f.text, i, o.min_line_chars), o.lines_per_file, o.seed, name))
        lines.push_back(std::move(c));
    if (o.body_cases > 0) {
      // The judge compiles the file elsewhere: its own directory (on this machine when the corpus was read from
      // installed packages) resolves its #include "...".
      for (auto& c : body_cases(f.path, f.text, i, o.cut, dirname_of(f.path))) bodies.push_back(std::move(c));
    }
  }
  auto cases = keep_by_hash(std::move(lines), o.line_cases, o.seed, name);
  for (auto& c : keep_by_hash(std::move(bodies), o.body_cases, o.seed, name)) cases.push_back(std::move(c));
  std::stable_sort(cases.begin(), cases.end(), [](const FimCase& a, const FimCase& b) {
    return std::tie(a.file, a.line, a.kind) < std::tie(b.file, b.line, b.kind);
  });
  return cases;
}

std::string copy_line_above(const std::string& prefix) {
  size_t end = prefix.size();
  while (end > 0) {
    const size_t start = end >= 2 ? prefix.rfind('\n', end - 2) : std::string::npos;
    const size_t from = start == std::string::npos ? 0 : start + 1;
    std::string line = prefix.substr(from, end - from);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    const size_t text = line.find_first_not_of(" \t\r");
    if (text != std::string::npos) return rtrim(line.substr(text));
    end = from;
  }
  return "";
}

size_t levenshtein(const std::string& a, const std::string& b) { return edit_distance(code_points(a), code_points(b)); }

double edit_similarity(const std::string& a, const std::string& b) {
  const size_t longest = std::max(code_points(a).size(), code_points(b).size());
  if (longest == 0) return 1.0;
  return 1.0 - static_cast<double>(levenshtein(a, b)) / static_cast<double>(longest);
}

bool first_line_match(const std::string& prediction, const std::string& truth) {
  return rtrim(first_line(prediction)) == rtrim(first_line(truth));
}

std::string fim_prediction(const FimCase& c, const std::string& generated) {
  if (c.kind == FimKind::kLine) return first_line(generated);
  std::string body = truncate_at_stop(generated, c.problem.stop_tokens);
  while (!body.empty() && body.back() == '\n') body.pop_back();
  return body;
}

const char* fim_context_name(FimContext mode) {
  switch (mode) {
    case FimContext::kNone: return "none";
    case FimContext::kNeighbours: return "neighbours";
    case FimContext::kGraph: return "graph";
  }
  return "?";
}

std::vector<FimContext> parse_fim_contexts(const std::string& list) {
  std::vector<FimContext> out;
  std::stringstream ss(list);
  for (std::string m; std::getline(ss, m, ',');) {
    if (m.empty()) continue;
    if (m == "none")
      out.push_back(FimContext::kNone);
    else if (m == "neighbours" || m == "neighbors")
      out.push_back(FimContext::kNeighbours);
    else if (m == "graph")
      out.push_back(FimContext::kGraph);
    else
      throw Error("--context: unknown mode '" + m + "' (none, neighbours, graph)");
    if (std::count(out.begin(), out.end(), out.back()) > 1) throw Error("--context: " + m + " is given twice");
  }
  if (out.empty()) throw Error("--context: give at least one of none, neighbours, graph");
  return out;
}

FimContextSource::FimContextSource(const std::vector<HeldOutFile>& files, FimContextOptions options)
    : files_(files), options_(options) {}
FimContextSource::~FimContextSource() = default;

std::vector<text::InfillChunk> FimContextSource::chunks(const FimCase& c, FimContext mode) {
  std::vector<text::InfillChunk> out;
  const HeldOutFile& current = files_.at(c.file);
  if (mode == FimContext::kNeighbours) {
    std::vector<const HeldOutFile*> others;
    for (const auto& f : files_)
      if (&f != &current && f.package == current.package) others.push_back(&f);
    std::sort(others.begin(), others.end(), [](auto* a, auto* b) { return a->path < b->path; });
    for (const auto* f : others) {
      if (out.size() == options_.max_chunks) break;
      size_t end = 0;
      for (size_t l = 0; l < options_.chunk_lines && end != std::string::npos; ++l) {
        end = f->text.find('\n', end);
        if (end != std::string::npos) ++end;
      }
      out.push_back({f->path, f->text.substr(0, end)});
    }
  } else if (mode == FimContext::kGraph) {
    const data::LinkedGraph& g = graph(current.package);
    // What slm serve --workspace gives the same cursor: the window without the text to predict is parsed on its own,
    // so the calls that text makes cannot choose the chunks.
    workspace::ContextOptions o;
    o.max_chunks = options_.max_chunks;
    o.max_chunk_lines = options_.chunk_lines;
    for (auto& k : workspace::context_at(g, graph_path(current.path), c.prefix + c.prompt, c.suffix, o).chunks)
      out.push_back(std::move(k.chunk));
  }
  return out;
}

const data::LinkedGraph& FimContextSource::graph(const std::string& package) {
  auto& g = graphs_[package];
  if (!g) {
    data::CppFileParser parser;
    std::vector<std::shared_ptr<const data::ParsedFile>> parsed;
    for (const auto& f : files_)
      if (f.package == package && data::is_cpp_source_name(f.path))
        parsed.push_back(std::make_shared<const data::ParsedFile>(parser.parse(graph_path(f.path), f.text)));
    g = std::make_unique<data::LinkedGraph>(std::move(parsed));
  }
  return *g;
}

FimGeneration fim_generate(const FimModel& m, const text::InfillRequest& request, const FimCase& c,
                           const FimGenerateOptions& o) {
  const FimKind kind = c.kind;
  const auto& tok = *m.tokenizer;
  const int64_t context = o.context > 0 ? o.context : m.model->recipe().seq_len;
  const int64_t max_new = kind == FimKind::kLine ? o.line_tokens : o.body_tokens;
  if (max_new < 1) throw Error("the generation caps must be at least 1 token");
  if (context <= max_new + 8)
    throw Error("a context of " + std::to_string(context) + " tokens leaves no room for a prompt beside " +
                std::to_string(max_new) + " generated tokens");
  const auto p = text::build_infill_prompt(request, text::InfillOrder::Spm, context - max_new, tok);
  const auto ids = text::text_ids(&tok, m.model->recipe().vocab_size, "");
  engine::GenerationOptions go;
  go.max_tokens = max_new;
  go.sampling.temperature = 0;
  go.banned =
      torch::zeros({m.model->recipe().vocab_size}, torch::kBool).index_fill_(0, torch::tensor(ids.banned), true);
  go.stop_id = ids.eos;
  text::TextOutput out(&tok, kind == FimKind::kLine ? std::vector<std::string>{"\n"} : c.problem.stop_tokens);
  FimGeneration g;
  engine::generate(*m.model, p.ids, go, [&](int64_t id) {
    g.text += out.push(id);
    return !out.stopped();
  });
  g.text += out.flush();
  g.prompt_tokens = static_cast<int64_t>(p.ids.size());
  g.extra_kept = p.extra_kept;
  g.extra_dropped = p.extra_dropped;
  g.truncated = p.truncated;
  return g;
}

std::vector<FimCase> keep_compiling_bodies(std::vector<FimCase> cases, Judge& judge, int jobs,
                                           const std::function<void(size_t, size_t)>& progress) {
  std::vector<BodyCut> cuts;
  for (const auto& c : cases)
    if (c.kind == FimKind::kBody) cuts.push_back({c.problem, c.truth});
  std::set<std::string> ok;
  for (const auto& cut : keep_compiling(std::move(cuts), judge, jobs, progress)) ok.insert(cut.problem.name);
  std::vector<FimCase> kept;
  for (auto& c : cases)
    if (c.kind == FimKind::kLine || ok.count(c.problem.name)) kept.push_back(std::move(c));
  return kept;
}

namespace {

// One prediction, for the score and the results file.
struct Prediction {
  Prediction(size_t s, size_t c, std::string t) : score(s), case_index(c), text(std::move(t)) {}
  size_t score = 0, case_index = 0;
  std::string text;
  bool exact = false;
  double similarity = 0;
  std::optional<bool> compiled;
  bool workspace_call = false;
  std::vector<std::string> invented;
};

// What the context-adherence rules (context_adherence.h score_adherence) say of a text against one package: the
// names of its functions, and every identifier its files hold.
struct PackageNames {
  std::vector<std::string> functions;
  std::set<std::string> identifiers;
};

void add(FimScore& s, Prediction& p, const FimCase& c, const PackageNames& names,
         const std::set<std::string>* standard) {
  p.exact = first_line_match(p.text, c.truth);
  p.similarity = edit_similarity(p.text, c.truth);
  ++s.cases;
  s.exact += p.exact;
  s.similarity += p.similarity;
  const auto a = score_adherence(p.text, names.functions, [&](const std::string& w) {
    return names.identifiers.count(w) > 0 || (standard && standard->count(w) > 0);
  });
  p.workspace_call = a.calls_callee;
  p.invented = a.unknown;
  s.workspace_calls += a.calls_callee;
  s.identifiers += a.identifiers.size();
  s.invented += a.unknown.size();
}

}  // namespace

FimReport run_fim(const std::vector<HeldOutFile>& files, const std::vector<FimCase>& cases,
                  const std::vector<FimModel>& models, const FimRunOptions& o,
                  const std::function<void(size_t, size_t)>& progress) {
  FimReport r;
  r.files = files.size();
  for (const auto& c : cases) (c.kind == FimKind::kLine ? r.line_cases : r.body_cases)++;
  // Scores in report order: the baseline, then each model in each mode; line before body.
  std::map<std::tuple<std::string, std::string, FimKind>, size_t> index;
  auto score = [&](const std::string& source, const std::string& context, FimKind kind) -> size_t {
    auto [it, fresh] = index.try_emplace({source, context, kind}, r.scores.size());
    if (fresh) {
      FimScore s;
      s.source = source;
      s.context = context;
      s.kind = kind;
      r.scores.push_back(s);
    }
    return it->second;
  };
  for (FimKind kind : {FimKind::kLine, FimKind::kBody}) {
    score("copy-line-above", "-", kind);
    for (const auto& m : models)
      for (FimContext mode : o.contexts) score(m.name, fim_context_name(mode), kind);
  }
  r.sources.push_back("copy-line-above: the previous non-blank line's text after its indentation");
  for (const auto& m : models) r.sources.push_back(m.name + ": " + m.description);

  std::vector<Prediction> predictions;
  const size_t total = cases.size() * (1 + models.size() * o.contexts.size());
  size_t done = 0;
  FimContextSource context(files, o.context);
  std::map<std::string, PackageNames> package_names;
  auto names_of = [&](const std::string& package) -> const PackageNames& {
    auto [it, fresh] = package_names.try_emplace(package);
    if (fresh) {
      std::set<std::string> fns;
      for (const auto& f : context.graph(package).graph().functions) fns.insert(f.name);
      it->second.functions.assign(fns.begin(), fns.end());
      for (const auto& f : files)
        if (f.package == package)
          for (auto& w : cpp_identifiers(f.text)) it->second.identifiers.insert(std::move(w));
    }
    return it->second;
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const auto& c = cases[ci];
    const PackageNames& names = names_of(files.at(c.file).package);
    if (score_adherence(c.truth, names.functions, [](const std::string&) { return true; }).calls_callee)
      ++(c.kind == FimKind::kLine ? r.line_truth_workspace_calls : r.body_truth_workspace_calls);
    Prediction copy{score("copy-line-above", "-", c.kind), ci, copy_line_above(c.prefix)};
    add(r.scores[copy.score], copy, c, names, o.standard_identifiers);
    predictions.push_back(std::move(copy));
    if (progress) progress(++done, total);
    const FimCase w = fim_window(c, o.window);
    for (FimContext mode : o.contexts) {
      text::InfillRequest req;
      req.extra = context.chunks(w, mode);
      req.prefix = w.prefix;
      req.prompt = w.prompt;
      req.suffix = w.suffix;
      req.filename = files.at(c.file).path;
      for (const auto& m : models) {
        const auto g = fim_generate(m, req, c, o.generate);
        Prediction p{score(m.name, fim_context_name(mode), c.kind), ci, fim_prediction(c, g.text)};
        auto& s = r.scores[p.score];
        add(s, p, c, names, o.standard_identifiers);
        s.prompt_tokens += static_cast<double>(g.prompt_tokens);
        s.extra_kept += static_cast<double>(g.extra_kept);
        s.extra_dropped += static_cast<double>(g.extra_dropped);
        s.truncated += g.truncated;
        predictions.push_back(std::move(p));
        if (progress) progress(++done, total);
      }
    }
  }
  if (o.judge) {  // every body prediction compiled in place, in parallel
    std::vector<Prediction*> bodies;
    for (auto& p : predictions)
      if (cases[p.case_index].kind == FimKind::kBody) bodies.push_back(&p);
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next++) < bodies.size();)
        bodies[i]->compiled =
            o.judge->judge(cases[bodies[i]->case_index].problem, bodies[i]->text).outcome == Outcome::kPassed;
    };
    std::vector<std::thread> workers;
    for (int t = 0; t < std::max(1, o.jobs); ++t) workers.emplace_back(work);
    for (auto& w : workers) w.join();
    for (const auto* p : bodies) {
      ++r.scores[p->score].compile_judged;
      r.scores[p->score].compiled += *p->compiled;
    }
  }
  if (!o.results_path.empty()) {
    std::string lines;
    for (const auto& p : predictions) {
      const auto& s = r.scores[p.score];
      const auto& c = cases[p.case_index];
      nlohmann::json j = {
          {"case", c.name},   {"kind", fim_kind_name(c.kind)}, {"source", s.source}, {"context", s.context},
          {"truth", c.truth}, {"prediction", p.text},          {"exact", p.exact},   {"similarity", p.similarity}};
      if (p.compiled) j["compiled"] = *p.compiled;
      j["workspace_call"] = p.workspace_call;
      if (!p.invented.empty()) j["invented"] = p.invented;
      lines += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
    write_file_atomic(o.results_path, lines);
  }
  return r;
}

nlohmann::json FimReport::json() const {
  nlohmann::json j = {
      {"corpus", corpus},
      {"domain", domain},
      {"split", split},
      {"files", files},
      {"cases", {{"line", line_cases}, {"body", body_cases}, {"body_candidates", body_candidates}}},
      {"truth_workspace_calls", {{"line", line_truth_workspace_calls}, {"body", body_truth_workspace_calls}}},
      {"sources", sources},
      {"scores", nlohmann::json::array()}};
  for (const auto& s : scores) {
    const double n = s.cases ? static_cast<double>(s.cases) : 1.0;
    nlohmann::json e = {
        {"source", s.source}, {"context", s.context},           {"kind", fim_kind_name(s.kind)},
        {"cases", s.cases},   {"exact_match", s.exact_match()}, {"edit_similarity", s.mean_similarity()}};
    e["workspace_call_rate"] = s.workspace_calls / n;
    e["invented_identifier_rate"] =
        s.identifiers ? static_cast<double>(s.invented) / static_cast<double>(s.identifiers) : 0.0;
    if (s.compile_judged > 0) {
      e["compiled"] = s.compiled;
      e["compile_rate"] = static_cast<double>(s.compiled) / static_cast<double>(s.compile_judged);
    }
    if (s.context != "-") {
      e["mean_prompt_tokens"] = s.prompt_tokens / n;
      e["mean_extra_kept"] = s.extra_kept / n;
      e["mean_extra_dropped"] = s.extra_dropped / n;
      e["truncated"] = s.truncated;
    }
    j["scores"].push_back(e);
  }
  return j;
}

std::string FimReport::markdown() const {
  std::ostringstream md;
  md << "# Fill-in-the-middle: " << domain << ", " << split << " split of " << corpus << "\n\n"
     << files << " held-out files; " << line_cases << " single-line cases, " << body_cases << " function-body cases";
  if (body_candidates != body_cases)
    md << " (of " << body_candidates << " cut; the rest do not compile here as written)";
  md << "; the truth calls a function of its package in " << line_truth_workspace_calls << " line and "
     << body_truth_workspace_calls << " body cases.\n\n";
  for (const auto& s : sources) md << "- " << s << "\n";
  md << "\n| kind | source | context | cases | exact match | edit similarity | compiles | calls the workspace | "
        "invented identifiers | prompt tokens | extra chunks kept / dropped |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char buf[512];
  for (const auto& s : scores) {
    if (s.cases == 0) continue;
    const double n = static_cast<double>(s.cases);
    std::string compiles = "-", prompt = "-", extra = "-";
    if (s.compile_judged > 0) {
      std::snprintf(buf, sizeof buf, "%.1f%% (%zu)", 100.0 * static_cast<double>(s.compiled) / s.compile_judged,
                    s.compiled);
      compiles = buf;
    }
    if (s.context != "-") {
      std::snprintf(buf, sizeof buf, "%.0f", s.prompt_tokens / n);
      prompt = buf;
      std::snprintf(buf, sizeof buf, "%.1f / %.1f", s.extra_kept / n, s.extra_dropped / n);
      extra = buf;
    }
    const double invented = s.identifiers ? 100.0 * static_cast<double>(s.invented) / s.identifiers : 0.0;
    std::snprintf(buf, sizeof buf, "| %s | %s | %s | %zu | %.1f%% | %.3f | %s | %.1f%% | %.1f%% | %s | %s |\n",
                  fim_kind_name(s.kind), s.source.c_str(), s.context.c_str(), s.cases, 100 * s.exact_match(),
                  s.mean_similarity(), compiles.c_str(), 100.0 * static_cast<double>(s.workspace_calls) / n, invented,
                  prompt.c_str(), extra.c_str());
    md << buf;
  }
  md << "\nexact match: the first line, trailing whitespace ignored; edit similarity: 1 - Levenshtein / longer "
        "length, over code points; compiles: the file with the predicted body, g++ -fsyntax-only; calls the "
        "workspace: predictions that call a function the package defines; invented identifiers: of the identifiers "
        "the predictions use, those in no file of the package and not in the standard library.\n";
  return md.str();
}

FimCase fim_window(const FimCase& c, const FimWindow& w) {
  FimCase out = c;
  // The whole lines of the prefix within prefix_chars (llama.vim sends whole lines, n_prefix of them).
  if (w.prefix_chars > 0 && c.prefix.size() > w.prefix_chars) {
    const size_t nl = c.prefix.find('\n', c.prefix.size() - w.prefix_chars - 1);
    out.prefix = c.prefix.substr(nl == std::string::npos ? c.prefix.size() : nl + 1);
  }
  if (w.suffix_lines > 0) {  // the rest of the cursor's line, then suffix_lines lines
    size_t end = 0;
    for (size_t l = 0; l <= w.suffix_lines && end != std::string::npos; ++l) {
      end = c.suffix.find('\n', end);
      if (end != std::string::npos) ++end;
    }
    out.suffix = c.suffix.substr(0, end);
  }
  return out;
}

nlohmann::json llama_vim_request(const FimCase& c, size_t typed, const FimLatencyOptions& o) {
  const FimCase w = fim_window(c, o.window);
  // The user is writing the line: what they typed of the truth is before the cursor, nothing of it after.
  return {{"id_slot", 0},
          {"input_prefix", w.prefix},
          {"input_suffix", w.suffix},
          {"input_extra", nlohmann::json::array()},
          {"prompt", c.prompt + c.truth.substr(0, std::min(typed, c.truth.size()))},
          {"n_predict", o.n_predict},
          {"stop", nlohmann::json::array()},
          {"n_indent", c.prompt.size()},
          {"top_k", 40},
          {"top_p", 0.90},
          {"samplers", {"top_k", "top_p", "infill"}},
          {"stream", false},
          {"cache_prompt", true},
          {"t_max_prompt_ms", 500},
          {"t_max_predict_ms", 250},  // each request is the first of its cursor position
          {"response_fields",
           {"content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
            "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
            "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"}},
          {"model", o.model}};
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

nlohmann::json FimLatency::json() const {
  auto side = [](const std::vector<double>& ms, double cached, double prompt_n) {
    const double n = ms.empty() ? 1.0 : static_cast<double>(ms.size());
    return nlohmann::json{{"requests", ms.size()},
                          {"p50_ms", percentile(ms, 50)},
                          {"p95_ms", percentile(ms, 95)},
                          {"mean_tokens_cached", cached / n},
                          {"mean_prompt_n", prompt_n / n}};
  };
  return {{"url", url},
          {"cold", side(cold_ms, cold_cached, cold_prompt_n)},
          {"warm", side(warm_ms, warm_cached, warm_prompt_n)}};
}

std::string FimLatency::markdown() const {
  const auto j = json();
  std::ostringstream md;
  md << "\n## Latency of POST /infill (" << url << ")\n\n| request | n | p50 ms | p95 ms | tokens cached | prompt_n |\n"
     << "|---|---:|---:|---:|---:|---:|\n";
  char buf[256];
  for (const char* side : {"cold", "warm"}) {
    const auto& s = j[side];
    std::snprintf(buf, sizeof buf, "| %s | %zu | %.1f | %.1f | %.1f | %.1f |\n", side, s["requests"].get<size_t>(),
                  s["p50_ms"].get<double>(), s["p95_ms"].get<double>(), s["mean_tokens_cached"].get<double>(),
                  s["mean_prompt_n"].get<double>());
    md << buf;
  }
  md << "\ncold: a file's first request; warm: the same place after typing on; the wall time of the whole request.\n";
  return md.str();
}

std::string plot_fim(const FimReport& r, const std::string& dir) {
  make_dirs(dir);
  const std::string data = dir + "/fim.dat", script = dir + "/fim.gp", png = dir + "/fim.png";
  {
    std::ofstream f(data);
    f << "case \"exact match\" \"edit similarity\"\n";
    for (const auto& s : r.scores) {
      if (s.cases == 0) continue;
      std::string label =
          std::string(fim_kind_name(s.kind)) + " " + s.source + (s.context == "-" ? "" : " " + s.context);
      label.erase(std::remove(label.begin(), label.end(), '"'), label.end());  // gnuplot's quotes
      f << "\"" << label << "\" " << s.exact_match() << " " << s.mean_similarity() << "\n";
    }
    if (!f) throw Error(data + ": cannot write");
  }
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1100,560 noenhanced\nset output " << single_quoted(png) << "\n"
     << "set title " << single_quoted("fill-in-the-middle, " + r.domain + " " + r.split + " split") << "\n"
     << "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
     << "set grid ytics\nset key outside right top\nset yrange [0:1]\nset xtics rotate by -35\n"
     << "plot for [i=2:3] " << single_quoted(data) << " using i:xtic(1) title columnhead\n";
  write_file_atomic(script, gp.str());
  run_gnuplot(script, dir + "/fim.log");
  return png;
}

}  // namespace slm::eval
