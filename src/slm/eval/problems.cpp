#include "slm/eval/problems.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "slm/util/error.h"

namespace slm::eval {

std::vector<Problem> load_problems(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the problem file");
  std::vector<Problem> out;
  std::set<std::string> names;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw Error(where + ": not a JSON value (one problem object per line)");
    if (!j.is_object()) throw Error(where + ": expected a JSON object");
    auto text = [&](const char* key) {
      if (!j.contains(key)) throw Error(where + ": the problem has no \"" + key + "\" field");
      if (!j[key].is_string()) throw Error(where + ": \"" + key + "\" must be a string");
      return j[key].get<std::string>();
    };
    Problem p{text("name"), text("prompt"), text("tests"), {}, {}};
    if (!j.contains("stop_tokens")) throw Error(where + ": the problem has no \"stop_tokens\" field");
    const auto& stops = j["stop_tokens"];
    if (!stops.is_array()) throw Error(where + ": \"stop_tokens\" must be an array of strings");
    for (const auto& s : stops) {
      if (!s.is_string() || s.get<std::string>().empty())
        throw Error(where + ": \"stop_tokens\" must hold non-empty strings");
      p.stop_tokens.push_back(s.get<std::string>());
    }
    if (p.name.empty()) throw Error(where + ": \"name\" is empty");
    if (!names.insert(p.name).second) throw Error(where + ": problem \"" + p.name + "\" appears twice");
    out.push_back(std::move(p));
  }
  if (out.empty()) throw Error(path + ": no problems in the file");
  return out;
}

std::string program_text(const Problem& problem, const std::string& completion) {
  // As MultiPL-E assembles it: the tests begin with the function's closing brace, on a line of its own.
  return problem.prompt + completion + "\n" + problem.tests;
}

}  // namespace slm::eval
