#!/usr/bin/env python3
"""Load one draft checkpoint with SGLang's own draft loader on CPU and print a verdict (JSON).

    python sglang_load.py --draft DIR --target-config DIR [--algorithm EAGLE3|DFLASH]
        [--layer-prefix midlayer.|layers.0.] [--plant swap-qk] [--pretend-sm 90]
    python sglang_load.py --jobs JOBS.json [--pretend-sm 90]   # one verdict line each

The calls SGLang's speculative worker makes for the draft (`ServerArgs` → `ModelConfig` of the
draft → `model_loader.get_model`: construction with its quant method, `load_weights`,
`process_weights_after_loading`), on CPU. Stand-ins, each only for something loading never
runs or that needs a GPU to answer:

- `vllm._custom_ops.rotary_embedding` (imported by `RotaryEmbedding.__init__`; RoPE never runs
  while loading) is a stub module;
- `get_device()` falls back to "cpu" (the MLA draft's rotary embedding asks for an accelerator);
- `--pretend-sm 90` answers `torch.cuda.get_device_capability()` for the quantization schemes'
  support check. With it, a run that stops where a CUDA kernel is set up after loading
  (Marlin's workspace) is reported as stage "kernel-setup": everything before it ran.

Checks as in vllm_load.py (SGLang drops names it cannot place without a word): sentinel-filled
parameters left unwritten, checkpoint tensors that reach no weight loader (followed through
`torch.cat`, which SGLang's MLA loader uses to fuse q_a and kv_a), and every parameter's content
against kquant's reading of the checkpoint (`hot_token_id` against d2t + its index). One forked
process per checkpoint, after the imports; `--pretend-sm` holds for the whole process.
"""

import argparse
import json
import os
import sys
import traceback

import types

from checks import (
    Sources,
    content,
    copies_marked,
    fill_sentinels,
    harness_args,
    kernel_setup_message,
    preload,
    problems,
    read_checkpoint,
    restore,
    run_jobs,
    still_sentinel,
)

DROPPED_BY_DESIGN = {"t2d"}


def stub_rotary():
    """`vllm._custom_ops.rotary_embedding` without vLLM (never called while loading)."""
    vllm = sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    ops = types.ModuleType("vllm._custom_ops")

    def rotary_embedding(*a, **k):
        raise RuntimeError("RoPE stub: not run while loading")

    ops.rotary_embedding = rotary_embedding
    sys.modules["vllm._custom_ops"] = ops
    vllm._custom_ops = ops


def load_one(job, pretend_sm):
    """One checkpoint through SGLang's draft loading (in a forked child); returns the verdict."""
    import torch
    import sglang

    algorithm = job.get("algorithm", "EAGLE3")
    v = {
        "engine": "sglang",
        "version": sglang.__version__,
        "ok": False,
        "stage": None,
        "message": None,
        "unwritten": [],
        "dropped": [],
        "consumed": 0,
        "compared": 0,
        "mismatched": [],
        "uncompared": [],
        # Answered for the schemes' capability check (a stand-in, so the verdict says so).
        "pretend_sm": pretend_sm,
    }
    stage = "config"
    try:
        import sglang.srt.utils as sutils

        orig_get_device = getattr(sutils, "get_device", None)
        if orig_get_device is not None:

            def get_device(*x, **k):
                try:
                    return orig_get_device(*x, **k)
                except Exception:
                    return "cpu"

            sutils.get_device = get_device
            for mod in list(sys.modules.values()):
                if getattr(mod, "get_device", None) is orig_get_device:
                    mod.get_device = get_device

        from sglang.srt.configs.device_config import DeviceConfig
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader import get_model, loader
        from sglang.srt.server_args import ServerArgs

        sa = ServerArgs(
            model_path=job["target_config"],
            device="cpu",
            speculative_algorithm=algorithm,
            speculative_draft_model_path=job["draft"],
            skip_tokenizer_init=True,
            disable_cuda_graph=True,
        )
        mc = ModelConfig.from_server_args(sa, model_path=job["draft"], is_draft_model=True)
        stage = "build"
        from sglang.test.layer_ut_utils import init_single_process_dist

        init_single_process_dist(backend="gloo")

        src = Sources(torch)
        mark = src.mark
        src.record(loader.DefaultModelLoader, "_get_all_weights")

        sentinel_params = {}
        by_design = set(DROPPED_BY_DESIGN)
        orig_load_only = loader.DefaultModelLoader.load_weights_only

        def load_weights_only(model, *x, **k):
            nonlocal stage
            sentinel_params.update(fill_sentinels(torch, model, mark, job.get("plant")))
            stage = "load"
            with src.following_cat(), copies_marked(torch, mark):
                out = orig_load_only(model, *x, **k)
            # SGLang's own decisions (speculative/eagle_worker_v2.py `init_lm_head`): an EAGLE-3
            # draft always takes the target's embedding (`set_embed`), and its lm_head too when
            # `load_lm_head_from_target`; `d2t` becomes `hot_token_id` by arithmetic, not a copy.
            exempt = set()
            # Defaults the engine fills itself when a checkpoint has none: KV-cache scales
            # (BaseKVCacheMethod), and ModelOpt W4A16 NVFP4's input_scale, "consumed during
            # loading and discarded before runtime" (ModelOptNvFp4A16LinearMethod, fill 1.0).
            from sglang.srt.layers.quantization.kv_cache import BaseKVCacheMethod

            for mname, mod in model.named_modules():
                qm = getattr(mod, "quant_method", None)
                names = [n for n, _ in mod.named_parameters(recurse=False)]
                pre = f"{mname}." if mname else ""
                if isinstance(qm, BaseKVCacheMethod):
                    exempt |= {pre + n for n in names}
                elif type(qm).__name__ == "ModelOptNvFp4A16LinearMethod":
                    exempt |= {pre + n for n in names if n == "input_scale"}
            if algorithm == "EAGLE3":
                exempt |= {n for n in sentinel_params if n.endswith("embed_tokens.weight")}
                if getattr(model, "load_lm_head_from_target", False):
                    exempt |= {n for n in sentinel_params if n.startswith("lm_head.")}
            if getattr(model, "confidence_head", False) is None:
                # SGLang's DSpark builds no confidence head in its default ragged-verify mode
                # (`build_confidence_head`: SGLANG_RAGGED_VERIFY_MODE=static) and its
                # `load_weights` skips `confidence_head.*` then, by design.
                by_design.update(n for n in src.names.values()
                                 if n.startswith("confidence_head."))
            hot = getattr(model, "hot_token_id", None)
            if hot is not None:
                src.consumed.update(n for n in src.names.values() if n.endswith("d2t"))
            v["unwritten"] = sorted(
                n
                for n, p in sentinel_params.items()
                if p.numel() > 0 and n not in exempt and still_sentinel(torch, p)
            )
            if job.get("content", True):
                tensors = read_checkpoint(job["draft"])
                compared, mismatched, uncompared = content(
                    torch, sentinel_params, tensors, job.get("layer_prefix"), exempt
                )
                if hot is not None and "d2t" in tensors:
                    # SGLang's reading of d2t (eagle_utils / llama_eagle3): target id = draft
                    # id + d2t[draft id].
                    d2t = tensors["d2t"]
                    compared.append("hot_token_id")
                    want = d2t + torch.arange(d2t.shape[0], dtype=d2t.dtype)
                    if not torch.equal(hot.detach().cpu().to(want.dtype), want):
                        mismatched.append("hot_token_id")
                v["compared"], v["mismatched"], v["uncompared"] = (
                    len(compared), mismatched, uncompared
                )
            restore(torch, sentinel_params, exempt)
            stage = "post-load"
            return out

        loader.DefaultModelLoader.load_weights_only = staticmethod(load_weights_only)

        try:
            get_model(
                model_config=mc,
                load_config=LoadConfig(load_format="auto"),
                device_config=DeviceConfig("cpu"),
            )
        except Exception as e:
            tb = traceback.format_exc()
            # ModelOpt per-tensor FP8 requantizes fused q/k/v and gate/up to their largest scale
            # after loading (`requantize_with_max_scale`) with sgl_kernel's
            # `sgl_per_tensor_quant_fp8`, a CUDA kernel not imported on CPU (NameError).
            gpu_op = "name 'sgl_per_tensor_quant_fp8' is not defined" in tb
            if stage == "post-load" and pretend_sm is not None and ("/torch/cuda/" in tb or gpu_op):
                # Everything up to the CUDA kernel set-up ran; that step cannot run on CPU.
                stage = "kernel-setup"
                v["message"] = kernel_setup_message(tb, "sglang")
            else:
                raise
        checks_stage = stage
        stage = "checks"
        v["dropped"] = src.dropped(by_design)
        v["dropped_by_design"] = sorted(by_design - DROPPED_BY_DESIGN)
        v["consumed"] = len(src.consumed)
        bad = problems(v)
        if bad:
            v["message"] = bad
        elif checks_stage == "kernel-setup":
            v["ok"] = True
            stage = "kernel-setup"
        else:
            v["ok"] = True
            stage = None
    except Exception as e:
        v["message"] = f"{type(e).__name__}: {e}".strip()
        v["trace"] = traceback.format_exc().splitlines()[-6:]
    v["stage"] = stage
    return v


# Imported once before forking (what loading the drafts imports).
PRELOAD = [
    "torch",
    "sglang",
    "sglang.srt.utils",
    "sglang.srt.configs.model_config",
    "sglang.srt.configs.load_config",
    "sglang.srt.server_args",
    "sglang.srt.model_loader",
    "sglang.srt.model_loader.loader",
    "sglang.srt.models.llama",
    "sglang.srt.models.llama_eagle3",
    "sglang.srt.models.deepseek_v2",
    "sglang.srt.models.kimi_k25_eagle3",
    "sglang.srt.models.dflash",
    "sglang.srt.models.dspark",
    "sglang.srt.layers.quantization.quark.quark",
    "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors",
    "sglang.srt.layers.quantization.modelopt_quant",
    "sglang.test.layer_ut_utils",
    "transformers.models.llama",
    "transformers.models.deepseek_v3",
    "transformers.models.qwen3",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pretend-sm", type=int, default=None)
    a, jobs = harness_args(ap, "--algorithm", "EAGLE3")
    import torch

    # Before any SGLang import: the stand-ins are process-wide (a capability read at import
    # time must see the pretended one).
    stub_rotary()
    if a.pretend_sm is not None:
        major, minor = divmod(a.pretend_sm, 10)
        torch.cuda.get_device_capability = lambda *x, **k: (major, minor)
        # SGLang's own helper answers (None, None) without a GPU; the schemes ask it.
        import sglang.srt.utils as sutils
        import sglang.srt.utils.common as scommon

        orig = scommon.get_device_capability
        pretend = lambda *x, **k: (major, minor)  # noqa: E731
        for mod in (sutils, scommon):
            mod.get_device_capability = pretend
    preload(PRELOAD)
    if a.pretend_sm is not None:
        for mod in list(sys.modules.values()):
            if getattr(mod, "get_device_capability", None) is orig:
                mod.get_device_capability = pretend
    run_jobs(jobs, lambda job: load_one(job, a.pretend_sm))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(3)
