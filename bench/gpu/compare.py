#!/usr/bin/env python3
"""berth beside PyTorch from one bench.txt (scripts/gpu_check.sh writes it: bench_gpu_ops' bf16
half, torch_reference.py, then bench_gpu_ops' fp32 half, on the same GPU in one run): the ratios
the issue sets goals for.

  attention: berth's bf16 varlen attention (tiled tensor-core kernels) fwd+bwd TFLOP/s over
             PyTorch's SDPA flash attention at the same (T, heads, head size); goal >= 0.70
  training:  berth's bf16 GPT-2 124M step tokens/s over PyTorch's (bf16 autocast, fused AdamW);
             goal >= 1.00

usage: bench/gpu/compare.py OUTDIR/bench.txt
"""
import re
import sys

SHAPE = r"B=(\d+)\s+T=(\d+)\s+NH=(\d+) HS=(\d+)"


def main(path):
    text = open(path).read()
    berth_att = {m.group(1, 2, 3, 4): float(m.group(5)) for m in re.finditer(
        r"berth cuda bf16 attention_varlen " + SHAPE + r":.*fwd\+bwd ([\d.]+) TFLOP/s", text)}
    torch_att = {m.group(1, 2, 3, 4): float(m.group(5)) for m in re.finditer(
        r"torch bf16 sdpa-flash " + SHAPE + r":.*fwd\+bwd ([\d.]+) TFLOP/s", text)}
    for m in re.finditer(r"berth cuda bf16-fallback attention_varlen " + SHAPE, text):
        print(f"attention B={m.group(1)} T={m.group(2)} NH={m.group(3)} HS={m.group(4)}: berth "
              "ran its fp32 kernels (the tiled bf16 ones do not fit this GPU): no ratio")
    berth_tok = re.search(r"berth cuda bf16 GPT-2 124M train step .*?, ([\d.]+) tok/s", text)
    torch_tok = re.search(r"torch GPT-2 124M train step .*?, ([\d,]+) tok/s", text)
    rows = 0
    for shape in sorted(berth_att.keys() & torch_att.keys(), key=lambda s: tuple(map(int, s))):
        b, t = berth_att[shape], torch_att[shape]
        print(f"attention B={shape[0]} T={shape[1]} NH={shape[2]} HS={shape[3]}: berth bf16 "
              f"{b:.2f} TFLOP/s, torch flash {t:.2f} TFLOP/s, ratio {b / t:.2f} (goal >= 0.70)")
        rows += 1
    if berth_tok and torch_tok:
        b, t = float(berth_tok.group(1)), float(torch_tok.group(1).replace(",", ""))
        print(f"training GPT-2 124M bf16: berth {b:.0f} tok/s, torch {t:.0f} tok/s, "
              f"ratio {b / t:.2f} (goal >= 1.00)")
        rows += 1
    if rows == 0:
        print("compare: no pair of berth and torch figures in", path)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
