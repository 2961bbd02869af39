#include "slm/train/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "slm/data/hashing.h"
#include "slm/io/run_dir.h"
#include "slm/io/safetensors.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::train {

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kMetaFile = "meta.json";
constexpr const char* kPrefix = "ckpt-";

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%08lld", kPrefix, static_cast<long long>(step));
  return buf;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// CRC-32C of a tensor's bytes as safetensors stores them (contiguous, CPU).
uint32_t tensor_crc(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kCPU).contiguous();
  return data::crc32c(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
}

nlohmann::json checksums(const TensorMap& tensors) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, t] : tensors) j[name] = tensor_crc(t);
  return j;
}

// Verifies a loaded file's tensors against the checksums recorded in meta.json: the same names, the same bytes.
void verify(const TensorMap& tensors, const nlohmann::json& sums, const std::string& file) {
  if (!sums.is_object()) throw Error(file + ": meta.json has no checksums for this file");
  for (const auto& [name, t] : tensors) {
    if (!sums.contains(name)) throw Error(file + ": tensor " + name + " is not listed in meta.json");
    if (sums[name].get<uint32_t>() != tensor_crc(t))
      throw Error(file + ": tensor " + name + " is corrupt (CRC-32C mismatch with meta.json)");
  }
  for (const auto& [name, _] : sums.items())
    if (!tensors.count(name)) throw Error(file + ": tensor " + name + " is missing");
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(run_dir.c_str());
  if (!d) return out;
  while (auto* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(kPrefix, 0) == 0 && name.size() == 13 &&
        std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      out.push_back(run_dir + "/" + name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string save_checkpoint(const std::string& run_dir, const CheckpointData& data, int keep_last) {
  if (!data.meta.contains("step")) throw Error("save_checkpoint: meta has no step");
  const int64_t step = data.meta["step"].get<int64_t>();
  make_dirs(run_dir);
  const std::string name = checkpoint_name(step), final_dir = run_dir + "/" + name;
  const std::string tmp = run_dir + "/.tmp-" + name + "-" + std::to_string(::getpid());
  remove_tree(tmp);
  if (::mkdir(tmp.c_str(), 0755) != 0) throw Error(tmp + ": cannot create the checkpoint directory");
  try {
    safetensors::save(tmp + "/" + kModelFile, data.model, {{"format", "slm-weights"}});
    safetensors::save(tmp + "/" + kOptimizerFile, data.optimizer, {{"format", "slm-optimizer"}});
    nlohmann::json meta = data.meta;
    meta["checksums"] = {{kModelFile, checksums(data.model)}, {kOptimizerFile, checksums(data.optimizer)}};
    write_file_atomic(tmp + "/" + kMetaFile, meta.dump(1) + "\n");
    fsync_dir(tmp);
    // Re-saving a step (resume, then an immediate stop) replaces the old directory only once the new one is whole.
    const std::string old = final_dir + ".old-" + std::to_string(::getpid());
    const bool replacing = is_dir(final_dir);
    if (replacing && ::rename(final_dir.c_str(), old.c_str()) != 0) throw Error(final_dir + ": cannot move aside");
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) throw Error(final_dir + ": cannot rename from " + tmp);
    fsync_dir(run_dir);
    write_file_atomic(run_dir + "/latest", name + "\n");
    if (replacing) remove_tree(old);
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
  if (keep_last > 0) {
    auto all = list_checkpoints(run_dir);
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i)
      if (all[i] != final_dir) remove_tree(all[i]);
  }
  return final_dir;
}

CheckpointData load_checkpoint(const std::string& path) {
  std::string dir = path;
  if (!is_dir(dir)) throw Error(path + ": no such checkpoint directory");
  if (::access((dir + "/" + kMetaFile).c_str(), F_OK) != 0) {
    dir = io::latest_checkpoint(path);
    if (dir.empty()) throw Error(path + ": neither a checkpoint (no meta.json) nor a run directory with one (no latest)");
  }
  CheckpointData out;
  const std::string meta_path = dir + "/" + kMetaFile;
  try {
    out.meta = nlohmann::json::parse(read_file(meta_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(meta_path + ": corrupt checkpoint metadata: " + e.what());
  }
  if (!out.meta.is_object() || !out.meta.contains("step") || !out.meta.contains("checksums"))
    throw Error(meta_path + ": not a checkpoint's metadata (no step or checksums)");
  for (auto [file, target] : {std::pair{kModelFile, &out.model}, std::pair{kOptimizerFile, &out.optimizer}}) {
    const std::string p = dir + "/" + file;
    *target = safetensors::load(p).tensors;
    verify(*target, out.meta["checksums"].value(file, nlohmann::json()), p);
  }
  out.meta.erase("checksums");
  out.meta["checkpoint_dir"] = dir;
  return out;
}

}  // namespace slm::train
