#!/usr/bin/env python3
"""Synthetic step-time traces of the kinds in ../shared/eta (a robustness set for `berth eta bench`).

The twelve development traces hold one seed of each kind. The predictor is judged on other traces of
the same kinds, so this writes many of each with the phenomena's parameters drawn at random (where a
checkpoint costs what, when an unannounced speed change happens, how long an epoch is, how fast a
straggler drifts, how much of a step attention takes, ...), in the same CSV and index.json format:

    python3 bench/eta_synth.py OUTDIR [--seeds N] [--kinds a,b,...]
    build/berth eta bench OUTDIR

The parameter ranges are this script's assumptions about such runs (stated below, per kind), not
measurements; the generator only exercises the predictor, it is not evidence of accuracy on real
runs. Only the standard library is used, and the same seed gives the same files.
"""

import argparse
import json
import math
import os
import random
import sys

HEADER = "step,duration_s,tokens,seq_len,compute_s,comm_s,data_wait_s,overhead_s,mem_gib,event\n"
KINDS = [
    "steady", "compile_warmup", "ckpt_periodic", "eval_periodic", "dataloader_late_epoch",
    "seqlen_switch", "batch_rampup", "packing_change", "drift_straggler", "heavy_tail_varlen",
    "llm_pretrain_realistic", "resumed_run"
]


class Run:
    """One session: facts, and a generator of its rows."""

    def __init__(self, rng, kind):
        self.rng = rng
        self.kind = kind
        self.hidden = rng.choice([2048, 4096, 8192])
        self.steps = rng.randrange(2000, 8001, 100)
        self.start = 0
        self.ckpt_interval = 0
        self.eval_interval = 0
        self.schedule = [[0, 4096, 4194304]]
        self.t0 = rng.uniform(0.5, 6.0)       # steady step time at the first schedule entry
        self.noise = rng.uniform(0.005, 0.04)  # relative per-step noise (normal)
        self.comm_share = rng.uniform(0.05, 0.2)
        self.data_wait = rng.uniform(0.002, 0.02) * self.t0
        self.attn = rng.uniform(0.05, 0.3)     # attention time share coefficient: × seq_len / hidden
        self.mem = rng.uniform(40, 70)
        self.mem_slope = 0.0
        self.first_cost = rng.uniform(5, 20)   # the first step's one-off cost (allocations, NCCL init)
        self.first_event = "first_step"
        self.warm_steps = 0                    # slow steps after the first (compile, cache warm-up)
        self.warm_factor = 1.0
        self.ckpt_cost = 0.0
        self.eval_cost = 0.0
        self.epoch_len = 0
        self.late_frac = 0.0                   # last fraction of each epoch with growing data waits
        self.late_peak = 0.0                   # data wait at an epoch's end, in step times
        self.epoch_stall = 0.0                 # seconds
        self.shift_at = -1                     # unannounced level shift (packing change)
        self.shift_time = 1.0                  # ... the step's time changes by this factor
        self.shift_tokens = 1.0
        self.drift = 0.0                       # relative step-time growth over the session
        self.spike_p = 0.0
        self.spike_cost = (0.0, 0.0)
        self.varlen = False

    def cost(self, tokens, seq_len):
        return tokens * (1.0 + self.attn * seq_len / self.hidden)

    def entry(self, step):
        e = self.schedule[0]
        for s in self.schedule:
            if step - 1 >= s[0]:
                e = s
        return e

    def rows(self):
        rng = self.rng
        base = self.t0 / self.cost(self.schedule[0][2], self.schedule[0][1])
        out = []
        for i in range(self.steps):
            step = self.start + i + 1
            _, seq_len, tokens = self.entry(step)
            time_factor = 1.0
            if 0 <= self.shift_at <= i:  # the step's time changes by shift_time in all
                time_factor *= self.shift_time / self.shift_tokens
                tokens = int(tokens * self.shift_tokens)
            if self.varlen:
                tokens = int(tokens * min(1.0, rng.lognormvariate(-0.25, 0.12)))
            compute = base * self.cost(tokens, seq_len) * time_factor
            compute *= 1.0 + self.drift * i / self.steps
            if i <= self.warm_steps and self.warm_steps:
                compute *= 1.0 + (self.warm_factor - 1.0) * math.exp(-4.0 * i / self.warm_steps)
            compute *= max(0.5, rng.gauss(1.0, self.noise))
            comm = compute * self.comm_share / (1 - self.comm_share)
            wait = self.data_wait * rng.uniform(0.5, 1.5)
            overhead = 0.0
            events = []
            if i == 0:
                overhead += self.first_cost
                events.append(self.first_event)
            if self.epoch_len:
                pos = (step - 1) % self.epoch_len + 1  # 1..epoch_len
                late = pos - (1 - self.late_frac) * self.epoch_len
                if late > 0:
                    wait += self.late_peak * self.t0 * late / (self.late_frac * self.epoch_len)
                if pos == self.epoch_len and step < self.start + self.steps:
                    overhead += self.epoch_stall * rng.uniform(0.8, 1.2)
                    events.append("epoch_boundary")
            if self.ckpt_interval and step % self.ckpt_interval == 0:
                overhead += self.ckpt_cost * rng.uniform(0.8, 1.25)
                events.append("ckpt")
            if self.eval_interval and step % self.eval_interval == 0:
                overhead += self.eval_cost * rng.uniform(0.9, 1.1)
                events.append("eval")
            if self.spike_p and not events and rng.random() < self.spike_p:
                overhead += rng.uniform(*self.spike_cost) * self.t0
                events.append("spike")
            if self.varlen and not events and rng.random() < 0.01:
                compute *= rng.paretovariate(2.5)  # heavy tail: a rare long-document step
            mem = self.mem + self.mem_slope * i / self.steps + rng.gauss(0, 0.05)
            duration = compute + comm + wait + overhead
            out.append((step, duration, tokens, seq_len, compute, comm, wait, overhead, mem,
                        "+".join(events)))
        return out


def make(kind, seed):
    rng = random.Random(f"{kind}:{seed}")
    r = Run(rng, kind)
    if kind == "compile_warmup":
        r.first_event = "compile"
        r.first_cost = rng.uniform(60, 400)
        r.warm_steps = rng.randrange(20, 150)
        r.warm_factor = rng.uniform(1.5, 4.0)
    elif kind == "ckpt_periodic":
        r.ckpt_interval = rng.choice([200, 250, 500, 1000])
        r.ckpt_cost = rng.uniform(20, 150) * r.t0
    elif kind == "eval_periodic":
        r.eval_interval = rng.choice([100, 250, 500])
        r.eval_cost = rng.uniform(10, 80) * r.t0
    elif kind == "dataloader_late_epoch":
        r.epoch_len = int(r.steps / rng.uniform(2.0, 4.5))
        r.late_frac = rng.uniform(0.1, 0.3)
        r.late_peak = rng.uniform(0.2, 0.8)
        r.epoch_stall = rng.uniform(1, 8) * r.t0
    elif kind == "seqlen_switch":
        at = int(r.steps * rng.uniform(0.3, 0.6))
        r.schedule.append([at, 8192, 8388608 if rng.random() < 0.5 else 4194304])
    elif kind == "batch_rampup":
        n = rng.randrange(3, 8)
        end = int(r.steps * rng.uniform(0.1, 0.35))
        r.schedule = [[int(end * k / n) + (1 if k else 0), 4096,
                       int(1048576 * (1 + 3 * k / n)) // 4096 * 4096] for k in range(n + 1)]
    elif kind == "packing_change":
        r.shift_at = int(r.steps * rng.uniform(0.3, 0.7))
        r.shift_tokens = rng.uniform(0.8, 0.95)
        r.shift_time = r.shift_tokens * rng.uniform(0.75, 1.0)
    elif kind == "drift_straggler":
        r.drift = rng.uniform(0.05, 0.25)
        r.noise = rng.uniform(0.02, 0.05)
        r.spike_p = rng.uniform(0.001, 0.005)
        r.spike_cost = (3, 10)
        r.mem_slope = rng.uniform(0, 12)
    elif kind == "heavy_tail_varlen":
        r.varlen = True
    elif kind == "llm_pretrain_realistic":
        r.steps = rng.randrange(8000, 16001, 1000)
        r.t0 = rng.uniform(3, 8)
        r.first_event = "compile"
        r.first_cost = rng.uniform(100, 400)
        r.ckpt_interval = rng.choice([500, 1000])
        r.ckpt_cost = rng.uniform(20, 60) * r.t0
        r.eval_interval = r.ckpt_interval * 2
        r.eval_cost = rng.uniform(5, 20) * r.t0
        r.epoch_len = int(r.steps / rng.uniform(2.0, 4.0))
        r.late_frac = rng.uniform(0.1, 0.25)
        r.late_peak = rng.uniform(0.1, 0.4)
        r.epoch_stall = rng.uniform(10, 30) * r.t0
        r.drift = rng.uniform(0.0, 0.05)
        r.spike_p = 0.002
        r.spike_cost = (1, 5)
        r.mem_slope = rng.uniform(0, 12)
        r.schedule.append([int(r.steps * rng.uniform(0.4, 0.6)), 8192, 4194304])
    elif kind == "resumed_run":
        r.start = rng.randrange(200, 3001, 100)
        r.first_event = "resume_load+compile"
        r.first_cost = rng.uniform(100, 500)
        r.warm_steps = rng.randrange(20, 150)
        r.warm_factor = rng.uniform(1.5, 3.0)
    rows = r.rows()
    total = sum(row[1] for row in rows)
    facts = {
        "file": f"{kind}__s{seed}.csv", "max_steps": r.start + r.steps, "start_step": r.start,
        "session_steps": r.steps, "ckpt_interval": r.ckpt_interval,
        "eval_interval": r.eval_interval, "schedule": r.schedule, "hidden_size": r.hidden,
        "mem_capacity_gib": 80.0, "lease_s": total * rng.uniform(0.85, 1.15), "seed": seed,
        "scenario": kind, "true_total_s": total
    }
    return facts, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--seeds", type=int, default=5, help="traces per kind (default 5)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds (default all)")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad or args.seeds < 1:
        sys.exit(f"eta_synth: unknown kind(s) {bad}; known: {', '.join(KINDS)}" if bad else
                 "eta_synth: --seeds must be at least 1")
    os.makedirs(args.outdir, exist_ok=True)
    index = []
    for kind in kinds:
        for seed in range(1, args.seeds + 1):
            facts, rows = make(kind, seed)
            path = os.path.join(args.outdir, facts["file"])
            with open(path + ".tmp", "w") as f:
                f.write(HEADER)
                for row in rows:
                    f.write("%d,%.4f,%d,%d,%.4f,%.4f,%.4f,%.3f,%.2f,%s\n" % row)
            os.replace(path + ".tmp", path)
            index.append(facts)
    with open(os.path.join(args.outdir, "index.json.tmp"), "w") as f:
        json.dump(index, f, indent=1)
    os.replace(os.path.join(args.outdir, "index.json.tmp"), os.path.join(args.outdir, "index.json"))
    print(f"wrote {len(index)} traces to {args.outdir}")


if __name__ == "__main__":
    main()
