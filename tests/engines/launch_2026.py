#!/usr/bin/env python3
"""The launch lines `kquant convert dspark|dflash2` prints, run through the engine's own
argument and config code on CPU, with the converted tiny drafts and the tiny Kimi target.

    <vllm venv>/bin/python   tests/engines/launch_2026.py --engine vllm   --kquant BIN --work DIR
    <sglang venv>/bin/python tests/engines/launch_2026.py --engine sglang --kquant BIN --work DIR

For each case it converts a fixture draft (fixtures/kimi-k2.5-tiny/dspark, dflash2, a copy of
dspark whose config says `sample_from_anchor: false`, and one under a `K3DSparkModel` config)
with kquant, takes the line kquant
printed after "launch with:", and:

- vLLM 0.33: parses it with the `vllm serve` parser (vllm/entrypoints/cli/serve.py), builds
  `EngineArgs.from_cli_args` and `create_engine_config()` with the tiny target; the
  `SpeculativeConfig` vLLM builds on the way is kept (vLLM's V1 runner, the only one that runs
  on CPU, then refuses `dspark` and DFlash candidate heads: that refusal, and only it, is
  expected). Checked: the method, `num_speculative_tokens`, the draft architecture after vLLM's
  rewrites, `sample_from_anchor`, the Markov rank, the block size, the mask token and the aux
  layers vLLM captures (`get_eagle3_aux_layers_from_config`). A control: the unconverted
  `K3DSparkModel` source (`num_target_layers` = the target's depth) is refused by vLLM's
  K3DSparkConfig, so the check can fail.
- SGLang 0.5.23: parses it with `prepare_server_args` and runs `ServerArgs.resolve_once()`
  (the whole resolution pipeline, `_handle_dspark` / `_handle_dflash` included) with
  `--device cuda` appended (DSpark's hook refuses any other device before it reads the draft;
  nothing here touches a GPU), then reads the draft as SGLang's worker does
  (`parse_dspark_draft_config` / `parse_dflash_draft_config`). A control: the same line with
  `--speculative-num-draft-tokens` off by one must be refused (DSpark), so the check can fail.

A kquant output in the SpecForge layout has no launch line (a trainer's layout); vLLM is
asked to load it with the vLLM line printed for the vLLM layout, as the layout promises.

Prints one JSON line per case and exits 1 when any case fails, 0 when all pass.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import traceback

FIX = "fixtures/kimi-k2.5-tiny"
TARGET = f"{FIX}/target"


def convert(kquant, kind, src, out, to):
    """`kquant convert`; returns the printed launch line (None when there is none)."""
    r = subprocess.run(
        [kquant, "convert", kind, src, "-o", out, "--to", to, "--target-checkpoint", TARGET],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RuntimeError(f"kquant convert {kind} --to {to} failed:\n{r.stderr}")
    lines = r.stderr.splitlines()
    for i, l in enumerate(lines):
        if l.strip() == "launch with:":
            return lines[i + 1].strip()
    return None


def anchor_variant(work):
    """A copy of the DSpark fixture whose config says it drafts the 1+N layout."""
    d = os.path.join(work, "dspark-1n")
    shutil.copytree(f"{FIX}/dspark", d)
    p = os.path.join(d, "config.json")
    with open(p) as f:
        c = json.load(f)
    c["sample_from_anchor"] = False
    with open(p, "w") as f:
        json.dump(c, f, indent=1)
    return d


def k3_variant(work):
    """The DSpark fixture's tensors under an Inferact `K3DSparkModel` config whose
    `num_target_layers` (4) is the target's depth, as SpecForge/TorchSpec configs give it: vLLM's
    K3DSparkConfig refuses it until convert counts the taps. Only the configs are read here."""
    d = os.path.join(work, "k3")
    shutil.copytree(f"{FIX}/dspark", d)
    p = os.path.join(d, "config.json")
    with open(p) as f:
        c = json.load(f)
    c.update(architectures=["K3DSparkModel"], model_type="k3_dspark", q_lora_rank=64,
             target_layer_ids=[0, 2])
    with open(p, "w") as f:
        json.dump(c, f, indent=1)
    return d


def cases(kquant, work, engine):
    """(name, launch line, draft dir, expectations) per case."""
    out = lambda n: os.path.join(work, n)  # noqa: E731
    one_n = anchor_variant(work)
    if engine == "vllm":
        vl = convert(kquant, "dspark", f"{FIX}/dspark", out("vllm"), "vllm")
        sf_line = convert(kquant, "dspark", f"{FIX}/dspark", out("specforge"), "specforge")
        assert sf_line is None, f"--to specforge printed a launch line: {sf_line}"
        dspark = dict(method="dspark", n=7, arch="Qwen3DSparkModel", anchor=True, markov=32,
                      block=7, mask=2047, aux=[1, 3])
        return [
            ("dspark --to vllm", vl, out("vllm"), dspark),
            ("dspark --to specforge (vLLM line)", vl.replace(out("vllm"), out("specforge")),
             out("specforge"), dspark),
            ("dspark --to speculators",
             convert(kquant, "dspark", f"{FIX}/dspark", out("speculators"), "speculators"),
             out("speculators"), dspark),
            ("dspark (1+N) --to speculators",
             convert(kquant, "dspark", one_n, out("speculators-1n"), "speculators"),
             out("speculators-1n"), dict(dspark, n=6, anchor=False)),
            ("k3-dspark --to vllm",
             convert(kquant, "dspark", k3_variant(work), out("k3-vllm"), "vllm"),
             out("k3-vllm"),
             dict(dspark, arch="K3DSparkModel", control=os.path.join(work, "k3"))),
            ("dflash2 --to vllm",
             convert(kquant, "dflash2", f"{FIX}/dflash2", out("dflash2-vllm"), "vllm"),
             out("dflash2-vllm"),
             dict(method="dflash", n=7, arch="DFlash2DraftModel", anchor=None, markov=None,
                  block=8, mask=2047, aux=[1, 3])),
        ]
    return [
        ("dspark --to sglang",
         convert(kquant, "dspark", f"{FIX}/dspark", out("sglang"), "sglang"), out("sglang"),
         dict(algorithm="DSPARK", draft_tokens=8, gamma=7, anchor=True, markov=32,
              head="vanilla", mask=2047, taps=[0, 2])),
        ("dspark (1+N) --to sglang",
         convert(kquant, "dspark", one_n, out("sglang-1n"), "sglang"), out("sglang-1n"),
         dict(algorithm="DSPARK", draft_tokens=7, gamma=7, anchor=False, markov=32,
              head="vanilla", mask=2047, taps=[0, 2])),
        ("dflash2 --to sglang",
         convert(kquant, "dflash2", f"{FIX}/dflash2", out("dflash2-sglang"), "sglang"),
         out("dflash2-sglang"),
         dict(algorithm="DFLASH", draft_tokens=8, block=8, mask=2047, taps=[0, 2],
              selector=(32, 8), conv=(2, 16))),
    ]


def vllm_case(line, want):
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
    )

    argv = shlex.split(line)
    assert argv[:3] == ["vllm", "serve", "<path-to-target>"], argv[:3]
    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subparser")
    ServeSubcommand().subparser_init(sub)
    args = parser.parse_args(["serve", TARGET] + argv[3:])
    ServeSubcommand().validate(args)
    args.model = args.model_tag
    ea = EngineArgs.from_cli_args(args)
    # CPU-only settings, none of them speculative.
    ea.skip_tokenizer_init = True
    ea.enforce_eager = True
    ea.max_model_len = 256
    kept = {}
    orig = EngineArgs.create_speculative_config

    def keep(self, *a, **k):
        kept["sc"] = orig(self, *a, **k)
        return kept["sc"]

    EngineArgs.create_speculative_config = keep
    try:
        ea.create_engine_config()
    except Exception as e:  # the V1 runner's refusal, after SpeculativeConfig was built
        if "sc" not in kept or "Model Runner V1 does not support" not in str(e):
            raise
    finally:
        EngineArgs.create_speculative_config = orig
    sc = kept["sc"]
    hf = sc.draft_model_config.hf_config
    dc = getattr(hf, "dflash_config", None) or {}
    got = dict(
        method=sc.method,
        n=sc.num_speculative_tokens,
        arch=(hf.architectures or [None])[0],
        anchor=getattr(hf, "sample_from_anchor", None),
        markov=getattr(hf, "markov_rank", None),
        block=getattr(hf, "block_size", None),
        mask=dc.get("mask_token_id", getattr(hf, "mask_token_id", None)),
        aux=list(get_eagle3_aux_layers_from_config(sc) or []),
    )
    if want["method"] == "dspark" and got["anchor"] is None:
        got["anchor"] = True  # DSparkSpeculator's default (dspark/speculator.py)
    return got


def sglang_case(line, draft, want):
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.hf_transformers_utils import get_config

    argv = shlex.split(line)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"], argv[:3]
    argv = [TARGET if a == "<path-to-target>" else a for a in argv[3:]]
    sa = prepare_server_args(argv + ["--device", "cuda"])
    sa.resolve_once()
    hf = get_config(draft, trust_remote_code=True)
    got = dict(algorithm=sa.speculative_algorithm, draft_tokens=sa.speculative_num_draft_tokens)
    if want["algorithm"] == "DSPARK":
        from sglang.srt.speculative.dspark_components.dspark_config import (
            get_dspark_sample_from_anchor,
            parse_dspark_draft_config,
        )

        c = parse_dspark_draft_config(draft_hf_config=hf)
        gamma = c.gamma
        if "--speculative-dspark-block-size" in argv:
            gamma = int(argv[argv.index("--speculative-dspark-block-size") + 1])
        got.update(gamma=c.gamma, anchor=get_dspark_sample_from_anchor(hf), markov=c.markov_rank,
                   head=c.markov_head_type, mask=c.mask_token_id, taps=c.target_layer_ids)
        # The control: a window that is not gamma + 1 is refused.
        i = argv.index("--speculative-num-draft-tokens")
        bad = argv[:i + 1] + [str(gamma + 2)] + argv[i + 2:]
        try:
            prepare_server_args(bad + ["--device", "cuda"]).resolve_once()
            got["control"] = "accepted a window of gamma + 2"
        except ValueError as e:
            got["control"] = "refused" if "gamma + 1" in str(e) else f"refused otherwise: {e}"
        want = dict(want, control="refused")
    else:
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

        c = parse_dflash_draft_config(draft_hf_config=hf)
        got.update(block=c.block_size, mask=c.mask_token_id, taps=c.target_layer_ids,
                   selector=(c.selector_rank, c.selector_top_k),
                   conv=(c.conv_kernel_size, c.conv_group_size))
    return got, want


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["vllm", "sglang"], required=True)
    ap.add_argument("--kquant", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    failed = 0
    for name, line, draft, want in cases(a.kquant, a.work, a.engine):
        try:
            if line is None:
                raise RuntimeError("kquant printed no launch line")
            if a.engine == "vllm":
                control = want.pop("control", None)
                got = vllm_case(line, want)
                if control:
                    # The control: the source as it was, which vLLM refuses.
                    try:
                        vllm_case(line.replace(draft, control), want)
                        got["control"] = "accepted the unconverted source"
                    except Exception as e:
                        ok_msg = "matching num_target_layers" in str(e)
                        got["control"] = "refused" if ok_msg else f"refused otherwise: {e}"
                    want = dict(want, control="refused")
            else:
                got, want = sglang_case(line, draft, want)
            got = {k: (list(v) if isinstance(v, tuple) else v) for k, v in got.items()}
            want = {k: (list(v) if isinstance(v, tuple) else v) for k, v in want.items()}
            ok = got == want
            msg = None if ok else "engine's reading differs"
        except Exception as e:
            ok, got, msg = False, None, f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
        failed += not ok
        print(json.dumps({"case": name, "engine": a.engine, "ok": ok, "launch": line,
                          "got": got, "want": want, "message": msg}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
