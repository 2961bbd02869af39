#include "slm/train/plot.h"

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

// One PNG: every series as a line, the x axis in steps.
std::string plot(const std::string& dir, const std::string& name, const std::string& title, const std::string& ylabel,
                 const std::map<std::string, Series>& series) {
  const std::string data_dir = dir + "/plot";
  std::ostringstream gp;
  const std::string png = dir + "/" + name + ".png";
  gp << "set terminal pngcairo size 960,560 noenhanced\nset output " << single_quoted(png) << "\n"
     << "set title " << single_quoted(title) << "\nset xlabel 'step'\nset ylabel " << single_quoted(ylabel) << "\n"
     << "set grid\nset key top right\nplot ";
  bool first = true;
  for (const auto& [label, s] : series) {
    if (s.points.empty()) continue;
    const std::string file = data_dir + "/" + name + "-" + label + ".dat";
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
  out.push_back(plot(dir, "loss", "loss (nats per token)", "loss", loss));
  if (!bpb.empty()) out.push_back(plot(dir, "bpb", "validation bits per byte", "bits per byte", bpb));
  out.push_back(plot(dir, "lr", "learning rate (matrix groups)", "lr", lr));
  return out;
}

}  // namespace slm::train
