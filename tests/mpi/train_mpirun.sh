#!/usr/bin/env bash
# MPI launch checks (ctest label "mpi"): `berth train` under `mpirun -np 1` trains and writes its
# run directory; under `mpirun -np 2` (this build trains on one rank) it fails fast with the
# specific message on every rank and a non-zero exit instead of hanging.
#   train_mpirun.sh BERTH MPIEXEC
set -u
berth=$1
mpiexec=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
check() {  # check NAME CONDITION-EXIT-CODE
  if [ "$2" -eq 0 ]; then echo "ok   $1"; pass=$((pass + 1)); else echo "FAIL $1"; fail=$((fail + 1)); fi
}

printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 40) > "$tmp/a.txt"
printf 'pack my box with five dozen liquor jugs! %.0s' $(seq 40) > "$tmp/b.txt"
"$berth" data import --format text "$tmp/a.txt" "$tmp/b.txt" --out "$tmp/d.h5" >/dev/null
check "import" $?

tiny=(--set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.max_seq_len=16
      --set data.seq_len=16 --set train.micro_batch_size=2 --set train.steps=4 --set eval.interval=0
      --set data.val= --set "data.train=$tmp/d.h5" --set "run.out_dir=$tmp/runs")
cfg="$(dirname "$0")/../../configs/tiny.toml"
mpi=("$mpiexec" --oversubscribe --allow-run-as-root)

timeout 120 "${mpi[@]}" -np 1 "$berth" train "$cfg" "${tiny[@]}" > "$tmp/np1.log" 2>&1
check "mpirun -np 1 berth train exits 0" $?
[ "$(wc -l < "$tmp/runs/tiny/metrics.jsonl" 2>/dev/null)" = "4" ]
check "mpirun -np 1 writes 4 metrics lines" $?
grep -q "step     4/4" "$tmp/np1.log"
check "mpirun -np 1 logs step 4/4 once (rank 0 only)" $?

timeout 120 "${mpi[@]}" -np 2 "$berth" train "$cfg" "${tiny[@]}" --set run.name=np2 > "$tmp/np2.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ]
check "mpirun -np 2 exits non-zero without hanging (rc $rc)" $?
grep -q "trains on one rank only" "$tmp/np2.log"
check "mpirun -np 2 says why" $?
[ ! -e "$tmp/runs/np2" ]
check "mpirun -np 2 leaves no run directory" $?

[ $fail -ne 0 ] && cat "$tmp/np1.log" "$tmp/np2.log"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
