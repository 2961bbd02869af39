#pragma once
// NVFP4 tensors inside safetensors files (docs/formats.md, "NVFP4 in safetensors"). A quantized tensor NAME of
// logical shape [..., R, K] is stored as three ordinary tensors plus two metadata strings:
//   NAME.nvfp4.codes         U8  [..., R, ceil(K/16)*8]   two E2M1 codes per byte, element 2j in the low nibble
//   NAME.nvfp4.scales        U8  [..., R, ceil(K/16)]     E4M3 block scales
//   NAME.nvfp4.tensor_scale  F32 [...] (or [1] for 1-D/2-D) one decode scale per matrix
//   __metadata__["NAME.nvfp4.shape"] = "D0,D1,...,K"     the logical shape
//   __metadata__["NAME.nvfp4.dtype"] = "BF16"            dtype of the source tensor (safetensors name)
// and __metadata__["slm.nvfp4"] = "1" marks the layout version.
#include <map>
#include <string>

#include "slm/io/safetensors.h"
#include "slm/quant/nvfp4.h"

namespace slm::nvfp4 {

inline constexpr const char* kLayoutVersion = "1";

struct Checkpoint {
  std::map<std::string, torch::Tensor> dense;  // stored as is
  std::map<std::string, QTensor> quantized;    // stored as NVFP4 entries
  safetensors::Metadata metadata;              // caller's metadata (the NVFP4 keys are added/removed here)
};

// Adds q's three tensors and two metadata keys under name.
void add_entries(const std::string& name, const QTensor& q, std::map<std::string, torch::Tensor>& tensors,
                 safetensors::Metadata& metadata);

// Splits a loaded file into dense and NVFP4 tensors, validating every NVFP4 entry; errors name source and tensor.
Checkpoint from_file(safetensors::File file, const std::string& source);

void save_checkpoint(const std::string& path, const Checkpoint& c);
Checkpoint load_checkpoint(const std::string& path);

}  // namespace slm::nvfp4
