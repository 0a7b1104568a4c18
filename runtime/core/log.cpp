#include "runtime/core/log.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "runtime/core/check.h"
#include "runtime/core/utf8.h"

namespace berth {

std::string printable_for_terminal(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const int n = utf8_char_at(s, i, &cp);
    if (n > 0 && (!utf8_acts_on_display(cp) || cp == '\n' || cp == '\t')) {
      out.append(s, i, static_cast<size_t>(n));
    } else {  // each of its bytes, or the one byte that begins no character
      for (size_t k = i; k < i + static_cast<size_t>(std::max(n, 1)); ++k)
        out += fmt::format("\\x{:02x}", static_cast<unsigned>(static_cast<unsigned char>(s[k])));
    }
    i += static_cast<size_t>(std::max(n, 1));
  }
  return out;
}

void log_line(const char* level, bool all_ranks, const std::string& raw) {
  // Messages quote what users' files hold (a trace's header, a config value): a control byte in
  // one, an escape sequence above all, would act on the terminal instead of showing.
  const std::string message = printable_for_terminal(raw);
  const int rank = identity_rank();
  if (!all_ranks) {
    if (rank > 0) return;
    std::fprintf(stdout, "%s\n", message.c_str());
    std::fflush(stdout);
    return;
  }
  std::fprintf(stderr, "berth %s [%s]: %s\n", level, identity().c_str(), message.c_str());
  std::fflush(stderr);
}

}  // namespace berth
