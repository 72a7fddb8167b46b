#!/usr/bin/env python3
"""The synthetic-acceptance fragments `kquant verify` writes, through vLLM's own config code.

    <vllm venv>/bin/python tests/engines/synthetic_rates.py REPORT.json

REPORT.json is a `kquant verify --json` report of the tiny EAGLE-3 draft. For its
`synthetic_acceptance` overall and per category, the `vllm_speculative_config` fragment is
merged into the draft's own speculative config (`method: eagle3`, the fixture draft) and vLLM
0.33 builds the engine config with the tiny Kimi target (`EngineArgs(...).create_engine_config()`
on CPU, its `speculative_config`). Checked: the rates vLLM keeps
(`_verify_args` -> `_resolve_synthetic_acceptance_rates`, vllm/config/speculative.py) are the
fragment's, `rejection_sample_method` is `synthetic`, the conditional rates vLLM's sampler takes
(`unconditional_to_conditional_rates`, vllm/v1/spec_decode/utils.py) are in [0, 1], and
1 + sum(rates) is the report's `accept_length` for that set.

Controls, so the check can fail: the same fragment with its rates reversed (increasing) must be
refused by vLLM with "non-increasing", and with one rate too few with "must have length".

Prints one JSON line per case and exits 1 when any case fails, 0 when all pass.
"""

import json
import os
import sys
import traceback

FIX = "fixtures/kimi-k2.5-tiny"
TARGET = f"{FIX}/target"
DRAFT = f"{FIX}/eagle3"


def build(fragment):
    """vLLM's SpeculativeConfig for the draft with `fragment` merged in."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.engine.arg_utils import EngineArgs

    spec = dict(method="eagle3", model=DRAFT)
    spec.update(fragment)
    ea = EngineArgs(
        model=TARGET,
        speculative_config=spec,
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=256,
    )
    return ea.create_engine_config().speculative_config


def accepted(name, rates_doc):
    frag = rates_doc["vllm_speculative_config"]
    sc = build(frag)
    from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates

    got = list(sc.synthetic_acceptance_rates)
    cond = unconditional_to_conditional_rates(got)
    al = 1.0 + sum(got)
    ok = (
        sc.rejection_sample_method == "synthetic"
        and got == frag["synthetic_acceptance_rates"]
        and sc.num_speculative_tokens == frag["num_speculative_tokens"]
        and all(0.0 <= c <= 1.0 for c in cond)
        and abs(al - rates_doc["accept_length"]) < 1e-9
    )
    return dict(case=name, ok=ok, rates=got, conditional=cond, accept_length=al)


def refused(name, frag, needle):
    try:
        build(frag)
    except Exception as e:  # pydantic wraps vLLM's ValueError
        lines = [l for l in str(e).splitlines() if needle in l] or str(e).splitlines()[-1:]
        return dict(case=name, ok=needle in str(e), error=lines[0].strip()[:200])
    return dict(case=name, ok=False, error="vLLM accepted it")


def main():
    rep = json.load(open(sys.argv[1]))
    syn = rep["synthetic_acceptance"]
    sets = [("overall", syn["overall"])] + sorted(syn["per_category"].items())
    results = []
    for name, doc in sets:
        try:
            results.append(accepted(name, doc))
        except Exception:
            results.append(dict(case=name, ok=False, error=traceback.format_exc()[-400:]))
    frag = dict(syn["overall"]["vllm_speculative_config"])
    rates = frag["synthetic_acceptance_rates"]
    assert rates[0] > rates[-1], "the control needs strictly decreasing rates"
    results.append(
        refused("increasing", dict(frag, synthetic_acceptance_rates=rates[::-1]), "non-increasing")
    )
    results.append(
        refused("too-few", dict(frag, synthetic_acceptance_rates=rates[:-1]), "must have length")
    )
    for r in results:
        print(json.dumps(r))
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
