#!/usr/bin/env bash
# Plan accuracy: `berth plan`'s per-rank memory and step time against what `berth train` measures,
# over a grid of layouts and model sizes, after `berth plan --calibrate` on this machine.
#   bench/plan_accuracy.sh [RANKS=2] [STEPS=30]
# Calibrates with RANKS ranks (the figures are per rank, with the others running), then trains
# each case on RANKS ranks (1-rank cases on 1) for STEPS steps, and reads the trainer's last line
# "plan vs measured: ..." (memory: the largest heap a rank's trainer holds; step: the median).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-2}
steps=${2:-30}
berth=build/berth
[ -x "$berth" ] || { echo "build first: scripts/bootstrap" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export XDG_DATA_HOME="$work/xdg" OMP_NUM_THREADS=1
mpi=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x XDG_DATA_HOME)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
if [ ! -f data/licenses_train.h5 ]; then
  "$berth" data import --format text /usr/share/common-licenses/* --out data/licenses_train.h5 \
      --val-out data/licenses_val.h5 --val-fraction 0.1 > /dev/null
fi
"${mpi[@]}" -np "$ranks" "$berth" plan --calibrate | head -2

models=("L4 C128:--set model.n_layer=4 --set model.d_model=128"
        "L8 C256:--set model.n_layer=8 --set model.d_model=256")
layouts=("1 rank:1:--set parallel.dp=1"
         "dp 2, ZeRO-1:2:--set parallel.dp=2"
         "tp 2:2:--set parallel.tp=2 --set parallel.dp=1"
         "pp 2, M 4, 1f1b:2:--set parallel.pp=2 --set parallel.dp=1 --set parallel.microbatches=4"
         "pp 2, M 4, afab:2:--set parallel.pp=2 --set parallel.dp=1 --set parallel.microbatches=4 --set parallel.schedule=afab"
         "cp 2:2:--set parallel.cp=2 --set parallel.dp=1")
printf "| model | layout | memory predicted | held | error | step predicted | measured | error |\n"
printf "|---|---|---|---|---|---|---|---|\n"
for m in "${models[@]}"; do
  for l in "${layouts[@]}"; do
    IFS=: read -r lname np lset <<< "$l"
    [ "$np" -le "$ranks" ] || continue
    # shellcheck disable=SC2086
    line=$("${mpi[@]}" -np "$np" "$berth" train configs/tiny.toml ${m#*:} $lset \
        --set train.steps="$steps" --set eval.interval=0 --set data.val= \
        --set run.out_dir="$work/runs" --set run.name="r$RANDOM" 2>&1 | grep "plan vs measured" || true)
    if [ -z "$line" ]; then
      printf "| %s | %s | (run failed) |||||\n" "${m%%:*}" "$lname"
      continue
    fi
    python3 - "$line" "${m%%:*}" "$lname" <<'EOF'
import re, sys
line, model, layout = sys.argv[1:4]
unit = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}
mem = re.findall(r"([0-9.]+) (KiB|MiB|GiB)", line)
pm, hm = float(mem[0][0]) * unit[mem[0][1]], float(mem[1][0]) * unit[mem[1][1]]
ps, ms = map(float, re.search(r"step predicted ([0-9.]+) s, measured ([0-9.]+) s", line).groups())
print(f"| {model} | {layout} | {pm:.1f} MiB | {hm:.1f} MiB | {100*(pm-hm)/hm:+.1f} % "
      f"| {ps*1e3:.1f} ms | {ms*1e3:.1f} ms | {100*(ps-ms)/ms:+.1f} % |")
EOF
  done
done
