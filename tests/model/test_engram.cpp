// Engram: hashing against a per-position int64 loop, the layer forward against a float64 per-position reference,
// the canonical token map, causality and decode == prefill with Engram on, host-resident tables, and the
// per-domain table files.
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <set>

#include "model_test_util.h"
#include "slm/data/engram_canonical.h"
#include "slm/data/tokenizer.h"
#include "slm/io/safetensors.h"
#include "slm/model/weights.h"
#include "slm/recipe/accounting.h"

using namespace slm;
using namespace slm::test;

namespace {

// micro_ae with Engram on both A layers (orders 2 and 3, two heads each, conv kernel 2 with dilation 3).
nlohmann::json engram_json() {
  auto j = micro_ae_json();
  j["engram"] = {{"enabled", true}, {"layers", {0, 2}}, {"orders", "2,3"}, {"heads_per_order", 2},
                 {"table_rows", 5}, {"embed_dim", 3},   {"conv_kernel", 2}};
  return j;
}

std::unique_ptr<model::HybridLM> random_engram_model(uint64_t seed, const nlohmann::json& j = engram_json()) {
  auto m = std::make_unique<model::HybridLM>(parse(j));
  randomize(*m, seed);
  m->eval();
  return m;
}

std::string temp_path(const std::string& tag) {
  return testing::TempDir() + "/engram_" + tag + "_" + std::to_string(getpid()) + ".safetensors";
}

// Row of (order o, head j) at position t by the definition: XOR over k < o of x_{t-k}·m_k (x = vocab before the
// start, or the window's ids), modulo that table's prime, plus the sizes of the tables before it.
int64_t naive_row(const model::EngramImpl& e, const std::vector<int64_t>& seq, int64_t t, size_t group) {
  const auto m = e.multipliers.cpu(), p = e.primes.cpu();
  const int order = e.orders.at(group / e.heads);
  int64_t mix = 0;
  for (int k = 0; k < order; ++k) {
    const int64_t x = t - k >= 0 ? seq[t - k] : e.vocab;
    mix ^= x * m[k].item<int64_t>();
  }
  int64_t offset = 0;
  for (size_t g = 0; g < group; ++g) offset += p[g].item<int64_t>();
  return mix % p[group].item<int64_t>() + offset;
}

std::vector<int64_t> row_of(const torch::Tensor& ids, int64_t b) {
  auto c = ids.select(0, b).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

TEST(Engram, TablesTakeDistinctPrimesAndOddBoundedMultipliers) {
  single_threaded();
  Recipe r = parse(engram_json());
  model::HybridLM m(r);
  std::set<int64_t> seen;
  for (int l : {0, 2}) {
    const auto& e = m.engram_layers()[l];
    ASSERT_FALSE(e.is_empty());
    auto p = e->primes.cpu();
    ASSERT_EQ(p.numel(), 4);
    for (int64_t i = 0; i < p.numel(); ++i) {
      const int64_t v = p[i].item<int64_t>();
      EXPECT_GE(v, 5);
      for (int64_t d = 2; d * d <= v; ++d) EXPECT_NE(v % d, 0) << v << " is not prime";
      EXPECT_TRUE(seen.insert(v).second) << "prime " << v << " used twice";
    }
    EXPECT_EQ(e->table.size(0), p.sum().item<int64_t>());
    auto mult = e->multipliers.cpu();
    ASSERT_EQ(mult.numel(), 3);  // max order
    for (int64_t k = 0; k < 3; ++k) {
      const int64_t v = mult[k].item<int64_t>();
      EXPECT_EQ(v % 2, 1);
      EXPECT_LE(v, std::numeric_limits<int64_t>::max() / (r.vocab_size + 1));  // x·m cannot overflow
    }
  }
  EXPECT_FALSE(torch::equal(m.engram_layers()[0]->multipliers, m.engram_layers()[2]->multipliers));
  EXPECT_TRUE(m.engram_layers()[1].is_empty());  // E layer
}

TEST(Engram, HashRowsMatchAPerPositionLoop) {
  single_threaded();
  model::HybridLM m(parse(engram_json()));
  const auto& e = *m.engram_layers()[2];
  auto ids = random_tokens(2, 9, 13, 1);
  auto rows = e.rows(ids, {});
  ASSERT_EQ(rows.sizes(), (std::vector<int64_t>{2, 9, 4}));
  for (int64_t b = 0; b < 2; ++b) {
    auto seq = row_of(ids, b);
    for (int64_t t = 0; t < 9; ++t)
      for (size_t g = 0; g < 4; ++g) EXPECT_EQ(rows[b][t][g].item<int64_t>(), naive_row(e, seq, t, g)) << b << "," << t;
  }
  // Continuing after a window of the two previous ids gives the same rows as the whole sequence.
  auto cont = e.rows(ids.narrow(1, 4, 5), ids.narrow(1, 2, 2));
  EXPECT_TRUE(torch::equal(cont, rows.narrow(1, 4, 5)));
  // Positions before the start hash differently from any token: a sequence that starts with token x differs
  // from the same tokens after a window of x's.
  auto after_x = e.rows(ids.narrow(1, 0, 1), torch::full({2, 2}, 3, torch::kLong));
  EXPECT_FALSE(torch::equal(after_x, rows.narrow(1, 0, 1)));
}

// Float64, two streams, every parameter random (the conv and the value projection start at zero otherwise).
TEST(Engram, ForwardMatchesAPerPositionReference) {
  single_threaded();
  Recipe r = parse(engram_json());
  const auto primes = engram_table_primes(r, make_plan(r));
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  model::Engram e(r, 0, /*streams=*/2, primes[0], f64);
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(3);
    for (auto& p : e->parameters()) p.normal_(0.0, 0.7);
  }
  const int64_t B = 2, T = 7, n = 2, D = 8, K = 2, dil = 3;
  auto x = torch::randn({B, T, n, D}, f64);
  auto ids = random_tokens(B, T, 13, 2);
  auto y = e->forward(x, e->lookup(e->rows(ids, {}))).first;

  const double eps = r.norm_eps;
  auto rms = [&](const torch::Tensor& v) { return v / std::sqrt((v * v).mean().item<double>() + eps); };
  auto ref = torch::zeros_like(y);
  auto w = e->conv->weight.squeeze(1);  // [n·D, K]
  for (int64_t b = 0; b < B; ++b) {
    auto seq = row_of(ids, b);
    std::vector<torch::Tensor> z(T), gated(T);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<torch::Tensor> parts;
      for (size_t g = 0; g < 4; ++g) parts.push_back(e->table[naive_row(*e, seq, t, g)]);
      auto mem = torch::cat(parts);  // [d_e]
      auto v = torch::mv(e->wv->weight.dense(), mem);
      auto k = torch::mv(e->wk->weight.dense(), mem).view({n, D});
      std::vector<torch::Tensor> g_m, z_m;
      for (int64_t s = 0; s < n; ++s) {
        const double dot =
            torch::dot(rms(x[b][t][s]) * e->h_norm->weight[s], rms(k[s]) * e->k_norm->weight[s]).item<double>() /
            std::sqrt(static_cast<double>(D));
        const double signed_root = (dot > 0 ? 1.0 : -1.0) * std::sqrt(std::max(std::abs(dot), 1e-6));
        auto gv = v / (1.0 + std::exp(-signed_root));
        g_m.push_back(gv);
        z_m.push_back(rms(gv) * e->conv_norm->weight[s]);
      }
      gated[t] = torch::stack(g_m);  // [n, D]
      z[t] = torch::cat(z_m);        // [n·D]
    }
    for (int64_t t = 0; t < T; ++t) {
      auto c = torch::zeros({n * D}, f64);
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1 - j) * dil;
        if (src >= 0) c += w.select(1, j) * z[src];
      }
      ref[b][t] = gated[t] + (c * torch::sigmoid(c)).view({n, D});
    }
  }
  EXPECT_LT(max_abs_diff(y, ref), 1e-12);
}

TEST(Engram, CanonicalMapMergesEqualNormalForms) {
  EXPECT_EQ(data::engram_normal_form("\xE2\x96\x81"
                                     "Foo"),
            "foo");
  EXPECT_EQ(data::engram_normal_form("  Bar\tBaz\n"), "bar baz");
  EXPECT_EQ(data::engram_normal_form("    "), "    ");  // whitespace-only keeps itself (indentation)
  EXPECT_EQ(data::engram_normal_form("\xC3\x89t\xC3\xA9"), "\xC3\x89t\xC3\xA9");  // ASCII-only lowercase
  // Foo, ▁foo and FOO merge; the two whitespace runs, the partial byte and the special stay apart; x is new.
  std::vector<std::string> texts = {"Foo",
                                    "\xE2\x96\x81"
                                    "foo",
                                    "FOO",
                                    " ",
                                    "  ",
                                    "\xC3",
                                    "",
                                    "x",
                                    "\xC3"};
  std::vector<bool> special = {false, false, false, false, false, false, true, false, false};
  EXPECT_EQ(data::engram_canonical_map(texts, special), (std::vector<int64_t>{0, 0, 0, 1, 2, 3, 4, 5, 3}));
}

TEST(Engram, CanonicalMapOfTheCodeTokenizer) {
  auto tok = data::Tokenizer::load(source_path("tokenizer/slm-code-32k.model"));
  auto map = data::engram_canonical_map(tok);
  ASSERT_EQ(map.size(), tok.vocab_size());
  // Dense, in first-seen order.
  int64_t next = 0;
  for (int64_t v : map) {
    ASSERT_LE(v, next);
    if (v == next) ++next;
  }
  EXPECT_LT(next, static_cast<int64_t>(map.size()));  // it compresses
  std::set<int64_t> specials;
  for (uint32_t id = 0; id < tok.vocab_size(); ++id)
    if (tok.is_special(id)) {
      EXPECT_TRUE(specials.insert(map[id]).second) << "special " << tok.piece(id) << " merged";
    }
  // Case variants of one word share an id when each is a single token.
  auto one = [&](const std::string& s) {
    auto ids = tok.encode(s);
    return ids.size() == 1 ? static_cast<int64_t>(ids[0]) : -1;
  };
  int merged = 0;
  for (const char* w : {"return", "int", "const", "void", "if", "for"}) {
    std::string up = w;
    up[0] = static_cast<char>(std::toupper(up[0]));
    if (one(w) < 0 || one(up) < 0) continue;
    EXPECT_EQ(map[one(w)], map[one(up)]) << w;
    ++merged;
  }
  EXPECT_GT(merged, 0);
}

TEST(Engram, CanonicalIdsAreInstalledAndChecked) {
  single_threaded();
  auto m = random_engram_model(4);
  torch::NoGradGuard no_grad;
  auto with_11 = random_tokens(1, 8, 13, 3), with_12 = with_11.clone();
  with_11[0][5] = 11;
  with_12[0][5] = 12;
  const auto& e = m->engram_layers()[0];
  auto canon = [&](const torch::Tensor& t) { return m->engram_canonical_ids.index_select(0, t.view({-1})).view_as(t); };
  auto before = m->forward(with_12).logits;
  EXPECT_FALSE(torch::equal(e->rows(canon(with_11), {}), e->rows(canon(with_12), {})));
  std::vector<int64_t> map = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 11};  // 12 merges into 11
  m->set_engram_canonical_ids(map);
  // Token 12 now looks up exactly what token 11 does, and the model's output follows.
  EXPECT_TRUE(torch::equal(e->rows(canon(with_11), {}), e->rows(canon(with_12), {})));
  EXPECT_GT(max_abs_diff(m->forward(with_12).logits.narrow(1, 5, 3), before.narrow(1, 5, 3)), 1e-5);
  EXPECT_TRUE(torch::equal(m->forward(with_12).logits.narrow(1, 0, 5), before.narrow(1, 0, 5)));
  EXPECT_THROW(m->set_engram_canonical_ids({0, 1}), Error);
  map[3] = 13;
  EXPECT_THROW(m->set_engram_canonical_ids(map), Error);
  auto plain = micro_ae_json();
  model::HybridLM no_engram(parse(plain));
  EXPECT_THROW(no_engram.set_engram_canonical_ids(std::vector<int64_t>(13, 0)), Error);
}

TEST(Engram, ChangingLaterTokensNeverChangesEarlierLogits) {
  single_threaded();
  auto m = random_engram_model(5);
  torch::NoGradGuard no_grad;
  auto a = random_tokens(2, 14, 13, 4);
  for (int64_t t : {0, 6, 12}) {
    auto b = a.clone();
    b.select(1, t).copy_((a.select(1, t) + 1) % 13);
    auto la = m->forward(a).logits, lb = m->forward(b).logits;
    if (t > 0) {
      EXPECT_LT(max_abs_diff(la.narrow(1, 0, t), lb.narrow(1, 0, t)), 1e-6) << t;
    }
    EXPECT_GT(max_abs_diff(la.narrow(1, t, 1), lb.narrow(1, t, 1)), 1e-4) << t;
  }
}

TEST(Engram, DecodeAndChunkedPrefillMatchTheForward) {
  single_threaded();
  auto m = random_engram_model(7);
  torch::NoGradGuard no_grad;
  const int64_t total = 24;
  auto tokens = random_tokens(2, total, 13, 5);
  auto full = m->forward(tokens).logits;

  auto state = m->new_state(2, total);
  auto pre = m->prefill(tokens.narrow(1, 0, 5), state);
  EXPECT_LT(max_abs_diff(pre, full.narrow(1, 0, 5)), 1e-4);
  double worst = 0;
  for (int64_t t = 5; t < total; ++t)
    worst = std::max(worst, max_abs_diff(m->decode(tokens.select(1, t), state), full.select(1, t)));
  EXPECT_LT(worst, 1e-4);

  // Uneven chunks with rollback 3: drop 3 tokens, feed 2 others, drop them, feed the originals again.
  auto chunked = m->new_state(2, total + 4, 3);
  int64_t at = 0;
  for (int64_t chunk : {1, 9, 4, 10}) {
    EXPECT_LT(max_abs_diff(m->prefill(tokens.narrow(1, at, chunk), chunked), full.narrow(1, at, chunk)), 1e-4)
        << "chunk at " << at;
    at += chunk;
  }
  chunked.rollback(3);
  m->prefill(random_tokens(2, 2, 13, 6), chunked);
  chunked.rollback(2);
  auto again = m->prefill(tokens.narrow(1, total - 3, 3), chunked);
  EXPECT_LT(max_abs_diff(again, full.narrow(1, total - 3, 3)), 1e-4);
}

// On the CPU the host-resident path is still a path of its own: inference gathers the rows into a staging buffer
// (at::index_select_out) instead of index_select on the table, and training gathers from the moved table. Both give
// the device-resident outputs exactly, and training's gradient reaches the table just the same.
TEST(Engram, HostResidentTablesGiveTheSameOutputs) {
  single_threaded();
  auto m = random_engram_model(8);
  auto tokens = random_tokens(2, 12, 13, 7);
  torch::Tensor device;
  {
    torch::NoGradGuard no_grad;
    device = m->forward(tokens).logits;
    m->set_engram_host_resident(true);
    for (const auto& e : m->engram_layers())
      if (e) {
        EXPECT_TRUE(e->host_resident() && e->table.device().is_cpu());
      }
    EXPECT_TRUE(torch::equal(m->forward(tokens).logits, device));
    auto state = m->new_state(2, 12);
    m->prefill(tokens.narrow(1, 0, 6), state);
    for (int64_t t = 6; t < 12; ++t)
      EXPECT_LT(max_abs_diff(m->decode(tokens.select(1, t), state), device.select(1, t)), 1e-4);
  }
  // Training: the same outputs and the same table gradient, host-resident or not.
  auto table_grads = [&] {
    m->zero_grad();
    auto logits = m->forward(tokens).logits;
    logits.square().mean().backward();
    std::vector<torch::Tensor> g;
    for (const auto& e : m->engram_layers())
      if (e) g.push_back(e->table.grad().clone());
    return std::make_pair(logits.detach(), g);
  };
  const auto [host_logits, host_grads] = table_grads();
  EXPECT_LT(max_abs_diff(host_logits, device), 1e-5);  // the training forward may use other kernels
  torch::NoGradGuard no_grad;
  m->set_engram_host_resident(false);
  for (const auto& e : m->engram_layers())
    if (e) {
      EXPECT_FALSE(e->host_resident());
    }
  EXPECT_TRUE(torch::equal(m->forward(tokens).logits, device));
  {
    torch::AutoGradMode grad(true);
    const auto [resident_logits, resident_grads] = table_grads();
    EXPECT_TRUE(torch::equal(resident_logits, host_logits));
    ASSERT_EQ(host_grads.size(), resident_grads.size());
    ASSERT_FALSE(host_grads.empty());
    for (size_t i = 0; i < host_grads.size(); ++i) {
      EXPECT_GT(host_grads[i].abs().max().item<double>(), 0.0) << "table " << i << " got no gradient";
      EXPECT_TRUE(torch::equal(host_grads[i], resident_grads[i])) << "table " << i;
    }
  }
}

// On a GPU the host path really gathers in (pinned) host memory and copies the rows over.
TEST(Engram, CudaHostResidentTablesGatherInHostMemory) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  single_threaded();
  auto m = random_engram_model(8);
  torch::NoGradGuard no_grad;
  auto tokens = random_tokens(2, 12, 13, 7);
  auto device = m->forward(tokens).logits;
  model::HybridLM gpu(parse(engram_json()), torch::TensorOptions().device(torch::kCUDA));
  auto src = m->named_parameters();
  for (auto& p : gpu.named_parameters()) p.value().copy_(src[p.key()]);
  for (auto& b : gpu.named_buffers()) b.value().copy_(m->named_buffers()[b.key()]);
  gpu.eval();
  auto on_device = gpu.forward(tokens.cuda()).logits;
  gpu.set_engram_host_resident(true);
  EXPECT_TRUE(gpu.engram_layers()[0]->table.device().is_cpu());
  EXPECT_TRUE(torch::equal(gpu.forward(tokens.cuda()).logits, on_device));
  EXPECT_LT(max_abs_diff(on_device.cpu(), device), 1e-4);
  {
    torch::AutoGradMode grad(true);  // the training path (no staging buffer) gives the same values and a CPU grad
    auto loss = gpu.forward(tokens.cuda()).logits.square().mean();
    loss.backward();
    EXPECT_TRUE(gpu.engram_layers()[0]->table.grad().device().is_cpu());
  }
}

TEST(Engram, TablesSaveLoadAndSwapAsTheirOwnFile) {
  single_threaded();
  auto m = random_engram_model(9);
  torch::NoGradGuard no_grad;
  auto tokens = random_tokens(2, 10, 13, 8);
  auto original = m->forward(tokens).logits;
  const auto all = temp_path("all"), one = temp_path("one");
  model::save_engram_tables(*m, all);
  model::save_engram_tables(*m, one, 2);
  auto header = safetensors::read_header(one);
  std::set<std::string> names;
  for (const auto& t : header.tensors) names.insert(t.name);
  EXPECT_EQ(names, (std::set<std::string>{"engram_canonical_ids", "layers.2.engram.multipliers",
                                          "layers.2.engram.primes", "layers.2.engram.table"}));

  // Another domain's tables change the outputs; loading the saved file swaps the first domain back exactly.
  auto saved0 = m->engram_layers()[0]->table.clone();
  for (const auto& e : m->engram_layers())
    if (e) e->table.normal_();
  EXPECT_GT(max_abs_diff(m->forward(tokens).logits, original), 1e-4);
  model::load_engram_tables(*m, all);
  EXPECT_TRUE(torch::equal(m->forward(tokens).logits, original));

  // A one-layer file replaces that layer only.
  auto other0 = torch::randn_like(saved0), other2 = torch::randn_like(m->engram_layers()[2]->table);
  m->engram_layers()[0]->table.copy_(other0);
  m->engram_layers()[2]->table.copy_(other2);
  model::load_engram_tables(*m, one);
  EXPECT_TRUE(torch::equal(m->engram_layers()[0]->table, other0));
  EXPECT_FALSE(torch::equal(m->engram_layers()[2]->table, other2));

  // Refusals leave the model unchanged: other table sizes, another canonical map, a weights file, no Engram.
  auto j = engram_json();
  j["engram"]["table_rows"] = 7;
  auto bigger = random_engram_model(10, j);
  const auto wrong = temp_path("wrong");
  model::save_engram_tables(*bigger, wrong);
  auto kept = m->engram_layers()[2]->table.clone();
  EXPECT_THROW(model::load_engram_tables(*m, wrong), Error);
  EXPECT_TRUE(torch::equal(m->engram_layers()[2]->table, kept));
  std::vector<int64_t> merged(13);
  for (int64_t i = 0; i < 13; ++i) merged[i] = i == 12 ? 0 : i;
  auto remapped = random_engram_model(11);
  remapped->set_engram_canonical_ids(merged);
  try {
    model::load_engram_tables(*remapped, all);
    ADD_FAILURE() << "tables hashed with another canonical map were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("canonical"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model::save_engram_tables(*m, one, 1), Error);  // layer 1 has no Engram
  model::HybridLM plain(parse(micro_ae_json()));
  EXPECT_THROW(model::save_engram_tables(plain, temp_path("none")), Error);
  for (const auto& p : {all, one, wrong}) unlink(p.c_str());
}

// Model checkpoints carry the hashing (multipliers, primes, canonical map) as integer tensors.
TEST(Engram, CheckpointsCarryTheHashingBuffers) {
  single_threaded();
  auto m = random_engram_model(12);
  std::vector<int64_t> map(13);
  for (int64_t i = 0; i < 13; ++i) map[i] = i / 2;
  m->set_engram_canonical_ids(map);
  const auto path = temp_path("weights");
  model::save_weights(*m, path);
  auto fresh = random_engram_model(13);
  model::load_weights(*fresh, path);
  auto loaded = model::named_state(*fresh);
  for (const auto& [name, t] : model::named_state(*m)) EXPECT_TRUE(torch::equal(t, loaded.at(name))) << name;
  EXPECT_EQ(loaded.at("engram_canonical_ids").scalar_type(), torch::kLong);
  torch::NoGradGuard no_grad;
  auto tokens = random_tokens(1, 9, 13, 10);
  EXPECT_TRUE(torch::equal(fresh->forward(tokens).logits, m->forward(tokens).logits));
  // Floats where the model holds integers are refused.
  std::map<std::string, torch::Tensor> state;
  for (const auto& [name, t] : model::named_state(*m)) state[name] = t.detach();
  state["engram_canonical_ids"] = state["engram_canonical_ids"].to(torch::kFloat);
  safetensors::save(path, state);
  EXPECT_THROW(model::load_weights(*fresh, path), Error);
  unlink(path.c_str());
}
