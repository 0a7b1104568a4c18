#!/usr/bin/env bash
# The reservation flow with real processes (ctest label "mpi"): register CPU slots, book, train
# under the lease; the window ends mid-run (checkpoint, exit 3) and the run resumes in the next
# window with the same losses as an uninterrupted run; a run extended while it trains, as its
# window warning says, finishes and stops warning; a second launch fails fast naming the
# holder; a save that outlasts the window still stops the run with its checkpoint, unless a later
# booking's launch took its run directory over meanwhile; a SIGKILLed
# holder's lease lapses and a relaunch gets a higher token; a holder SIGSTOPped
# inside a checkpoint save past its TTL has its late commit refused, and one stopped between steps
# leaves the new holder's run directory alone; bad requests exit 1, a booking that cannot start
# when asked exits 2.
#   reservation_flow.sh BERTH MPIEXEC
set -u
berth=$1
mpiexec=$2
tmp=$(mktemp -d)
pids=()
trap 'kill -9 "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/checks.sh"  # check NAME STATUS
export BERTH_LEDGER="$tmp/ledger.db"
mpi=("$mpiexec" --oversubscribe --allow-run-as-root --bind-to none)
booked_id() { python3 -c "import json,sys; print(json.load(sys.stdin)['reservations'][0]['id'])"; }
# stop_between_writes PID: SIGSTOPs PID where it holds no ledger write lock. Its heartbeat renews
# the lease in a short write transaction every TTL/3; frozen inside one, it would keep the lock for
# good and the successor a scenario launches would fail with "database is locked", which is not
# what these scenarios test. So: stop, probe the lock, and if it is held resume briefly and retry.
stop_between_writes() {
  local pid=$1
  for _ in $(seq 50); do
    kill -STOP "$pid"
    python3 - "$BERTH_LEDGER" <<'PY' && return 0
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=0.2, isolation_level=None)
c.execute("BEGIN IMMEDIATE")
c.execute("ROLLBACK")
PY
    kill -CONT "$pid"
    sleep 0.05
  done
  echo "stop_between_writes: pid $pid held the ledger's write lock 50 times" >&2
  return 1
}

printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 60) > "$tmp/a.txt"
"$berth" data import --format text "$tmp/a.txt" --out "$tmp/d.h5" >/dev/null
cfg="$(dirname "$0")/../../configs/tiny.toml"
# ~12 ms per step (10 ms injected on rank 0), so windows of seconds hold hundreds of steps.
small=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.max_seq_len=16
       --set data.seq_len=16 --set train.micro_batch_size=2 --set eval.interval=0 --set data.val=
       --set "data.train=$tmp/d.h5" --set train.log_interval=100 --set progress.interval=100
       --set debug.slow_rank=0 --set debug.slow_rank_s=0.01 --set reservation.lease_ttl_s=3
       --set reservation.stop_margin_s=1 --set reservation.checkpoint_estimate_s=0.5)

"$berth" devices register --cpu-slots 2 > "$tmp/reg.log" 2>&1
check "devices register --cpu-slots 2" $?

# ---- two processes opening a new ledger at once (two jobs' first `devices register`): SQLite
# refused one's switch to WAL mode at once, "database is locked" (5 of 20 pairs) ----------------
failed=0
for i in $(seq 10); do
  "$berth" devices register --cpu-slots 1 --ledger "$tmp/race$i.db" > "$tmp/race_a.log" 2>&1 &
  a=$!
  "$berth" devices register --cpu-slots 1 --ledger "$tmp/race$i.db" > "$tmp/race_b.log" 2>&1 &
  b=$!
  wait $a || { failed=$((failed + 1)); cat "$tmp/race_a.log"; }
  wait $b || { failed=$((failed + 1)); cat "$tmp/race_b.log"; }
done
[ $failed -eq 0 ]
check "two processes registering on a new ledger at once both succeed (10 pairs)" $?

# ---- the end a booking shows can be booked: windows are whole seconds (an earliest start of
# 12:40:42.43 showed as 12:40:42, and --start at the shown end was refused forever) -------------
sec=(--ledger "$tmp/seconds.db")
"$berth" devices register --cpu-slots 1 "${sec[@]}" > /dev/null 2>&1
end=$("$berth" reserve --gpus 1 --duration 1h --json "${sec[@]}" 2> "$tmp/sec.log" |
      python3 -c "import json,sys; print(json.load(sys.stdin)['reservations'][0]['end'])")
"$berth" reserve --gpus 1 --duration 1h --start "$end" "${sec[@]}" >> "$tmp/sec.log" 2>&1
check "a booking at the end another booking shows succeeds" $?

# ---- bad requests, and a booking that cannot start when asked ----------------------------------
"$berth" reserve --gpus 0 --duration 1h > "$tmp/bad1.log" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q -- "--gpus must be between 1 and 4096, got 0" "$tmp/bad1.log"
check "reserve --gpus 0 exits 1 with a specific error" $?
"$berth" reserve --gpus 1 --duration 1h --priority P9 > "$tmp/bad2.log" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "use P0 (highest)" "$tmp/bad2.log"
check "reserve --priority P9 exits 1" $?
"$berth" reserve --gpus 1 --duration 1h --start 2020-01-01T00:00Z > "$tmp/bad3.log" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "is in the past" "$tmp/bad3.log"
check "reserve --start in the past exits 1" $?
"$berth" reserve --gpus 1 --duration 1h --start tomorrow > "$tmp/bad4.log" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "cannot read the time 'tomorrow'" "$tmp/bad4.log"
check "reserve --start tomorrow exits 1" $?
later=$(date -u -d '+2 hours' +%Y-%m-%dT%H:%M:%SZ)
"$berth" reserve --gpus 2 --duration 1h --start "$later" --name later > "$tmp/later.log" 2>&1
check "book 2 slots in two hours" $?
"$berth" reserve --gpus 1 --duration 2h --start "$(date -u -d '+90 minutes' +%Y-%m-%dT%H:%M:%SZ)" \
    > "$tmp/conflict.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "earliest feasible start" "$tmp/conflict.log" && grep -q "blocked by reservation 1" "$tmp/conflict.log"
check "an overlapping request exits 2 with the earliest start and the blocker (rc $rc)" $?
# The same refusal in JSON says what to pass as --start: here the fixed start (a start that moves
# with the clock, a running holder's notice, says "earliest": test_ledger checks which is which).
"$berth" reserve --gpus 1 --duration 2h --start "$(date -u -d '+90 minutes' +%Y-%m-%dT%H:%M:%SZ)" \
    --json > "$tmp/conflict.json" 2> "$tmp/conflict_json.log"; rc=$?
[ $rc -eq 2 ] && python3 - "$tmp/conflict.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert not j["booked"] and j["earliest_moves"] is False, j
assert j["book_with_start"] == j["earliest_start"], j
assert [b["reservation"] for b in j["blockers"]] == [1], j
PY
check "the refusal in JSON names the --start to book with (rc $rc)" $?
"$berth" timeline --hours 4 --html "$tmp/t.html" > "$tmp/timeline.log" 2>&1 && grep -q "<svg" "$tmp/t.html" \
    && grep -q "vm\|$(hostname)" "$tmp/timeline.log"
check "timeline prints devices and writes an HTML/SVG page" $?

# ---- window end mid-run, then resume in the next window: same losses as uninterrupted ----------
timeout 120 "${mpi[@]}" -np 2 "$berth" train "$cfg" "${small[@]}" --set train.steps=700 \
    --set "run.out_dir=$tmp/ref" > "$tmp/ref.log" 2>&1
check "reference run without a lease" $?
# 700 steps of ~21 ms (~15 s) in a 14 s window, stopping 1.5 × 0.5 + 3.5 s before its end: the
# run stops at ~10 s (step ~470). The margin is wide because this scenario tests the stop, not
# its precision: on a noisy machine a stall of seconds between two steps near the end would let
# the window close first (the lease is then lost, nothing saved: exit 4), as would a launch slower
# than the window. The extra 10 ms a step sleeps does not change the losses.
inwin=(--set debug.slow_rank_s=0.02 --set reservation.stop_margin_s=3.5)
id=$("$berth" reserve --gpus 2 --duration 14s --json | booked_id)
timeout 120 "${mpi[@]}" -np 2 "$berth" train "$cfg" "${small[@]}" "${inwin[@]}" --set train.steps=700 \
    --set "run.out_dir=$tmp/w" --reservation "$id" > "$tmp/w1.log" 2>&1; rc=$?
[ $rc -eq 3 ] && grep -q "stopping before step" "$tmp/w1.log"
check "the window ends mid-run: checkpoint and exit 3 (rc $rc)" $?
ls -d "$tmp"/w/tiny/checkpoints/step-* > /dev/null 2>&1 && [ "$(cat "$tmp/w/tiny/checkpoints/FENCE")" -ge 1 ]
check "the stop left a checkpoint committed with the fencing token" $?
id2=$("$berth" reserve --gpus 2 --duration 10m --json | booked_id)
timeout 120 "${mpi[@]}" -np 2 "$berth" train "$cfg" "${small[@]}" "${inwin[@]}" --set train.steps=700 \
    --set "run.out_dir=$tmp/w" --reservation "$id2" --resume auto > "$tmp/w2.log" 2>&1
check "resume in the next window exits 0" $?
python3 - "$tmp/ref/tiny/metrics.jsonl" "$tmp/w/tiny/metrics.jsonl" <<'EOF'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
sys.exit(0 if len(a) == len(b) == 700 and a == b else 1)
EOF
check "700 losses identical to the uninterrupted run" $?
"$berth" cancel "$id2" > /dev/null && "$berth" reservation show "$id2" | grep -q "| cancelled |"
check "the finished run's booking is cancelled by its owner" $?

# ---- the window warning names `berth extend`; running it mid-run moves the window --------------
# The run needs ~25 s of a 12 s window: the first progress block warns with the command; the user
# runs it, the lease keeper sees the new window at its next renewal, the run finishes (exit 0), and
# the blocks after that carry no window warning; run_facts.json holds the lease as extended.
idx=$("$berth" reserve --gpus 2 --duration 12s --json | booked_id)
timeout 120 "${mpi[@]}" -np 2 "$berth" train "$cfg" "${small[@]}" --set train.steps=2000 \
    --set "run.out_dir=$tmp/x" --reservation "$idx" > "$tmp/x.log" 2>&1 &
trainer=$!; pids+=("$trainer")
for _ in $(seq 100); do grep -q "berth extend $idx --by" "$tmp/x.log" && break; sleep 0.1; done
"$berth" extend "$idx" --by 10m > "$tmp/x_extend.log" 2>&1
check "berth extend, as the window warning says, while the run trains" $?
wait "$trainer"; rc=$?
[ $rc -eq 0 ] && grep -q "reservation $idx's window now ends at .* (extended)" "$tmp/x.log"
check "the extended run finishes instead of stopping at the old window (rc $rc)" $?
python3 - "$tmp/x/tiny/metrics.jsonl" "$tmp/x/tiny/run_facts.json" <<'PY'
import json, sys
blocks = [j for j in map(json.loads, open(sys.argv[1])) if "predicted_total_s" in j]
window = ["window" in j.get("warnings", []) for j in blocks]
lease_s = json.load(open(sys.argv[2]))["lease_s"]
# Blocks every 100 steps: the first warns, the extension lands within a second (~80 steps).
sys.exit(0 if len(blocks) == 20 and window[0] and not any(window[5:]) and lease_s > 600 else 1)
PY
check "the window warning stops once the window is extended; run_facts.json has the new lease" $?
"$berth" cancel "$idx" > /dev/null 2>&1

# A cancelled booking is refused as cancelled, even by a launch that does not match its devices
# (2 ranks, 1 booked): the lease is checked before the placement.
idc=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
"$berth" cancel "$idc" > /dev/null
timeout 60 "${mpi[@]}" -np 2 "$berth" train "$cfg" "${small[@]}" --set train.steps=5 \
    --set "run.out_dir=$tmp/c" --reservation "$idc" > "$tmp/c.log" 2>&1; rc=$?
[ $rc -eq 4 ] && grep -q "reservation $idc is cancelled" "$tmp/c.log" && [ ! -e "$tmp/c" ]
check "a cancelled booking is refused as cancelled before the placement check (rc $rc)" $?
# A placement refusal gives the lease back at once: a matching launch takes it right after.
idp=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
timeout 60 "${mpi[@]}" -np 2 "$berth" train "$cfg" "${small[@]}" --set train.steps=5 \
    --set "run.out_dir=$tmp/p" --reservation "$idp" > "$tmp/p1.log" 2>&1; rc=$?
[ $rc -eq 4 ] && grep -q "launch on the booked hosts" "$tmp/p1.log" &&
  "$berth" reservation show "$idp" | grep -q "released" &&
  timeout 60 "$berth" train "$cfg" "${small[@]}" --set train.steps=5 --set "run.out_dir=$tmp/p" \
    --reservation "$idp" > "$tmp/p2.log" 2>&1
check "a placement refusal (rc $rc) releases the lease; one rank then trains under it" $?
"$berth" cancel "$idp" > /dev/null

# A CPU slot's free memory is checked when the lease is taken (rule 5): a slot registered as huge
# and booked near its size is refused on this host, naming both figures, and the lease given back.
mem=(--ledger "$tmp/mem.db")
"$berth" devices register --cpu-slots 1 --slot-memory-gib 100000 "${mem[@]}" > /dev/null 2>&1
idm=$("$berth" reserve --gpus 1 --duration 10m --min-free-mem 90000GiB --json "${mem[@]}" |
      booked_id)
BERTH_LEDGER="$tmp/mem.db" timeout 60 "$berth" train "$cfg" "${small[@]}" --set train.steps=5 \
    --set "run.out_dir=$tmp/m" --reservation "$idm" > "$tmp/m.log" 2>&1; rc=$?
[ $rc -eq 4 ] && grep -q "GiB free, reservation $idm needs 90000.0 GiB per device" "$tmp/m.log" &&
  [ ! -e "$tmp/m" ] && "$berth" reservation show "$idm" "${mem[@]}" | grep -q "released"
check "a CPU slot without the booked free memory is refused at start, the lease given back (rc $rc)" $?

# ---- double start; SIGKILLed holder -------------------------------------------------------------
id3=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
# (a TTL of 10 s here: the relaunch below must reach its lease before the killed holder's lapses)
one=(train "$cfg" "${small[@]}" --set train.steps=100000 --reservation "$id3"
     --set reservation.lease_ttl_s=10)
"$berth" "${one[@]}" --set "run.out_dir=$tmp/k1" > "$tmp/k1.log" 2>&1 &
holder=$!; pids+=("$holder")
for _ in $(seq 100); do grep -q "fencing token" "$tmp/k1.log" && break; sleep 0.1; done
start=$(date +%s)
"$berth" "${one[@]}" --set "run.out_dir=$tmp/k2" > "$tmp/k2.log" 2>&1; rc=$?
# (within 5 s of grace for a holder of this host to end, plus the start-up)
[ $rc -eq 4 ] && [ $(( $(date +%s) - start )) -le 20 ] && grep -q "already held by pid $holder on" "$tmp/k2.log"
check "a second launch fails fast naming the holder's pid and host (rc $rc)" $?
kill -9 "$holder"; wait "$holder" 2>/dev/null
token1=$(sed -n 's/.*fencing token \([0-9]*\).*/\1/p' "$tmp/k1.log" | head -1)
# (at once, as a requeued job relaunches: the holder's process is gone from this host, so the
# relaunch waits for its lease to lapse, at most its lease_ttl_s = 10 s, instead of failing)
start=$(date +%s)
timeout 60 "$berth" train "$cfg" "${small[@]}" --set train.steps=20 --reservation "$id3" \
    --set "run.out_dir=$tmp/k3" > "$tmp/k3.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "held by pid $holder of this host .*, which is no longer running" "$tmp/k3.log" &&
  [ $(( $(date +%s) - start )) -le 30 ]
check "a relaunch at once after SIGKILL waits for the dead holder's lease to lapse, and trains (rc $rc)" $?
token2=$(sed -n 's/.*fencing token \([0-9]*\).*/\1/p' "$tmp/k3.log" | head -1)
[ -n "$token1" ] && [ -n "$token2" ] && [ "$token2" -gt "$token1" ]
check "the relaunch got a higher fencing token ($token1 -> $token2)" $?
"$berth" reservation show "$id3" | grep -q "| active |"
check "the booking survived the killed holder" $?
# A holder that stopped renewing shows as lapsed, not "until" a time already past.
id4=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
"$berth" train "$cfg" "${small[@]}" --set train.steps=100000 --reservation "$id4" \
    --set reservation.lease_ttl_s=1 --set "run.out_dir=$tmp/k4" > "$tmp/k4.log" 2>&1 &
h4=$!; pids+=("$h4")
for _ in $(seq 100); do grep -q "fencing token" "$tmp/k4.log" && break; sleep 0.1; done
"$berth" reservation show "$id4" | grep -q "pid $h4 on .*, until "; held=$?
kill -9 "$h4"; wait "$h4" 2>/dev/null; sleep 1.5
"$berth" reservation show "$id4" | grep -q "pid $h4 on .*, not renewed: lapsed at "; lapsed=$?
"$berth" reservation show "$id4" --json |
  python3 -c 'import json,sys; l=json.load(sys.stdin)["lease"]; assert l["lapsed"] and not l["released"]'
json=$?
[ $held -eq 0 ] && [ $lapsed -eq 0 ] && [ $json -eq 0 ]
check "reservation show says a killed holder's lease lapsed (held $held, lapsed $lapsed, json $json)" $?
"$berth" cancel "$id4" > /dev/null 2>&1

# ---- SIGSTOPped holder past its TTL: its late checkpoint commit is refused -----------------------
"$berth" cancel "$id3" > /dev/null
id4=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
ck="$tmp/stop/checkpoints"
"$berth" train "$cfg" "${small[@]}" --set train.steps=100000 --reservation "$id4" \
    --set "checkpoint.dir=$ck" --set checkpoint.interval=30 --set debug.checkpoint_pause_s=2 \
    --set "run.out_dir=$tmp/s1" > "$tmp/s1.log" 2>&1 &
stale=$!; pids+=("$stale")
for _ in $(seq 200); do ls -d "$ck"/step-*.tmp-* > /dev/null 2>&1 && break; sleep 0.05; done
stop_between_writes "$stale"  # frozen inside its first save, before the commit
sleep 3.5            # past its TTL
timeout 60 "$berth" train "$cfg" "${small[@]}" --set train.steps=40 --reservation "$id4" \
    --set "checkpoint.dir=$ck" --set checkpoint.interval=0 --set "run.out_dir=$tmp/s2" \
    > "$tmp/s2.log" 2>&1
check "a new holder takes the lapsed lease and commits its checkpoint" $?
kill -CONT "$stale"
wait "$stale"; rc=$?
[ $rc -ne 0 ] && grep -q "checkpoint commit refused" "$tmp/s1.log"
check "the stale holder's late commit is refused (rc $rc)" $?
[ ! -e "$ck/step-00000030" ] && [ -e "$ck/step-00000040" ]
check "only the new holder's checkpoint is in the directory" $?

# take_over NAME MARK RUN_DIR: runs `berth "${holder[@]}"` in the background (log $tmp/NAME1.log),
# SIGSTOPs it once its log shows MARK, lets its TTL pass, runs `berth "${successor[@]}"` (log
# $tmp/NAME2.log) to the end, then resumes the holder and waits for it. Sets `sums` (RUN_DIR's
# metrics.jsonl and trace.csv as the successor left them) and `rc` (the holder's exit status).
take_over() {
  local name=$1 mark=$2 dir=$3
  "$berth" "${holder[@]}" > "$tmp/${name}1.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 400); do grep -q "$mark" "$tmp/${name}1.log" && break; sleep 0.02; done
  stop_between_writes "$pid"
  sleep 3.5  # past its TTL
  timeout 60 "$berth" "${successor[@]}" > "$tmp/${name}2.log" 2>&1
  check "a new holder takes the lease over and trains in the same run directory ($name)" $?
  sums=$(md5sum "$dir/metrics.jsonl" "$dir/trace.csv" 2>&1)
  kill -CONT "$pid"
  wait "$pid"
  rc=$?
}

# ---- a holder SIGSTOPped between steps past its TTL leaves the new holder's run directory alone --
"$berth" cancel "$id4" > /dev/null 2>&1
id6=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
zrun=(train "$cfg" "${small[@]}" --reservation "$id6" --set "run.out_dir=$tmp/z" --set run.name=z
      --set checkpoint.interval=0)
holder=("${zrun[@]}" --set train.steps=100000)
successor=("${zrun[@]}" --set train.steps=30)
take_over z "step   101/" "$tmp/z/z"
[ $rc -eq 4 ] && grep -q "the lease is lost (the lease of reservation $id6 is now held with token" \
    "$tmp/z1.log" && grep -q "is left as it is" "$tmp/z1.log" &&
    [ "$(md5sum "$tmp/z/z/metrics.jsonl" "$tmp/z/z/trace.csv" 2>&1)" = "$sums" ] &&
    [ "$(wc -l < "$tmp/z/z/metrics.jsonl")" -eq 30 ] && ! grep -q "released" "$tmp/z1.log"
check "the fenced-out holder exits 4 and leaves the new holder's metrics and trace (rc $rc)" $?
"$berth" cancel "$id6" > /dev/null 2>&1

# ---- a holder stopped in its last step past its TTL: taken over, it commits nothing at the end ---
id9=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
lrun=(train "$cfg" "${small[@]}" --reservation "$id9" --set "run.out_dir=$tmp/last" --set run.name=l
      --set checkpoint.interval=0 --set checkpoint.final=false --set train.log_interval=1)
holder=("${lrun[@]}" --set train.steps=3 --set debug.slow_rank_s=1.5)
successor=("${lrun[@]}" --set train.steps=10)
take_over l "step     2/3" "$tmp/last/l"  # stopped inside step 3, after the last check before a step
[ $rc -eq 4 ] && grep -q "the lease was lost before the run could end (the lease of reservation $id9 is now held with token" "$tmp/l1.log" &&
    grep -q "is left as it is" "$tmp/l1.log" && ! grep -q "released" "$tmp/l1.log" &&
    [ "$(md5sum "$tmp/last/l/metrics.jsonl" "$tmp/last/l/trace.csv" 2>&1)" = "$sums" ] &&
    "$berth" reservation show "$id9" | grep -q "| active |"
check "after its last step it sees the lease gone: exit 4, no files committed, nothing released (rc $rc)" $?
"$berth" cancel "$id9" > /dev/null 2>&1

# ---- steps longer than the lease's TTL: the renewal before a step holds it, with a warning --------
id10=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
timeout 60 "$berth" train "$cfg" "${small[@]}" --reservation "$id10" --set "run.out_dir=$tmp/long" \
    --set train.steps=3 --set debug.slow_rank_s=2 > "$tmp/long.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "longer than reservation.lease_ttl_s = 3s" "$tmp/long.log" &&
    grep -q "released" "$tmp/long.log"
check "2 s steps under a 3 s lease TTL train to the end, warning about the TTL (rc $rc)" $?
"$berth" cancel "$id10" > /dev/null 2>&1

# ---- a checkpoint save longer than the lease's TTL keeps the lease (the heartbeat renews it) ------
id8=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
timeout 60 "$berth" train "$cfg" "${small[@]}" --reservation "$id8" --set "run.out_dir=$tmp/slow" \
    --set train.steps=40 --set checkpoint.interval=20 --set debug.checkpoint_pause_s=5 \
    > "$tmp/slow.log" 2>&1
rc=$?
[ $rc -eq 0 ] && [ -e "$tmp/slow/tiny/checkpoints/step-00000040" ]
check "a 5 s checkpoint save under a 3 s lease TTL keeps the lease (rc $rc)" $?
"$berth" cancel "$id8" > /dev/null 2>&1

# ---- a save that outlasts the window: the run still stops with that checkpoint -------------------
# The periodic save at step 100 (~1.5 s in) pauses 10 s in an 8 s window (its writes add 0.05 to
# 0.2 s on this VM, by the day's disk), so the window ends during it and the heartbeat's renewal is
# refused for that. Nobody can take a lease after its window, so
# the run ends as at a window's end (exit 3, checkpoint, metrics, lease given back), not as a lost
# lease (exit 4, nothing committed).
ido=$("$berth" reserve --gpus 1 --duration 8s --json | booked_id)
timeout 60 "$berth" train "$cfg" "${small[@]}" --reservation "$ido" --set "run.out_dir=$tmp/over" \
    --set train.steps=100000 --set checkpoint.interval=100 --set debug.checkpoint_pause_s=10 \
    > "$tmp/over.log" 2>&1
rc=$?
[ $rc -eq 3 ] && grep -q "outlasted the stop margin .*saves took up to 10\.[0-4][0-9] s so far" "$tmp/over.log" &&
    grep -q "stopping before step 101: reservation $ido's window ended at .* before the run could stop" "$tmp/over.log" &&
    [ -e "$tmp/over/tiny/checkpoints/step-00000100" ] && [ -e "$tmp/over/tiny/metrics.jsonl" ] &&
    "$berth" reservation show "$ido" | grep -q "released"
check "a save that outlasts the window still ends the run with its checkpoint (rc $rc)" $?

# ---- ... unless a later booking's launch took its run directory over meanwhile -------------------
# A saves step 40 and stalls 10 s before step 41 (debug.stall_step: its heartbeat keeps renewing)
# in an 8 s window. Meanwhile B, under another booking, resumes from step 40 in the same run
# directory and finishes step 60. A then stops as at its window's end, finds B's token in FENCE,
# and leaves B's files: exit 4 (it committed its metrics over B's before).
ida=$("$berth" reserve --gpus 1 --duration 8s --json | booked_id)
idb=$("$berth" reserve --gpus 1 --duration 10m --json | booked_id)
frun=(train "$cfg" "${small[@]}" --set "run.out_dir=$tmp/fo" --set run.name=fo
      --set checkpoint.interval=40)
"$berth" "${frun[@]}" --reservation "$ida" --set train.steps=100000 --set debug.stall_step=40 \
    --set debug.stall_s=10 > "$tmp/fo1.log" 2>&1 &
stalled=$!; pids+=("$stalled")
for _ in $(seq 200); do [ -e "$tmp/fo/fo/checkpoints/step-00000040/meta.json" ] && break; sleep 0.05; done
timeout 60 "$berth" "${frun[@]}" --reservation "$idb" --set train.steps=60 --resume auto \
    > "$tmp/fo2.log" 2>&1
check "a later booking's launch resumes in the stalled run's directory" $?
sums=$(md5sum "$tmp/fo/fo/metrics.jsonl" "$tmp/fo/fo/trace.csv" 2>&1)
wait "$stalled"; rc=$?
[ $rc -eq 4 ] && grep -q "the window ended and a later launch took this run directory over" \
    "$tmp/fo1.log" && grep -q "is left as it is" "$tmp/fo1.log" &&
    [ "$(md5sum "$tmp/fo/fo/metrics.jsonl" "$tmp/fo/fo/trace.csv" 2>&1)" = "$sums" ] &&
    [ "$(wc -l < "$tmp/fo/fo/metrics.jsonl")" -eq 60 ]
check "past its window, the stalled run leaves the later launch's files alone (rc $rc)" $?
"$berth" cancel "$idb" > /dev/null 2>&1

# ---- a window too short for one step before the clean stop is refused at start -------------------
id7=$("$berth" reserve --gpus 1 --duration 1m --json | booked_id)
"$berth" train "$cfg" "${small[@]}" --reservation "$id7" --set "run.out_dir=$tmp/short" \
    --set reservation.checkpoint_estimate_s=60 > "$tmp/short.log" 2>&1
rc=$?
[ $rc -eq 4 ] && grep -q "but a run stops 1m31s before it" "$tmp/short.log" &&
    grep -q "berth extend $id7 --by 1h" "$tmp/short.log" && [ ! -e "$tmp/short" ] &&
    "$berth" reservation show "$id7" | grep -q "released"
check "a window shorter than the clean stop needs is refused at start, the lease given back (rc $rc)" $?
"$berth" cancel "$id7" > /dev/null 2>&1

# ---- reserve --config: the booking sized from the run config's plan -----------------------------
"$berth" reserve --config "$cfg" --gpu cpu --json > "$tmp/sized.json" 2> "$tmp/sized.log"
rc=$?
id5=$(booked_id < "$tmp/sized.json" 2>/dev/null)
[ $rc -eq 0 ] && grep -q "sized from .*tiny.toml on cpu" "$tmp/sized.log" && \
  grep -q "devices        1 (the smallest count that fits)" "$tmp/sized.log" && \
  grep -q "min free mem   .*MiB (predicted peak .* per rank + 10 %)" "$tmp/sized.log" && \
  grep -q "duration       .*(predicted .* for 300 steps × margin 1.25, + .* for 0 checkpoint save(s) and 7 evaluation(s), + the stop reserve 2m00s" "$tmp/sized.log" && \
  grep -q "model          any (the plan assumed cpu: add --model 'cpu' to book only those)" "$tmp/sized.log" && [ -n "$id5" ]
check "reserve --config sizes the booking from the plan and says what it assumed (rc $rc)" $?
# The advice on --model names the ledger's model of the profile's devices: a calibrated profile is
# named after its host (it advised "--model vm"), and a host's GPUs are registered by their CUDA
# names (it advised "--model H100", which the ledger refused).
"$berth" plan --calibrate --out "$tmp/calibrated.json" > /dev/null 2>&1
"$berth" reserve --config "$cfg" --gpu "$tmp/calibrated.json" --json > /dev/null 2> "$tmp/sized_cal.log"
grep -q "the plan assumed .*: add --model 'cpu' to book only those" "$tmp/sized_cal.log"
check "reserve --config on a calibrated profile advises the ledger's cpu model" $?
printf '[[hosts]]\nname = "gpunode"\nmodel = "NVIDIA H100 80GB HBM3"\nmemory_gib = 80\ngpus = 8\n' \
  > "$tmp/h100.toml"
BERTH_LEDGER="$tmp/h100.db" "$berth" devices register --from "$tmp/h100.toml" > /dev/null 2>&1
BERTH_LEDGER="$tmp/h100.db" "$berth" reserve --config "$cfg" --gpu h100 --json > /dev/null \
  2> "$tmp/sized_h100.log"
grep -q "the plan assumed h100: add --model 'NVIDIA H100 80GB HBM3' to book only those" \
  "$tmp/sized_h100.log"
check "reserve --config on h100 advises the ledger's name of those GPUs" $?
# The sized window holds the config's run with the stop reserve: `berth train` is not refused.
timeout 120 "$berth" train "$cfg" --set "data.train=$tmp/d.h5" --set data.val= --set eval.interval=0 \
  --set train.steps=2 --set "run.out_dir=$tmp/runs" --set run.name=sized --reservation "$id5" \
  > "$tmp/sized_train.log" 2>&1
rc=$?
[ $rc -eq 0 ]
check "the config trains in the window reserve --config booked (rc $rc)" $?
# --set is read as by berth train: 600 steps take twice the time.
"$berth" reserve --config "$cfg" --gpu cpu --set train.steps=600 --json > /dev/null \
  2> "$tmp/sized600.log"
grep -q "for 600 steps" "$tmp/sized600.log"
check "reserve --config --set train.steps=600 plans 600 steps" $?
"$berth" reservation show "$id5" > "$tmp/sized_show.log" 2>&1
grep -q "min free" "$tmp/sized_show.log"
check "the sized booking carries its minimum free memory" $?
"$berth" cancel "$id5" > /dev/null 2>&1
# --print-id: stdout is the id alone (`id=$(berth reserve --config ... --print-id)`), the sizing
# report goes to stderr; it went to stdout, and the id read "sized from ...".
id6=$("$berth" reserve --config "$cfg" --gpu cpu --print-id 2> "$tmp/sized_id.log")
rc=$?
[ $rc -eq 0 ] && [[ "$id6" =~ ^[0-9]+$ ]] && grep -q "sized from" "$tmp/sized_id.log"
check "reserve --config --print-id prints the id alone, the sizing on stderr (rc $rc, '$id6')" $?
"$berth" cancel "$id6" > /dev/null 2>&1
"$berth" reserve --config "$cfg" --json > "$tmp/noprof.log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "say which hardware to plan for with --gpu" "$tmp/noprof.log"
check "reserve --config without a profile asks for --gpu (rc $rc)" $?

# ---- timeline marks: by place in the listing (ids 1 and 63 both drew 'A') ------------------------
(
  export BERTH_LEDGER="$tmp/marks.db"
  "$berth" devices register --cpu-slots 1 > /dev/null 2>&1
  for i in $(seq 1 63); do
    "$berth" reserve --gpus 1 --duration 1m \
      --start "$(date -u -d "+$((10 + 2 * i)) min" +%Y-%m-%dT%H:%M:00Z)" > /dev/null 2>&1 || exit 1
  done
  for i in $(seq 2 62); do "$berth" cancel "$i" > /dev/null 2>&1 || exit 1; done
  "$berth" timeline --hours 4 > "$tmp/marks.log" 2>&1
)
grep -q "^  A = reservation 1 " "$tmp/marks.log" && grep -q "^  B = reservation 63 " "$tmp/marks.log"
check "timeline marks the bookings it shows apart (reservations 1 and 63: A and B)" $?

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
