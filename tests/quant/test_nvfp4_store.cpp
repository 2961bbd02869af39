// NVFP4 inside safetensors: round trips, the documented layout decoded by hand from the raw file, and
// rejection of corrupt entries (truncated, wrong scale count, shape mismatch, missing pieces).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>

#include <fstream>

#include "quant/nvfp4_reference.h"
#include "slm/io/safetensors.h"
#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_store.h"
#include "slm/util/error.h"

namespace nv = slm::nvfp4;
namespace st = slm::safetensors;
namespace ref = slm::test::nvfp4ref;

namespace {

std::string temp_path(const std::string& name) {
  // POSIX only: libtorch exports std::filesystem symbols that can shadow libstdc++'s.
  std::string d = testing::TempDir() + "/slm_nvfp4_store";
  ::mkdir(d.c_str(), 0755);
  return d + "/" + name;
}

nv::Checkpoint sample() {
  torch::manual_seed(5);
  nv::Checkpoint c;
  c.dense["embed.weight"] = torch::randn({10, 8}).to(torch::kBFloat16);
  c.dense["norm.weight"] = torch::ones({8});
  c.quantized["layers.0.attn.wq.weight"] = nv::quantize(torch::randn({12, 40}).to(torch::kBFloat16));
  c.quantized["layers.0.moe.experts.w13"] = nv::quantize(torch::randn({3, 6, 32}));
  c.quantized["vec"] = nv::quantize(torch::randn({21}).to(torch::kHalf));
  c.metadata["recipe"] = "tiny";
  return c;
}

void expect_error(const std::string& path, std::initializer_list<std::string> fragments) {
  try {
    nv::load_checkpoint(path);
    ADD_FAILURE() << "expected an error for " << path;
  } catch (const slm::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nmissing: " << f;
  }
}

// Rewrites the file after applying edit to its raw tensors and metadata.
std::string corrupt(const std::string& name, const std::function<void(st::File&)>& edit) {
  std::string good = temp_path("good_" + name + ".safetensors");
  nv::save_checkpoint(good, sample());
  st::File f = st::load(good);
  edit(f);
  std::string bad = temp_path("bad_" + name + ".safetensors");
  st::save(bad, f.tensors, f.metadata);
  return bad;
}

}  // namespace

TEST(Nvfp4Store, RoundTripsDenseAndQuantizedTensors) {
  nv::Checkpoint c = sample();
  std::string path = temp_path("roundtrip.safetensors");
  nv::save_checkpoint(path, c);
  nv::Checkpoint r = nv::load_checkpoint(path);
  EXPECT_EQ(r.metadata, c.metadata);
  ASSERT_EQ(r.dense.size(), 2u);
  for (const auto& [name, t] : c.dense) EXPECT_TRUE(torch::equal(r.dense.at(name), t)) << name;
  ASSERT_EQ(r.quantized.size(), 3u);
  for (const auto& [name, q] : c.quantized) {
    const nv::QTensor& g = r.quantized.at(name);
    EXPECT_EQ(g.shape, q.shape) << name;
    EXPECT_EQ(g.dtype, q.dtype) << name;
    EXPECT_TRUE(torch::equal(g.codes, q.codes)) << name;
    EXPECT_TRUE(torch::equal(g.scales, q.scales)) << name;
    EXPECT_TRUE(torch::equal(g.tensor_scale, q.tensor_scale)) << name;
    EXPECT_TRUE(torch::equal(nv::dequantize(g), nv::dequantize(q))) << name;
  }
}

// Reads the raw file as the documentation describes it, without the library's NVFP4 code, and decodes
// every element: codes byte j of a row holds elements 2j (low nibble) and 2j+1; block b's scale is byte b of the
// row's scales; x = e2m1(code) * e4m3(scale) * tensor_scale[matrix].
TEST(Nvfp4Store, RawLayoutDecodesByTheDocumentedRules) {
  nv::Checkpoint c = sample();
  std::string path = temp_path("layout.safetensors");
  nv::save_checkpoint(path, c);
  st::File f = st::load(path);
  EXPECT_EQ(f.metadata.at("slm.nvfp4"), "1");
  EXPECT_EQ(f.metadata.at("layers.0.moe.experts.w13.nvfp4.shape"), "3,6,32");
  EXPECT_EQ(f.metadata.at("layers.0.attn.wq.weight.nvfp4.shape"), "12,40");
  EXPECT_EQ(f.metadata.at("layers.0.attn.wq.weight.nvfp4.dtype"), "BF16");
  EXPECT_EQ(f.metadata.at("vec.nvfp4.dtype"), "F16");
  const torch::Tensor& codes = f.tensors.at("layers.0.moe.experts.w13.nvfp4.codes");
  const torch::Tensor& scales = f.tensors.at("layers.0.moe.experts.w13.nvfp4.scales");
  const torch::Tensor& ts = f.tensors.at("layers.0.moe.experts.w13.nvfp4.tensor_scale");
  EXPECT_EQ(codes.sizes(), (std::vector<int64_t>{3, 6, 16}));
  EXPECT_EQ(scales.sizes(), (std::vector<int64_t>{3, 6, 2}));
  EXPECT_EQ(ts.sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(f.tensors.at("layers.0.attn.wq.weight.nvfp4.codes").sizes(), (std::vector<int64_t>{12, 24}));  // 40 -> 48
  EXPECT_EQ(f.tensors.at("layers.0.attn.wq.weight.nvfp4.scales").sizes(), (std::vector<int64_t>{12, 3}));
  EXPECT_EQ(f.tensors.at("layers.0.attn.wq.weight.nvfp4.tensor_scale").sizes(), (std::vector<int64_t>{1}));
  EXPECT_EQ(f.tensors.at("vec.nvfp4.codes").sizes(), (std::vector<int64_t>{16}));
  EXPECT_FALSE(f.tensors.count("layers.0.moe.experts.w13"));
  torch::Tensor want = nv::dequantize(c.quantized.at("layers.0.moe.experts.w13"), torch::kDouble);
  for (int e = 0; e < 3; ++e)
    for (int r = 0; r < 6; ++r)
      for (int k = 0; k < 32; ++k) {
        int byte = codes[e][r][k / 2].item<int>();
        int code = (k % 2 == 0) ? (byte & 15) : (byte >> 4);
        double x = ref::e2m1_value(code) * ref::e4m3_value(scales[e][r][k / 16].item<int>()) * ts[e].item<float>();
        EXPECT_NEAR(x, want[e][r][k].item<double>(), 1e-6 * std::fabs(x)) << e << " " << r << " " << k;
      }
}

TEST(Nvfp4Store, RejectsCorruptEntries) {
  const std::string w = "layers.0.attn.wq.weight";
  // Wrong scale count.
  expect_error(corrupt("scales", [&](st::File& f) { f.tensors[w + ".nvfp4.scales"] = f.tensors[w + ".nvfp4.scales"].narrow(1, 0, 2).contiguous(); }),
               {"NVFP4 tensor " + w, "block scales", "shape [12, 2], expected [12, 3]"});
  // Shape metadata that does not match the buffers.
  expect_error(corrupt("shape", [&](st::File& f) { f.metadata[w + ".nvfp4.shape"] = "12,70"; }),
               {"NVFP4 tensor " + w, "codes", "expected [12, 40]"});
  expect_error(corrupt("shape2", [&](st::File& f) { f.metadata[w + ".nvfp4.shape"] = "12,x"; }),
               {"NVFP4 tensor " + w, "comma-separated"});
  // Missing pieces.
  expect_error(corrupt("missing_ts", [&](st::File& f) { f.tensors.erase(w + ".nvfp4.tensor_scale"); }),
               {"NVFP4 tensor " + w, "tensor_scale", "missing"});
  expect_error(corrupt("missing_meta", [&](st::File& f) { f.metadata.erase(w + ".nvfp4.shape"); }),
               {w + ".nvfp4.codes", "looks like an NVFP4 entry"});
  expect_error(corrupt("missing_dtype", [&](st::File& f) { f.metadata.erase(w + ".nvfp4.dtype"); }),
               {"NVFP4 tensor " + w, ".nvfp4.dtype is missing"});
  // Wrong buffer dtype, NaN block scale, negative tensor scale, per-matrix count for experts.
  expect_error(corrupt("dtype", [&](st::File& f) { f.tensors[w + ".nvfp4.codes"] = f.tensors[w + ".nvfp4.codes"].to(torch::kInt32); }),
               {"codes", "has dtype I32, expected U8"});
  expect_error(corrupt("nan", [&](st::File& f) { f.tensors[w + ".nvfp4.scales"][0][0] = 0x7F; }), {w, "NaN"});
  expect_error(corrupt("neg", [&](st::File& f) { f.tensors[w + ".nvfp4.tensor_scale"][0] = -1.0f; }), {w, "tensor scale 0"});
  expect_error(corrupt("experts", [&](st::File& f) {
                 auto& t = f.tensors["layers.0.moe.experts.w13.nvfp4.tensor_scale"];
                 t = t.narrow(0, 0, 2).contiguous();
               }),
               {"layers.0.moe.experts.w13", "tensor scales", "shape [2], expected [3]"});
  expect_error(corrupt("version", [&](st::File& f) { f.metadata["slm.nvfp4"] = "9"; }), {"layout version '9'"});
  // A truncated file fails in the safetensors reader, naming the file and a tensor.
  std::string good = temp_path("trunc_src.safetensors");
  nv::save_checkpoint(good, sample());
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string bad = temp_path("trunc.safetensors");
  {
    std::ofstream out(bad, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 7));
  }
  expect_error(bad, {"truncated"});
}
