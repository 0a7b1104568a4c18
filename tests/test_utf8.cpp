// UTF-8 reading (runtime/core/utf8.h) and what log lines let through to a terminal
// (runtime/core/log.h printable_for_terminal).
#include <gtest/gtest.h>

#include <string>

#include "runtime/core/log.h"
#include "runtime/core/utf8.h"

namespace berth {
namespace {

int length_of(const std::string& s, uint32_t* cp = nullptr) {
  uint32_t v = 0;
  const int n = utf8_char_at(s, 0, &v);
  if (cp) *cp = v;
  return n;
}

TEST(Utf8, ReadsWellFormedCharactersOfEveryLength) {
  uint32_t cp = 0;
  EXPECT_EQ(length_of("a", &cp), 1);
  EXPECT_EQ(cp, 0x61u);
  EXPECT_EQ(length_of("\xc3\xa9", &cp), 2);  // é
  EXPECT_EQ(cp, 0xe9u);
  EXPECT_EQ(length_of("\xe2\x80\x93", &cp), 3);  // – (the progress block's en dash)
  EXPECT_EQ(cp, 0x2013u);
  EXPECT_EQ(length_of("\xf0\x9f\x98\x80", &cp), 4);  // U+1F600
  EXPECT_EQ(cp, 0x1f600u);
  EXPECT_EQ(length_of("\xf4\x8f\xbf\xbf", &cp), 4);  // U+10FFFF, the last
  EXPECT_EQ(cp, 0x10ffffu);
}

TEST(Utf8, RefusesWhatIsNotOneCharacter) {
  EXPECT_EQ(length_of("\x9b"), 0);              // a continuation byte alone
  EXPECT_EQ(length_of("\xe2\x80"), 0);          // cut short
  EXPECT_EQ(length_of("\xe2\x28\xa1"), 0);      // a second byte that continues nothing
  EXPECT_EQ(length_of("\xc0\xaf"), 0);          // overlong '/'
  EXPECT_EQ(length_of("\xe0\x80\xaf"), 0);      // overlong '/', three bytes
  EXPECT_EQ(length_of("\xed\xa0\x80"), 0);      // a surrogate, U+D800
  EXPECT_EQ(length_of("\xf4\x90\x80\x80"), 0);  // U+110000
  EXPECT_EQ(length_of("\xf8\x88\x80\x80\x80"), 0);
  EXPECT_EQ(utf8_char_at("ab", 2, nullptr), 0);  // past the end
}

TEST(Utf8, NamesTheCharactersThatActOnADisplay) {
  for (uint32_t cp : {0x00u, 0x09u, 0x0au, 0x1bu, 0x7fu, 0x80u, 0x9bu, 0x9fu, 0x061cu, 0x200eu,
                      0x200fu, 0x2028u, 0x2029u, 0x202au, 0x202eu, 0x2066u, 0x2069u})
    EXPECT_TRUE(utf8_acts_on_display(cp)) << std::hex << cp;
  for (uint32_t cp : {0x20u, 0x41u, 0x7eu, 0xa0u, 0xe9u, 0x2013u, 0x2030u, 0x1f600u})
    EXPECT_FALSE(utf8_acts_on_display(cp)) << std::hex << cp;
}

TEST(PrintableForTerminal, KeepsTextNewlinesTabsAndWellFormedUtf8) {
  const std::string text =
      "step 1200/12000 | band 13:27\xe2\x80\x93"
      "13:41 \xc2\xb1"
      "12m\n\tr\xc3\xa9sum\xc3\xa9 \xf0\x9f\x98\x80";
  EXPECT_EQ(printable_for_terminal(text), text);
}

TEST(PrintableForTerminal, WritesControlsAndMalformedBytesAsHex) {
  EXPECT_EQ(printable_for_terminal("st\x01"
                                   "ep \x1b[31mred\x7f"),
            "st\\x01ep \\x1b[31mred\\x7f");
  // 8-bit CSI: a lone byte, and the C1 control U+009B as well-formed UTF-8
  EXPECT_EQ(printable_for_terminal("a\x9b"
                                   "31mb"),
            "a\\x9b31mb");
  EXPECT_EQ(printable_for_terminal("a\xc2\x9b"
                                   "31mb"),
            "a\\xc2\\x9b31mb");
  // a right-to-left override, and a sequence cut short by the end of the text
  EXPECT_EQ(printable_for_terminal("x\xe2\x80\xae"
                                   "cba"),
            "x\\xe2\\x80\\xaecba");
  EXPECT_EQ(printable_for_terminal("x\xe2\x80"), "x\\xe2\\x80");
  // a malformed byte costs only itself: the character after it shows
  EXPECT_EQ(printable_for_terminal("\xe2\xc3\xa9"), "\\xe2\xc3\xa9");
}

}  // namespace
}  // namespace berth
