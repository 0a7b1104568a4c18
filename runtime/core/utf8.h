// UTF-8 text that users' files and arguments bring in (names, config values, CSV headers), read
// one character at a time, and which of its characters may reach a terminal as they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace berth {

// The length in bytes (1 to 4) of the well-formed UTF-8 character at s[i], with its code point in
// *cp; 0 when the bytes there are not one (a stray continuation byte, a sequence cut short, an
// overlong form, a surrogate, beyond U+10FFFF).
int utf8_char_at(const std::string& s, size_t i, uint32_t* cp);

// Whether code point `cp` changes how a terminal, a listing or a web page shows the text around
// it instead of showing itself: C0 and C1 controls (U+009B is CSI, like ESC [), DEL, the
// bidirectional formatting characters and the line and paragraph separators (a right-to-left
// override makes text read other than it is: CVE-2021-42574, "Trojan Source").
bool utf8_acts_on_display(uint32_t cp);

}  // namespace berth
