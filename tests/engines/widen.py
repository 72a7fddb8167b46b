#!/usr/bin/env python3
"""Write a wider copy of a tiny draft for the quantized rows of the engine-loader matrix:

    python widen.py SRC OUT [--factor 8]

Every width of the draft (hidden, intermediate, head dims, MLA ranks) times FACTOR; vocabulary
sizes, layer counts, head counts and every other config field unchanged; new weights drawn
from a fixed seed (norms 1). The tiny drafts are 64 wide: the engines' group-128 schemes
need every quantized input width to be a multiple of 128 (vLLM and SGLang check it while
building the layer), and vLLM's CPU INT4 kernel wants output widths in multiples of 32 (the
MLA draft's fused q_a/kv_a is 56). Eight times the width meets both, at about 10 MB.

    python widen.py --head SRC OUT [--factor 8]

The target's embedding and lm_head alone (every shard of SRC read), widened alike: what the
calibration replay of a widened draft without them takes from `--target-checkpoint` (EAGLE-3
without `embed_tokens`, DFlash), for the `--method gptq` rows.
"""

import argparse
import glob
import json
import os

import torch
from safetensors.torch import load_file, save_file

WIDTHS = (
    "hidden_size",
    "target_hidden_size",
    "intermediate_size",
    "head_dim",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)
# Tensors with a vocabulary dimension (first) and a hidden one (second), or vocab-only maps.
VOCAB_ROWS = ("embed_tokens.weight", "lm_head.weight")
VOCAB_ONLY = ("d2t", "t2d")


def widen_config(cfg, k):
    for key in WIDTHS:
        if isinstance(cfg.get(key), int):
            cfg[key] *= k
    for sub in cfg.values():
        if isinstance(sub, dict):
            for key in WIDTHS:
                if isinstance(sub.get(key), int):
                    sub[key] *= k
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--factor", type=int, default=8)
    ap.add_argument("--head", action="store_true", help="the embedding and lm_head only")
    a = ap.parse_args()
    k = a.factor
    gen = torch.Generator().manual_seed(20261125)
    with open(os.path.join(a.src, "config.json")) as f:
        cfg = widen_config(json.load(f), k)
    tensors = {}
    for shard in sorted(glob.glob(os.path.join(a.src, "*.safetensors"))):
        tensors.update(load_file(shard))
    if a.head:
        tensors = {n: t for n, t in tensors.items() if n.endswith(VOCAB_ROWS)}
    out = {}
    for name, t in sorted(tensors.items()):
        if name.endswith(VOCAB_ONLY):
            out[name] = t.clone()
            continue
        if name.endswith(VOCAB_ROWS):
            shape = [t.shape[0], t.shape[1] * k]
        else:
            shape = [d * k for d in t.shape]
        if len(shape) == 1:
            w = torch.ones(shape, dtype=torch.float32)
        else:
            w = torch.randn(shape, generator=gen) * 0.02
        out[name] = w.to(t.dtype).contiguous()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file(out, os.path.join(a.out, "model.safetensors"))


if __name__ == "__main__":
    main()
