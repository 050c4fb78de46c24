#!/usr/bin/env python3
"""Checks that torch_llama.Llama (the PyTorch side of `weft bench train`'s LS row) is the
model of shared/reference/README.md: in float64 from llama-tiny's initial weights, on its
first global batch (2 micro-batches of 4), it must give the reference's step-0 loss and
gradient norm. Prints both pairs and exits 1 when they differ by more than 1e-7 relative.

  /usr/bin/python3 bench/train_throughput/check_torch_llama.py [--reference DIR]
"""
import argparse
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_llama import Llama  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", default=os.path.join(HERE, "../../../shared/reference"))
    a = ap.parse_args()
    sys.path.insert(0, a.reference)
    import make_reference as mr  # the reference's own readers and batch order

    case = os.path.join(a.reference, "llama-tiny")
    p = mr.load_safetensors(os.path.join(case, "init.safetensors"))
    m = Llama(2, 64, 4, 2, 176, 256, 32).double()
    # Hugging Face names -> this module's: drop "model.", "self_attn." and "mlp.".
    own = dict(m.named_parameters())
    with torch.no_grad():
        for name, t in p.items():
            key = name[len("model."):] if name.startswith("model.") else name
            own.pop(key.replace("self_attn.", "").replace("mlp.", "")).copy_(t.detach())
    assert not own, "not in init.safetensors: %s" % sorted(own)
    toks = mr.read_tokens(os.path.join(case, "tokens.bin"))

    class Shape:
        seq, batch = 32, 8

    loss = 0.0
    for b0 in (0, 4):
        x, y = mr.batch(Shape, toks, 0, b0, 4)
        part = m(x, y) / 2
        part.backward()
        loss += float(part)
    grad_norm = math.sqrt(sum(float((q.grad ** 2).sum()) for q in m.parameters()))
    with open(os.path.join(case, "expected.jsonl")) as f:
        ref = json.loads(f.readline())
    ok = True
    for what, got, want in (("loss", loss, ref["loss"]), ("grad_norm", grad_norm, ref["grad_norm"])):
        rel = abs(got - want) / abs(want)
        ok = ok and rel <= 1e-7
        print("%-9s torch_llama %.12f  reference %.12f  rel %.1e" % (what, got, want, rel))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
