#include "slm/recipe/letters.h"

#include <array>
#include <string>

#include "slm/recipe/recipe.h"
#include "slm/util/error.h"

namespace slm {

namespace {

// 'C' (the product documents' reserved letter) has no row: recipe parsing names it reserved.
constexpr std::array<PatternLetter, 5> kLetters = {{
    {'A', Family::Attention, "attention", "attention", [](const Recipe& r) { return r.attention.has_value(); }},
    {'E', Family::MoE, "moe", "MoE", [](const Recipe& r) { return r.moe.has_value(); }},
    {'M', Family::Mamba3, "mamba3", "Mamba-3", [](const Recipe& r) { return r.mamba3.has_value(); }},
    {'R', Family::M2RNN, "m2rnn", "M2RNN", [](const Recipe& r) { return r.m2rnn.has_value(); }},
    {'F', Family::MLP, "mlp", "dense MLP", [](const Recipe& r) { return r.mlp.has_value(); }},
}};

std::string letters_text() {
  std::string s;
  for (const auto& l : kLetters) s += std::string(s.empty() ? "" : ", ") + l.letter + " (" + l.title + ")";
  return s;
}

}  // namespace

std::span<const PatternLetter> pattern_letters() {
  return kLetters;
}

const PatternLetter* find_pattern_letter(char letter) {
  for (const auto& l : kLetters)
    if (l.letter == letter) return &l;
  return nullptr;
}

const PatternLetter& pattern_letter(char letter) {
  if (const auto* l = find_pattern_letter(letter)) return *l;
  throw Error(std::string("unknown pattern letter '") + letter + "'; known letters: " + known_letters_text());
}

const PatternLetter& pattern_letter(Family family) {
  for (const auto& l : kLetters)
    if (l.family == family) return l;
  throw Error("no pattern letter has block family " + std::to_string(static_cast<int>(family)));
}

const char* known_letters_text() {
  static const std::string text = letters_text();
  return text.c_str();
}

}  // namespace slm
