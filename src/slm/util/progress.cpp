#include "slm/util/progress.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace slm {

namespace {

std::string amount(uint64_t v, const std::string& unit) {
  char buf[64];
  if (unit == "B") {
    double d = static_cast<double>(v);
    if (d >= 1e9)
      std::snprintf(buf, sizeof buf, "%.2f GB", d / 1e9);
    else if (d >= 1e6)
      std::snprintf(buf, sizeof buf, "%.1f MB", d / 1e6);
    else if (d >= 1e3)
      std::snprintf(buf, sizeof buf, "%.1f KB", d / 1e3);
    else
      std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(v));
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%llu%s%s", static_cast<unsigned long long>(v), unit.empty() ? "" : " ", unit.c_str());
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::ostream& out, std::string label, uint64_t total, std::string unit)
    : out_(out), label_(std::move(label)), unit_(std::move(unit)), total_(total) {
  tty_ = (&out == &std::cerr && isatty(STDERR_FILENO)) || (&out == &std::cout && isatty(STDOUT_FILENO));
  start_ = last_ = std::chrono::steady_clock::now();
}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::update(uint64_t done) {
  done_ = done;
  auto now = std::chrono::steady_clock::now();
  if (!started_) {
    // Rate and ETA count from the first report: work skipped at once (a resumed download) does not inflate them.
    started_ = true;
    base_done_ = done;
    base_time_ = now;
  }
  auto min_gap = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(2000);
  if (now - last_ < min_gap) return;
  last_ = now;
  draw(false);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (total_ && done_ < total_) done_ = total_;
  draw(true);
}

ProgressFn ProgressBar::callback() {
  return [this](uint64_t done, uint64_t total) {
    if (total) total_ = total;
    update(done);
  };
}

void ProgressBar::draw(bool final) {
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = label_ + " ";
  if (total_) {
    double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
    constexpr int kWidth = 30;
    int fill = static_cast<int>(frac * kWidth);
    line += "[" + std::string(fill, '#') + std::string(kWidth - fill, '.') + "] ";
    char pct[16];
    std::snprintf(pct, sizeof pct, "%5.1f%% ", frac * 100.0);
    line += pct + amount(done_, unit_) + " / " + amount(total_, unit_);
  } else {
    line += amount(done_, unit_);
  }
  char t[48];
  std::snprintf(t, sizeof t, "  %.1fs", secs);
  line += t;
  const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - base_time_).count();
  if (!final && started_ && done_ > base_done_ && since > 1.0) {
    const double rate = static_cast<double>(done_ - base_done_) / since;
    if (unit_ == "B") line += "  " + amount(static_cast<uint64_t>(rate), unit_) + "/s";
    if (total_ > done_) {
      const auto eta = static_cast<uint64_t>(static_cast<double>(total_ - done_) / rate);
      char e[48];
      if (eta >= 3600)
        std::snprintf(e, sizeof e, "  ETA %lluh%02llum", static_cast<unsigned long long>(eta / 3600),
                      static_cast<unsigned long long>(eta / 60 % 60));
      else
        std::snprintf(e, sizeof e, "  ETA %llum%02llus", static_cast<unsigned long long>(eta / 60),
                      static_cast<unsigned long long>(eta % 60));
      line += e;
    }
  }
  if (tty_)
    out_ << "\r" << line << "\x1b[K" << (final ? "\n" : "") << std::flush;
  else
    out_ << line << "\n" << std::flush;
}

}  // namespace slm
