// Stopping a training run on a signal, with a checkpoint. While a StopSignals lives, SIGTERM
// (Slurm's time limit and scancel, a batch system's preemption), SIGINT (Ctrl-C) and SIGUSR1
// (`sbatch --signal=USR1@300`, or `kill -USR1` to mpirun, which forwards it) only set a flag:
// the trainer reads it before every step (agreed by all ranks: one of them receiving it stops
// them all), saves a checkpoint, commits its files, releases the lease and exits 6. A second
// Ctrl-C ends the process at once, as it would have without berth; repeated SIGTERM or SIGUSR1
// (Slurm and launchers send them more than once) are ignored. A signal the process inherited as
// ignored stays ignored. Like Megatron-LM's --exit-signal-handler or Lightning's SLURM
// auto-requeue.
//
// While one lives SIGPIPE is ignored too: a run piped into `tee` whose tee a Ctrl-C ended first
// would otherwise be killed by its next log line, before the checkpoint the Ctrl-C asked for; its
// writes to the closed pipe fail instead, and it saves and exits 6.
//
// They nest: `berth train` installs them before it loads the config (a signal during start-up,
// which can take seconds, stops the run before its first step, exit 6, instead of killing it),
// and the trainer's own, inside, changes nothing and keeps what was received.
#pragma once

namespace berth {

class StopSignals {
 public:
  StopSignals();   // installs the handlers (the previous ones are kept); nested: nothing
  ~StopSignals();  // puts the previous handlers back (the outermost one)
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal received while installed (SIGTERM, SIGINT, SIGUSR1), or 0.
  static int received();
  // "SIGTERM", "SIGINT", "SIGUSR1" (or "a signal").
  static const char* name(int signum);
};

}  // namespace berth
