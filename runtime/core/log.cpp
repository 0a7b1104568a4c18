#include "runtime/core/log.h"

#include <cstdio>

#include "runtime/core/check.h"

namespace berth {

std::string printable_for_terminal(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else {
      out += ch;
    }
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
