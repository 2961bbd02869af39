#pragma once
// Training checkpoints. A run directory holds
//   ckpt-00000100/  model.safetensors      the weights (slm::model::save_weights: readable by other tools)
//                   optimizer.safetensors  every optimizer state tensor, plus the RNG state
//                   meta.json              recipe text, step, tokens seen, data cursor, configs, per-tensor CRC-32C
//   latest                                 the name of the newest complete checkpoint (io/run_dir.h finds it)
//   metrics.jsonl                          one JSON object per logged step (the trainer's)
// A checkpoint is written under a temporary name, fsynced and renamed, and `latest` is replaced the same way, so a
// crash at any point leaves the previous checkpoint as latest. Loading checks every file and every tensor's
// checksum before anything is copied into the model or the optimizer.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace slm::train {

using TensorMap = std::map<std::string, torch::Tensor>;

struct CheckpointData {
  TensorMap model;      // parameters and buffers by name (model::named_state)
  TensorMap optimizer;  // optimizer state tensors and "rng/cpu"
  nlohmann::json meta;  // free-form trainer metadata; "step" (int) is required
};

// Writes ckpt-<step>/ under run_dir atomically, points `latest` at it, then removes all but the newest keep_last
// checkpoints (keep_last <= 0 keeps everything). Returns the checkpoint directory.
std::string save_checkpoint(const std::string& run_dir, const CheckpointData& data, int keep_last);

// Reads and verifies a checkpoint directory (or a run directory: its latest). Throws slm::Error naming the file and,
// for a damaged tensor, the tensor.
CheckpointData load_checkpoint(const std::string& dir);

// Checkpoint directories in run_dir, oldest first.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

}  // namespace slm::train
