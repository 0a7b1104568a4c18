#!/usr/bin/env bash
# A stop signal ends `berth train` at the next step with a checkpoint, its files committed and its
# lease given back (exit 6), and `--resume auto` continues (and, run again when the run is
# complete, has nothing to do: exit 0). A closed stdout does not kill it. A repeated SIGTERM does not stop the
# save it asked for; a second Ctrl-C ends the process at once. A second launch on a live run's
# directory is refused.
#   stop_signal.sh BERTH
set -u
berth=$1
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; umount "$tmp/full" 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/checks.sh"  # check NAME STATUS
# wait_saving RUN_DIR: until a checkpoint save is in progress there (at most 30 s)
wait_saving() {
  for _ in $(seq 300); do
    compgen -G "$1/checkpoints/step-*.tmp-*" > /dev/null && return 0
    sleep 0.1
  done
  return 1
}
# wait_lines FILE N: until FILE has N lines (at most 30 s)
wait_lines() {
  for _ in $(seq 300); do
    [ -f "$1" ] && [ "$(wc -l < "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

tiny_setup "$berth"
# 400 steps of at least 0.1 s each (debug.slow_rank): the signals land mid-run.
args=("${tiny[@]}" --set train.steps=400 --set debug.slow_rank=0 --set debug.slow_rank_s=0.1)
run="$tmp/runs/tiny"

# SIGTERM (Slurm's time limit, scancel) after a few steps.
"$berth" "${args[@]}" > "$tmp/term.log" 2>&1 &
pid=$!
wait_lines "$run/metrics.jsonl.partial" 3
# While it trains, a second launch on its run directory is refused, naming it.
"$berth" "${args[@]}" --set train.steps=5 --resume auto > "$tmp/second.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "the run directory $run is in use by another \`berth train\` (pid $pid on " \
  "$tmp/second.log"
check "a second launch on a live run's directory is refused, naming its pid (rc $rc)" $?
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=""
[ $rc -eq 6 ]
check "SIGTERM: exit 6 (rc $rc)" $?
step=$(sed -n 's/.*stopping before step \([0-9]*\): SIGTERM received; checkpoint step-\([0-9]*\) saved.*/\2/p' "$tmp/term.log")
[ -n "$step" ] && [ -f "$run/checkpoints/step-$step/meta.json" ]
check "SIGTERM: the stop is logged and its checkpoint (step ${step:-none}) is complete" $?
saved=$((10#${step:-0}))
[ -f "$run/metrics.jsonl" ] && [ "$(wc -l < "$run/metrics.jsonl")" -eq "$saved" ] &&
  [ ! -e "$run/metrics.jsonl.partial" ] && [ -f "$run/trace.csv" ]
check "SIGTERM: metrics.jsonl ($saved steps) and trace.csv are committed" $?
# The stop's save is the last step's (its time in that row of the trace and of metrics.jsonl, as
# a periodic save's, so the steps still tile the session), and that step's block is logged.
last=$(tail -n 1 "$run/trace.csv" 2>/dev/null)
[ "${last%%,*}" = "$saved" ] && [[ "${last##*,}" == *ckpt* ]] &&
  echo "$last" | awk -F, '{ exit !($8 > 0) }' && grep -q "\[progress\] step $saved/400 " "$tmp/term.log" &&
  tail -n 1 "$run/metrics.jsonl" | grep -q '"event":"ckpt'
check "SIGTERM: the stop's save is in step $saved's trace row ('$last') and its block is logged" $?

"$berth" "${args[@]}" --set train.steps=$((saved + 2)) --set debug.slow_rank=-1 --set debug.slow_rank_s=0 --resume auto \
  > "$tmp/resume.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "at step $saved" "$tmp/resume.log" &&
  [ "$(wc -l < "$run/metrics.jsonl")" -eq $((saved + 2)) ]
check "resume auto continues from step $saved to the end (rc $rc)" $?

# A requeue of the finished run (a batch job run again under the same run.name, as Slurm requeues
# it): nothing is left to train, exit 0, its files as they were. A checkpoint named by path asks
# to train on from it: refused, saying how.
cp "$run/metrics.jsonl" "$tmp/metrics.before"
"$berth" "${args[@]}" --set train.steps=$((saved + 2)) --resume auto > "$tmp/requeue.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "nothing to train: the run is complete" "$tmp/requeue.log" &&
  cmp -s "$run/metrics.jsonl" "$tmp/metrics.before"
check "a requeue of the finished run has nothing to train: exit 0, its files kept (rc $rc)" $?
# Killed after its last save and before it committed metrics.jsonl (as a SIGKILL there leaves
# it: the earlier session's metrics.jsonl, this one's records in metrics.jsonl.partial, the last
# step's not yet): the requeue that finds the run complete says where the records are and which
# one is lost, and changes nothing.
head -n -1 "$tmp/metrics.before" > "$run/metrics.jsonl.partial"
head -n "$saved" "$tmp/metrics.before" > "$run/metrics.jsonl"
cp "$run/metrics.jsonl" "$tmp/metrics.earlier"
"$berth" "${args[@]}" --set train.steps=$((saved + 2)) --resume auto > "$tmp/requeue2.log" 2>&1
rc=$?
[ $rc -eq 0 ] && cmp -s "$run/metrics.jsonl" "$tmp/metrics.earlier" &&
  [ -e "$run/metrics.jsonl.partial" ] &&
  grep -q "metrics.jsonl ends at step $saved (the run was killed after its last save, step $((saved + 2))" "$tmp/requeue2.log" &&
  grep -q "metrics.jsonl.partial holds the records up to step $((saved + 1)) (steps $((saved + 2)) are lost); copy its lines up to step $((saved + 2))" "$tmp/requeue2.log"
check "a requeue of a run killed before its metrics commit says where its records are (rc $rc)" $?
rm "$run/metrics.jsonl.partial"
cp "$tmp/metrics.before" "$run/metrics.jsonl"
last_ckpt=$(ls -d "$run"/checkpoints/step-* | tail -n 1)
"$berth" "${args[@]}" --set train.steps=$((saved + 2)) --resume "$last_ckpt" > "$tmp/reuse.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "which already reaches train.steps = $((saved + 2)); raise" "$tmp/reuse.log"
check "--resume of the last checkpoint by path asks to raise train.steps (rc $rc)" $?

# Piped into a reader that went away (tee ended by the same Ctrl-C): the closed pipe does not kill
# the run (SIGPIPE, exit 141, no checkpoint); the signal still stops it with one.
"$berth" "${args[@]}" --set run.name=piped --set train.log_interval=1 \
  > >(head -n 1 > /dev/null) 2>&1 &
pid=$!
wait_lines "$tmp/runs/piped/metrics.jsonl.partial" 4
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=""
[ $rc -eq 6 ] && [ -n "$(ls "$tmp/runs/piped/checkpoints" | grep -v '\.tmp-')" ] &&
  [ -f "$tmp/runs/piped/metrics.jsonl" ]
check "a closed stdout does not kill the run: SIGTERM saves and exits 6 (rc $rc)" $?

# A signal while the last step's checkpoint is saved finds the run complete: exit 0, said so.
"$berth" "${args[@]}" --set run.name=last --set train.steps=3 --set debug.slow_rank=-1 \
  --set debug.slow_rank_s=0 --set debug.checkpoint_pause_s=3 > "$tmp/last.log" 2>&1 &
pid=$!
wait_saving "$tmp/runs/last"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=""
[ $rc -eq 0 ] && grep -q "SIGTERM received after the last step started: the run is complete" \
  "$tmp/last.log" && [ -f "$tmp/runs/last/checkpoints/step-00000003/meta.json" ]
check "a signal during the last save: the run is complete, exit 0 (rc $rc)" $?

# The checkpoint a signal asks for fails (checkpoint.dir on a full disk): the error names the
# signal and where --resume auto continues (only the save's error was logged). Needs root (tmpfs).
if [ "$(id -u)" -eq 0 ] && mkdir -p "$tmp/full" && mount -t tmpfs -o size=64k tmpfs "$tmp/full" 2>/dev/null; then
  "$berth" "${args[@]}" --set run.name=full --set checkpoint.dir="$tmp/full" \
    --set checkpoint.interval=0 > "$tmp/full.log" 2>&1 &
  pid=$!
  wait_lines "$tmp/runs/full/metrics.jsonl.partial" 3
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  pid=""
  umount "$tmp/full"
  # (checkpoint.interval = 0: no checkpoint before it, and the error says so)
  [ $rc -eq 1 ] && grep -q "SIGTERM received, and the checkpoint it saves failed: .*No space left" \
    "$tmp/full.log" && grep -q "This session saved no checkpoint" "$tmp/full.log"
  check "a signal whose checkpoint fails on a full disk names the signal (rc $rc)" $?
else
  echo "skip: a signal whose checkpoint fails on a full disk (needs root and mount -t tmpfs)"
fi

# Under a lease (SIGINT, Ctrl-C): the lease is given back, so the same booking trains again at
# once instead of being refused as held by a dead process. (Job control on, as in a terminal: a
# background job of a script ignores SIGINT, and berth leaves an ignored signal ignored.)
export BERTH_LEDGER="$tmp/ledger.db"
"$berth" devices register --cpu-slots 1 >/dev/null 2>&1
id=$("$berth" reserve --gpus 1 --duration 30m --print-id 2>"$tmp/reserve.log")
set -m
"$berth" "${args[@]}" --set run.name=leased --reservation "$id" > "$tmp/int.log" 2>&1 &
pid=$!
set +m
wait_lines "$tmp/runs/leased/metrics.jsonl.partial" 2
kill -INT "$pid"
wait "$pid"
rc=$?
pid=""
[ $rc -eq 6 ] && grep -q "SIGINT received" "$tmp/int.log"
check "SIGINT under a lease: exit 6 (rc $rc)" $?
saved=$(sed -n 's/.*SIGINT received; checkpoint step-\([0-9]*\) saved.*/\1/p' "$tmp/int.log")
saved=$((10#${saved:-0}))
timeout 60 "$berth" "${args[@]}" --set run.name=leased --reservation "$id" --resume auto \
  --set train.steps=$((saved + 2)) --set debug.slow_rank=-1 --set debug.slow_rank_s=0 \
  > "$tmp/again.log" 2>&1
rc=$?
[ $rc -eq 0 ]
check "the lease was given back: the same booking trains again at once (rc $rc)" $?

# SIGTERM twice (Slurm signals every task and the launcher, which forwards it again): the second
# does not kill the checkpoint the first asked for.
"$berth" "${args[@]}" --set run.name=twice --set debug.checkpoint_pause_s=3 > "$tmp/twice.log" 2>&1 &
pid=$!
wait_lines "$tmp/runs/twice/metrics.jsonl.partial" 2
kill -TERM "$pid"
wait_saving "$tmp/runs/twice"
saving=$?
kill -TERM "$pid"
# (the save pauses 3 s: it is still a temporary when the second signal has been sent)
compgen -G "$tmp/runs/twice/checkpoints/step-*.tmp-*" > /dev/null
still=$?
[ $saving -eq 0 ] && [ $still -eq 0 ]
check "the second SIGTERM came while the first one's save was in progress" $?
wait "$pid"
rc=$?
pid=""
[ $rc -eq 6 ] && [ -n "$(ls "$tmp/runs/twice/checkpoints" | grep -v '\.tmp-')" ]
check "a repeated SIGTERM is ignored: the checkpoint completes, exit 6 (rc $rc)" $?

# A second Ctrl-C while the first one's checkpoint is being saved ends the process at once, as it
# would without berth, and leaves no checkpoint half-written.
set -m
"$berth" "${args[@]}" --set run.name=ctrlc --set debug.checkpoint_pause_s=20 > "$tmp/ctrlc.log" 2>&1 &
pid=$!
set +m
wait_lines "$tmp/runs/ctrlc/metrics.jsonl.partial" 2
kill -INT "$pid"
wait_saving "$tmp/runs/ctrlc"
start=$(date +%s)
kill -INT "$pid"
wait "$pid"
rc=$?
pid=""
[ $rc -eq 130 ] && [ $(( $(date +%s) - start )) -lt 10 ] &&
  [ -z "$(ls "$tmp/runs/ctrlc/checkpoints" | grep -v '\.tmp-')" ]
check "a second Ctrl-C ends it at once (rc $rc), no complete checkpoint" $?

[ $fail -ne 0 ] && cat "$tmp/term.log" "$tmp/second.log" "$tmp/resume.log" "$tmp/requeue.log" \
  "$tmp/reuse.log" "$tmp/last.log" "$tmp/int.log" "$tmp/again.log" "$tmp/twice.log" "$tmp/ctrlc.log"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
