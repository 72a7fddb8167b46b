#!/usr/bin/env python3
"""The engine-loader tier: every tiny draft, every `kquant convert --to` output made from them and
every `kquant quantize` scheme × format output (and, for each one the calibrated methods take,
its `--method gptq`, `search` and `search-gptq` twins), through vLLM's and SGLang's own draft loaders
(vllm_load.py, sglang_load.py, run in the engines' venvs), each verdict compared with
`kquant inspect --json`'s claim for that engine; then the planted defects, each of which the
checks must catch. Plain Python 3, no packages (the harnesses run in the engines' venvs):

    python3 tests/engines/matrix.py --kquant target/release/kquant \\
        --vllm "$(bash tests/engines/venv.sh vllm)" --sglang "$(bash tests/engines/venv.sh sglang)" \\
        --work /tmp/engine-tier --json /tmp/engine-tier.json --doc docs/engines.md

Prints one line per (checkpoint, engine) — AGREE / DISAGREE, the engine's verdict, kquant's
claim — and per planted defect — CAUGHT / MISSED; then `N passed, N failed`. Exit 1 on any
failure. A claim agrees when it says "yes" and the engine loads it (every tensor placed, every
parameter written, every parameter holding what kquant reads for it), or "no" and the engine
refuses it or a check fails; a verdict that stopped at a step CPU cannot run (SGLang's kernel
set-up after loading) agrees only with a "yes" that names that step (`unproven_on_cpu`).
"depends" never agrees. A calibrated output (`--method M --calibrate TRACE`) is compared
with its round-to-nearest twin's claim — kquant's claim is per scheme × format, the method does
not change it — and `kquant inspect` must make that same claim for it. `--doc` writes
docs/engines.md from the results.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import engines_doc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TINY = os.path.join(ROOT, "fixtures", "tiny")
TARGET_CONFIG = os.path.join(TINY, "target-kimi-k2", "config.json")

# DSpark / DFlash2 (#40): the trained fixtures, in the layouts vLLM's own classes name
# (`Qwen3DSparkModel`, `DFlash2DraftModel`), with their target, the tiny Kimi-K2.5; blocks.py
# writes the other layouts kquant detects (src/checkpoint/block.rs `Layout`).
BLOCK_FIX = os.path.join(ROOT, "fixtures", "kimi-k2.5-tiny")
BLOCK_FIXTURES = ["dspark", "dflash2"]
BLOCK_TARGET_CONFIG = os.path.join(BLOCK_FIX, "target", "config.json")
# What SGLang needs unquantized (plain nn.Linear in its DFlashDraftModel), and DSpark's
# markov_w2, which kquant keeps unquantized by default (an explicit --exclude replaces that).
SGLANG_EXCLUDE = {"dspark": ["fc", "markov_head.markov_w2"],
                  "dflash2": ["fc", "*kernel_projection"]}
# Each family's method in vLLM's speculative config and algorithm in SGLang's server args.
# `kquant convert dspark|dflash2 --to …` of every block source (the fixtures and blocks.py's
# layouts); a refusal (an MLA source to a GQA layout, SGLang for K3) is a NOT MADE row.
BLOCK_CONVERT_TO = {"dspark": ["vllm", "sglang", "specforge", "speculators"],
                    "dflash2": ["vllm", "sglang"]}
BLOCK_ENGINE_KIND = {"dspark": ("dspark", "DSPARK"), "dflash2": ("dflash", "DFLASH")}

CONVERT_TO = {
    "eagle3": ["sglang", "vllm", "trtllm", "specforge", "torchspec", "eagle"],
    "dflash": ["zlab", "sglang", "vllm", "trtllm", "specforge", "torchspec"],
}
# Sources of the quantized outputs: one per family the engines serve, widened ×8 (widen.py:
# group-128 schemes need input widths in multiples of 128).
QUANT_SOURCES = ["eagle3-specforge", "eagle3-mla-vllm", "dflash-zlab"]
# The calibrated rows: the methods, and the synthetic trace each widened draft replays for them
# (`kquant bench replay --synthetic-trace LEN --prompt-len P --samples N --write-trace DIR`).
CALIBRATED_METHODS = ["gptq", "search", "search-gptq"]
CAL_TRACE = {"len": 64, "prompt_len": 16, "samples": 2}
# What kquant says when a scheme × format has no integer grid for a calibrated method (fp8,
# uint4, nvfp4, …): no row for those.
NOT_CALIBRATABLE = "chooses integer codes under the format's scales"
# What kquant cannot read from the files and asks to be told (its hint names the flag).
CONVERT_FLAGS = {"eagle3-vllm": ["--aux-convention", "input-of-layer"]}
PLANTED = {
    # name: (what the defect is, the harness plant, what must happen)
    "renamed": ("`mlp.down_proj` stored as `mlp.dwn_proj`", None, "caught"),
    "no-fc": ("`fc.weight` removed", None, "caught"),
    "no-k_proj": ("`self_attn.k_proj.weight` removed", None, "caught"),
    "fc-2-aux": ("`fc` built for two aux layers ([H, 2H])", None, "caught"),
    "mha": ("none (k/v heads repeated to the query heads): must load", None, "loads"),
    "mha+swap-qk": (
        "the loader hands the k shard as q and q as k (q, k of one shape)",
        "swap-qk",
        "caught",
    ),
}


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def kquant_json(kquant, args):
    out = sh([kquant, *args])
    if out.returncode != 0:
        raise SystemExit(f"kquant {' '.join(args)} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def amax_file(kquant, src, path):
    """An input-amax file (`kquant.input-amax/1`) for every linear of `src`: the loaders read
    only the shapes and the static input scale, so one value serves."""
    info = kquant_json(kquant, ["inspect", src, "--json", "--tensors"])
    mods = sorted(
        t["name"][: -len(".weight")]
        for t in info.get("tensors", [])
        if t["name"].endswith(".weight") and len(t["shape"]) == 2
        and "embed" not in t["name"] and "lm_head" not in t["name"]
    )
    with open(path, "w") as f:
        json.dump({"schema": "kquant.input-amax/1", "amax": {m: 4.0 for m in mods}}, f)


# `--scheme ID` (repeatable): only the quantized rows of these schemes (no fixtures, converts or
# planted defects): a slice for a new scheme.
ONLY_SCHEMES = set()


def implemented(schemes):
    """(scheme, carrier) for every carrier kquant implements, in `kquant schemes` order (only
    `--scheme`'s when given)."""
    return [(s, c) for s in schemes for c in s["carriers"] if c["implemented"]
            and (not ONLY_SCHEMES or s["id"] in ONLY_SCHEMES)]


def amax_flags(kquant, work, name, src, scheme):
    """`--input-amax FILE` for nvfp4 (W4A4 needs static input scales), written once per source;
    fp8-pt takes ModelOpt's drafter quantizer's fixed input scale (`--fixed-input-amax`)."""
    if scheme == "fp8-pt":
        return ["--fixed-input-amax"]
    if scheme != "nvfp4":
        return []
    amax = os.path.join(work, f"{name}.amax.json")
    if not os.path.exists(amax):
        amax_file(kquant, src, amax)
    return ["--input-amax", amax]


def quantize(kquant, src, out, scheme, fmt, exclude, extra):
    """`kquant quantize`, widening `--exclude` by the modules kquant names when the tiny shapes
    cannot carry the scheme (input 64 is not a multiple of a group of 128). Returns (the
    exclude list used, None | kquant's refusal)."""
    exclude = list(exclude)
    for _ in range(16):
        cmd = [kquant, "quantize", src, "-o", out, "--force", "--scheme", scheme, "--format",
               fmt, *(["--exclude", ",".join(exclude)] if exclude else []), *extra]
        r = sh(cmd)
        if r.returncode == 0:
            return exclude, None
        # kquant names every module the scheme cannot take at once, after the patterns already
        # excluded: `with --exclude fc,lm_head,a,b (the patterns …`.
        m = re.search(r"with --exclude (\S+) \(the patterns", r.stderr)
        new = [x for x in m.group(1).split(",") if x and x not in exclude] if m else []
        if not new:
            return exclude, last_error(r.stderr)
        exclude.extend(new)
    return exclude, last_error(r.stderr)


def calibration_trace(kquant, wide, src, target, out):
    """A `kquant-trace/1` directory that fits the widened draft: kquant's own synthetic trace,
    replayed with the widened target's embedding (and lm_head, DFlash) where the draft has none."""
    t = CAL_TRACE
    r = sh([kquant, "bench", "replay", os.path.join(wide, src), "--synthetic-trace", str(t["len"]),
            "--prompt-len", str(t["prompt_len"]), "--samples", str(t["samples"]),
            "--target-checkpoint", target, "--write-trace", out])
    if r.returncode != 0:
        raise SystemExit(f"kquant bench replay {src} --write-trace failed:\n{r.stderr}")


def check_calibrated(out, twin, expected):
    """What a calibrated row puts to the engines, and only that: config.json's extra
    `kquant_quantization` key (naming the method) and other codes; every other JSON file the
    engines read (config.json without that key, `hf_quant_config.json`) as the round-to-nearest
    twin wrote it, and the same tensor files (not the same bytes)."""
    def read(d, ext):
        return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))
                if n.endswith(ext) and n != "kquant-manifest.json"}

    cj, tj = read(out, ".json"), read(twin, ".json")
    cj = {n: json.loads(b) for n, b in cj.items()}
    tj = {n: json.loads(b) for n, b in tj.items()}
    method = (cj["config.json"].pop("kquant_quantization", None) or {}).get("method")
    if method != expected:
        raise SystemExit(f"{out}: config.json's kquant_quantization.method is {method!r}, "
                         f"expected {expected!r}")
    if cj != tj:
        raise SystemExit(f"{out}: its JSON files differ from round-to-nearest's ({twin}) by "
                         "more than config.json's kquant_quantization")
    cs, ts = read(out, ".safetensors"), read(twin, ".safetensors")
    if sorted(cs) != sorted(ts) or cs == ts:
        raise SystemExit(f"{out}: not round-to-nearest's tensor files with other codes ({twin})")


def build(kquant, work, python, blocks_only=False):
    """Every checkpoint of the matrix: [(id, path, how it was made, None | refusal)], and for
    each calibrated output its round-to-nearest twin's path."""
    items, twins = [], {}
    if blocks_only:
        schemes = kquant_json(kquant, ["schemes", "--json"])["schemes"]
        return block_items(kquant, work, python, schemes), twins
    for sub in ("convert", "quantize"):
        os.makedirs(os.path.join(work, sub), exist_ok=True)
    fixtures = sorted(
        d for d in os.listdir(TINY) if d.startswith(("eagle3-", "dflash-"))
    )
    for d in [] if ONLY_SCHEMES else fixtures:
        items.append((f"fixture {d}", os.path.join(TINY, d), f"fixtures/tiny/{d}", None))
    for d in [] if ONLY_SCHEMES else fixtures:
        fam = "dflash" if d.startswith("dflash") else "eagle3"
        for to in CONVERT_TO[fam]:
            out = os.path.join(work, "convert", f"{d}--to-{to}")
            flags = CONVERT_FLAGS.get(d, [])
            cmd = [kquant, "convert", fam, os.path.join(TINY, d), "--to", to, "-o", out, "--force"]
            r = sh(cmd + flags)
            how = " ".join([f"kquant convert {fam} fixtures/tiny/{d} --to {to}", *flags])
            refused = None if r.returncode == 0 else last_error(r.stderr)
            items.append((f"convert {d} --to {to}", out, how, refused))
    schemes = kquant_json(kquant, ["schemes", "--json"])["schemes"]
    items += block_items(kquant, work, python, schemes)
    wide = os.path.join(work, "wide")
    for src in QUANT_SOURCES:
        r = sh([python, os.path.join(HERE, "widen.py"), os.path.join(TINY, src),
                os.path.join(wide, src)])
        if r.returncode != 0:
            raise SystemExit(f"widen.py {src} failed:\n{r.stderr}")
    # The target's embedding and lm_head, widened alike, for the calibration replays.
    wide_target = os.path.join(wide, "target-head")
    r = sh([python, os.path.join(HERE, "widen.py"), "--head",
            os.path.dirname(TARGET_CONFIG), wide_target])
    if r.returncode != 0:
        raise SystemExit(f"widen.py --head failed:\n{r.stderr}")
    for src in QUANT_SOURCES:
        trace = os.path.join(work, "trace", src)
        calibration_trace(kquant, wide, src, wide_target, trace)
        for s, c in implemented(schemes):
            fmt = c["format"]
            out = os.path.join(work, "quantize", f"{src}--{s['id']}--{fmt}")
            exclude = ["fc", "lm_head"] if src.startswith("eagle3") else ["fc"]
            extra = amax_flags(kquant, work, src, os.path.join(wide, src), s["id"])
            exclude, refused = quantize(
                kquant, os.path.join(wide, src), out, s["id"], fmt, exclude, extra
            )
            how = (
                f"kquant quantize WIDE/{src} --scheme {s['id']} --format {fmt} "
                f"--exclude {','.join(exclude)}"
            )
            items.append((f"quantize {src} {s['id']} {fmt}", out, how, refused))
            if refused:
                continue
            # Its calibrated twins: the same flags and exclusions, codes (and, for the
            # search, scales) chosen by each method.
            for method in CALIBRATED_METHODS:
                cal = out + f"--{method}"
                flags = ["--method", method, "--calibrate", trace,
                         "--target-checkpoint", wide_target]
                _, crefused = quantize(kquant, os.path.join(wide, src), cal, s["id"], fmt,
                                       exclude, extra + flags)
                if crefused and NOT_CALIBRATABLE in crefused:
                    break
                if not crefused:
                    check_calibrated(cal, out, method)
                    twins[cal] = out
                items.append((
                    f"quantize {src} {s['id']} {fmt} --method {method}", cal,
                    f"{how} --method {method} --calibrate TRACE/{src} "
                    "--target-checkpoint WIDE/target-head",
                    crefused,
                ))
    return items, twins


def block_items(kquant, work, python, schemes):
    """The DSpark / DFlash2 rows: the trained fixtures, blocks.py's other layouts, and every
    `kquant quantize` scheme × format of the two fixtures (their widths, 256 and 768, already
    take groups of 128: no widening). kquant's own exclusions apply (`DSPARK_KEPT`:
    markov_w2, the confidence head); the matrix adds only what kquant names."""
    items = []
    if ONLY_SCHEMES:
        return items + block_quantize_items(kquant, work, schemes)
    for d in BLOCK_FIXTURES:
        items.append((f"block {d}", os.path.join(BLOCK_FIX, d), f"fixtures/kimi-k2.5-tiny/{d}",
                      None))
    out = os.path.join(work, "blocks")
    r = sh([python, os.path.join(HERE, "blocks.py"), out])
    if r.returncode != 0:
        raise SystemExit(f"blocks.py failed:\n{r.stderr}")
    sources = [(d, os.path.join(BLOCK_FIX, d), f"fixtures/kimi-k2.5-tiny/{d}") for d in BLOCK_FIXTURES]
    for d in sorted(os.listdir(out)):
        items.append((f"block {d}", os.path.join(out, d), f"tests/engines/blocks.py: {d}", None))
        sources.append((d, os.path.join(out, d), f"tests/engines/blocks.py: {d}"))
    os.makedirs(os.path.join(work, "convert"), exist_ok=True)
    for d, path, made in sources:
        fam = kquant_json(kquant, ["inspect", path, "--json"])["family"]
        for to in BLOCK_CONVERT_TO.get(fam, []):
            o = os.path.join(work, "convert", f"block-{d}--to-{to}")
            r = sh([kquant, "convert", fam, path, "--to", to, "-o", o, "--force"])
            refused = None if r.returncode == 0 else last_error(r.stderr)
            items.append((f"block-convert {d} --to {to}", o,
                          f"kquant convert {fam} {made} --to {to}", refused))
    return items + block_quantize_items(kquant, work, schemes)


def block_quantize_items(kquant, work, schemes):
    """Every `kquant quantize` scheme × format of the two block fixtures (and SGLang's
    `--exclude` twins)."""
    items = []
    os.makedirs(os.path.join(work, "quantize"), exist_ok=True)
    for src in BLOCK_FIXTURES:
        path = os.path.join(BLOCK_FIX, src)
        for s, c in implemented(schemes):
            fmt = c["format"]
            q = os.path.join(work, "quantize", f"{src}--{s['id']}--{fmt}")
            extra = amax_flags(kquant, work, src, path, s["id"])
            exclude, refused = quantize(kquant, path, q, s["id"], fmt, [], extra)
            how = f"kquant quantize fixtures/kimi-k2.5-tiny/{src} --scheme {s['id']} --format {fmt}"
            if exclude:
                how += f" --exclude {','.join(exclude)}"
            items.append((f"block-quantize {src} {s['id']} {fmt}", q, how, refused))
            if refused or not sglang_loads(c):
                continue
            # SGLang builds `fc` (DFlash2: also the convolutions' kernel_projection) as a
            # plain nn.Linear: the same output with those kept unquantized, for SGLang.
            ex = SGLANG_EXCLUDE[src]
            q2 = q + "--sglang-exclude"
            exclude, refused = quantize(kquant, path, q2, s["id"], fmt, ex, extra)
            items.append((f"block-quantize {src} {s['id']} {fmt} --exclude {','.join(exclude)}",
                          q2, f"{how} --exclude {','.join(exclude)}", refused))
    return items


def sglang_loads(carrier):
    """Whether `kquant schemes` claims SGLang loads this scheme × format for every draft."""
    return any(e["engine"] == "sglang" and e["loads"] == "yes"
               for e in carrier.get("engines", []))


def last_error(stderr):
    lines = [l for l in stderr.splitlines() if l.startswith("error:")]
    return (lines[-1] if lines else stderr.strip()[-200:])[len("error: ") :]


def engine_jobs(kquant, items, target, block_target):
    """Per engine, the harness jobs; and the claims kquant makes for each checkpoint."""
    claims, jobs = {}, {"vllm": [], "vllm-gpu": [], "sglang": [], "sglang-sm90": []}
    for ident, path, _, refused in items:
        if refused:
            continue
        info = kquant_json(kquant, ["inspect", path, "--json"])
        fam = info.get("family") or ""
        quantized = bool((info.get("quantization") or {}).get("quantized"))
        claims[path] = {c["engine"]: c for c in info.get("engines", [])}
        base = {"draft": path, "target_config": target, "layer_prefix": info.get("layer_prefix")}
        dflash = fam.startswith("dflash")
        method, algorithm = ("dflash", "DFLASH") if dflash else ("eagle3", "EAGLE3")
        vextra = {}
        if fam in BLOCK_ENGINE_KIND:
            # Their target is the tiny Kimi-K2.5 (hidden 256, 4 layers, taps 0 and 2); vLLM
            # validates the config for its V2 runner, the only one that runs them.
            method, algorithm = BLOCK_ENGINE_KIND[fam]
            base["target_config"] = block_target
            vextra = {"runner": "v2"}
        jobs["vllm-gpu" if quantized else "vllm"].append({**base, "method": method, **vextra})
        jobs["sglang-sm90" if quantized else "sglang"].append({**base, "algorithm": algorithm})
    return claims, jobs


def run_engines(venvs, jobs, work):
    """Both engines at once (one process each; each forks a child per checkpoint)."""
    procs = []
    for key, js in jobs.items():
        if not js:
            continue
        engine = "sglang" if key.startswith("sglang") else "vllm"
        if not venvs.get(engine):
            continue
        path = os.path.join(work, f"jobs-{key}.json")
        with open(path, "w") as f:
            json.dump(js, f)
        cmd = [os.path.join(venvs[engine], "bin", "python"), os.path.join(HERE, f"{engine}_load.py")]
        cmd += ["--jobs", path]
        if key == "sglang-sm90":
            cmd += ["--pretend-sm", "90"]
        if key == "vllm-gpu":
            cmd += ["--pretend-gpu"]
        procs.append((key, cmd))
    # Each engine's groups one after the other, the two engines side by side.
    groups = [[p for p in procs if p[0].startswith(e)] for e in ("vllm", "sglang")]
    verdicts = []
    logs = open(os.path.join(work, "engines.log"), "w")

    def chain(cmds):
        script = " && ".join(" ".join(sh_quote(c) for c in cmd) for _, cmd in cmds)
        return subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=logs, text=True)

    running = [chain(g) for g in groups if g]
    for p in running:
        out, _ = p.communicate()
        for line in out.splitlines():
            if line.startswith("{"):
                verdicts.append(json.loads(line))
        if p.returncode != 0:
            raise SystemExit(f"an engine harness broke (exit {p.returncode}): see {logs.name}")
    return verdicts


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def verdict_word(v):
    """The console's verdict: the doc's cell without its markdown."""
    return engines_doc.cell(v).replace("**", "").replace("`", "")


def agrees(claim, v):
    loads = claim.get("loads")
    if loads == "yes":
        if not v["ok"]:
            return False
        if v.get("stage") == "kernel-setup":
            return bool(claim.get("unproven_on_cpu"))
        return True
    if loads == "no":
        return not v["ok"]
    return False


K3_TARGET = os.path.join(ROOT, "fixtures", "kimi-k3-tiny", "target-random")


def k3_drafting(kquant, venvs):
    """kquant's `inspect` rows for a Kimi-K3 target (the draft families each engine runs beside
    it, the stream it taps, whether a switch changes it) against each installed engine's own
    source (k3_drafting.py)."""
    ours = {d["engine"]: d for d in kquant_json(kquant, ["inspect", K3_TARGET, "--json"])["drafting"]}
    rows = []
    for engine in ("vllm", "sglang"):
        if not venvs[engine]:
            continue
        r = sh([os.path.join(venvs[engine], "bin", "python"), os.path.join(HERE, "k3_drafting.py"), engine])
        if r.returncode != 0:
            raise SystemExit(f"k3_drafting.py {engine} failed:\n{r.stderr}")
        facts = json.loads(r.stdout.strip().splitlines()[-1])
        k = ours.get(engine, {})
        says = lambda fam, stream, switch: (f"{', '.join(fam) or 'none'}; taps {stream}"
                                            + ("; a switch taps the other" if switch else ""))
        kq = (k.get("families", []), k.get("stream"), bool(k.get("switch")))
        en = (facts["families"], facts["stream"], facts["switch"])
        ok = kq == en
        if engine == "vllm":
            # kquant says the ROCm model ignores the switch; the engine's source must agree.
            ok = ok and ("ROCm" in (k.get("switch") or "")) != facts["rocm_reads_switch"]
        rows.append({"id": "k3-drafting", "engine": engine, "agree": ok,
                     "kquant_says": says(*kq), "engine_says": says(*en),
                     "read": [p.split("site-packages/", 1)[-1] for p in facts["read"]]})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kquant", required=True)
    ap.add_argument("--vllm")
    ap.add_argument("--sglang")
    ap.add_argument("--work", help="where the checkpoints are written (default: a temp dir)")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--doc", help="write the verdict matrix (docs/engines.md) here")
    ap.add_argument("--scheme", action="append", default=[],
                    help="only the quantized rows of this scheme (repeatable; not with --doc)")
    ap.add_argument("--blocks-only", action="store_true",
                    help="only the DSpark / DFlash2 rows (no planted defects; not with --doc)")
    a = ap.parse_args()
    if (a.blocks_only or a.scheme) and a.doc:
        ap.error("--doc writes the whole matrix: not with --blocks-only or --scheme")
    ONLY_SCHEMES.update(a.scheme)
    kquant = os.path.abspath(a.kquant)
    work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="kquant-engine-tier-"))
    os.makedirs(work, exist_ok=True)
    target = os.path.join(work, "target")
    os.makedirs(target, exist_ok=True)
    shutil.copy(TARGET_CONFIG, os.path.join(target, "config.json"))
    venvs = {"vllm": a.vllm, "sglang": a.sglang}

    # widen.py and plant.py run with an engine venv's torch and safetensors.
    py = os.path.join(a.vllm or a.sglang, "bin", "python")
    items, twins = build(kquant, work, py, a.blocks_only)
    block_target = os.path.join(work, "target-kimi-k2.5")
    os.makedirs(block_target, exist_ok=True)
    shutil.copy(BLOCK_TARGET_CONFIG, os.path.join(block_target, "config.json"))
    claims, jobs = engine_jobs(kquant, items, target, block_target)

    # The planted defects.
    plant_dir = os.path.join(work, "planted")
    shutil.rmtree(plant_dir, ignore_errors=True)
    r = sh([py, os.path.join(HERE, "plant.py"), os.path.join(TINY, "eagle3-specforge"), plant_dir])
    if r.returncode != 0:
        raise SystemExit(f"plant.py failed:\n{r.stderr}")
    for name, (_, plant, _) in ({} if a.blocks_only or a.scheme else PLANTED).items():
        d = os.path.join(plant_dir, name.split("+")[0])
        for key, extra in (("vllm", {"method": "eagle3"}), ("sglang", {"algorithm": "EAGLE3"})):
            jobs[key].append(
                {"draft": d, "target_config": target, "layer_prefix": "midlayer.",
                 "plant": plant, "planted": name, **extra}
            )

    verdicts = run_engines(venvs, jobs, work)
    rel = lambda p: os.path.relpath(p, ROOT) if p.startswith(ROOT) else p.replace(work, "<work>")
    by_key = {}
    for v in verdicts:
        by_key[(v["job"]["draft"], v["engine"], v["job"].get("planted"))] = v

    rows, passed, failed = [], 0, 0
    for ident, path, how, refused in items:
        if refused:
            rows.append({"id": ident, "how": how, "refused": refused})
            print(f"NOT MADE {ident}: kquant refuses: {refused}")
            continue
        for engine in ("vllm", "sglang"):
            if not venvs[engine]:
                continue
            v = by_key.get((path, engine, None))
            claim = claims[path].get(engine, {"loads": "none"})
            own = None
            if path in twins:
                # The RTN twin's claim; inspect must say the same of the calibrated output.
                own = claim
                claim = claims[twins[path]].get(engine, {"loads": "none"})
            ok = v is not None and agrees(claim, v) and (own is None or own == claim)
            passed += ok
            failed += not ok
            word = verdict_word(v) if v else "no verdict"
            row = {"id": ident, "how": how, "engine": engine, "claim": claim,
                   "verdict": v, "agree": ok}
            if own is not None:
                row["claim_of"] = "round-to-nearest twin"
                if own != claim:
                    row["own_claim"] = own
            rows.append(row)
            claim_word = claim.get("loads", "none")
            if claim.get("unproven_on_cpu"):
                claim_word += f" ({claim['unproven_on_cpu']})"
            if own is not None:
                claim_word += " (RTN twin's claim)"
                if own != claim:
                    claim_word += f"; but inspect says {own.get('loads', 'none')} of this output"
            print(f"{'AGREE   ' if ok else 'DISAGREE'} {engine:6} {ident}: engine {word}; "
                  f"kquant says {claim_word}")
    for name, (what, _, must) in ({} if a.blocks_only or a.scheme else PLANTED).items():
        d = os.path.join(plant_dir, name.split("+")[0])
        for engine in ("vllm", "sglang"):
            if not venvs[engine]:
                continue
            v = by_key.get((d, engine, name))
            if v is None:
                ok = False
            elif must == "loads":
                ok = v["ok"]
            else:
                ok = not v["ok"]
            passed += ok
            failed += not ok
            rows.append({"id": f"planted {name}", "how": what, "engine": engine,
                         "must": must, "verdict": v, "agree": ok})
            word = verdict_word(v) if v else "no verdict"
            tag = ("CAUGHT  " if must == "caught" else "LOADS   ") if ok else "MISSED  "
            print(f"{tag} {engine:6} planted {name}: {word}")
    for row in k3_drafting(kquant, venvs):
        passed += row["agree"]
        failed += not row["agree"]
        rows.append(row)
        print(f"{'AGREE   ' if row['agree'] else 'DISAGREE'} {row['engine']:6} k3-drafting: "
              f"engine {row['engine_says']}; kquant says {row['kquant_says']}")
    made = sum(1 for r in rows if "refused" in r)
    print(f"{passed} passed, {failed} failed ({made} outputs kquant refuses to make)")
    for r in rows:
        if r.get("verdict"):
            r["verdict"] = {k: r["verdict"][k] for k in r["verdict"] if k != "job"}
            r["verdict"]["draft"] = rel(r["verdict"]["draft"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "passed": passed, "failed": failed}, f, indent=1)
    if a.doc:
        with open(a.doc, "w") as f:
            f.write(engines_doc.render(rows, passed, failed, work, ROOT,
                                       {"methods": CALIBRATED_METHODS, **CAL_TRACE}))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
