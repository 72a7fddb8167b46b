# Requires (PyPI, fixtures/gen/requirements.txt): torch 2.15.0, safetensors 0.8.0, nvidia-modelopt 0.47.0.
"""kquant's `--scheme fp8-pt --format modelopt` against ModelOpt's own drafter quantizer.

Usage: python tests/interop/modelopt_drafter.py SOURCE_DIR REFERENCE_DIR KQUANT_DIR   (run by
tests/modelopt_drafter.rs)

REFERENCE_DIR is what `fixtures/gen/modelopt_drafter/quantize_drafter.py --qformat fp8` (Model-
Optimizer PR #2027, on nvidia-modelopt 0.47.0) wrote for a draft; KQUANT_DIR is kquant's output
for the same draft. Checked: the same tensor names, and every tensor's dtype, shape and bytes,
but for the source's non-float tensors (EAGLE-3's `d2t` int64 and `t2d` bool), which the script
casts to the compute dtype with everything else (`{k: v.to(dtype)}`): kquant keeps them as the
source has them (checked equal to the source), and the entries the script's BF16 cast changed
are counted (`d2t` offsets above 256 are not all BF16 integers);
`hf_quant_config.json` byte for byte; `config.json` equal as JSON (kquant's serializer spells some
numbers differently from Python's `json.dumps`, e.g. 1e-6 vs 1e-06). Then kquant's output is read
back with ModelOpt's own code: each FP8 weight dequantized by `FP8QTensor.dequantize` with its
`weight_scale`, re-quantized by `to_quantized_weight(..., QUANTIZATION_FP8)` to the file's bytes.
Prints one JSON line; exit 1 on a difference.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open


def tensors(d: Path) -> dict:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def main() -> int:
    src_dir, ref_dir, kq_dir = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    src, ref, kq = tensors(src_dir), tensors(ref_dir), tensors(kq_dir)
    errors, kept, corrupted = [], [], 0
    if set(ref) != set(kq):
        errors.append(f"tensor names: only ModelOpt {sorted(set(ref) - set(kq))}, only kquant {sorted(set(kq) - set(ref))}")
    same = 0
    for k in sorted(set(ref) & set(kq)):
        a, b = ref[k], kq[k]
        if k in src and not src[k].is_floating_point():
            # The script's cast; kquant keeps the source.
            if b.dtype != src[k].dtype or raw(b) != raw(src[k]):
                errors.append(f"{k}: kquant's copy differs from the source")
            corrupted += int((a.to(torch.float64) != src[k].to(torch.float64)).sum())
            kept.append(k)
            continue
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
            errors.append(f"{k}: ModelOpt {a.dtype}{tuple(a.shape)}, kquant {b.dtype}{tuple(b.shape)}")
        elif raw(a) != raw(b):
            errors.append(f"{k}: bytes differ")
        else:
            same += 1
    hq_ref = (ref_dir / "hf_quant_config.json").read_bytes()
    hq_kq = (kq_dir / "hf_quant_config.json").read_bytes()
    if hq_ref != hq_kq:
        errors.append(f"hf_quant_config.json differs:\n{hq_ref.decode()}\nvs\n{hq_kq.decode()}")
    c_ref = json.loads((ref_dir / "config.json").read_text())
    c_kq = json.loads((kq_dir / "config.json").read_text())
    if c_ref != c_kq:
        keys = sorted(k for k in set(c_ref) | set(c_kq) if c_ref.get(k) != c_kq.get(k))
        errors.append(f"config.json differs in {keys}: {[(c_ref.get(k), c_kq.get(k)) for k in keys]}")

    from modelopt.torch.export.model_config import QUANTIZATION_FP8
    from modelopt.torch.export.quant_utils import to_quantized_weight
    from modelopt.torch.quantization.qtensor import FP8QTensor

    modules = sorted(k[: -len(".weight_scale")] for k in kq if k.endswith(".weight_scale"))
    for m in modules:
        data, scale = kq[m + ".weight"], kq[m + ".weight_scale"]
        inp = kq.get(m + ".input_scale")
        if data.dtype != torch.float8_e4m3fn or tuple(scale.shape) != (1,) or inp is None or tuple(inp.shape) != (1,):
            errors.append(f"{m}: not ModelOpt FP8 per tensor with an input_scale")
            continue
        w = FP8QTensor(data.shape, torch.float32, data).dequantize(dtype=torch.float32, scale=scale)
        again = to_quantized_weight(w, scale, QUANTIZATION_FP8)
        if raw(again) != raw(data):
            errors.append(f"{m}.weight: ModelOpt's to_quantized_weight(FP8QTensor.dequantize) differs from the file")
    print(json.dumps({"tensors_identical": same, "tensors": len(ref), "kept_as_source": kept,
                      "entries_the_script_cast_changed": corrupted, "modules_read_back": len(modules),
                      "errors": errors}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
