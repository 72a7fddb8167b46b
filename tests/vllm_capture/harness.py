#!/usr/bin/env python3
"""Run scripts/vllm_capture.py without a GPU, against vLLM 0.33.0's own code
(the `vllm_capture` tests at the end of tests/trace_import.rs).

    PY=$(bash tests/engines/venv.sh vllm)/bin/python
    $PY tests/vllm_capture/harness.py --trace fixtures/kimi-k2.5-tiny/trace [--probe] -- SCRIPT ARGS

The script's engine (`vllm_capture.make_llm`) is replaced by `FakeLLM`, which runs everything of
vLLM that does not need a GPU, with the arguments exactly as the script passes them:

- **Configuration**: every keyword must be a parameter of `vllm.LLM.__init__` or a field of
  `EngineArgs`; `kv_transfer_config` becomes a `KVTransferConfig` as `LLM.__init__` makes it
  (pydantic, unknown keys refused); then `EngineArgs(...).create_engine_config()` builds the
  `VllmConfig` (the `SpeculativeConfig` with `extract_hidden_states` included) on CPU, and the
  capture's own pieces are built from it: `ExtractHiddenStatesProposer` (its checks:
  one speculative token, layer ids set), `ExtractHiddenStatesModel` (the cache-only layer) and
  `ExampleHiddenStatesConnector` through `KVConnectorFactory.create_connector`, scheduler and
  worker role.
- **Calls**: `generate`'s arguments bind to the real `LLM.generate` signature; sampling
  parameters must be vLLM's `SamplingParams`; every prompt must be a `TokensPrompt` (only its
  keys, `prompt_token_ids` a list of ints).
- **Tokens**: the target is the tiny fixture, whose greedy continuations are in its trace
  (`--trace`, a kquant-trace/1 captured greedy with ignore_eos): the continuation of a prompt
  is the trace's next tokens (cut after EOS unless `ignore_eos`); requests must be greedy.
- **Files**: for every request the stacked taps (the trace's `hs[k]` for each id k, in layer
  order, `torch.stack(..., dim=1)` as the proposer stacks them) go through the real
  `ExtractHiddenStatesModel.forward` into a KV-cache tensor at a scattered block table; the
  scheduler-side connector's `build_connector_meta` / `request_finished` and the worker-side
  `wait_for_save` / `get_finished` (`_submit_async_write`, `extract_from_kv_cache`,
  `_write_tensors`: its thread pool, `.lock` and `save_file`) write the file, and the output
  carries the `kv_transfer_params` `request_finished` returned. Request ids are made by vLLM's
  own `InputProcessor.assign_request_id` (`{n}-{8 random chars}`), `n` counting across calls as
  `LLM` counts.
- **CPU stand-ins** (the only things not vLLM's): `torch.cuda.Event` / `Stream` / `stream()`
  are no-ops (CPU copies are synchronous), and `pin_memory=True` is dropped.
- **Outputs** are vLLM's own `RequestOutput` / `CompletionOutput`.

`--probe` first checks that the validation bites: each of a set of wrong arguments (a misspelled
key in each config, a wrong connector name, two speculative tokens, unknown sampling and engine
arguments) must be refused by vLLM's classes; it prints `probe: N of N wrong arguments refused`.
Exit status: the script's, or 3 when the harness itself fails.
"""

import argparse
import contextlib
import copy
import importlib.util
import inspect
import itertools
import json
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def load_script():
    spec = importlib.util.spec_from_file_location("vllm_capture", os.path.join(ROOT, "scripts", "vllm_capture.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Fixture:
    """A kquant-trace/1: per sample its tokens and taps (HF hidden_states indices)."""

    def __init__(self, path):
        from safetensors.torch import load_file

        with open(os.path.join(path, "manifest.json")) as f:
            self.manifest = json.load(f)
        m = self.manifest
        if m.get("format") != "kquant-trace/1":
            raise SystemExit(f"harness: {path} is not a kquant-trace/1")
        shards = {}
        self.samples = []
        for s in m["samples"]:
            if s["shard"] not in shards:
                shards[s["shard"]] = load_file(os.path.join(path, s["shard"]))
            t = shards[s["shard"]]
            i = s["id"]
            self.samples.append({
                "tokens": [int(x) for x in t[f"s{i}.tokens"].tolist()],
                "taps": {k: t[f"s{i}.tap.{k}"] for k in m["taps"]},
            })
        self.greedy_ignore_eos = bool(m.get("sampling", {}).get("ignore_eos"))

    def find(self, prompt):
        n = len(prompt)
        for s in self.samples:
            if s["tokens"][:n] == prompt:
                return s
        raise AssertionError(f"harness: no fixture sample starts with this {n}-token prompt")


# --- CPU stand-ins for the CUDA calls in the connector's async write -------------------------


class _Event:
    def record(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


class _Stream:
    def wait_event(self, *a, **k):
        pass


def install_cpu_standins(torch):
    torch.cuda.Event = _Event
    torch.cuda.Stream = _Stream
    torch.cuda.stream = lambda s=None: contextlib.nullcontext()
    if not torch.cuda.is_available():
        real = torch.empty_like

        def empty_like(*a, pin_memory=False, **k):
            return real(*a, **k)

        torch.empty_like = empty_like


class FakeLLM:
    """`vllm.LLM` as far as a CPU can run it; see the module docstring."""

    fixture = None  # loaded by main's make_llm, once an engine is asked for

    def __init__(self, model, **kwargs):
        import torch
        import vllm
        from vllm.config import set_current_vllm_config
        from vllm.config.kv_transfer import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.engine.arg_utils import EngineArgs
        from vllm.model_executor.models.extract_hidden_states import ExtractHiddenStatesModel
        from vllm.v1.spec_decode.extract_hidden_states import ExtractHiddenStatesProposer

        self.torch = torch
        llm_params = set(inspect.signature(vllm.LLM.__init__).parameters) - {"self", "kwargs"}
        ea_fields = {f.name for f in __import__("dataclasses").fields(EngineArgs)}
        kw = dict(kwargs)
        # As LLM.__init__ does (vllm/entrypoints/llm.py): the dict becomes a KVTransferConfig,
        # everything goes to EngineArgs (which refuses unknown names itself).
        if isinstance(kw.get("kv_transfer_config"), dict):
            kw["kv_transfer_config"] = KVTransferConfig(**kw["kv_transfer_config"])
        only_llm = sorted(k for k in kw if k in llm_params and k not in ea_fields)
        if only_llm:
            raise TypeError(f"harness: LLM-only arguments {only_llm} are not modelled")
        cfg = EngineArgs(model=model, **kw).create_engine_config()
        for key in ("enable_chunked_prefill", "enable_prefix_caching"):
            if kw.get(key) is not False:
                raise AssertionError(f"harness: the recipe needs {key}=False, got {kw.get(key)!r}")
        self.cfg = cfg
        spec = cfg.speculative_config
        if spec is None or spec.method != "extract_hidden_states":
            raise AssertionError(f"harness: speculative method is {getattr(spec, 'method', None)!r}")
        ExtractHiddenStatesProposer(cfg, torch.device("cpu"))
        with set_current_vllm_config(cfg):
            self.model = ExtractHiddenStatesModel(vllm_config=cfg)
        self.layer = next(iter(self.model.cache_only_layers.values()))
        self.ids = sorted(spec.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids)
        self.sched = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, None)
        self.worker = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, None)
        if type(self.worker).__name__ != "ExampleHiddenStatesConnector":
            raise AssertionError(f"harness: connector is {type(self.worker).__name__}")
        self.worker._is_tp_rank_zero = True
        self.worker._get_copy_stream = lambda: _Stream()
        self.block_size = cfg.cache_config.block_size
        self.dtype = self.layer.kv_cache_torch_dtype
        self.eos = cfg.model_config.hf_config.eos_token_id
        self.counter = itertools.count()
        self.requests = 0

    # -- one request through the real cache-only layer and connector --
    def _save(self, internal_id, sp, prompt, output):
        torch = self.torch
        from vllm.forward_context import set_forward_context

        fx = FakeLLM.fixture
        s = fx.find(prompt)
        t = len(prompt)
        for k in self.ids:
            if k not in s["taps"]:
                raise AssertionError(f"harness: the fixture trace holds no hs[{k}]")
        stacked = torch.stack([s["taps"][k][:t].to(self.dtype) for k in self.ids], dim=1)
        bs = self.block_size
        nb = -(-t // bs)
        # Scattered, descending block ids (block 0 is vLLM's null block).
        block_ids = list(range(nb, 0, -1))
        kv = torch.zeros(nb + 1, len(self.ids), bs, stacked.shape[-1], dtype=self.dtype)
        self.layer.kv_cache = kv
        self.worker._kv_cache = kv
        slots = torch.tensor([block_ids[p // bs] * bs + p % bs for p in range(t)], dtype=torch.long)

        meta = self.sched.build_connector_meta(types.SimpleNamespace(
            scheduled_new_reqs=[types.SimpleNamespace(req_id=internal_id, sampling_params=sp)]))
        self.worker.bind_connector_metadata(meta)
        self.worker.wait_for_save()
        with set_forward_context(None, self.cfg, num_tokens=t, slot_mapping={self.layer.layer_name: slots}):
            self.model(hidden_states=stacked)
        self.worker.clear_connector_metadata()

        req = types.SimpleNamespace(
            request_id=internal_id, kv_transfer_params=None,
            prompt_token_ids=list(prompt), all_token_ids=list(prompt) + list(output))
        delay, params = self.sched.request_finished(req, block_ids)
        assert delay and params, "harness: request_finished kept nothing"
        self.worker.bind_connector_metadata(self.sched.build_connector_meta(
            types.SimpleNamespace(scheduled_new_reqs=[])))
        done, _ = self.worker.get_finished({internal_id})
        self.worker.clear_connector_metadata()
        assert done == {internal_id}, f"harness: get_finished gave {done}"
        return params

    def generate(self, prompts, sampling_params=None, *args, **kwargs):
        import vllm
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.v1.engine.input_processor import InputProcessor

        inspect.signature(vllm.LLM.generate).bind(self, prompts, sampling_params, *args, **kwargs)
        sp = sampling_params
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"harness: sampling_params is {type(sp).__name__}, not SamplingParams")
        if sp.temperature != 0 or sp.n != 1:
            raise AssertionError("harness: the fixture trace is greedy; requests must be temperature 0, n 1")
        allowed = set(TokensPrompt.__required_keys__) | set(TokensPrompt.__optional_keys__)
        outs = []
        for p in prompts:
            if not isinstance(p, dict) or not set(p) <= allowed or "prompt_token_ids" not in p:
                raise TypeError(f"harness: prompt {str(p)[:80]} is not a TokensPrompt")
            ids = p["prompt_token_ids"]
            if not (isinstance(ids, list) and all(type(x) is int for x in ids)):
                raise TypeError("harness: prompt_token_ids must be a list of int")
            s = FakeLLM.fixture.find(ids)
            rest = s["tokens"][len(ids):]
            if len(rest) >= sp.max_tokens:
                out, reason = rest[: sp.max_tokens], "length"
            elif sp.max_tokens == 1:
                # The fixture ends here; pass 2's one output token is never used.
                out, reason = [0], "length"
            else:
                raise AssertionError(
                    f"harness: the fixture holds {len(rest)} tokens after this prompt, max_tokens is {sp.max_tokens}")
            if not sp.ignore_eos and self.eos in out:
                out, reason = out[: out.index(self.eos) + 1], "stop"
            ext = str(next(self.counter))
            req = types.SimpleNamespace(request_id=ext, external_req_id=None)
            InputProcessor.assign_request_id(req)
            params = self._save(req.request_id, sp, ids, out)
            self.requests += 1
            outs.append(RequestOutput(
                request_id=ext, prompt=None, prompt_token_ids=list(ids), prompt_logprobs=None,
                outputs=[CompletionOutput(index=0, text="", token_ids=out, cumulative_logprob=None,
                                          logprobs=None, finish_reason=reason)],
                finished=True, kv_transfer_params=params))
        return outs


def probe(script, model, out_dir):
    """Each wrong argument must be refused by vLLM's own classes."""
    good = script.recipe_engine_kwargs([1, 2, 3], out_dir, 1, 512, False)

    def with_(path, value):
        kw = copy.deepcopy(good)
        d = kw
        for k in path[:-1]:
            d = d[k]
        if value is KeyError:
            d[path[-1] + "_typo"] = d.pop(path[-1])
        else:
            d[path[-1]] = value
        return kw

    from vllm import SamplingParams

    cases = {
        "speculative_config key misspelled": lambda: FakeLLM(model, **with_(["speculative_config", "draft_model_config"], KeyError)),
        "layer-ids key misspelled": lambda: FakeLLM(model, **with_(["speculative_config", "draft_model_config", "hf_config", "eagle_aux_hidden_state_layer_ids"], KeyError)),
        "two speculative tokens": lambda: FakeLLM(model, **with_(["speculative_config", "num_speculative_tokens"], 2)),
        "kv_transfer_config key misspelled": lambda: FakeLLM(model, **with_(["kv_transfer_config", "kv_connector_extra_config"], KeyError)),
        "connector name wrong": lambda: FakeLLM(model, **with_(["kv_transfer_config", "kv_connector"], "ExampleHiddenStateConnector")),
        "engine argument misspelled": lambda: FakeLLM(model, **with_(["enable_chunked_prefill"], KeyError)),
        "sampling argument misspelled": lambda: SamplingParams(temperature=0.0, max_token=1),
    }
    refused = 0
    for name, make in cases.items():
        try:
            make()
        except Exception as e:  # noqa: BLE001 - any refusal counts; a pass does not
            refused += 1
            first = (str(e).splitlines() or [""])[0][:160]
            print(f"probe: refused: {name}: {type(e).__name__}: {first}")
        else:
            print(f"probe: ACCEPTED (harness too lax): {name}")
    print(f"probe: {refused} of {len(cases)} wrong arguments refused")
    return refused == len(cases)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("script_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = a.script_args[1:] if a.script_args[:1] == ["--"] else a.script_args
    script = load_script()
    built = []

    def make_llm(model, **kwargs):
        import torch

        install_cpu_standins(torch)
        if FakeLLM.fixture is None:
            FakeLLM.fixture = Fixture(a.trace)
        llm = FakeLLM(model, **kwargs)
        built.append(llm)
        return llm

    script.make_llm = make_llm
    if a.probe:
        import tempfile

        import torch

        install_cpu_standins(torch)
        model = args[args.index("--model") + 1]
        with tempfile.TemporaryDirectory() as d:
            if not probe(script, model, d):
                return 3
    rc = script.main(args)
    if built:
        print(f"harness: {built[0].requests} requests through vLLM's connector")
    return rc


if __name__ == "__main__":
    sys.exit(main())
