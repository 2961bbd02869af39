#pragma once
// Finding a checkpoint in a training run directory (train/checkpoint.h describes the layout: ckpt-<step>/ and a
// `latest` file naming the newest complete one). Everything that loads a model takes either a checkpoint or a run
// directory, so the lookup lives here, below both the trainer that writes runs and the programs that read them.
#include <string>

namespace slm::io {

// The checkpoint directory `latest` names, or "" when run_dir has none. Throws slm::Error when `latest` names a
// directory that does not exist.
std::string latest_checkpoint(const std::string& run_dir);

// A run directory means its latest checkpoint; any other path (a checkpoint, a weights file) is returned as it is.
std::string resolve_run_dir(const std::string& path);

}  // namespace slm::io
