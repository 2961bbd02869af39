#include "slm/util/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "slm/util/error.h"

namespace slm {

namespace {
std::string sys_error() { return std::strerror(errno); }

std::string parent_dir(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

std::string real_path(const std::string& path) {
  char* real = ::realpath(path.c_str(), nullptr);
  const std::string out = real ? real : "";
  std::free(real);
  return out;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path + ": cannot create temporary file " + tmp + ": " + sys_error());
  const char* p = contents.data();
  size_t left = contents.size();
  bool ok = true;
  std::string what;
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      ok = false;
      what = "write failed: " + sys_error();
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (ok && ::fsync(fd) != 0) ok = false, what = "fsync failed: " + sys_error();
  if (::close(fd) != 0 && ok) ok = false, what = "close failed: " + sys_error();
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) ok = false, what = "rename failed: " + sys_error();
  if (!ok) {
    ::unlink(tmp.c_str());
    throw Error(path + ": " + what);
  }
  fsync_dir(parent_dir(path));
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw Error(path + ": cannot stat: " + sys_error());
  }
  auto remove_one = [](const char* p, const struct stat*, int flag, struct FTW*) -> int {
    return flag == FTW_DP ? ::rmdir(p) : ::unlink(p);
  };
  if (::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
    throw Error(path + ": cannot remove: " + sys_error());
}

void make_dirs(const std::string& path) {
  if (path.empty()) throw Error("cannot create a directory with an empty name");
  // Each prefix ending before a '/' (and the whole path) in turn, root first, as mkdir -p does.
  for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    const std::string part = path.substr(0, end);
    struct stat st;
    if (::stat(part.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        throw Error(path + ": cannot create the directory: " + part + " exists and is not a directory");
    } else if (errno != ENOENT) {
      throw Error(path + ": cannot create the directory: " + part + ": " + sys_error());
    } else if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {  // EEXIST: made by someone else meanwhile
      throw Error(path + ": cannot create the directory " + part + ": " + sys_error());
    }
    if (end == std::string::npos) return;
  }
}

void make_parent_dirs(const std::string& file_path) {
  if (file_path.find('/') != std::string::npos) make_dirs(parent_dir(file_path));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open: " + sys_error());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(path + ": read failed");
  return ss.str();
}

}  // namespace slm
