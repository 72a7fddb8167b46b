#!/usr/bin/env python3
"""Write checkpoints with planted defects next to OUT, each a copy of an EAGLE-3 draft (Llama
attention, `layers.0.*` or `midlayer.*`) with one thing wrong, for showing that the engine-loader
harness catches what the engines accept silently:

    python plant.py SRC OUT      # OUT/renamed, OUT/no-fc, OUT/no-k_proj, OUT/fc-2-aux, OUT/mha

- renamed:   `mlp.down_proj` stored as `mlp.dwn_proj`
- no-fc:     `fc.weight` removed
- no-k_proj: `self_attn.k_proj.weight` removed (the fused qkv is then only partly written)
- fc-2-aux:  `fc.weight` built for two aux layers ([H, 2H]) instead of three ([H, 3H])
- mha:       no defect: the same draft with every k/v head repeated up to the query heads
             (`num_key_value_heads` = `num_attention_heads`), so that q and k have one shape;
             the harness's `--plant swap-qk` (a loader handing q as k and k as q) must then be
             caught by the content check, as no shape check can
"""

import json

import os
import shutil
import sys

from safetensors.torch import load_file, save_file


def main(src, out):
    tensors = load_file(os.path.join(src, "model.safetensors"))

    def write(name, t):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(src, "config.json"), os.path.join(d, "config.json"))
        save_file(t, os.path.join(d, "model.safetensors"))

    def find(part):
        return next(k for k in tensors if part in k)

    down = find("mlp.down_proj")
    t = dict(tensors)
    t[down.replace("down_proj", "dwn_proj")] = t.pop(down)
    write("renamed", t)
    t = dict(tensors)
    del t["fc.weight"]
    write("no-fc", t)
    t = dict(tensors)
    del t[find("k_proj")]
    write("no-k_proj", t)
    t = dict(tensors)
    h = t["fc.weight"].shape[0]
    t["fc.weight"] = t["fc.weight"][:, : 2 * h].contiguous()
    write("fc-2-aux", t)

    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    t = dict(tensors)
    for part in ("k_proj", "v_proj"):
        name = find(part)
        w = t[name]
        hd = w.shape[0] // kv
        t[name] = (
            w.reshape(kv, hd, -1).repeat_interleave(heads // kv, 0).reshape(heads * hd, -1)
        ).contiguous()
    write("mha", t)
    cfg["num_key_value_heads"] = heads
    with open(os.path.join(out, "mha", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
