#include "slm/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // the format's limit on the JSON header

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};

const DtypeName kDtypes[] = {
    {torch::kBool, "BOOL"},   {torch::kUInt8, "U8"},    {torch::kInt8, "I8"},
    {torch::kUInt16, "U16"},  {torch::kInt16, "I16"},   {torch::kHalf, "F16"},
    {torch::kBFloat16, "BF16"}, {torch::kUInt32, "U32"}, {torch::kInt32, "I32"},
    {torch::kFloat, "F32"},   {torch::kUInt64, "U64"},  {torch::kInt64, "I64"},
    {torch::kDouble, "F64"},  {torch::kFloat8_e4m3fn, "F8_E4M3"}, {torch::kFloat8_e5m2, "F8_E5M2"},
};

std::string sys_error() { return std::strerror(errno); }

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

void write_all(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, std::min<size_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": write failed: " + sys_error());
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all_at(int fd, char* data, size_t n, uint64_t offset, const std::string& path, const std::string& what) {
  while (n > 0) {
    ssize_t r = ::pread(fd, data, std::min<size_t>(n, 1u << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": reading " + what + " failed: " + sys_error());
    }
    if (r == 0) throw Error(path + ": unexpected end of file while reading " + what + " (file truncated?)");
    data += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

uint64_t checked_u64(const nlohmann::json& v, const std::string& where) {
  if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
    throw Error(where + " must be a non-negative integer, got " + v.dump());
  return v.get<uint64_t>();
}

Header parse_header(int fd, uint64_t file_size, const std::string& path) {
  if (file_size < 8)
    throw Error(path + ": file is " + std::to_string(file_size) +
                " bytes, shorter than the 8-byte safetensors header length (truncated or not a safetensors file)");
  unsigned char len_bytes[8];
  read_all_at(fd, reinterpret_cast<char*>(len_bytes), 8, 0, path, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > file_size - 8)
    throw Error(path + ": header length " + std::to_string(n) + " runs past the end of the file (" +
                std::to_string(file_size) + " bytes; truncated or not a safetensors file)");
  if (n > kMaxHeader) throw Error(path + ": header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n < 2) throw Error(path + ": header length " + std::to_string(n) + " is too small for a JSON object");
  std::string text(n, '\0');
  read_all_at(fd, text.data(), n, 8, path, "the header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw Error(path + ": header is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(path + ": header must be a JSON object");

  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = file_size - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it.value().is_object()) throw Error(path + ": __metadata__ must be an object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string())
          throw Error(path + ": __metadata__." + m.key() + " must be a string, got " + m.value().dump());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor " + name;
    const nlohmann::json& e = it.value();
    if (!e.is_object()) throw Error(where + ": entry must be an object");
    for (auto k = e.begin(); k != e.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        throw Error(where + ": unknown field '" + k.key() + "' (expected dtype, shape, data_offsets)");
    if (!e.contains("dtype") || !e["dtype"].is_string()) throw Error(where + ": dtype missing or not a string");
    if (!e.contains("shape") || !e["shape"].is_array()) throw Error(where + ": shape missing or not an array");
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
      throw Error(where + ": data_offsets must be an array [begin, end]");
    TensorInfo t;
    t.name = name;
    t.dtype = dtype_from_name(e["dtype"].get<std::string>(), where);
    unsigned __int128 numel = 1, span = 1;
    for (const auto& d : e["shape"]) {
      uint64_t v = checked_u64(d, where + ": shape entry");
      if (v > (uint64_t{1} << 62)) throw Error(where + ": shape entry " + std::to_string(v) + " is too large");
      t.shape.push_back(static_cast<int64_t>(v));
      numel *= v;
      if (numel > (static_cast<unsigned __int128>(1) << 64)) throw Error(where + ": shape is too large");
      // The strides libtorch computes for the tensor skip zero sizes: [0, 2^62, 2^62] has no bytes but does not fit.
      span *= std::max<uint64_t>(v, 1);
      if (span > static_cast<uint64_t>(INT64_MAX)) throw Error(where + ": shape is too large");
    }
    t.begin = checked_u64(e["data_offsets"][0], where + ": data_offsets[0]");
    t.end = checked_u64(e["data_offsets"][1], where + ": data_offsets[1]");
    if (t.begin > t.end)
      throw Error(where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                  "] end before they begin");
    if (t.end > data_size)
      throw Error(where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                  "] run past the end of the data (" + std::to_string(data_size) + " bytes; file truncated?)");
    unsigned __int128 want = numel * dtype_size(t.dtype);
    if (want != t.end - t.begin)
      throw Error(where + ": dtype " + dtype_name(t.dtype) + " shape " + shape_text(t.shape) + " needs " +
                  std::to_string(static_cast<uint64_t>(want)) + " bytes but data_offsets cover " +
                  std::to_string(t.end - t.begin));
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.begin < pos)
      throw Error(path + ": tensor " + t.name + ": data_offsets [" + std::to_string(t.begin) + ", " +
                  std::to_string(t.end) + "] overlap tensor " + (prev ? prev->name : std::string("?")));
    if (t.begin > pos)
      throw Error(path + ": bytes [" + std::to_string(pos) + ", " + std::to_string(t.begin) +
                  ") of the data belong to no tensor (hole before tensor " + t.name + ")");
    pos = t.end;
    prev = &t;
  }
  if (pos != data_size)
    throw Error(path + ": the data is " + std::to_string(data_size) + " bytes but the tensors cover " +
                std::to_string(pos) + " (trailing bytes)");
  return h;
}

}  // namespace

std::string dtype_name(torch::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw Error(std::string("dtype ") + c10::toString(t) + " cannot be stored in safetensors");
}

torch::ScalarType dtype_from_name(const std::string& name, const std::string& what) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  std::string known;
  for (const auto& d : kDtypes) known += std::string(known.empty() ? "" : " ") + d.name;
  throw Error(what + ": unknown dtype '" + name + "' (known: " + known + ")");
}

size_t dtype_size(torch::ScalarType t) { return c10::elementSize(t); }

void save(const std::string& path, const std::map<std::string, torch::Tensor>& tensors, const Metadata& metadata) {
  struct Item {
    std::string name;
    torch::Tensor t;
    size_t elsize;
  };
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__")
      throw Error(path + ": invalid tensor name '" + name + "'");
    if (!t.defined()) throw Error(path + ": tensor " + name + " is undefined");
    torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
    dtype_name(c.scalar_type());  // throws for unsupported dtypes
    items.push_back({name, c, c10::elementSize(c.scalar_type())});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.elsize != b.elsize ? a.elsize > b.elsize : a.name < b.name;
  });
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t off = 0;
  for (const auto& it : items) {
    uint64_t n = static_cast<uint64_t>(it.t.numel()) * it.elsize;
    h[it.name] = {{"dtype", dtype_name(it.t.scalar_type())}, {"shape", it.t.sizes().vec()}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string text = h.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');

  static std::atomic<unsigned> counter{0};
  std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw Error(path + ": cannot create temporary file " + tmp + ": " + sys_error());
  try {
    unsigned char len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xFF);
    write_all(fd.get(), reinterpret_cast<const char*>(len), 8, path);
    write_all(fd.get(), text.data(), text.size(), path);
    for (const auto& it : items)
      write_all(fd.get(), static_cast<const char*>(it.t.data_ptr()), static_cast<size_t>(it.t.numel()) * it.elsize,
                path);
    if (::fsync(fd.get()) != 0) throw Error(path + ": fsync failed: " + sys_error());
    if (::close(fd.release()) != 0) throw Error(path + ": close failed: " + sys_error());
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw Error(path + ": rename from " + tmp + " failed: " + sys_error());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename durable (best effort: some file systems refuse fsync on directories).
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

Header read_header(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw Error(path + ": cannot open: " + sys_error());
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw Error(path + ": cannot stat: " + sys_error());
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  return parse_header(fd.get(), static_cast<uint64_t>(st.st_size), path);
}

File load(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw Error(path + ": cannot open: " + sys_error());
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw Error(path + ": cannot stat: " + sys_error());
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  Header h = parse_header(fd.get(), static_cast<uint64_t>(st.st_size), path);
  File f;
  f.metadata = std::move(h.metadata);
  for (const auto& t : h.tensors) {
    torch::Tensor x = torch::empty(t.shape, torch::TensorOptions().dtype(t.dtype));
    read_all_at(fd.get(), static_cast<char*>(x.data_ptr()), t.end - t.begin, h.data_start + t.begin, path,
                "tensor " + t.name);
    f.tensors.emplace(t.name, std::move(x));
  }
  return f;
}

}  // namespace slm::safetensors
