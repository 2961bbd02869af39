#pragma once
// Crash-safe file operations on POSIX calls. (The torch wheel's libtorch.so exports its own std::filesystem
// symbols and its remove_all crashes when mixed with ours: see README, "Pitfalls".)
#include <string>

namespace slm {

// Writes contents to a temporary file next to path, fsyncs it, renames it over path and fsyncs the directory.
void write_file_atomic(const std::string& path, const std::string& contents);

// fsync of a directory, making renames inside it durable (best effort: some file systems refuse it).
void fsync_dir(const std::string& dir);

// Removes a file or a directory tree (like rm -rf); missing paths are fine. Throws slm::Error on failure.
void remove_tree(const std::string& path);

// mkdir -p: creates the directory and every missing parent (mode 0755); an existing directory is fine. Throws
// slm::Error naming the path and the component that could not be made and why (e.g. it is a regular file).
void make_dirs(const std::string& path);

// make_dirs of the directory a file path names (nothing for a bare file name), so writing the file can succeed.
void make_parent_dirs(const std::string& file_path);

// The absolute path with every symlink, "." and ".." resolved (realpath(3)); "" when the path does not exist.
std::string real_path(const std::string& path);

// Whole file as a string; throws slm::Error naming the file when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace slm
