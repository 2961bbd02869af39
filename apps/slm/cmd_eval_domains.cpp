// slm eval domains: the per-domain table (src/slm/eval/domain_table.h) of an ensemble's specialists and any other
// checkpoints (a generalist), all scored on the same held-out windows, with the oracle route and, given a router,
// the routed column: each window answered by the model the router picks for its text.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "commands.h"
#include "slm/data/tokenizer.h"
#include "slm/eval/domain_table.h"
#include "slm/recipe/ensemble.h"
#include "slm/router/classifier.h"
#include "slm/router/route.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::cli {

namespace {

struct DomainsCli {
  std::string ensemble;
  std::vector<std::string> models;  // NAME=CHECKPOINT
  std::vector<std::string> routes;  // NAME=DOMAIN[,DOMAIN...]
  std::string router;               // router model file; "": the ensemble's; "none": no routed column
  std::string fallback;             // the routing curve's fallback model; "": "generalist" when it is a column
  train::CheckpointEval windows;    // data, split, domains, tokenizer, batch, seq_len, batches, device, bf16
  std::string out;
  int threads = 0;
  bool json = false;
};

std::pair<std::string, std::string> name_value(const std::string& kv, const std::string& flag) {
  const auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == kv.size()) throw Error(flag + " " + kv + ": expected NAME=VALUE");
  return {kv.substr(0, eq), kv.substr(eq + 1)};
}

void run_domains(DomainsCli& c) {
  if (c.threads > 0) torch::set_num_threads(c.threads);
  struct Column {
    std::string name, checkpoint, recipe;
  };
  std::vector<Column> columns;
  std::map<std::string, std::vector<std::string>> routes;
  std::string router_file = c.router;
  if (!c.ensemble.empty()) {
    const Ensemble e = load_ensemble(c.ensemble);
    if (router_file.empty()) router_file = e.router;
    for (const auto& s : e.specialists) {
      if (s.checkpoint.empty())
        throw Error(c.ensemble + ": specialist '" + s.name + "' has no checkpoint to score (train it first)");
      columns.push_back({s.name, s.checkpoint, s.recipe_path});
      routes[s.name] = s.routes;
    }
  }
  for (const auto& m : c.models) {
    auto [name, checkpoint] = name_value(m, "--model");
    columns.push_back({name, checkpoint, ""});
  }
  for (const auto& r : c.routes) {
    auto [name, labels] = name_value(r, "--routes");
    std::vector<std::string> list;
    std::stringstream ss(labels);
    for (std::string d; std::getline(ss, d, ',');)
      if (!d.empty()) list.push_back(d);
    routes[name] = list;
  }
  if (columns.empty()) throw Error("slm eval domains: give --ensemble and/or --model NAME=CHECKPOINT");
  if (router_file == "none") router_file.clear();
  if (!c.fallback.empty() && router_file.empty())
    throw Error("slm eval domains: --fallback draws the routing curve, which needs a router (--router)");
  std::optional<router::Classifier> router;
  if (!router_file.empty()) router = router::Classifier::load(router_file);  // fails before hours of scoring

  std::vector<std::pair<std::string, eval::DomainScores>> scores;
  train::CheckpointEval req = c.windows;
  // Every model on every domain of the data (a specialist's own run names only its domain).
  if (req.domains.empty())
    for (const auto& d : train::find_domains(req.data, {})) req.domains.push_back(d.name);
  std::string tokenizer;  // the first model's: decodes the windows for the router
  for (size_t i = 0; i < columns.size(); ++i) {
    std::fprintf(stderr, "scoring %s (%zu/%zu): %s\n", columns[i].name.c_str(), i + 1, columns.size(),
                 columns[i].checkpoint.c_str());
    req.checkpoint = columns[i].checkpoint;
    req.recipe = columns[i].recipe;
    req.keep_tokens = router && i == 0;
    auto r = train::evaluate_checkpoint(req);
    if (i == 0) tokenizer = r.tokenizer;
    // Every later model reads exactly the first one's windows.
    req.batch = r.windows.batch;
    req.seq_len = r.windows.seq_len;
    req.batches = r.windows.batches;
    scores.emplace_back(columns[i].name, r.domains);
  }
  auto table = eval::make_domain_table(scores, routes);
  std::optional<eval::RoutingCurve> curve;
  if (router) {
    if (tokenizer.empty()) throw Error("slm eval domains: the routed column needs a tokenizer (--tokenizer)");
    const auto tok = data::Tokenizer::load(tokenizer);
    std::vector<std::vector<std::string>> column_routes;
    for (const auto& col : columns)
      column_routes.push_back(routes.count(col.name) ? routes.at(col.name) : std::vector<std::string>{});
    // The routing curve's picks ignore the fallback's routes: each window's label goes to its specialist, and the
    // curve decides how many of them the fallback keeps.
    const std::string fallback =
        !c.fallback.empty()                                                                       ? c.fallback
        : std::find(table.models.begin(), table.models.end(), "generalist") != table.models.end() ? "generalist"
                                                                                                  : "";
    if (!fallback.empty() && std::find(table.models.begin(), table.models.end(), fallback) == table.models.end())
      throw Error("slm eval domains: --fallback " + fallback + " is not a column");
    auto specialist_routes = column_routes;
    size_t fallback_index = 0;
    for (size_t m = 0; m < columns.size(); ++m)
      if (columns[m].name == fallback) {
        specialist_routes[m].clear();
        fallback_index = m;
      }
    std::map<std::string, std::vector<size_t>> choice;
    std::map<std::string, std::vector<eval::RouterPick>> picks;
    for (const auto& [d, score] : scores.front().second)
      for (const auto& ids : score.window_tokens) {
        const std::string text = tok.decode(std::vector<uint32_t>(ids.begin(), ids.end()));
        const auto probabilities = router->classify(text);
        choice[d].push_back(router::route_mass(probabilities, router->labels(), column_routes).best);
        const auto to_specialist = router::route_mass(probabilities, router->labels(), specialist_routes);
        // A label no specialist answers stays with the fallback.
        picks[d].push_back(to_specialist.total > 0
                               ? eval::RouterPick{to_specialist.best, to_specialist.mass[to_specialist.best]}
                               : eval::RouterPick{fallback_index, 0.0});
      }
    eval::add_routed(table, choice);
    if (!fallback.empty()) curve = eval::routing_curve(table, fallback, picks);
  }
  std::string md = eval::domain_table_markdown(table);
  auto j = eval::domain_table_json(table);
  j["windows"] = {{"split", req.split}, {"batch", req.batch}, {"seq_len", req.seq_len}, {"batches", req.batches}};
  if (curve) {
    md += "\n" + eval::routing_curve_markdown(table, *curve);
    j["routing_curve"] = eval::routing_curve_json(table, *curve);
  }
  if (!c.out.empty()) {
    make_dirs(c.out);
    write_file_atomic(c.out + "/domain-table.md", md);
    write_file_atomic(c.out + "/domain-table.json", j.dump(2) + "\n");
    std::string pngs = eval::plot_domain_table(table, c.out);
    if (curve) pngs += " and " + eval::plot_routing_curve(table, *curve, c.out);
    std::fprintf(stderr, "wrote %s/domain-table.md, .json, %s\n", c.out.c_str(), pngs.c_str());
  }
  std::cout << (c.json ? j.dump(2) + "\n" : md);
}

}  // namespace

void add_eval_domains_command(CLI::App* eval) {
  auto c = std::make_shared<DomainsCli>();
  auto& w = c->windows;
  auto* d = eval->add_subcommand(
      "domains",
      "The per-domain table: an ensemble's specialists and other checkpoints (a generalist) scored on the same "
      "held-out windows of every domain, with the oracle route (each domain answered by the specialist whose router "
      "labels include it) and, with a router, the routed column (each window answered by the model the router picks); "
      "Markdown, JSON and a PNG chart (docs/evaluation.md)");
  d->add_option("--ensemble", c->ensemble, "ensemble manifest: every specialist's checkpoint, recipe and routes");
  d->add_option("--model", c->models, "another column, NAME=CHECKPOINT (training checkpoint or run directory)");
  d->add_option("--routes", c->routes,
                "the router labels (domains) a --model answers, for the oracle and routed columns, "
                "NAME=DOMAIN[,DOMAIN...]");
  d->add_option("--router", c->router,
                "router model file for the routed column: each held-out window answered by the model the router "
                "picks for its text (default: the ensemble's router; none: no routed column)");
  d->add_option("--fallback", c->fallback,
                "with a router, the routing curve: quality against the share of windows the router sends from this "
                "model to specialists, with the oracle as the ceiling (default: the column named generalist)");
  d->add_option("--data", w.data, "shard directory with the held-out splits of every domain")->required();
  d->add_option("--split", w.split, "validation or test")->capture_default_str();
  d->add_option("--domains", w.domains, "these domains only (default: every domain with the split)")->delimiter(',');
  d->add_option("--tokenizer", w.tokenizer, "tokenizer .model for bits per byte (default: the run's; none: loss)");
  d->add_option("--batch", w.batch, "sequences per batch (0: the first model's run, else 8)")->capture_default_str();
  d->add_option("--seq-len", w.seq_len, "tokens per sequence (0: the first model's run, else its recipe's)")
      ->capture_default_str();
  d->add_option("--batches", w.batches, "batches per domain (0: the first model's run, else 4)")->capture_default_str();
  d->add_option("--device", w.device, "cpu or cuda")->capture_default_str();
  d->add_option("--threads", c->threads, "CPU threads (0: torch's default)")->capture_default_str();
  d->add_option("--out", c->out, "also write DIR/domain-table.md, .json and .png");
  d->add_flag("--json", c->json, "print JSON instead of Markdown");
  d->callback([c] { run_domains(*c); });
}

}  // namespace slm::cli
