"""berth's GPT-2 against Hugging Face transformers' GPT2LMHeadModel, on the CPU.

    python bench/reference/hf_gpt2.py build/berth WORKDIR   (a new or empty directory)

Needs torch, transformers, safetensors and numpy (not installed by scripts/bootstrap: a venv with
`pip install torch transformers safetensors numpy`). It makes a small random GPT-2 (its LayerNorm
and bias parameters moved off their defaults, so they are tested too), imports it into berth
(`berth model import --format hf-gpt2`), trains one step on a dataset of exactly one window, and
compares with transformers in float32 and float64 on the same tokens:
  - step 1's loss and gradient norm (before clipping);
  - the learning rate of step 1 (against what the schedule should give);
  - every parameter after one AdamW step, for three optimizer settings (weight decay on the 2-D
    weights only, the first step of a warm-up, clipping with an eps large enough for clipping to
    show); a NaN fails;
  - the export of the untouched import (bit-identical).
berth passes when its loss and norm are within 1e-5 relative of float64 and every parameter is
within 4x float32 transformers' own distance from float64 (plus 1e-7). Exit 1 otherwise.
"""
import json
import math
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

BERTH, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "tiny.toml")
T = 32  # tokens per window
RUNS = {  # name: (lr, schedule, warmup, weight_decay, grad_clip, eps, the lr of step 1)
    "plain": (1e-3, "constant", 0, 0.1, 0.0, 1e-8, 1e-3),
    "warmup_decay": (4e-3, "cosine", 2, 5.0, 1.0, 1e-8, 2e-3),  # step 1 of a 2-step warm-up
    "clipped": (1e-3, "constant", 0, 0.1, 1.0, 1e-3, 1e-3),
}


def berth(*args):
    done = subprocess.run([BERTH, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, cwd=WORK)
    if done.returncode != 0:
        sys.exit(f"berth {' '.join(args[:3])} failed (exit {done.returncode}):\n{done.stderr}")


def make_inputs():
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=50257, n_positions=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln" in name or name.startswith("transformer.ln_f"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(f"{WORK}/hf", safe_serialization=True)
    tokens = np.random.default_rng(1).integers(0, 1000, size=T + 1).astype(np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, len(tokens))  # llm.c token file, version 1 (uint16)
    with open(f"{WORK}/tokens.bin", "wb") as f:
        f.write(header.tobytes() + tokens.tobytes())
    berth("model", "import", "--format", "hf-gpt2", "hf", "--out", "ckpt")
    berth("data", "import", "--format", "llmc", "tokens.bin", "--out", "data.h5")
    return torch.tensor(tokens.astype(np.int64))


def train(name, lr, schedule, warmup, wd, clip, eps):
    sets = {"run.name": name, "run.out_dir": f"{WORK}/runs", "model.n_layer": 2, "model.n_head": 4,
            "model.d_model": 64, "model.vocab_size": 50257, "model.max_seq_len": 64,
            "model.init_from": f"{WORK}/ckpt", "data.train": f"{WORK}/data.h5", "data.mode": "stream",
            "data.seq_len": T, "data.shuffle": "false", "data.val": '""', "train.micro_batch_size": 1,
            "train.steps": 1, "train.lr": lr, "train.lr_schedule": schedule,
            "train.warmup_steps": warmup, "train.min_lr": 0.0, "train.beta1": 0.9,
            "train.beta2": 0.95, "train.eps": eps, "train.weight_decay": wd,
            "train.grad_clip": clip, "parallel.zero": 0, "parallel.microbatches": 1,
            "eval.interval": 0, "checkpoint.interval": 0, "checkpoint.final": "true"}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    berth("train", TINY, *args)
    berth("model", "export", "--format", "hf-gpt2", f"runs/{name}/checkpoints/step-00000001",
          "--out", f"export_{name}")
    with open(f"{WORK}/runs/{name}/metrics.jsonl") as f:
        return json.loads(f.readline()), load_file(f"{WORK}/export_{name}/model.safetensors")


def reference(tokens, dtype, lr, wd, clip, eps):
    model = GPT2LMHeadModel.from_pretrained(f"{WORK}/hf", dtype=torch.float32).to(dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    logits = model(input_ids=tokens[None, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), tokens[1:])
    loss.backward()
    params = list(model.parameters())  # (wte once: lm_head is tied to it)
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(params, clip)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=eps, foreach=False).step()
    after = {n[len("transformer."):]: p.detach().double() for n, p in model.named_parameters()}
    return loss.item(), norm, after


def main():
    if os.path.exists(WORK) and os.listdir(WORK):
        sys.exit(f"{WORK} is not empty: give a new or empty directory")
    os.makedirs(WORK, exist_ok=True)
    tokens = make_inputs()
    ok = True
    for name, (lr, schedule, warmup, wd, clip, eps, step_lr) in RUNS.items():
        metrics, exported = train(name, lr, schedule, warmup, wd, clip, eps)
        # The reference takes the lr the schedule should give at step 1, not berth's own.
        lr_right = math.isclose(metrics["lr"], step_lr, rel_tol=1e-9)
        loss32, norm32, p32 = reference(tokens, torch.float32, step_lr, wd, clip, eps)
        loss64, norm64, p64 = reference(tokens, torch.float64, step_lr, wd, clip, eps)
        rel_loss = abs(metrics["loss"] - loss64) / loss64
        rel_norm = abs(metrics["grad_norm"] - norm64) / norm64
        worst, worst_name = 0.0, ""
        for key, ref in p64.items():
            mine = torch.tensor(exported[key]).double()
            allowed = 4 * (p32[key] - ref).abs().max().item() + 1e-7
            ratio = (mine - ref).abs().max().item() / allowed
            if not math.isfinite(ratio) or ratio > worst:  # (a NaN is the worst)
                worst, worst_name = (ratio if math.isfinite(ratio) else math.inf), key
        passed = (lr_right and rel_loss <= 1e-5 and rel_norm <= 1e-5 and worst <= 1 and
                  set(exported) == set(p64))
        ok = ok and passed
        print(f"{name:13s} lr {metrics['lr']:.3g} (expected {step_lr:.3g}) | loss berth {metrics['loss']:.9f} fp32 {loss32:.9f} "
              f"fp64 {loss64:.9f} ({rel_loss:.1e}) | grad_norm berth {metrics['grad_norm']:.9f} "
              f"fp64 {norm64:.9f} ({rel_norm:.1e}) | params: worst {worst:.2f} of the allowance "
              f"({worst_name}) | {'ok' if passed else 'MISMATCH'}")
    berth("model", "export", "--format", "hf-gpt2", "ckpt", "--out", "export_untouched")
    original = load_file(f"{WORK}/hf/model.safetensors")
    again = load_file(f"{WORK}/export_untouched/model.safetensors")
    names = {k.replace("transformer.", ""): k for k in original if k != "lm_head.weight"}
    same = set(names) == set(again) and all(
        original[k].dtype == again[n].dtype and original[k].shape == again[n].shape and
        original[k].tobytes() == again[n].tobytes() for n, k in names.items())
    ok = ok and same
    print(f"export of the untouched import: {'bit-identical' if same else 'DIFFERS'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
