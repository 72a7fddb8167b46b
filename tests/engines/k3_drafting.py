"""What an installed engine's own source says about drafting beside Kimi-K3 (#41 item 6): the
draft families it captures taps for and the attention-residual stream it hands them. Run with the
engine's Python (`python k3_drafting.py vllm|sglang`); prints one JSON object. matrix.py holds
kquant's `inspect` `drafting` rows (src/engines/target.rs) to it.

The engines' K3 model modules need a GPU to build, so the facts are read from the installed
source itself (Python's `ast` on the files the engine imports) and, where it is a plain setting,
from the engine's own settings module:

- vLLM: `KimiK3ForConditionalGeneration` declares `SupportsEagle3` (its `eagle3`, `dflash` and
  `dspark` methods all capture through that interface); the CUDA model taps the stream named by
  `VLLM_KIMI_K3_AUX_ATTN_RES_STREAM` (read from `vllm.envs`, off by default: the prefix sum,
  kquant's `partial`); the ROCm model (`amd/`) never reads it.
- SGLang: the K3 classes' `set_*_layers_to_capture` methods (no EAGLE-3 one: EAGLE-3 is refused
  by `configure_aux_hidden_state_capture`), and `_dspark_capture_stream`, which captures the
  mixture the next layer reads.
"""

import ast
import importlib.util
import json
import os
import sys

AUX = ["eagle3", "eagle3-mla", "dflash", "dspark", "dflash2"]


def source(module):
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise SystemExit(f"{module} is not installed in this Python")
    with open(spec.origin) as f:
        return spec.origin, f.read()


def classes(text):
    return {n.name: n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef)}


def methods(cls):
    return {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def base_names(cls):
    out = set()
    for b in cls.bases:
        if isinstance(b, ast.Name):
            out.add(b.id)
        elif isinstance(b, ast.Attribute):
            out.add(b.attr)
    return out


def vllm():
    path, text = source("vllm.models.kimi_k3.nvidia.model")
    c = classes(text)
    k3 = c["KimiK3ForConditionalGeneration"]
    eagle3 = "SupportsEagle3" in base_names(k3)
    model = c["KimiLinearModel"]
    reads_switch = "_aux_attn_res_stream" in methods(model) and "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM" in text
    os.environ.pop("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", None)
    import vllm.envs as envs

    default_on = bool(envs.VLLM_KIMI_K3_AUX_ATTN_RES_STREAM)
    amd_path, amd_text = source("vllm.models.kimi_k3.amd.linear")
    spec_path, spec_text = source("vllm.config.speculative")
    have_methods = all(f'"{m}"' in spec_text for m in ("eagle3", "dflash", "dspark"))
    return {
        "engine": "vllm",
        "families": AUX if eagle3 and have_methods else [],
        "stream": "mixture" if default_on else "partial",
        "switch": reads_switch,
        "rocm_reads_switch": "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM" in amd_text,
        "read": [path, amd_path, spec_path, envs.__file__],
    }


def sglang():
    path, text = source("sglang.srt.models.kimi_k3")
    c = classes(text)
    k3 = c["KimiK3ForConditionalGeneration"]
    have = methods(k3)
    families = []
    if "set_dspark_layers_to_capture" in have:
        families += ["dspark"]
    if "set_dflash_layers_to_capture" in have:
        families += ["dflash", "dflash2"]
    if "set_eagle3_layers_to_capture" in have:
        families += ["eagle3", "eagle3-mla"]
    capture = [n for n in c.values() if "_dspark_capture_stream" in methods(n)]
    return {
        "engine": "sglang",
        "families": sorted(families, key=AUX.index),
        # `_dspark_capture_stream` forms the next layer's mixture; without it the capture
        # would be the plain prefix.
        "stream": "mixture" if capture else "partial",
        "switch": False,
        "read": [path],
    }


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which not in ("vllm", "sglang"):
        raise SystemExit("usage: k3_drafting.py vllm|sglang")
    print(json.dumps(vllm() if which == "vllm" else sglang()))
