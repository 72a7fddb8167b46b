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
