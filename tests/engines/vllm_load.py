#!/usr/bin/env python3
"""Load one draft checkpoint with vLLM's own draft loader on CPU and print a verdict (JSON).

    python vllm_load.py --draft DIR --target-config DIR [--method eagle3|dflash]
        [--layer-prefix midlayer.|layers.0.] [--plant swap-qk]
    python vllm_load.py --jobs JOBS.json       # many checkpoints, one verdict line each

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

- every parameter, as loaded (before post-processing), is compared with the checkpoint tensors
  kquant's reading puts there (`checks.content`: the decoder layer under inspect's
  `layer_prefix`, fused q/k/v and gate/up as the concatenation of their parts); one holding
  anything else is *mismatched*.

The verdict: {"engine", "version", "ok", "stage" (where it stopped: config / build / load /
post-load / checks, or null), "message" (the engine's own, or the check's), "unwritten",
"dropped", "consumed", "compared", "mismatched", "uncompared"}. Exit 0 when the verdicts were
printed (loads or not), 3 when the harness itself broke. One forked process per checkpoint
(vLLM keeps global state), after the imports.
"""

import argparse
import json
import os
import socket
import sys
import traceback

from checks import (
    Sources,
    content,
    copies_marked,
    fill_sentinels,
    harness_args,
    kernel_setup_message,
    problems,
    preload,
    read_checkpoint,
    restore,
    run_jobs,
    still_sentinel,
)

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# Imported once before forking (what loading the drafts imports).
PRELOAD = [
    "torch",
    "vllm",
    "vllm.engine.arg_utils",
    "vllm.config",
    "vllm.distributed",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.model_loader.default_loader",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.llama_eagle3",
    "vllm.model_executor.models.deepseek_v2",
    "vllm.model_executor.models.deepseek_eagle3",
    "vllm.model_executor.models.qwen3",
    "vllm.model_executor.models.qwen3_dflash",
    "vllm.model_executor.models.qwen3_dflash2",
    "vllm.model_executor.models.qwen3_dspark",
    "vllm.models.kimi_k3.nvidia.dspark_mla",
    "vllm.transformers_utils.configs.k3_dspark",
    "vllm.model_executor.layers.quantization.quark.quark",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
    "vllm.model_executor.layers.quantization.modelopt",
    "vllm.model_executor.layers.quantization.kv_cache",
    "vllm.transformers_utils.configs.eagle",
    "transformers.models.llama",
    "transformers.models.deepseek_v3",
    "transformers.models.qwen3",
]

# Names vLLM drops by design (`Eagle3LlamaForCausalLM.load_weights` skips `t2d`).
DROPPED_BY_DESIGN = {"t2d"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pretend_gpu_kernels():
    """Where vLLM's CPU platform has no kernel for a scheme (NVFP4), take the one it picks on a
    Hopper GPU (`init_nvfp4_linear_kernel`: Marlin FP4 for SM 8.0–9.0): construction and
    loading then run as there; the kernel's own set-up after loading needs the GPU and is
    reported as stage "kernel-setup"."""
    from vllm.model_executor.kernels.linear import NvFp4LinearLayerConfig
    from vllm.model_executor.kernels.linear.nvfp4.marlin import MarlinNvFp4LinearKernel

    class Marlin(MarlinNvFp4LinearKernel):
        @classmethod
        def is_supported(cls, *a, **k):
            return True, None

    def init_nvfp4_linear_kernel(use_a16=False):
        return Marlin(NvFp4LinearLayerConfig())

    for mod in list(sys.modules.values()):
        if getattr(mod, "init_nvfp4_linear_kernel", None) is not None and (
            getattr(mod, "__name__", "").startswith("vllm.")
        ):
            mod.init_nvfp4_linear_kernel = init_nvfp4_linear_kernel


def same_cpu_everywhere():
    """Report the CPU as one without AMX tiles. The vLLM wheel is a CUDA build: its `_C` has
    none of vLLM's CPU kernels, and its CPU post-load processing calls one of them
    (`torch.ops._C.convert_weight_packed`) only where the CPU has AMX (`model_executor/layers/
    utils.py`, `kernels/linear/scaled_mm/cpu.py`). Without this, every verdict on an Intel
    machine with AMX would be that AttributeError; with it, every machine takes the path every
    x86 CPU without AMX takes, and the verdicts do not depend on which CPU CI gets."""
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False
    if hasattr(torch.cpu, "_is_amx_fp16_supported"):
        torch.cpu._is_amx_fp16_supported = lambda: False


def load_one(job, pretend_gpu=False):
    """One checkpoint through vLLM's draft loading (in a forked child); returns the verdict."""
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
        "compared": 0,
        "mismatched": [],
        "uncompared": [],
        "pretend_gpu": pretend_gpu,
    }
    stage = "config"
    try:
        from vllm.engine.arg_utils import EngineArgs

        if job.get("runner") == "v2":
            # DSpark and DFlash2 drafts run on the V2 GPU model runner only; CPU has V1,
            # whose check refuses them. Validate the config for V2 instead (stand-in).
            from vllm.config import VllmConfig

            VllmConfig._validate_v1_model_runner = VllmConfig._validate_v2_model_runner
            v["runner"] = "v2"

        ea = EngineArgs(
            model=job["target_config"],
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            max_model_len=256,
            speculative_config={
                "method": job.get("method", "eagle3"),
                "model": job["draft"],
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
        loaded = {}
        orig_load = default_loader.DefaultModelLoader.load_weights

        def load_weights(self, model, model_config):
            nonlocal stage
            loaded["model"] = model
            sentinel_params.update(fill_sentinels(torch, model, mark, job.get("plant")))
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
            skip = kv | {n for n in sentinel_params if exempt(model, n)}
            if modelopt_algo(job["draft"]) == "W4A16_NVFP4":
                # vLLM registers a NaN `input_scale` for W4A16 NVFP4 and drops it after
                # loading (modelopt.py `_DropInputScale`): genuine exports have none.
                skip |= {n for n in sentinel_params if n.endswith(".input_scale")}
            v["unwritten"] = sorted(
                n
                for n, p in sentinel_params.items()
                if p.numel() > 0 and n not in skip and still_sentinel(torch, p)
            )
            if job.get("content", True):
                compared, mismatched, uncompared = content(
                    torch, sentinel_params, read_checkpoint(job["draft"]),
                    job.get("layer_prefix"), skip,
                )
                v["compared"], v["mismatched"], v["uncompared"] = (
                    len(compared), mismatched, uncompared
                )
            restore(torch, sentinel_params, skip)
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
            try:
                get_model(
                    vllm_config=cfg,
                    model_config=cfg.speculative_config.draft_model_config,
                    load_config=get_draft_load_config(cfg),
                )
            except Exception:
                tb = traceback.format_exc()
                # ModelOpt / Quark per-tensor FP8 requantizes fused q/k/v and gate/up to their
                # largest scale after loading (`requantize_with_max_scale`,
                # quantization/utils/w8a8_utils.py) with `ops.scaled_fp8_quant`, a CUDA op the CPU
                # build lacks (`torch.ops._C.static_scaled_fp8_quant`).
                gpu_op = "static_scaled_fp8_quant" in tb and "'_C' object has no attribute" in tb
                if stage == "post-load" and pretend_gpu and ("/kernels/" in tb or gpu_op):
                    # Everything up to the GPU kernel's own set-up ran.
                    stage = "kernel-setup"
                    v["message"] = kernel_setup_message(tb, "vllm")
                else:
                    raise
        checks_stage = stage
        stage = "checks"
        away = mapped_away(loaded.get("model"), src)
        v["dropped"] = src.dropped(DROPPED_BY_DESIGN | away)
        v["dropped_by_design"] = sorted(away)
        v["consumed"] = len(src.consumed)
        bad = problems(v)
        if bad:
            v["message"] = bad
        else:
            v["ok"] = True
            stage = "kernel-setup" if checks_stage == "kernel-setup" else None
    except Exception as e:  # the engine refused: that is a verdict, not a harness failure
        v["message"] = f"{type(e).__name__}: {e}".strip()
        v["trace"] = traceback.format_exc().splitlines()[-6:]
    v["stage"] = stage
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--pretend-gpu",
        action="store_true",
        help="choose the GPU kernels vLLM would on a Hopper GPU (SM 9.0) where CPU has none",
    )
    a, jobs = harness_args(ap, "--method", "eagle3")
    # The engine's imports, once, before forking a child per checkpoint.
    preload(PRELOAD)
    same_cpu_everywhere()
    if a.pretend_gpu:
        pretend_gpu_kernels()
    run_jobs(jobs, lambda job: load_one(job, a.pretend_gpu))
    return 0


def mapped_away(model, src):
    """Checkpoint names the model's own `hf_to_vllm_mapper` maps to None: vLLM drops them by
    design (K3DSparkForCausalLM: `embed_tokens`, `lm_head`, which it shares from the target)."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is None or not hasattr(mapper, "_map_name"):
        return set()
    return {n for n in set(src.names.values()) if mapper._map_name(n) is None}


def modelopt_algo(draft):
    """`quant_algo` of a ModelOpt checkpoint (config.json's quantization_config), or None."""
    try:
        with open(os.path.join(draft, "config.json")) as f:
            q = json.load(f).get("quantization_config") or {}
    except (OSError, ValueError):
        return None
    return q.get("quant_algo") if q.get("quant_method") == "modelopt" else None


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
