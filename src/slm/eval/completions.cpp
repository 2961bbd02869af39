#include "slm/eval/completions.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "slm/util/error.h"

namespace slm::eval {

CompletionsFile::CompletionsFile(const std::string& path, const std::vector<Problem>& problems) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the completions file");
  std::set<std::string> known;
  for (const auto& p : problems) known.insert(p.name);
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw Error(where + ": not a JSON value (one completion object per line)");
    if (!j.is_object()) throw Error(where + ": expected a JSON object");
    const char* id_key = j.contains("task_id") ? "task_id" : "name";
    if (!j.contains(id_key) || !j[id_key].is_string())
      throw Error(where + ": needs a string \"task_id\" (or \"name\") naming the problem");
    if (!j.contains("completion") || !j["completion"].is_string())
      throw Error(where + ": needs a string \"completion\"");
    const auto task = j[id_key].get<std::string>();
    if (!known.count(task)) throw Error(where + ": task \"" + task + "\" is not in the problem file");
    by_task_[task].push_back(j["completion"].get<std::string>());
    ++lines_;
  }
  if (lines_ == 0) throw Error(path + ": no completions in the file");
}

std::string CompletionsFile::describe() const {
  return path_ + " (" + std::to_string(lines_) + " completions of " + std::to_string(by_task_.size()) + " problems)";
}

int CompletionsFile::count(const Problem& problem, int) const {
  const auto it = by_task_.find(problem.name);
  return it == by_task_.end() ? 0 : static_cast<int>(it->second.size());
}

std::vector<std::string> CompletionsFile::complete(const Problem& problem, int) {
  const auto it = by_task_.find(problem.name);
  return it == by_task_.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace slm::eval
