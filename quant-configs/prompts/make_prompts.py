#!/usr/bin/env python3
"""Make the bundled prompt sets (quant-configs/prompts/*.jsonl) from their pinned sources.

    python3 quant-configs/prompts/make_prompts.py --fastchat DIR --gsm8k DIR --human-eval DIR [--check]

Each DIR is a git clone of the source repository (the file is read at the pinned commit with
`git show COMMIT:PATH`, so the clone may be at any later commit as long as it holds the pinned
one) or a directory holding the file at its path. Every input is checked against the pinned
sha256 before anything is written. `--check` writes nothing and exits 1 when a committed file
differs from what the sources give. Standard library only; see README.md beside this file.

Output: one JSON object per line, keys in this order:
    {"id": "...", "dataset": "...", "category": "...", "text": "..."}
"""

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SOURCES = {
    "fastchat": {
        "repo": "https://github.com/lm-sys/FastChat",
        "commit": "0e6d3e4beaab66f4d3f93db72541a4abab8af28d",
        "path": "fastchat/llm_judge/data/mt_bench/question.jsonl",
        "sha256": "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
    },
    "gsm8k": {
        "repo": "https://github.com/openai/grade-school-math",
        "commit": "3101c7d5072418e28b9008a6636bde82a006892c",
        "path": "grade_school_math/data/test.jsonl",
        "sha256": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    },
    "human-eval": {
        "repo": "https://github.com/openai/human-eval",
        "commit": "6d43fb980f9fee3c892a914eda09951f772ad10d",
        "path": "data/HumanEval.jsonl.gz",
        "sha256": "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
    },
}

GSM8K_FIRST = 100


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_source(name, root):
    s = SOURCES[name]
    plain = os.path.join(root, s["path"])
    if os.path.isfile(plain) and not os.path.exists(os.path.join(root, ".git")):
        with open(plain, "rb") as f:
            data = f.read()
        where = plain
    else:
        try:
            data = subprocess.run(
                ["git", "-C", root, "show", f"{s['commit']}:{s['path']}"],
                check=True,
                capture_output=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            err = getattr(e, "stderr", b"") or b""
            fail(
                f"cannot read {s['path']} at {s['commit']} from {root}: "
                f"{err.decode(errors='replace').strip() or e}\n"
                f"hint: git clone {s['repo']} {root} (it must hold commit {s['commit']})"
            )
        where = f"{root} @ {s['commit']}"
    got = hashlib.sha256(data).hexdigest()
    if got != s["sha256"]:
        fail(f"{where}: {s['path']} has sha256 {got}, the pinned file has {s['sha256']}")
    return data


def jsonl(data):
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def rec(id_, dataset, category, text):
    return {"id": id_, "dataset": dataset, "category": category, "text": text}


def mt_bench(data):
    rows = jsonl(data)
    if len(rows) != 80:
        fail(f"MT-Bench: expected 80 questions, found {len(rows)}")
    # The first turn only: a second turn is a follow-up to the model's own first answer.
    return [rec(str(q["question_id"]), "mt_bench", q["category"], q["turns"][0]) for q in rows]


def gsm8k(data):
    rows = jsonl(data)[:GSM8K_FIRST]
    # The question only; the reference answer (with its worked solution) is left out.
    return [rec(f"test-{i}", "gsm8k", "math", q["question"]) for i, q in enumerate(rows)]


def humaneval(data):
    rows = jsonl(gzip.decompress(data))
    if len(rows) != 164:
        fail(f"HumanEval: expected 164 problems, found {len(rows)}")
    # The prompt (signature and docstring) as given to the model; tests and solution left out.
    return [rec(q["task_id"], "humaneval", "code", q["prompt"]) for q in rows]


def render(records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fastchat", required=True, help="clone of lm-sys/FastChat")
    ap.add_argument("--gsm8k", required=True, help="clone of openai/grade-school-math")
    ap.add_argument("--human-eval", required=True, help="clone of openai/human-eval")
    ap.add_argument("--out", default=HERE, help="output directory (default: beside this script)")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out, write nothing")
    a = ap.parse_args(argv)
    sets = {
        "mt_bench.jsonl": mt_bench(read_source("fastchat", a.fastchat)),
        "gsm8k.jsonl": gsm8k(read_source("gsm8k", a.gsm8k)),
        "humaneval.jsonl": humaneval(read_source("human-eval", a.human_eval)),
    }
    stale = []
    for name, records in sets.items():
        path = os.path.join(a.out, name)
        body = render(records)
        if a.check:
            try:
                with open(path, "rb") as f:
                    same = f.read() == body
            except FileNotFoundError:
                same = False
            if not same:
                stale.append(path)
            continue
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
        print(f"{path}: {len(records)} prompts, sha256 {hashlib.sha256(body).hexdigest()}")
    if stale:
        for p in stale:
            print(f"error: {p} is not what the pinned sources give", file=sys.stderr)
        return 1
    if a.check:
        print("prompt sets match their pinned sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
