#!/usr/bin/env python3
"""The ETA predictor's error over the whole of each run, not only at the bench's five points.

`berth eta bench` asks at 5 / 10 / 25 / 50 / 75 % of each session; a failure that lasts a few
hundred steps between those points (just after an epoch boundary, inside a late-epoch ramp) does
not show there, and judged traces of the same kinds put their events elsewhere. This replays every
trace of DIR/index.json with `berth eta replay --every N` and reports, per scenario kind, the mean
absolute error of the predicted total over every query row from 5 % to 95 % of the session and its
worst, beside linear extrapolation's mean over the same rows. Several berth binaries can be given
(old and new side by side, the same traces, one run).

    python3 bench/eta_whole_run.py DIR [--every N] [BERTH ...]      # default: build/berth, N = 10

Standard library only. `true_total_s` and `scenario` are read from index.json for scoring and
grouping only; the replay is given the run facts without them.
"""
import argparse
import collections
import csv
import io
import json
import os
import subprocess
import sys
import tempfile


def replay(berth, trace, facts, every):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as meta:
        json.dump({k: v for k, v in facts.items() if k not in ("scenario", "true_total_s")}, meta)
    try:
        out = subprocess.run([berth, "eta", "replay", trace, "--meta", meta.name, "--every",
                              str(every)], capture_output=True, text=True)
    finally:
        os.unlink(meta.name)
    if out.returncode != 0:
        sys.exit(f"{berth} eta replay {trace} failed: {out.stderr.strip()}")
    return list(csv.DictReader(io.StringIO(out.stdout)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a directory with index.json and the traces it names")
    ap.add_argument("berth", nargs="*", default=["build/berth"], help="berth binaries to compare")
    ap.add_argument("--every", type=int, default=10, help="query every N rows (default 10)")
    a = ap.parse_intermixed_args()
    if a.every < 1:
        sys.exit("--every must be at least 1")
    index_path = os.path.join(a.dir, "index.json")
    try:
        with open(index_path) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{index_path}: {e}")

    errs = {b: collections.defaultdict(list) for b in a.berth}
    linear = collections.defaultdict(list)
    for t in index:
        n, true, kind = t["session_steps"], t["true_total_s"], t.get("scenario", t["file"])
        trace = os.path.join(a.dir, t["file"])
        for b in a.berth:
            for row in replay(b, trace, t, a.every):
                k = int(row["rows"])
                if not 0.05 * n <= k <= 0.95 * n:
                    continue
                errs[b][kind].append(abs(float(row["predicted_total_s"]) - true) / true * 100)
                if b == a.berth[0]:
                    lin = float(row["elapsed_s"]) / k * n
                    linear[kind].append(abs(lin - true) / true * 100)

    print(f"whole-run APE of the total over {a.dir} (every {a.every} rows, 5..95 % of each "
          "session): mean (worst), %")
    print(f"{'kind':26}" + "".join(f"{os.path.basename(b)[:20]:>22}" for b in a.berth) +
          f"{'linear':>10}")
    for kind in sorted(linear):
        cells = "".join(f"{sum(e) / len(e):10.2f} ({max(e):7.2f})"
                        for e in (errs[b][kind] for b in a.berth))
        print(f"{kind[:26]:26}{cells}{sum(linear[kind]) / len(linear[kind]):10.2f}")
    every = [sum(sum(v) for v in errs[b].values()) / sum(len(v) for v in errs[b].values())
             for b in a.berth]
    lin_all = sum(sum(v) for v in linear.values()) / sum(len(v) for v in linear.values())
    print(f"{'all':26}" + "".join(f"{m:10.2f}{'':12}" for m in every) + f"{lin_all:10.2f}")


if __name__ == "__main__":
    main()
