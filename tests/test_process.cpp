// Other processes of this host (runtime/core/process.h): what a lease relaunch and the checkpoint
// cleaner take for a process that is gone.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/core/process.h"

namespace berth {
namespace {

TEST(Process, StateIsReadPastAnyParenthesesInTheName) {
  EXPECT_EQ(process_state("4242 (berth) S 1 4242 4242 0 -1"), 'S');
  EXPECT_EQ(process_state("4242 (a (b) c) Z 1 4242"), 'Z');
  EXPECT_EQ(process_state("4242 (x) ) R 1"), 'R');
  EXPECT_EQ(process_state(""), '\0');
  EXPECT_EQ(process_state("4242 (berth)"), '\0');
}

TEST(Process, AZombieIsNotRunningAndNeitherIsAReapedOne) {
  EXPECT_TRUE(process_running(::getpid()));
  EXPECT_FALSE(process_running(0));
  EXPECT_FALSE(process_running(-5));
  EXPECT_TRUE(process_running(int64_t{1} << 40)) << "beyond pid_t: taken as running (safe side)";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();  // until killed
    ::_exit(0);
  }
  EXPECT_TRUE(process_running(child));
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  // killed, not yet reaped (waitid with WNOWAIT waits for its end and leaves it a zombie)
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT), 0);
  EXPECT_FALSE(process_running(child)) << "a SIGKILLed child not yet reaped read as running";
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(process_running(child));
}

}  // namespace
}  // namespace berth
