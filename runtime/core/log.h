// Logging: one line per message on stderr (info goes to stdout), prefixed with the level.
// log_info prints only on rank 0 (or before the identity is set); log_warn/log_error print on every
// rank with rank@host so a failing peer can be found in a multi-node log.
#pragma once

#include <fmt/format.h>

#include <string>

namespace berth {

// `s` with what would act on a terminal instead of showing written as \xNN, byte by byte: the
// characters utf8_acts_on_display names (controls but newline and tab, DEL, C1 controls, the
// bidirectional ones) and the bytes that are not well-formed UTF-8 (a lone 0x9b is CSI to a
// terminal that reads 8-bit controls). log_line prints every message through it.
std::string printable_for_terminal(const std::string& s);

void log_line(const char* level, bool all_ranks, const std::string& message);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log_line("info", false, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  log_line("warn", true, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  log_line("error", true, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace berth
