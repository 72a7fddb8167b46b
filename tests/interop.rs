//! Interop: every (scheme, format) that kquant writes is read back by the reference library's own
//! code (compressed-tensors 0.20.0, AMD Quark 0.13, NVIDIA ModelOpt 0.47.0) and must dequantize
//! to exactly what `kquant dequantize --dtype f32` gives. The reading and the comparison are in
//! `tests/interop/check.py`, which runs once for all cases in the pinned Python venv
//! (`fixtures/gen/venv.sh`) named by `KQUANT_PYTHON`: that test is ignored unless asked for
//! (`-- --include-ignored`, as .ci/run does), and then a missing venv is a failure.
//! `every_carrier_has_a_case` always runs, so a new carrier cannot skip interop.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::root;
use kquant::quant::registry::SCHEMES;
use serde_json::json;

/// A source checkpoint: a directory used in place, or a lone `.safetensors` copied into a fresh
/// directory (the golden directories hold the reference tool's quantized config beside it).
struct Source {
    id: &'static str,
    path: &'static str,
}

/// BF16 Llama-style layer, hidden 128, intermediate 256: every input dimension is a multiple of
/// 128, so every scheme quantizes every Linear.
const LLAMA_BF16: Source = Source {
    id: "llama-bf16",
    path: "fixtures/goldens/compressed-tensors-0.20/W4A16/orig.safetensors",
};
/// The tiny SpecForge EAGLE-3 draft (`midlayer.*`, `fc` 64×192, `d2t`/`t2d`), hidden 64.
const EAGLE3_BF16: Source = Source {
    id: "eagle3-bf16",
    path: "fixtures/tiny/eagle3-specforge",
};
/// F16 Llama-style layer, hidden 64, intermediate 128.
const LLAMA_F16: Source = Source {
    id: "llama-f16",
    path: "fixtures/goldens/quark-0.13/int4_pc_float16/orig.safetensors",
};

/// In the EAGLE-3 draft only q/k/v_proj (in 128) and down_proj (in 128) fit a group of 128.
const EAGLE3_NOT_128: &str =
    "lm_head,fc,midlayer.self_attn.o_proj,midlayer.mlp.gate_proj,midlayer.mlp.up_proj";

struct Case {
    source: &'static Source,
    scheme: &'static str,
    format: &'static str,
    exclude: &'static str,
    /// Further `kquant quantize` flags (Quark layout, version, nibble order).
    flags: &'static [&'static str],
}

const fn case(
    source: &'static Source,
    scheme: &'static str,
    format: &'static str,
    exclude: &'static str,
    flags: &'static [&'static str],
) -> Case {
    Case {
        source,
        scheme,
        format,
        exclude,
        flags,
    }
}

const Q: &str = "quark";
const CT: &str = "compressed-tensors";
const MO: &str = "modelopt";
const F2F: &[&str] = &["--quark-layout", "file2file"];
const F2F_011: &[&str] = &["--quark-layout", "file2file", "--quark-version", "0.11.1"];
const V011: &[&str] = &["--quark-version", "0.11.1"];
const SEQ: &[&str] = &["--quark-sequential"];
/// Calibrated input amax for the W4A4 `nvfp4` cases: the Llama golden's (from the tools'
/// calibration), and made-up values for the EAGLE-3 draft (v_proj's differs from q/k_proj's,
/// so the fused sharing shows).
const AMAX_LLAMA: &[&str] = &[
    "--input-amax",
    "fixtures/goldens/compressed-tensors-0.20/NVFP4/input_amax.json",
];
const AMAX_EAGLE3: &[&str] = &["--input-amax", "tests/interop/eagle3_input_amax.json"];
/// ModelOpt's drafter quantizer's fixed input amax (448: `input_scale` 1.0).
const FIXED: &[&str] = &["--fixed-input-amax"];

#[rustfmt::skip]
static CASES: &[Case] = &[
    // Every implemented carrier on the source that fits every group size.
    case(&LLAMA_BF16, "int4-pc", Q, "lm_head", &[]),
    case(&LLAMA_BF16, "int4-pc", CT, "lm_head", &[]),
    case(&LLAMA_BF16, "int4-g32", Q, "lm_head", &[]),
    case(&LLAMA_BF16, "int4-g32", CT, "lm_head", &[]),
    case(&LLAMA_BF16, "int4-g64", Q, "lm_head", &[]),
    case(&LLAMA_BF16, "int4-g64", CT, "lm_head", &[]),
    case(&LLAMA_BF16, "int4-g128", Q, "lm_head", &[]),
    case(&LLAMA_BF16, "int4-g128", CT, "lm_head", &[]),
    case(&LLAMA_BF16, "int4-g128", MO, "lm_head,*embed_tokens", &[]),
    case(&LLAMA_BF16, "fp8-pc", Q, "lm_head", &[]),
    case(&LLAMA_BF16, "fp8-pc", CT, "lm_head", &[]),
    case(&LLAMA_BF16, "fp8-pc", MO, "lm_head", &[]),
    case(&LLAMA_BF16, "w4a8-fp8", Q, "lm_head", &[]),
    case(&LLAMA_BF16, "w4a8-int8", CT, "lm_head", &[]),
    case(&LLAMA_BF16, "uint4-g32", Q, "lm_head", &[]),
    case(&LLAMA_BF16, "uint4-g64", Q, "lm_head", &[]),
    case(&LLAMA_BF16, "uint4-g128", Q, "lm_head", &[]),
    case(&LLAMA_BF16, "nvfp4-a16", CT, "lm_head", &[]),
    case(&LLAMA_BF16, "nvfp4-a16", MO, "lm_head,*embed_tokens", &[]),
    case(&LLAMA_BF16, "nvfp4", CT, "lm_head", AMAX_LLAMA),
    case(&LLAMA_BF16, "nvfp4", MO, "lm_head,*embed_tokens", AMAX_LLAMA),
    case(&LLAMA_BF16, "fp8-pt", MO, "lm_head,*embed_tokens", FIXED),
    // The EAGLE-3 draft, `fc` quantized (192 inputs), with the Quark layouts and versions.
    case(&EAGLE3_BF16, "int4-pc", Q, "lm_head", &[]),
    case(&EAGLE3_BF16, "int4-pc", Q, "lm_head", SEQ),
    case(&EAGLE3_BF16, "int4-pc", Q, "lm_head", V011),
    case(&EAGLE3_BF16, "int4-pc", Q, "fc,lm_head", F2F),
    case(&EAGLE3_BF16, "int4-pc", Q, "lm_head", F2F_011),
    case(&EAGLE3_BF16, "int4-pc", CT, "lm_head", &[]),
    case(&EAGLE3_BF16, "int4-g32", Q, "lm_head", &[]),
    case(&EAGLE3_BF16, "int4-g32", Q, "lm_head", SEQ),
    case(&EAGLE3_BF16, "int4-g64", CT, "lm_head", &[]),
    case(&EAGLE3_BF16, "int4-g128", Q, EAGLE3_NOT_128, &[]),
    case(&EAGLE3_BF16, "int4-g128", CT, EAGLE3_NOT_128, &[]),
    case(&EAGLE3_BF16, "int4-g128", MO, EAGLE3_NOT_128, &[]),
    case(&EAGLE3_BF16, "fp8-pc", Q, "lm_head", &[]),
    case(&EAGLE3_BF16, "fp8-pc", CT, "lm_head", &[]),
    case(&EAGLE3_BF16, "fp8-pc", MO, "lm_head", &[]),
    case(&EAGLE3_BF16, "w4a8-fp8", Q, "lm_head", &[]),
    case(&EAGLE3_BF16, "w4a8-fp8", Q, "lm_head", SEQ),
    case(&EAGLE3_BF16, "w4a8-int8", CT, EAGLE3_NOT_128, &[]),
    case(&EAGLE3_BF16, "uint4-g32", Q, "lm_head", SEQ),
    case(&EAGLE3_BF16, "uint4-g64", Q, "lm_head", &[]),
    case(&EAGLE3_BF16, "nvfp4-a16", CT, "lm_head", &[]),
    case(&EAGLE3_BF16, "nvfp4-a16", MO, "lm_head", &[]),
    case(&EAGLE3_BF16, "nvfp4", CT, "lm_head", AMAX_EAGLE3),
    case(&EAGLE3_BF16, "nvfp4", MO, "lm_head", AMAX_EAGLE3),
    case(&EAGLE3_BF16, "fp8-pt", MO, "lm_head", AMAX_EAGLE3),
    // F16 models.
    case(&LLAMA_F16, "int4-pc", Q, "lm_head", &[]),
    case(&LLAMA_F16, "int4-pc", CT, "lm_head", &[]),
    case(&LLAMA_F16, "int4-g32", Q, "lm_head", &[]),
    case(&LLAMA_F16, "int4-g64", CT, "lm_head", &[]),
    case(&LLAMA_F16, "fp8-pc", Q, "lm_head", &[]),
    case(&LLAMA_F16, "fp8-pc", CT, "lm_head", &[]),
    case(&LLAMA_F16, "fp8-pc", MO, "lm_head", &[]),
    case(&LLAMA_F16, "w4a8-fp8", Q, "lm_head", &[]),
    case(&LLAMA_F16, "uint4-g32", Q, "lm_head", &[]),
    case(&LLAMA_F16, "nvfp4-a16", CT, "lm_head", &[]),
    case(&LLAMA_F16, "nvfp4-a16", MO, "lm_head", &[]),
];

impl Case {
    fn name(&self) -> String {
        let mut n = format!("{} {} {}", self.source.id, self.format, self.scheme);
        for f in self.flags {
            n.push(' ');
            n.push_str(f);
        }
        n
    }
}

/// Every carrier that `kquant::quant::registry::SCHEMES` marks implemented has a case, and every
/// case is an implemented carrier.
#[test]
fn every_carrier_has_a_case() {
    let mut missing = Vec::new();
    for s in SCHEMES {
        for c in s.carriers.iter().filter(|c| c.implemented()) {
            if !CASES
                .iter()
                .any(|k| k.scheme == s.id.id() && k.format == c.format.name())
            {
                missing.push(format!("{} as {}", s.id, c.format.name()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "no interop case in tests/interop.rs for: {}",
        missing.join(", ")
    );
    for k in CASES {
        let implemented = SCHEMES.iter().any(|s| {
            s.id.id() == k.scheme
                && s.carriers
                    .iter()
                    .any(|c| c.implemented() && c.format.name() == k.format)
        });
        assert!(implemented, "{}: not an implemented carrier", k.name());
    }
}

fn kquant(args: &[&str]) {
    let o = common::kquant(args);
    assert!(
        o.status.success(),
        "kquant {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The source as a path `kquant quantize` takes: a directory in place, or a lone file copied
/// into its own directory under `tmp`.
fn source_path(tmp: &Path, s: &Source) -> PathBuf {
    let p = root().join(s.path);
    if p.is_dir() {
        return p;
    }
    let d = tmp.join("src").join(s.id);
    let f = d.join(p.file_name().unwrap());
    if !f.exists() {
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(&p, &f).unwrap();
    }
    f
}

#[test]
#[ignore = "needs the interop venv: KQUANT_PYTHON=$(bash fixtures/gen/venv.sh)/bin/python (.ci/run runs this)"]
fn reference_libraries_read_kquant_outputs() {
    let python = std::env::var_os("KQUANT_PYTHON").expect(
        "KQUANT_PYTHON is not set: KQUANT_PYTHON=$(bash fixtures/gen/venv.sh)/bin/python \
         cargo test --test kquant interop:: -- --include-ignored",
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut cases = Vec::new();
    for (i, k) in CASES.iter().enumerate() {
        let src = source_path(tmp.path(), k.source);
        let out = tmp.path().join(format!("q{i:02}"));
        let deq = tmp.path().join(format!("d{i:02}"));
        let (src_s, out_s, deq_s) = (
            src.to_str().unwrap(),
            out.to_str().unwrap(),
            deq.to_str().unwrap(),
        );
        let mut args = vec![
            "quantize",
            src_s,
            "-o",
            out_s,
            "--scheme",
            k.scheme,
            "--format",
            k.format,
            "--exclude",
            k.exclude,
        ];
        args.extend_from_slice(k.flags);
        kquant(&args);
        kquant(&["dequantize", out_s, "-o", deq_s, "--dtype", "f32"]);
        cases.push(json!({
            "name": k.name(),
            "kquant_output_dir": out_s,
            "kquant_dequantized_dir": deq_s,
            "format": k.format,
            "scheme": k.scheme,
        }));
    }
    let list = tmp.path().join("cases.json");
    std::fs::write(&list, serde_json::to_vec_pretty(&cases).unwrap()).unwrap();

    // Quark JIT-compiles its C++ extension with `ninja` from the venv's bin/.
    let python = PathBuf::from(python);
    let mut path =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect::<Vec<_>>();
    if let Some(bin) = python.parent() {
        path.insert(0, bin.to_path_buf());
    }
    let o = Command::new(&python)
        .current_dir(root())
        .arg(root().join("tests/interop/check.py"))
        .arg(&list)
        .env("PATH", std::env::join_paths(path).unwrap())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&o.stdout);
    println!("{stdout}");
    let last = stdout.lines().last().unwrap_or("");
    assert!(
        o.status.success() && last == format!("{} passed, 0 failed", cases.len()),
        "tests/interop/check.py failed ({}):\n{stdout}\n--- stderr (tail) ---\n{}",
        o.status,
        tail(&String::from_utf8_lossy(&o.stderr), 60)
    );
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
