// Output directories: make_dirs creates every missing parent and names what stands in the way.
#include <sys/stat.h>

#include "data/data_test_util.h"
#include "slm/util/files.h"

namespace slm::test {
namespace {

bool is_directory(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

TEST(MakeDirs, CreatesEveryMissingParentAndAcceptsExistingDirectories) {
  const std::string dir = fresh_dir("m");
  const std::string deep = dir + "/a/b/c";
  make_dirs(deep);
  EXPECT_TRUE(is_directory(dir + "/a"));
  EXPECT_TRUE(is_directory(dir + "/a/b"));
  EXPECT_TRUE(is_directory(deep));
  make_dirs(deep);        // already there: fine
  make_dirs(deep + "/");  // a trailing slash names the same directory
  make_dirs(dir + "//a/./b/d");
  EXPECT_TRUE(is_directory(dir + "/a/b/d"));

  make_parent_dirs(dir + "/x/y/file.bin");
  EXPECT_TRUE(is_directory(dir + "/x/y"));
  EXPECT_FALSE(is_directory(dir + "/x/y/file.bin")) << "only the parents are made";
}

TEST(MakeDirs, ARegularFileInThePathIsAClearErrorAndStaysAsItWas) {
  const std::string dir = fresh_dir("m");
  write_file(dir + "/plain", "keep me");
  auto e = error_of([&] { make_dirs(dir + "/plain/run/ckpt"); });
  EXPECT_NE(e.find(dir + "/plain/run/ckpt: cannot create the directory: " + dir + "/plain exists and is not a directory"),
            std::string::npos)
      << e;
  EXPECT_EQ(read_file(dir + "/plain"), "keep me");
  e = error_of([&] { make_dirs(dir + "/plain"); });
  EXPECT_NE(e.find("exists and is not a directory"), std::string::npos) << e;
  e = error_of([&] { make_parent_dirs(dir + "/plain/out.safetensors"); });
  EXPECT_NE(e.find(dir + "/plain exists and is not a directory"), std::string::npos) << e;
}

}  // namespace
}  // namespace slm::test
