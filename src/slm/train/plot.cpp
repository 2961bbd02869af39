#include "slm/train/plot.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/gnuplot.h"

namespace slm::train {

namespace {

struct Series {
  std::vector<std::pair<double, double>> points;  // (step, value)
};

void write_series(const std::string& path, const Series& s) {
  std::ofstream f(path);
  for (const auto& [x, y] : s.points) f << x << " " << y << "\n";
  if (!f) throw Error(path + ": cannot write");
}

// One PNG, png, from the gnuplot data and script under data_dir: every series as a line.
std::string plot(const std::string& data_dir, const std::string& png, const std::string& name, const std::string& title,
                 const std::string& xlabel, const std::string& ylabel, const std::map<std::string, Series>& series) {
  std::ostringstream gp;
  gp << "set terminal pngcairo size 960,560 noenhanced\nset output " << single_quoted(png) << "\n"
     << "set title " << single_quoted(title) << "\nset xlabel " << single_quoted(xlabel) << "\nset ylabel "
     << single_quoted(ylabel) << "\nset grid\nset key top right\nplot ";
  bool first = true;
  for (const auto& [label, s] : series) {
    if (s.points.empty()) continue;
    std::string stem = label;
    std::replace(stem.begin(), stem.end(), '/', '_');  // a label may be a path
    const std::string file = data_dir + "/" + name + "-" + stem + ".dat";
    write_series(file, s);
    gp << (first ? "" : ", ") << single_quoted(file) << " using 1:2 with " << (s.points.size() > 1 ? "lines" : "points")
       << " lw 2 title " << single_quoted(label);
    first = false;
  }
  gp << "\n";
  const std::string script = data_dir + "/" + name + ".gp";
  write_file_atomic(script, gp.str());
  run_gnuplot(script, data_dir + "/" + name + ".log");
  return png;
}

}  // namespace

std::vector<std::string> plot_run(const std::string& dir) {
  const std::string metrics = dir + "/metrics.jsonl";
  std::ifstream in(metrics);
  if (!in) throw Error(metrics + ": cannot open (is " + dir + " a training run directory?)");
  std::map<std::string, Series> loss, bpb, lr;
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step")) continue;
    const double step = j["step"].get<double>();
    ++n;
    if (j.contains("loss") && j["loss"].is_number() && !j.value("skipped", false))
      loss["train"].points.push_back({step, j["loss"].get<double>()});
    if (j.contains("lr") && j["lr"].is_number()) lr["lr"].points.push_back({step, j["lr"].get<double>()});
    if (j.contains("eval"))
      for (const auto& [domain, v] : j["eval"].items()) {
        if (v.contains("loss") && v["loss"].is_number())
          loss["val " + domain].points.push_back({step, v["loss"].get<double>()});
        if (v.contains("bpb") && v["bpb"].is_number()) bpb[domain].points.push_back({step, v["bpb"].get<double>()});
      }
  }
  if (n == 0) throw Error(metrics + ": no metrics yet");
  make_dirs(dir + "/plot");
  std::vector<std::string> out;
  const std::string data = dir + "/plot";
  out.push_back(plot(data, dir + "/loss.png", "loss", "loss (nats per token)", "step", "loss", loss));
  if (!bpb.empty())
    out.push_back(plot(data, dir + "/bpb.png", "bpb", "validation bits per byte", "step", "bits per byte", bpb));
  out.push_back(plot(data, dir + "/lr.png", "lr", "learning rate (matrix groups)", "step", "lr", lr));
  return out;
}

std::string plot_runs_by_time(const std::vector<std::string>& dirs, const std::string& png) {
  if (dirs.empty()) throw Error("plot: no run directories to compare");
  std::map<std::string, Series> loss;
  for (const auto& dir : dirs) {
    const std::string metrics = dir + "/metrics.jsonl";
    std::ifstream in(metrics);
    if (!in) throw Error(metrics + ": cannot open (is " + dir + " a training run directory?)");
    // The x axis is the time spent in training steps: each logged step's tokens over its tokens/s, the steps between
    // two records counted at the later record's rate. Evaluation and checkpoint time is left out, and a resumed run
    // continues where it stopped, so runs of different programs and interruptions compare on the same footing.
    std::string label = dir;
    while (label.size() > 1 && label.back() == '/') label.pop_back();
    label = label.substr(label.find_last_of('/') + 1);
    if (loss.count(label)) label = dir;  // two runs of one name (a/run, b/run) stay two lines
    auto& s = loss[label];
    double seconds = 0, last_tokens = 0;
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("loss") || !j.contains("tokens") || !j.contains("tokens_per_s")) continue;
      const double tokens = j["tokens"].get<double>(), rate = j["tokens_per_s"].get<double>();
      if (!(rate > 0) || tokens < last_tokens) continue;  // a record repeated by a resume from an earlier checkpoint
      seconds += (tokens - last_tokens) / rate;
      last_tokens = tokens;
      if (j["loss"].is_number() && !j.value("skipped", false))
        s.points.push_back({seconds / 60, j["loss"].get<double>()});
    }
    if (s.points.empty()) throw Error(metrics + ": no training steps with a loss and tokens/s");
  }
  const std::string data = png + ".plot";
  make_dirs(data);
  return plot(data, png, "loss", "training loss against the minutes of training steps", "minutes", "loss", loss);
}

}  // namespace slm::train
