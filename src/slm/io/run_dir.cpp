#include "slm/io/run_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::io {

std::string latest_checkpoint(const std::string& run_dir) {
  const std::string pointer = run_dir + "/latest";
  if (::access(pointer.c_str(), F_OK) != 0) return "";
  std::string name = read_file(pointer);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const std::string dir = run_dir + "/" + name;
  struct stat st;
  if (name.empty() || name.find('/') != std::string::npos || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(pointer + ": names checkpoint '" + name + "', which does not exist");
  return dir;
}

std::string resolve_run_dir(const std::string& path) {
  const std::string latest = latest_checkpoint(path);
  return latest.empty() ? path : latest;
}

}  // namespace slm::io
