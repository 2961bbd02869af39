#pragma once
// Pictures of a training run: PNG curves drawn by gnuplot (Debian gnuplot-nox) from DIR/metrics.jsonl.
#include <string>
#include <vector>

namespace slm::train {

// Writes DIR/loss.png (training loss and validation loss per domain), DIR/bpb.png (validation bits per byte per
// domain, when measured) and DIR/lr.png, with the gnuplot data and script under DIR/plot/. Returns the PNG paths.
// Throws slm::Error when metrics.jsonl is missing or empty or gnuplot is not installed or fails.
std::vector<std::string> plot_run(const std::string& dir);

// Writes png: the training loss of each run directory against the minutes spent in its training steps (tokens over
// tokens/s per logged step; evaluation and checkpoints left out), one line per run named by its directory, with the
// gnuplot data and script under png + ".plot/". For comparing runs of different speed at equal time. Throws
// slm::Error as plot_run does, or when a run logged no tokens/s.
std::string plot_runs_by_time(const std::vector<std::string>& dirs, const std::string& png);

}  // namespace slm::train
