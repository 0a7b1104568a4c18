#!/usr/bin/env python3
"""berth beside PyTorch from one bench.txt (scripts/gpu_check.sh writes it: bench_gpu_ops' bf16
half, torch_reference.py, then bench_gpu_ops' fp32 half, on the same GPU in one run): the ratios
the issue sets goals for.

  attention: berth's bf16 varlen attention (tiled tensor-core kernels) fwd+bwd TFLOP/s over
             PyTorch's SDPA flash attention at the same (T, heads, head size); goal >= 0.70
  training:  berth's bf16 GPT-2 124M step tokens/s over PyTorch's (bf16 autocast, fused AdamW);
             goal >= 1.00. Both MFUs beside it, from tokens/s with one count of FLOPs a token
             (the two programs' own counts differ: PyTorch's 6·n_params includes wpe).

usage: bench/gpu/compare.py OUTDIR/bench.txt
"""
import re
import sys

SHAPE = r"B=(\d+)\s+T=(\d+)\s+NH=(\d+) HS=(\d+)"
PEAK_BF16 = 989e12  # H100/H200 SXM dense bf16


def gpt2_flops_per_token(L=12, C=768, V=50257, T=1024):
    """Model FLOPs a token of GPT-2 124M training: 6 × (the weights every token multiplies: the
    layers, the final LayerNorm and the tied LM head, not the position table) + attention's
    12·L·T·C (berth's gpt_flops_per_token, on the real vocabulary)."""
    per_layer = 12 * C * C + 13 * C
    return 6 * (L * per_layer + 2 * C + V * C) + 12 * L * T * C


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
        f = gpt2_flops_per_token()
        print(f"training GPT-2 124M bf16: berth {b:.0f} tok/s (MFU {b * f / PEAK_BF16 * 100:.1f}%), "
              f"torch {t:.0f} tok/s (MFU {t * f / PEAK_BF16 * 100:.1f}%), ratio {b / t:.2f} "
              f"(goal >= 1.00; MFU at {f / 1e6:.1f} MFLOP a token of 989 TFLOP/s)")
        rows += 1
    elif torch_tok or berth_tok:
        print("training GPT-2 124M bf16: no " + ("berth" if torch_tok else "torch") +
              " figure (it failed or was stopped: see bench.txt), no ratio")
    if rows == 0:
        print("compare: no pair of berth and torch figures in", path)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
