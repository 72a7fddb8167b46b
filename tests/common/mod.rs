//! Helpers the integration tests share (`tests/main.rs` declares `mod common;`): running the binary, reading
//! safetensors files without kquant's own reader, copying a golden's files into a temporary
//! directory, and comparing kquant's output with a reference tool's.

// Not every helper is used by every build (features).
#![allow(dead_code)]

pub mod engines_http;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The repository root (tests run the binary from there, with relative fixture paths).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A directory under `fixtures/goldens/` (e.g. `quark-0.13/int4_pc_bf16`).
pub fn golden(rel: &str) -> PathBuf {
    root().join("fixtures/goldens").join(rel)
}

/// The `kquant` binary as a command run from the repository root, for a test to add arguments,
/// environment or another working directory to.
pub fn kquant_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kquant"));
    c.current_dir(root());
    c
}

/// Run `kquant ARGS…` from the repository root.
pub fn kquant(args: &[&str]) -> Output {
    kquant_cmd().args(args).output().unwrap()
}

/// A command's standard error, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run `kquant ARGS…`, require exit 0 (stderr shown otherwise), and parse stdout as JSON.
pub fn kquant_json(args: &[&str]) -> Value {
    let o = kquant(args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `kquant inspect DIR --json`, parsed.
pub fn inspect_json(dir: &Path) -> Value {
    serde_json::from_slice(&kquant(&["inspect", dir.to_str().unwrap(), "--json"]).stdout).unwrap()
}

/// `block_draft.problems[].what` of an `inspect --json` document, joined with ` | `.
pub fn block_problems(j: &Value) -> String {
    j["block_draft"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["what"].as_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// The `*.json` files of repository directory `rel` are exactly the entries of `builtin`, a
/// built-in `(name, JSON text)` table (presets, target profiles): named `NAME.json` each. Returns
/// the names, sorted.
pub fn assert_files_are_builtin(rel: &str, builtin: &[(&str, &str)]) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root().join(rel))
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.strip_suffix(".json").map(String::from)
        })
        .collect();
    files.sort();
    let mut names: Vec<String> = builtin.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    assert_eq!(
        files, names,
        "{rel}/*.json and the built-in table must list the same names"
    );
    names
}

/// A JSON file, parsed.
pub fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// A safetensors file's tensors: name → (dtype, shape, data bytes), `__metadata__` left out.
pub type Tensors = BTreeMap<String, (String, Vec<u64>, Vec<u8>)>;

/// Read a safetensors file by its format alone (not with kquant's reader).
pub fn load(p: &Path) -> Tensors {
    let b = std::fs::read(p).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Map<String, Value> = serde_json::from_slice(&b[8..8 + n]).unwrap();
    h.into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let o = v["data_offsets"].as_array().unwrap();
            let (s, e) = (
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
            );
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            (
                k,
                (
                    v["dtype"].as_str().unwrap().to_string(),
                    shape,
                    b[8 + n + s..8 + n + e].to_vec(),
                ),
            )
        })
        .collect()
}

/// Write a safetensors file from its header JSON and data bytes.
pub fn write_safetensors(p: &Path, header: &[u8], data: impl IntoIterator<Item = u8>) {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.extend(data);
    std::fs::write(p, b).unwrap();
}

/// F32 or BF16 data as f32 values.
pub fn floats(dtype: &str, b: &[u8]) -> Vec<f32> {
    match dtype {
        "F32" => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "BF16" => b
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect(),
        d => panic!("{d}"),
    }
}

/// A golden's source weights (`orig.safetensors`), alone in a temporary directory: the golden
/// directory's config is the *quantized* one, which would make the source look quantized.
pub fn source(golden_dir: &Path) -> (tempfile::TempDir, String) {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("orig.safetensors");
    std::fs::copy(golden_dir.join("orig.safetensors"), &p).unwrap();
    let s = p.to_str().unwrap().to_string();
    (t, s)
}

/// A checkpoint directory under `t` made of a golden's export: `model` as `model.safetensors`,
/// `config` as `config.json`, and `hf_quant_config.json` where the golden has one (ModelOpt).
pub fn golden_checkpoint(t: &Path, golden_dir: &Path, model: &str, config: &str) -> PathBuf {
    let name = golden_dir.strip_prefix(golden("")).unwrap_or(golden_dir);
    let d = t.join(name.to_str().unwrap().replace('/', "_"));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(golden_dir.join(model), d.join("model.safetensors")).unwrap();
    std::fs::copy(golden_dir.join(config), d.join("config.json")).unwrap();
    let hf = golden_dir.join("hf_quant_config.json");
    if hf.exists() {
        std::fs::copy(hf, d.join("hf_quant_config.json")).unwrap();
    }
    d
}

/// `kquant quantize SRC -o <temporary>/out ARGS…`, which must succeed: the temporary directory
/// (keep it alive), the output directory and the standard error (for the warning checks).
pub fn quantize(src: &str, args: &[&str]) -> (tempfile::TempDir, PathBuf, String) {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let mut all = vec!["quantize", src, "-o", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = kquant(&all);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (t, out, err)
}

/// `kquant quantize SRC -o <temporary>/out ARGS…`, which must be refused (exit 2): the
/// temporary directory, the output directory (for "nothing written" checks) and the standard
/// error.
pub fn quantize_refused(src: &str, args: &[&str]) -> (tempfile::TempDir, PathBuf, String) {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let mut all = vec!["quantize", src, "-o", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = kquant(&all);
    assert_eq!(o.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (t, out, err)
}

/// `kquant quantize SRC -o <temporary>/o --dry-run --json ARGS…`, which must succeed and write
/// nothing: the plan it prints.
pub fn quantize_dry_run(src: &str, args: &[&str]) -> Value {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let mut all = vec![
        "quantize",
        src,
        "-o",
        out.to_str().unwrap(),
        "--dry-run",
        "--json",
    ];
    all.extend_from_slice(args);
    let plan = kquant_json(&all);
    assert!(!out.exists(), "a dry run wrote {}", out.display());
    plan
}

/// The bytes of a safetensors file's tensor data (what a plan's `bytes_after` counts).
pub fn data_bytes(p: &Path) -> u64 {
    load(p).values().map(|(_, _, d)| d.len() as u64).sum()
}

/// `kquant dequantize DIR -o OUT ARGS…`, which must succeed.
pub fn dequantize(dir: &Path, out: &Path, args: &[&str], label: &str) {
    let mut all = vec![
        "dequantize",
        dir.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let o = kquant(&all);
    assert!(
        o.status.success(),
        "{label}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `inspect` sees kquant's quantized EAGLE-3 output (seven quantized Linear modules) as `method`
/// and still as the same draft; its JSON, for further checks.
pub fn assert_detected(out: &Path, method: &str) -> Value {
    let j = inspect_json(out);
    assert_eq!(j["quantization"]["method"], method);
    assert_eq!(j["quantization"]["quantized_modules"], 7);
    assert_eq!(j["family"], "eagle3", "still detected as the same draft");
    j
}

/// A quantized output given to `quantize` again is refused (exit 2, "already quantized").
pub fn assert_refused_as_input(out: &Path, again: &Path, label: &str) {
    let o = kquant(&[
        "quantize",
        out.to_str().unwrap(),
        "-o",
        again.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{label}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("already quantized"));
}

/// `kquant verify-files DIR` succeeds.
pub fn assert_verifies(out: &Path) {
    assert!(kquant(&["verify-files", out.to_str().unwrap()])
        .status
        .success());
}

/// Ours and theirs hold the same tensor names, each with the same dtype and shape, and the same
/// bytes where `bytes(name)`.
pub fn assert_tensors_match(
    label: &str,
    ours: &Tensors,
    theirs: &Tensors,
    bytes: impl Fn(&str) -> bool,
) {
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{label}: tensor names"
    );
    for (name, (dt, shape, data)) in theirs {
        let (odt, oshape, odata) = &ours[name];
        assert_eq!((odt, oshape), (dt, shape), "{label}: {name} dtype/shape");
        if bytes(name) && odata != data {
            let diff = odata.iter().zip(data).filter(|(a, b)| a != b).count();
            panic!("{label}: {name}: {diff} of {} bytes differ", data.len());
        }
    }
}

/// Our `quantization_config` (in `ours`, a `config.json`) equals theirs on every field but the
/// list of unquantized modules under `key`, where kquant adds one `re:` pattern per name for
/// engines: the concrete names must be the same. Returns our list.
pub fn assert_config_matches(label: &str, ours: &Path, theirs: &Path, key: &str) -> Vec<String> {
    let (mut oq, mut tq) = (
        read_json(ours)["quantization_config"].clone(),
        read_json(theirs)["quantization_config"].clone(),
    );
    let oex: Vec<String> = serde_json::from_value(oq[key].take()).unwrap();
    let tex: Vec<String> = serde_json::from_value(tq[key].take()).unwrap();
    let mut concrete: Vec<&String> = oex.iter().filter(|e| !e.starts_with("re:")).collect();
    let mut want: Vec<&String> = tex.iter().collect();
    concrete.sort();
    want.sort();
    assert_eq!(concrete, want, "{label}: concrete {key} names");
    assert_eq!(
        oex.iter().filter(|e| e.starts_with("re:")).count(),
        tex.len(),
        "{label}: one engine pattern per name"
    );
    assert_eq!(oq, tq, "{label}: quantization_config");
    oex
}

/// xorshift64: the integration tests' fixed, dependency-free pseudo-random stream (the unit
/// tests' twin is `src/test_rng.rs`).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform-ish in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize].clone()
    }
}

/// The kernels' CPU replay: the device the device tests' `cpu_emu` tier runs on. Under
/// `KQUANT_GPU_ONLY=1` (a hardware run: the GPU tests alone) it refuses, because the GPU tier
/// is `#[ignore]`d: a run that forgot `-- --ignored` fails here instead of passing without
/// having touched a GPU.
pub fn cpu_emu() -> std::sync::Arc<dyn kquant::gpu::Backend> {
    assert!(
        std::env::var("KQUANT_GPU_ONLY").as_deref() != Ok("1"),
        "KQUANT_GPU_ONLY=1 asks for the GPU tests alone, and they are #[ignore]d: run with \
         `-- --ignored` (docs/kernels.md)"
    );
    std::sync::Arc::new(kquant::gpu::CpuEmu::nvidia())
}

/// Device 0 of `kind` (`cuda`, `hip`) for the GPU tier: a missing driver, runtime or GPU fails
/// the test (it was asked for with `-- --ignored`).
pub fn gpu(kind: &str) -> std::sync::Arc<dyn kquant::gpu::Backend> {
    match kquant::gpu::open::<Box<dyn kquant::gpu::Backend>>(kind) {
        Ok(d) => std::sync::Arc::from(d),
        Err(e) => panic!("{kind} device 0 does not open: {e} (this test needs the GPU)"),
    }
}

/// Whether `dev` is the CPU replay (slow: the device tests trim what it runs).
pub fn is_emulation(dev: &dyn kquant::gpu::Backend) -> bool {
    dev.name().starts_with("cpu")
}

/// Device tests, each in tiers: `NAME::cpu_emu` (the kernels' CPU replay, [`cpu_emu`]; always
/// runs), and under their feature `NAME::cuda` / `NAME::hip` (device 0, [`gpu`]), `#[ignore]`d
/// because they need the GPU, and failing without it: `-- --ignored` runs them (docs/kernels.md).
/// Each body is a function of the device, `Arc<dyn Backend>`.
macro_rules! device_tests {
    ($($(#[doc = $doc:literal])* fn $name:ident($d:ident) $body:block)*) => {$(
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($d: std::sync::Arc<dyn kquant::gpu::Backend>) $body

            #[test]
            fn cpu_emu() {
                body($crate::common::cpu_emu())
            }

            #[cfg(feature = "cuda")]
            #[test]
            #[ignore = "needs an NVIDIA GPU (run with -- --ignored; docs/kernels.md)"]
            fn cuda() {
                body($crate::common::gpu("cuda"))
            }

            #[cfg(feature = "hip")]
            #[test]
            #[ignore = "needs an AMD GPU (run with -- --ignored; docs/kernels.md)"]
            fn hip() {
                body($crate::common::gpu("hip"))
            }
        }
    )*};
}
pub(crate) use device_tests;

/// A named F32 tensor of a parity file: its shape and values.
pub fn tensor_f32s(t: &Tensors, name: &str) -> (Vec<u64>, Vec<f32>) {
    let (dt, shape, b) = t.get(name).unwrap_or_else(|| panic!("`{name}` missing"));
    assert_eq!(dt, "F32", "{name}");
    let v = b
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (shape.clone(), v)
}

pub fn tensor_i32s(t: &Tensors, name: &str) -> Vec<i32> {
    let (dt, _, b) = t.get(name).unwrap_or_else(|| panic!("`{name}` missing"));
    assert_eq!(dt, "I32", "{name}");
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// max |a − b| / max |b|: the parity tests' error measure.
pub fn rel_to(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// A copy of the trace at `trace` in `out` holding only the first sample of each category (same
/// shards): a replay over it in seconds. Returns the samples kept, in manifest order.
pub fn one_sample_per_category(trace: &Path, out: &Path) -> Vec<Value> {
    let mut man = read_json(&trace.join("manifest.json"));
    let mut seen = std::collections::BTreeSet::new();
    let keep: Vec<Value> = man["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| seen.insert(s["category"].as_str().unwrap().to_string()))
        .cloned()
        .collect();
    man["samples"] = Value::Array(keep.clone());
    std::fs::create_dir_all(out).unwrap();
    std::fs::write(out.join("manifest.json"), man.to_string()).unwrap();
    for sh in man["shards"].as_array().unwrap() {
        let f = sh["file"].as_str().unwrap();
        std::fs::copy(trace.join(f), out.join(f)).unwrap();
    }
    keep
}

/// An engine venv's python: `$VAR`, else the one `tests/engines/venv.sh ENGINE` builds
/// (`${KQUANT_ENGINE_CACHE:-~/.cache/kquant/engines}/ENGINE-VERSION-<sha256 of the
/// constraints, 12 hex>`, complete when `.complete` exists). A missing venv fails the
/// (ignored unless asked for) test.
pub fn engine_python(var: &str, engine_version: &str) -> PathBuf {
    use sha2::{Digest, Sha256};
    if let Some(p) = std::env::var_os(var) {
        let p = PathBuf::from(p);
        assert!(p.exists(), "{var}={} does not exist", p.display());
        return p;
    }
    let cons =
        std::fs::read(root().join(format!("tests/engines/constraints-{engine_version}.txt")))
            .unwrap();
    let hash: String = Sha256::digest(&cons)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let cache = std::env::var_os("KQUANT_ENGINE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/kquant/engines")
        });
    let venv = cache.join(format!("{engine_version}-{}", &hash[..12]));
    assert!(
        venv.join("bin/python").exists() && venv.join(".complete").exists(),
        "no {engine_version} venv at {} (build it with `bash tests/engines/venv.sh`, or set {var})",
        venv.display()
    );
    venv.join("bin/python")
}
