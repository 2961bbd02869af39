#pragma once
// The pattern letters, one row each: the only place a letter is tied to its block family, its recipe section and
// its name in messages. Recipe parsing (which letters exist), the plan (family, required section), the model's
// layer registry (which class builds a family) and the accounting (parameter names) all read this table; see
// docs/architecture.md, "Who owns a letter".
#include <span>

namespace slm {

struct Recipe;

enum class Family { Attention, MoE, Mamba3, M2RNN, MLP };

struct PatternLetter {
  char letter;
  Family family;
  const char* name;   // the family's name: the recipe section that configures it, parameter and report names
  const char* title;  // how messages name it
  bool (*configured)(const Recipe&);  // whether the recipe has that section
};

std::span<const PatternLetter> pattern_letters();
const PatternLetter* find_pattern_letter(char letter);  // nullptr when no row has it
const PatternLetter& pattern_letter(char letter);       // throws slm::Error when no row has it
const PatternLetter& pattern_letter(Family family);

// "A (attention), E (MoE), ...": the letters for an error message.
const char* known_letters_text();

}  // namespace slm
