#pragma once
// From the router's label probabilities to a model: each model (a specialist of a manifest, a column of the domain
// table) answers a list of router labels. A label's probability counts once, for the first model in the given order
// whose labels include it, so a manifest decides which model answers a label two of them list by listing it first.
// The server (server/specialists.cpp) and the routed column of `slm eval domains` both route this way.
#include <string>
#include <vector>

namespace slm::router {

struct RouteMass {
  std::vector<double> mass;  // per model: the probability of the labels it answers
  double total = 0;          // the probability of the labels some model answers
  size_t best = 0;           // the model with the most mass; the first of them on a tie
};

// probabilities are in the order of labels; routes[m] are model m's labels. Throws slm::Error when no model is given.
RouteMass route_mass(const std::vector<double>& probabilities, const std::vector<std::string>& labels,
                     const std::vector<std::vector<std::string>>& routes);

}  // namespace slm::router
