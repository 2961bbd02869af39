// Safetensors I/O: round trips of every dtype, byte-level conformance of written files to the published
// layout, reading a file assembled by hand, and rejection of corrupt files with messages naming file and tensor.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <dirent.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "slm/io/safetensors.h"
#include "slm/util/error.h"

namespace st = slm::safetensors;

namespace {

// A fresh directory (POSIX calls only: libtorch exports std::filesystem symbols that can shadow libstdc++'s).
std::string temp_dir(const std::string& name) {
  std::string tmpl = testing::TempDir() + "/slm_st_" + name + "_XXXXXX";
  char* d = mkdtemp(tmpl.data());
  if (d == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return tmpl;
}

// Entries in dir, without . and ..
long count_entries(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  long n = 0;
  while (dirent* e = readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
  closedir(d);
  return n;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Assembles a safetensors file from a header JSON text and a data buffer.
std::string assemble(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

std::string raw(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

void expect_load_error(const std::string& path, std::initializer_list<std::string> fragments) {
  try {
    st::load(path);
    ADD_FAILURE() << "expected an error loading " << path;
  } catch (const slm::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nmissing: " << f;
  }
}

}  // namespace

TEST(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  std::string dir = temp_dir("roundtrip");
  std::map<std::string, torch::Tensor> t;
  t["f32"] = torch::randn({3, 5});
  t["bf16"] = torch::randn({7}).to(torch::kBFloat16);
  t["f16"] = torch::randn({2, 2, 3}).to(torch::kHalf);
  t["f64"] = torch::randn({4}, torch::kDouble);
  t["u8"] = torch::randint(0, 256, {9}, torch::kUInt8);
  t["i8"] = torch::randint(-128, 128, {5}, torch::kInt8);
  t["i16"] = torch::randint(-1000, 1000, {3}, torch::kInt16);
  t["i32"] = torch::randint(-100000, 100000, {6}, torch::kInt32);
  t["i64"] = torch::tensor({int64_t{1} << 40, int64_t{-5}});
  t["bool"] = torch::tensor({true, false, true});
  t["f8"] = torch::randn({11}).to(torch::kFloat8_e4m3fn);
  t["scalar"] = torch::tensor(3.5f);
  t["empty"] = torch::zeros({0, 4});
  t["noncontig"] = torch::randn({4, 6}).t();
  std::string path = dir + "/a.safetensors";
  st::save(path, t, {{"format", "pt"}, {"note", "héllo"}});
  st::File f = st::load(path);
  ASSERT_EQ(f.tensors.size(), t.size());
  for (const auto& [name, x] : t) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    const torch::Tensor& y = f.tensors.at(name);
    EXPECT_EQ(y.scalar_type(), x.scalar_type()) << name;
    EXPECT_EQ(y.sizes(), x.sizes()) << name;
    if (x.scalar_type() == torch::kFloat8_e4m3fn)
      EXPECT_TRUE(torch::equal(y.view(torch::kUInt8), x.contiguous().view(torch::kUInt8))) << name;
    else
      EXPECT_TRUE(torch::equal(y, x)) << name;
  }
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("note"), "héllo");
  // Nothing but the file is left in the directory (the temporary was renamed).
  EXPECT_EQ(count_entries(dir), 1);
}

TEST(Safetensors, WrittenBytesFollowThePublishedLayout) {
  std::string dir = temp_dir("layout");
  std::string path = dir + "/b.safetensors";
  torch::Tensor a = torch::tensor({1.0f, -2.0f, 0.5f});
  torch::Tensor b = torch::tensor({int64_t{7}, int64_t{-1}});
  torch::Tensor c = torch::tensor({1, 2, 3}, torch::kUInt8);
  st::save(path, {{"a", a}, {"b", b}, {"c", c}}, {{"k", "v"}});
  std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "the byte buffer starts 8-aligned";
  auto h = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["k"], "v");
  EXPECT_EQ(h["a"]["dtype"], "F32");
  EXPECT_EQ(h["a"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(h["b"]["dtype"], "I64");
  EXPECT_EQ(h["c"]["dtype"], "U8");
  std::string data = bytes.substr(8 + n);
  EXPECT_EQ(data.size(), 12u + 16u + 3u);
  auto span = [&](const char* name) {
    auto off = h[name]["data_offsets"];
    uint64_t b0 = off[0], b1 = off[1];
    EXPECT_EQ(b0 % static_cast<uint64_t>(h[name]["dtype"] == "I64" ? 8 : h[name]["dtype"] == "F32" ? 4 : 1), 0u);
    return data.substr(b0, b1 - b0);
  };
  float af[3] = {1.0f, -2.0f, 0.5f};
  int64_t bi[2] = {7, -1};
  unsigned char cu[3] = {1, 2, 3};
  EXPECT_EQ(span("a"), raw(af, sizeof af));
  EXPECT_EQ(span("b"), raw(bi, sizeof bi));
  EXPECT_EQ(span("c"), raw(cu, sizeof cu));
}

TEST(Safetensors, ReadsAFileAssembledByHand) {
  std::string dir = temp_dir("hand");
  float f[2] = {1.5f, -3.0f};
  uint16_t bf[3] = {0x3F80, 0xC000, 0x0000};  // BF16 1, -2, 0
  std::string data = raw(f, sizeof f) + raw(bf, sizeof bf);
  std::string header =
      R"({"__metadata__":{"x":"y"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("h":{"dtype":"BF16","shape":[1,3],"data_offsets":[8,14]}}   )";
  std::string path = dir + "/hand.safetensors";
  write_bytes(path, assemble(header, data));
  st::File file = st::load(path);
  EXPECT_TRUE(torch::equal(file.tensors.at("w"), torch::tensor({1.5f, -3.0f})));
  EXPECT_TRUE(torch::equal(file.tensors.at("h").to(torch::kFloat), torch::tensor({{1.0f, -2.0f, 0.0f}})));
  EXPECT_EQ(file.metadata.at("x"), "y");
  st::Header h = st::read_header(path);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "w");
  EXPECT_EQ(h.tensors[1].end, 14u);
  EXPECT_EQ(h.data_start, 8 + header.size());
}

TEST(Safetensors, RejectsCorruptFilesNamingFileAndTensor) {
  std::string dir = temp_dir("corrupt");
  float f[4] = {1, 2, 3, 4};
  std::string data = raw(f, sizeof f);
  auto file_with = [&](const std::string& name, const std::string& header, const std::string& d) {
    std::string p = dir + "/" + name + ".safetensors";
    write_bytes(p, assemble(header, d));
    return p;
  };
  const std::string good = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  // Truncated data.
  expect_load_error(file_with("trunc", good, data.substr(0, 10)), {"tensor w", "past the end", "truncated"});
  // Shorter than the length prefix; header length beyond the file.
  std::string p = dir + "/short.safetensors";
  write_bytes(p, "abc");
  expect_load_error(p, {"shorter than the 8-byte"});
  std::string whole = assemble(good, data);
  p = dir + "/cut_header.safetensors";
  write_bytes(p, whole.substr(0, 20));
  expect_load_error(p, {"header length", "runs past the end of the file"});
  expect_load_error(file_with("json", "{\"w\": [1, 2", data), {"not valid JSON"});
  expect_load_error(file_with("size", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data),
                    {"tensor w", "needs 12 bytes", "cover 16"});
  expect_load_error(file_with("dtype", R"({"w":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", data),
                    {"tensor w", "unknown dtype 'F33'"});
  expect_load_error(file_with("overlap",
                              R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                              R"("v":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                              data),
                    {"tensor v", "overlap tensor w"});
  expect_load_error(file_with("hole", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", data),
                    {"hole before tensor w"});
  expect_load_error(file_with("trailing", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", data),
                    {"trailing"});
  expect_load_error(file_with("reversed", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", data),
                    {"tensor w", "end before they begin"});
  expect_load_error(file_with("negative", R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data),
                    {"tensor w", "non-negative"});
  expect_load_error(file_with("field", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1}})", data),
                    {"tensor w", "unknown field 'x'"});
  expect_load_error(file_with("meta", R"({"__metadata__":{"a":1},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data),
                    {"__metadata__.a", "must be a string"});
  expect_load_error(dir + "/missing.safetensors", {"cannot open"});
}

TEST(Safetensors, SaveRejectsBadInputAndLeavesNoTemporaryFiles) {
  std::string dir = temp_dir("bad_save");
  EXPECT_THROW(st::save(dir + "/x.safetensors", {{"c", torch::zeros({2}, torch::kComplexFloat)}}), slm::Error);
  EXPECT_THROW(st::save(dir + "/x.safetensors", {{"", torch::zeros({2})}}), slm::Error);
  EXPECT_THROW(st::save(dir + "/no/such/dir/x.safetensors", {{"a", torch::zeros({2})}}), slm::Error);
  EXPECT_EQ(count_entries(dir), 0);
  // Overwriting replaces the old file as a whole.
  std::string path = dir + "/y.safetensors";
  st::save(path, {{"a", torch::zeros({100})}});
  st::save(path, {{"b", torch::ones({2})}});
  st::File f = st::load(path);
  EXPECT_EQ(f.tensors.size(), 1u);
  EXPECT_TRUE(torch::equal(f.tensors.at("b"), torch::ones({2})));
  EXPECT_EQ(count_entries(dir), 1);
}
