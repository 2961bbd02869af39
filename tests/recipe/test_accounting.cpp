// Parameter accounting against counts worked out by hand from the shapes in docs/recipes.md.
#include "slm/recipe/accounting.h"
#include "test_util.h"

using namespace slm;
using namespace slm::test;

namespace {
Accounting account_of(const nlohmann::json& j) {
  Recipe r = parse(j);
  return account(r, make_plan(r));
}
}  // namespace

TEST(Accounting, AttentionPlusMoeByHand) {
  auto j = nlohmann::json::parse(R"({
    "name": "hand", "vocab_size": 10, "d_model": 4, "depth": 2, "pattern": "AE", "seq_len": 8,
    "attention": {"heads": 2, "kv_heads": 1, "head_dim": 2},
    "moe": {"routed_experts": 4, "experts_per_token": 1, "shared_experts": 1, "expert_hidden": 3}
  })");
  Accounting a = account_of(j);
  // embedding 10*4=40, lm_head 40, final norm 4, resid/x0 lambdas 2+2.
  // A layer: norm 4, wq 4x4=16, wk 2x4=8, wv 8, wo 16, q/k norm 2+2            = 56
  // E layer: norm 4, router 4x4=16, experts w13 4*6*4=96, w2 4*4*3=48,
  //          shared w13 6*4=24, w2 4*3=12                                       = 200
  EXPECT_EQ(a.total, 40 + 40 + 4 + 4 + 56 + 200);
  EXPECT_EQ(a.layers[0].total, 56);
  EXPECT_EQ(a.layers[1].total, 200);
  // Routed experts (144) count 1 of 4 when active.
  EXPECT_EQ(a.active, 344 - 144 + 36);
  EXPECT_EQ(a.active_excl_embedding, a.active - 40);
  EXPECT_EQ(a.mtp_total, 0);
  EXPECT_EQ(a.stored, 344);
  EXPECT_EQ(a.by_family.at("moe"), 200);
  EXPECT_EQ(a.by_family.at("attention"), 56);
}

TEST(Accounting, Mamba3SisoAndMimoByHand) {
  auto j = nlohmann::json::parse(R"({
    "name": "m", "vocab_size": 10, "d_model": 4, "depth": 1, "pattern": "M", "seq_len": 8,
    "mamba3": {"d_state": 4, "expand": 2, "headdim": 4, "ngroups": 1, "rope_fraction": 0.5}
  })");
  // d_inner 8, H 2, rope angles: floor(4*0.5)=2 -> 1 angle. in_proj width 2*8 + 2*1*1*4 + 3*2 + 1 = 31.
  // in_proj 31*4=124, dt_bias 2, B/C bias 2*(2*1*4)=16, B/C norm 8, D 2, out_proj 4*8=32, pre-norm 4 = 188
  EXPECT_EQ(account_of(j).layers[0].total, 188);
  j["mamba3"]["is_mimo"] = true;
  j["mamba3"]["mimo_rank"] = 2;
  // in_proj width 16 + 2*1*2*4 + 6 + 1 = 39 -> 156; B/C bias 2*(2*2*4)=32; mimo x/z/o 3*(2*2*4)=48
  EXPECT_EQ(account_of(j).layers[0].total, 156 + 2 + 32 + 8 + 48 + 2 + 32 + 4);
}

TEST(Accounting, M2rnnByHand) {
  auto j = nlohmann::json::parse(R"({
    "name": "r", "vocab_size": 10, "d_model": 4, "depth": 1, "pattern": "R", "seq_len": 8,
    "m2rnn": {"heads": 2, "k_head_dim": 2, "v_head_dim": 3, "qk_heads": 1, "conv_kernel": 4}
  })");
  // conv channels q,k,v = 2*1*2 + 2*3 = 10; in_proj (10 + f 2 + g 6)*4 = 72; conv 10*4 + bias 10;
  // A_log 2, dt_bias 2, W 2*3*3=18, D 2*3=6, out norm 6, out_proj 4*6=24, pre-norm 4
  EXPECT_EQ(account_of(j).layers[0].total, 72 + 40 + 10 + 2 + 2 + 18 + 6 + 6 + 24 + 4);
}

TEST(Accounting, MlaAndDsaByHand) {
  auto j = nlohmann::json::parse(R"({
    "name": "mla", "vocab_size": 10, "d_model": 8, "depth": 1, "pattern": "A", "seq_len": 8,
    "attention": {"heads": 2, "kv_heads": 2, "head_dim": 4, "mla_layers": "all",
                  "mla": {"q_lora_rank": 3, "kv_lora_rank": 5, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 3},
                  "dsa_enabled": true, "dsa_indexer_heads": 2, "dsa_indexer_dim": 4}
  })");
  // wq_a 3*8=24, q_a_norm 3, wq_b 2*(4+2)*3=36, wkv_a (5+2)*8=56, kv_a_norm 5, wkv_b 2*(4+3)*5=70, wo 8*6=48
  // indexer: wq 8*8=64, wk 4*8=32, k_norm 4+4, weights 2*8=16; pre-norm 8
  EXPECT_EQ(account_of(j).layers[0].total, 24 + 3 + 36 + 56 + 5 + 70 + 48 + 64 + 32 + 8 + 16 + 8);
}

TEST(Accounting, EngramTablesMhcAndMtpAreSeparate) {
  auto j = nlohmann::json::parse(R"({
    "name": "x", "vocab_size": 10, "d_model": 4, "depth": 2, "pattern": "AF", "seq_len": 8,
    "attention": {"heads": 1, "kv_heads": 1, "head_dim": 4, "qk_norm": false},
    "mlp": {"hidden": 2},
    "engram": {"enabled": true, "layers": [0], "orders": "2,3", "heads_per_order": 2, "table_rows": 10, "embed_dim": 3},
    "mhc": {"enabled": true, "streams": 2, "layers": [1]},
    "mtp": {"depth": 1, "pattern": "F"}
  })");
  Accounting a = account_of(j);
  // Engram tables: 4 distinct primes >= 10: 11, 13, 17, 19 -> 60 rows x 3.
  EXPECT_EQ(a.engram_tables, 60 * 3);
  EXPECT_EQ(a.engram_lookups_per_token, 2 * 2 * 3);
  // A layer: norm 4 + wq/wk/wv/wo 4*16 = 68; Engram projections: wv 4x12=48, wk (2*4)x12=96, norms 3*(2*4)=24,
  // conv 8*4=32 -> 200.   F layer: norm 4 + w13 4*4=16 + w2 4*2=8 = 28; mHC (n=2): phi (4+4)x8=64, bias 8, alpha 3.
  EXPECT_EQ(a.layers[0].total, 68 + 200);
  EXPECT_EQ(a.layers[1].total, 28 + 64 + 8 + 3);
  // No lambdas with mHC; head collapse phi 2x8=16, bias 2, alpha 1; embedding 40, lm_head 40, final norm 4.
  EXPECT_EQ(a.total, 40 + 40 + 4 + 16 + 2 + 1 + 268 + 103);
  // MTP: enorm 4, hnorm 4, proj 4x8=32, its F layer 28, norm 4.
  EXPECT_EQ(a.mtp_total, 4 + 4 + 32 + 28 + 4);
  EXPECT_EQ(a.stored, a.total + a.mtp_total + a.engram_tables);
}

TEST(Accounting, Nvfp4BytesPadTheReductionDim) {
  ParamSpec w{"w", {3, 20}, ParamKind::Linear, "mlp"};
  // 20 -> 2 blocks of 16 (padded to 32): per row 2*8 code bytes + 2 scale bytes; 3 rows; + 4-byte tensor scale.
  EXPECT_EQ(nvfp4_bytes(w), 3 * (2 * 8 + 2) + 4);
  ParamSpec norm{"n", {20}, ParamKind::Norm, "norm"};
  EXPECT_EQ(nvfp4_bytes(norm), 40);
  ParamSpec experts{"e", {2, 4, 32}, ParamKind::Expert, "moe", true};
  EXPECT_EQ(nvfp4_bytes(experts), 2 * (4 * 2 * 9 + 4));
}
