// UTF-8 repair and truncation at character boundaries (the coordinator stores only valid UTF-8).
#include "common/utf8.h"

#include <gtest/gtest.h>

namespace dt {
namespace {

TEST(Utf8, ValidTextIsRecognised) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("d\xC3\xA9j\xC3\xA0 \xE2\x80\xA6 \xF0\x9F\x94\xA5"));  // déjà … 🔥
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));                                  // U+10FFFF
}

TEST(Utf8, MalformedSequencesAreRefused) {
  EXPECT_FALSE(IsValidUtf8("\xC3"));              // cut short
  EXPECT_FALSE(IsValidUtf8("\x80"));              // a lone continuation byte
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\xAF"));      // overlong, three bytes
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // beyond U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xFF"));
}

TEST(Utf8, EachBadByteBecomesAReplacementCharacter) {
  EXPECT_EQ(ValidUtf8("a\xFF"
                      "b\xC3"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  EXPECT_EQ(ValidUtf8("\xE2\x80"
                      "x"),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "x");
  EXPECT_EQ(ValidUtf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_TRUE(IsValidUtf8(ValidUtf8(std::string("\0\xFE\xC0\x80\xF0\x9F", 6))));
}

TEST(Utf8, TruncationNeverSplitsACharacter) {
  std::string e_acute = "\xC3\xA9";
  std::string text;
  for (int i = 0; i < 100; ++i) text += e_acute;  // 200 bytes
  for (size_t max : {0u, 1u, 2u, 3u, 99u, 100u, 101u, 199u, 200u, 500u}) {
    std::string cut = TruncateUtf8(text, max);
    EXPECT_TRUE(IsValidUtf8(cut)) << max;
    EXPECT_LE(cut.size(), max) << max;
    EXPECT_GE(cut.size() + 1, std::min<size_t>(max, text.size())) << max;  // at most one char lost
  }
  EXPECT_EQ(TruncateUtf8("ab\xF0\x9F\x94\xA5", 5), "ab");
  EXPECT_EQ(TruncateUtf8("ab\xF0\x9F\x94\xA5", 6), "ab\xF0\x9F\x94\xA5");
}

TEST(Utf8, TerminalOutputCannotCarryControlSequences) {
  EXPECT_EQ(PrintableForTerminal("ok\tline\nnext"), "ok\tline\nnext");
  EXPECT_EQ(PrintableForTerminal("\x1b[2J\x1b]0;owned\x07"), "\\x1b[2J\\x1b]0;owned\\x07");
  EXPECT_EQ(PrintableForTerminal("a\rb\x7f"), "a\\x0db\\x7f");
  EXPECT_EQ(PrintableForTerminal("\xC2\x9B"
                                 "31m"),
            "\\u009b31m");  // C1 CSI
  EXPECT_EQ(PrintableForTerminal("d\xC3\xA9j\xC3\xA0 \xC2\xA0"), "d\xC3\xA9j\xC3\xA0 \xC2\xA0");
  EXPECT_EQ(PrintableForTerminal("\xFF"), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace dt
