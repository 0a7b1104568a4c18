#!/usr/bin/env python3
"""PyTorch's figures for the shapes bench_gpu_ops measures, on the same GPU (scripts/gpu_check.sh
runs both): causal attention forward+backward (scaled_dot_product_attention pinned to its flash
backend, bf16) at the training shapes, 16 sequences of T = 1024 and 4 of T = 4096, with 12 heads
of 64 (and 6 of 128 at 4096); the fp32 GEMM (TF32 off) and bf16 GEMM of GPT-2's MLP at 16 x 1024
tokens; and GPT-2 124M training steps (bf16 autocast, SDPA, fused AdamW) at micro-batch
16 x 1024, as tokens/s and MFU against 989 TFLOP/s dense bf16. Timed with CUDA events over many
repetitions, so Python's launch overhead does not count as kernel time."""
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"torch_reference: no PyTorch here ({e}); nothing to measure")
    sys.exit(0)

PEAK_BF16 = 989e12


def timed(fn, reps):
    """Seconds per call of fn, between CUDA events around `reps` calls (after a warm-up)."""
    fn()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / 1e3 / reps


def flash_only():
    """SDPA pinned to the flash backend (an error, not a silent fallback, where it cannot run)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # older PyTorch
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                              enable_mem_efficient=False)


def attention(B, T, nh=12, hs=64):
    q, k, v = (torch.randn(B, nh, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn(B, nh, T, hs, device="cuda", dtype=torch.bfloat16)
    with flash_only():
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 50)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), 50)
    flop_fwd = 4.0 * B * T * T * hs * nh * 0.5
    flop_bwd = 2.5 * flop_fwd
    print(f"torch bf16 sdpa-flash B={B:<2d} T={T:<5d} NH={nh} HS={hs}: fwd {fwd*1e3:.3f} ms "
          f"({flop_fwd/fwd/1e12:.2f} TFLOP/s), bwd {bwd*1e3:.3f} ms ({flop_bwd/bwd/1e12:.2f} "
          f"TFLOP/s), fwd+bwd {(flop_fwd+flop_bwd)/(fwd+bwd)/1e12:.2f} TFLOP/s")


def gemm(N=16 * 1024, IC=768, OC=3072):
    torch.backends.cuda.matmul.allow_tf32 = False
    for dt, name in ((torch.float32, "fp32 (no TF32)"), (torch.bfloat16, "bf16")):
        a = torch.randn(N, IC, device="cuda", dtype=dt)
        w = torch.randn(OC, IC, device="cuda", dtype=dt)
        s = timed(lambda: a @ w.t(), 20)
        print(f"torch {name} matmul {N}x{IC}x{OC}: {s*1e3:.3f} ms, {2*N*IC*OC/s/1e12:.2f} TFLOP/s")


class Block(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.nh = nh
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, V=50304, T=1024, C=768, L=12, nh=12):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, nh) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def gpt2_step(B=16, T=1024, steps=10):
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT2().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    idx = torch.randint(0, 50257, (B, T), device="cuda")
    tgt = torch.randint(0, 50257, (B, T), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    s = timed(step, steps)
    n_params = sum(p.numel() for p in model.parameters())
    flops = 6 * n_params * B * T + 12 * 12 * 768 * T * B * T  # params + attention (Megatron)
    print(f"torch GPT-2 124M train step B={B} T={T} bf16 autocast, fused AdamW: {s*1e3:.1f} ms, "
          f"{B*T/s:,.0f} tok/s, MFU {flops/s/PEAK_BF16*100:.1f}% of 989 TFLOP/s")


def main():
    if not torch.cuda.is_available():
        print("torch_reference: PyTorch sees no GPU; nothing to measure")
        return
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    gpt2_step()  # the headline comparison first, should a time limit stop the rest
    attention(16, 1024)
    attention(4, 4096)
    attention(4, 4096, nh=6, hs=128)
    gemm()


if __name__ == "__main__":
    main()
