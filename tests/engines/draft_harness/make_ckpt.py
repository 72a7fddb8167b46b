# Run with the pinned fixtures venv (/root/.cache/kquant/venv-12142216c9b8/bin/python).
"""Random-weight DSpark / DFlash2 checkpoints in exactly the layouts train_block2026.py writes
(config("dspark") / config("dflash2"), bf16 safetensors + config.json), for the harness while
the trained fixtures do not exist yet.

    make_ckpt.py OUT_ROOT [--seed 0]

writes OUT_ROOT/{dspark,dflash2}-warm (the trained DFlash backbone of fixtures/kimi-k2.5-tiny/
dflash/ plus random heads: Markov / confidence, or perturbed convolutions and a random selector,
so walks accept several tokens and the heads change the argmax) and OUT_ROOT/{dspark,dflash2}-random
(every tensor random), and OUT_ROOT/dspark-1n-warm (dspark-warm with sample_from_anchor false,
the speculators-format 1 + N block)."""
import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "fixtures" / "gen" / "verify"))
from drafts2026 import DFlash2, DSpark  # noqa: E402
from train_block2026 import config  # noqa: E402


CONV, KPROJ, SEL = 0.03, 0.01, 0.1


def randomize_all(m, g):
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def bigram_factors(r, scale):
    """A rank-r factorisation of the trace's bigram log-odds (so the Markov head proposes the
    trace's likely next token and walks accept several tokens; only a test fixture)."""
    from safetensors.torch import load_file

    t = load_file(str(REPO / "fixtures/kimi-k2.5-tiny/trace/shard-00000.safetensors"))
    V = 2048
    C = torch.zeros(V, V)
    for k, v in t.items():
        if k.endswith(".tokens"):
            v = v.long()
            C.index_put_((v[:-1], v[1:]), torch.ones(len(v) - 1), accumulate=True)
    L = torch.log((C + 0.05) / (C.sum(1, keepdim=True) + 0.05 * V))
    L = L - L.mean(1, keepdim=True)
    U, S, Vh = torch.linalg.svd(L, full_matrices=False)
    s = (S[:r] * scale).sqrt()
    return U[:, :r] * s, Vh[:r].t() * s


def heads(m, family, g, kind):
    with torch.no_grad():
        if family == "dspark":
            r = m.markov_head.markov_w1.weight.shape[1]
            if kind == "warm":
                w1, w2 = bigram_factors(r, 1.0)
                m.markov_head.markov_w1.weight.copy_(w1)
                m.markov_head.markov_w2.weight.copy_(w2)
            else:
                m.markov_head.markov_w1.weight.copy_(torch.randn(m.markov_head.markov_w1.weight.shape, generator=g))
                m.markov_head.markov_w2.weight.copy_(2.0 * torch.randn(m.markov_head.markov_w2.weight.shape, generator=g) / r ** 0.5)
            w = m.confidence_head.proj.weight
            w.copy_(torch.randn(w.shape, generator=g) / w.shape[1] ** 0.5)
            m.confidence_head.proj.bias.fill_(0.3)
        else:
            for L in m.layers:
                for c in (L.attention_conv, L.mlp_conv):
                    c.base_kernel.zero_()
                    c.base_kernel[:, 0] = 1.0
                    c.base_kernel.add_(CONV * torch.randn(c.base_kernel.shape, generator=g))
                    c.kernel_projection.weight.copy_(KPROJ * torch.randn(c.kernel_projection.weight.shape, generator=g))
            cs = m.candidate_selector
            cs.predecessor_codebook.copy_(torch.randn(cs.predecessor_codebook.shape, generator=g))
            cs.successor_codebook.copy_(SEL * torch.randn(cs.successor_codebook.shape, generator=g))
            H = cs.hidden_projection.weight.shape[1]
            cs.hidden_projection.weight.copy_(torch.randn(cs.hidden_projection.weight.shape, generator=g) / H ** 0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from safetensors.torch import load_file, save_file

    base = {k: v.float() for k, v in load_file(str(REPO / "fixtures/kimi-k2.5-tiny/dflash/model.safetensors")).items()}
    for family, cls in (("dspark", DSpark), ("dflash2", DFlash2)):
        for kind in ("warm", "random"):
            g = torch.Generator().manual_seed(a.seed + (0 if kind == "warm" else 1))
            cfg = config(family)
            m = cls(cfg)
            if kind == "warm":
                missing, unexpected = m.load_state_dict(base, strict=False)
                assert not unexpected, unexpected
            else:
                randomize_all(m, g)
            heads(m, family, g, kind)
            out = Path(a.out) / f"{family}-{kind}"
            out.mkdir(parents=True, exist_ok=True)
            sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in m.state_dict().items() if k != "inv_freq"}
            save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
            json.dump(cfg, open(out / "config.json", "w"), indent=1)
            print(out, len(sd), "tensors")
            if family == "dspark" and kind == "warm":
                # The speculators layout (sample_from_anchor false: DFlash's 1 + N block, the
                # anchor not predicting), same tensors: drafts2026's anchor_first=False path.
                o2 = Path(a.out) / "dspark-1n-warm"
                o2.mkdir(parents=True, exist_ok=True)
                save_file(sd, str(o2 / "model.safetensors"), metadata={"format": "pt"})
                json.dump({**cfg, "sample_from_anchor": False}, open(o2 / "config.json", "w"), indent=1)
                print(o2, len(sd), "tensors")


if __name__ == "__main__":
    main()
