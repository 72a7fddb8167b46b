#!/usr/bin/env python3
"""Run the engine-loader harnesses over a set of draft checkpoints and compare each verdict with
`kquant inspect --json`'s claim for that engine (plain Python 3, no packages: the harnesses run
in the engines' own venvs).

    python3 tests/engines/matrix.py --kquant target/debug/kquant \\
        --vllm "$(bash tests/engines/venv.sh vllm)" --sglang "$(bash tests/engines/venv.sh sglang)" \\
        --out /tmp/engine-matrix.json DRAFT_DIR...

Prints one line per (checkpoint, engine): the verdict, kquant's claim, and AGREE / DISAGREE;
then `N passed, N failed` (a disagreement is a failure). A quantized draft runs SGLang with
SM 9.0 pretended for its schemes' capability check; its verdict then says so.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGET_CONFIG = os.path.join(ROOT, "fixtures/tiny/target-kimi-k2/config.json")


def inspect(kquant, d):
    out = subprocess.run([kquant, "inspect", d, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def run(python, script, args):
    out = subprocess.run(
        [python, os.path.join(HERE, script), *args], capture_output=True, text=True
    )
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"ok": False, "stage": "harness", "message": out.stderr[-400:]}
    return json.loads(lines[-1])


def verdict_word(v):
    if v["ok"] and v.get("stage") is None:
        return "yes"
    if v["ok"]:
        return f"yes ({v['stage']} not run on CPU)"
    return f"no ({v['stage']}: {v.get('message', '')[:120]})"


def agrees(claim, v):
    """`yes` must load; `no` must not; anything else ("depends") is not a definite claim."""
    if claim == "yes":
        return v["ok"]
    if claim == "no":
        return not v["ok"]
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kquant", required=True)
    ap.add_argument("--vllm")
    ap.add_argument("--sglang")
    ap.add_argument("--out")
    ap.add_argument("drafts", nargs="+")
    a = ap.parse_args()
    tgt = tempfile.mkdtemp(prefix="kquant-engine-target-")
    with open(TARGET_CONFIG) as f, open(os.path.join(tgt, "config.json"), "w") as g:
        g.write(f.read())
    rows, passed, failed = [], 0, 0
    for d in a.drafts:
        info = inspect(a.kquant, d)
        if info is None:
            print(f"{d}: kquant inspect failed", file=sys.stderr)
            failed += 1
            continue
        family = info.get("family", "")
        quantized = bool(info.get("quantization"))
        claims = {c["engine"]: c for c in info.get("engines", [])}
        for engine, venv in (("vllm", a.vllm), ("sglang", a.sglang)):
            if not venv:
                continue
            py = os.path.join(venv, "bin", "python")
            args = ["--draft", d, "--target-config", tgt]
            if engine == "vllm":
                args += ["--method", "dflash" if "dflash" in family else "eagle3"]
                v = run(py, "vllm_load.py", args)
            else:
                if "dflash" in family:
                    args += ["--algorithm", "DFLASH"]
                if quantized:
                    args += ["--pretend-sm", "90"]
                v = run(py, "sglang_load.py", args)
            claim = claims.get(engine, {}).get("loads", "none")
            ok = agrees(claim, v)
            passed += ok
            failed += not ok
            rows.append({"draft": d, "engine": engine, "claim": claim, "verdict": v, "agree": ok})
            print(
                f"{'AGREE   ' if ok else 'DISAGREE'} {engine:6} {d}: engine {verdict_word(v)}; "
                f"kquant says {claim}"
            )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
