//! `kquant quantize --scheme fp8-pc|w4a8-fp8|w4a8-int8` against the outputs of the reference tools
//! (fixtures/goldens/, made by fixtures/gen/goldens/make_golden.py with amd-quark 0.13 and
//! make_ct_golden.py with compressed-tensors 0.20.0, on CPU): every tensor byte for byte, the
//! quantization_config on every field, and `dequantize`/`diff` reading the results back.

use crate::common;

use std::path::{Path, PathBuf};

use common::{floats, kquant, load, Tensors};
use serde_json::Value;

/// One golden: where it is, the scheme/format that reproduces it, and its file names.
struct Golden {
    dir: &'static str,
    scheme: &'static str,
    format: &'static str,
    exclude: &'static str,
    model: &'static str,
    config: &'static str,
    exclude_key: &'static str,
    /// kquant warns that no (GPU) engine loads it.
    warns: bool,
}

const PTPC: Golden = Golden {
    dir: "quark-0.13/ptpc_fp8_bfloat16",
    scheme: "fp8-pc",
    format: "quark",
    exclude: "lm_head,*embed_tokens",
    model: "export_model.safetensors",
    config: "export_config.json",
    exclude_key: "exclude",
    warns: false,
};
const INT4_FP8: Golden = Golden {
    dir: "quark-0.13/int4_fp8_bfloat16",
    scheme: "w4a8-fp8",
    warns: true,
    ..PTPC
};
const UINT4_G32: Golden = Golden {
    dir: "quark-0.13/uint4_g32_bfloat16",
    scheme: "uint4-g32",
    warns: false,
    ..PTPC
};
const FP8_DYNAMIC: Golden = Golden {
    dir: "compressed-tensors-0.20/FP8_DYNAMIC",
    scheme: "fp8-pc",
    format: "compressed-tensors",
    exclude: "lm_head",
    model: "model.safetensors",
    config: "config.json",
    exclude_key: "ignore",
    warns: false,
};
const W4A8: Golden = Golden {
    dir: "compressed-tensors-0.20/W4A8",
    scheme: "w4a8-int8",
    warns: true,
    ..FP8_DYNAMIC
};

impl Golden {
    fn path(&self) -> PathBuf {
        common::golden(self.dir)
    }

    /// Quantize the golden's source weights (copied alone into a temporary directory: the golden
    /// directory's config is the quantized one) the way the reference run did.
    fn quantize(&self) -> (tempfile::TempDir, PathBuf) {
        let (_s, src) = common::source(&self.path());
        let (t, out, err) = common::quantize(
            &src,
            &[
                "--scheme",
                self.scheme,
                "--format",
                self.format,
                "--exclude",
                self.exclude,
            ],
        );
        assert_eq!(
            err.contains("warning: no"),
            self.warns,
            "{}: {err}",
            self.dir
        );
        (t, out)
    }

    fn check(&self) {
        let (_t, out) = self.quantize();
        let ours = load(&out.join("model.safetensors"));
        let theirs = load(&self.path().join(self.model));
        common::assert_tensors_match(self.dir, &ours, &theirs, |_| true);
        // Config: every field equal, except that kquant's list adds `re:` patterns for engines.
        common::assert_config_matches(
            self.dir,
            &out.join("config.json"),
            &self.path().join(self.config),
            self.exclude_key,
        );
    }
}

#[test]
fn quark_ptpc_fp8_bf16() {
    PTPC.check();
}

#[test]
fn quark_int4_fp8_bf16() {
    INT4_FP8.check();
}

/// Quark `uint4_wo_32` (asymmetric): scales, zero points and every code.
#[test]
fn quark_uint4_g32_bf16() {
    UINT4_G32.check();
}

#[test]
fn compressed_tensors_fp8_dynamic_bf16() {
    FP8_DYNAMIC.check();
}

#[test]
fn compressed_tensors_w4a8_bf16() {
    W4A8.check();
}

/// A checkpoint directory holding a golden's exported weights and quantized config.
fn golden_checkpoint(t: &Path, g: &Golden) -> PathBuf {
    common::golden_checkpoint(t, &g.path(), g.model, g.config)
}

/// E4M3 by value (sign, 4-bit exponent with bias 7, 3-bit mantissa; subnormals at exponent 0).
fn e4m3(b: u8) -> f32 {
    let (e, m) = (((b >> 3) & 15) as i32, (b & 7) as f32);
    let v = if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// What a quantized module of the reference tool's output must dequantize to, computed here
/// from the raw tensors without kquant's decoders, in the order the tools dequantize.
fn expected(g: &Golden, t: &Tensors, module: &str, rows: usize, cols: usize) -> Vec<f32> {
    let get = |s: &str| &t[&format!("{module}.{s}")];
    let (wdt, _, w) = get("weight");
    let (sdt, _, s) = get("weight_scale");
    let s = floats(sdt, s);
    match (g.scheme, wdt.as_str()) {
        ("fp8-pc", "F8_E4M3") => (0..rows * cols).map(|i| e4m3(w[i]) * s[i / cols]).collect(),
        ("w4a8-int8", "I8") => {
            let per_row = s.len() / rows;
            let group = cols / per_row;
            (0..rows * cols)
                .map(|i| w[i] as i8 as f32 * s[(i / cols) * per_row + (i % cols) / group])
                .collect()
        }
        ("w4a8-fp8", "I32") => {
            let (s2dt, _, s2) = get("weight_scale_2");
            let s2 = floats(s2dt, s2);
            let wpr = cols / 8;
            // Reorder packing: nibble i of a word holds element [0,2,4,6,1,3,5,7][i].
            let pos = [0usize, 2, 4, 6, 1, 3, 5, 7];
            let mut out = vec![0f32; rows * cols];
            for r in 0..rows {
                for k in 0..wpr {
                    let o = 4 * (r * wpr + k);
                    let word = u32::from_le_bytes(w[o..o + 4].try_into().unwrap());
                    for (i, &p) in pos.iter().enumerate() {
                        let nib = ((word >> (4 * i)) & 15) as i32;
                        let q = if nib >= 8 { nib - 16 } else { nib };
                        out[r * cols + 8 * k + p] = (q as f32 * s2[r]) * s[0];
                    }
                }
            }
            out
        }
        ("uint4-g32", "I32") => {
            // Transposed: word [c, k] holds rows 8k.. of input column c (reorder); scales and
            // zero points are [in/G, out], the zero points packed the same way.
            let (_, _, zp) = get("weight_zero_point");
            let pos = [0usize, 2, 4, 6, 1, 3, 5, 7];
            let wpc = rows.div_ceil(8);
            let nib = |b: &[u8], c: usize, r: usize| {
                let i = (pos.iter().position(|&p| p == r % 8).unwrap()) as u32;
                let o = 4 * (c * wpc + r / 8);
                (u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) >> (4 * i)) & 15
            };
            let mut out = vec![0f32; rows * cols];
            for r in 0..rows {
                for c in 0..cols {
                    let j = c / 32;
                    let q = nib(w, c, r) as f32 - nib(zp, j, r) as f32;
                    out[r * cols + c] = q * s[j * rows + r];
                }
            }
            out
        }
        other => panic!("{other:?}"),
    }
}

/// `kquant dequantize` reads every reference output back: each quantized module equals the
/// independent decoding above bit for bit, lies within the scheme's error of the source weights,
/// and every other tensor is copied unchanged. `kquant diff` source ↔ reference output agrees.
#[test]
fn reference_outputs_dequantize_and_diff() {
    for g in [&PTPC, &INT4_FP8, &UINT4_G32, &FP8_DYNAMIC, &W4A8] {
        let t = tempfile::tempdir().unwrap();
        let ck = golden_checkpoint(t.path(), g);
        let dq = t.path().join("dq");
        common::dequantize(&ck, &dq, &["--dtype", "f32"], g.dir);
        let out = load(&dq.join("model.safetensors"));
        let orig = load(&g.path().join("orig.safetensors"));
        let quantized = load(&g.path().join(g.model));
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            orig.keys().collect::<Vec<_>>(),
            "{}: the source's tensor names",
            g.dir
        );
        let mut n_q = 0;
        for (name, (odt, oshape, odata)) in &orig {
            let (dt, shape, data) = &out[name];
            assert_eq!(shape, oshape, "{}: {name}", g.dir);
            let module = name.strip_suffix(".weight").unwrap_or(name);
            if !quantized.contains_key(&format!("{module}.weight_scale")) {
                assert_eq!((dt, data), (odt, odata), "{}: {name} copied", g.dir);
                continue;
            }
            n_q += 1;
            assert_eq!(dt, "F32");
            let (rows, cols) = (shape[0] as usize, shape[1] as usize);
            let got = floats("F32", data);
            let want = expected(g, &quantized, module, rows, cols);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}: {name} dequantized values",
                g.dir
            );
            // Against the source: FP8 is within 2^-4 relative (+ subnormal step); INT4 stages
            // within half a step of their scale (a little more where the +7 code clamps).
            let src = floats(odt, odata);
            let s = floats(
                &quantized[&format!("{module}.weight_scale")].0,
                &quantized[&format!("{module}.weight_scale")].2,
            );
            for (i, (&x, &y)) in src.iter().zip(&got).enumerate() {
                let r = i / cols;
                let bound = match g.scheme {
                    "fp8-pc" => x.abs() / 15.0 + s[r] * 2f32.powi(-9),
                    "uint4-g32" => 1.01 * s[(i % cols) / 32 * rows + r] + 1e-6,
                    "w4a8-int8" => {
                        let per_row = s.len() / rows;
                        0.55 * s[r * per_row + (i % cols) * per_row / cols] + 1e-6
                    }
                    _ => {
                        let s2 = floats("F32", &quantized[&format!("{module}.weight_scale_2")].2);
                        0.55 * s2[r] * s[0] + x.abs() / 15.0 + 1e-6
                    }
                };
                assert!((x - y).abs() <= bound, "{}: {name}[{i}]: {x} vs {y}", g.dir);
            }
        }
        assert_eq!(n_q, 7, "{}: seven quantized Linear modules", g.dir);
        let o = kquant(&[
            "diff",
            g.path().join("orig.safetensors").to_str().unwrap(),
            ck.to_str().unwrap(),
            "--json",
        ]);
        assert!(
            o.status.success(),
            "{}: {}",
            g.dir,
            String::from_utf8_lossy(&o.stderr)
        );
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        let min_sqnr = if g.scheme == "fp8-pc" { 25.0 } else { 10.0 };
        for t in j["tensors"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let module = name.strip_suffix(".weight").unwrap_or(name);
            if quantized.contains_key(&format!("{module}.weight_scale")) {
                let sq = t["sqnr_db"].as_f64().unwrap();
                assert!(sq > min_sqnr, "{}: {name}: {sq} dB", g.dir);
            } else {
                assert_eq!(t["max_abs"], 0.0, "{}: {name}", g.dir);
            }
        }
    }
}

/// kquant's own output of each scheme reads back (quantize → dequantize) to the same values
/// as the reference output (they are byte-identical, so this checks the whole path), and is
/// detected as quantized and refused as a quantize input.
#[test]
fn kquant_outputs_round_trip() {
    for g in [&PTPC, &INT4_FP8, &UINT4_G32, &FP8_DYNAMIC, &W4A8] {
        let (t, out) = g.quantize();
        let dq = t.path().join("dq");
        common::dequantize(&out, &dq, &[], g.dir);
        let j = common::inspect_json(&dq);
        assert_eq!(j["quantization"]["quantized"], false, "{}", g.dir);
        let j = common::inspect_json(&out);
        assert_eq!(j["quantization"]["quantized_modules"], 7, "{}", g.dir);
        common::assert_refused_as_input(&out, &t.path().join("again"), g.dir);
    }
}

/// The planted all-zero row 2 of q_proj in the Quark goldens: `ptpc_fp8` stores the scale
/// `bf16(2^-23)` (0x3400, f32 eps replacing a zero scale) with codes 0; `int4_fp8` stores
/// `weight_scale_2 = 2^-23` (Quark's eps floor) with codes 0; `uint4_wo_32` stores the scale
/// `bf16(2^-23)` in every group of the row. kquant writes the same bytes.
#[test]
fn planted_zero_row() {
    let m = "model.layers.0.self_attn.q_proj";
    for g in [&PTPC, &INT4_FP8, &UINT4_G32] {
        let theirs = load(&g.path().join(g.model));
        let (_t, out) = g.quantize();
        let ours = load(&out.join("model.safetensors"));
        let orig = load(&g.path().join("orig.safetensors"));
        let (_, shape, w) = &orig[&format!("{m}.weight")];
        let cols = shape[1] as usize;
        assert!(
            w[2 * cols * 2..3 * cols * 2].iter().all(|&b| b == 0),
            "row 2 is zero"
        );
        for tensors in [&theirs, &ours] {
            let (wdt, _, wq) = &tensors[&format!("{m}.weight")];
            if g.scheme == "uint4-g32" {
                let (_, shape, s) = &tensors[&format!("{m}.weight_scale")];
                let out = shape[1] as usize;
                for j in 0..shape[0] as usize {
                    let o = 2 * (j * out + 2);
                    assert_eq!(u16::from_le_bytes([s[o], s[o + 1]]), 0x3400, "group {j}");
                }
            } else if g.scheme == "fp8-pc" {
                let (_, _, s) = &tensors[&format!("{m}.weight_scale")];
                assert_eq!(u16::from_le_bytes([s[4], s[5]]), 0x3400);
                assert!(wq[2 * cols..3 * cols].iter().all(|&b| b == 0));
            } else {
                assert_eq!(wdt, "I32");
                let (_, _, s2) = &tensors[&format!("{m}.weight_scale_2")];
                assert_eq!(floats("F32", s2)[2], f32::EPSILON);
                let wpr = cols / 8 * 4;
                assert!(wq[2 * wpr..3 * wpr].iter().all(|&b| b == 0));
            }
        }
    }
}

#[test]
fn quark_flags_without_a_reference_are_refused() {
    let tiny = "fixtures/tiny/eagle3-specforge";
    for (scheme, flag) in [
        ("fp8-pc", &["--quark-layout", "file2file"][..]),
        ("fp8-pc", &["--quark-version", "0.11.1"][..]),
        ("fp8-pc", &["--quark-sequential"][..]),
        ("w4a8-fp8", &["--quark-layout", "file2file"][..]),
        ("w4a8-fp8", &["--quark-version", "0.11.1"][..]),
    ] {
        let (_t, _, err) = common::quantize_refused(tiny, &[&["--scheme", scheme], flag].concat());
        assert!(err.contains(flag[0]), "{err}");
    }
    // The pairs that have no reference at all name the formats that do.
    let (_t, _, err) = common::quantize_refused(tiny, &["--scheme", "w4a8-int8"]);
    assert!(
        err.contains("hint: --scheme w4a8-int8 is written as --format compressed-tensors"),
        "{err}"
    );
}

/// `--quark-sequential` with `w4a8-fp8` packs the INT4 stage in sequential order and says
/// `pack_method: "order"`; dequantize follows the config (no golden: UNVERIFIED against Quark).
#[test]
fn w4a8_fp8_sequential_reads_back() {
    let (t, src) = common::source(&INT4_FP8.path());
    let mut outs = Vec::new();
    for extra in [&[][..], &["--quark-sequential"][..]] {
        let out = t.path().join(format!("o{}", extra.len()));
        let mut args = vec![
            "quantize",
            &src,
            "-o",
            out.to_str().unwrap(),
            "--scheme",
            "w4a8-fp8",
        ];
        args.extend(extra);
        assert!(kquant(&args).status.success());
        let dq = t.path().join(format!("dq{}", extra.len()));
        common::dequantize(&out, &dq, &[], INT4_FP8.dir);
        outs.push((
            load(&out.join("model.safetensors")),
            load(&dq.join("model.safetensors")),
        ));
    }
    let w = "model.layers.0.mlp.down_proj.weight";
    assert_ne!(outs[0].0[w].2, outs[1].0[w].2, "different nibble order");
    assert_eq!(outs[0].1, outs[1].1, "same dequantized weights");
}
