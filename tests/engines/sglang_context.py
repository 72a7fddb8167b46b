"""SGLang's context-length rule, held against kquant's launch line: SGLang gives an EAGLE-3 or
DFlash draft the target's context (`draft_worker_common.py`, `eagle_worker_v2.py`:
`context_length=target_model_config.context_len`) and `ModelConfig._derive_context_length`
raises when that is longer than the draft's own, unless `--context-length` caps the server
(or `SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1` stretches the draft).

For the tiny Kimi-K2.5 target (262144 tokens: yarn, factor 64 over 4096) and its drafts
(`max_position_embeddings` 4096): `kquant convert --to sglang --target-checkpoint` must print a
launch line whose `--context-length` SGLang's own ModelConfig accepts for both target and draft,
and the same line without it must fail with SGLang's own error.

    <sglang venv>/bin/python tests/engines/sglang_context.py --kquant BIN --work DIR
"""

import argparse
import os
import shlex
import subprocess
import sys


def launch_line(kquant, kind, src, target, out):
    r = subprocess.run(
        [kquant, "convert", kind, src, "-o", out, "--to", "sglang", "--target-checkpoint", target, "--force"],
        capture_output=True, text=True, timeout=300,
    )
    if r.returncode != 0:
        sys.exit(f"error: kquant convert {kind} --to sglang failed:\n{r.stderr}")
    lines = r.stderr.splitlines()
    i = lines.index("launch with:")
    return shlex.split(lines[i + 1].strip()), r.stderr


def flag(words, name):
    return int(words[words.index(name) + 1]) if name in words else None


def configs(target, draft, algorithm, context_length):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(
        model_path=target, device="cpu", speculative_algorithm=algorithm,
        speculative_draft_model_path=draft, skip_tokenizer_init=True,
        disable_cuda_graph=True, context_length=context_length, trust_remote_code=True,
    )
    tm = ModelConfig.from_server_args(sa)
    # What SGLang's draft workers pass: the target's context.
    dm = ModelConfig.from_server_args(sa, model_path=draft, is_draft_model=True, context_length=tm.context_len)
    return tm.context_len, dm.context_len


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kquant", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.environ.pop("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", None)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    fx = os.path.join(repo, "fixtures", "kimi-k2.5-tiny")
    target = os.path.join(fx, "target")
    bad = 0
    for kind, src, algorithm in [("eagle3", "eagle3", "EAGLE3"), ("dflash", "dflash", "DFLASH")]:
        out = os.path.join(a.work, f"sglang-context-{kind}")
        words, err = launch_line(a.kquant, kind, os.path.join(fx, src), target, out)
        cap = flag(words, "--context-length")
        if cap is None:
            print(f"FAIL {kind}: the launch line has no --context-length: {' '.join(words)}")
            bad += 1
            continue
        if "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" not in err:
            print(f"FAIL {kind}: no warning naming the alternative:\n{err}")
            bad += 1
        t, d = configs(target, out, algorithm, cap)
        if not (t == d == cap):
            print(f"FAIL {kind}: SGLang took --context-length {cap} as target {t}, draft {d}")
            bad += 1
            continue
        try:
            configs(target, out, algorithm, None)
            print(f"FAIL {kind}: SGLang served the draft without --context-length (kquant's cap is not needed)")
            bad += 1
            continue
        except ValueError as e:
            if "greater than the derived context_length" not in str(e):
                raise
        print(f"ok   {kind}: SGLang accepts kquant's --context-length {cap} and refuses the line without it")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
