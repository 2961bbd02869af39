#pragma once
// Safetensors files (https://github.com/huggingface/safetensors, format section): an 8-byte little-endian
// header length N, N bytes of UTF-8 JSON {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// ..., "__metadata__": {"key": "value"}} (padded with spaces), then the byte buffer; offsets are relative to the
// buffer, tensors are row-major little-endian and the buffer is covered exactly (no holes, no overlaps).
//
// Writing is atomic: a temporary file next to the target is written, fsync'ed and renamed over it. Reading
// validates everything before trusting it and throws slm::Error naming the file and the tensor.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace slm::safetensors {

using Metadata = std::map<std::string, std::string>;

struct TensorInfo {
  std::string name;
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the byte buffer
  uint64_t end = 0;
};

struct Header {
  std::vector<TensorInfo> tensors;  // in file (offset) order
  Metadata metadata;
  uint64_t data_start = 0;  // absolute file offset of the byte buffer (8 + N)
};

struct File {
  std::map<std::string, torch::Tensor> tensors;  // CPU, contiguous
  Metadata metadata;
};

// Safetensors dtype names: BOOL U8 I8 U16 I16 F16 BF16 U32 I32 F32 U64 I64 F64 F8_E4M3 F8_E5M2.
std::string dtype_name(torch::ScalarType t);                                   // throws for others
torch::ScalarType dtype_from_name(const std::string& name, const std::string& what);
size_t dtype_size(torch::ScalarType t);

// Writes tensors (any device; copied to CPU, made contiguous) and metadata to path atomically. Tensors are laid
// out by decreasing element size, then name, so every tensor starts aligned to its element size; the header is
// padded so the buffer starts at a multiple of 8. Names must be non-empty and not "__metadata__".
void save(const std::string& path, const std::map<std::string, torch::Tensor>& tensors, const Metadata& metadata = {});

// Reads and validates the header only.
Header read_header(const std::string& path);

// Reads the whole file (validated).
File load(const std::string& path);

}  // namespace slm::safetensors
