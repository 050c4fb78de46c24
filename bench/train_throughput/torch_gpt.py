#!/usr/bin/env python3
"""The PyTorch side of `weft bench train`: the same GPT (tied head, pre-LN, tanh GELU,
causal attention), or with `--arch llama` the same Llama (torch_llama.py: RMSNorm, rotary,
grouped-query attention, SwiGLU, untied head), the same optimizer (AdamW with clipping) and
the same shapes, trained on the same kind of data for a few steps. Prints one JSON line:
{"tokens_per_s": ..., "peak_rss_mib": ..., "torch": version, "threads": n, "blas": ...}

Needs Debian's python3-torch (run with /usr/bin/python3). Not a build dependency.
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H, mlp):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.mproj = nn.Linear(C, mlp * C), nn.Linear(mlp * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=-1)
        q, k, v = [t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.mproj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, H, V, T, mlp=4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H, mlp) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    for k in ("layers", "dim", "heads", "vocab", "seq", "batch", "threads", "steps", "warmup"):
        ap.add_argument("--" + k, type=int, required=k not in ("steps", "warmup"))
    ap.add_argument("--arch", choices=("gpt", "llama"), default="gpt")
    ap.add_argument("--kv-heads", type=int, help="llama: key/value heads (default: heads)")
    ap.add_argument("--ffn-dim", type=int, help="llama: SwiGLU width (default: Llama's rule)")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.arch == "llama":
        from torch_llama import Llama  # beside this file

        ffn = a.ffn_dim or (8 * a.dim // 3 + 15) // 16 * 16
        model = Llama(a.layers, a.dim, a.heads, a.kv_heads or a.heads, ffn, a.vocab, a.seq,
                      a.rope_theta)
        params = model.param_groups(0.1)
    else:
        model = GPT(a.layers, a.dim, a.heads, a.vocab, a.seq)
        params = model.parameters()
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    steps, warmup = a.steps or 5, a.warmup if a.warmup is not None else 1
    t0 = None
    for s in range(warmup + steps):
        if s == warmup:
            t0 = time.perf_counter()
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        opt.zero_grad(set_to_none=True)
        loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    dt = time.perf_counter() - t0
    # The BLAS actually loaded (Debian's torch reports BLAS_INFO=generic and calls libblas.so.3,
    # which the alternatives system points at OpenBLAS).
    blas = "unknown"
    try:
        with open("/proc/self/maps") as maps:
            libs = maps.read()
        blas = next((n for n in ("openblas", "mkl", "blis") if "lib" + n in libs), "other")
    except OSError:
        pass
    print(json.dumps({"tokens_per_s": steps * a.batch * a.seq / dt,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "blas": blas,
                      "arch": a.arch, "params": sum(p.numel() for p in model.parameters()),
                      "loss": float(loss)}))


if __name__ == "__main__":
    main()
