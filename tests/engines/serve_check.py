#!/usr/bin/env python3
"""Hold kquant's offline replay against a real engine's own per-request counts (tests/engines/serve.sh).

    serve_check.py requests LIVE.json OFFLINE.json --side draft|baseline
        Every request the engine measured (`kquant verify --endpoint --json`, `live.SIDE.requests`)
        against the sample of the same id in the offline replay (`kquant verify --trace --json`,
        `SIDE.requests`): verify steps, committed drafts (completion_tokens - 1 - steps) and the
        engine's own accepted drafts (vLLM counts the final step before its cut) must be equal.
        Exit 1 with every difference listed.

    serve_check.py gate LIVE.json OFFLINE.json --bound B
        The paired gate: the engine's dAL (live, committed convention) and the offline replay's,
        overall and per category, within B, and the same decision; every request whose
        committed accept length differs between the two is listed with its figures.
        Exit 1 when a bound or the decision differs.

Prints one line per check and a closing `N passed, N failed` line.
"""

import argparse
import json
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
    for c, v in off["per_category"].items():
        lv = live["per_category"].get(c, {}).get("delta")
        check(f"category {c} dAL", lv, v["delta"])
    same = live["passed"] == off["passed"]
    print(f"{'ok  ' if same else 'FAIL'} decision: engine {'PASSED' if live['passed'] else 'FAILED'}, "
          f"kquant {'PASSED' if off['passed'] else 'FAILED'} at {off['max_regression']}")
    passed, failed = passed + same, failed + (not same)
    # Every request where the engine and the replay disagree, in the report's terms.
    for side in ("draft", "baseline"):
        orq = {str(r["id"]): r for r in off[side]["requests"]}
        for r in live["live"][side]["requests"]:
            o = orq.get(str(r["id"]))
            if o and (r["steps"], r["committed"], r["completion_tokens"]) != (o["steps"], o["committed"], o["tokens"]):
                print(f"  {side} request {r['id']} ({r['category']}): engine {r['completion_tokens']} tokens, "
                      f"{r['steps']} steps, {r['committed']} committed (AL {r['accept_length']:.3f}); "
                      f"kquant {o['tokens']} tokens, {o['steps']} steps, {o['committed']} committed "
                      f"(AL {o['accept_length']:.3f})")
    print(f"gate: {passed} passed, {failed} failed")
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
    a = ap.parse_args()
    return 1 if (requests(a) if a.cmd == "requests" else gate(a)) else 0


if __name__ == "__main__":
    sys.exit(main())
