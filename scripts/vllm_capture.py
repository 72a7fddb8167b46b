#!/usr/bin/env python3
"""Capture a target's hidden states with vLLM, for `kquant trace import --format vllm-hidden-states`.

Runs on the GPU cluster that serves the target, with vLLM installed (written against vLLM
0.33.0). Not part of kquant: kquant only reads what this writes. docs/verify.md, "From a vLLM
cluster to a gate", is the whole path.

    python3 scripts/vllm_capture.py --model moonshotai/Kimi-K2.5 --trust-remote-code \\
        --tensor-parallel-size 8 --layer-ids 2,30,58 --max-tokens 256 \\
        --prompts quant-configs/prompts/mt_bench.jsonl --out /data/k25-mtbench

The recipe (two passes over one engine, so the target is loaded once):

1. Greedy continuation of each prompt: `SamplingParams(temperature=0, max_tokens=N)`
   (`--ignore-eos` for exactly N tokens).
2. Prompt + continuation fed back as the prompt, `TokensPrompt(prompt_token_ids=...)`, with
   `max_tokens=1`. One prefill computes every position's hidden states; vLLM's
   `extract_hidden_states` speculative method caches the taps named by
   `eagle_aux_hidden_state_layer_ids` and `ExampleHiddenStatesConnector` writes one
   `{shared_storage_path}/{req_id}.safetensors` per request: `hidden_states` [T, n_taps, H] in
   the target's dtype, `token_ids` I64 [T].

The engine runs with `enable_chunked_prefill=False` (vLLM's example marks it "required") and
`enable_prefix_caching=False` (pass 2 must recompute every position in one prefill, never reuse
pass 1's blocks). Pass 1 writes prompt-only files as well (the connector saves every request);
they are deleted once pass 1 is done. Then OUT/prompts.jsonl gets one record per request in the
form `kquant trace import --prompts` reads (req_id = the file's name, prompt_len, tokens,
category, dataset, finish_reason), and the `kquant trace import` command to run is printed.

Sources (vLLM, Apache-2.0):
- vLLM 0.33.0 as installed from PyPI (`vllm/_version.py`: commit g4ba787ec9):
  `vllm/entrypoints/llm.py` (LLM, request ids), `vllm/config/speculative.py`,
  `vllm/v1/spec_decode/extract_hidden_states.py`,
  `vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py`
  (file name, tensors, `.lock` companion, `kv_transfer_params["hidden_states_path"]`),
  `vllm/v1/engine/input_processor.py` (internal request id `{n}-{8 random chars}`).
- github.com/vllm-project/vllm `examples/offline_inference/extract_hidden_states.py` at
  2d1858ae32a86e143f1894125f221d6267ecba96 (the engine arguments used here).

Prompt files (`--prompts`, repeatable): JSON lines, each with one of
  "tokens": [ids]                 the prompt as token ids, used as is;
  "messages": [{"role", "content"}, ...]  rendered with the tokenizer's chat template
                                  (`apply_chat_template(..., add_generation_prompt=True)`);
  "text": "..."                   a user message rendered the same way (`--text-mode chat`,
                                  the default), or encoded as is (`--text-mode raw`);
and optionally "id", "category", "dataset". quant-configs/prompts/*.jsonl are ready-made sets.

Exit status: 0 done, 2 any error (printed as `error: ...` with a `hint:` where one helps).
"""

import argparse
import fcntl
import json
import os
import shutil
import struct
import sys
import time

# Arguments this script sets for the recipe; --engine-arg may not change them.
RECIPE_KEYS = (
    "speculative_config",
    "kv_transfer_config",
    "enable_chunked_prefill",
    "enable_prefix_caching",
)
TEXT_SOURCES = ("tokens", "messages", "text")
# The tap streams kquant names (`tap_stream` in a kquant-trace/1 manifest; docs/verify.md,
# "Tap streams"), and vLLM 0.33.0's switch between the two of an attention-residual target:
# vllm/envs.py VLLM_KIMI_K3_AUX_ATTN_RES_STREAM (default 0), read by
# vllm/models/kimi_k3/nvidia/model.py `_capture_aux_hidden_stream` (0: `prefix_only`, the
# block's partial sum; 1: the attention-residual mixture the next layer reads).
STREAMS = ("residual", "partial", "mixture")
STREAM_ENV = "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"
KIMI_K3 = "KimiK3ForConditionalGeneration"


class CaptureError(Exception):
    def __init__(self, msg, hint=None):
        super().__init__(msg)
        self.hint = hint


def make_llm(model, **kwargs):
    """The engine. Tests replace this function (tests/vllm_capture/harness.py)."""
    from vllm import LLM

    return LLM(model=model, **kwargs)


# ----------------------------------------------------------------------------------------------
# Arguments


def parse_layer_ids(s):
    try:
        ids = [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise CaptureError(f"--layer-ids {s!r}: not a comma-separated list of integers")
    if not ids:
        raise CaptureError("--layer-ids is empty")
    if any(i < 0 for i in ids):
        raise CaptureError(f"--layer-ids {s!r}: ids are non-negative")
    if len(set(ids)) != len(ids):
        raise CaptureError(
            f"--layer-ids {s!r} lists an id twice",
            "vLLM captures each layer once; list each id once",
        )
    return sorted(ids)


def parse_engine_args(items):
    out = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise CaptureError(f"--engine-arg {item!r}: expected KEY=VALUE")
        if key in RECIPE_KEYS:
            raise CaptureError(
                f"--engine-arg {key}: set by this script for the capture recipe",
                "see the docstring at the top of scripts/vllm_capture.py",
            )
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key] = value
    return out


def build_parser():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="target: HF id or local directory")
    ap.add_argument(
        "--prompts", required=True, action="append", metavar="JSONL",
        help="prompt file (repeatable): lines with tokens, messages or text",
    )
    ap.add_argument(
        "--layer-ids", required=True,
        help="vLLM aux layer ids to capture (id k = HF hidden_states[k]); "
        "`kquant targets NAME` prints them as 'vLLM ids'",
    )
    ap.add_argument("--out", required=True, help="new (or empty) directory for the files")
    ap.add_argument("--max-tokens", type=int, default=256, help="continuation length N (default 256)")
    ap.add_argument("--ignore-eos", action="store_true", help="always generate N tokens")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--limit", type=int, help="the first N prompts of each --prompts file")
    ap.add_argument("--max-model-len", type=int,
                    help="default: the longest prompt + --max-tokens + 1")
    ap.add_argument("--trust-remote-code", action="store_true",
                    help="for the tokenizer and vLLM (Kimi-K2.x needs it)")
    ap.add_argument("--tokenizer", help="tokenizer to render text prompts (default: --model)")
    ap.add_argument("--text-mode", choices=("chat", "raw"), default="chat",
                    help="`text` as a user message through the chat template (default) or as is")
    ap.add_argument("--chat-template-kwargs", default="{}", metavar="JSON",
                    help="extra keyword arguments for apply_chat_template, e.g. '{\"thinking\": false}'")
    ap.add_argument("--engine-arg", action="append", metavar="KEY=VALUE",
                    help="any other vLLM engine argument (VALUE is JSON if it parses), repeatable")
    ap.add_argument("--continuations", metavar="LIVE_JSON",
                    help="the continuations a serving deployment generated, from `kquant verify --endpoint "
                         "--json` (each request's `token_ids`, matched to the prompts by id): pass 1 is "
                         "skipped and pass 2 captures the hidden states of exactly those tokens")
    ap.add_argument("--continuations-side", choices=("draft", "baseline"), default="baseline",
                    help="which deployment's continuations (default baseline, else draft when the run had none)")
    ap.add_argument("--stream", choices=STREAMS, default=None,
                    help="which hidden-state stream to tap on a target with attention residuals (Kimi-K3): "
                         "`partial` (the block's partial sum, vLLM's default; the default here) or `mixture` (the "
                         "mixture the next layer reads, SGLang's: sets VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1 before vLLM "
                         "is imported). Other targets have one stream, `residual`. Recorded as `tap_stream` in "
                         "OUT/capture.json, which `kquant trace import` reads")
    ap.add_argument("--kquant-target", metavar="PROFILE",
                    help="kquant target profile for the printed import command (e.g. kimi-k2.5)")
    ap.add_argument("--dry-run", action="store_true",
                    help="read and tokenize the prompts, print the plan, load no engine")
    return ap


# ----------------------------------------------------------------------------------------------
# Prompts


def read_prompt_files(paths, limit):
    """Records from every file: {id, dataset, category, src, line, and one of TEXT_SOURCES}."""
    records = []
    seen = {}
    for path in paths:
        stem = os.path.splitext(os.path.basename(path))[0]
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
        except OSError as e:
            raise CaptureError(f"{path}: cannot read: {e.strerror or e}")
        taken = 0
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if limit is not None and taken >= limit:
                break
            where = f"{path}:{n}"
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise CaptureError(f"{where}: not JSON: {e}")
            if not isinstance(r, dict):
                raise CaptureError(f"{where}: not a JSON object")
            have = [k for k in TEXT_SOURCES if k in r]
            if not have:
                raise CaptureError(
                    f"{where}: has none of {', '.join(TEXT_SOURCES)}",
                    "each line needs the prompt as token ids (tokens), chat messages or text",
                )
            kind = have[0]  # token ids win: they are exactly what the target reads
            rec = {
                "id": str(r["id"]) if "id" in r else f"{stem}-{n}",
                "dataset": str(r.get("dataset", stem)),
                "category": str(r.get("category", "")),
                "where": where,
                "kind": kind,
                "value": r[kind],
            }
            if kind == "tokens":
                v = r["tokens"]
                if not (isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)):
                    raise CaptureError(f"{where}: tokens must be a non-empty list of non-negative integers")
            elif kind == "messages":
                v = r["messages"]
                if not (isinstance(v, list) and v and all(isinstance(m, dict) and "role" in m and "content" in m for m in v)):
                    raise CaptureError(f"{where}: messages must be a non-empty list of {{role, content}} objects")
            elif not isinstance(r["text"], str) or not r["text"]:
                raise CaptureError(f"{where}: text must be a non-empty string")
            key = (rec["dataset"], rec["id"])
            if key in seen:
                raise CaptureError(
                    f"{where}: dataset {rec['dataset']!r} id {rec['id']!r} is also at {seen[key]}",
                    "ids must be unique within a dataset",
                )
            seen[key] = where
            records.append(rec)
            taken += 1
    if not records:
        raise CaptureError("the prompt files hold no prompts")
    return records


def load_tokenizer(name, trust_remote_code):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise CaptureError("text or messages prompts need transformers (installed with vLLM)")
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        raise CaptureError(
            f"cannot load the tokenizer of {name}: {e}",
            "Kimi-K2.x needs --trust-remote-code; or give --tokenizer",
        )


def tokenize(records, tok_name, trust_remote_code, text_mode, template_kwargs):
    tok = None
    for r in records:
        if r["kind"] == "tokens":
            r["tokens"] = list(r["value"])
            continue
        if tok is None:
            tok = load_tokenizer(tok_name, trust_remote_code)
        if r["kind"] == "text" and text_mode == "raw":
            ids = tok.encode(r["value"])
        else:
            messages = r["value"] if r["kind"] == "messages" else [{"role": "user", "content": r["value"]}]
            if not getattr(tok, "chat_template", None):
                raise CaptureError(
                    f"{r['where']}: the tokenizer of {tok_name} has no chat template",
                    "give the prompts as tokens, or --text-mode raw for text",
                )
            try:
                rendered = tok.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True, **template_kwargs
                )
            except Exception as e:  # noqa: BLE001
                raise CaptureError(f"{r['where']}: the chat template failed: {e}")
            # The template writes the special tokens (BOS included) itself; vLLM's own chat path
            # encodes the rendered prompt the same way (vllm/renderers/base.py,
            # default_chat_tok_params: add_special_tokens=False).
            ids = tok.encode(rendered, add_special_tokens=False)
        if not ids:
            raise CaptureError(f"{r['where']}: the prompt tokenizes to nothing")
        r["tokens"] = [int(t) for t in ids]
    return records


# ----------------------------------------------------------------------------------------------
# Target shape (from its config, before any engine is loaded)


def local_config(model):
    """config.json of a target given as a local directory, as a dict (None otherwise)."""
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def target_shape(model, trust_remote_code):
    """(num_hidden_layers, hidden_size, vocab_size) of the target's text model, or None. Read
    with transformers; without it (a plain python3, e.g. for --dry-run), from a local target's
    config.json (`text_config` where it has one)."""
    try:
        from transformers import AutoConfig
    except ImportError:
        cfg = local_config(model)
        text = cfg.get("text_config", cfg) if cfg else None
        try:
            return (int(text["num_hidden_layers"]), int(text["hidden_size"]), int(text.get("vocab_size") or 0))
        except (KeyError, TypeError, ValueError, AttributeError):
            print(f"warning: cannot read {model}'s config without transformers; layer ids are checked by vLLM only", file=sys.stderr)
            return None
    try:
        cfg = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001
        print(f"warning: cannot read {model}'s config ({e}); layer ids are checked by vLLM only", file=sys.stderr)
        return None
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    try:
        return (int(text.num_hidden_layers), int(text.hidden_size), int(getattr(text, "vocab_size", 0) or 0))
    except (AttributeError, TypeError, ValueError):
        return None


KIMI_LINEAR = "KimiLinearForCausalLM"


def target_architectures(model, trust_remote_code):
    """(architectures, model_type) of the target: a local config.json, else transformers'
    config; ([], None) when neither reads."""
    cfg = local_config(model)
    if cfg is not None:
        archs = cfg.get("architectures")
        return (archs if isinstance(archs, list) else []), cfg.get("model_type")
    try:
        from transformers import AutoConfig

        c = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001
        return [], None
    return list(getattr(c, "architectures", None) or []), getattr(c, "model_type", None)


def kimi_linear_warning(model, trust_remote_code):
    """The warning for a Kimi-Linear target (None for others): vLLM captures taps through the
    EAGLE-3 aux-hidden-state path, which needs SupportsEagle3 on the target class."""
    archs, model_type = target_architectures(model, trust_remote_code)
    if KIMI_LINEAR not in archs and model_type != "kimi_linear":
        return None
    return (
        f"{model} is {KIMI_LINEAR}: vLLM captures hidden states (extract_hidden_states, the EAGLE-3 "
        "aux-hidden-state path) only for a target class that declares SupportsEagle3, which "
        f"{KIMI_LINEAR} does only from the build that merged vllm-project/vllm#52171 (2026-08-13); "
        "older builds stop with \"Model does not support EAGLE3 interface but aux_hidden_state_outputs "
        "was requested\". Check `supports_eagle3` on the installed build's class, or capture on CPU "
        "with `kquant trace capture` (docs/verify.md, \"A Kimi-Linear-48B trace\")"
    )


def resolve_stream(asked, model, trust_remote_code):
    """The stream to tap and record (None: not known), after setting vLLM's switch for it.
    Must run before vLLM is imported: vllm.envs reads the variable from the environment."""
    archs, model_type = target_architectures(model, trust_remote_code)
    k3 = KIMI_K3 in archs or model_type == "kimi_k3"
    known = bool(archs) or model_type is not None
    if known and not k3:
        if asked in ("partial", "mixture"):
            raise CaptureError(
                f"--stream {asked}: {model} has no attention residuals; its taps are the one residual stream",
                "leave --stream out (or say residual): partial and mixture are the two streams of an "
                "attention-residual target (Kimi-K3)",
            )
        return "residual"
    if k3 and asked == "residual":
        raise CaptureError(
            f"--stream residual: {model} is {KIMI_K3}, whose taps are the `partial` or the `mixture` stream",
            "--stream partial (vLLM's default) or --stream mixture (SGLang's)",
        )
    if not known:
        if asked is None:
            print(f"warning: {model}'s architecture could not be read: the tap stream is not recorded "
                  "(give --stream to record it)", file=sys.stderr)
            return None
        if asked == "residual":
            return asked
        print(f"warning: {model}'s architecture could not be read: --stream {asked} is recorded as asked",
              file=sys.stderr)
    stream = asked or "partial"
    want = "1" if stream == "mixture" else "0"
    had = os.environ.get(STREAM_ENV)
    if had is not None and had != want:
        print(f"warning: {STREAM_ENV}={had} in the environment is replaced by {want} (--stream {stream})",
              file=sys.stderr)
    os.environ[STREAM_ENV] = want
    return stream


def gib(n):
    return f"{n / 2**30:.2f} GiB"


# ----------------------------------------------------------------------------------------------
# The connector's files


def wait_written(path):
    """Block until the connector has finished writing `path` (a shared flock on its `.lock`,
    as vLLM's own `load_hidden_states` does), then drop the lock file."""
    lock = path + ".lock"
    if os.path.exists(lock):
        with open(lock) as lf:
            fcntl.flock(lf, fcntl.LOCK_SH)
        os.remove(lock)
    if not os.path.isfile(path):
        raise CaptureError(
            f"{path}: vLLM returned this path but wrote no file there",
            "the directory must be on a filesystem that TP rank 0's worker writes and this process reads",
        )


def read_header(path):
    """The safetensors header of `path` and the offset of its data."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CaptureError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 * 2**20:
            raise CaptureError(f"{path}: not a safetensors file (header of {n} bytes)")
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise CaptureError(f"{path}: not a safetensors file (header is not JSON)")
    return header, 8 + n


def check_file(path, expect_tokens, n_taps, hidden):
    """The file holds `hidden_states` [T, n_taps, H] and `token_ids` I64 [T] equal to the
    tokens sent; returns the hidden-states dtype."""
    header, base = read_header(path)
    hs, ti = header.get("hidden_states"), header.get("token_ids")
    if hs is None or ti is None:
        raise CaptureError(f"{path}: has no hidden_states/token_ids tensors (it holds {sorted(k for k in header if k != '__metadata__')})")
    t = len(expect_tokens)
    want = [t, n_taps, hidden] if hidden else [t, n_taps, hs["shape"][-1]]
    if hs["shape"] != want:
        raise CaptureError(f"{path}: hidden_states is {hs['shape']}, expected {want} ([T, n_taps, H])")
    if ti["dtype"] != "I64" or ti["shape"] != [t]:
        raise CaptureError(f"{path}: token_ids is {ti['dtype']} {ti['shape']}, expected I64 [{t}]")
    a, b = ti["data_offsets"]
    with open(path, "rb") as f:
        f.seek(base + a)
        data = f.read(b - a)
    got = list(struct.unpack(f"<{t}q", data))
    if got != expect_tokens:
        k = next(i for i, (x, y) in enumerate(zip(got, expect_tokens)) if x != y)
        raise CaptureError(f"{path}: token_ids differ from the tokens sent at position {k} ({got[k]} vs {expect_tokens[k]})")
    return hs["dtype"]


def hidden_states_path(out, what):
    params = getattr(out, "kv_transfer_params", None) or {}
    path = params.get("hidden_states_path")
    if not path:
        raise CaptureError(
            f"{what}: vLLM returned no kv_transfer_params['hidden_states_path']",
            "the engine must run the ExampleHiddenStatesConnector (vLLM >= 0.33.0)",
        )
    return path


# ----------------------------------------------------------------------------------------------
# The run


def recipe_engine_kwargs(ids, out_dir, tensor_parallel_size, max_model_len, trust_remote_code):
    """The `LLM(...)` keyword arguments of the capture recipe (vLLM 0.33.0 names)."""
    return {
        "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": max_model_len,
        "trust_remote_code": trust_remote_code,
        # vLLM's example marks this "required".
        "enable_chunked_prefill": False,
        # Pass 2 must prefill every position itself, never reuse blocks cached by pass 1.
        "enable_prefix_caching": False,
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}},
        },
        "kv_transfer_config": {
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": out_dir},
        },
    }


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def file_sha256(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def same_prompt_file(live_path, prompt_paths):
    """Whether the prompt file a live run read (`live.prompts`, a path on the machine that ran
    it) is one of `prompt_paths`: the same bytes where that path exists here, else the same
    file name."""
    if os.path.isfile(live_path):
        h = file_sha256(live_path)
        return any(os.path.isfile(p) and file_sha256(p) == h for p in prompt_paths)
    return os.path.basename(live_path) in {os.path.basename(p) for p in prompt_paths}


def read_continuations(path, side, records, prompt_paths, limited):
    """Give each record the continuation its serving deployment generated: `live.SIDE.requests`
    of a `kquant verify --endpoint --json` report, matched by prompt id. The report must be of
    these prompt files (`live.prompts`), each request id listed once, with the record's
    category; every record must have one, and (without --limit) every request a record."""
    try:
        with open(path, encoding="utf-8") as f:
            rep = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CaptureError(f"--continuations {path}: cannot read it as JSON: {e}")
    live = rep.get("live") if isinstance(rep, dict) else None
    if not isinstance(live, dict):
        raise CaptureError(f"--continuations {path}: not a `kquant verify --endpoint --json` report (no `live`)",
                           "give the JSON a live verify wrote")
    s = live.get(side) if isinstance(live.get(side), dict) else None
    if s is None and side == "baseline":
        side, s = "draft", live.get("draft")
    if not isinstance(s, dict) or not isinstance(s.get("requests"), list):
        raise CaptureError(f"--continuations {path}: has no `live.{side}.requests`")
    live_prompts = live.get("prompts")
    if not isinstance(live_prompts, str) or not live_prompts:
        raise CaptureError(f"--continuations {path}: does not name the prompt file the live run read (`live.prompts`)",
                           "give the JSON `kquant verify --endpoint --json` wrote, unedited")
    if not same_prompt_file(live_prompts, prompt_paths):
        raise CaptureError(f"--continuations {path}: the live run read its prompts from {live_prompts!r}, not from {', '.join(prompt_paths)}",
                           "continuations are matched by id: give the prompt file the live run used (--prompts)")
    by_id = {}
    for q in s["requests"]:
        ids = q.get("token_ids") if isinstance(q, dict) else None
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
            raise CaptureError(f"--continuations {path}: request {q.get('id') if isinstance(q, dict) else q!r} of `live.{side}` has no `token_ids`",
                               "the engine must return the generated ids (vLLM >= 0.10.2 with kquant's `return_token_ids`)")
        rid = str(q.get("id"))
        if rid in by_id:
            raise CaptureError(f"--continuations {path}: `live.{side}` lists request id {rid!r} twice",
                               "a report kquant wrote lists each prompt once: give it unedited")
        cat = q.get("category")
        by_id[rid] = (ids, q.get("finish_reason") or "given", cat if isinstance(cat, str) else "")
    missing = [r["where"] for r in records if r["id"] not in by_id]
    if missing:
        raise CaptureError(f"--continuations {path}: {len(missing)} prompts have no continuation in `live.{side}` (e.g. {missing[0]})",
                           "give the same prompt file (and --limit) the live run used")
    if not limited:
        known = {r["id"] for r in records}
        unknown = [rid for rid in by_id if rid not in known]
        if unknown:
            raise CaptureError(f"--continuations {path}: `live.{side}` has {len(unknown)} requests whose ids the prompt files do not have (e.g. {unknown[0]!r})",
                               "the live run read another prompt file: give the one it used")
    for r in records:
        ids, reason, cat = by_id[r["id"]]
        if cat and r["category"] and cat != r["category"]:
            raise CaptureError(f"--continuations {path}: request {r['id']!r} of `live.{side}` has category {cat!r}, but {r['where']} is {r['category']!r}",
                               "the live run read another prompt file: give the one it used")
        r["continuation"], r["finish_reason"] = ids, reason
    return side


def prepare_out(out):
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise CaptureError(f"--out {out}: exists and is not a directory")
        if os.listdir(out):
            raise CaptureError(
                f"--out {out}: is not empty",
                "give a new directory: `kquant trace import` reads every *.safetensors in it",
            )
    else:
        os.makedirs(out)


def run(a):
    if a.max_tokens < 1:
        raise CaptureError("--max-tokens must be at least 1")
    if a.tensor_parallel_size < 1:
        raise CaptureError("--tensor-parallel-size must be at least 1")
    if a.limit is not None and a.limit < 1:
        raise CaptureError("--limit must be at least 1")
    ids = parse_layer_ids(a.layer_ids)
    extra = parse_engine_args(a.engine_arg)
    try:
        template_kwargs = json.loads(a.chat_template_kwargs)
    except json.JSONDecodeError as e:
        raise CaptureError(f"--chat-template-kwargs: not JSON: {e}")
    if not isinstance(template_kwargs, dict):
        raise CaptureError("--chat-template-kwargs: must be a JSON object")
    out_dir = os.path.abspath(a.out)

    shape = target_shape(a.model, a.trust_remote_code)
    num_layers, hidden, vocab = shape if shape else (None, None, None)
    if num_layers is not None and ids[-1] > num_layers:
        raise CaptureError(
            f"--layer-ids {ids[-1]} is past the last hidden state of a {num_layers}-layer target",
            f"vLLM id k is HF hidden_states[k]; the largest is {num_layers} (the last block's output)",
        )

    warning = kimi_linear_warning(a.model, a.trust_remote_code)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    stream = resolve_stream(a.stream, a.model, a.trust_remote_code)

    records = read_prompt_files(a.prompts, a.limit)
    if a.continuations:
        side = read_continuations(a.continuations, a.continuations_side, records, a.prompts, a.limit is not None)
        print(f"continuations from {a.continuations} (live.{side}): pass 1 skipped")
        if vocab:
            for r in records:
                bad = [t for t in r["continuation"] if t >= vocab]
                if bad:
                    raise CaptureError(f"--continuations {a.continuations}: the continuation of {r['where']}: token {bad[0]} is outside the target's vocabulary of {vocab}",
                                       "the live run served another model (or another tokenizer) than --model")
        else:
            print("warning: the target's vocabulary size is unknown: the continuations' token ids are checked by vLLM only", file=sys.stderr)
    tokenize(records, a.tokenizer or a.model, a.trust_remote_code, a.text_mode, template_kwargs)
    if vocab:
        for r in records:
            bad = [t for t in r["tokens"] if t >= vocab]
            if bad:
                raise CaptureError(f"{r['where']}: token {bad[0]} is outside the target's vocabulary of {vocab}")
    longest = max(len(r["tokens"]) for r in records)
    gen = max(len(r["continuation"]) for r in records) if a.continuations else a.max_tokens
    need_len = longest + gen + 1  # pass 2: prompt + continuation, then 1 token
    max_model_len = a.max_model_len or need_len
    too_long = [r for r in records if len(r["tokens"]) + gen + 1 > max_model_len]
    if too_long:
        r = too_long[0]
        raise CaptureError(
            f"{len(too_long)} prompts do not fit --max-model-len {max_model_len} with "
            f"{'the longest continuation, ' + str(gen) + ' tokens,' if a.continuations else '--max-tokens ' + str(a.max_tokens)} "
            f"(e.g. {r['where']}: {len(r['tokens'])} tokens; pass 2 needs prompt + N + 1)",
            f"raise --max-model-len to {need_len}, lower --max-tokens, or drop those prompts",
        )

    engine_kwargs = recipe_engine_kwargs(ids, out_dir, a.tensor_parallel_size, max_model_len, a.trust_remote_code)
    if a.tokenizer:
        engine_kwargs["tokenizer"] = a.tokenizer
    engine_kwargs.update(extra)

    # What pass 2 stores: every prompt and its continuation (the given ones' own lengths; at
    # most --max-tokens each otherwise).
    if a.continuations:
        generated = sum(len(r["continuation"]) for r in records)
    else:
        generated = len(records) * a.max_tokens
    tokens_total = sum(len(r["tokens"]) for r in records) + generated
    per_token = len(ids) * (hidden or 0) * 2
    print(f"prompts     {len(records)} from {', '.join(a.prompts)}"
          f" ({sum(len(r['tokens']) for r in records)} prompt tokens, longest {longest})")
    print(f"taps        vLLM ids {ids} (HF hidden_states indices)")
    if stream in ("partial", "mixture"):
        print(f"stream      {stream} ({STREAM_ENV}={os.environ.get(STREAM_ENV)})")
    else:
        print(f"stream      {stream or 'unknown (not recorded)'}")
    if hidden:
        print(f"disk        at most {tokens_total} tokens x {len(ids)} taps x {hidden} x 2 bytes = {gib(tokens_total * per_token)}"
              " (BF16/F16 targets)")
    else:
        # Said, not left out (#38.23): the guard below cannot run either.
        print(f"disk        unknown: {a.model}'s hidden size could not be read (its config.json, by the"
              f" warning on stderr); {tokens_total} tokens x {len(ids)} taps x hidden x 2 bytes")
    print(f"engine      {a.model} " + json.dumps(engine_kwargs, sort_keys=True))
    if a.dry_run:
        return 0

    prepare_out(out_dir)
    if hidden:
        free = shutil.disk_usage(out_dir).free
        if tokens_total * per_token > free:
            raise CaptureError(
                f"--out {out_dir}: {gib(free)} free, the capture needs up to {gib(tokens_total * per_token)}",
                "lower --max-tokens or --limit, or pick a larger filesystem",
            )

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.time()
    llm = make_llm(a.model, **engine_kwargs)
    print(f"engine up   {time.time() - t0:.0f} s")

    # Pass 1: greedy continuations (none with --continuations: they are given).
    t0 = time.time()
    sp1 = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=a.ignore_eos, detokenize=False)
    todo = [r for r in records if "continuation" not in r]
    outs = llm.generate([TokensPrompt(prompt_token_ids=r["tokens"]) for r in todo], sp1) if todo else []
    if len(outs) != len(todo):
        raise CaptureError(f"pass 1: vLLM returned {len(outs)} outputs for {len(todo)} prompts")
    for r, o in zip(todo, outs):
        if list(o.prompt_token_ids) != r["tokens"]:
            raise CaptureError(f"pass 1: the output for {r['where']} is not its prompt's (outputs out of order?)")
        c = o.outputs[0]
        r["continuation"] = [int(t) for t in c.token_ids]
        r["finish_reason"] = c.finish_reason or "unknown"
        # The connector saved this request's prompt too; not needed.
        p = hidden_states_path(o, f"pass 1, {r['where']}")
        wait_written(p)
        os.remove(p)
    print(f"pass 1      {sum(len(r['continuation']) for r in records)} tokens generated in {time.time() - t0:.0f} s")
    empty = [r for r in records if not r["continuation"]]
    for r in empty:
        print(f"warning: {r['where']}: the target generated nothing (finish_reason {r['finish_reason']}); left out", file=sys.stderr)
    records = [r for r in records if r["continuation"]]
    if not records:
        raise CaptureError("no prompt got a continuation")

    # Pass 2: prompt + continuation as the prompt, one prefill each; the connector saves it.
    t0 = time.time()
    sp2 = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    full = [r["tokens"] + r["continuation"] for r in records]
    outs = llm.generate([TokensPrompt(prompt_token_ids=t) for t in full], sp2)
    if len(outs) != len(records):
        raise CaptureError(f"pass 2: vLLM returned {len(outs)} outputs for {len(records)} prompts")
    lines = []
    dtypes = set()
    total = 0
    for r, t, o in zip(records, full, outs):
        p = hidden_states_path(o, f"pass 2, {r['where']}")
        if os.path.dirname(os.path.abspath(p)) != out_dir:
            raise CaptureError(f"pass 2: vLLM wrote {p}, not into --out {out_dir}")
        wait_written(p)
        dtypes.add(check_file(p, t, len(ids), hidden))
        total += os.path.getsize(p)
        req_id = os.path.basename(p)[: -len(".safetensors")]
        lines.append(json.dumps({
            "req_id": req_id,
            "id": r["id"],
            "dataset": r["dataset"],
            "category": r["category"],
            "prompt_len": len(r["tokens"]),
            "gen_len": len(r["continuation"]),
            "finish_reason": r["finish_reason"],
            "tokens": r["tokens"],
        }))
    print(f"pass 2      {len(records)} files, {gib(total)}, hidden_states {'/'.join(sorted(dtypes))}, in {time.time() - t0:.0f} s")

    write_atomic(os.path.join(out_dir, "prompts.jsonl"), "".join(line + "\n" for line in lines))
    try:
        import vllm

        vllm_version = vllm.__version__
    except Exception:  # noqa: BLE001
        vllm_version = "unknown"
    write_atomic(os.path.join(out_dir, "capture.json"), json.dumps({
        "tool": "kquant scripts/vllm_capture.py",
        "model": a.model,
        "vllm_version": vllm_version,
        "layer_ids": ids,
        "tap_stream": stream,
        "max_tokens": a.max_tokens,
        "ignore_eos": a.ignore_eos,
        "text_mode": a.text_mode,
        "chat_template_kwargs": template_kwargs,
        "prompt_files": a.prompts,
        "continuations": a.continuations,
        "engine_kwargs": engine_kwargs,
        "requests": len(records),
    }, indent=1) + "\n")

    target = f"--target {a.kquant_target}" if a.kquant_target else (
        f"--num-layers {num_layers}" if num_layers is not None else "--target PROFILE")
    print()
    print("next (wherever kquant runs; copy the directory there first):")
    print(f"  kquant trace import --format vllm-hidden-states {out_dir} -o {out_dir}.trace "
          f"--layer-ids {','.join(map(str, ids))} {target} --prompts {os.path.join(out_dir, 'prompts.jsonl')}")
    return 0


def main(argv=None):
    a = build_parser().parse_args(argv)
    try:
        return run(a)
    except CaptureError as e:
        print(f"error: {e}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
