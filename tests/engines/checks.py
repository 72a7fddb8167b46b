"""The checks both engine harnesses add around the engine's own loading (the engines do not
check completeness themselves): sentinel-filled parameters, source tensors followed to a weight
loader, and the verdict's problem line."""

import contextlib

INT_SENTINEL = 0x7EADBEEF


def fill_sentinels(torch, model, mark):
    """Fill every float / 32-64-bit integer parameter with a sentinel and wrap its weight
    loader so that the tensor it is given is marked consumed. Returns {name: parameter}."""
    filled = {}
    for pname, p in model.named_parameters():
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

            def wrapped(param, loaded_weight, *r, _wl=wl, **kw):
                mark(loaded_weight)
                return _wl(param, loaded_weight, *r, **kw)

            try:
                p.weight_loader = wrapped
            except AttributeError:
                # vLLM-style parameter classes expose it as a read-only property.
                p._weight_loader = wrapped
    return filled


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
