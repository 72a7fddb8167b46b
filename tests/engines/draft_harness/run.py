#!/usr/bin/env python3
# Run with the vLLM 0.33.0 engine venv (tests/engines/venv.sh vllm).
"""vLLM's own DSpark / DFlash2 drafting, on CPU, over a kquant trace: the proposals vLLM makes at
every root of every sample, and the greedy walk's accept length (vLLM's count).

    run.py --draft DIR [--target DIR] [--trace DIR] [--limit N] [--ids 0,3] [--dtype float32|bfloat16]
           [--topk K] [--out FILE]

No engine serves these drafts on CPU (vLLM 0.33 refuses them on its V1 runner; its V2 runner
needs Triton), so this builds the draft the way the V2 runner's speculator does and runs the
engine's own code wherever it can run on CPU:

* config: vLLM's EngineArgs / VllmConfig for target + draft (`method` dspark, or dflash for a
  DFlash2DraftModel), with the V1-runner refusal switched off (stand-in 1);
* model: `load_dspark_model` / `load_dflash_model` (vLLM's own loaders: `get_model` ->
  Qwen3DSparkForCausalLM / DFlash2Qwen3ForCausalLM, their `load_weights` over the safetensors,
  then the target's embedding and lm_head shared by vLLM's own sharing code) given a target
  holding only the target's embed_tokens / lm_head (stand-in 2);
* context: `combine_hidden_states` (fc) over the trace's taps (vLLM's aux ids, from
  `get_eagle3_aux_layers_from_config`), then the model's own `precompute_and_store_context_kv`,
  whose cache write is captured (stand-in 3); its `ops.rms_norm` / `ops.rotary_embedding` are
  CUDA-only in this wheel and run as vLLM's PyTorch-native versions of the same ops (stand-in 4);
* query block: the layout `_prepare_dflash_inputs_kernel` (Triton) writes, in PyTorch
  (stand-in 5): DSpark [x_r, MASK x (N-1)] at r..r+N-1, sample rows 0..N-1 at pos+1;
  DFlash2 [x_r, MASK x N] at r..r+N, sample rows 1..N at pos;
* backbone: the model's own forward (decoder layers, norms, qkv/o projections, q/k norm,
  rotary embedding, MLP, DFlash2's DFlashGroupedConv on its CPU path), with only the paged
  attention op (`Attention`) replaced by plain attention over the captured context K/V of rows
  < r plus the block, non-causal within the block unless the layer is causal (stand-in 6);
* DSpark: `DSparkSpeculator._sample_sequential` (or `_sample_sequential_topk` with --topk) run
  on a speculator object created without __init__ that holds the buffers it reads (stand-in 7);
  confidences: its own `compute_confidence` branch (use_confidence_head on);
* DFlash2: `compute_candidates`, `DFlash2Speculator._score_candidates` (same stand-in object),
  and the greedy walk of `_selector_walk_kernel` (Triton) reproduced in PyTorch from its source
  (stand-in 8).

Output JSON: {draft, family, layout, dtype, stand_ins, samples: [{id, prompt_len, total_len,
roots: {r: [N proposals]}, confidences: {r: [...]} (DSpark), walk: {steps, committed, al}}],
aggregate}. Roots are r = prompt_len .. T-2 (anchor x_r at position r, context rows < r); the
walk starts at r = prompt_len, accepts the leading proposals equal to x[r+1..], commits them
plus one bonus (capped so the bonus is still in the trace), next root r + accepted + 1; AL =
committed / steps (vLLM's 1 + accepted / verify steps).
"""

import argparse
import json
import os
import socket
import sys
import time
import types
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
FIX = REPO / "fixtures" / "kimi-k2.5-tiny"

STAND_INS = {
    "config": "VllmConfig._get_v1_model_runner_unsupported_features -> [] (vLLM refuses dspark / "
    "DFlash candidate heads on its V1 runner, and its V2 runner needs Triton; the config is "
    "otherwise vLLM's own)",
    "target": "the target model is a module holding only the target checkpoint's "
    "model.embed_tokens (VocabParallelEmbedding) and lm_head (ParallelLMHead); vLLM's "
    "load_dspark_model / load_dflash_model share them into the draft with their own code",
    "kv_cache": "precompute_and_store_context_kv runs as vLLM's own code; its KV-cache write "
    "(attn.impl.do_kv_cache_update) is captured into per-layer [T, kv_heads, head_dim] K/V "
    "instead of a paged cache",
    "cpu_ops": "vllm._custom_ops.rms_norm / rotary_embedding (CUDA-only in the vLLM 0.33.0 "
    "wheel) run as PyTorch: rms_norm = RMSNorm.forward_static per row with the weight row of the "
    "outermost index for a 2-D weight (the CUDA kernel's per-layer K-norm), rotary_embedding = "
    "RotaryEmbedding.forward_static in place",
    "prepare_inputs": "_prepare_dflash_inputs_kernel (Triton) reproduced in PyTorch: input_ids, "
    "positions, sample_indices, sample_pos for the uniform N or 1+N query block",
    "attention": "Attention (paged attention op) replaced by plain attention (fp32 softmax): "
    "queries of the block over the captured context K/V of rows < r and the block's own K/V, "
    "non-causal within the block (causal if the layer is), scale = the layer's Attention scale",
    "mla_attention": "K3 MultiHeadLatentAttention._attention (the fused RoPE + cache-insert "
    "epilogues and the MLA backend's forward_mqa, GPU kernels) replaced by plain PyTorch: the "
    "layer's own rotary_emb (RotaryEmbedding.forward_static over its fp32 cos_sin_cache, "
    "is_neox_style False) on q_pe and k_pe, then latent attention with the layer's own absorbed "
    "W_UK_T / W_UV (process_weights_after_loading): scores (q_nope W_UK_T . kv_c + q_pe . k_pe) "
    "* the layer's scale over the captured context latents of rows < r and the block's own, "
    "fp32 softmax, non-causal, output W_UV; context latents captured from "
    "precompute_and_store_context_kv's per-layer impl.do_kv_cache_update "
    "(_has_uniform_block_layout -> False: no paged cache to group)",
    "fused_q_kv_rmsnorm": "vllm.models.common.ops.fused_q_kv_rmsnorm (a Triton kernel: "
    "q_a_layernorm and kv_a_layernorm in one launch) run as two RMSNorms in PyTorch, fp32 "
    "statistics, the weight applied in the input dtype",
    "speculator": "DSparkSpeculator / DFlash2Speculator methods called on an object created "
    "with __new__ that holds the buffers they read (sample_indices, sample_pos, "
    "sample_idx_mapping, input_buffers.input_ids, _anchor_idx, draft_tokens, ...); "
    "greedy (draft_logits None), no acceptance estimator",
    "selector_walk": "_selector_walk_kernel (Triton) reproduced in PyTorch from its source: "
    "previous = 0; per step scores[step, previous, :] as fp32, argmax (leftmost on ties, "
    "tl.max return_indices), token = candidates[step, index], previous = index",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def patch_cpu_ops(torch):
    """Stand-in `cpu_ops`."""
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    orig_rms, orig_rot = ops.rms_norm, ops.rotary_embedding

    def rms_one(x, w, eps):
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        y = xf * torch.rsqrt(var + eps)
        y = y.to(x.dtype)
        return y * w if w is not None else y

    def rms_norm(out, input, weight, epsilon):
        if input.is_cuda:
            return orig_rms(out, input, weight, epsilon)
        if weight is not None and weight.dim() == 2:
            for i in range(input.shape[0]):
                out[i].copy_(rms_one(input[i], weight[i], epsilon))
        else:
            out.copy_(rms_one(input, weight, epsilon))

    def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox, *a, **k):
        if query.is_cuda:
            return orig_rot(positions, query, key, head_size, cos_sin_cache, is_neox, *a, **k)
        assert not a and not k, "rope_dim_offset / inverse not used by these drafts"
        rot_dim = cos_sin_cache.shape[-1]
        q, kk = RotaryEmbedding.forward_static(
            positions, query, key, head_size, rot_dim, cos_sin_cache, is_neox
        )
        query.copy_(q)
        if key is not None:
            key.copy_(kk)

    ops.rms_norm = rms_norm
    ops.rotary_embedding = rotary_embedding


def RMSNormStatic(torch):
    """RMSNorm of each row in fp32, weight applied in the input dtype (RMSNorm.forward_static)."""

    def rms(x, w, eps):
        xf = x.float()
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        return y * w

    return rms


def rms_check(torch):
    """Which of the two ops exist on CPU in this wheel (reported, not needed)."""
    from vllm import _custom_ops as ops  # noqa: F401

    out = {}
    x = torch.ones(2, 8)
    try:
        torch.ops._C.rms_norm(torch.empty_like(x), x, torch.ones(8), 1e-6)
        out["_C.rms_norm on CPU"] = "present"
    except Exception as e:  # noqa: BLE001
        out["_C.rms_norm on CPU"] = f"absent ({type(e).__name__})"
    return out


class Ctx:
    """What the stand-in attention reads: captured context K/V per layer, the roots of the
    current batch and the query rows per request."""

    def __init__(self):
        self.K, self.V = {}, {}
        self.roots = None
        self.Q = None


class PlainMlaAttention:
    """Stand-in `MultiHeadLatentAttention._attention` (K3 MLA DSpark): RoPE with the layer's own
    rotary table, latent attention over the captured context latents and the block's own."""

    def __init__(self, torch, sa, li, ctx):
        self.sa, self.li, self.ctx = sa, li, ctx

    def __call__(self, positions, q, kv_c_normed, k_pe, attn_out):
        from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

        sa, c = self.sa, self.ctx
        roots, Q = c.roots, c.Q
        R = roots.shape[0]
        nh, nope, rd, L = sa.num_local_heads, sa.qk_nope_head_dim, sa.qk_rope_head_dim, sa.kv_lora_rank
        re = sa.rotary_emb
        q_nope, q_pe = q.split([nope, rd], -1)
        q_pe, k_pe = RotaryEmbedding.forward_static(
            positions, q_pe.reshape(q.shape[0], -1).clone(), k_pe.reshape(k_pe.shape[0], -1).clone(),
            rd, rd, re.cos_sin_cache, re.is_neox_style)
        q_pe = q_pe.view(R, Q, nh, rd).float()
        k_pe = k_pe.view(R, Q, rd).float()
        ql = torch.einsum("nhp,hpl->nhl", q_nope.float(), sa.W_UK_T.float()).view(R, Q, nh, L)
        kc = kv_c_normed.view(R, Q, L).float()
        Cc, Cpe = c.K[self.li].float(), c.V[self.li].float().reshape(-1, rd)  # [T, L], [T, rd]
        T = Cc.shape[0]
        sc = (torch.einsum("rqhl,tl->rhqt", ql, Cc) + torch.einsum("rqhd,td->rhqt", q_pe, Cpe)) * sa.scale
        sc = sc.masked_fill(~(torch.arange(T)[None, :] < roots[:, None])[:, None, None, :], float("-inf"))
        sb = (torch.einsum("rqhl,rkl->rhqk", ql, kc) + torch.einsum("rqhd,rkd->rhqk", q_pe, k_pe)) * sa.scale
        p = torch.softmax(torch.cat([sc, sb], -1), -1)
        lat = torch.einsum("rhqt,tl->rqhl", p[..., :T], Cc) + torch.einsum("rhqk,rkl->rqhl", p[..., T:], kc)
        o = torch.einsum("nhl,hlv->nhv", lat.reshape(R * Q, nh, L), sa.W_UV.float())
        attn_out.copy_(o.reshape(R * Q, -1).to(attn_out.dtype))


class PlainAttention(torch.nn.Module):
    """Stand-in `attention` (called as `self.attn(q, k, v)` inside DFlashQwen3Attention)."""

    def __init__(self, torch, attn, li, ctx, causal):
        super().__init__()
        self.li, self.ctx, self.causal = li, ctx, causal
        self.nh, self.nkv, self.hd = attn.num_heads, attn.num_kv_heads, attn.head_size
        self.scale = attn.impl.scale if hasattr(attn, "impl") else attn.scale
        self.sliding = getattr(attn, "sliding_window", None)

    def forward(self, q, k, v):
        c = self.ctx
        roots, Q = c.roots, c.Q
        R = roots.shape[0]
        nh, nkv, hd = self.nh, self.nkv, self.hd
        g = nh // nkv
        qf = q.view(R, Q, nh, hd).float()
        kf = k.view(R, Q, nkv, hd).float().repeat_interleave(g, 2)
        vf = v.view(R, Q, nkv, hd).float().repeat_interleave(g, 2)
        Kc = c.K[self.li].float().repeat_interleave(g, 1)  # [T, nh, hd]
        Vc = c.V[self.li].float().repeat_interleave(g, 1)
        T = Kc.shape[0]
        sc = torch.einsum("rqhd,thd->rhqt", qf, Kc) * self.scale
        vis = torch.arange(T)[None, :] < roots[:, None]  # context rows < r
        if self.sliding:
            qpos = roots[:, None] + torch.arange(Q)[None]
            raise NotImplementedError("sliding-window draft layers", self.sliding, qpos.shape)
        sc = sc.masked_fill(~vis[:, None, None, :], float("-inf"))
        sb = torch.einsum("rqhd,rkhd->rhqk", qf, kf) * self.scale
        if self.causal:
            cm = torch.ones(Q, Q, dtype=torch.bool).triu(1)
            sb = sb.masked_fill(cm, float("-inf"))
        p = torch.softmax(torch.cat([sc, sb], -1), -1)
        o = torch.einsum("rhqt,thd->rqhd", p[..., :T], Vc) + torch.einsum("rhqk,rkhd->rqhd", p[..., T:], vf)
        return o.reshape(R * Q, nh * hd).to(q.dtype)


def build(args, torch):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    VllmConfig._get_v1_model_runner_unsupported_features = lambda self: []
    dcfg = json.load(open(Path(args.draft) / "config.json"))
    arch = dcfg["architectures"][0]
    if arch in ("Qwen3DSparkModel", "DSparkDraftModel", "K3DSparkModel"):
        family, method = "dspark", "dspark"
        n = int(dcfg.get("block_size") or dcfg.get("dspark_block_size"))
    elif arch == "DFlash2DraftModel":
        family, method = "dflash2", "dflash"
        n = int(dcfg["block_size"]) - 1
    else:
        raise SystemExit(f"not a DSpark / DFlash2 draft: {arch}")
    if args.num_spec:
        n = args.num_spec
    ea = EngineArgs(
        model=str(args.target),
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype=args.dtype,
        max_model_len=512,
        speculative_config={"method": method, "model": str(args.draft), "num_speculative_tokens": n},
    )
    cfg = ea.create_engine_config()
    cm = set_current_vllm_config(cfg)
    cm.__enter__()
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
    )
    ensure_model_parallel_initialized(1, 1)

    # Stand-in `target`: the target's embedding and lm_head, vLLM's own layer classes.
    from safetensors import safe_open
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    dt = cfg.model_config.dtype
    with safe_open(str(Path(args.target) / "model.safetensors"), "pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
        head = f.get_tensor("lm_head.weight")
    target = torch.nn.Module()
    target.model = torch.nn.Module()
    target.model.embed_tokens = VocabParallelEmbedding(emb.shape[0], emb.shape[1], params_dtype=dt)
    target.lm_head = ParallelLMHead(head.shape[0], head.shape[1], params_dtype=dt)
    target.model.embed_tokens.weight_loader(target.model.embed_tokens.weight, emb)
    target.lm_head.weight_loader(target.lm_head.weight, head)
    # vLLM's post-load step for these layers (picks the CPU GEMM).
    for m in (target.model.embed_tokens, target.lm_head):
        m.quant_method.process_weights_after_loading(m)

    if family == "dspark":
        from vllm.v1.worker.gpu.spec_decode.dspark.utils import load_dspark_model

        model = load_dspark_model(target, cfg)
    else:
        from vllm.v1.worker.gpu.spec_decode.dflash.utils import load_dflash_model

        model = load_dflash_model(target, cfg)
    model.eval()
    shared = {
        "embed_tokens": model.model.embed_tokens is target.model.embed_tokens,
        "lm_head": model.lm_head is target.lm_head,
    }
    return cfg, model, family, n, dcfg, shared


def load_trace(trace_dir, torch):
    from safetensors.torch import load_file

    man = json.load(open(Path(trace_dir) / "manifest.json"))
    shards = {}
    out = []
    for s in man["samples"]:
        if s["shard"] not in shards:
            shards[s["shard"]] = load_file(str(Path(trace_dir) / s["shard"]))
        t = shards[s["shard"]]
        i = s["id"]
        out.append({"meta": s, "x": t[f"s{i}.tokens"].long(),
                    "taps": {k: t[f"s{i}.tap.{k}"] for k in man["taps"]}})
    return man, out


def walk(x, props, P):
    """The greedy walk (vLLM count), as common.walk / src/replay/walk.rs schedule it."""
    T = len(x)
    r, steps, committed = P, 0, 0
    path = []
    while r + 1 < T:
        d = props[r]
        n = 0
        while n < len(d) and r + 1 + n < T and d[n] == int(x[r + 1 + n]):
            n += 1
        n = min(n, T - r - 2)
        steps += 1
        committed += n + 1
        path.append([r, n])
        r += n + 1
    return {"steps": steps, "committed": committed, "al": committed / steps if steps else 1.0, "path": path}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", required=True)
    ap.add_argument("--target", default=str(FIX / "target"))
    ap.add_argument("--trace", default=str(FIX / "trace"))
    ap.add_argument("--limit", type=int, default=None, help="first N samples")
    ap.add_argument("--ids", default=None, help="comma-separated sample ids")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--topk", type=int, default=None, help="DSpark: dspark_draft_topk (_sample_sequential_topk)")
    ap.add_argument("--num-spec", type=int, default=None, help="num_speculative_tokens (default: the config's block)")
    ap.add_argument("--chunk", type=int, default=32, help="roots per forward")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    t0 = time.time()
    patch_cpu_ops(torch)
    import vllm

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from vllm_load import same_cpu_everywhere  # the loader tier's CPU rule (no AMX path)

    same_cpu_everywhere()

    cfg, model, family, N, dcfg, shared = build(args, torch)
    spec_cfg = cfg.speculative_config
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

    aux = list(get_eagle3_aux_layers_from_config(spec_cfg))
    inner = model.model
    mla = dcfg["architectures"][0] == "K3DSparkModel"
    if mla:
        from vllm.v1.worker.gpu.spec_decode.utils import get_parallel_drafting_token_id

        mask_id = get_parallel_drafting_token_id(spec_cfg.draft_model_config.hf_config)
    else:
        mask_id = inner.mask_token_id
    Q = N if family == "dspark" and getattr(dcfg, "get")("sample_from_anchor", True) else N + 1
    sample_from_anchor = family == "dspark" and Q == N

    # Stand-in `kv_cache`: capture the context K/V vLLM's precompute writes.
    ctx = Ctx()
    for li, layer in enumerate(inner.layers if mla else []):
        def upd_mla(kv_c, k_pe, kv_cache, slot_mapping, dtype, scale, li=li):
            ctx.K[li] = kv_c.detach().clone()
            ctx.V[li] = k_pe.detach().clone()

        layer.self_attn.impl.do_kv_cache_update = upd_mla
        if not hasattr(layer.self_attn, "kv_cache"):
            layer.self_attn.kv_cache = None  # no paged cache: the stand-in captures the latents
        layer.self_attn._attention = PlainMlaAttention(torch, layer.self_attn, li, ctx)
    if mla:
        inner._has_uniform_block_layout = lambda layers: False
        from vllm.v1.worker.workspace import init_workspace_manager

        init_workspace_manager(torch.device("cpu"))  # the GPU model runner's start-up does this
        import vllm.models.kimi_k3.nvidia.mla as k3mla

        def fused_q_kv_rmsnorm(qr, kv, q_weight, kv_weight, eps):  # Triton in vLLM
            rms = RMSNormStatic(torch)
            return rms(qr, q_weight, eps), rms(kv, kv_weight, eps)

        k3mla.fused_q_kv_rmsnorm = fused_q_kv_rmsnorm
    for li, attn in enumerate([] if mla else inner._attn_layers):
        def upd(layer, k, v, kv_cache, slot_mapping, li=li):
            ctx.K[li] = k.detach().clone()
            ctx.V[li] = v.detach().clone()

        attn.impl.do_kv_cache_update = upd
    # Stand-in `attention`.
    for li, layer in enumerate([] if mla else inner.layers):
        sa = layer.self_attn
        sa.attn = PlainAttention(torch, inner._attn_layers[li], li, ctx, sa.causal)

    # Stand-in `speculator`.
    if family == "dspark":
        from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator as SpecCls
    else:
        from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator as SpecCls
    spec = SpecCls.__new__(SpecCls)
    spec.model = model
    spec.num_speculative_steps = N
    spec.num_query_per_req = Q
    spec.draft_logits = None
    spec.acceptance_estimator = None
    spec.enable_adaptive_verification = False
    spec._step_cols = torch.arange(N, dtype=torch.int32)
    if family == "dspark":
        spec._draft_topk = args.topk
        spec.sample_from_anchor = sample_from_anchor
        spec._d2t_scatter_index = None
        spec.use_confidence_head = inner.confidence_head is not None
    else:
        spec.top_k = int(dcfg["dflash_config"]["selector_top_k"])

    man, trace = load_trace(args.trace, torch)
    if args.ids:
        keep = {int(i) for i in args.ids.split(",")}
        trace = [s for s in trace if s["meta"]["id"] in keep]
    if args.limit is not None:
        trace = trace[: args.limit]
    for a in aux:
        assert a in man["taps"], f"the draft reads hs[{a}], the trace has {man['taps']}"

    samples = []
    tot_steps = tot_comm = 0
    with torch.inference_mode():
        for s in trace:
            x, P = s["x"], s["meta"]["prompt_len"]
            T = len(x)
            feats = torch.cat([s["taps"][a] for a in aux], -1).to(cfg.model_config.dtype)
            ctx_states = model.combine_hidden_states(feats)
            model.precompute_and_store_context_kv(
                ctx_states, torch.arange(T), torch.arange(T)
            )
            roots_all = torch.arange(P, T - 1)
            props, confs = {}, {}
            for c0 in range(0, len(roots_all), args.chunk):
                roots = roots_all[c0 : c0 + args.chunk]
                R = roots.shape[0]
                ctx.roots, ctx.Q = roots, Q
                # Stand-in `prepare_inputs`.
                off = torch.arange(Q)
                ids = torch.full((R, Q), mask_id, dtype=torch.long)
                ids[:, 0] = x[roots]
                pos = roots[:, None] + off[None]
                flat_ids = ids.reshape(-1)
                hidden = model(flat_ids, pos.reshape(-1))
                so = 0 if sample_from_anchor else 1
                qidx = (torch.arange(R)[:, None] * Q + so + torch.arange(N)[None]).reshape(-1)
                spos = (pos[:, so:so + N] + (1 if sample_from_anchor else 0)).reshape(-1)
                spec.input_buffers = types.SimpleNamespace(input_ids=flat_ids)
                spec.sample_indices = qidx
                spec.sample_pos = spos
                spec.sample_idx_mapping = torch.arange(R).repeat_interleave(N)
                spec.draft_tokens = torch.zeros(R, N, dtype=torch.int64)
                if family == "dspark":
                    spec._anchor_idx = torch.arange(R) * Q
                    spec.draft_token_confidence_probs = torch.zeros(R, N, dtype=torch.float32)
                    spec._sample_sequential(R, hidden)
                    d = spec.draft_tokens
                    if spec.use_confidence_head:
                        for j, r in enumerate(roots.tolist()):
                            confs[r] = spec.draft_token_confidence_probs[j].tolist()
                else:
                    hs = hidden[qidx].view(R, N, -1)
                    cand, unary = model.compute_candidates(hs.flatten(0, 1))
                    cand = cand.view(R, N, spec.top_k)
                    unary = unary.view_as(cand)
                    scores = spec._score_candidates(cand, unary, hs)
                    d = selector_walk(torch, scores, cand)
                for j, r in enumerate(roots.tolist()):
                    props[r] = [int(v) for v in d[j].tolist()]
            w = walk(x, props, P)
            tot_steps += w["steps"]
            tot_comm += w["committed"]
            rec = {"id": s["meta"]["id"], "category": s["meta"].get("category"), "prompt_len": P,
                   "total_len": T, "roots": {str(r): v for r, v in props.items()}, "walk": w}
            if confs:
                rec["confidences"] = {str(r): v for r, v in confs.items()}
            samples.append(rec)
            print(f"sample {s['meta']['id']}: {len(props)} roots, walk AL {w['al']:.3f} "
                  f"[{time.time() - t0:.0f}s]", file=sys.stderr)

    layout = {
        "architecture": dcfg["architectures"][0],
        "vllm_class": type(model).__name__,
        "num_speculative_tokens": N,
        "query_rows_per_request": Q,
        "sample_from_anchor": sample_from_anchor,
        "mask_token_id": mask_id,
        "aux_hidden_state_ids": aux,
        "target_shared": shared,
        "causal_layers": [not l.self_attn.non_causal_multi_token_decode if mla else bool(l.self_attn.causal)
                          for l in inner.layers],
    }
    if family == "dspark":
        layout["markov_rank"] = dcfg.get("markov_rank")
        layout["confidence_head"] = inner.confidence_head is not None
        layout["draft_topk"] = args.topk
    else:
        dc = dcfg["dflash_config"]
        layout.update({k: dc.get(k) for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")})
        layout["conv_block_size"] = inner.layers[0].attention_conv.block_size
        layout["conv_cpu_path_vs_triton_kernel_max_abs"] = conv_check(
            torch, inner.layers[0].attention_conv, 4 * (N + 1))
    si = [STAND_INS[k] for k in ("config", "target", "kv_cache", "cpu_ops", "prepare_inputs",
                                 "mla_attention" if mla else "attention", "speculator")]
    if mla:
        si.append(STAND_INS["fused_q_kv_rmsnorm"])
    if family == "dflash2":
        si.append(STAND_INS["selector_walk"])
    out = {
        "draft": str(args.draft),
        "family": family,
        "engine": f"vllm {vllm.__version__}",
        "dtype": args.dtype,
        "layout": layout,
        "stand_ins": si,
        "notes": rms_check(torch),
        "samples": samples,
        "aggregate": {"samples": len(samples), "steps": tot_steps, "committed": tot_comm,
                      "al": tot_comm / tot_steps if tot_steps else None,
                      "macro_al": sum(s["walk"]["al"] for s in samples) / max(1, len(samples))},
        "seconds": round(time.time() - t0, 1),
    }
    text = json.dumps(out, indent=None)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    print(f"{family}: {len(samples)} samples, AL {out['aggregate']['al']:.3f} [{out['seconds']}s]", file=sys.stderr)
    return 0


def conv_check(torch, conv, rows, seed=0):
    """vLLM's CPU path of the DFlash2 grouped convolution (`_grouped_conv`, what the harness
    runs) against `_dflash2_grouped_conv_kernel` (the Triton kernel CUDA runs) reproduced in
    PyTorch from its source: per row and channel, fp32 accumulator (base[0] + delta[0, group]) *
    x[row] + sum over taps t >= 1 with row % BLOCK_SIZE >= t of (base[t] + delta[t, group]) *
    x[row - t]. Returns the max abs difference on random inputs."""
    from vllm.model_executor.models.qwen3_dflash2 import _grouped_conv

    g = torch.Generator().manual_seed(seed)
    H = conv.num_groups * conv.group_size
    dt = conv.base_kernel.dtype
    x = torch.randn(rows, H, generator=g).to(dt)
    delta = (0.1 * torch.randn(rows, conv.taps, conv.num_groups, generator=g)).to(dt)
    base = conv.base_kernel[0]
    ours = _grouped_conv(x, delta, base, conv.block_size, conv.num_groups, conv.group_size, conv.taps)
    grp = torch.arange(H) // conv.group_size
    pos = torch.arange(rows) % conv.block_size
    acc = (base[0].float()[None] + delta[:, 0, grp].float()) * x.float()
    for t in range(1, conv.taps):
        m = (pos >= t).float()[:, None]
        xs = torch.cat([torch.zeros(t, H), x.float()[:-t]])
        acc = acc + m * (base[t].float()[None] + delta[:, t, grp].float()) * xs
    return (ours.float() - acc.to(dt).float()).abs().max().item()


def selector_walk(torch, scores, cand):
    """Stand-in `selector_walk`: `_selector_walk_kernel` (vllm/v1/worker/gpu/spec_decode/
    dflash2/speculator.py) at temperature 0, in PyTorch. One program per request: previous = 0;
    per step the row scores[step, previous, :top_k] loaded as fp32 (USE_FP64 off),
    gumbel_noised_argmax at temp 0 = tl.max(..., return_indices=True) (leftmost index on ties),
    token = candidates[step, index], previous = index."""
    R, N, K, _ = scores.shape
    prev = torch.zeros(R, dtype=torch.long)
    ar = torch.arange(R)
    out = torch.zeros(R, N, dtype=torch.long)
    for step in range(N):
        row = scores[ar, step, prev].float()  # [R, K]
        idx = row.argmax(-1)  # first maximal index
        out[:, step] = cand[ar, step, idx]
        prev = idx
    return out


if __name__ == "__main__":
    sys.exit(main())
