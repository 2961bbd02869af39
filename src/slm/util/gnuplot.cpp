#include "slm/util/gnuplot.h"

#include <sys/wait.h>

#include <cstdlib>

#include "slm/util/error.h"

namespace slm {

std::string single_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void run_gnuplot(const std::string& script, const std::string& log) {
  const std::string cmd = "gnuplot " + single_quoted(script) + " 2>" + single_quoted(log);
  const int rc = std::system(cmd.c_str());
  if (rc == 0) return;
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127)
    throw Error("gnuplot is not installed (Debian: apt-get install gnuplot-nox; scripts/setup.sh installs it)");
  throw Error("gnuplot failed on " + script + " (see " + log + ")");
}

}  // namespace slm
