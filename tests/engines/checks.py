"""The checks both engine harnesses add around the engine's own loading (the engines do not
check completeness themselves): sentinel-filled parameters, source tensors followed to a weight
loader, the content of every parameter against kquant's reading of the checkpoint, the verdict's
problem line, and the one-process-per-checkpoint runner (fork after the engine's imports)."""

import contextlib
import json
import os
import signal
import sys
import time
import traceback

INT_SENTINEL = 0x7EADBEEF


def fill_sentinels(torch, model, mark, plant=None):
    """Fill every float / 32-64-bit integer parameter with a sentinel and wrap its weight
    loader so that the tensor it is given is marked consumed. Returns {name: parameter}.

    `plant="swap-qk"` plants a loader defect for the content check to catch: the fused q/k/v
    parameters' loaders are handed the k shard as q and the q shard as k."""
    filled = {}
    for pname, p in model.named_parameters():
        ORIGINAL[id(p)] = p.data.detach().clone()
        with torch.no_grad():
            if p.dtype.is_floating_point:
                p.data.fill_(float("nan"))
            elif p.dtype in (torch.int32, torch.int64):
                p.data.fill_(INT_SENTINEL)
            else:
                continue
        filled[pname] = p
        wl = getattr(p, "weight_loader", None)
        if wl is not None:

            swap = plant == "swap-qk" and "qkv_proj" in pname

            def wrapped(param, loaded_weight, *r, _wl=wl, _swap=swap, **kw):
                mark(loaded_weight)
                if _swap and r and r[0] in ("q", "k"):
                    r = ({"q": "k", "k": "q"}[r[0]], *r[1:])
                return _wl(param, loaded_weight, *r, **kw)

            try:
                p.weight_loader = wrapped
            except AttributeError:
                # vLLM-style parameter classes expose it as a read-only property.
                p._weight_loader = wrapped
    return filled


# Each filled parameter's value before the fill (by id), for `restore`.
ORIGINAL = {}


def restore(torch, params, names):
    """Give the parameters the engine fills itself (its exemptions: KV-cache scales, defaults
    a checkpoint may omit) their own initial value back where the checkpoint left them
    unwritten, so that post-processing sees what it would without the harness."""
    for n in names:
        p = params.get(n)
        if p is not None and id(p) in ORIGINAL and still_sentinel(torch, p):
            with torch.no_grad():
                p.data.copy_(ORIGINAL[id(p)])


@contextlib.contextmanager
def copies_marked(torch, mark):
    """While loading, every `copy_` marks its source consumed."""
    orig = torch.Tensor.copy_

    def copy_(dst, src, *r, **kw):
        mark(src)
        return orig(dst, src, *r, **kw)

    torch.Tensor.copy_ = copy_
    try:
        yield
    finally:
        torch.Tensor.copy_ = orig


def still_sentinel(torch, p):
    d = p.data
    if d.dtype.is_floating_point:
        return bool(torch.isnan(d.float()).any())
    return bool((d == INT_SENTINEL).any())


def problems(v):
    """The problem line of a verdict, or None."""
    out = []
    if v["unwritten"]:
        out.append(f"{len(v['unwritten'])} parameter(s) never written")
    if v["dropped"]:
        out.append(f"{len(v['dropped'])} checkpoint tensor(s) reached no weight loader")
    if v.get("mismatched"):
        out.append(
            f"{len(v['mismatched'])} parameter(s) hold other values than the checkpoint "
            f"tensors kquant reads for them ({', '.join(v['mismatched'][:3])})"
        )
    return "; ".join(out) or None


class Sources:
    """The checkpoint's tensors by storage, followed to the weight loaders (and through
    `torch.cat`, which SGLang's MLA loader uses to fuse q_a and kv_a)."""

    def __init__(self, torch):
        self.torch = torch
        self.names = {}  # storage pointer -> checkpoint tensor name
        self.derived = {}  # storage of a torch.cat result -> the names it holds
        self.consumed = set()

    def names_of(self, t):
        try:
            key = t.untyped_storage().data_ptr()
        except Exception:
            return set()
        if key in self.names:
            return {self.names[key]}
        return self.derived.get(key, set())

    def mark(self, t):
        """`t` reached a weight loader (or was copied into a parameter)."""
        if isinstance(t, self.torch.Tensor):
            self.consumed.update(self.names_of(t))

    def record(self, cls, attr):
        """Wrap the engine's weight iterator `cls.attr` so that every tensor it yields is known."""
        orig = getattr(cls, attr)

        def iterate(loader, *x, **k):
            for name, t in orig(loader, *x, **k):
                self.names[t.untyped_storage().data_ptr()] = name
                yield name, t

        setattr(cls, attr, iterate)

    @contextlib.contextmanager
    def following_cat(self):
        torch = self.torch
        orig = torch.cat

        def cat(tensors, *x, **k):
            out = orig(tensors, *x, **k)
            held = set()
            for t in tensors:
                held |= self.names_of(t)
            if held:
                self.derived[out.untyped_storage().data_ptr()] = held
            return out

        torch.cat = cat
        try:
            yield
        finally:
            torch.cat = orig

    def dropped(self, by_design):
        """Checkpoint tensors that reached no weight loader, less what the engine drops."""
        return sorted(n for n in set(self.names.values()) - self.consumed if n not in by_design)


# Engine parameters that fuse several checkpoint tensors (concatenated along dim 0, in this
# order: vLLM's and SGLang's `stacked_params_mapping`, and SGLang's MLA `torch.cat` of q_a and
# kv_a).
FUSED = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "fused_qkv_a_proj_with_mqa": ("q_a_proj", "kv_a_proj_with_mqa"),
    "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"),
}
# Engine parameters that stack one checkpoint tensor of every decoder layer (dim 0, layer
# order): K3DSparkModel's `context_kv_proj`, each layer's `kv_a_proj_with_mqa`
# (`_duplicate_context_kv_weights` in vLLM's models/kimi_k3/nvidia/dspark_mla.py).
PER_LAYER = {"context_kv_proj": "self_attn.kv_a_proj_with_mqa"}
# Engine parameter names that are a checkpoint name under another name.
RENAMED = {"draft_id_to_target_id": "d2t"}
LAYER_PREFIXES = ("midlayer.", "layers.0.")


def checkpoint_names(engine_name, layer_prefix):
    """The checkpoint names kquant's reading gives an engine parameter: `model.` dropped, the
    EAGLE-3 decoder layer under the prefix `kquant inspect` found (`layer_prefix`)."""
    n = engine_name
    if n.startswith("model."):
        n = n[len("model.") :]
    n = RENAMED.get(n, n)
    if layer_prefix:
        for p in LAYER_PREFIXES:
            if n.startswith(p):
                n = layer_prefix + n[len(p) :]
                break
    parts = n.split(".")
    for i, part in enumerate(parts):
        if part in FUSED:
            return [".".join(parts[:i] + [s] + parts[i + 1 :]) for s in FUSED[part]]
    return [n]


def per_layer(names, tensors):
    """A [`PER_LAYER`] parameter's checkpoint names: its part in every layer, in layer order."""
    if len(names) != 1 or names[0].split(".")[0] not in PER_LAYER:
        return names
    head, _, rest = names[0].partition(".")
    part = f".{PER_LAYER[head]}.{rest}"
    layers = sorted(
        int(n.split(".")[1]) for n in tensors
        if n.startswith("layers.") and n.endswith(part) and n.split(".")[1].isdecimal()
    )
    return [f"layers.{i}{part}" for i in layers] or names


def same(torch, got, want):
    """Exact equality after bringing the checkpoint tensor to the parameter's dtype."""
    try:
        want = want.to(got.dtype)
    except Exception:
        return False
    if got.dtype.is_floating_point:
        return bool(torch.equal(got.float(), want.float()))
    return bool(torch.equal(got, want))


def content(torch, params, tensors, layer_prefix, exempt=()):
    """Compare each parameter (as loaded, before post-processing) with the checkpoint tensors
    kquant's reading puts there. `tensors`: name -> tensor of the checkpoint. Returns
    (compared, mismatched, uncompared): names. A fused parameter is compared with the
    dim-0 concatenation of its parts (or, for per-part scalars, with their stack)."""
    compared, mismatched, uncompared = [], [], []
    for pname, p in sorted(params.items()):
        if pname in exempt or p.numel() == 0:
            continue
        names = checkpoint_names(pname, layer_prefix)
        names = per_layer(names, tensors)
        if not all(n in tensors for n in names):
            uncompared.append(pname)
            continue
        parts = [tensors[n] for n in names]
        got = p.data.detach().cpu()
        if len(parts) == 1:
            want = parts[0]
        elif all(t.numel() == 1 for t in parts) and got.numel() == len(parts):
            want, got = torch.stack([t.reshape(()) for t in parts]), got.reshape(-1)
        else:
            try:
                want = torch.cat(parts, 0)
            except Exception:
                uncompared.append(pname)
                continue
        if tuple(want.shape) != tuple(got.shape) and len(parts) > 1:
            # Per-part vectors (compressed-tensors' weight_shape) kept one row per part.
            same_shape = all(t.shape == parts[0].shape for t in parts)
            if same_shape and tuple(got.shape) == (len(parts), *parts[0].shape):
                want = torch.stack(parts)
        if tuple(want.shape) != tuple(got.shape):
            if want.numel() == 1 and got.numel() == 1:
                want, got = want.reshape(()), got.reshape(())
            elif want.dim() == 2 and tuple(got.shape) == tuple(want.shape[::-1]):
                # Stored transposed by the engine's scheme (vLLM's Quark W4A16: [in, out]).
                want = want.t()
            else:
                uncompared.append(pname)
                continue
        compared.append(pname)
        if not same(torch, got, want):
            mismatched.append(pname)
    return compared, mismatched, uncompared


def read_checkpoint(draft):
    """Every tensor of the checkpoint's safetensors files (the tiny drafts are small)."""
    from safetensors import safe_open

    out = {}
    for f in sorted(os.listdir(draft)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(draft, f), framework="pt") as sf:
                for k in sf.keys():
                    out[k] = sf.get_tensor(k)
    return out


def harness_args(ap, kind_flag, kind_default):
    """The command line both harnesses share: `--jobs FILE`, or one checkpoint given by
    `--draft DIR --target-config DIR` and `kind_flag` (`--method` / `--algorithm`). `ap` may
    hold the harness's own flags already. Returns (args, jobs)."""
    key = kind_flag.lstrip("-")
    ap.add_argument("--jobs", help=f"a JSON list of jobs (draft, target_config, {key}, ...)")
    ap.add_argument("--draft")
    ap.add_argument("--target-config")
    ap.add_argument(kind_flag, default=kind_default)
    ap.add_argument("--layer-prefix", help="kquant's reading (inspect's layer_prefix)")
    ap.add_argument("--plant", choices=["swap-qk"])
    a = ap.parse_args()
    if a.jobs:
        with open(a.jobs) as f:
            return a, json.load(f)
    if not (a.draft and a.target_config):
        ap.error("--jobs FILE, or --draft DIR --target-config DIR")
    job = {
        "draft": a.draft,
        "target_config": a.target_config,
        key: getattr(a, key),
        "layer_prefix": a.layer_prefix,
        "plant": a.plant,
    }
    return a, [job]


def preload(modules):
    """Import what every child would import (once, in the parent), then freeze the heap so
    each child's garbage collections skip it."""
    import gc
    import importlib

    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # a module this release lacks: the child reports what matters
            print(f"preload {m}: {type(e).__name__}: {e}", file=sys.stderr)
    gc.collect()
    gc.freeze()


def run_jobs(jobs, one, timeout=600):
    """Run `one(job) -> verdict` for each job in a child forked after the engine's imports (one
    process per checkpoint, as the engines keep global state, without paying the imports each
    time). Prints one JSON verdict line per job on stdout; the engine's own output goes to
    stderr. A child that dies without a verdict gives a verdict with stage "harness"."""
    sys.stdout.flush()
    for job in jobs:
        r, w = os.pipe()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.dup2(2, 1)
            signal.alarm(timeout)
            try:
                v = one(job)
            except BaseException:
                v = {"ok": False, "stage": "harness", "message": traceback.format_exc()[-800:]}
            v["draft"] = job["draft"]
            v["job"] = job
            sys.stdout.flush()
            sys.stderr.flush()
            with os.fdopen(w, "w") as f:
                f.write(json.dumps(v))
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        if data:
            v = json.loads(data)
        else:
            v = {
                "ok": False,
                "stage": "harness",
                "message": f"harness child died (wait status {status})",
                "draft": job["draft"],
                "job": job,
            }
        v["seconds"] = round(time.monotonic() - t0, 1)
        print(json.dumps(v), flush=True)


def kernel_setup_message(tb_text, engine_pkg):
    """What a stop in CUDA kernel set-up says: the engine's own frame that asked for the GPU
    (the exception itself only says there is none, or that CUDA cannot start in a forked
    child)."""
    frames = [l.strip() for l in tb_text.splitlines() if l.strip().startswith("File ")]
    own = [f for f in frames if f"/{engine_pkg}/" in f]
    where = own[-1] if own else (frames[-1] if frames else "")
    where = where.split(f"/site-packages/", 1)[-1].replace('", line', ":").replace(", in ", " ")
    return f"CUDA kernel set-up needs a GPU (at {where})"
