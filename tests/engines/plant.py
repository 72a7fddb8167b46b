#!/usr/bin/env python3
"""Write checkpoints with planted defects next to OUT, each a copy of an EAGLE-3 draft (Llama
attention, `layers.0.*` or `midlayer.*`) with one thing wrong, for showing that the engine-loader
harness catches what the engines accept silently:

    python plant.py SRC OUT      # OUT/renamed, OUT/no-fc, OUT/no-k_proj, OUT/fc-2-aux

- renamed:   `mlp.down_proj` stored as `mlp.dwn_proj`
- no-fc:     `fc.weight` removed
- no-k_proj: `self_attn.k_proj.weight` removed (the fused qkv is then only partly written)
- fc-2-aux:  `fc.weight` built for two aux layers ([H, 2H]) instead of three ([H, 3H])
"""

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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
