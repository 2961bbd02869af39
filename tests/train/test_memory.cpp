// What training holds in memory and the out-of-memory message: the exact parts against a live model and optimizer,
// the estimate's scaling, the advice against hand-computed numbers, and a trainer step that cannot allocate.
#include <c10/util/Exception.h>

#include <new>
#include <sstream>

#include "model/model_test_util.h"
#include "slm/recipe/accounting.h"
#include "slm/train/memory.h"
#include "slm/train/optimizer.h"
#include "slm/util/format.h"
#include "train/train_test_util.h"

namespace slm::test {
namespace {

double tensor_bytes(const torch::Tensor& t) {
  return static_cast<double>(t.numel() * t.element_size());
}

// The line of text that starts with `start` ("" when there is none).
std::string line_starting(const std::string& text, const std::string& start) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(start, 0) == 0) return line;
  return "";
}

TEST(TrainingMemory, ParametersAndOptimizerStateAreWhatALiveStepHolds) {
  single_threaded();
  for (const auto& json : {micro_hybrid_json(), micro_ae_json()}) {
    const Recipe r = parse(json);
    model::HybridLM m(r, torch::TensorOptions().dtype(torch::kFloat));
    train::Optimizer opt(m, train::OptimizerConfig{});
    auto tokens = random_tokens(2, 9, r.vocab_size, 1);
    m.loss(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8)).total.backward();
    opt.step(1.0);
    double params = 0, grads = 0, state = 0;
    for (const auto& p : m.parameters()) {
      params += tensor_bytes(p);
      if (p.grad().defined()) grads += tensor_bytes(p.grad());
    }
    for (const auto& [_, t] : opt.state_tensors()) state += tensor_bytes(t);

    const auto mem = train::training_memory(r, 2, 8, /*bf16=*/false);
    EXPECT_EQ(mem.parameters, params) << r.name;
    EXPECT_EQ(mem.gradients, grads) << r.name << ": every parameter trains";
    EXPECT_EQ(mem.optimizer, state) << r.name;
  }
}

TEST(TrainingMemory, ActivationsScaleWithTokensAndHalveUnderBf16) {
  const Recipe r = parse(micro_hybrid_json());
  const double a = train::training_memory(r, 2, 16, false).activations;
  EXPECT_GT(a, 0);
  EXPECT_EQ(train::training_memory(r, 4, 16, false).activations, 2 * a);
  EXPECT_EQ(train::training_memory(r, 2, 48, false).activations, 3 * a);
  EXPECT_EQ(train::training_memory(r, 2, 16, true).activations, a / 2);
  // At least the LM head's logits (vocab per token, twice for the loss) in float32.
  EXPECT_GE(a, 2.0 * 16 * (2.0 * r.vocab_size) * 4);
}

TEST(OutOfMemoryMessage, SuggestsTheBatchThatFitsTheCapacity) {
  train::TrainingMemory m;
  m.parameters = 100;
  m.gradients = 100;
  m.optimizer = 200;
  m.activations = 8000;  // 1000 bytes per sequence at batch 8
  train::OutOfMemoryContext c;
  c.where = "at step 3 on cpu";
  c.recipe_file = "recipes/x.json";
  c.batch = 8;
  c.seq_len = 64;
  c.accum = 1;
  c.capacity = 5000;  // 90% usable: 4500 - 400 fixed = 4100, 4 sequences
  c.allocator = "CUDA out of memory. Tried to allocate 2.00 GiB";
  std::string msg = train::out_of_memory_message(m, c);
  for (const char* part :
       {"out of memory at step 3 on cpu training recipes/x.json (micro-batch 8 x 64 tokens", "parameters", "gradients",
        "optimizer state", "activations", "the allocator: CUDA out of memory. Tried to allocate 2.00 GiB",
        "--batch 4 --accum 2", "--recompute", "--seq-len", "smaller recipe"})
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in\n" << msg;
  EXPECT_NE(line_starting(msg, "  activations").find("  ~7.81 KiB  estimated"), std::string::npos) << msg;
  EXPECT_NE(line_starting(msg, "  total").find("  ~8.20 KiB  of the device's 4.88 KiB"), std::string::npos) << msg;

  c.workers = 2;  // --batch is the global batch: twice the per-device batch
  EXPECT_NE(train::out_of_memory_message(m, c).find("--batch 8 --accum 2"), std::string::npos);

  c.workers = 1;
  c.capacity = 400;  // the weights and the optimizer alone do not fit
  msg = train::out_of_memory_message(m, c);
  EXPECT_NE(msg.find("alone need 400 B of the device's 400 B: train a smaller recipe"), std::string::npos) << msg;

  c.capacity = 1200;  // 1080 - 400 = 680 < one sequence
  msg = train::out_of_memory_message(m, c);
  EXPECT_NE(msg.find("Even one sequence of 64 tokens does not fit: turn on --recompute"), std::string::npos) << msg;
  c.recompute = true;  // already on: not suggested again
  msg = train::out_of_memory_message(m, c);
  EXPECT_NE(msg.find("Even one sequence of 64 tokens does not fit: lower --seq-len"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("--recompute"), std::string::npos) << msg;
  c.recompute = false;

  c.capacity = 0;  // unknown: halve the batch
  EXPECT_NE(train::out_of_memory_message(m, c).find("--batch 4 --accum 2"), std::string::npos);
}

TEST(OutOfMemory, RecognisesAllocationFailuresOnly) {
  auto caught = [](auto&& f) -> bool {
    try {
      f();
    } catch (const std::exception& e) {
      return train::is_out_of_memory(e);
    }
    ADD_FAILURE() << "nothing was thrown";
    return false;
  };
  EXPECT_TRUE(caught([] { TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory"); }));
  EXPECT_TRUE(caught([] { throw std::bad_alloc(); }));
  // libtorch's CPU allocator, asked for more than any address space (2^60 bytes).
  EXPECT_TRUE(caught([] { torch::empty({int64_t{1} << 57}, torch::kLong); }));
  EXPECT_FALSE(caught([] { TORCH_CHECK(false, "shape mismatch"); }));
  EXPECT_FALSE(caught([] { throw Error("bad recipe"); }));
}

// A real step that cannot allocate: a batch whose token tensor alone (2^52 x 17 int64) exceeds any address space.
TEST(OutOfMemory, ATrainingStepThatDoesNotFitSaysWhatAndHowToFix) {
  single_threaded();
  const std::string dir = fresh_dir("oom");
  ::mkdir((dir + "/shards").c_str(), 0755);
  write_counting_shards(dir + "/shards", "count", 48, 16, 3);
  const std::string recipe = write_recipe(dir, micro_hybrid_json());
  auto c = micro_config(recipe, dir + "/shards", dir + "/run");
  c.batch = int64_t{1} << 52;
  c.seq_len = 16;
  std::ostringstream log;
  train::Trainer t(c, log);
  std::string msg;
  try {
    t.run();
    FAIL() << "the step allocated 2^52 sequences";
  } catch (const Error& e) {
    msg = e.what();
  }
  double params = 0;
  for (const auto& p : model::HybridLM(parse(micro_hybrid_json())).parameters())
    params += static_cast<double>(p.numel()) * 4;
  const std::vector<std::string> parts = {"out of memory at step 1 on cpu training " + recipe,
                                          "micro-batch 4503599627370496 x 16 tokens",
                                          "optimizer state",
                                          "activations",
                                          "DefaultCPUAllocator: can't allocate memory",
                                          "--batch",
                                          "--accum",
                                          "--seq-len"};
  for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in\n" << msg;
  EXPECT_NE(line_starting(msg, "  parameters").find(human_bytes(params) + "  FP32 master weights"), std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("frame #"), std::string::npos) << "no C++ backtrace in the message:\n" << msg;
}

}  // namespace
}  // namespace slm::test
