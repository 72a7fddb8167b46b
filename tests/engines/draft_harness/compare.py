#!/usr/bin/env python3
# Run with the pinned fixtures venv (/root/.cache/kquant/venv-12142216c9b8/bin/python).
"""Hold fixtures/gen/verify/drafts2026.py (the reference the Rust replay follows) to vLLM's own
drafting as run.py recorded it, request by request.

    compare.py HARNESS.json [--draft DIR] [--json OUT]

For every sample and root of the harness output: drafts2026's proposals from `block_matches`
(the same trace, the target's embedding / lm_head, the draft's bf16 weights in fp32 math),
DSpark's confidences from `propose`, the walk from common.walk over block_matches' bitmask.
Prints and returns: roots compared, roots whose N proposals differ, proposals that differ,
the first position of each difference, confidence max |diff|, per-sample walk AL equal.
Exit 0 when everything agrees, 1 otherwise.
"""
import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "fixtures" / "gen" / "verify"))
from common import walk, walk_stats  # noqa: E402
from drafts2026 import DFlash2, DSpark, K3DSpark, block_matches, from_dir  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("harness")
    ap.add_argument("--draft", default=None, help="default: the harness output's draft")
    ap.add_argument("--target", default=str(REPO / "fixtures/kimi-k2.5-tiny/target"))
    ap.add_argument("--trace", default=str(REPO / "fixtures/kimi-k2.5-tiny/trace"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    h = json.load(open(a.harness))
    draft_dir = a.draft or h["draft"]
    fam = h["family"]
    k3 = h["layout"]["architecture"] == "K3DSparkModel"
    m = from_dir(draft_dir, K3DSpark if k3 else DSpark if fam == "dspark" else DFlash2)
    tsd = load_file(str(Path(a.target) / "model.safetensors"))
    embed = tsd["model.embed_tokens.weight"].float()
    W = tsd["lm_head.weight"].float()
    man = json.load(open(Path(a.trace) / "manifest.json"))
    shards = {}
    lids = m.cfg["target_layer_ids"] if k3 else m.cfg["dflash_config"]["target_layer_ids"]
    ids = [int(t) + 1 for t in lids]
    topk = h["layout"].get("draft_topk")
    kw = {"topk": topk} if topk else {}
    N = m.N if fam == "dspark" else m.B - 1
    assert N == h["layout"]["num_speculative_tokens"], (N, h["layout"])
    rep = {"harness": a.harness, "draft": draft_dir, "family": fam, "dtype": h["dtype"], "samples": 0, "roots": 0,
           "roots_differ": 0, "proposals": 0, "proposals_differ": 0, "first_diff_pos": {},
           "conf_max_abs": None, "walk_al_equal": 0, "walk_al_differ": [], "per_sample": []}
    byid = {s["id"]: s for s in man["samples"]}
    conf_max = 0.0
    for hs in h["samples"]:
        meta = byid[hs["id"]]
        if meta["shard"] not in shards:
            shards[meta["shard"]] = load_file(str(Path(a.trace) / meta["shard"]))
        t = shards[meta["shard"]]
        i = hs["id"]
        x = t[f"s{i}.tokens"].long()
        feats = torch.cat([t[f"s{i}.tap.{k}"].float() for k in ids], -1)
        P, T = meta["prompt_len"], len(x)
        c, preds = block_matches(m, feats, x, embed, W, P, **kw)
        rd = pd = 0
        for r, v in hs["roots"].items():
            ref = preds[int(r)]
            rep["roots"] += 1
            rep["proposals"] += len(v)
            diff = [k for k in range(len(v)) if v[k] != ref[k]]
            if diff:
                rd += 1
                pd += len(diff)
                rep["first_diff_pos"][str(diff[0])] = rep["first_diff_pos"].get(str(diff[0]), 0) + 1
        rep["roots_differ"] += rd
        rep["proposals_differ"] += pd
        if fam == "dspark" and "confidences" in hs:
            roots = torch.tensor(sorted(int(r) for r in hs["confidences"]))
            ctx = m.context(feats)
            with torch.no_grad():
                hh = m.hidden(ctx, roots, x[roots], embed, T)
                _, conf = m.propose(hh, W, x[roots], **kw)
            for j, r in enumerate(roots.tolist()):
                d = (conf[j] - torch.tensor(hs["confidences"][str(r)])).abs().max().item()
                conf_max = max(conf_max, d)
        w = walk(c, P, T, N)
        al = walk_stats(w)["al_walk"]
        eq = abs(al - hs["walk"]["al"]) < 1e-12 and w["rounds"] == hs["walk"]["steps"]
        rep["walk_al_equal"] += int(eq)
        if not eq:
            rep["walk_al_differ"].append({"id": i, "vllm": hs["walk"]["al"], "drafts2026": al})
        rep["per_sample"].append({"id": i, "roots": len(hs["roots"]), "roots_differ": rd, "proposals_differ": pd,
                                  "al_vllm": hs["walk"]["al"], "al_drafts2026": al})
        rep["samples"] += 1
        print(f"sample {i}: roots {len(hs['roots'])}, differ {rd} ({pd} proposals), AL vllm "
              f"{hs['walk']['al']:.3f} drafts2026 {al:.3f}", file=sys.stderr)
    if fam == "dspark" and any("confidences" in s for s in h["samples"]):
        rep["conf_max_abs"] = conf_max
    ok = rep["roots_differ"] == 0 and rep["walk_al_equal"] == rep["samples"]
    rep["agree"] = ok
    line = (f"{fam} ({h['dtype']}{', topk ' + str(topk) if topk else ''}): {rep['samples']} samples, "
            f"{rep['roots']} roots, {rep['roots_differ']} roots differ ({rep['proposals_differ']}/"
            f"{rep['proposals']} proposals), conf max|d| {rep['conf_max_abs']}, walk AL equal "
            f"{rep['walk_al_equal']}/{rep['samples']}")
    print(line)
    if a.json:
        Path(a.json).write_text(json.dumps(rep, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
