//! `kquant quantize --scheme nvfp4-a16|nvfp4` against the reference tools' own NVFP4 outputs,
//! made on CPU from one tiny BF16 Llama with a planted q_proj row (every E2M1 tie, a zero
//! block, a block scale below FP8's smallest subnormal):
//!
//! - compressed-tensors 0.20.0 `NVFP4A16` / `NVFP4` (fixtures/goldens/compressed-tensors-0.20/,
//!   fixtures/gen/goldens/make_ct_nvfp4_golden.py: llm-compressor 0.14's observer arithmetic
//!   with compressed-tensors' functions, then its `ModelCompressor`);
//! - nvidia-modelopt 0.47.0 `W4A16_NVFP4_CFG` / `NVFP4_DEFAULT_CFG`
//!   (fixtures/goldens/modelopt-0.47/{W4A16_NVFP4_CFG,NVFP4_planted},
//!   make_modelopt_nvfp4_golden.py: `mtq.quantize` + `export_hf_checkpoint`).
//!
//! Every tensor byte for byte (the W4A4 ones with the goldens' `input_amax.json`), both configs
//! (ModelOpt's `hf_quant_config.json` byte for byte); the fused-sibling scale sharing; the
//! refusals; and the goldens read back by `kquant dequantize` / `diff` / `inspect`.

use crate::common;

use std::path::PathBuf;

use common::{kquant, load, read_json, Tensors};
use serde_json::{json, Value};

const CT: &str = "compressed-tensors-0.20";
const MO: &str = "modelopt-0.47";
const L: &str = "model.layers.0.";
const MODULES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

fn golden(tool: &str, name: &str) -> PathBuf {
    common::golden(tool).join(name)
}

/// The planted source (identical in every NVFP4 golden; shipped in the weight-only dirs).
fn source() -> (tempfile::TempDir, String) {
    common::source(&golden(CT, "NVFP4A16"))
}

fn f32s(t: &(String, Vec<u64>, Vec<u8>)) -> Vec<f32> {
    common::floats(&t.0, &t.2)
}

/// E4M3 (`float8_e4m3fn`) byte → value, written out here independently of kquant.
fn e4m3(b: u8) -> f32 {
    let (s, e, m) = ((b >> 7) & 1, ((b >> 3) & 0xf) as i32, (b & 7) as f32);
    let v = if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    if s == 1 {
        -v
    } else {
        v
    }
}

/// E2M1 nibble → value, as each tool reads it: compressed-tensors' `unpack_fp4_from_uint8`
/// multiplies by −1 (code 8 is −0), ModelOpt's `e2m1_values` table has +0 at code 8.
fn e2m1(n: u8, modelopt: bool) -> f32 {
    let v = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(n & 7) as usize];
    match (n & 8 != 0, modelopt) {
        (true, true) if v == 0.0 => 0.0,
        (true, _) => -v,
        (false, _) => v,
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Run `kquant quantize` (must succeed, without a warning: NVFP4 loads on NVIDIA GPUs).
fn quantize(src: &str, args: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let (t, out, err) = common::quantize(src, args);
    assert!(!err.contains("warning: no"), "{err}");
    (t, out)
}

fn ct_args<'a>(scheme: &'a str, amax: Option<&'a str>) -> Vec<&'a str> {
    let mut v = vec![
        "--scheme",
        scheme,
        "--format",
        "compressed-tensors",
        "--exclude",
        "lm_head",
    ];
    if let Some(a) = amax {
        v.extend(["--input-amax", a]);
    }
    v
}

fn mo_args<'a>(scheme: &'a str, amax: Option<&'a str>) -> Vec<&'a str> {
    let mut v = vec![
        "--scheme",
        scheme,
        "--format",
        "modelopt",
        "--exclude",
        "lm_head,*embed_tokens",
    ];
    if let Some(a) = amax {
        v.extend(["--input-amax", a]);
    }
    v
}

fn check_ct(name: &str, scheme: &str) {
    let g = golden(CT, name);
    let amax = g.join("input_amax.json");
    let amax = amax.exists().then(|| amax.to_str().unwrap().to_string());
    let (_s, src) = source();
    let (_t, out) = quantize(&src, &ct_args(scheme, amax.as_deref()));
    let ours = load(&out.join("model.safetensors"));
    common::assert_tensors_match(name, &ours, &load(&g.join("model.safetensors")), |_| true);
    common::assert_config_matches(
        name,
        &out.join("config.json"),
        &g.join("config.json"),
        "ignore",
    );
}

fn check_mo(name: &str, scheme: &str) {
    let g = golden(MO, name);
    let amax = g.join("input_amax.json");
    let amax = amax.exists().then(|| amax.to_str().unwrap().to_string());
    let (_s, src) = source();
    let (_t, out) = quantize(&src, &mo_args(scheme, amax.as_deref()));
    let ours = load(&out.join("model.safetensors"));
    let theirs = load(&g.join("export_model.safetensors"));
    common::assert_tensors_match(name, &ours, &theirs, |_| true);
    assert_eq!(
        String::from_utf8(std::fs::read(out.join("hf_quant_config.json")).unwrap()).unwrap(),
        String::from_utf8(std::fs::read(g.join("hf_quant_config.json")).unwrap()).unwrap(),
        "{name}: hf_quant_config.json"
    );
    assert_eq!(
        read_json(&out.join("config.json"))["quantization_config"],
        read_json(&g.join("export_config.json"))["quantization_config"],
        "{name}: quantization_config"
    );
}

#[test]
fn ct_nvfp4a16_is_byte_exact() {
    check_ct("NVFP4A16", "nvfp4-a16");
}

#[test]
fn ct_nvfp4_w4a4_is_byte_exact() {
    check_ct("NVFP4", "nvfp4");
}

#[test]
fn modelopt_w4a16_nvfp4_is_byte_exact() {
    check_mo("W4A16_NVFP4_CFG", "nvfp4-a16");
}

#[test]
fn modelopt_nvfp4_w4a4_is_byte_exact() {
    check_mo("NVFP4_planted", "nvfp4");
}

/// The planted row, where the two tools differ: a zero block gets scale 0.125 (compressed-
/// tensors' FP8 eps) or 1.0 (ModelOpt); a block scale below half of 2^-9 rounds to 0 → 0.125,
/// or is clamped to 2^-9. The first block hits every tie (codes `f7 20 42 64 86 aa cc ee`).
#[test]
fn planted_row_differs_between_the_tools_as_recorded() {
    let ct = read_json(&golden(CT, "NVFP4A16").join("summary.json"));
    let mo = read_json(&golden(MO, "W4A16_NVFP4_CFG").join("summary.json"));
    assert_eq!(ct["q_proj_row0"]["weight_global_scale"], json!([512.0]));
    assert_eq!(mo["q_proj_row0"]["weight_scale_2"], json!(1.0 / 512.0));
    let cs = &ct["q_proj_row0"]["weight_scale"];
    let ms = &mo["q_proj_row0"]["weight_scale"];
    assert_eq!((&cs[0], &ms[0]), (&json!(256.0), &json!(256.0)));
    assert_eq!((&cs[2], &ms[2]), (&json!(0.125), &json!(1.0)));
    assert_eq!((&cs[3], &ms[3]), (&json!(0.125), &json!(0.001953125)));
    let (_s, src) = source();
    for (args, key) in [
        (ct_args("nvfp4-a16", None), "weight_packed"),
        (mo_args("nvfp4-a16", None), "weight"),
    ] {
        let (_t, out) = quantize(&src, &args);
        let ours = load(&out.join("model.safetensors"));
        let row0 = &ours[&format!("{L}self_attn.q_proj.{key}")].2[..8];
        assert_eq!(row0, [0xf7, 0x20, 0x42, 0x64, 0x86, 0xaa, 0xcc, 0xee]);
    }
}

/// q/k/v and gate/up carry one per-tensor scale, from the largest amax of the family: q_proj
/// holds the planted 5.25, k/v only their random weights, so without sharing k and v would get
/// other scales. The goldens hold the shared ones; so does kquant, in both formats.
#[test]
fn fused_siblings_share_the_per_tensor_scale() {
    let src_t = load(&golden(CT, "NVFP4A16").join("orig.safetensors"));
    let amax = |m: &str| {
        f32s(&src_t[&format!("{L}{m}.weight")])
            .iter()
            .fold(0f32, |a, x| a.max(x.abs()))
    };
    assert_eq!(amax("self_attn.q_proj"), 5.25);
    assert!(amax("self_attn.k_proj") < 1.0 && amax("self_attn.v_proj") < 1.0);
    assert_ne!(amax("mlp.gate_proj"), amax("mlp.up_proj"));
    let gate_up = amax("mlp.gate_proj").max(amax("mlp.up_proj"));

    let (_s, src) = source();
    let (_t, out) = quantize(&src, &mo_args("nvfp4-a16", None));
    let ours = load(&out.join("model.safetensors"));
    let ws2 = |m: &str| f32s(&ours[&format!("{L}{m}.weight_scale_2")])[0];
    for m in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"] {
        assert_eq!(ws2(m), 5.25 / 2688.0, "{m}");
    }
    for m in ["mlp.gate_proj", "mlp.up_proj"] {
        assert_eq!(ws2(m), gate_up / 2688.0, "{m}");
    }
    assert_eq!(ws2("self_attn.o_proj"), amax("self_attn.o_proj") / 2688.0);

    let (_t, out) = quantize(&src, &ct_args("nvfp4-a16", None));
    let ours = load(&out.join("model.safetensors"));
    let g = |m: &str| f32s(&ours[&format!("{L}{m}.weight_global_scale")])[0];
    for m in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"] {
        assert_eq!(g(m), 512.0, "{m}");
    }
    assert_eq!(g("mlp.gate_proj"), g("mlp.up_proj"));
    assert_ne!(g("mlp.down_proj"), g("mlp.up_proj"));

    // The EAGLE-3 draft's midlayer too, in either format.
    for args in [ct_args("nvfp4-a16", None), mo_args("nvfp4-a16", None)] {
        let (_t, out) = quantize("fixtures/tiny/eagle3-specforge", &args);
        let ours = load(&out.join("model.safetensors"));
        let key = if args.contains(&"modelopt") {
            "weight_scale_2"
        } else {
            "weight_global_scale"
        };
        let v: Vec<f32> = ["q_proj", "k_proj", "v_proj"]
            .iter()
            .map(|p| f32s(&ours[&format!("midlayer.self_attn.{p}.{key}")])[0])
            .collect();
        assert!(v[0] == v[1] && v[1] == v[2], "{v:?}");
    }
}

/// Input amax: the W4A4 input scales follow each tool's formula, shared across fused siblings
/// (max) when a calibration file gives them different values.
#[test]
fn input_scales_follow_each_tool_and_are_shared() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("amax.json");
    let mut amax = serde_json::Map::new();
    for (m, a) in MODULES.iter().zip([1.5, 3.25, 2.0, 0.5, 0.75, 1.0, 0.125]) {
        amax.insert(format!("{L}{m}"), json!(a));
    }
    std::fs::write(
        &f,
        serde_json::to_vec(&json!({"schema": "kquant.input-amax/1", "amax": amax})).unwrap(),
    )
    .unwrap();
    let (_s, src) = source();
    let fa = f.to_str().unwrap();
    let (_t, out) = quantize(&src, &mo_args("nvfp4", Some(fa)));
    let ours = load(&out.join("model.safetensors"));
    let is = |m: &str| f32s(&ours[&format!("{L}{m}.input_scale")])[0];
    for m in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"] {
        assert_eq!(is(m), 3.25f32 / 2688.0, "{m}");
    }
    assert_eq!(is("mlp.gate_proj"), 1.0f32 / 2688.0);
    assert_eq!(is("mlp.down_proj"), 0.125f32 / 2688.0);
    let (_t, out) = quantize(&src, &ct_args("nvfp4", Some(fa)));
    let ours = load(&out.join("model.safetensors"));
    let ig = |m: &str| f32s(&ours[&format!("{L}{m}.input_global_scale")])[0];
    // generate_gparam's `2688.0 / amax` on a BF16 tensor: bf16(bf16(1 / amax) · 2688).
    let bf16 = |x: f32| half::bf16::from_f32(x).to_f32();
    let g = |a: f32| bf16(bf16(1.0 / a) * 2688.0);
    for m in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"] {
        assert_eq!(ig(m), g(3.25), "{m}");
    }
    assert_eq!(ig("self_attn.o_proj"), g(0.5));
    assert_eq!(ig("mlp.down_proj"), g(0.125));
}

/// Refusals (exit 2, nothing written): W4A4 without an input amax file, a file lacking a
/// module, an input amax file with a weight-only scheme, a partly excluded fused family.
#[test]
fn refusals() {
    let (_s, src) = source();
    for fmt in ["compressed-tensors", "modelopt"] {
        let (_t, out, err) =
            common::quantize_refused(&src, &["--scheme", "nvfp4", "--format", fmt]);
        assert!(
            err.contains("input amax")
                && err.contains("hint:")
                && err.contains("nvfp4-a16")
                && err.contains("--input-amax"),
            "{err}"
        );
        assert!(!out.exists());
    }
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("amax.json");
    std::fs::write(&f, br#"{"model.layers.0.self_attn.q_proj": 1.0}"#).unwrap();
    let (_t, out, err) = common::quantize_refused(
        &src,
        &[
            "--scheme",
            "nvfp4",
            "--format",
            "modelopt",
            "--input-amax",
            f.to_str().unwrap(),
            "--dry-run",
        ],
    );
    assert!(
        err.contains("no input amax for 6 quantized module(s)")
            && err.contains("`model.layers.0.self_attn.k_proj`"),
        "{err}"
    );
    assert!(!out.exists());
    let (_t, _, err) = common::quantize_refused(
        &src,
        &[
            "--scheme",
            "nvfp4-a16",
            "--format",
            "modelopt",
            "--input-amax",
            f.to_str().unwrap(),
        ],
    );
    assert!(
        err.contains("--scheme nvfp4-a16 has no static input scale")
            && err
                .contains("applies to the schemes with a static input scale (nvfp4, fp8-pt) only"),
        "{err}"
    );
    for fmt in ["compressed-tensors", "modelopt"] {
        let (_t, out, err) = common::quantize_refused(
            &src,
            &[
                "--scheme",
                "nvfp4-a16",
                "--format",
                fmt,
                "--exclude",
                "lm_head,*k_proj",
            ],
        );
        assert!(
            err.contains("fused sibling")
                && err.contains("model.layers.0.self_attn.k_proj")
                && err.contains("exclude all of"),
            "{err}"
        );
        assert!(!out.exists());
    }
    // Excluding the whole family is fine.
    quantize(
        &src,
        &[
            "--scheme",
            "nvfp4-a16",
            "--format",
            "modelopt",
            "--exclude",
            "lm_head,*embed_tokens,*_proj",
        ],
    );
    // Quark has no NVFP4 writer in kquant.
    let (_t, _, err) =
        common::quantize_refused(&src, &["--scheme", "nvfp4-a16", "--format", "quark"]);
    assert!(
        err.contains(
            "hint: --scheme nvfp4-a16 is written as --format compressed-tensors or --format modelopt"
        ),
        "{err}"
    );
}

/// Each golden read back by `kquant dequantize --dtype f32`: equal to an independent decoding
/// of its tensors (ModelOpt `e2m1 · (f8(s) · ws2)`, compressed-tensors `e2m1 · (f8(s) / g)`)
/// and within one effective block scale of the source (`MAX_ERR_STEPS`); `kquant diff` and
/// `inspect` read them too.
#[test]
fn goldens_read_back() {
    const MAX_ERR_STEPS: f32 = 1.0;
    const MIN_SQNR_DB: f64 = 19.0;
    let src = load(&golden(CT, "NVFP4A16").join("orig.safetensors"));
    let t = tempfile::tempdir().unwrap();
    for (tool, name, model, config, method) in [
        (
            CT,
            "NVFP4A16",
            "model.safetensors",
            "config.json",
            "compressed-tensors",
        ),
        (
            CT,
            "NVFP4",
            "model.safetensors",
            "config.json",
            "compressed-tensors",
        ),
        (
            MO,
            "W4A16_NVFP4_CFG",
            "export_model.safetensors",
            "export_config.json",
            "modelopt",
        ),
        (
            MO,
            "NVFP4_planted",
            "export_model.safetensors",
            "export_config.json",
            "modelopt",
        ),
    ] {
        let g = golden(tool, name);
        let dir = common::golden_checkpoint(t.path(), &g, model, config);
        let q = load(&g.join(model));
        let out = t.path().join(format!("dq-{name}"));
        common::dequantize(&dir, &out, &["--dtype", "f32"], name);
        let dq = load(&out.join("model.safetensors"));
        assert_eq!(
            dq.keys().collect::<Vec<_>>(),
            src.keys().collect::<Vec<_>>(),
            "{name}"
        );
        for m in MODULES {
            let module = format!("{L}{m}");
            let d = f32s(&dq[&format!("{module}.weight")]);
            let (want, eff, cols) = decode(&q, &module, tool == MO);
            assert_eq!(
                bits(&d),
                bits(&want),
                "{name} {module}: kquant vs independent decoding"
            );
            let w = f32s(&src[&format!("{module}.weight")]);
            for i in 0..w.len() {
                let step = eff[(i / cols) * (cols / 16) + (i % cols) / 16];
                assert!(
                    (w[i] - d[i]).abs() <= MAX_ERR_STEPS * step,
                    "{name} {module} {i}"
                );
            }
        }
        let orig = golden(CT, "NVFP4A16").join("orig.safetensors");
        let o = kquant(&[
            "diff",
            orig.to_str().unwrap(),
            dir.to_str().unwrap(),
            "--json",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            (&j["only_in_a"], &j["only_in_b"]),
            (&json!([]), &json!([])),
            "{name}"
        );
        for r in j["tensors"].as_array().unwrap() {
            if r["name"].as_str().unwrap().ends_with("_proj.weight") {
                assert!(r["sqnr_db"].as_f64().unwrap() > MIN_SQNR_DB, "{name} {r}");
            }
        }
        let i = common::inspect_json(&dir);
        assert_eq!(i["quantization"]["method"], method, "{name}");
    }
}

/// The f32 weights, effective block scales and input dimension of one module, decoded here.
fn decode(q: &Tensors, module: &str, modelopt: bool) -> (Vec<f32>, Vec<f32>, usize) {
    let (packed, global) = if modelopt {
        (
            &q[&format!("{module}.weight")],
            f32s(&q[&format!("{module}.weight_scale_2")])[0],
        )
    } else {
        (
            &q[&format!("{module}.weight_packed")],
            f32s(&q[&format!("{module}.weight_global_scale")])[0],
        )
    };
    let scales = &q[&format!("{module}.weight_scale")];
    assert_eq!(scales.0, "F8_E4M3");
    let eff: Vec<f32> = scales
        .2
        .iter()
        .map(|&b| {
            if modelopt {
                e4m3(b) * global
            } else {
                e4m3(b) / global
            }
        })
        .collect();
    let cols = packed.1[1] as usize * 2;
    let w = packed
        .2
        .iter()
        .flat_map(|&b| [b & 0xf, b >> 4])
        .enumerate()
        .map(|(i, n)| e2m1(n, modelopt) * eff[(i / cols) * (cols / 16) + (i % cols) / 16])
        .collect();
    (w, eff, cols)
}

/// `--dry-run --json` plans exactly the goldens' tensor bytes.
#[test]
fn dry_run_sizes_equal_the_goldens() {
    let (_s, src) = source();
    for (tool, name, model, args) in [
        (
            CT,
            "NVFP4A16",
            "model.safetensors",
            ct_args("nvfp4-a16", None),
        ),
        (
            MO,
            "W4A16_NVFP4_CFG",
            "export_model.safetensors",
            mo_args("nvfp4-a16", None),
        ),
    ] {
        let j = common::quantize_dry_run(&src, &args);
        let want = common::data_bytes(&golden(tool, name).join(model));
        assert_eq!(j["bytes_after"], want, "{name}");
    }
}

/// kquant's NVFP4 output of the EAGLE-3 draft (`fc` excluded, as the seed recipe): detected
/// by `inspect`, refused as input, verified by `verify-files`.
#[test]
fn eagle3_output_is_detected_and_refused_as_input() {
    for fmt in ["compressed-tensors", "modelopt"] {
        let (_t, out) = quantize(
            "fixtures/tiny/eagle3-specforge",
            &[
                "--scheme",
                "nvfp4-a16",
                "--format",
                fmt,
                "--exclude",
                "fc,lm_head",
            ],
        );
        common::assert_detected(&out, fmt);
        common::assert_refused_as_input(&out, &out.with_extension("again"), fmt);
        common::assert_verifies(&out);
    }
}
