#pragma once
// Running gnuplot (Debian gnuplot-nox) on a script file, for the PNG pictures of training runs and evaluation reports.
#include <string>

namespace slm {

// s in single quotes, each ' written as '\'': a literal for the shell and for gnuplot alike.
std::string single_quoted(const std::string& s);

// Runs `gnuplot script`, its stderr to log. Throws slm::Error when gnuplot is not installed or fails (naming the log).
void run_gnuplot(const std::string& script, const std::string& log);

}  // namespace slm
