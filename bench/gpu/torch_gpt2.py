"""GPT-2 training throughput in PyTorch (the baseline for bench/gpu/check.sh).

The same model as Weft's GPT (tied LM head, pre-LayerNorm blocks, tanh GELU, causal
attention through scaled_dot_product_attention), bf16 autocast with f32 weights, fused
AdamW, torch.compile; synthetic tokens; the same FLOPs-per-token formula as
weft_cuda_gpt2_bench (nanoGPT's estimate_mfu). Prints a line per step and writes a JSON
summary with --json.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    model = GPT(a.layers, a.dim, a.heads, a.vocab, a.seq).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_fn = model if a.no_compile else torch.compile(model)
    g = torch.Generator(device=dev).manual_seed(0)
    n = n_params - a.seq * a.dim  # as nanoGPT: without the position embedding
    flops_per_token = 6 * n + 12 * a.layers * a.dim * a.seq
    timed, tokens, loss_v = 0.0, 0, float("nan")
    for i in range(a.warmup + a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=g)
        y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v = loss.item()  # synchronises
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            timed += dt
            tokens += a.batch * a.seq
        print(f"step {i:3d} | loss {loss_v:.4f} | {dt * 1e3:.1f} ms | {a.batch * a.seq / dt:.0f} tok/s"
              + (" (warm-up)" if i < a.warmup else ""), flush=True)
    tps = tokens / timed
    mfu = tps * flops_per_token / (a.peak_tflops * 1e12)
    print(f"torch: {tps:.0f} tokens/s, MFU {100 * mfu:.1f}%, {1e3 * timed / a.steps:.1f} ms/step, "
          f"torch {torch.__version__}, compile={not a.no_compile}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"impl": "torch", "tokens_per_s": tps, "mfu": mfu,
                       "ms_per_step": 1e3 * timed / a.steps, "batch": a.batch, "seq": a.seq,
                       "params": n_params, "final_loss": loss_v, "torch": torch.__version__,
                       "compile": not a.no_compile}, f)
            f.write("\n")


if __name__ == "__main__":
    main()
