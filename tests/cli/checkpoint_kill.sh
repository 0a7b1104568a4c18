#!/usr/bin/env bash
# kill -9 during a checkpoint save: the next `--resume auto` uses the previous complete
# checkpoint, removes the partial one, and training continues to the end.
#   checkpoint_kill.sh BERTH
set -u
berth=$1
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/checks.sh"  # check NAME STATUS

tiny_setup "$berth"
args=("${tiny[@]}" --set train.steps=6 --set checkpoint.interval=2 --set parallel.zero=0)
ck="$tmp/runs/tiny/checkpoints"

# Every save pauses 2 s before its commit; kill while the step-4 save is paused.
"$berth" "${args[@]}" --set debug.checkpoint_pause_s=2 > "$tmp/first.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  if [ -f "$ck/step-00000002/meta.json" ] && compgen -G "$ck/step-00000004.tmp-*" > /dev/null; then
    break
  fi
  sleep 0.1
done
compgen -G "$ck/step-00000004.tmp-*" > /dev/null
check "the step-4 save is in progress" $?
kill -9 "$pid"
wait "$pid" 2>/dev/null
pid=""
[ ! -e "$ck/step-00000004" ]
check "no step-4 checkpoint after kill -9" $?

"$berth" "${args[@]}" --resume auto > "$tmp/second.log" 2>&1
check "resume auto exits 0" $?
grep -q "resumed from $ck/step-00000002 at step 2" "$tmp/second.log"
check "resume auto used the previous complete checkpoint (step 2)" $?
grep -q "removed 1 incomplete checkpoint" "$tmp/second.log"
check "the partial checkpoint was cleaned up" $?
grep -q "device cpu, fp32 GEMMs, attention through its probabilities (BLAS)" "$tmp/second.log"
check "the log says how the GEMMs and the attention run" $?
! compgen -G "$ck/*.tmp-*" > /dev/null
check "no temporary checkpoint directory left" $?
[ -f "$ck/step-00000006/meta.json" ]
check "training continued to the final checkpoint (step 6)" $?
[ "$(wc -l < "$tmp/runs/tiny/metrics.jsonl")" = "6" ]
check "metrics.jsonl holds steps 1..6" $?

# A newer step directory without meta.json (emptied or partly copied by hand) is passed by, and
# --resume auto says so instead of silently going back past it.
mkdir "$ck/step-00000008"
"$berth" "${args[@]}" --set train.steps=7 --resume auto > "$tmp/third.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "resume auto: $ck/step-00000008 has no meta.json .* passed by; resuming from the newest complete one, $ck/step-00000006" "$tmp/third.log"
check "resume auto names a newer step directory without meta.json it passes by (rc $rc)" $?

# One where this run would save is refused before a resume is announced, saying what to move.
"$berth" "${args[@]}" --set train.steps=8 --resume auto > "$tmp/fourth.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "step-00000008 has no meta.json .* would save there at step 8: move it out of $ck and launch again with --resume auto (the newest complete one is $ck/step-00000007)" "$tmp/fourth.log" && ! grep -q "resumed from" "$tmp/fourth.log"
check "resume auto refuses a step directory without meta.json where it would save (rc $rc)" $?

# A damaged newest checkpoint: the error says to move it out and resume auto, and doing so works
# (an older one named by --resume PATH is refused while the later one is there).
rmdir "$ck/step-00000008"
rm "$ck/step-00000007/optimizer.h5"
"$berth" "${args[@]}" --set train.steps=8 --resume auto > "$tmp/fifth.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "optimizer.h5' is missing.*move $ck/step-00000007 out of $ck, then launch again with --resume auto" "$tmp/fifth.log"
check "a damaged checkpoint's error says to move it out and resume auto (rc $rc)" $?
mv "$ck/step-00000007" "$tmp/damaged-step-7"
"$berth" "${args[@]}" --set train.steps=8 --resume auto > "$tmp/sixth.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "resumed from $ck/step-00000006 at step 6" "$tmp/sixth.log" && [ -f "$ck/step-00000008/meta.json" ]
check "after moving it out, resume auto continues from the checkpoint before it (rc $rc)" $?

[ $fail -ne 0 ] && cat "$tmp/first.log" "$tmp/second.log" "$tmp/third.log" "$tmp/fourth.log" \
  "$tmp/fifth.log" "$tmp/sixth.log"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
