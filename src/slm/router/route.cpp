#include "slm/router/route.h"

#include <algorithm>

#include "slm/util/error.h"

namespace slm::router {

RouteMass route_mass(const std::vector<double>& probabilities, const std::vector<std::string>& labels,
                     const std::vector<std::vector<std::string>>& routes) {
  if (routes.empty()) throw Error("route: no model to route to");
  RouteMass r;
  r.mass.assign(routes.size(), 0.0);
  for (size_t l = 0; l < probabilities.size() && l < labels.size(); ++l)
    for (size_t m = 0; m < routes.size(); ++m)
      if (std::find(routes[m].begin(), routes[m].end(), labels[l]) != routes[m].end()) {
        r.mass[m] += probabilities[l];
        r.total += probabilities[l];
        break;
      }
  r.best = static_cast<size_t>(std::max_element(r.mass.begin(), r.mass.end()) - r.mass.begin());
  return r;
}

}  // namespace slm::router
