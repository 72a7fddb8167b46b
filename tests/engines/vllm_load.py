#!/usr/bin/env python3
"""Load one draft checkpoint with vLLM's own draft loader on CPU and print a verdict (JSON).

    python vllm_load.py --draft DIR --target-config DIR [--method eagle3|dflash]

Runs the same calls vLLM's EAGLE proposer makes (config parsing with the draft's quant config,
model construction with its quant method, `load_weights` over the real safetensors iterator,
`process_weights_after_loading`), with `VLLM_TARGET_DEVICE=cpu`. vLLM's own completeness check
is off for EAGLE-3 drafts (their `load_weights` returns None), so the harness adds two:

- every parameter is filled with a sentinel before loading; one still holding it afterwards is
  *unwritten* (except what vLLM itself takes from the target: the embedding / lm_head when the
  draft has none, DFlash's mask embedding when it has no separate one);
- every checkpoint tensor is tracked by its storage until it reaches a weight loader (or a
  `copy_` into a parameter); one that never does is *dropped* (except `t2d`, which vLLM drops by
  design).

The verdict: {"engine", "version", "ok", "stage" (where it stopped: config / build / load /
post-load / checks, or null), "message" (the engine's own, or the check's), "unwritten",
"dropped", "consumed"}. Exit 0 when a verdict was printed (loads or not), 3 when the harness
itself broke. One process per checkpoint: vLLM keeps global state.
"""

import argparse
import json
import os
import socket
import sys
import traceback

from checks import Sources, copies_marked, fill_sentinels, problems, still_sentinel

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# Names vLLM drops by design (`Eagle3LlamaForCausalLM.load_weights` skips `t2d`).
DROPPED_BY_DESIGN = {"t2d"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", required=True)
    ap.add_argument("--target-config", required=True)
    ap.add_argument("--method", default="eagle3")
    a = ap.parse_args()

    import torch
    import vllm

    v = {
        "engine": "vllm",
        "version": vllm.__version__,
        "ok": False,
        "stage": None,
        "message": None,
        "unwritten": [],
        "dropped": [],
        "consumed": 0,
    }
    stage = "config"
    try:
        from vllm.engine.arg_utils import EngineArgs

        ea = EngineArgs(
            model=a.target_config,
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            max_model_len=256,
            speculative_config={
                "method": a.method,
                "model": a.draft,
                "num_speculative_tokens": 3,
            },
        )
        cfg = ea.create_engine_config()
        stage = "build"
        from vllm.config import set_current_vllm_config
        from vllm.distributed import (
            ensure_model_parallel_initialized,
            init_distributed_environment,
        )
        from vllm.model_executor.model_loader import default_loader, get_model, weight_utils
        from vllm.model_executor.model_loader.utils import get_draft_load_config

        # Checkpoint tensors by storage, and which reached a loader.
        src = Sources(torch)
        mark = src.mark
        src.record(default_loader.DefaultModelLoader, "get_all_weights")

        orig_default_wl = weight_utils.default_weight_loader

        def default_weight_loader(param, loaded_weight, *r, **kw):
            mark(loaded_weight)
            return orig_default_wl(param, loaded_weight, *r, **kw)

        weight_utils.default_weight_loader = default_weight_loader
        for mod in list(sys.modules.values()):
            if getattr(mod, "default_weight_loader", None) is orig_default_wl:
                mod.default_weight_loader = default_weight_loader

        sentinel_params = {}
        orig_load = default_loader.DefaultModelLoader.load_weights

        def load_weights(self, model, model_config):
            nonlocal stage
            sentinel_params.update(fill_sentinels(torch, model, mark))
            stage = "load"
            with copies_marked(torch, mark):
                out = orig_load(self, model, model_config)
            # Checked before post-processing, which may repack parameters.
            # vLLM's own rule (DefaultModelLoader.track_weights_loading): KV-cache quantization
            # parameters fall back to defaults when a checkpoint has none; empty placeholders
            # hold no data.
            from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

            kv = set()
            for mname, mod in model.named_modules():
                if isinstance(getattr(mod, "quant_method", None), BaseKVCacheMethod):
                    kv.update(f"{mname}.{n}" if mname else n for n, _ in mod.named_parameters())
            v["unwritten"] = sorted(
                n
                for n, p in sentinel_params.items()
                if p.numel() > 0 and n not in kv and still_sentinel(torch, p) and not exempt(model, n)
            )
            stage = "post-load"
            return out

        default_loader.DefaultModelLoader.load_weights = load_weights

        with set_current_vllm_config(cfg):
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                backend="gloo",
                distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
            )
            ensure_model_parallel_initialized(1, 1)
            get_model(
                vllm_config=cfg,
                model_config=cfg.speculative_config.draft_model_config,
                load_config=get_draft_load_config(cfg),
            )
        stage = "checks"
        v["dropped"] = src.dropped(DROPPED_BY_DESIGN)
        v["consumed"] = len(src.consumed)
        bad = problems(v)
        if bad:
            v["message"] = bad
        else:
            v["ok"] = True
            stage = None
    except Exception as e:  # the engine refused: that is a verdict, not a harness failure
        v["message"] = f"{type(e).__name__}: {e}".strip()
        v["trace"] = traceback.format_exc().splitlines()[-6:]
    v["stage"] = stage
    print(json.dumps(v))
    return 0


def exempt(model, name):
    """What vLLM itself takes from the target (its own flags decide, on whichever module or
    config carries them)."""
    flags = {}
    for m in [model, *model.modules()]:
        for obj in (m, getattr(m, "config", None)):
            for f in ("has_own_embed_tokens", "has_own_lm_head", "has_separate_mask_embedding"):
                if obj is not None and isinstance(getattr(obj, f, None), bool):
                    flags.setdefault(f, getattr(obj, f))
    leaf = name.split(".")
    if "embed_tokens" in leaf and flags.get("has_own_embed_tokens") is False:
        return True
    if "lm_head" in leaf and flags.get("has_own_lm_head") is False:
        return True
    if "mask_embedding" in leaf and flags.get("has_separate_mask_embedding") is False:
        return True
    return False


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(3)
