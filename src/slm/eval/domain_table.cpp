#include "slm/eval/domain_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/gnuplot.h"

namespace slm::eval {

DomainTable make_domain_table(const std::vector<std::pair<std::string, DomainScores>>& scores,
                              const std::map<std::string, std::vector<std::string>>& routes) {
  DomainTable t;
  std::set<std::string> domains;
  for (const auto& [model, by_domain] : scores) {
    if (model.empty()) throw Error("domain table: a model without a name");
    if (t.scores.count(model)) throw Error("domain table: model '" + model + "' is given twice");
    t.models.push_back(model);
    t.scores[model] = by_domain;
    for (const auto& [d, s] : by_domain) {
      domains.insert(d);
      if (std::isnan(s.bpb)) t.bpb = false;
    }
  }
  t.domains.assign(domains.begin(), domains.end());
  for (const auto& [model, labels] : routes)
    if (!t.scores.count(model)) throw Error("domain table: routes given for '" + model + "', which is not a model");
  for (const auto& d : t.domains)
    for (const auto& model : t.models) {
      auto r = routes.find(model);
      if (r == routes.end() || std::find(r->second.begin(), r->second.end(), d) == r->second.end()) continue;
      if (!t.scores.at(model).count(d)) continue;
      t.oracle[d] = model;
      break;
    }
  return t;
}

void add_routed(DomainTable& t, const std::map<std::string, std::vector<size_t>>& choice) {
  for (const auto& [d, picks] : choice) {
    if (picks.empty()) throw Error("routed column: domain " + d + " has no windows");
    train::DomainScore r;
    double nll = 0;
    for (size_t w = 0; w < picks.size(); ++w) {
      if (picks[w] >= t.models.size())
        throw Error("routed column: domain " + d + ", window " + std::to_string(w) + " routed to model #" +
                    std::to_string(picks[w]) + " of " + std::to_string(t.models.size()));
      const std::string& m = t.models[picks[w]];
      auto it = t.scores.at(m).find(d);
      if (it == t.scores.at(m).end()) throw Error("routed column: model " + m + " was not scored on domain " + d);
      const auto& s = it->second;
      if (s.window_nll.size() != picks.size())
        throw Error("routed column: model " + m + " scored " + std::to_string(s.window_nll.size()) +
                    " windows of domain " + d + ", the router picked for " + std::to_string(picks.size()));
      nll += s.window_nll[w];
      r.bytes += s.window_bytes[w];
      r.tokens += s.tokens / static_cast<int64_t>(picks.size());  // every window has seq_len targets
      t.routed_windows[d][m] += 1;
    }
    if (r.tokens > 0) r.loss = nll / static_cast<double>(r.tokens);
    r.bpb = r.bytes > 0 ? nll / std::log(2.0) / r.bytes : std::nan("");
    r.batches = t.scores.at(t.models[picks[0]]).at(d).batches;
    t.routed[d] = r;
  }
}

double measure(const DomainTable& table, const train::DomainScore& score) {
  return table.bpb ? score.bpb : score.loss;
}

DomainScores pooled_scores(const DomainTable& table) {
  DomainScores out;
  for (const auto& [model, by_domain] : table.scores)
    if (!by_domain.empty()) out[model] = train::pooled(by_domain);
  return out;
}

train::DomainScore oracle_pooled(const DomainTable& table) {
  DomainScores answered;
  for (const auto& [d, model] : table.oracle) answered[d] = table.scores.at(model).at(d);
  return train::pooled(answered);
}

namespace {

std::string cell(double v, bool bold) {
  char buf[32];
  std::snprintf(buf, sizeof buf, bold ? "**%.4f**" : "%.4f", v);
  return buf;
}

// A name as a gnuplot data-file string: double quotes (its data files do not read single ones), none inside.
std::string data_string(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '"'), s.end());
  return "\"" + s + "\"";
}

nlohmann::json score_json(const train::DomainScore& s) {
  return {{"loss", s.loss},
          {"bpb", std::isnan(s.bpb) ? nlohmann::json() : nlohmann::json(s.bpb)},
          {"tokens", s.tokens},
          {"bytes", s.bytes}};
}

}  // namespace

std::string domain_table_markdown(const DomainTable& t) {
  std::ostringstream md;
  const bool oracle = !t.oracle.empty(), routed = !t.routed.empty();
  md << "| domain |";
  for (const auto& m : t.models) md << " " << m << " |";
  if (oracle) md << " oracle route |";
  if (routed) md << " routed |";
  md << "\n|---|";
  for (size_t i = 0; i < t.models.size() + (oracle ? 1 : 0) + (routed ? 1 : 0); ++i) md << "---:|";
  md << "\n";
  // One row: the models' values (the lowest in bold), then the oracle's, then the router's.
  auto row = [&](const std::string& name, const DomainScores& by_model, const train::DomainScore* best_route,
                 const std::string& route_model, const train::DomainScore* routed_score) {
    double best = INFINITY;
    for (const auto& [m, s] : by_model) best = std::min(best, measure(t, s));
    md << "| " << name << " |";
    for (const auto& m : t.models) {
      auto it = by_model.find(m);
      md << " "
         << (it == by_model.end() ? std::string("—") : cell(measure(t, it->second), measure(t, it->second) == best))
         << " |";
    }
    if (oracle)
      md << " "
         << (best_route ? cell(measure(t, *best_route), false) + (route_model.empty() ? "" : " (" + route_model + ")")
                        : std::string("—"))
         << " |";
    if (routed) md << " " << (routed_score ? cell(measure(t, *routed_score), false) : std::string("—")) << " |";
    md << "\n";
  };
  for (const auto& d : t.domains) {
    DomainScores by_model;
    for (const auto& m : t.models)
      if (auto it = t.scores.at(m).find(d); it != t.scores.at(m).end()) by_model[m] = it->second;
    auto o = t.oracle.find(d);
    const train::DomainScore* route = o == t.oracle.end() ? nullptr : &t.scores.at(o->second).at(d);
    auto r = t.routed.find(d);
    row(d, by_model, route, o == t.oracle.end() ? "" : o->second, r == t.routed.end() ? nullptr : &r->second);
  }
  const auto all = pooled_scores(t);
  const auto oracle_all = oracle_pooled(t);
  const auto routed_all = train::pooled(t.routed);
  row("all (pooled)", all, oracle ? &oracle_all : nullptr, "", routed ? &routed_all : nullptr);
  md << "\n"
     << (t.bpb ? "Bits per byte" : "Loss in nats per token") << " of the held-out targets, lower is better; "
     << "the lowest model of each row in bold. \"all\" pools every domain's tokens";
  if (oracle)
    md << "; the oracle route answers each domain with the model whose router labels include it (over the "
       << t.oracle.size() << " of " << t.domains.size() << " domains that have one)";
  if (routed)
    md << "; routed answers each held-out window with the model the router picks for its text (over the "
       << t.routed.size() << " domains routed)";
  md << ".\n";
  return md.str();
}

nlohmann::json domain_table_json(const DomainTable& t) {
  nlohmann::json j = {{"measure", t.bpb ? "bpb" : "loss"}, {"models", t.models}, {"domains", t.domains}};
  j["scores"] = nlohmann::json::object();
  for (const auto& [m, by_domain] : t.scores) {
    j["scores"][m] = nlohmann::json::object();
    for (const auto& [d, s] : by_domain) j["scores"][m][d] = score_json(s);
  }
  j["pooled"] = nlohmann::json::object();
  for (const auto& [m, s] : pooled_scores(t)) j["pooled"][m] = score_json(s);
  j["oracle"] = t.oracle;
  if (!t.oracle.empty()) j["oracle_pooled"] = score_json(oracle_pooled(t));
  if (!t.routed.empty()) {
    j["routed"] = nlohmann::json::object();
    for (const auto& [d, s] : t.routed) j["routed"][d] = score_json(s);
    j["routed_pooled"] = score_json(train::pooled(t.routed));
    j["routed_windows"] = t.routed_windows;
  }
  return j;
}

std::string plot_domain_table(const DomainTable& t, const std::string& dir) {
  make_dirs(dir);
  const std::string data = dir + "/domain-table.dat", script = dir + "/domain-table.gp",
                    png = dir + "/domain-table.png";
  {
    std::ofstream f(data);
    f << "domain";
    for (const auto& m : t.models) f << " " << data_string(m);
    if (!t.routed.empty()) f << " routed";
    f << "\n";
    for (const auto& d : t.domains) {
      f << data_string(d);
      for (const auto& m : t.models) {
        auto it = t.scores.at(m).find(d);
        f << " " << (it == t.scores.at(m).end() ? std::string("NaN") : std::to_string(measure(t, it->second)));
      }
      if (!t.routed.empty()) {
        auto it = t.routed.find(d);
        f << " " << (it == t.routed.end() ? std::string("NaN") : std::to_string(measure(t, it->second)));
      }
      f << "\n";
    }
    if (!f) throw Error(data + ": cannot write");
  }
  std::ostringstream gp;
  gp << "set terminal pngcairo size 960,560 noenhanced\nset output " << single_quoted(png) << "\n"
     << "set title " << single_quoted(std::string("held-out ") + (t.bpb ? "bits per byte" : "loss") + " per domain")
     << "\nset ylabel " << single_quoted(t.bpb ? "bits per byte (lower is better)" : "nats per token") << "\n"
     << "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
     << "set grid ytics\nset key outside right top\nset yrange [0:*]\nset xtics rotate by -30\n"
     // Twelve distinct colours: gnuplot's own eight repeat, and an ensemble table has up to eleven bars per group.
     << "set linetype 9 lc rgb '#8c564b'\nset linetype 10 lc rgb '#7f7f7f'\nset linetype 11 lc rgb '#bcbd22'\n"
     << "set linetype 12 lc rgb '#17becf'\n"
     << "plot for [i=2:" << t.models.size() + 1 + (t.routed.empty() ? 0 : 1) << "] " << single_quoted(data)
     << " using i:xtic(1) title columnhead\n";
  write_file_atomic(script, gp.str());
  run_gnuplot(script, dir + "/domain-table.log");
  return png;
}

}  // namespace slm::eval

namespace slm::eval {

namespace {

// One held-out window with every model's NLL on it (NaN for a model not scored on its domain).
struct CurveWindow {
  double bytes = 0, tokens = 0;
  std::vector<double> nll;
  RouterPick pick;
};

CurvePoint curve_point(int64_t sent, int64_t windows, double nll, double bytes, double tokens) {
  CurvePoint p;
  p.sent = sent;
  p.share = windows ? static_cast<double>(sent) / static_cast<double>(windows) : 0;
  p.score.loss = tokens > 0 ? nll / tokens : 0;
  p.score.bpb = bytes > 0 ? nll / std::log(2.0) / bytes : std::nan("");
  p.score.tokens = static_cast<int64_t>(tokens);
  p.score.bytes = bytes;
  return p;
}

}  // namespace

RoutingCurve routing_curve(const DomainTable& t, const std::string& fallback,
                           const std::map<std::string, std::vector<RouterPick>>& picks) {
  const auto fb_it = std::find(t.models.begin(), t.models.end(), fallback);
  if (fb_it == t.models.end()) throw Error("routing curve: the fallback '" + fallback + "' is not a model");
  const size_t fb = static_cast<size_t>(fb_it - t.models.begin());
  std::vector<CurveWindow> ws;
  for (const auto& [d, p] : picks) {
    auto fs = t.scores.at(fallback).find(d);
    if (fs == t.scores.at(fallback).end())
      throw Error("routing curve: the fallback '" + fallback + "' was not scored on domain " + d);
    const size_t n = p.size();
    for (size_t w = 0; w < n; ++w) {
      CurveWindow x;
      x.bytes = fs->second.window_bytes.at(w);
      x.tokens = static_cast<double>(fs->second.tokens) / static_cast<double>(n);  // every window: seq_len targets
      x.nll.assign(t.models.size(), std::nan(""));
      for (size_t m = 0; m < t.models.size(); ++m) {
        auto it = t.scores.at(t.models[m]).find(d);
        if (it == t.scores.at(t.models[m]).end()) continue;
        if (it->second.window_nll.size() != n)
          throw Error("routing curve: model " + t.models[m] + " scored " +
                      std::to_string(it->second.window_nll.size()) + " windows of domain " + d + ", the router " +
                      std::to_string(n));
        x.nll[m] = it->second.window_nll[w];
      }
      if (p[w].model >= t.models.size() || std::isnan(x.nll[p[w].model]))
        throw Error("routing curve: domain " + d + ", window " + std::to_string(w) +
                    " is picked for a model that is not scored on it");
      x.pick = p[w];
      ws.push_back(std::move(x));
    }
  }
  RoutingCurve c;
  c.fallback = fallback;
  c.windows = static_cast<int64_t>(ws.size());
  double nll0 = 0, bytes = 0, tokens = 0;
  for (const auto& x : ws) {
    nll0 += x.nll[fb];
    bytes += x.bytes;
    tokens += x.tokens;
  }
  // Both curves add windows one at a time in their order, each swapping the fallback's NLL for its specialist's.
  auto trace = [&](std::vector<std::pair<size_t, size_t>> order) {  // (window, model)
    std::vector<CurvePoint> out{curve_point(0, c.windows, nll0, bytes, tokens)};
    double nll = nll0;
    for (const auto& [w, m] : order) {
      nll += ws[w].nll[m] - ws[w].nll[fb];
      out.push_back(curve_point(static_cast<int64_t>(out.size()), c.windows, nll, bytes, tokens));
    }
    return out;
  };
  std::vector<size_t> by_confidence;
  for (size_t w = 0; w < ws.size(); ++w)
    if (ws[w].pick.model != fb) by_confidence.push_back(w);
  std::stable_sort(by_confidence.begin(), by_confidence.end(),
                   [&](size_t a, size_t b) { return ws[a].pick.confidence > ws[b].pick.confidence; });
  std::vector<std::pair<size_t, size_t>> router_order, oracle_order;
  for (size_t w : by_confidence) router_order.emplace_back(w, ws[w].pick.model);
  std::vector<std::pair<double, std::pair<size_t, size_t>>> gains;  // (saving, (window, best specialist))
  for (size_t w = 0; w < ws.size(); ++w) {
    size_t best = fb;
    for (size_t m = 0; m < t.models.size(); ++m)
      if (m != fb && !std::isnan(ws[w].nll[m]) && (best == fb || ws[w].nll[m] < ws[w].nll[best])) best = m;
    if (best != fb) gains.push_back({ws[w].nll[fb] - ws[w].nll[best], {w, best}});
  }
  std::stable_sort(gains.begin(), gains.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& g : gains) oracle_order.push_back(g.second);
  c.router = trace(router_order);
  c.oracle = trace(oracle_order);
  return c;
}

namespace {

// The random router at `sent` windows: the expected score of sending a random `sent` of the router's picks, i.e.
// the straight line between the curve's ends.
double random_value(const DomainTable& t, const RoutingCurve& c, int64_t sent) {
  const double v0 = measure(t, c.router.front().score), v1 = measure(t, c.router.back().score);
  const int64_t all = c.router.back().sent;
  return all ? v0 + (v1 - v0) * static_cast<double>(sent) / static_cast<double>(all) : v0;
}

}  // namespace

std::string routing_curve_markdown(const DomainTable& t, const RoutingCurve& c) {
  std::ostringstream md;
  md << "| share of windows sent to a specialist | router | random | oracle (ceiling) |\n|---:|---:|---:|---:|\n";
  const int64_t most = c.router.back().sent;
  std::vector<int64_t> counts;
  for (double s : {0.0, 0.1, 0.25, 0.5, 0.75}) {
    const auto k = static_cast<int64_t>(std::llround(s * static_cast<double>(c.windows)));
    if (k < most && (counts.empty() || k > counts.back())) counts.push_back(k);
  }
  if (counts.empty() || most > counts.back()) counts.push_back(most);
  char buf[160];
  for (int64_t k : counts) {
    std::snprintf(buf, sizeof buf, "| %.0f%% (%lld) | %.4f | %.4f | %.4f |\n",
                  100.0 * static_cast<double>(k) / static_cast<double>(std::max<int64_t>(1, c.windows)),
                  static_cast<long long>(k), measure(t, c.router[k].score), random_value(t, c, k),
                  measure(t, c.oracle[k].score));
    md << buf;
  }
  const auto best = std::min_element(c.oracle.begin(), c.oracle.end(), [&](const auto& a, const auto& b) {
    return measure(t, a.score) < measure(t, b.score);
  });
  std::snprintf(buf, sizeof buf, "%.4f at %.0f%%", measure(t, best->score), 100.0 * best->share);
  md << "\n"
     << (t.bpb ? "Bits per byte" : "Loss in nats per token") << " pooled over " << c.windows
     << " held-out windows; every window not sent is answered by " << c.fallback
     << " (0%). router: the windows it is most confident about go to the specialist it picks; random: a random "
        "subset of its picks (expected value); oracle: the windows a specialist helps most, the ceiling for any router "
        "(its best: "
     << buf << ").\n";
  return md.str();
}

nlohmann::json routing_curve_json(const DomainTable& t, const RoutingCurve& c) {
  auto points = [&](const std::vector<CurvePoint>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& p : v) a.push_back({{"sent", p.sent}, {"share", p.share}, {"value", measure(t, p.score)}});
    return a;
  };
  return {{"fallback", c.fallback},
          {"windows", c.windows},
          {"measure", t.bpb ? "bpb" : "loss"},
          {"router", points(c.router)},
          {"oracle", points(c.oracle)}};
}

std::string plot_routing_curve(const DomainTable& t, const RoutingCurve& c, const std::string& dir) {
  make_dirs(dir);
  const std::string data = dir + "/routing-curve.dat", script = dir + "/routing-curve.gp",
                    png = dir + "/routing-curve.png";
  {
    std::ofstream f(data);
    // Three gnuplot data sets (index 0, 1, 2), two blank lines apart: router, random, oracle.
    for (const auto& p : c.router) f << 100 * p.share << " " << measure(t, p.score) << "\n";
    f << "\n\n0 " << random_value(t, c, 0) << "\n"
      << 100 * c.router.back().share << " " << random_value(t, c, c.router.back().sent) << "\n\n\n";
    for (const auto& p : c.oracle) f << 100 * p.share << " " << measure(t, p.score) << "\n";
    if (!f) throw Error(data + ": cannot write");
  }
  std::ostringstream gp;
  gp << "set terminal pngcairo size 800,520 noenhanced\nset output " << single_quoted(png) << "\n"
     << "set title " << single_quoted("quality against the share of held-out windows sent to specialists") << "\n"
     << "set xlabel " << single_quoted("% of windows answered by a specialist (the rest: " + c.fallback + ")") << "\n"
     << "set ylabel " << single_quoted(t.bpb ? "bits per byte (lower is better)" : "nats per token") << "\n"
     << "set grid\nset key top right\nset xrange [0:100]\n"
     << "plot " << single_quoted(data) << " index 0 with lines lw 2 title 'router', " << single_quoted(data)
     << " index 1 with lines dt 2 title 'random', " << single_quoted(data)
     << " index 2 with lines lw 2 title 'oracle (ceiling)'\n";
  write_file_atomic(script, gp.str());
  run_gnuplot(script, dir + "/routing-curve.log");
  return png;
}

}  // namespace slm::eval
