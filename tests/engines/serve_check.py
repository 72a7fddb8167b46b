#!/usr/bin/env python3
"""Hold kquant's offline replay against a real engine's own per-request counts (tests/engines/serve.sh).

    serve_check.py requests LIVE.json OFFLINE.json --side draft|baseline
        Every request the engine measured (`kquant verify --endpoint --json`, `live.SIDE.requests`)
        against the sample of the same id in the offline replay (`kquant verify --trace --json`,
        `SIDE.requests`): verify steps, committed drafts (completion_tokens - 1 - steps) and the
        engine's own accepted drafts (vLLM counts the final step before its cut) must be equal.
        Exit 1 with every difference listed.

    serve_check.py gate LIVE.json OFFLINE.json --bound B
        The paired gate: the engine's dAL (live, committed convention) and the offline replay's
        (on a trace of the engine's own continuations) within B overall (per category printed),
        the same decision overall and per category, every request's tokens the engine's; every
        request whose steps differ is listed with its figures. Exit 1 when any check fails.

    serve_check.py traces A.json B.json
        Two offline replays of one draft (`verify --json`) on two traces of the same prompts:
        per sample the same tokens, verify steps and committed drafts.

    serve_check.py taps TRACE_A TRACE_B --bound B      (with the engine venv's python)
        Two traces of the same prompts: equal tokens up to each stop, every tap within B of
        the other relative to the tensor's largest magnitude.

    serve_check.py claims SERVED.tsv --kquant BIN
        What kquant claims a real server does (`served` in `kquant inspect --json` and
        `kquant schemes --json`) against what this tier's servers did. SERVED.tsv has one line
        per draft the tier served: DIR, `serves` or `refused`, and for a refusal a phrase of the
        engine's error. Each draft's vLLM claim must say the same (a refusal quoting that
        phrase), and every scheme x format claim of a CPU server must be one the tier ran.

Prints one line per check and a closing `N passed, N failed` line.
"""

import argparse
import json
import os
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def requests(a):
    live, off = load(a.live), load(a.offline)
    lr = live["live"][a.side]["requests"]
    orq = {str(r["id"]): r for r in off[a.side]["requests"]}
    passed = failed = 0
    if live["live"][a.side]["failed"]:
        print(f"FAIL {a.side}: failed requests: {live['live'][a.side]['failed']}")
        failed += 1
    for r in lr:
        o = orq.get(str(r["id"]))
        if o is None:
            print(f"FAIL request {r['id']}: no sample of that id in the offline replay")
            failed += 1
            continue
        diffs = []
        for k in ("steps", "committed", "accepted"):
            if o[k] is None:
                diffs.append(f"{k}: the offline replay has none (trace without lookahead?)")
            elif r[k] != o[k]:
                diffs.append(f"{k} engine {r[k]} kquant {o[k]}")
        if r["completion_tokens"] != o["tokens"]:
            diffs.append(f"tokens engine {r['completion_tokens']} kquant {o['tokens']}")
        if diffs:
            print(f"FAIL request {r['id']} ({r['category']}): " + "; ".join(diffs))
            failed += 1
        else:
            passed += 1
    if len(lr) != len(orq):
        print(f"FAIL {len(lr)} requests measured live, {len(orq)} samples replayed")
        failed += 1
    ok = live["steps"] == off["steps"]
    print(f"{'ok  ' if ok else 'FAIL'} drafts per step: engine {live['steps']} kquant {off['steps']}")
    passed, failed = passed + ok, failed + (not ok)
    for k in ("accept_length", "accept_length_engine"):
        lv, ov = live[a.side][k], off[a.side][k]
        ok = lv == ov
        print(f"{'ok  ' if ok else 'FAIL'} {a.side} {k}: engine {lv} kquant {ov}")
        passed, failed = passed + ok, failed + (not ok)
    print(f"{a.side}: {passed} passed, {failed} failed")
    return failed


def gate(a):
    live, off = load(a.live), load(a.offline)
    passed = failed = 0

    def check(name, lv, ov):
        nonlocal passed, failed
        ok = lv is not None and ov is not None and abs(lv - ov) <= a.bound + 1e-12
        print(f"{'ok  ' if ok else 'FAIL'} {name}: engine {lv:+.4f} kquant {ov:+.4f} (bound {a.bound})")
        passed, failed = passed + ok, failed + (not ok)

    check("overall dAL", live["delta"], off["delta"])
    maxr = off["max_regression"]
    for c, v in off["per_category"].items():
        lv = live["per_category"].get(c, {}).get("delta")
        # Per category (20 requests here) a flipped step weighs 3x: the figures are printed,
        # the decision is checked.
        print(f"     category {c} dAL: engine {lv:+.4f} kquant {v['delta']:+.4f}")
        lp, op = lv is not None and lv >= -maxr, v["delta"] >= -maxr
        ok = lp == op
        print(f"{'ok  ' if ok else 'FAIL'} category {c} decision at {maxr}: engine {'pass' if lp else 'fail'}, kquant {'pass' if op else 'fail'}")
        passed, failed = passed + ok, failed + (not ok)
    same = live["passed"] == off["passed"]
    print(f"{'ok  ' if same else 'FAIL'} decision: engine {'PASSED' if live['passed'] else 'FAILED'}, "
          f"kquant {'PASSED' if off['passed'] else 'FAILED'} at {maxr}")
    passed, failed = passed + same, failed + (not same)
    # The replay ran on the engine's own continuations: the tokens must be the engine's.
    for side in ("draft", "baseline"):
        orq = {str(r["id"]): r for r in off[side]["requests"]}
        diff = [r["id"] for r in live["live"][side]["requests"]
                if str(r["id"]) not in orq or orq[str(r["id"])]["tokens"] != r["completion_tokens"]]
        ok = not diff
        print(f"{'ok  ' if ok else 'FAIL'} {side}: every request's tokens are the engine's"
              + ("" if ok else f" (not: {diff[:8]})"))
        passed, failed = passed + ok, failed + (not ok)
    # Every request where the engine and the replay disagree, in the report's terms: same
    # tokens, a different split into verify steps. With `verify --near-ties`, each must have a
    # verify step on the replay's walk that a near-tie decides (where an engine's walk first
    # leaves the replay's): the disagreement is a flipped near-tie, not a different model.
    ties = "near_ties" in off
    for side in ("draft", "baseline"):
        orq = {str(r["id"]): r for r in off[side]["requests"]}
        differ = unexplained = 0
        for r in live["live"][side]["requests"]:
            o = orq.get(str(r["id"]))
            if o and (r["steps"], r["committed"], r["completion_tokens"]) != (o["steps"], o["committed"], o["tokens"]):
                differ += 1
                why = ""
                if ties:
                    n = o.get("near_tie_steps", 0)
                    unexplained += n == 0
                    why = f"; {n} step(s) decided by a near-tie" if n else "; NO near-tie on the replay's walk"
                print(f"  {side} request {r['id']} ({r['category']}): engine {r['completion_tokens']} tokens, "
                      f"{r['steps']} steps, {r['committed']} committed (AL {r['accept_length']:.3f}); "
                      f"kquant {o['tokens']} tokens, {o['steps']} steps, {o['committed']} committed "
                      f"(AL {o['accept_length']:.3f}){why}")
        if ties:
            with_ties = sum(1 for o in orq.values() if o.get("near_tie_steps", 0) > 0)
            ok = unexplained == 0
            print(f"{'ok  ' if ok else 'FAIL'} {side}: {differ} requests differ from the engine, "
                  f"{differ - unexplained} at a near-tie (within {off['near_ties']['margin']} logits; "
                  f"{with_ties} of {len(orq)} requests have one)")
            passed, failed = passed + ok, failed + (not ok)
    print(f"gate: {passed} passed, {failed} failed")
    return failed


def traces(a):
    """Two offline replays of one draft on two traces of the same prompts: per sample (by id)
    the same tokens, verify steps and committed drafts."""
    x, y = load(a.a), load(a.b)
    ya = {str(r["id"]): r for r in y["draft"]["requests"]}
    passed = failed = 0
    for r in x["draft"]["requests"]:
        o = ya.get(str(r["id"]))
        keys = ("tokens", "steps", "committed")
        if o is None or any(r[k] != o[k] for k in keys):
            print(f"FAIL sample {r['id']}: " + ", ".join(f"{k} {r[k]} vs {o and o[k]}" for k in keys))
            failed += 1
        else:
            passed += 1
    ok = len(x["draft"]["requests"]) == len(ya) and x["draft"]["accept_length"] == y["draft"]["accept_length"]
    print(f"{'ok  ' if ok else 'FAIL'} accept_length {x['draft']['accept_length']} vs {y['draft']['accept_length']}")
    passed, failed = passed + ok, failed + (not ok)
    print(f"traces: {passed} passed, {failed} failed")
    return failed


def taps(a):
    """Two traces' tokens (up to each sample's stop) and taps: tokens equal, every tap tensor
    within `bound` of the other relative to its largest magnitude. Needs torch + safetensors
    (the engine's venv)."""
    import torch
    from safetensors.torch import load_file

    def side(d):
        m = load(os.path.join(d, "manifest.json"))
        t = {}
        for sh in m["shards"]:
            t.update(load_file(os.path.join(d, sh["file"])))
        return m, t

    (ma, ta), (mb, tb) = side(a.a), side(a.b)
    bs = {s["id"]: s for s in mb["samples"]}
    passed = failed = 0
    worst, ndiff, n = 0.0, 0, 0
    for s in ma["samples"]:
        o = bs.get(s["id"])
        if o is None:
            print(f"FAIL sample {s['id']}: not in {a.b}")
            failed += 1
            continue
        la = s.get("stop_len") or s["prompt_len"] + s["gen_len"]
        lb = o.get("stop_len") or o["prompt_len"] + o["gen_len"]
        xa, xb = ta[f"s{s['id']}.tokens"][:la], tb[f"s{o['id']}.tokens"][:lb]
        if not torch.equal(xa, xb):
            print(f"FAIL sample {s['id']}: tokens differ")
            failed += 1
            continue
        for tap in ma["taps"]:
            u = ta[f"s{s['id']}.tap.{tap}"][:la].float()
            v = tb[f"s{o['id']}.tap.{tap}"][:la].float()
            worst = max(worst, ((u - v).abs().max() / v.abs().max()).item())
            ndiff += (u != v).sum().item()
            n += u.numel()
        passed += 1
    ok = worst <= a.bound
    print(f"{'ok  ' if ok else 'FAIL'} taps: max |a - b| / max |b| per tensor {worst:.2e} (bound {a.bound:.2e}); "
          f"{ndiff} of {n} values differ ({100 * ndiff / max(n, 1):.3f} %)")
    passed, failed = passed + ok, failed + (not ok)
    print(f"taps: {passed} passed, {failed} failed")
    return failed


def claims(a):
    import subprocess

    def kq(*args):
        return json.loads(subprocess.run([a.kquant, *args], check=True, capture_output=True, text=True).stdout)

    passed = failed = 0
    proven = set()
    with open(a.served) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    for row in rows:
        d, verdict = row[0], row[1]
        needle = row[2] if len(row) > 2 else ""
        doc = kq("inspect", "--json", d)
        e = next((e for e in doc["engines"] if e["engine"] == "vllm"), None)
        s = e and e.get("served")
        name = os.path.basename(d.rstrip("/"))
        if not s:
            ok, msg = False, "kquant claims nothing about serving it"
        else:
            ok = s["serves"] == (verdict == "serves") and needle in s["detail"]
            msg = f"kquant: {'serves' if s['serves'] else 'refused'} ({s['detail'][:90]}…)"
            proven.add(s["detail"])
        print(f"{'ok  ' if ok else 'FAIL'} {name}: the engine {verdict}{f' ({needle})' if needle else ''}; {msg}")
        passed, failed = passed + ok, failed + (not ok)
    for sc in kq("schemes", "--json")["schemes"]:
        for c in sc["carriers"]:
            for e in c["engines"]:
                s = e.get("served")
                if e["engine"] != "vllm" or not s:
                    continue
                ok = s["detail"] in proven
                if not ok:
                    print(f"FAIL {sc['id']} {c['format']}: kquant claims a CPU server's verdict the tier did not run")
                passed, failed = passed + ok, failed + (not ok)
    print(f"claims: {passed} passed, {failed} failed")
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("requests")
    r.add_argument("live")
    r.add_argument("offline")
    r.add_argument("--side", choices=("draft", "baseline"), default="draft")
    g = sub.add_parser("gate")
    g.add_argument("live")
    g.add_argument("offline")
    g.add_argument("--bound", type=float, required=True)
    c = sub.add_parser("claims")
    c.add_argument("served")
    c.add_argument("--kquant", required=True)
    for name in ("traces", "taps"):
        t = sub.add_parser(name)
        t.add_argument("a")
        t.add_argument("b")
        if name == "taps":
            t.add_argument("--bound", type=float, required=True)
    a = ap.parse_args()
    return 1 if {"requests": requests, "gate": gate, "traces": traces, "taps": taps, "claims": claims}[a.cmd](a) else 0


if __name__ == "__main__":
    sys.exit(main())
