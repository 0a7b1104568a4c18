#include "runtime/core/utf8.h"

namespace berth {

int utf8_char_at(const std::string& s, size_t i, uint32_t* cp) {
  if (i >= s.size()) return 0;
  const auto c = static_cast<unsigned char>(s[i]);
  const int extra = c < 0x80           ? 0
                    : (c >> 5) == 0x6  ? 1
                    : (c >> 4) == 0xe  ? 2
                    : (c >> 3) == 0x1e ? 3
                                       : -1;  // a continuation byte, or 0xf8.. first
  if (extra < 0 || s.size() - i <= static_cast<size_t>(extra)) return 0;  // or cut short
  uint32_t v = extra == 0 ? c : c & (0x3fu >> extra);
  for (int k = 1; k <= extra; ++k) {
    const auto t = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((t >> 6) != 0x2) return 0;
    v = (v << 6) | (t & 0x3fu);
  }
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (v < kMin[extra] || (v >= 0xd800 && v <= 0xdfff) || v > 0x10ffff) return 0;
  *cp = v;
  return 1 + extra;
}

bool utf8_acts_on_display(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp < 0xa0) || cp == 0x061c || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace berth
