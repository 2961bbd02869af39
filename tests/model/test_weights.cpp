// Weights files: a saved model reloads bit-exactly; every kind of mismatch is refused and leaves the model as it was.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "model_test_util.h"
#include "slm/model/weights.h"

using namespace slm;
using namespace slm::test;

namespace {

std::string temp_file(const std::string& name) {
  return testing::TempDir() + "/" + name;
}

void expect_load_error(model::HybridLM& m, const std::string& path, const std::string& fragment) {
  auto before = m.forward(random_tokens(1, 8, m.recipe().vocab_size, 3)).logits;
  try {
    model::load_weights(m, path);
    ADD_FAILURE() << "expected an error containing: " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  auto after = m.forward(random_tokens(1, 8, m.recipe().vocab_size, 3)).logits;
  EXPECT_TRUE(torch::equal(before, after)) << "a refused load changed the model";
}

}  // namespace

TEST(Weights, SaveThenLoadReproducesTheModelExactly) {
  single_threaded();
  model::HybridLM a(tiny_ae());
  randomize(a, 11);
  const std::string path = temp_file("weights_roundtrip.safetensors");
  model::save_weights(a, path);
  model::HybridLM b(tiny_ae());
  randomize(b, 12);
  auto tokens = random_tokens(2, 12, a.recipe().vocab_size, 5);
  ASSERT_FALSE(torch::equal(a.forward(tokens).logits, b.forward(tokens).logits));
  model::load_weights(b, path);
  EXPECT_TRUE(torch::equal(a.forward(tokens).logits, b.forward(tokens).logits));
  auto meta = safetensors::read_header(path).metadata;
  EXPECT_EQ(meta.at("format"), "slm-weights");
  EXPECT_EQ(meta.at("recipe"), a.recipe().name);
  // The MoE balancing biases travel with the weights.
  auto state = model::named_state(b);
  bool has_bias = false;
  for (const auto& [name, t] : state) has_bias |= name.find("moe.expert_bias") != std::string::npos;
  EXPECT_TRUE(has_bias);
}

TEST(Weights, MissingWrongShapedAndUnknownTensorsAreRefused) {
  single_threaded();
  model::HybridLM m(tiny_ae());
  randomize(m, 1);
  auto state = model::named_state(m);

  auto missing = state;
  missing.erase("lm_head.weight");
  safetensors::save(temp_file("w_missing.safetensors"), missing);
  expect_load_error(m, temp_file("w_missing.safetensors"), "tensor lm_head.weight is missing");

  auto reshaped = state;
  reshaped["final_norm.weight"] = torch::ones({3});
  safetensors::save(temp_file("w_shape.safetensors"), reshaped);
  expect_load_error(m, temp_file("w_shape.safetensors"), "tensor final_norm.weight has shape [3]");

  auto extra = state;
  extra["layers.99.attn.wq.weight"] = torch::ones({2, 2});
  safetensors::save(temp_file("w_extra.safetensors"), extra);
  expect_load_error(m, temp_file("w_extra.safetensors"), "tensor layers.99.attn.wq.weight is not part of the model");

  expect_load_error(m, temp_file("does_not_exist.safetensors"), "does_not_exist.safetensors");
}

TEST(Weights, GenerateUsesTheCheckpoint) {
  single_threaded();
  model::HybridLM m(tiny_ae());
  randomize(m, 21);
  const std::string dir = temp_file("ckpt_dir");
  std::filesystem::create_directories(dir);
  model::save_weights(m, dir + "/model.safetensors");
  auto run = [&](const std::string& extra) {
    std::string err = temp_file("gen_err.txt");
    std::string cmd = "OMP_NUM_THREADS=1 " + std::string(SLM_BINARY) + " generate --recipe " +
                      source_path("recipes/tiny-ae.json") + " --prompt 'int main(' --max-tokens 8 --seed 1 " + extra +
                      " 2>" + err + " >/dev/null";
    int status = std::system(cmd.c_str());
    std::ifstream in(err);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, text);
  };
  auto [code, err] = run("--checkpoint " + dir);
  EXPECT_EQ(code, 0) << err;
  EXPECT_EQ(err.find("RANDOM"), std::string::npos) << err;
  auto [code_random, err_random] = run("");
  EXPECT_NE(err_random.find("RANDOM"), std::string::npos);
  // The trained (here: randomized) weights change what is generated.
  auto ids = [](const std::string& e) {  // the "generated N tokens: ..." line (the timings after it always differ)
    const auto at = e.find("generated");
    return e.substr(at, e.find('\n', at) - at);
  };
  EXPECT_NE(ids(err), ids(err_random));
  auto [code_bad, err_bad] = run("--checkpoint " + temp_file("nope.safetensors"));
  EXPECT_EQ(code_bad, 2);
  EXPECT_NE(err_bad.find("nope.safetensors"), std::string::npos) << err_bad;
}
