#pragma once
// The expanded layer plan: the pattern tiled to the depth, each layer's family (the ownership table) and
// the features placed on it. The plan is the single source of truth the model builder follows.
#include <map>
#include <string>
#include <vector>

#include "slm/recipe/letters.h"
#include "slm/recipe/recipe.h"

namespace slm {

// Shorthands for the letter table (letters.h): one letter, one family, one layer class.
inline Family family_of(char letter) { return pattern_letter(letter).family; }
inline const char* family_name(Family f) { return pattern_letter(f).name; }

struct LayerPlan {
  int index = 0;         // 0-based position in its stack (the main stack or one MTP module)
  char declared = 0;     // letter the tiled pattern put here
  char letter = 0;       // letter the runtime builds (E becomes F on slots skipped by moe.layer_freq)
  Family family = Family::Attention;
  int family_rank = 0;   // index among the layers with the same letter
  // Attention-only features.
  char window = 0;        // 'L' (full context) or 'S' (short window)
  int window_tokens = 0;  // 0 means full context
  bool dsa = false;
  bool mla = false;
  // Features beside or around the block.
  bool engram = false;
  bool mhc = false;  // learned (dynamic) hyper-connection mixing on this layer
  std::string features() const;  // "window=S:512 dsa mla engram mhc" style summary
};

struct ModelPlan {
  std::string expanded;                // letters the runtime builds, one per layer
  std::vector<LayerPlan> layers;       // the main stack
  std::vector<LayerPlan> mtp_layers;   // the layers of one MTP module (every module has the same plan)
  int mtp_depth = 0;
  std::map<char, int> composition;     // counts by letter of the main stack
};

// The pattern repeated cyclically and cut to depth ("AEM", 7 -> "AEMAEMA").
std::string tile_pattern(const std::string& pattern, int depth);

// Builds the plan; throws slm::Error when a letter lacks its settings section or a feature is placed
// on a layer that cannot host it.
ModelPlan make_plan(const Recipe& recipe);

}  // namespace slm
