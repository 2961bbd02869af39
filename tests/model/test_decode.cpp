// Inference: prefill (all logits or the last) + token-by-token decode reproduce the full forward; rollback; capacity;
// MTP drafts.
#include <c10/cuda/CUDAFunctions.h>  // the sync debug mode; in the CUDA-enabled libtorch both builds link

#include "model_test_util.h"
#include "slm/quant/nvfp4_linear.h"

using namespace slm;
using namespace slm::test;

namespace {

std::unique_ptr<model::HybridLM> random_tiny(uint64_t seed) {
  auto m = std::make_unique<model::HybridLM>(tiny_ae());
  randomize(*m, seed);
  m->eval();
  return m;
}

}  // namespace

TEST(Decode, TokenByTokenMatchesFullForwardAfterPrefill) {
  single_threaded();
  auto m = random_tiny(21);
  torch::NoGradGuard no_grad;
  const int64_t prompt = 13, steps = 67, total = prompt + steps;  // well past the 16-token window of layer 0
  auto tokens = random_tokens(2, total, 384, 9);
  auto full = m->forward(tokens).logits;
  auto state = m->new_state(2, total);
  auto pre = m->prefill(tokens.narrow(1, 0, prompt), state);
  EXPECT_LT(max_abs_diff(pre, full.narrow(1, 0, prompt)), 1e-4);
  double worst = 0;
  for (int64_t t = prompt; t < total; ++t) {
    auto logits = m->decode(tokens.select(1, t), state);
    worst = std::max(worst, max_abs_diff(logits, full.select(1, t)));
  }
  EXPECT_LE(worst, 1e-4);
  EXPECT_EQ(state.length, total);
}

TEST(Decode, ChunkedPrefillMatchesFullForward) {
  single_threaded();
  auto m = random_tiny(22);
  torch::NoGradGuard no_grad;
  auto tokens = random_tokens(1, 70, 384, 10);
  auto full = m->forward(tokens).logits;
  auto state = m->new_state(1, 70);
  int64_t at = 0;
  for (int64_t chunk : {5, 1, 20, 3, 41}) {
    auto logits = m->prefill(tokens.narrow(1, at, chunk), state);
    EXPECT_LT(max_abs_diff(logits, full.narrow(1, at, chunk)), 1e-4) << "chunk at " << at;
    at += chunk;
  }
}

// prefill_last: the last token's logits of the same forward, the same state afterwards (the next decode agrees).
TEST(Decode, PrefillLastReturnsTheLastTokensLogitsAndTheSameState) {
  single_threaded();
  auto m = random_tiny(23);
  torch::NoGradGuard no_grad;
  auto tokens = random_tokens(2, 30, 384, 11);
  auto full = m->forward(tokens).logits;
  auto a = m->new_state(2, 30), b = m->new_state(2, 30);
  auto all = m->prefill(tokens.narrow(1, 0, 29), a);
  auto last = m->prefill_last(tokens.narrow(1, 0, 29), b);
  ASSERT_EQ(last.sizes(), (std::vector<int64_t>{2, m->recipe().vocab_size}));
  EXPECT_LT(max_abs_diff(last, full.select(1, 28)), 1e-4);
  EXPECT_LT(max_abs_diff(last, all.select(1, 28)), 1e-5);
  EXPECT_EQ(b.length, 29);
  EXPECT_LT(max_abs_diff(m->decode(tokens.select(1, 29), b), full.select(1, 29)), 1e-4);
  EXPECT_THROW(m->prefill_last(torch::zeros({2, 0}, torch::kLong), b), Error);
}

TEST(Decode, RollbackDropsTokensInPlace) {
  single_threaded();
  auto m = random_tiny(23);
  torch::NoGradGuard no_grad;
  auto prefix = random_tokens(1, 20, 384, 11);
  auto branch_a = random_tokens(1, 6, 384, 12), branch_b = random_tokens(1, 6, 384, 13);
  auto state = m->new_state(1, 40, /*max_rollback=*/6);
  const void* storage = state.tokens.data_ptr();
  m->prefill(prefix, state);
  for (int64_t i = 0; i < 6; ++i) m->decode(branch_a.select(1, i), state);
  state.rollback(6);
  EXPECT_EQ(state.length, 20);
  auto expected = m->forward(torch::cat({prefix, branch_b}, 1)).logits;
  for (int64_t i = 0; i < 6; ++i) {
    auto logits = m->decode(branch_b.select(1, i), state);
    EXPECT_LE(max_abs_diff(logits, expected.select(1, 20 + i)), 1e-4) << i;
  }
  // Partial rollback followed by a multi-token prefill (what a speculative verifier does).
  state.rollback(2);
  auto verify = m->prefill(branch_a.narrow(1, 0, 3), state);
  auto expected2 = m->forward(torch::cat({prefix, branch_b.narrow(1, 0, 4), branch_a.narrow(1, 0, 3)}, 1)).logits;
  EXPECT_LE(max_abs_diff(verify, expected2.narrow(1, 24, 3)), 1e-4);
  EXPECT_EQ(state.tokens.data_ptr(), storage);
  EXPECT_THROW(state.rollback(7), Error);  // beyond max_rollback
  EXPECT_THROW(state.rollback(-1), Error);
  auto fresh = m->new_state(1, 8, 6);
  m->prefill(prefix.narrow(1, 0, 3), fresh);
  EXPECT_THROW(fresh.rollback(4), Error);  // beyond what it holds
}

TEST(Decode, CapacityAndShapesAreChecked) {
  single_threaded();
  auto m = random_tiny(24);
  auto state = m->new_state(1, 8);
  m->prefill(random_tokens(1, 6, 384, 14), state);
  EXPECT_THROW(m->prefill(random_tokens(1, 3, 384, 15), state), Error);
  EXPECT_EQ(state.length, 6);  // a refused call changes nothing
  EXPECT_THROW(m->decode(random_tokens(2, 1, 384, 16).squeeze(1), state), Error);
  EXPECT_THROW(m->decode(random_tokens(1, 2, 384, 17), state), Error);
}

// The memory a state keeps, counted by hand for tiny-ae (d 128, pattern AE x 6, 2 KV heads of 32, one MTP module):
// three attention layers with keys and values [B, 2, capacity, 32], the token history [B, capacity] int64, the
// hidden history [B, capacity, 128] for MTP, and the positions [B] int64 that the attention caches share, once.
TEST(Decode, StateBytesCountEveryBufferOnce) {
  auto m = random_tiny(25);
  auto state = m->new_state(2, 10);
  const int64_t kv = 3 * 2 * (2 * 2 * 10 * 32) * 4, tokens = 2 * 10 * 8, hidden = 2 * 10 * 128 * 4, positions = 2 * 8;
  EXPECT_EQ(state.bytes(), kv + tokens + hidden + positions);
  // A view of rows keeps the whole buffers alive; two states together count what each holds.
  EXPECT_EQ(state.view_rows(1, 1).bytes(), state.bytes());
  auto other = m->new_state(1, 4);
  std::vector<torch::Tensor> both;
  state.collect_tensors(both);
  other.collect_tensors(both);
  state.view_rows(0, 1).collect_tensors(both);
  EXPECT_EQ(model::distinct_storage_bytes(both), state.bytes() + other.bytes());
}

TEST(Decode, MtpDraftsMatchTheTrainingPathAndLeaveTheStateAlone) {
  single_threaded();
  auto j = micro_ae_json();  // two MTP modules
  model::HybridLM m(parse(j));
  randomize(m, 25);
  m.eval();
  torch::NoGradGuard no_grad;
  const int64_t n = 9;
  auto tokens = random_tokens(2, n + 1, 13, 18);  // t_0..t_n; the state holds t_0..t_{n-1}
  auto state = m.new_state(2, 16, 2);
  m.prefill(tokens.narrow(1, 0, n), state);
  auto drafts = m.draft(state, tokens.select(1, n));
  ASSERT_EQ(drafts.sizes(), (std::vector<int64_t>{2, 2}));
  // Module 1 at position n-1 on the full sequence predicts t_{n+1}.
  auto l1 = m.mtp_logits(tokens, m.forward(tokens).hidden)[0];
  EXPECT_TRUE(torch::equal(drafts.select(1, 0), l1.select(1, n - 1).argmax(-1)));
  // Module 2 at position n-1, given t_{n+1} = the first draft, predicts t_{n+2}.
  auto extended = torch::cat({tokens, drafts.narrow(1, 0, 1)}, 1);
  auto l2 = m.mtp_logits(extended, m.forward(extended).hidden)[1];
  EXPECT_TRUE(torch::equal(drafts.select(1, 1), l2.select(1, n - 1).argmax(-1)));
  // The state is untouched: decoding t_n still matches the full forward.
  EXPECT_EQ(state.length, n);
  auto logits = m.decode(tokens.select(1, n), state);
  EXPECT_LE(max_abs_diff(logits, m.forward(tokens).logits.select(1, n)), 1e-4);
}

namespace {

// The drafts of the training path over the whole sequence: module 1 at the last position of tokens [1, T]
// predicts d1, module 2 there (with d1 appended) d2, and so on. What draft() computed before it had a cache.
std::vector<int64_t> full_history_drafts(model::HybridLM& m, torch::Tensor tokens) {
  std::vector<int64_t> out;
  const int64_t t = tokens.size(1);  // the last token is the draft's next_token, position t-2 predicts t_t
  for (size_t k = 0; k < m.mtp_modules().size(); ++k) {
    auto logits = m.mtp_logits(tokens, m.forward(tokens).hidden)[k];
    out.push_back(logits[0][t - 2].argmax().item<int64_t>());
    tokens = torch::cat({tokens, torch::tensor({{out.back()}}, torch::kLong)}, 1);
  }
  return out;
}

std::vector<int64_t> ids(const torch::Tensor& row) {
  auto c = row.reshape({-1}).cpu();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

// The MTP cache: drafts after decode steps, multi-token verifies and rollbacks (what a speculative decoder does)
// equal the drafts recomputed over the whole history; so does a state whose MTP cache copy_row dropped.
TEST(Decode, IncrementalDraftsEqualFullHistoryDrafts) {
  single_threaded();
  auto m = random_model(spec_hybrid_json(), 31, torch::kDouble);
  torch::NoGradGuard no_grad;
  auto seq = random_tokens(1, 60, 29, 32);
  auto state = m->new_state(1, 64, /*max_rollback=*/2);
  int64_t at = 9;
  m->prefill(seq.narrow(1, 0, at), state);
  // Each round: draft after t_at, then advance by a decode (1 token) or a verify of 2-3 tokens rolled back by 0-2.
  for (int round = 0; at + 4 < seq.size(1); ++round) {
    auto drafts = m->draft(state, seq.select(1, at));
    EXPECT_EQ(ids(drafts), full_history_drafts(*m, seq.narrow(1, 0, at + 1))) << "round " << round;
    if (round % 3 == 0) {
      m->decode(seq.select(1, at), state);
      at += 1;
    } else {
      const int64_t verify = 2 + round % 2, keep = 1 + round % verify;
      m->prefill(seq.narrow(1, at, verify), state);
      state.rollback(verify - keep);
      at += keep;
    }
    ASSERT_EQ(state.length, at);
  }
  auto copy = m->new_state(1, 64, 2);
  m->prefill(seq.narrow(1, 0, 3), copy);
  m->draft(copy, seq.select(1, 3));
  ASSERT_EQ(copy.mtp.size(), 2u);
  copy.copy_row(state, 0, 0, at);  // the rows' histories change under the MTP cache: it goes
  EXPECT_TRUE(copy.mtp.empty());
}

// Rollback over rejected tokens leaves every cache kind (attention, Mamba-3, M2RNN, Engram, the MTP caches) as if
// they had never been seen: the next logits and drafts equal those of a state that never saw them.
TEST(Decode, RollbackEqualsAStateThatNeverSawTheRejectedTokens) {
  single_threaded();
  auto m = random_model(spec_hybrid_json(), 33, torch::kDouble);
  torch::NoGradGuard no_grad;
  auto prompt = random_tokens(1, 15, 29, 34);
  auto good = random_tokens(1, 4, 29, 35), bad = random_tokens(1, 2, 29, 36);
  auto spec = m->new_state(1, 40, 2), clean = m->new_state(1, 40, 2);
  m->prefill(prompt, spec);
  m->prefill(prompt, clean);
  for (int64_t i = 0; i < 2; ++i) {
    // A round keeps good[i] and rejects the two drafts after it.
    m->draft(spec, good.select(1, i));
    m->prefill(torch::cat({good.narrow(1, i, 1), bad}, 1), spec);
    spec.rollback(2);
    m->decode(good.select(1, i), clean);
  }
  EXPECT_EQ(spec.length, clean.length);
  EXPECT_EQ(ids(m->draft(spec, good.select(1, 2))), ids(m->draft(clean, good.select(1, 2))));
  auto a = m->prefill(good.narrow(1, 2, 2), spec), b = m->prefill(good.narrow(1, 2, 2), clean);
  EXPECT_LE(max_abs_diff(a, b), 1e-9);
  EXPECT_LE(max_abs_diff(a, m->forward(torch::cat({prompt, good}, 1)).logits.narrow(1, 17, 2)), 1e-9);
}

TEST(Decode, DraftNeedsMtpModules) {
  single_threaded();
  auto j = micro_ae_json();
  j.erase("mtp");
  model::HybridLM m(parse(j));
  auto state = m.new_state(1, 4);
  m.prefill(random_tokens(1, 2, 13, 19), state);
  EXPECT_THROW(m.draft(state, torch::zeros({1}, torch::kLong)), Error);
}

// The decode path of attention (rotary tables, a binding window) and MoE (gathered experts) on the GPU: with the sync
// debug mode at "error", any read back to the host inside a step (a .cpu(), an .item(), a bincount) throws.
// Compiled in every build, run where there is a GPU and the CUDA kernels (an SLM_CUDA=OFF build falls back to ATen
// ops on the GPU, which may read back).
TEST(Decode, CudaDecodeStepsReadNothingBackToTheHost) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!nvfp4::cuda_kernels_built()) GTEST_SKIP() << "built without SLM_CUDA";
  model::HybridLM m(tiny_ae(), torch::TensorOptions().device(torch::kCUDA));
  randomize(m, 26);
  m.eval();
  torch::NoGradGuard no_grad;
  const int64_t prompt = 32, total = 40;  // past layer 0's 16-token window
  auto tokens = random_tokens(1, total, 384, 20).cuda();
  auto full = m.forward(tokens).logits;
  auto state = m.new_state(1, total);
  m.prefill(tokens.narrow(1, 0, prompt), state);
  std::vector<torch::Tensor> steps;
  torch::cuda::synchronize();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  EXPECT_NO_THROW({
    for (int64_t t = prompt; t < total; ++t) steps.push_back(m.decode(tokens.select(1, t), state));
  });
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  ASSERT_EQ(static_cast<int64_t>(steps.size()), total - prompt);
  for (int64_t t = prompt; t < total; ++t)
    EXPECT_LE(max_abs_diff(steps[t - prompt].cpu(), full.select(1, t).cpu()), 1e-3) << t;
}

// The decode step's cache write goes where each row's device position says, and nowhere else.
TEST(Decode, WriteStepWritesEachRowAtItsPosition) {
  model::TokenCache cache(8, 0);
  cache.add_stream(torch::zeros({2, 3, 8, 4}), 2);
  cache.set_positions(torch::tensor({2, 5}, torch::kLong));
  auto x = torch::arange(1, 25, torch::kFloat).view({2, 3, 1, 4});
  auto all = cache.write_step(0, x);
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{2, 3, 8, 4}));
  auto expected = torch::zeros({2, 3, 8, 4});
  expected.select(0, 0).select(1, 2).copy_(x.select(0, 0).select(1, 0));
  expected.select(0, 1).select(1, 5).copy_(x.select(0, 1).select(1, 0));
  EXPECT_TRUE(torch::equal(all, expected));
  EXPECT_THROW(cache.write_step(0, torch::zeros({2, 3, 2, 4})), Error);
}
