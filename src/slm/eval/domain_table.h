#pragma once
// The per-domain table of issue 18: every model (an ensemble's specialists, a generalist, any other checkpoint) scored
// on the same held-out windows of every domain (train::evaluate_checkpoint), and the oracle route: each domain
// answered by the model whose router labels include it. Rows are domains, columns models; Markdown, JSON and a PNG
// bar chart. The measure is bits per byte when every score has it (a tokenizer gave the bytes), else the loss in
// nats per token.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "slm/train/evaluate.h"

namespace slm::eval {

using DomainScores = std::map<std::string, train::DomainScore>;  // domain -> score

struct DomainTable {
  std::vector<std::string> models;             // columns, in the order given
  std::vector<std::string> domains;            // rows: every domain some model was scored on, by name
  std::map<std::string, DomainScores> scores;  // model -> its domains
  std::map<std::string, std::string> oracle;   // domain -> the model answering it (domains without one absent)
  bool bpb = true;                             // the measure: bits per byte, else loss (nats per token)
  DomainScores routed;                         // domain -> the routed column (add_routed; empty without a router)
  std::map<std::string, std::map<std::string, int64_t>> routed_windows;  // domain -> model -> windows routed to it
};

// routes: model -> the router labels (domain names) it answers. A domain's oracle is the first model, in column
// order, whose labels include it and which was scored on it. Throws slm::Error for a repeated or empty model name
// or for routes of a model that is not a column.
DomainTable make_domain_table(const std::vector<std::pair<std::string, DomainScores>>& scores,
                              const std::map<std::string, std::vector<std::string>>& routes = {});

// The routed column: window i of domain d answered by the model choice.at(d)[i] (an index into table.models, the
// model a router picked for that window's text), so the domain's score is the sum of each window's NLL under its
// model over the sum of the windows' bytes. Every model scores the same windows (train::evaluate_model). Throws
// slm::Error for a domain without choices, an index out of range, a model without the domain or a window count
// that differs from the choices'.
void add_routed(DomainTable& table, const std::map<std::string, std::vector<size_t>>& choice);

// The RouteLLM-style routing curve (issue 18): quality against the share of held-out windows sent away from a fallback
// model (the generalist) to specialists. One point per count c of windows sent, pooled over every window of every
// domain (sum of NLL over sum of bytes):
//   router: the c windows the router is most confident about (RouterPick::confidence, descending) answered by the
//           specialist it picks, every other window by the fallback; windows it picks the fallback for never count;
//   oracle: the c windows where the best specialist saves the most NLL over the fallback answered by that specialist:
//           no router sending c windows can do better, so it is the ceiling at each share;
//   random: sending a random c of the router's picks is, in expectation, the straight line from c = 0 to all of them.
struct RouterPick {
  size_t model = 0;       // index into table.models
  double confidence = 0;  // the router's probability for that model's labels
};
struct CurvePoint {
  int64_t sent = 0;  // windows answered by a specialist
  double share = 0;  // sent / all windows
  train::DomainScore score;
};
struct RoutingCurve {
  std::string fallback;
  int64_t windows = 0;
  std::vector<CurvePoint> router, oracle;  // router: c = 0..(windows picked away from the fallback); oracle: 0..windows
};

// picks: domain -> one pick per window of that domain (the table's window order). Throws slm::Error for a fallback
// that is not a model or lacks a picked domain, a pick out of range, or window counts that differ between models.
RoutingCurve routing_curve(const DomainTable& table, const std::string& fallback,
                           const std::map<std::string, std::vector<RouterPick>>& picks);
// A Markdown table at shares 0, 10, 25, 50, 75 % and the router's largest: router, random and oracle at each share.
std::string routing_curve_markdown(const DomainTable& table, const RoutingCurve& curve);
nlohmann::json routing_curve_json(const DomainTable& table, const RoutingCurve& curve);
// <dir>/routing-curve.png (gnuplot data and script beside it); returns its path.
std::string plot_routing_curve(const DomainTable& table, const RoutingCurve& curve, const std::string& dir);

// The table's measure of one score (bpb, or loss when the table has no bpb).
double measure(const DomainTable& table, const train::DomainScore& score);

// Every model's pooled score (train::pooled over its domains), and the oracle's: the oracle model's score of each
// domain that has one, pooled.
DomainScores pooled_scores(const DomainTable& table);
train::DomainScore oracle_pooled(const DomainTable& table);

// | domain | model ... | oracle | rows, then "all": the lowest model value of each row in bold; "—" where a model
// has no score. The oracle column only when some domain has one.
std::string domain_table_markdown(const DomainTable& table);
nlohmann::json domain_table_json(const DomainTable& table);
// Grouped bars, one group per domain, one bar per model: <dir>/domain-table.png (gnuplot data and script beside it).
// Returns the PNG's path; throws slm::Error when gnuplot is missing or fails.
std::string plot_domain_table(const DomainTable& table, const std::string& dir);

}  // namespace slm::eval
