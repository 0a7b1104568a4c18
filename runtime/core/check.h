// berth::Error and the one family of check macros.
//
// Library code reports every failure a user can act on by throwing berth::Error; `main` catches it,
// logs it with rank@host and aborts the job (MPI_Abort) so no peer hangs in a collective.
// Expected outcomes (end of data, lease refused, ...) are return values, never exceptions.
//
//   BERTH_CHECK(cond, fmt, args...)   throws Error("<message>"), where() = "check `cond` failed
//                                     at file:line" (main prints it only with BERTH_DEBUG=1: the
//                                     user reads what to do, a bug report gets the source line)
//   BERTH_FAIL(fmt, args...)          throws Error("<message>") unconditionally, where() =
//                                     "raised at file:line"
//
// Each macro evaluates its condition exactly once. Messages are fmt format strings and should say
// what to do ("seq_len (2048) > model.max_seq_len (1024): lower data.seq_len or raise ...").
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace berth {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string where = "")
      : std::runtime_error(message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }  // "" or the failed check and its line

 private:
  std::string where_;
};

// "rank 3@node07" once main has set it (set_identity), "rank ?@host" before.
const std::string& identity();
std::string host_name();  // this machine's host name ("unknown-host" if it cannot be read)
void set_identity(int rank, int world_size);
int identity_rank();  // -1 until set_identity

}  // namespace berth

#define BERTH_FAIL(...)                            \
  throw ::berth::Error(::fmt::format(__VA_ARGS__), \
                       ::fmt::format("raised at {}:{}", __FILE__, __LINE__))

// The same, throwing `Type` (a subclass of Error with Error's constructor) for callers that catch
// one kind of failure, e.g. DamagedCheckpoint.
#define BERTH_FAIL_AS(Type, ...) \
  throw Type(::fmt::format(__VA_ARGS__), ::fmt::format("raised at {}:{}", __FILE__, __LINE__))

#define BERTH_CHECK_AS(Type, cond, ...)                                                   \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      throw Type(::fmt::format(__VA_ARGS__),                                              \
                 ::fmt::format("check `{}` failed at {}:{}", #cond, __FILE__, __LINE__)); \
    }                                                                                     \
  } while (0)

#define BERTH_CHECK(cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      throw ::berth::Error(::fmt::format(__VA_ARGS__), ::fmt::format("check `{}` failed at {}:{}", \
                                                                     #cond, __FILE__, __LINE__));  \
    }                                                                                              \
  } while (0)
