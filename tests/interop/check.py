# Requires (PyPI, fixtures/gen/requirements.txt): torch 2.15.0, safetensors 0.8.0,
# compressed-tensors 0.20.0, amd-quark 0.13, nvidia-modelopt 0.47.0, ninja.
"""Interop check: kquant's quantized outputs read back by the reference libraries' own code.

Usage: python tests/interop/check.py CASES.json      (run by tests/interop.rs; see .ci/run)

CASES.json is a list of {"kquant_output_dir", "kquant_dequantized_dir", "format", "scheme"}
(plus an optional "name"). For every case this loads the output kquant wrote, dequantizes every
quantized module with the reference library's own functions, and compares the result with
`kquant dequantize --dtype f32` of the same output:

- compressed-tensors 0.20.0: `CompressedTensorsDequantizer` (its model-free dequantizing
  converter, compressed_tensors/entrypoints/convert/converters/ct_dequantizer.py), built from
  the output directory's config.json, whose `validate` runs `process` (the registered
  compressor's `decompress`: `PackedQuantizationCompressor` -> `unpack_from_int32` +
  `forward.dequantize`; `FloatQuantizationCompressor` / `IntQuantizationCompressor` ->
  `forward.dequantize`) and then refuses leftover quantization parameters.
  compressed-tensors dequantizes in the scale's dtype (`x_q.to(scale.dtype) * scale`, i.e. BF16
  for a BF16 model). kquant's f32 result is the exact product, so the rule is
  `reference == round_to_scale_dtype(kquant_f32)` (round to nearest even, bit for bit). The same
  converter is then run again with every `weight_scale` widened to f32 (lossless), which makes it
  compute in f32; that result must equal kquant's f32 bit for bit.
  The converter matches the naive formats by tensor name (`<module>.weight`), so for
  float-/int-quantized it would also take `embed_tokens.weight` (which no compressed-tensors
  writer quantizes: its `ignore` lists Linear layers only) and fail on the missing scale; it
  does the same on compressed-tensors' own FP8_DYNAMIC/W4A8 goldens. The modules whose weight
  has no `weight_scale` are therefore passed to its `ignore` argument.
  `nvfp4-pack-quantized` (`_check_ct_nvfp4`): the converter (NVFP4PackedCompressor.decompress
  unpacks to BF16, so the rule is `reference == bf16(kquant_f32)`), plus the library's
  `unpack_fp4_from_uint8(dtype=float32)` + `forward.dequantize` in f32, bitwise. For W4A4 the
  converter's `validate` refuses compressed-tensors' own output (residual `input_global_scale`),
  so `process` is used and the leftover input global scales are checked separately.
- AMD Quark 0.13, model layout: `quark.torch.export.api.import_model_from_safetensors(model,
  dir)` (Quark's own importer for its safetensors exports) into a skeleton of `nn.Linear` /
  `nn.Embedding` modules on the meta device, built from the tensor names (Quark decides from the
  config's `exclude` which Linears become `QParamsLinear`). Each `QParamsLinear`'s weight is then
  dequantized by its own `weight_quantizer` (`StaticScaledRealQuantizer` or, for int4_fp8,
  `SequentialRealQuantizer`: `Pack_4_bits.unpack` + `quark.torch.kernel.dequantize`), which
  computes in f32: equal to kquant's f32 bit for bit.
- AMD Quark 0.13, file2file layout (per-channel INT4 without `weight_zero_point`): Quark's
  importer refuses these files (it requires `weight_zero_point`; it refuses Quark's own
  `direct_quantize_checkpoint` output the same way), so they are read with Quark's unpacker
  `quark.torch.utils.pack.Pack_4_bits("per_channel", "int4").unpack(w, reorder=False)` (the
  data is sequential although the config says "reorder", as Quark's own file2file output is)
  and `quark.torch.kernel.dequantize("int4", q, scale, 0, axis 0, "per_channel")` in f32.
- NVIDIA ModelOpt 0.47.0: ModelOpt has no reader for its unified HF export. `FP8_PER_CHANNEL_
  PER_TOKEN` is dequantized with `FP8QTensor(...).dequantize(scale=weight_scale[:, None],
  dtype=float32)`. `W4A16_AWQ` is unpacked with the inverse of ModelOpt's packer
  (`quant_utils.pack_int4_in_uint8`), and re-packing the codes with that packer must give the
  file's bytes; the value is `q * weight_scale * pre_quant_scale` in f32 (what TensorRT-LLM
  computes with). Both must equal kquant's f32 bit for bit, and ModelOpt's own export function
  `quant_utils.to_quantized_weight` applied to kquant's f32 result (divided by
  `pre_quant_scale`) with the file's scales must reproduce the file's weight bytes. The modules
  Linear layers left unquantized (2-D `.weight`, embeddings aside) must all be in
  `hf_quant_config.json`'s `exclude_modules` (fnmatch, as TensorRT-LLM matches them) and no
  quantized module may be. `NVFP4` / `W4A16_NVFP4`: `NVFP4QTensor(...).dequantize(scale,
  double_scale=weight_scale_2)` in f32, bitwise, and `to_quantized_weight(kquant f32, scale,
  NVFP4, weight_scale_2)` must reproduce the file's bytes, except that code 8 (−0, which
  ModelOpt reads back as +0) re-quantizes to 0; `input_scale` only for `NVFP4`. `FP8`
  (`fp8-pt`, the layout of ModelOpt's drafter quantizer): `FP8QTensor(...).dequantize(scale=
  weight_scale)` with the F32 `[1]` scale, bitwise, an F32 `[1]` `input_scale` on every module,
  and `to_quantized_weight(kquant f32, scale, FP8)` reproduces the file's bytes.

In every case the tensors that are not quantized must be identical (dtype, shape, bytes) and the
set of tensor names must be the same. Prints one line per case and `N passed, M failed`; exits 1
on any failure.
"""

import fnmatch
import json
import os
import sys
import time
import traceback
from pathlib import Path

# Quark JIT-compiles a C++ extension on first import and needs `ninja` from the venv's bin/.
os.environ["PATH"] = os.path.dirname(os.path.abspath(sys.executable)) + os.pathsep + os.environ.get("PATH", "")

# The libraries print freely (logs, progress bars, compiler output): keep stdout for the report.
REPORT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr


def say(line: str) -> None:
    REPORT.write(line + "\n")


T0 = time.time()
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

torch.set_grad_enabled(False)


class Mismatch(Exception):
    pass


# What each (format, scheme) must look like in the config, so that a case cannot be wired to the
# wrong reader. A (format, scheme) missing here fails: a new carrier needs a reader here.
def _quark_weights(scheme):
    if scheme == "int4-pc":
        return [("int4", "per_channel", None)]
    if scheme == "fp8-pc":
        return [("fp8_e4m3", "per_channel", None)]
    if scheme == "w4a8-fp8":
        return [("fp8_e4m3", "per_tensor", None), ("int4", "per_channel", None)]
    for kind in ("int4", "uint4"):
        if scheme.startswith(kind + "-g"):
            return [(kind, "per_group", int(scheme[len(kind) + 2 :]))]
    return None


def _ct_weights(scheme):
    if scheme == "int4-pc":
        return ("pack-quantized", {"type": "int", "num_bits": 4, "strategy": "channel", "group_size": None})
    if scheme.startswith("int4-g"):
        g = int(scheme[len("int4-g") :])
        return ("pack-quantized", {"type": "int", "num_bits": 4, "strategy": "group", "group_size": g})
    if scheme == "fp8-pc":
        return ("float-quantized", {"type": "float", "num_bits": 8, "strategy": "channel", "group_size": None})
    if scheme == "w4a8-int8":
        return ("int-quantized", {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128})
    if scheme in ("nvfp4-a16", "nvfp4"):
        return ("nvfp4-pack-quantized", {"type": "float", "num_bits": 4, "strategy": "tensor_group", "group_size": 16})
    return None


MODELOPT_ALGO = {
    "int4-g128": "W4A16_AWQ",
    "fp8-pc": "FP8_PER_CHANNEL_PER_TOKEN",
    "nvfp4-a16": "W4A16_NVFP4",
    "nvfp4": "NVFP4",
    "fp8-pt": "FP8",
}


def load_dir(d: Path) -> dict:
    """All tensors of a checkpoint directory (single file or index + shards)."""
    index = d / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        out.update(load_file(str(d / f)))
    return out


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    a8 = a.contiguous().reshape(-1).view(torch.uint8)
    b8 = b.contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(a8, b8)


def first_diffs(ref: torch.Tensor, kq: torch.Tensor, n: int = 3) -> str:
    bad = (ref.reshape(-1).view(torch.int32) != kq.reshape(-1).view(torch.int32)).nonzero().reshape(-1)
    cols = kq.shape[-1] if kq.dim() else 1
    parts = []
    for i in bad[:n].tolist():
        parts.append(f"[{i // cols},{i % cols}] ref {ref.reshape(-1)[i].item()!r} kquant {kq.reshape(-1)[i].item()!r}")
    return f"{bad.numel()} of {kq.numel()} values differ: " + "; ".join(parts)


def compare_f32(name: str, ref: torch.Tensor, kq: torch.Tensor, what: str) -> None:
    """Bitwise equality of two f32 tensors."""
    if kq.dtype != torch.float32:
        raise Mismatch(f"{name}: kquant's dequantized tensor is {kq.dtype}, not float32")
    ref = ref.to(torch.float32) if ref.dtype != torch.float32 else ref
    if tuple(ref.shape) != tuple(kq.shape):
        raise Mismatch(f"{name}: {what}: shape {tuple(ref.shape)} vs kquant {tuple(kq.shape)}")
    if not torch.equal(ref.contiguous().view(torch.int32), kq.contiguous().view(torch.int32)):
        raise Mismatch(f"{name}: {what}: {first_diffs(ref.contiguous(), kq.contiguous())}")


def compare_rounded(name: str, ref: torch.Tensor, kq: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """The reference computed in `dtype`: it must equal kquant's exact f32 rounded to `dtype`."""
    want = kq.to(dtype).to(torch.float32)  # round to nearest even, then exact widening
    compare_f32(name, ref.to(dtype).to(torch.float32), want, what + f" (rule: reference == {dtype}(kquant f32))")
    if not torch.equal(ref.to(torch.float32), ref.to(dtype).to(torch.float32)):
        raise Mismatch(f"{name}: {what}: reference values are not {dtype} values")


def compare_rest(ref: dict, kq: dict, dequantized: set) -> int:
    """Same tensor names; every tensor that is not a dequantized weight identical."""
    if set(ref) != set(kq):
        only_ref = sorted(set(ref) - set(kq))[:5]
        only_kq = sorted(set(kq) - set(ref))[:5]
        raise Mismatch(f"tensor names differ: only in the reference's reading {only_ref}, only in kquant's {only_kq}")
    n = 0
    for k in sorted(ref):
        if k in dequantized:
            continue
        if not same_bytes(ref[k], kq[k]):
            raise Mismatch(f"{k}: unquantized tensor differs ({ref[k].dtype} {tuple(ref[k].shape)} vs {kq[k].dtype} {tuple(kq[k].shape)})")
        n += 1
    return n


# ---------------------------------------------------------------------------------------------
# compressed-tensors


def check_ct(case, out_dir: Path, kq: dict) -> str:
    from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer

    qc = json.loads((out_dir / "config.json").read_text())["quantization_config"]
    want = _ct_weights(case["scheme"])
    if want is None:
        raise Mismatch(f"no compressed-tensors reader for scheme {case['scheme']} in check.py")
    fmt, wargs = want
    got = qc["config_groups"]["group_0"]["weights"]
    if qc.get("format") != fmt or any(got.get(k) != v for k, v in wargs.items()):
        raise Mismatch(f"config does not describe {case['scheme']}: format {qc.get('format')}, weights {got}")

    if fmt == "nvfp4-pack-quantized":
        return _check_ct_nvfp4(case, qc, out_dir, kq)

    tensors = load_dir(out_dir)
    modules = sorted(k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale"))
    no_scale = sorted(
        k[: -len(".weight")] for k in tensors if k.endswith(".weight") and k[: -len(".weight")] + ".weight_scale" not in tensors
    )

    for m in no_scale:
        if not tensors[m + ".weight"].dtype.is_floating_point or tensors[m + ".weight"].element_size() == 1:
            raise Mismatch(f"{m}.weight is {tensors[m + '.weight'].dtype} without a weight_scale")

    def run(ts):
        dq = CompressedTensorsDequantizer(str(out_dir), ignore=no_scale, dtype=torch.float32)
        if dq.quant_config.config_groups["group_0"].format.value != fmt:
            raise Mismatch(f"compressed-tensors inferred format {dq.quant_config.config_groups['group_0'].format} for this config, not {fmt}")
        return dq.validate(dict(ts))

    native = run(tensors)
    scale_dtype = {tensors[m + ".weight_scale"].dtype for m in modules}
    if len(scale_dtype) != 1:
        raise Mismatch(f"mixed scale dtypes {scale_dtype}")
    (scale_dtype,) = scale_dtype
    wide = run({k: (v.to(torch.float32) if k.endswith(".weight_scale") else v) for k, v in tensors.items()})

    deq = {m + ".weight" for m in modules}
    for w in sorted(deq):
        if scale_dtype == torch.float32:
            compare_f32(w, native[w], kq[w], "compressed-tensors decompress")
        else:
            compare_rounded(w, native[w], kq[w], scale_dtype, "compressed-tensors decompress")
        compare_f32(w, wide[w], kq[w], "compressed-tensors decompress with f32 scales")
    rest = compare_rest(native, kq, deq)
    comp = {"pack-quantized": "PackedQuantizationCompressor", "float-quantized": "FloatQuantizationCompressor", "int-quantized": "IntQuantizationCompressor"}[fmt]
    rule = "bitwise" if scale_dtype == torch.float32 else f"== {str(scale_dtype).removeprefix('torch.')}(kquant f32)"
    return (
        f"{len(deq)} modules via CompressedTensorsDequantizer/{comp} ({rule}; with f32 scales bitwise), "
        f"{rest} other tensors identical"
    )


def _check_ct_nvfp4(case, qc, out_dir: Path, kq: dict) -> str:
    """NVFP4: `CompressedTensorsDequantizer.process` (NVFP4PackedCompressor.decompress, which
    unpacks to BF16 and so returns BF16: reference == bf16(kquant f32)), and the library's own
    `unpack_fp4_from_uint8(dtype=float32)` + `forward.dequantize` in F32 (bitwise).

    For W4A4 (`NVFP4`) the converter's `validate` refuses compressed-tensors' own output (it
    does the same on fixtures/goldens/compressed-tensors-0.20/NVFP4): `input_global_scale` is
    not among NVFP4PackedCompressor's `compression_param_names` when the input activations are
    `dynamic: "local"`, so it is left behind and counted as residual. `process` is run instead,
    and the leftover `input_global_scale` tensors must be exactly one F32 [1] per module."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    w4a4 = case["scheme"] == "nvfp4"
    ia = qc["config_groups"]["group_0"]["input_activations"]
    if w4a4 != (ia is not None and ia.get("dynamic") == "local"):
        raise Mismatch(f"input_activations {ia} do not describe {case['scheme']}")
    tensors = load_dir(out_dir)
    modules = sorted(k[: -len(".weight_packed")] for k in tensors if k.endswith(".weight_packed"))
    dq = CompressedTensorsDequantizer(str(out_dir), dtype=torch.float32)
    scheme = dq.quant_config.config_groups["group_0"]
    if scheme.format.value != "nvfp4-pack-quantized":
        raise Mismatch(f"compressed-tensors inferred format {scheme.format} for this config")
    native = dq.process(dict(tensors)) if w4a4 else dq.validate(dict(tensors))
    deq, extra = set(), set()
    for m in modules:
        w = m + ".weight"
        compare_rounded(w, native[w], kq[w], torch.bfloat16, "compressed-tensors decompress")
        packed, scale = tensors[m + ".weight_packed"], tensors[m + ".weight_scale"]
        q = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2, dtype=torch.float32)
        f32 = dequantize(q, scale.to(torch.float32), args=scheme.weights,
                         global_scale=tensors[m + ".weight_global_scale"], dtype=torch.float32)
        compare_f32(w, f32, kq[w], "unpack_fp4_from_uint8 + forward.dequantize in f32")
        deq.add(w)
        if w4a4:
            g = native.pop(m + ".input_global_scale", None)
            if g is None or g.dtype != torch.float32 or tuple(g.shape) != (1,):
                raise Mismatch(f"{m}.input_global_scale: {None if g is None else (g.dtype, tuple(g.shape))}")
            extra.add(m)
    rest = compare_rest(native, kq, deq)
    how = "process (validate refuses input_global_scale)" if w4a4 else "validate"
    return (
        f"{len(deq)} modules via CompressedTensorsDequantizer.{how}/NVFP4PackedCompressor (== bfloat16(kquant f32)) "
        f"and forward.dequantize in f32 (bitwise), {len(extra)} input_global_scale, {rest} other tensors identical"
    )


# ---------------------------------------------------------------------------------------------
# AMD Quark


def _quark_skeleton(shapes: dict) -> torch.nn.Module:
    """nn.Linear / nn.Embedding for every 2-D `.weight`, buffers for everything else, on meta."""
    root = torch.nn.Module()

    def parent(path):
        m = root
        for p in path:
            if not hasattr(m, p):
                m.add_module(p, torch.nn.Module())
            m = getattr(m, p)
        return m

    linear = {k[: -len(".weight")] for k, (shape, _) in shapes.items() if k.endswith(".weight") and len(shape) == 2}
    with torch.device("meta"):
        for name, (shape, dtype) in shapes.items():
            parts = name.split(".")
            mod_name = ".".join(parts[:-1])
            if mod_name in linear:
                if parts[-1] != "weight":
                    continue  # a bias: created with its Linear
                out_f, in_f = shape
                if "embed" in mod_name:
                    mod = torch.nn.Embedding(out_f, in_f, dtype=dtype)
                else:
                    mod = torch.nn.Linear(in_f, out_f, bias=mod_name + ".bias" in shapes, dtype=dtype)
                parent(parts[:-2]).add_module(parts[-2], mod)
            else:
                parent(parts[:-1]).register_buffer(parts[-1], torch.empty(shape, dtype=dtype))
    return root


def check_quark(case, out_dir: Path, kq: dict) -> str:
    qc = json.loads((out_dir / "config.json").read_text())["quantization_config"]
    want = _quark_weights(case["scheme"])
    if want is None:
        raise Mismatch(f"no Quark reader for scheme {case['scheme']} in check.py")
    w = qc["global_quant_config"]["weight"]
    w = w if isinstance(w, list) else [w]
    got = [(x["dtype"], x["qscheme"], x.get("group_size")) for x in w]
    if got != want:
        raise Mismatch(f"config does not describe {case['scheme']}: weight {got}")

    tensors = load_dir(out_dir)
    has_scale = {k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale")}
    # Quark's file2file path writes per-channel INT4 without `weight_zero_point`.
    file2file = want == [("int4", "per_channel", None)] and not any(m + ".weight_zero_point" in tensors for m in has_scale)
    if file2file:
        return _check_quark_f2f(case, qc, tensors, has_scale, kq)

    from quark.torch.export.api import import_model_from_safetensors
    from quark.torch.export.nn.modules.qparamslinear import QParamsLinear

    # The skeleton: the float model's modules. A quantized Linear gets the shape of kquant's
    # dequantized weight (Quark checks it against the packed tensors when loading).
    shapes = {}
    for k, v in tensors.items():
        mod, _, leaf = k.rpartition(".")
        if mod not in has_scale:
            shapes[k] = (tuple(v.shape), v.dtype)
        elif leaf == "weight":
            sd = tensors[mod + ".weight_scale"].dtype
            shapes[k] = (tuple(kq[k].shape), sd if sd.is_floating_point else torch.bfloat16)
        elif leaf == "bias":
            shapes[k] = (tuple(v.shape), v.dtype)
    model = _quark_skeleton(shapes)
    model = import_model_from_safetensors(model, str(out_dir))

    qmods = {n: m for n, m in model.named_modules() if isinstance(m, QParamsLinear)}
    if set(qmods) != has_scale:
        raise Mismatch(
            f"Quark's config made QParamsLinear of {sorted(set(qmods) - has_scale)[:5]} (no scales in the file) "
            f"and left {sorted(has_scale - set(qmods))[:5]} (scales in the file) unquantized"
        )
    for n, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type == "meta":
            raise Mismatch(f"{n}: not loaded by Quark's importer")

    ref, deq = {}, set()
    for n, t in model.state_dict().items():
        if n.rpartition(".")[0] in qmods and n.rpartition(".")[2] == "bias":
            ref[n] = t
        elif not any(n.startswith(q + ".") for q in qmods):
            ref[n] = t
    kinds = set()
    for n, m in sorted(qmods.items()):
        kinds.add(type(m.weight_quantizer).__name__)
        wq = m._get_qweight(m.weight)  # QParamsLinear's own dequantization of its stored weight
        if wq.dtype != torch.float32:
            raise Mismatch(f"{n}: Quark dequantized to {wq.dtype}, expected float32")
        compare_f32(n + ".weight", wq, kq[n + ".weight"], "Quark import")
        ref[n + ".weight"] = wq
        deq.add(n + ".weight")
    rest = compare_rest(ref, kq, deq)
    return (
        f"{len(deq)} modules via import_model_from_safetensors/QParamsLinear ({'+'.join(sorted(kinds))}, f32 bitwise), "
        f"{rest} other tensors identical"
    )


def _check_quark_f2f(case, qc, tensors, modules, kq) -> str:
    import quark.torch.kernel  # noqa: F401  (registers torch.ops.quark)
    from quark.torch.utils.pack import Pack_4_bits

    pack = Pack_4_bits("per_channel", "int4")
    ref, deq, reorder_differs = dict(tensors), set(), 0
    for m in sorted(modules):
        packed, scale = ref.pop(m + ".weight"), ref.pop(m + ".weight_scale")
        out_f, in_f = kq[m + ".weight"].shape
        q = pack.unpack(packed.clone(), reorder=False)[:, :in_f]
        w = torch.ops.quark.dequantize("int4", q, scale, torch.zeros(scale.shape, dtype=torch.int32), 0, 0, "per_channel")
        compare_f32(m + ".weight", w, kq[m + ".weight"], "Quark Pack_4_bits(order) + kernel.dequantize")
        if not torch.equal(pack.unpack(packed.clone(), reorder=True)[:, :in_f], q):
            reorder_differs += 1
        ref[m + ".weight"] = w
        deq.add(m + ".weight")
    rest = compare_rest(ref, kq, deq)
    note = qc.get("export", {}).get("pack_method")
    return (
        f"{len(deq)} modules via Pack_4_bits.unpack(reorder=False)+quark.kernel.dequantize (f32 bitwise; Quark's importer "
        f"refuses file2file; config says {note!r}, reading it so would change {reorder_differs}/{len(deq)} modules), "
        f"{rest} other tensors identical"
    )


# ---------------------------------------------------------------------------------------------
# NVIDIA ModelOpt


def check_modelopt(case, out_dir: Path, kq: dict) -> str:
    from modelopt.torch.export.model_config import (
        QUANTIZATION_FP8,
        QUANTIZATION_FP8_PC_PT,
        QUANTIZATION_INT4_AWQ,
        QUANTIZATION_NVFP4,
        QUANTIZATION_W4A16_NVFP4,
    )
    from modelopt.torch.export.quant_utils import pack_int4_in_uint8, to_quantized_weight
    from modelopt.torch.quantization.qtensor import FP8QTensor, NVFP4QTensor

    hf = json.loads((out_dir / "hf_quant_config.json").read_text())["quantization"]
    qc = json.loads((out_dir / "config.json").read_text())["quantization_config"]
    algo = MODELOPT_ALGO.get(case["scheme"])
    if algo is None:
        raise Mismatch(f"no ModelOpt reader for scheme {case['scheme']} in check.py")
    if hf["quant_algo"] != algo or qc["quant_algo"] != algo:
        raise Mismatch(f"quant_algo {hf['quant_algo']} / {qc['quant_algo']}, expected {algo}")
    exclude = hf.get("exclude_modules") or []
    if sorted(exclude) != sorted(qc.get("ignore") or []):
        raise Mismatch("hf_quant_config.json exclude_modules differs from config.json ignore")

    tensors = load_dir(out_dir)
    modules = sorted(k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale"))
    for k, v in tensors.items():
        m = k[: -len(".weight")]
        if k.endswith(".weight") and v.dim() == 2 and "embed" not in m:  # the Linear layers
            excluded = any(fnmatch.fnmatch(m, p) for p in exclude)
            if (m in modules) == excluded:
                raise Mismatch(f"{m}: {'quantized but' if excluded else 'not quantized and not'} in exclude_modules")

    ref, deq = dict(tensors), set()
    for m in modules:
        data, scale = ref.pop(m + ".weight"), ref.pop(m + ".weight_scale")
        pqs = ref.pop(m + ".pre_quant_scale", None)
        kqw = kq[m + ".weight"]
        if algo in ("NVFP4", "W4A16_NVFP4"):
            ws2 = ref.pop(m + ".weight_scale_2")
            inp = ref.pop(m + ".input_scale", None)
            if (inp is not None) != (algo == "NVFP4") or (inp is not None and tuple(inp.shape) != ()):
                raise Mismatch(f"{m}.input_scale: {None if inp is None else tuple(inp.shape)} for {algo}")
            if data.dtype != torch.uint8 or scale.dtype != torch.float8_e4m3fn or tuple(ws2.shape) != ():
                raise Mismatch(f"{m}: {data.dtype}/{scale.dtype}/{tuple(ws2.shape)} is not ModelOpt NVFP4")
            if hf.get("group_size") != 16:
                raise Mismatch(f"group_size {hf.get('group_size')}")
            shape = torch.Size([data.shape[0], data.shape[1] * 2])
            w = NVFP4QTensor(shape, torch.float32, data).dequantize(
                dtype=torch.float32, scale=scale, double_scale=ws2, block_sizes={-1: 16}
            )
            compare_f32(m + ".weight", w, kqw, "NVFP4QTensor.dequantize")
            fmt = QUANTIZATION_NVFP4 if algo == "NVFP4" else QUANTIZATION_W4A16_NVFP4
            again = to_quantized_weight(kqw, scale, fmt, weights_scaling_factor2=ws2, block_size=16)
            # ModelOpt reads code 8 (a negative that rounded to 0) as +0, which re-quantizes to
            # code 0: compare with both zero codes as 0.
            def zero8(b):
                lo, hi = b & 0x0F, b >> 4
                lo = torch.where(lo == 8, torch.zeros_like(lo), lo)
                hi = torch.where(hi == 8, torch.zeros_like(hi), hi)
                return lo | (hi << 4)
            again, data = zero8(again), zero8(data)
        elif algo == "W4A16_AWQ":
            g = hf["group_size"]
            if data.dtype != torch.uint8:
                raise Mismatch(f"{m}.weight is {data.dtype}, not uint8")
            lo = (data & 0x0F).to(torch.int16)
            hi = (data >> 4).to(torch.int16)
            lo = torch.where(lo > 7, lo - 16, lo)
            hi = torch.where(hi > 7, hi - 16, hi)
            q = torch.stack([lo, hi], dim=1).reshape(2 * data.shape[0], data.shape[1])  # rows 2i, 2i+1
            repacked = pack_int4_in_uint8(q.to(torch.float32), torch.ones_like(scale), g)
            if not same_bytes(repacked, data):
                raise Mismatch(f"{m}.weight: ModelOpt's pack_int4_in_uint8 does not reproduce the file from its unpacked codes")
            w = q.to(torch.float32) * scale.repeat_interleave(g, dim=1)
            if pqs is not None:
                w = w * pqs.to(torch.float32)[None, :]
            compare_f32(m + ".weight", w, kqw, "q * weight_scale * pre_quant_scale")
            back = kqw if pqs is None else kqw / pqs.to(torch.float32)[None, :]
            again = to_quantized_weight(back, scale, QUANTIZATION_INT4_AWQ, block_size=g)
        elif algo == "FP8":
            # quantize_drafter.py's layout: one F32 [1] scale per tensor and a static [1] input scale.
            inp = ref.pop(m + ".input_scale", None)
            if data.dtype != torch.float8_e4m3fn or tuple(scale.shape) != (1,) or inp is None or tuple(inp.shape) != (1,):
                raise Mismatch(f"{m}: {data.dtype} weight, scale {tuple(scale.shape)}, input_scale {None if inp is None else tuple(inp.shape)} is not ModelOpt FP8 per tensor")
            w = FP8QTensor(data.shape, torch.float32, data).dequantize(dtype=torch.float32, scale=scale)
            compare_f32(m + ".weight", w, kqw, "FP8QTensor.dequantize")
            again = to_quantized_weight(kqw, scale, QUANTIZATION_FP8)
        else:
            if data.dtype != torch.float8_e4m3fn or scale.dim() != 1:
                raise Mismatch(f"{m}: {data.dtype} weight with a {tuple(scale.shape)} scale is not FP8 per channel")
            w = FP8QTensor(data.shape, torch.float32, data).dequantize(dtype=torch.float32, scale=scale[:, None])
            compare_f32(m + ".weight", w, kqw, "FP8QTensor.dequantize")
            again = to_quantized_weight(kqw, scale, QUANTIZATION_FP8_PC_PT)
        if not same_bytes(again, data):
            n = (again.reshape(-1).view(torch.uint8) != data.reshape(-1).view(torch.uint8)).sum().item()
            raise Mismatch(f"{m}.weight: ModelOpt's to_quantized_weight(kquant's f32) differs from the file in {n} bytes")
        ref[m + ".weight"] = w
        deq.add(m + ".weight")
    rest = compare_rest(ref, kq, deq)
    how = {
        "W4A16_AWQ": "unpack checked by pack_int4_in_uint8, q*s*pre_quant_scale",
        "FP8_PER_CHANNEL_PER_TOKEN": "FP8QTensor.dequantize",
        "FP8": "FP8QTensor.dequantize (per tensor, input_scale)",
    }.get(algo, "NVFP4QTensor.dequantize")
    return (
        f"{len(deq)} modules via {how} (f32 bitwise), to_quantized_weight(kquant f32) == file bytes, "
        f"exclude_modules consistent, {rest} other tensors identical"
    )


CHECKERS = {"compressed-tensors": check_ct, "quark": check_quark, "modelopt": check_modelopt}


def main() -> int:
    if len(sys.argv) != 2:
        say(__doc__.split("\n\n")[1])
        return 2
    cases = json.loads(Path(sys.argv[1]).read_text())
    passed = failed = 0
    for case in cases:
        name = case.get("name") or f"{case['format']} {case['scheme']}"
        t = time.time()
        try:
            fn = CHECKERS.get(case["format"])
            if fn is None:
                raise Mismatch(f"unknown format {case['format']!r}")
            kq = load_dir(Path(case["kquant_dequantized_dir"]))
            msg = fn(case, Path(case["kquant_output_dir"]), kq)
            say(f"ok   {name}: {msg} [{time.time() - t:.1f} s]")
            passed += 1
        except Mismatch as e:
            say(f"FAIL {name}: {e}")
            failed += 1
        except Exception as e:  # a reference library refusing the file is a failure too
            say(f"FAIL {name}: {type(e).__name__}: {e}")
            traceback.print_exc()
            failed += 1
    say(f"(python {time.time() - T0:.1f} s in all, library imports included)")
    say(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
