// Finding a run directory's checkpoint (io/run_dir.h): the directory `latest` names, the path itself where there is
// no run directory, and a clear error where `latest` points nowhere. Directories made here, by hand.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "slm/io/run_dir.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::io {
namespace {

std::string temp_dir() {
  std::string tmpl = ::testing::TempDir() + "slm-run-dir-XXXXXX";
  char* d = mkdtemp(tmpl.data());
  if (d == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return d;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(RunDir, ARunDirectoryMeansTheCheckpointItsLatestNames) {
  const std::string run = temp_dir();
  ASSERT_EQ(::mkdir((run + "/ckpt-00000010").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((run + "/ckpt-00000020").c_str(), 0755), 0);
  write(run + "/latest", "ckpt-00000010\n");  // not the newest name: what latest says counts
  EXPECT_EQ(latest_checkpoint(run), run + "/ckpt-00000010");
  EXPECT_EQ(resolve_run_dir(run), run + "/ckpt-00000010");
  // A checkpoint directory, a weights file and a path that does not exist are no run directories.
  EXPECT_EQ(resolve_run_dir(run + "/ckpt-00000020"), run + "/ckpt-00000020");
  EXPECT_EQ(resolve_run_dir(run + "/ckpt-00000020/model.safetensors"), run + "/ckpt-00000020/model.safetensors");
  EXPECT_EQ(latest_checkpoint(run + "/nothing"), "");
  remove_tree(run);
}

TEST(RunDir, ALatestThatNamesNoCheckpointIsAnError) {
  const std::string run = temp_dir();
  for (const std::string name : {"ckpt-00000030", "", "../elsewhere"}) {
    write(run + "/latest", name);
    try {
      latest_checkpoint(run);
      ADD_FAILURE() << "accepted latest = '" << name << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("names checkpoint '" + name + "', which does not exist"), std::string::npos)
          << e.what();
    }
  }
  remove_tree(run);
}

}  // namespace
}  // namespace slm::io
