//! `kquant quantize --scheme fp8-pt --format modelopt --fixed-input-amax` against ModelOpt's own
//! calibration-free drafter quantizer (`quantize_drafter.py --qformat fp8`, Model-Optimizer PR
//! #2027 on nvidia-modelopt 0.47.0; fixtures/gen/modelopt_drafter/).
//!
//! - Every bundled tiny draft against the goldens the script wrote
//!   (fixtures/goldens/modelopt-0.47/quantize_drafter/, made by make_golden.py there):
//!   `hf_quant_config.json` byte for byte, `config.json` equal as JSON, every tensor's dtype,
//!   shape and bytes (SHA-256) equal — but EAGLE-3's `d2t` (int64) and `t2d` (bool), which the
//!   script casts to BF16 with everything else (lossy: `d2t` offsets above 256) and kquant keeps
//!   byte for byte from the source.
//! - With the fixture venv (`KQUANT_PYTHON`, ignored otherwise): the script is run afresh on each
//!   draft and compared by tests/interop/modelopt_drafter.py, which also reads kquant's output
//!   back through ModelOpt's `FP8QTensor` / `to_quantized_weight`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{kquant, load, read_json, root};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// (golden case, draft under fixtures/, kquant's `--exclude`: the script's defaults, lm_head,
/// `*embed_tokens*`, `*markov_head*`, `*confidence_head*`, where the draft has them).
const CASES: [(&str, &str, &str); 7] = [
    ("eagle3", "kimi-k2.5-tiny/eagle3", "lm_head"),
    ("eagle3-mla", "kimi-k2.5-tiny/eagle3-mla", "lm_head"),
    ("dflash", "kimi-k2.5-tiny/dflash", "lm_head"),
    ("dflash2", "kimi-k2.5-tiny/dflash2", "lm_head"),
    (
        "dspark",
        "kimi-k2.5-tiny/dspark",
        "lm_head,*markov_head*,*confidence_head*",
    ),
    (
        "k3-dspark",
        "kimi-k2.5-tiny/k3-dspark",
        "lm_head,*markov_head*,*confidence_head*",
    ),
    ("kimi-linear-dflash", "kimi-linear-tiny/dflash", "lm_head"),
];

/// The source's non-float tensors the script casts to BF16 and kquant keeps.
const KEPT_AS_SOURCE: [&str; 2] = ["d2t", "t2d"];

/// `kquant quantize SRC -o OUT --scheme fp8-pt --format modelopt` and `extra`.
fn fp8_pt(src: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let (src, out) = (src.to_str().unwrap(), out.to_str().unwrap());
    let base = [
        "quantize", src, "-o", out, "--scheme", "fp8-pt", "--format", "modelopt",
    ];
    kquant(&[&base[..], extra].concat())
}

fn quantize(t: &Path, draft: &str, exclude: &str) -> PathBuf {
    let out = t.join(draft.replace('/', "-"));
    let src = root().join("fixtures").join(draft);
    let o = fp8_pt(&src, &out, &["--fixed-input-amax", "--exclude", exclude]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    out
}

#[test]
fn fp8_pt_fixed_is_modelopt_drafter_quantizer_byte_for_byte() {
    let t = tempfile::tempdir().unwrap();
    for (case, draft, exclude) in CASES {
        let golden = root()
            .join("fixtures/goldens/modelopt-0.47/quantize_drafter")
            .join(case);
        let out = quantize(t.path(), draft, exclude);
        assert_eq!(
            String::from_utf8(std::fs::read(out.join("hf_quant_config.json")).unwrap()).unwrap(),
            String::from_utf8(std::fs::read(golden.join("hf_quant_config.json")).unwrap()).unwrap(),
            "{case}: hf_quant_config.json"
        );
        assert_eq!(
            read_json(&out.join("config.json")),
            read_json(&golden.join("config.json")),
            "{case}: config.json"
        );
        let want = read_json(&golden.join("tensors.json"));
        let want = want.as_object().unwrap();
        let got = load(&out.join("model.safetensors"));
        let source = load(
            &root()
                .join("fixtures")
                .join(draft)
                .join("model.safetensors"),
        );
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{case}: tensor names"
        );
        let mut quantized = 0;
        for (name, (dtype, shape, bytes)) in &got {
            if KEPT_AS_SOURCE.contains(&name.as_str()) {
                let (sd, ss, sb) = &source[name];
                assert!(
                    (dtype, shape, bytes) == (sd, ss, sb),
                    "{case} {name}: kept as the source"
                );
                assert_eq!(
                    want[name]["dtype"], "BF16",
                    "{case} {name}: the script's cast"
                );
                continue;
            }
            let w = &want[name];
            assert_eq!(w["dtype"], dtype.as_str(), "{case} {name}");
            let ws: Vec<u64> = w["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(&ws, shape, "{case} {name}");
            let digest = format!("{:x}", Sha256::digest(bytes));
            assert_eq!(w["sha256"], Value::from(digest), "{case} {name}: bytes");
            quantized += usize::from(name.ends_with(".input_scale"));
        }
        assert!(quantized >= 8, "{case}: {quantized} modules quantized");
    }
}

/// A calibrated `--input-amax` gives each module its own `input_scale` (`amax / 448` in F32);
/// the scheme refuses to run without either source, and `--fixed-input-amax` conflicts with a
/// file.
#[test]
fn fp8_pt_input_scale_from_the_amax_file_or_refused() {
    let t = tempfile::tempdir().unwrap();
    let src = root().join("fixtures/kimi-k2.5-tiny/eagle3");
    let amax = t.path().join("amax.json");
    // Every 2-D weight but lm_head: the modules `--exclude lm_head` quantizes.
    let mods: Vec<String> = load(&src.join("model.safetensors"))
        .into_iter()
        .filter(|(n, (_, shape, _))| shape.len() == 2 && n != "lm_head.weight")
        .filter_map(|(n, _)| n.strip_suffix(".weight").map(str::to_string))
        .collect();
    assert_eq!(mods.len(), 8);
    let map: serde_json::Map<String, Value> = mods
        .iter()
        .enumerate()
        .map(|(i, m)| (m.clone(), Value::from(3.5 + i as f64)))
        .collect();
    std::fs::write(&amax, serde_json::to_vec(&Value::Object(map)).unwrap()).unwrap();
    let out = t.path().join("q");
    let o = fp8_pt(
        &src,
        &out,
        &[
            "--exclude",
            "lm_head",
            "--input-amax",
            amax.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let got = load(&out.join("model.safetensors"));
    for (i, m) in mods.iter().enumerate() {
        let b = &got[&format!("{m}.input_scale")].2;
        let s = f32::from_le_bytes(b[..4].try_into().unwrap());
        assert_eq!(s, (3.5 + i as f32) / 448.0, "{m}");
    }
    let refused = t.path().join("refused");
    let o = fp8_pt(&src, &refused, &["--exclude", "lm_head"]);
    assert_eq!(o.status.code(), Some(2));
    let err = common::stderr(&o);
    assert!(
        err.contains("error:") && err.contains("--fixed-input-amax"),
        "{err}"
    );
    let both = ["--fixed-input-amax", "--input-amax", amax.to_str().unwrap()];
    let o = fp8_pt(&src, &refused, &both);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
}

#[test]
#[ignore = "needs the fixture venv: KQUANT_PYTHON=$(bash fixtures/gen/venv.sh)/bin/python"]
fn modelopt_drafter_quantizer_run_afresh_and_read_back() {
    let python = std::env::var_os("KQUANT_PYTHON").expect("KQUANT_PYTHON is not set");
    let t = tempfile::tempdir().unwrap();
    for (case, draft, exclude) in CASES {
        let kq = quantize(t.path(), draft, exclude);
        let reference = t.path().join(format!("{case}-modelopt"));
        let mut cmd = Command::new(&python);
        cmd.arg(root().join("fixtures/gen/modelopt_drafter/quantize_drafter.py"))
            .args([
                "--drafter_path",
                root().join("fixtures").join(draft).to_str().unwrap(),
            ])
            .args([
                "--qformat",
                "fp8",
                "--export_path",
                reference.to_str().unwrap(),
            ]);
        if case == "dflash2" {
            cmd.args(["--exclude", "*candidate_selector*"]);
        }
        let o = cmd.output().unwrap();
        assert!(
            o.status.success(),
            "{case}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let o = Command::new(&python)
            .arg(root().join("tests/interop/modelopt_drafter.py"))
            .arg(root().join("fixtures").join(draft))
            .arg(&reference)
            .arg(&kq)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        println!("{case}: {out}");
        assert!(o.status.success(), "{case}: {out}");
        let v: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert!(v["modules_read_back"].as_u64().unwrap() >= 8, "{case}: {v}");
    }
}
