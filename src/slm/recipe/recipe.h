#pragma once
// A recipe is the data that defines one model: sizes, the pattern string, and the settings of every block
// family and feature. See docs/recipes.md for every field, its default and its rule.
#include <optional>
#include <string>
#include <vector>

namespace slm {

// Which layers a feature is placed on: none, all eligible layers, or an explicit list of 0-based indices.
struct LayerSet {
  enum class Kind { None, All, List };
  Kind kind = Kind::None;
  std::vector<int> list;
  bool contains(int layer) const;
  std::string describe() const;
};

struct MlaConfig {
  int q_lora_rank = 0;  // 0: queries are projected directly from the hidden state
  int kv_lora_rank = 512;
  int qk_nope_head_dim = 128;
  int qk_rope_head_dim = 64;
  int v_head_dim = 128;
};

struct AttentionConfig {
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  double rope_theta = 10000.0;
  bool qk_norm = true;
  std::string window_pattern = "L";  // tiled over the A layers; L = full context, S = short window
  int short_window = 0;              // tokens seen by S layers (required when the pattern has S)
  bool dsa_enabled = false;
  int dsa_start_layer = 0;
  std::optional<std::vector<int>> dsa_layers;  // explicit DSA layers (all A layers >= start when absent)
  double dsa_top_k_ratio = 0.5;
  int dsa_local_window = 128;
  int dsa_indexer_heads = 16;
  int dsa_indexer_dim = 32;
  LayerSet mla_layers;  // A layers that use multi-head latent attention
  MlaConfig mla;
};

// Mirrors the product documents' AuthorMamba3Config.
struct Mamba3Config {
  int d_state = 128;
  int expand = 2;
  int headdim = 64;
  int ngroups = 1;
  double rope_fraction = 0.5;
  double dt_min = 0.001;
  double dt_max = 0.1;
  double dt_init_floor = 1e-4;
  double A_floor = 1e-4;
  bool is_outproj_norm = false;
  bool is_mimo = false;
  int mimo_rank = 4;
  int chunk_size = 64;
  // Derived (heads = d_model*expand/headdim); a recipe may state it, but it must agree.
  int heads = 0;
  int d_inner = 0;
  int rank() const { return is_mimo ? mimo_rank : 1; }
  int rope_angles() const;                            // S_ang
  long long in_proj_width(int d_model) const;         // d_in_proj
};

struct MoeConfig {
  int routed_experts = 0;
  int experts_per_token = 0;
  int shared_experts = 1;
  int expert_hidden = 0;
  int shared_expert_hidden = 0;  // defaults to expert_hidden
  std::string gate = "sigmoid";
  double routed_scaling_factor = 1.0;
  double bias_update_rate = 1e-3;
  int layer_freq = 1;  // every layer_freq-th E slot is MoE; the others become dense F layers
  double aux_loss_weight = 0.0;
};

struct M2rnnConfig {
  int heads = 0;
  int k_head_dim = 64;
  int v_head_dim = 16;
  int qk_heads = 1;  // q and k heads (shared by all state heads in the paper setting)
  int conv_kernel = 4;
};

struct MlpConfig {
  int hidden = 0;  // SwiGLU hidden size of dense F layers
};

struct EngramConfig {
  bool enabled = false;
  LayerSet layers;
  std::vector<int> orders = {2, 3};
  int heads_per_order = 8;
  long long table_rows = 0;  // base rows per (order, head); each table takes the next distinct prime
  int embed_dim = 0;         // width of one table row
  int conv_kernel = 4;
  std::string orders_text() const;
};

struct MhcConfig {
  bool enabled = false;
  int streams = 4;
  LayerSet layers;  // layers with learned (dynamic) mixing; the rest use the fixed plain-residual mix
  int sinkhorn_iters = 20;  // the paper's t_max; docs/recipes.md has the row/column errors it leaves
  double temperature = 1.0;
  double epsilon = 1e-6;
  double blend_alpha = 1.0;
};

struct MtpConfig {
  int depth = 0;
  double lambda = 0.3;
  std::string pattern = "AF";  // the layers of one MTP module
  bool mla = false;            // MTP attention uses MLA
};

struct Recipe {
  std::string source;  // file it came from (for messages)
  std::string name;
  std::string notes;
  int vocab_size = 0;
  int d_model = 0;
  int depth = 0;
  std::string pattern;
  int seq_len = 0;
  double norm_eps = 1e-5;

  std::optional<AttentionConfig> attention;
  std::optional<Mamba3Config> mamba3;
  std::optional<MoeConfig> moe;
  std::optional<M2rnnConfig> m2rnn;
  std::optional<MlpConfig> mlp;
  EngramConfig engram;
  MhcConfig mhc;
  MtpConfig mtp;
};

// The pattern letters a recipe may use, with the family each one names.
bool is_pattern_letter(char c);

// Parse and fully validate (including the layer plan's placement rules). Throws slm::Error.
Recipe parse_recipe_text(const std::string& text, const std::string& source);
Recipe load_recipe(const std::string& path);

}  // namespace slm
