# Sourced by the CLI and MPI test scripts (after they set $tmp): `check NAME STATUS` prints ok or
# FAIL and counts into $pass and $fail; on a failure it shows the end of the newest log in $tmp,
# the one the scenario just wrote, so a failure in CI says why where it is reported.
pass=0
fail=0
check() {
  if [ "$2" -eq 0 ]; then echo "ok   $1"; pass=$((pass + 1)); return; fi
  echo "FAIL $1"
  fail=$((fail + 1))
  local log
  log=$(ls -t "$tmp"/*.log 2>/dev/null | head -1)
  [ -n "$log" ] && { echo "---- the end of $log:"; grep -v '^[a-z_0-9]* = ' "$log" | tail -n 25; echo "----"; }
}

# tiny_setup BERTH: a small text dataset $tmp/d.h5 (one document), and in $tiny the arguments of
# `berth train configs/tiny.toml` at tiny shapes on it, writing under $tmp/runs (a few ms a step;
# the caller adds train.steps and its own --set).
tiny_setup() {
  printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 60) > "$tmp/a.txt"
  "$1" data import --format text "$tmp/a.txt" --out "$tmp/d.h5" >/dev/null
  tiny=(train "$(dirname "${BASH_SOURCE[0]}")/../../configs/tiny.toml" --set model.n_layer=1
        --set model.d_model=32 --set model.n_head=2 --set model.max_seq_len=16
        --set data.seq_len=16 --set train.micro_batch_size=2 --set eval.interval=0 --set data.val=
        --set "data.train=$tmp/d.h5" --set "run.out_dir=$tmp/runs")
}
