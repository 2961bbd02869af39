#include "slm/quant/nvfp4_store.h"

#include <set>
#include <sstream>

#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::nvfp4 {

namespace {

const std::string kCodes = ".nvfp4.codes";
const std::string kScales = ".nvfp4.scales";
const std::string kTensorScale = ".nvfp4.tensor_scale";
const std::string kShapeKey = ".nvfp4.shape";
const std::string kDtypeKey = ".nvfp4.dtype";
const std::string kMarker = ".nvfp4.";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_csv(const std::vector<int64_t>& s) {
  std::ostringstream o;
  for (size_t i = 0; i < s.size(); ++i) o << (i ? "," : "") << s[i];
  return o.str();
}

std::vector<int64_t> parse_shape(const std::string& text, const std::string& where) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string part = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 18)
      throw Error(where + ": shape '" + text + "' must be comma-separated positive integers");
    int64_t v = std::stoll(part);
    if (v <= 0) throw Error(where + ": shape '" + text + "' has a dimension <= 0");
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// File shapes of the three buffers for a logical shape.
struct FileShapes {
  std::vector<int64_t> codes, scales, tensor_scale;
};

FileShapes file_shapes(const std::vector<int64_t>& shape) {
  FileShapes f;
  int64_t K = shape.back(), blocks = (K + kBlock - 1) / kBlock;
  f.codes.assign(shape.begin(), shape.end() - 1);
  f.scales = f.codes;
  f.codes.push_back(blocks * kBlock / 2);
  f.scales.push_back(blocks);
  if (shape.size() >= 3)
    f.tensor_scale.assign(shape.begin(), shape.end() - 2);
  else
    f.tensor_scale = {1};
  return f;
}

}  // namespace

void add_entries(const std::string& name, const QTensor& q, std::map<std::string, torch::Tensor>& tensors,
                 safetensors::Metadata& metadata) {
  validate(q, "tensor " + name);
  FileShapes f = file_shapes(q.shape);
  tensors[name + kCodes] = q.codes.reshape(f.codes);
  tensors[name + kScales] = q.scales.reshape(f.scales);
  tensors[name + kTensorScale] = q.tensor_scale.reshape(f.tensor_scale);
  metadata.insert_or_assign(name + kShapeKey, shape_csv(q.shape));
  metadata.insert_or_assign(name + kDtypeKey, safetensors::dtype_name(q.dtype));
  metadata.insert_or_assign(std::string("slm.nvfp4"), std::string(kLayoutVersion));
}

Checkpoint from_file(safetensors::File file, const std::string& source) {
  Checkpoint c;
  std::set<std::string> claimed;
  auto version = file.metadata.find("slm.nvfp4");
  if (version != file.metadata.end() && version->second != kLayoutVersion)
    throw Error(source + ": NVFP4 layout version '" + version->second + "' is not supported (expected " +
                kLayoutVersion + ")");
  for (const auto& [key, value] : file.metadata) {
    if (!ends_with(key, kShapeKey)) continue;
    std::string name = key.substr(0, key.size() - kShapeKey.size());
    std::string where = source + ": NVFP4 tensor " + name;
    QTensor q;
    q.shape = parse_shape(value, where);
    auto dt = file.metadata.find(name + kDtypeKey);
    if (dt == file.metadata.end()) throw Error(where + ": metadata " + name + kDtypeKey + " is missing");
    q.dtype = safetensors::dtype_from_name(dt->second, where);
    if (!c10::isFloatingType(q.dtype)) throw Error(where + ": source dtype " + dt->second + " is not floating");
    FileShapes f = file_shapes(q.shape);
    auto take = [&](const std::string& suffix, torch::ScalarType want, const std::vector<int64_t>& shape,
                    const char* what) {
      auto it = file.tensors.find(name + suffix);
      if (it == file.tensors.end()) throw Error(where + ": tensor " + name + suffix + " (" + what + ") is missing");
      const torch::Tensor& t = it->second;
      if (t.scalar_type() != want)
        throw Error(where + ": " + what + " " + name + suffix + " has dtype " + safetensors::dtype_name(t.scalar_type()) +
                    ", expected " + safetensors::dtype_name(want));
      if (t.sizes().vec() != shape)
        throw Error(where + ": " + what + " " + name + suffix + " has shape " + shape_text(t.sizes().vec()) +
                    ", expected " + shape_text(shape) + " for logical shape " + shape_text(q.shape));
      claimed.insert(name + suffix);
      return t;
    };
    q.codes = take(kCodes, torch::kUInt8, f.codes, "codes").reshape({q.rows(), q.k_padded() / 2}).contiguous();
    q.scales = take(kScales, torch::kUInt8, f.scales, "block scales").reshape({q.rows(), q.blocks_per_row()}).contiguous();
    q.tensor_scale = take(kTensorScale, torch::kFloat, f.tensor_scale, "tensor scales").reshape({q.matrices()}).contiguous();
    validate(q, source + ": tensor " + name);
    if (file.tensors.count(name)) throw Error(where + ": a dense tensor of the same name is also stored");
    c.quantized.emplace(name, std::move(q));
  }
  for (auto& [name, t] : file.tensors) {
    if (claimed.count(name)) continue;
    size_t at = name.rfind(kMarker);
    if (at != std::string::npos && (ends_with(name, kCodes) || ends_with(name, kScales) || ends_with(name, kTensorScale)))
      throw Error(source + ": tensor " + name + " looks like an NVFP4 entry but metadata " + name.substr(0, at) +
                  kShapeKey + " is missing");
    c.dense.emplace(name, std::move(t));
  }
  for (auto& [key, value] : file.metadata) {
    if (key == "slm.nvfp4") continue;
    if (ends_with(key, kShapeKey) || ends_with(key, kDtypeKey)) {
      if (ends_with(key, kDtypeKey) && !c.quantized.count(key.substr(0, key.size() - kDtypeKey.size())))
        throw Error(source + ": metadata " + key + " has no matching " +
                    key.substr(0, key.size() - kDtypeKey.size()) + kShapeKey);
      continue;
    }
    c.metadata.emplace(key, value);
  }
  return c;
}

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  std::map<std::string, torch::Tensor> tensors = c.dense;
  safetensors::Metadata metadata = c.metadata;
  for (const auto& [name, q] : c.quantized) {
    if (tensors.count(name)) throw Error(path + ": tensor " + name + " is both dense and NVFP4");
    add_entries(name, q, tensors, metadata);
  }
  safetensors::save(path, tensors, metadata);
}

Checkpoint load_checkpoint(const std::string& path) { return from_file(safetensors::load(path), path); }

}  // namespace slm::nvfp4
