#include "slm/eval/ablation.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <set>
#include <sstream>

#include "slm/eval/domain_table.h"
#include "slm/io/run_dir.h"
#include "slm/recipe/accounting.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"
#include "slm/train/checkpoint.h"
#include "slm/train/trainer.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::eval {
namespace {

namespace fs = std::filesystem;

bool valid_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  return s != "." && s != "..";
}

std::string fixed(double v, const char* format) {
  char buf[48];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string millions(int64_t n) {
  return fixed(static_cast<double>(n) / 1e6, "%.1fM");
}

std::string read_text(const std::string& path) {
  return read_file(path);
}

}  // namespace

AblationPlan parse_ablation_plan(const nlohmann::json& j, const std::string& source) {
  auto fail = [&](const std::string& what) { return Error(source + ": " + what); };
  if (!j.is_object()) throw fail("an ablation plan is a JSON object");
  AblationPlan p;
  p.source = source;
  p.name = j.value("name", "");
  p.notes = j.value("notes", "");
  p.base = j.value("base", "");
  p.train = j.value("train", nlohmann::json::object());
  p.eval = j.value("eval", nlohmann::json::object());
  if (!valid_name(p.name)) throw fail("\"name\" must be letters, digits, '-', '_' or '.'");
  if (!p.train.is_object()) throw fail("\"train\" must be an object of training settings");
  if (!p.eval.is_object()) throw fail("\"eval\" must be an object (split, batch, seq_len, batches)");
  // Only settings TrainConfig knows, and none of those the runner sets per arm.
  const auto known = train::TrainConfig{}.to_json();
  for (const auto& [k, v] : p.train.items()) {
    if (k == "recipe" || k == "data" || k == "out" || k == "device")
      throw fail("\"train\": \"" + k + "\" is set by the runner (per arm, or by --data/--out/--device)");
    if (!known.contains(k)) throw fail("\"train\": unknown setting \"" + k + "\"");
  }
  for (const auto& [k, v] : p.eval.items())
    if (k != "split" && k != "batch" && k != "seq_len" && k != "batches")
      throw fail("\"eval\": unknown setting \"" + k + "\" (split, batch, seq_len, batches)");
  if (!j.contains("arms") || !j["arms"].is_array() || j["arms"].size() < 2)
    throw fail("\"arms\" must list at least two arms to compare");
  std::set<std::string> names;
  for (const auto& a : j["arms"]) {
    if (!a.is_object()) throw fail("every arm is an object with a \"name\"");
    AblationArm arm;
    arm.name = a.value("name", "");
    arm.recipe = a.value("recipe", "");
    arm.overrides = a.value("overrides", nlohmann::json());
    if (!valid_name(arm.name)) throw fail("arm \"" + arm.name + "\": names are letters, digits, '-', '_' or '.'");
    if (!names.insert(arm.name).second) throw fail("arm \"" + arm.name + "\" appears twice");
    if (arm.recipe.empty() && p.base.empty()) throw fail("arm \"" + arm.name + "\" has no recipe and the plan no base");
    if (!arm.overrides.is_null() && !arm.overrides.is_object())
      throw fail("arm \"" + arm.name + "\": \"overrides\" must be an object of recipe fields");
    p.arms.push_back(std::move(arm));
  }
  return p;
}

AblationPlan load_ablation_plan(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  return parse_ablation_plan(j, path);
}

nlohmann::json ArmResult::to_json() const {
  nlohmann::json s = nlohmann::json::object();
  for (const auto& [d, v] : scores)
    s[d] = {{"loss", v.loss},
            {"bpb", std::isnan(v.bpb) ? nlohmann::json() : nlohmann::json(v.bpb)},
            {"tokens", v.tokens},
            {"bytes", v.bytes},
            {"batches", v.batches}};
  return {{"name", name},
          {"recipe_file", recipe_file},
          {"run_dir", run_dir},
          {"params", params},
          {"active_params", active_params},
          {"steps", steps},
          {"tokens", tokens},
          {"seconds", seconds},
          {"scores", s}};
}

ArmResult ArmResult::from_json(const nlohmann::json& j) {
  ArmResult r;
  r.name = j.at("name").get<std::string>();
  r.recipe_file = j.at("recipe_file").get<std::string>();
  r.run_dir = j.at("run_dir").get<std::string>();
  r.params = j.at("params").get<int64_t>();
  r.active_params = j.at("active_params").get<int64_t>();
  r.steps = j.at("steps").get<int64_t>();
  r.tokens = j.at("tokens").get<int64_t>();
  r.seconds = j.at("seconds").get<double>();
  for (const auto& [d, v] : j.at("scores").items()) {
    train::DomainScore s;
    s.loss = v.at("loss").get<double>();
    s.bpb = v.at("bpb").is_null() ? std::nan("") : v.at("bpb").get<double>();
    s.tokens = v.at("tokens").get<int64_t>();
    s.bytes = v.at("bytes").get<double>();
    s.batches = v.at("batches").get<int64_t>();
    r.scores[d] = s;
  }
  return r;
}

nlohmann::json arm_recipe(const AblationPlan& plan, const AblationArm& arm) {
  const std::string source = arm.recipe.empty() ? plan.base : arm.recipe;
  nlohmann::json rj;
  try {
    rj = nlohmann::json::parse(read_text(source));
  } catch (const nlohmann::json::exception& e) {
    throw Error(source + ": not valid JSON: " + e.what());
  }
  if (!arm.overrides.is_null()) rj.merge_patch(arm.overrides);
  rj["name"] = plan.name + "-" + arm.name;
  return rj;
}

std::vector<ArmResult> run_ablations(const AblationPlan& plan, const AblationOptions& o, std::ostream& log) {
  if (o.data.empty() || o.out.empty()) throw Error("ablations: give the shard directory and an output directory");
  std::set<std::string> wanted(o.arms.begin(), o.arms.end());
  for (const auto& w : wanted)
    if (std::none_of(plan.arms.begin(), plan.arms.end(), [&](const AblationArm& a) { return a.name == w; }))
      throw Error("ablations: " + plan.source + " has no arm \"" + w + "\"");
  make_dirs(o.out);
  std::vector<ArmResult> results;
  size_t index = 0;
  for (const auto& arm : plan.arms) {
    ++index;
    if (!wanted.empty() && !wanted.count(arm.name)) continue;
    const std::string dir = o.out + "/" + arm.name, result_file = dir + "/result.json";
    if (fs::exists(result_file)) {
      log << "arm " << arm.name << " (" << index << "/" << plan.arms.size() << "): done earlier, " << result_file
          << "\n";
      results.push_back(ArmResult::from_json(nlohmann::json::parse(read_text(result_file))));
      continue;
    }
    make_dirs(dir);
    // The arm's recipe, kept beside its run.
    const std::string recipe_file = dir + "/recipe.json";
    write_file_atomic(recipe_file, arm_recipe(plan, arm).dump(2) + "\n");
    const Recipe recipe = load_recipe(recipe_file);  // a bad override fails here, naming the field
    const Accounting acc = account(recipe, make_plan(recipe));

    auto cj = train::TrainConfig{}.to_json();
    cj.merge_patch(plan.train);
    cj["recipe"] = recipe_file;
    cj["data"] = o.data;
    cj["out"] = dir + "/run";
    cj["device"] = o.device;
    if (o.steps > 0) cj["steps"] = o.steps;
    const train::TrainConfig cfg = train::TrainConfig::from_json(cj);
    log << "arm " << arm.name << " (" << index << "/" << plan.arms.size() << "): " << millions(acc.total)
        << " parameters, " << millions(acc.active) << " active\n";
    const std::string seconds_file = dir + "/train-seconds";
    double seconds = fs::exists(seconds_file) ? std::stod(read_text(seconds_file)) : 0.0;
    const auto t0 = std::chrono::steady_clock::now();
    int64_t steps = 0;
    {
      auto trainer = io::latest_checkpoint(cfg.out).empty()
                         ? train::Trainer(cfg, log)
                         : train::Trainer::resume(cfg.out, {{"steps", cfg.steps}}, log);
      trainer.run();
      steps = trainer.step();
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    write_file_atomic(seconds_file, fixed(seconds, "%.3f") + "\n");

    train::CheckpointEval req;
    req.checkpoint = cfg.out;
    req.data = o.data;
    req.device = o.device;
    req.bf16 = o.device == "cuda";
    req.tokenizer = cfg.tokenizer;
    req.split = plan.eval.value("split", "validation");
    req.batch = plan.eval.value("batch", int64_t{0});
    req.seq_len = plan.eval.value("seq_len", int64_t{0});
    req.batches = plan.eval.value("batches", int64_t{0});
    for (const auto& d : train::find_domains(o.data, {})) req.domains.push_back(d.name);
    const auto scored = train::evaluate_checkpoint(req);

    ArmResult r;
    r.name = arm.name;
    r.recipe_file = recipe_file;
    r.run_dir = cfg.out;
    r.params = acc.total;
    r.active_params = acc.active;
    r.steps = steps;
    r.tokens = steps * cfg.batch * cfg.accum * (cfg.seq_len > 0 ? cfg.seq_len : recipe.seq_len);
    r.seconds = seconds;
    r.scores = scored.domains;
    write_file_atomic(result_file, r.to_json().dump(2) + "\n");
    results.push_back(std::move(r));
  }
  return results;
}

namespace {

DomainTable arm_table(const std::vector<ArmResult>& results) {
  std::vector<std::pair<std::string, DomainScores>> scores;
  for (const auto& r : results) scores.emplace_back(r.name, r.scores);
  return make_domain_table(scores);
}

}  // namespace

std::string ablation_markdown(const AblationPlan& plan, const std::vector<ArmResult>& results) {
  const DomainTable table = arm_table(results);
  const auto pooled = pooled_scores(table);
  const char* unit = table.bpb ? "bits per byte" : "loss (nats per token)";
  std::ostringstream o;
  o << "Ablation plan `" << plan.name << "`" << (plan.notes.empty() ? "" : ": " + plan.notes) << "\n\n";
  o << "| arm | recipe | parameters | active | steps | tokens | train time | held-out " << unit << " (all) |\n";
  o << "|---|---|---:|---:|---:|---:|---:|---:|\n";
  double best = 1e300;
  for (const auto& r : results) best = std::min(best, measure(table, pooled.at(r.name)));
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const auto& arm =
        *std::find_if(plan.arms.begin(), plan.arms.end(), [&](const AblationArm& a) { return a.name == r.name; });
    std::string recipe = arm.recipe.empty() ? plan.base : arm.recipe;
    if (!arm.overrides.is_null()) recipe += " + `" + arm.overrides.dump() + "`";
    const double v = measure(table, pooled.at(r.name));
    const std::string value = fixed(v, "%.4f");
    o << "| " << r.name << " | " << recipe << " | " << millions(r.params) << " | " << millions(r.active_params) << " | "
      << r.steps << " | " << millions(r.tokens) << " | " << fixed(r.seconds, "%.0f s") << " | "
      << (v == best ? "**" + value + "**" : value) << " |\n";
  }
  o << "\nPer domain (the lowest of each row in bold):\n\n" << domain_table_markdown(table);
  return o.str();
}

nlohmann::json ablation_json(const AblationPlan& plan, const std::vector<ArmResult>& results) {
  nlohmann::json arms = nlohmann::json::array();
  for (const auto& r : results) arms.push_back(r.to_json());
  return {{"plan", plan.name},
          {"source", plan.source},
          {"arms", arms},
          {"domain_table", domain_table_json(arm_table(results))}};
}

}  // namespace slm::eval
