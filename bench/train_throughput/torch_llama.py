"""The Llama model of `weft bench train`'s LS row on the PyTorch side, imported by
torch_gpt.py (`--arch llama`): the semantics of shared/reference/README.md and
core/models/llama.cc. RMSNorm (eps inside the sqrt, weight, no bias), rotary positions in
the rotate-half convention, grouped-query causal attention with scale 1/sqrt(hd), SwiGLU
MLP, untied head, no biases anywhere.

Debian's torch 1.13 has no scaled_dot_product_attention, so attention is written out like
the GPT side's (scores, causal mask, softmax, probabilities times V: the same work Weft
does, which also keeps the (B,H,T,T) probabilities for backward), with each KV head
repeated for its H/KV query heads by repeat_interleave, as transformers' repeat_kv does.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, C, H, KV, Fw, eps):
        super().__init__()
        self.H, self.KV, self.hd = H, KV, C // H
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(C, eps), RMSNorm(C, eps)
        self.q_proj = nn.Linear(C, H * self.hd, bias=False)
        self.k_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.o_proj = nn.Linear(H * self.hd, C, bias=False)
        self.gate_proj = nn.Linear(C, Fw, bias=False)
        self.up_proj = nn.Linear(C, Fw, bias=False)
        self.down_proj = nn.Linear(Fw, C, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(B, T, self.H, self.hd).transpose(1, 2)  # (B,H,T,hd)
        k = self.k_proj(y).view(B, T, self.KV, self.hd).transpose(1, 2)  # (B,KV,T,hd)
        v = self.v_proj(y).view(B, T, self.KV, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.H // self.KV
        k = k.repeat_interleave(group, dim=1)  # query head h reads KV head h // group
        v = v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        a = (att @ v).transpose(1, 2).reshape(B, T, self.H * self.hd)
        x = x + self.o_proj(a)
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Llama(nn.Module):
    def __init__(self, L, C, H, KV, Fw, V, T, theta=10000.0, eps=1e-5):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block(C, H, KV, Fw, eps) for _ in range(L))
        self.norm = RMSNorm(C, eps)
        self.lm_head = nn.Linear(C, V, bias=False)
        hd = C // H
        # cos/sin (T, hd): pair j (dimensions j and j + hd/2) turns by t * theta^(-2j/hd).
        inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).tril(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx, tgt):
        T = idx.shape[1]
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        x = self.embed_tokens(idx)
        for b in self.layers:
            x = b(x, cos, sin, mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))

    def param_groups(self, weight_decay):
        """AdamW groups as Weft's optimizer: decay on the 2-D weights only."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
