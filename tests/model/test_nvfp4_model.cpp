// The model on an NVFP4 checkpoint: a random tiny-hybrid model is saved, quantized with `slm quantize`'s
// quantizer and reloaded; its logits (full forward and cached decode) must equal those of the same model whose
// weights were replaced by dequantize(quantize(W)) in fp32 and run with dense matmuls (the independent reference),
// and stay close to the unquantized model's. Corrupt NVFP4 checkpoints are refused naming the tensor.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>

#include "model_test_util.h"
#include "quant/nvfp4_fp32_kernel.h"
#include "slm/engine/graph_decoder.h"
#include "slm/io/safetensors.h"
#include "slm/model/weights.h"
#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_linear.h"
#include "slm/quant/nvfp4_store.h"
#include "slm/quant/quantize_checkpoint.h"
#include "slm/recipe/accounting.h"

using namespace slm;
using namespace slm::test;

namespace {

Recipe tiny_hybrid() {
  return load_recipe(source_path("recipes/tiny-hybrid.json"));
}

std::string temp_file(const std::string& name) {
  return testing::TempDir() + "/nvfp4_model_" + std::to_string(getpid()) + "_" + name;
}

std::set<std::string> quantizable_names(const Recipe& r, bool head = false, bool embedding = false) {
  std::set<std::string> out;
  for (const auto& p : account(r, make_plan(r)).params)
    if (p.quantized() || (head && p.kind == ParamKind::Head) || (embedding && p.kind == ParamKind::Embedding))
      out.insert(p.name);
  return out;
}

// A random tiny-hybrid model saved dense (fp32) and quantized by the checkpoint quantizer.
struct Checkpoints {
  Recipe recipe = tiny_hybrid();
  std::string dense = temp_file("dense.safetensors");
  std::string nvfp4 = temp_file("nvfp4.safetensors");
  std::string nvfp4_head = temp_file("nvfp4_head.safetensors");  // the LM head quantized too
  std::string nvfp4_all = temp_file("nvfp4_all.safetensors");    // the head and the token embedding too
  Checkpoints() {
    model::HybridLM m(recipe);
    randomize(m, 31);
    model::save_weights(m, dense);
    nvfp4::quantize_checkpoint(dense, nvfp4, recipe, {});
    nvfp4::quantize_checkpoint(dense, nvfp4_head, recipe, {}, /*quantize_head=*/true);
    nvfp4::quantize_checkpoint(dense, nvfp4_all, recipe, {}, /*quantize_head=*/true, /*quantize_embedding=*/true);
  }
};

const Checkpoints& checkpoints() {
  static const Checkpoints c;
  return c;
}

std::unique_ptr<model::HybridLM> load(const std::string& path) {
  auto m = std::make_unique<model::HybridLM>(checkpoints().recipe);
  model::load_weights(*m, path);
  m->eval();
  return m;
}

// The reference: the dense model with every quantizable weight replaced by dequantize(quantize(W)) in fp32 and
// every other tensor rounded to BF16, as the quantizer stores it; it runs the ordinary dense matmuls.
std::unique_ptr<model::HybridLM> dequantized_reference(bool head = false, bool embedding = false) {
  auto m = load(checkpoints().dense);
  const auto quantizable = quantizable_names(m->recipe(), head, embedding);
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : model::named_state(*m))
    t.copy_(quantizable.count(name) ? nvfp4::dequantize(nvfp4::quantize(t), torch::kFloat)
                                    : t.to(torch::kBFloat16).to(torch::kFloat));
  return m;
}

// Largest |a - b| over the largest |b|: the tolerance scale of fp32 sums in a different order.
double rel_max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return max_abs_diff(a, b) / b.abs().max().item<double>();
}

// q's forward, chunked prefill and cached decode all equal ref's (on 2 x 19 random tokens), and `other` (the same
// checkpoint with one part left out of NVFP4) differs from ref: the part really changed.
void expect_equal_to_reference(model::HybridLM& q, model::HybridLM& ref, model::HybridLM& other, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto tokens = random_tokens(2, 19, q.recipe().vocab_size, seed);
  auto lq = q.forward(tokens).logits, lr = ref.forward(tokens).logits;
  EXPECT_LT(rel_max_diff(lq, lr), 1e-5);
  EXPECT_GT(rel_max_diff(other.forward(tokens).logits, lr), 1e-3);
  auto sq = q.new_state(2, 19), sr = ref.new_state(2, 19);
  EXPECT_LT(rel_max_diff(q.prefill(tokens.narrow(1, 0, 18), sq), ref.prefill(tokens.narrow(1, 0, 18), sr)), 1e-5);
  EXPECT_LT(rel_max_diff(q.decode(tokens.select(1, 18), sq), ref.decode(tokens.select(1, 18), sr)), 1e-5);
}

void expect_load_error(const std::string& path, const std::string& fragment) {
  model::HybridLM m(checkpoints().recipe);
  randomize(m, 5);
  m.eval();
  auto tokens = random_tokens(1, 8, m.recipe().vocab_size, 3);
  auto before = m.forward(tokens).logits;
  try {
    model::load_weights(m, path);
    ADD_FAILURE() << "expected an error containing: " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_TRUE(model::nvfp4_weights(m).empty());
  EXPECT_TRUE(torch::equal(before, m.forward(tokens).logits)) << "a refused load changed the model";
}

}  // namespace

TEST(Nvfp4Model, EveryQuantizableWeightRunsInNvfp4WithoutADenseCopy) {
  single_threaded();
  auto m = load(checkpoints().nvfp4);
  const auto quantizable = quantizable_names(m->recipe());
  const auto used = model::nvfp4_weights(*m);
  EXPECT_EQ(std::set<std::string>(used.begin(), used.end()), quantizable);
  EXPECT_GT(quantizable.size(), 30u);
  auto state = model::named_state(*m);
  for (const auto& name : quantizable) EXPECT_EQ(state.at(name).numel(), 0) << name;
  for (const auto& p : m->parameters()) EXPECT_FALSE(p.requires_grad());
  EXPECT_THROW(model::save_weights(*m, temp_file("resave.safetensors")), Error);
}

// use_nvfp4_weights installs matrices as the loader does: the dense model given the quantizer's matrices (its other
// tensors rounded to BF16, as the checkpoint stores them) computes what the loaded NVFP4 checkpoint computes. A name
// that is not a matrix, or a wrong shape, is refused before anything changes.
TEST(Nvfp4Model, MatricesInstalledInMemoryEqualTheLoadedCheckpoint) {
  single_threaded();
  auto loaded = load(checkpoints().nvfp4);
  auto m = load(checkpoints().dense);
  const auto quantizable = quantizable_names(m->recipe());
  std::map<std::string, nvfp4::QTensor> matrices;
  {
    torch::NoGradGuard no_grad;
    for (const auto& name : model::nvfp4_weight_slots(*m))
      if (quantizable.count(name)) matrices.emplace(name, nvfp4::quantize(model::named_state(*m).at(name)));
    for (auto& [name, t] : model::named_state(*m))
      if (!matrices.count(name)) t.copy_(t.to(torch::kBFloat16).to(torch::kFloat));
  }
  ASSERT_EQ(matrices.size(), model::nvfp4_weights(*loaded).size());
  const auto linear = matrices.begin()->first;
  const auto slots = model::nvfp4_weight_slots(*m);
  std::string not_a_matrix;  // a norm's weight, say
  for (const auto& [name, t] : model::named_state(*m))
    if (std::find(slots.begin(), slots.end(), name) == slots.end()) not_a_matrix = name;
  ASSERT_FALSE(not_a_matrix.empty());
  auto tokens = random_tokens(2, 11, m->recipe().vocab_size, 8);
  torch::NoGradGuard no_grad;
  const auto dense = m->forward(tokens).logits;
  std::map<std::string, nvfp4::QTensor> bad = {{linear, matrices.at(linear)},
                                               {not_a_matrix, nvfp4::quantize(torch::ones({2, 16}))}};
  EXPECT_THROW(model::use_nvfp4_weights(*m, bad), Error);
  bad = {{linear, nvfp4::quantize(torch::ones({2, 16}))}};
  EXPECT_THROW(model::use_nvfp4_weights(*m, bad), Error);
  EXPECT_TRUE(model::nvfp4_weights(*m).empty());
  EXPECT_TRUE(torch::equal(m->forward(tokens).logits, dense)) << "a refused install changed the model";
  model::use_nvfp4_weights(*m, std::move(matrices));
  EXPECT_EQ(model::nvfp4_weights(*m), model::nvfp4_weights(*loaded));
  EXPECT_LT(rel_max_diff(m->forward(tokens).logits, loaded->forward(tokens).logits), 1e-6);
  for (const auto& p : m->parameters()) EXPECT_FALSE(p.requires_grad());
}

TEST(Nvfp4Model, ForwardAndCachedDecodeEqualTheDequantizedDenseModel) {
  single_threaded();
  Fp32Nvfp4Kernel exact;
  auto q = load(checkpoints().nvfp4);
  auto ref = dequantized_reference();
  auto full = load(checkpoints().dense);
  torch::NoGradGuard no_grad;
  const int64_t prompt = 11, total = 27;
  auto tokens = random_tokens(2, total, q->recipe().vocab_size, 7);

  auto lq = q->forward(tokens).logits, lr = ref->forward(tokens).logits;
  const double forward_diff = rel_max_diff(lq, lr);
  EXPECT_LT(forward_diff, 1e-5);
  // The kernel nvfp4::linear picks by default (BF16 activations where the CPU has AVX-512 BF16): x's rounding to
  // 8 significant bits (2^-9 relative) before every NVFP4 product, compounded over 12 random layers, moves the logits
  // by about 1% (relative L2; the max-abs measure above reads ~3%), a twentieth of what NVFP4's own rounding moves them
  // (the rel L2 delta printed below, ~0.2) and far below a wiring error's O(1).
  {
    nvfp4::set_cpu_kernel(nvfp4::CpuKernel::Auto);
    auto la = q->forward(tokens).logits;
    const double auto_l2 = ((la - lr).norm() / lr.norm()).item<double>();
    std::cout << "[nvfp4 " << nvfp4::cpu_kernel_name(nvfp4::CpuKernel::Auto) << " kernel vs dequantized reference] "
              << "rel L2 " << auto_l2 << ", max abs / max |logit| " << rel_max_diff(la, lr) << "\n";
    EXPECT_LT(auto_l2, 0.05);
    nvfp4::set_cpu_kernel(fp32_nvfp4_kernel());
  }

  auto sq = q->new_state(2, total), sr = ref->new_state(2, total);
  EXPECT_LT(rel_max_diff(q->prefill(tokens.narrow(1, 0, prompt), sq), ref->prefill(tokens.narrow(1, 0, prompt), sr)),
            1e-5);
  double worst = 0;
  for (int64_t t = prompt; t < total; ++t)
    worst = std::max(worst, rel_max_diff(q->decode(tokens.select(1, t), sq), ref->decode(tokens.select(1, t), sr)));
  EXPECT_LT(worst, 1e-5);

  // Against the unquantized model: random weights, so this measures the format's noise, not a trained model's
  // loss change (the < 1% loss goal is for trained checkpoints). Gross errors (a wrong scale, a swapped
  // nibble) move the logits by O(1) of their norm; NVFP4 rounding moves them by about a tenth.
  auto lf = full->forward(tokens).logits;
  const double rel_l2 = ((lq - lf).norm() / lf.norm()).item<double>();
  auto targets = tokens.narrow(1, 1, total - 1).reshape({-1});
  auto ce = [&](const torch::Tensor& l) {
    return torch::cross_entropy_loss(l.narrow(1, 0, total - 1).reshape({-1, l.size(-1)}), targets).item<double>();
  };
  const double loss_q = ce(lq), loss_f = ce(lf);
  std::cout << "[nvfp4 vs dequantized reference] forward " << forward_diff << ", decode " << worst
            << " (max abs diff / max |logit|)\n";
  std::cout << "[nvfp4 vs fp32, random tiny-hybrid] logits rel L2 delta " << rel_l2 << ", loss " << loss_f << " -> "
            << loss_q << " (rel " << std::abs(loss_q - loss_f) / loss_f << ")\n";
  EXPECT_GT(rel_l2, 1e-3);  // the weights really are quantized
  EXPECT_LT(rel_l2, 0.3);
  EXPECT_LT(std::abs(loss_q - loss_f) / loss_f, 0.05);
}

// On the GPU an NVFP4 model's decode steps run the routed experts by id on the device (nvfp4_gathered_experts), so
// they replay from a CUDA graph; the steps equal the model's full forward there (whose 120-token MoE calls take the
// per-expert loop), and that forward is the dequantized dense reference's up to BF16 activations (about 1%, as the
// CPU's BF16 kernel above).
TEST(Nvfp4Model, CudaGraphDecodeEqualsTheForward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!nvfp4::cuda_kernels_built()) GTEST_SKIP() << "built without SLM_CUDA";
  model::HybridLM m(checkpoints().recipe, torch::TensorOptions().device(torch::kCUDA));
  model::load_weights(m, checkpoints().nvfp4_head);
  m.eval();
  ASSERT_EQ(engine::graph_decode_blocker(m, m.new_state(1, 4)), "");
  torch::NoGradGuard no_grad;
  auto tokens = random_tokens(2, 60, m.recipe().vocab_size, 5);
  auto full = m.forward(tokens.cuda()).logits.cpu();
  auto ref = dequantized_reference(/*head=*/true)->forward(tokens).logits;
  EXPECT_LT(((full - ref).norm() / ref.norm()).item<double>(), 0.05);
  auto state = m.new_state(2, 64), eager = m.new_state(2, 64);
  m.prefill(tokens.narrow(1, 0, 12).cuda(), state);
  m.prefill(tokens.narrow(1, 0, 12).cuda(), eager);
  engine::GraphDecoder graph(m, state);
  double worst = 0;
  for (int64_t t = 12; t < 60; ++t) {
    auto step = graph.step(tokens.select(1, t).cuda()).cpu();
    ASSERT_LT(rel_max_diff(step, m.decode(tokens.select(1, t).cuda(), eager).cpu()), 1e-6) << "position " << t;
    // The forward's BF16 GEMMs round the same activations as the decode's GEMVs, but inputs that differ in the last
    // FP32 bits (other scan and attention kernels) can round to neighbouring BF16 values: L2, not bits.
    const auto ref_t = full.select(1, t);
    worst = std::max(worst, ((step - ref_t).norm() / ref_t.norm()).item<double>());
  }
  std::cout << "[nvfp4 cuda graph decode vs forward] worst rel L2 " << worst << "\n";
  EXPECT_LT(worst, 0.05);
}

TEST(Nvfp4Model, GenerateRunsTheNvfp4Checkpoint) {
  single_threaded();
  // The quantized checkpoint must generate what the dequantized dense reference generates (greedy).
  auto ref = dequantized_reference();
  const std::string ref_path = temp_file("reference.safetensors");
  model::save_weights(*ref, ref_path);
  const std::string q_cli = temp_file("nvfp4_cli.safetensors");
  CliResult qr = run_slm("quantize --recipe " + source_path("recipes/tiny-hybrid.json") + " --in " +
                         checkpoints().dense + " --out " + q_cli);
  ASSERT_EQ(qr.code, 0) << qr.out;
  auto generate = [&](const std::string& ckpt) {
    return run_slm("generate --recipe " + source_path("recipes/tiny-hybrid.json") + " --checkpoint " + ckpt +
                   " --prompt 'template <typename T>' --max-tokens 12 --temperature 0");
  };
  // Greedy equality needs the same arithmetic: the FP32-activation kernel in the child process too.
  setenv("SLM_NVFP4_CPU_KERNEL", nvfp4::cpu_kernel_name(fp32_nvfp4_kernel()), 1);
  CliResult g = generate(q_cli), r = generate(ref_path);
  unsetenv("SLM_NVFP4_CPU_KERNEL");
  ASSERT_EQ(g.code, 0) << g.out;
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(g.out.find("NVFP4 checkpoint: " + std::to_string(quantizable_names(checkpoints().recipe).size()) +
                       " weights run in NVFP4"),
            std::string::npos)
      << g.out;
  auto ids = [](const std::string& out) {  // the "generated N tokens: ..." line (the timings after it differ)
    const auto at = out.find("generated");
    return out.substr(at, out.find('\n', at) - at);
  };
  ASSERT_NE(g.out.find("generated"), std::string::npos) << g.out;
  EXPECT_EQ(ids(g.out), ids(r.out));
}

// `slm quantize --quantize-head`: the LM head runs in NVFP4 as well, and the logits equal the dense model's with the
// head dequantized too.
TEST(Nvfp4Model, TheLmHeadCanRunInNvfp4) {
  single_threaded();
  Fp32Nvfp4Kernel exact;
  auto q = load(checkpoints().nvfp4_head);
  const auto used = model::nvfp4_weights(*q);
  const auto want = quantizable_names(q->recipe(), /*head=*/true);
  EXPECT_EQ(std::set<std::string>(used.begin(), used.end()), want);
  EXPECT_TRUE(want.count("lm_head.weight"));
  EXPECT_EQ(model::named_state(*q).at("lm_head.weight").numel(), 0);
  auto ref = dequantized_reference(/*head=*/true);
  auto base = load(checkpoints().nvfp4);  // head in BF16
  expect_equal_to_reference(*q, *ref, *base, 9);
}

// `slm quantize --quantize-embedding`: the file stores the token embedding in NVFP4; the model gathers from its
// dequantized copy, so the logits equal the dense model's with the embedding dequantized too.
TEST(Nvfp4Model, TheTokenEmbeddingCanBeStoredInNvfp4) {
  single_threaded();
  Fp32Nvfp4Kernel exact;
  const auto file = nvfp4::load_checkpoint(checkpoints().nvfp4_all);
  EXPECT_TRUE(file.quantized.count("embed.weight"));
  EXPECT_FALSE(file.dense.count("embed.weight"));
  auto q = load(checkpoints().nvfp4_all);
  auto ref = dequantized_reference(/*head=*/true, /*embedding=*/true);
  auto head_only = load(checkpoints().nvfp4_head);  // the embedding dense
  expect_equal_to_reference(*q, *ref, *head_only, 13);
}

TEST(Nvfp4Model, TruncatedCheckpointIsRefusedNamingTheTensor) {
  single_threaded();
  const std::string& src = checkpoints().nvfp4;
  auto header = safetensors::read_header(src);
  const std::string last = header.tensors.back().name;  // offset order: the one the cut lands in
  std::ifstream in(src, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string path = temp_file("truncated.safetensors");
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 1));
  expect_load_error(path, "tensor " + last + ": data_offsets");
  expect_load_error(path, "truncated");
}

TEST(Nvfp4Model, WrongScaleCountIsRefusedNamingTheTensor) {
  single_threaded();
  auto file = safetensors::load(checkpoints().nvfp4);
  const std::string name = "layers.0.attn.wq.weight.nvfp4.scales";
  ASSERT_TRUE(file.tensors.count(name));
  auto& scales = file.tensors.at(name);
  scales = scales.narrow(-1, 0, scales.size(-1) - 1).contiguous();
  const std::string path = temp_file("scales.safetensors");
  safetensors::save(path, file.tensors, file.metadata);
  expect_load_error(path, "block scales " + name + " has shape [128, 7], expected [128, 8]");
}

TEST(Nvfp4Model, ShapeMismatchForTheRecipeIsRefusedNamingTheTensor) {
  single_threaded();
  nvfp4::Checkpoint c = nvfp4::load_checkpoint(checkpoints().nvfp4);
  // A self-consistent NVFP4 tensor whose logical shape is not the recipe's ([8, 256, 128]).
  const std::string experts = "layers.1.moe.experts.w13";
  ASSERT_TRUE(c.quantized.count(experts));
  c.quantized[experts] = nvfp4::quantize(torch::randn({8, 256, 112}));
  const std::string path = temp_file("shape.safetensors");
  nvfp4::save_checkpoint(path, c);
  expect_load_error(path, "NVFP4 tensor " + experts + " has shape [8, 256, 112], the model needs [8, 256, 128]");

  // A tensor the model runs dense (the router) cannot come in NVFP4.
  c = nvfp4::load_checkpoint(checkpoints().nvfp4);
  const std::string router = "layers.1.moe.router.weight";
  ASSERT_TRUE(c.dense.count(router));
  c.quantized[router] = nvfp4::quantize(c.dense.at(router));
  c.dense.erase(router);
  nvfp4::save_checkpoint(path, c);
  expect_load_error(path, "tensor " + router + " is stored in NVFP4, but the model runs it dense");
}

// The packed size by hand: per row of K inputs, K/2 bytes of codes and K/16 E4M3 block scales (K padded to 16), plus
// one FP32 tensor scale per matrix (each expert is a matrix); everything else at FP32.
TEST(Nvfp4Model, WeightMemoryCountsThePackedMatricesAndTheDenseRest) {
  single_threaded();
  auto m = load(checkpoints().nvfp4);
  auto dense = load(checkpoints().dense);
  const auto quantizable = quantizable_names(m->recipe());
  int64_t packed = 0, rest = 0;
  for (const auto& [name, t] : model::named_state(*dense)) {
    if (!quantizable.count(name)) {
      rest += t.numel() * 4;
      continue;
    }
    const int64_t k = t.size(-1), rows = t.numel() / k, matrices = t.dim() == 3 ? t.size(0) : 1;
    packed += rows * ((k + 15) / 16) * (8 + 1) + 4 * matrices;
  }
  const auto memory = model::weight_memory(*m);
  EXPECT_EQ(memory.nvfp4_bytes, packed);
  EXPECT_EQ(memory.dense_bytes, rest);
  EXPECT_EQ(memory.devices, std::set<std::string>{"cpu"});
  EXPECT_EQ(model::weight_memory(*dense).nvfp4_bytes, 0);
  EXPECT_EQ(
      model::weight_memory(*dense).dense_bytes, rest + [&] {
        int64_t q = 0;
        for (const auto& [name, t] : model::named_state(*dense))
          if (quantizable.count(name)) q += t.numel() * 4;
        return q;
      }());
}
