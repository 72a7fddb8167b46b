"""vLLM 0.32's DFlash proposer on CPU, with its per-layer context K-norm put back.

`DFlashQwen3Model._normalize_context_k` (`vllm/model_executor/models/qwen3_dflash.py`)
normalizes the context keys of every draft layer in one call,
`ops.rms_norm(out, all_k[L, n, kv_heads, head_dim], k_norm_weights[L, head_dim], eps)`, relying
on the kernel to pick weight row `l` for layer `l` (the CUDA kernel does, since vLLM PR #46761).
The CPU kernel (`csrc/cpu/layernorm.cpp`) reads only `weight[0 .. head_dim)`: every layer's
context keys are normalized with layer 0's `k_norm`. On the tiny fixture that puts layer 1's
context K 17.5 % off, and vLLM commits 2.596 tokens a step where the per-layer model (and
kquant's replay) gives 2.622. vLLM fixed the same fault on XPU with a per-layer fallback
(PR #56431); 0.32 has none for CPU.

Imported at start-up through PYTHONPATH (every process of the server), this file makes
`_normalize_context_k` call the same `ops.rms_norm` once per layer with that layer's weight —
what the method's own comment says it does. Nothing else changes. Used only by
tests/engines/serve.sh; never part of kquant.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from patch_on_import import after_import  # noqa: E402


def _per_layer_k_norm(module):
    ops = module.ops
    torch = module.torch

    def _normalize_context_k(self, all_k):
        out = torch.empty_like(all_k)
        for i in range(all_k.shape[0]):
            ops.rms_norm(
                out[i],
                all_k[i].contiguous(),
                self._k_norm_weights[i].contiguous(),
                self._rms_norm_eps,
            )
        return out

    module.DFlashQwen3Model._normalize_context_k = _normalize_context_k


after_import("vllm.model_executor.models.qwen3_dflash", _per_layer_k_norm)
