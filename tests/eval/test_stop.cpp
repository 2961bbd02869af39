// Cutting completions at stop sequences, against hand-written strings.
#include <gtest/gtest.h>

#include "slm/eval/stop.h"

using slm::eval::truncate_at_stop;

TEST(StopSequence, CutsBeforeTheFirstOccurrence) {
  EXPECT_EQ(truncate_at_stop("    return x + y;\n}\nint main() {\n}\n", {"\n}"}), "    return x + y;");
  EXPECT_EQ(truncate_at_stop("  if (a) { b(); }\n  return 1;\n}", {"\n}"}), "  if (a) { b(); }\n  return 1;");
}

TEST(StopSequence, EarliestOfSeveralWinsWhateverTheirOrder) {
  const std::string text = "  return 1;\n// done\n}\n";
  EXPECT_EQ(truncate_at_stop(text, {"\n}", "\n//"}), "  return 1;");
  EXPECT_EQ(truncate_at_stop(text, {"\n//", "\n}"}), "  return 1;");
}

TEST(StopSequence, NoStopKeepsEverythingAndEmptyStopsAreIgnored) {
  EXPECT_EQ(truncate_at_stop("  return 1; }", {"\n}"}), "  return 1; }");
  EXPECT_EQ(truncate_at_stop("abc", {""}), "abc");
  EXPECT_EQ(truncate_at_stop("abc", {}), "abc");
  EXPECT_EQ(truncate_at_stop("\n}rest", {"\n}"}), "");
}
