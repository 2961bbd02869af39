#pragma once
// A small \r-redrawn progress bar for long CLI work. Library code never prints: it takes an optional
// ProgressFn callback, and the CLI passes one that feeds a ProgressBar.
#include <chrono>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace slm {

// Reports (done, total) in the caller's unit; total 0 means unknown.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

class ProgressBar {
 public:
  // unit "B" shows sizes in KB/MB/GB; any other unit is shown as a count. When the stream is not a terminal,
  // the bar redraws at most every 2 s and uses newlines instead of \r. After a second it shows the rate ("B" only)
  // and the ETA, both measured from the first update.
  ProgressBar(std::ostream& out, std::string label, uint64_t total, std::string unit = "");
  ~ProgressBar();
  void update(uint64_t done);
  void set_total(uint64_t total) { total_ = total; }
  void finish();
  ProgressFn callback();

 private:
  void draw(bool final);
  std::ostream& out_;
  std::string label_, unit_;
  uint64_t total_ = 0, done_ = 0;
  bool tty_ = false, finished_ = false, started_ = false;
  uint64_t base_done_ = 0;
  std::chrono::steady_clock::time_point start_, last_, base_time_;
};

}  // namespace slm
