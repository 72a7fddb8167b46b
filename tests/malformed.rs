//! Hostile inputs against the real `kquant` binary. Every malformed input must end in exit code
//! 2 with an `error:` line on stderr that names the offending file (and tensor, where there is
//! one), never a panic, and nothing on stdout.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Run the real binary with a clean, offline hub environment.
fn kquant<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = common::kquant_cmd();
    cmd.args(args)
        .env("HF_HUB_OFFLINE", "1")
        .env_remove("HF_HOME")
        .env_remove("HUGGINGFACE_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env("RUST_BACKTRACE", "1");
    cmd.output().expect("run kquant")
}

/// `kquant inspect PATH --json`.
fn inspect(path: &Path) -> Output {
    kquant([
        std::ffi::OsStr::new("inspect"),
        path.as_os_str(),
        std::ffi::OsStr::new("--json"),
    ])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Assert a clean failure: exit 2, empty stdout, no panic, and an `error:` line that contains
/// every one of `needles` (the file path, the tensor name, …). Returns stderr.
fn assert_fails(out: &Output, needles: &[&str]) -> String {
    let stderr = text(&out.stderr);
    let stdout = text(&out.stdout);
    let ctx = format!("\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(!stderr.contains("panicked"), "kquant panicked:{ctx}");
    assert_eq!(out.status.code(), Some(2), "exit code must be 2:{ctx}");
    assert!(stdout.is_empty(), "stdout must be empty:{ctx}");
    let errs: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert!(!errs.is_empty(), "no `error:` line:{ctx}");
    assert!(
        errs.iter().any(|l| needles.iter().all(|n| l.contains(n))),
        "no `error:` line names all of {needles:?}:{ctx}"
    );
    stderr
}

/// The `hint:` text of a failure.
fn hint(stderr: &str) -> String {
    stderr
        .lines()
        .filter(|l| l.starts_with("hint:"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// Raw safetensors bytes: 8-byte little-endian header length, the header, then data.
fn st_raw(json: &str, data: &[u8]) -> Vec<u8> {
    let mut f = (json.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(json.as_bytes());
    f.extend_from_slice(data);
    f
}

/// A well-formed safetensors file of F32 tensors laid out back to back, in the given order.
fn st_valid(tensors: &[(&str, &[usize])]) -> Vec<u8> {
    let mut entries = Vec::new();
    let mut pos = 0usize;
    for (name, shape) in tensors {
        let n = shape.iter().product::<usize>() * 4;
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        entries.push(format!(
            r#""{name}":{{"dtype":"F32","shape":[{}],"data_offsets":[{pos},{}]}}"#,
            dims.join(","),
            pos + n
        ));
        pos += n;
    }
    let json = format!(
        r#"{{"__metadata__":{{"format":"pt"}},{}}}"#,
        entries.join(",")
    );
    st_raw(&json, &vec![0u8; pos])
}

/// A lone file in its own temp dir (no sibling `config.json`).
fn lone_file(bytes: &[u8]) -> (TempDir, PathBuf) {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("bad.safetensors");
    fs::write(&path, bytes).unwrap();
    (dir, path)
}

/// Write `json` as a header with `data` and check that `inspect` refuses it naming the file
/// and every one of `extra`.
fn header_case(json: &str, data: &[u8], extra: &[&str]) -> String {
    let (_d, path) = lone_file(&st_raw(json, data));
    let out = inspect(&path);
    let ps = p(&path);
    let mut needles = vec![ps.as_str()];
    needles.extend_from_slice(extra);
    assert_fails(&out, &needles)
}

const CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama"}"#;

/// A checkpoint directory: optional `config.json` plus the given files.
fn ckpt_dir(config: Option<&str>, files: &[(&str, Vec<u8>)]) -> TempDir {
    let dir = TempDir::new().unwrap();
    if let Some(c) = config {
        fs::write(dir.path().join("config.json"), c).unwrap();
    }
    for (name, bytes) in files {
        fs::write(dir.path().join(name), bytes).unwrap();
    }
    dir
}

const INDEX: &str = "model.safetensors.index.json";
const S1: &str = "model-00001-of-00002.safetensors";
const S2: &str = "model-00002-of-00002.safetensors";

/// A sharded checkpoint: `index` as the index text, plus shards.
fn sharded(index: &str, shards: &[(&str, Vec<u8>)]) -> TempDir {
    let mut files: Vec<(&str, Vec<u8>)> = vec![(INDEX, index.as_bytes().to_vec())];
    files.extend(shards.iter().cloned());
    ckpt_dir(Some(CONFIG), &files)
}

/// `{"weight_map": {...}}` from (tensor, shard) pairs, in order.
fn index_json(map: &[(&str, &str)]) -> String {
    let e: Vec<String> = map.iter().map(|(t, s)| format!(r#""{t}":"{s}""#)).collect();
    format!(
        r#"{{"metadata":{{"total_size":0}},"weight_map":{{{}}}}}"#,
        e.join(",")
    )
}

/// Assert `inspect DIR` fails naming the index file plus `extra`.
fn index_case(dir: &TempDir, extra: &[&str]) -> String {
    let idx = p(&dir.path().join(INDEX));
    let mut needles = vec![idx.as_str()];
    needles.extend_from_slice(extra);
    assert_fails(&inspect(dir.path()), &needles)
}

// ---------------------------------------------------------------------------------------------
// Baselines: well-formed inputs succeed
// ---------------------------------------------------------------------------------------------

#[test]
fn baseline_well_formed_file_inspects() {
    let (_d, path) = lone_file(&st_valid(&[("a.weight", &[2, 3]), ("b.bias", &[3])]));
    let out = inspect(&path);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(doc["schema"], "kquant.inspect/1");
    assert_eq!(doc["source"]["kind"], "file");
    let names: Vec<&str> = doc["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a.weight", "b.bias"]);
    assert_eq!(doc["parameters"], 9);
    assert_eq!(doc["bytes"], 36);
}

#[test]
fn baseline_well_formed_sharded_dir_inspects() {
    let dir = sharded(
        &index_json(&[("a", S1), ("b", S2), ("c", S1)]),
        &[
            (S1, st_valid(&[("a", &[2]), ("c", &[1])])),
            (S2, st_valid(&[("b", &[4])])),
        ],
    );
    let out = inspect(dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["source"]["kind"], "directory");
    assert_eq!(doc["source"]["files"].as_array().unwrap().len(), 2);
    assert_eq!(doc["tensors"].as_array().unwrap().len(), 3);
}

// ---------------------------------------------------------------------------------------------
// Safetensors header cases
// ---------------------------------------------------------------------------------------------

#[test]
fn truncated_file_shorter_than_prefix() {
    let (_d, path) = lone_file(&[1, 2, 3]);
    let err = assert_fails(&inspect(&path), &[&p(&path), "3 bytes"]);
    assert!(hint(&err).contains("truncated"), "{err}");
}

#[test]
fn empty_file() {
    let (_d, path) = lone_file(&[]);
    assert_fails(&inspect(&path), &[&p(&path), "0 bytes"]);
}

#[test]
fn truncated_header_past_eof() {
    let mut f = 100u64.to_le_bytes().to_vec();
    f.extend_from_slice(b"{}");
    let (_d, path) = lone_file(&f);
    let err = assert_fails(&inspect(&path), &[&p(&path), "past the end"]);
    assert!(hint(&err).contains("truncated"), "{err}");
}

#[test]
fn header_length_u64_max() {
    let mut f = u64::MAX.to_le_bytes().to_vec();
    f.extend_from_slice(b"{}");
    let (_d, path) = lone_file(&f);
    assert_fails(&inspect(&path), &[&p(&path), "exceeds"]);
}

#[test]
fn header_length_over_cap() {
    let mut f = 100_000_001u64.to_le_bytes().to_vec();
    f.extend_from_slice(b"{}");
    let (_d, path) = lone_file(&f);
    assert_fails(&inspect(&path), &[&p(&path), "100000001", "exceeds"]);
}

#[test]
fn header_length_where_prefix_plus_length_overflows() {
    // 8 + (u64::MAX - 4) overflows u64; it must be refused, not wrap around.
    let mut f = (u64::MAX - 4).to_le_bytes().to_vec();
    f.extend_from_slice(b"{}");
    let (_d, path) = lone_file(&f);
    assert_fails(&inspect(&path), &[&p(&path)]);
}

#[test]
fn header_bad_json() {
    header_case("{nope", &[], &["not valid JSON"]);
}

#[test]
fn header_invalid_utf8() {
    let mut f = 4u64.to_le_bytes().to_vec();
    f.extend_from_slice(&[b'{', 0xff, 0xfe, b'}']);
    let (_d, path) = lone_file(&f);
    assert_fails(&inspect(&path), &[&p(&path)]);
}

#[test]
fn header_json_not_an_object() {
    header_case("[1]", &[], &["must be an object"]);
}

#[test]
fn header_json_scalar() {
    header_case(r#""a string""#, &[], &["must be an object"]);
}

#[test]
fn header_tensor_entry_not_an_object() {
    header_case(r#"{"w":5}"#, &[], &["`w`"]);
}

#[test]
fn header_tensor_entry_missing_data_offsets() {
    header_case(r#"{"w":{"dtype":"U8","shape":[1]}}"#, &[0], &["`w`"]);
}

#[test]
fn unknown_dtype() {
    header_case(
        r#"{"w.q":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}"#,
        &[0],
        &["`w.q`", "unknown dtype `Q9`"],
    );
}

#[test]
fn negative_shape_dimension() {
    header_case(
        r#"{"neg":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
        &[0],
        &["`neg`", "shape"],
    );
}

#[test]
fn fractional_shape_dimension() {
    header_case(
        r#"{"frac":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}"#,
        &[0],
        &["`frac`", "shape"],
    );
}

#[test]
fn shape_element_count_overflows() {
    header_case(
        r#"{"huge":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,1]}}"#,
        &[0],
        &["`huge`", "overflows"],
    );
}

#[test]
fn shape_dimension_u64_max_overflows() {
    header_case(
        r#"{"huge":{"dtype":"U8","shape":[18446744073709551615,2],"data_offsets":[0,1]}}"#,
        &[0],
        &["`huge`", "overflows"],
    );
}

#[test]
fn shape_bytes_mismatch() {
    header_case(
        r#"{"mm":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
        &[0; 4],
        &["`mm`", "needs 8 bytes", "span 4"],
    );
}

#[test]
fn data_offsets_out_of_bounds() {
    header_case(
        r#"{"oob":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}}"#,
        &[0; 4],
        &["`oob`", "past the end"],
    );
}

#[test]
fn data_offsets_huge_out_of_bounds() {
    header_case(
        r#"{"oob":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}}"#,
        &[0; 4],
        &["`oob`"],
    );
}

#[test]
fn overlapping_offsets() {
    header_case(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#,
        &[0; 3],
        &["`b`", "overlap", "`a`"],
    );
}

#[test]
fn gap_between_tensors() {
    header_case(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}"#,
        &[0; 3],
        &["unused bytes 1..2"],
    );
}

#[test]
fn trailing_bytes_after_last_tensor() {
    header_case(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        &[0; 5],
        &["unused bytes 1..5"],
    );
}

#[test]
fn duplicate_tensor_name_in_header() {
    header_case(
        r#"{"dup":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"dup":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
        &[0; 2],
        &["`dup`", "twice"],
    );
}

#[test]
fn bad_metadata_value_not_a_string() {
    header_case(r#"{"__metadata__":{"format":1}}"#, &[], &["`__metadata__`"]);
}

#[test]
fn bad_metadata_not_an_object() {
    header_case(r#"{"__metadata__":["pt"]}"#, &[], &["`__metadata__`"]);
}

#[test]
fn begin_greater_than_end_offsets() {
    header_case(
        r#"{"rev":{"dtype":"U8","shape":[1],"data_offsets":[2,1]}}"#,
        &[0; 2],
        &["`rev`", "data_offsets"],
    );
}

#[test]
fn data_offsets_wrong_arity() {
    header_case(
        r#"{"tri":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}"#,
        &[0],
        &["`tri`", "data_offsets"],
    );
}

// ---------------------------------------------------------------------------------------------
// Directory cases
// ---------------------------------------------------------------------------------------------

#[test]
fn dir_missing_config_json() {
    let dir = ckpt_dir(None, &[("model.safetensors", st_valid(&[("a", &[1])]))]);
    let err = assert_fails(&inspect(dir.path()), &[&p(dir.path()), "config.json"]);
    assert!(hint(&err).contains("config.json"), "{err}");
}

#[test]
fn dir_bad_config_json() {
    let dir = ckpt_dir(
        Some("{\"model_type\": "),
        &[("model.safetensors", st_valid(&[("a", &[1])]))],
    );
    assert_fails(
        &inspect(dir.path()),
        &[&p(&dir.path().join("config.json")), "not valid JSON"],
    );
}

#[test]
fn dir_config_json_is_array() {
    let dir = ckpt_dir(
        Some("[1, 2, 3]"),
        &[("model.safetensors", st_valid(&[("a", &[1])]))],
    );
    assert_fails(
        &inspect(dir.path()),
        &[&p(&dir.path().join("config.json")), "JSON object"],
    );
}

#[test]
fn empty_directory() {
    let dir = TempDir::new().unwrap();
    assert_fails(&inspect(dir.path()), &[&p(dir.path())]);
}

#[test]
fn dir_with_config_but_no_weights() {
    let dir = ckpt_dir(Some(CONFIG), &[]);
    let err = assert_fails(&inspect(dir.path()), &[&p(dir.path()), "model.safetensors"]);
    assert!(hint(&err).contains("model.safetensors"), "{err}");
}

#[test]
fn dir_with_only_stray_safetensors() {
    let dir = ckpt_dir(
        Some(CONFIG),
        &[("foo.safetensors", st_valid(&[("a", &[1])]))],
    );
    let err = assert_fails(&inspect(dir.path()), &[&p(dir.path())]);
    assert!(hint(&err).contains("foo.safetensors"), "{err}");
}

#[test]
fn dir_with_malformed_model_safetensors() {
    let dir = ckpt_dir(Some(CONFIG), &[("model.safetensors", vec![1, 2, 3])]);
    assert_fails(
        &inspect(dir.path()),
        &[&p(&dir.path().join("model.safetensors"))],
    );
}

#[test]
fn path_does_not_exist() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("nope").join("model.safetensors");
    assert_fails(&inspect(&missing), &[&p(&missing)]);
}

// ---------------------------------------------------------------------------------------------
// Index cases
// ---------------------------------------------------------------------------------------------

#[test]
fn index_invalid_json() {
    let dir = sharded("{\"weight_map\": {", &[(S1, st_valid(&[("a", &[1])]))]);
    index_case(&dir, &["not valid JSON"]);
}

#[test]
fn index_not_an_object() {
    let dir = sharded(r#"["a", "b"]"#, &[(S1, st_valid(&[("a", &[1])]))]);
    index_case(&dir, &["weight_map"]);
}

#[test]
fn index_missing_weight_map() {
    let dir = sharded(
        r#"{"metadata":{"total_size":4}}"#,
        &[(S1, st_valid(&[("a", &[1])]))],
    );
    index_case(&dir, &["weight_map"]);
}

#[test]
fn index_weight_map_not_an_object() {
    let dir = sharded(
        &format!(r#"{{"weight_map":["{S1}"]}}"#),
        &[(S1, st_valid(&[("a", &[1])]))],
    );
    index_case(&dir, &["weight_map"]);
}

#[test]
fn index_weight_map_value_not_a_string() {
    let dir = sharded(
        r#"{"weight_map":{"a":1}}"#,
        &[(S1, st_valid(&[("a", &[1])]))],
    );
    index_case(&dir, &["weight_map"]);
}

#[test]
fn index_empty_weight_map() {
    let dir = sharded(r#"{"weight_map":{}}"#, &[(S1, st_valid(&[("a", &[1])]))]);
    index_case(&dir, &["empty"]);
}

#[test]
fn index_shard_name_with_slash() {
    let dir = sharded(
        &index_json(&[("a", "sub/model.safetensors")]),
        &[(S1, st_valid(&[("a", &[1])]))],
    );
    fs::create_dir(dir.path().join("sub")).unwrap();
    fs::write(
        dir.path().join("sub/model.safetensors"),
        st_valid(&[("a", &[1])]),
    )
    .unwrap();
    index_case(
        &dir,
        &["`a`", "sub/model.safetensors", "not a plain file name"],
    );
}

#[test]
fn index_shard_name_with_dotdot() {
    // A real, valid shard sits one level up: following `..` would succeed, so only the name
    // check can refuse it.
    let outer = TempDir::new().unwrap();
    fs::write(
        outer.path().join("escape.safetensors"),
        st_valid(&[("a", &[1])]),
    )
    .unwrap();
    let inner = outer.path().join("ckpt");
    fs::create_dir(&inner).unwrap();
    fs::write(inner.join("config.json"), CONFIG).unwrap();
    fs::write(
        inner.join(INDEX),
        index_json(&[("a", "../escape.safetensors")]),
    )
    .unwrap();
    let idx = p(&inner.join(INDEX));
    assert_fails(
        &inspect(&inner),
        &[
            &idx,
            "`a`",
            "../escape.safetensors",
            "not a plain file name",
        ],
    );
}

#[test]
fn index_shard_name_is_dotdot() {
    let dir = sharded(&index_json(&[("a", "..")]), &[]);
    index_case(&dir, &["`a`", "`..`", "not a plain file name"]);
}

#[test]
fn index_shard_absolute_path() {
    let dir = sharded(&index_json(&[("a", "/etc/passwd")]), &[]);
    let err = index_case(&dir, &["`a`", "/etc/passwd", "not a plain file name"]);
    assert!(hint(&err).contains("plain file names"), "{err}");
}

#[test]
fn index_shard_missing_on_disk() {
    let dir = sharded(
        &index_json(&[("a", S1), ("b", S2)]),
        &[(S1, st_valid(&[("a", &[1])]))],
    );
    let err = index_case(&dir, &[S2, "`b`", "does not exist"]);
    assert!(hint(&err).contains("missing shard"), "{err}");
}

#[test]
fn index_shard_malformed() {
    let dir = sharded(
        &index_json(&[("a", S1), ("b", S2)]),
        &[(S1, st_valid(&[("a", &[1])])), (S2, vec![0u8; 5])],
    );
    assert_fails(&inspect(dir.path()), &[&p(&dir.path().join(S2))]);
}

#[test]
fn index_tensor_absent_from_its_shard() {
    let dir = sharded(
        &index_json(&[("a", S1), ("ghost", S1)]),
        &[(S1, st_valid(&[("a", &[1])]))],
    );
    index_case(&dir, &["`ghost`", S1, "does not contain"]);
}

#[test]
fn index_tensor_present_in_two_shards() {
    let dir = sharded(
        &index_json(&[("a", S1), ("b", S2)]),
        &[
            (S1, st_valid(&[("a", &[1]), ("b", &[1])])),
            (S2, st_valid(&[("b", &[1])])),
        ],
    );
    index_case(&dir, &["`b`", S1, S2, "two shards"]);
}

#[test]
fn index_shard_holds_unlisted_tensor() {
    let dir = sharded(
        &index_json(&[("a", S1)]),
        &[(S1, st_valid(&[("a", &[1]), ("extra", &[1])]))],
    );
    index_case(&dir, &["`extra`", S1, "does not list"]);
}

#[test]
fn index_duplicate_key_in_weight_map() {
    // serde_json's map would silently keep the second entry; kquant must refuse.
    let dir = sharded(
        &format!(r#"{{"weight_map":{{"a":"{S1}","b":"{S2}","a":"{S2}"}}}}"#),
        &[
            (S1, st_valid(&[("a", &[1])])),
            (S2, st_valid(&[("b", &[1])])),
        ],
    );
    index_case(&dir, &["`a`", "twice"]);
}

#[test]
fn index_weight_map_given_twice() {
    let dir = sharded(
        &format!(r#"{{"weight_map":{{"a":"{S1}"}},"weight_map":{{"b":"{S1}"}}}}"#),
        &[(S1, st_valid(&[("a", &[1]), ("b", &[1])]))],
    );
    index_case(&dir, &["weight_map"]);
}

// ---------------------------------------------------------------------------------------------
// Hub
// ---------------------------------------------------------------------------------------------

#[test]
fn hub_id_offline_with_empty_cache() {
    let cache = TempDir::new().unwrap();
    let cwd = TempDir::new().unwrap();
    let repo = "kquant-test-org/no-such-draft";
    let mut cmd = common::kquant_cmd();
    let out = cmd
        .args(["inspect", repo, "--json"])
        .current_dir(cwd.path())
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", cache.path())
        .env_remove("HF_HOME")
        .env_remove("HUGGINGFACE_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    let err = assert_fails(&out, &[repo]);
    assert!(hint(&err).contains("HF_HUB_OFFLINE"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// verify-files
// ---------------------------------------------------------------------------------------------

fn synth_tiny(root: &TempDir) -> PathBuf {
    let dir = root.path().join("out");
    let out = kquant([
        std::ffi::OsStr::new("synth"),
        std::ffi::OsStr::new("--preset"),
        std::ffi::OsStr::new("tiny-eagle3-specforge"),
        std::ffi::OsStr::new("-o"),
        dir.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    dir
}

fn verify_files(dir: &Path) -> Output {
    kquant([std::ffi::OsStr::new("verify-files"), dir.as_os_str()])
}

#[test]
fn verify_files_unmodified_output_passes() {
    let root = TempDir::new().unwrap();
    let dir = synth_tiny(&root);
    let out = verify_files(&dir);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"));
    assert!(!stderr.lines().any(|l| l.starts_with("error:")), "{stderr}");
}

#[test]
fn verify_files_modified_output_fails() {
    let root = TempDir::new().unwrap();
    let dir = synth_tiny(&root);
    let model = dir.join("model.safetensors");
    let mut bytes = fs::read(&model).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&model, bytes).unwrap();
    let err = assert_fails(
        &verify_files(&dir),
        &[
            &p(&dir.join("kquant-manifest.json")),
            "changed",
            "model.safetensors",
        ],
    );
    assert!(!hint(&err).is_empty(), "{err}");
}

#[test]
fn verify_files_missing_manifest() {
    let root = TempDir::new().unwrap();
    let dir = synth_tiny(&root);
    fs::remove_file(dir.join("kquant-manifest.json")).unwrap();
    assert_fails(
        &verify_files(&dir),
        &[&p(&dir.join("kquant-manifest.json"))],
    );
}

#[test]
fn verify_files_manifest_not_json() {
    let root = TempDir::new().unwrap();
    let dir = synth_tiny(&root);
    fs::write(dir.join("kquant-manifest.json"), "{not json").unwrap();
    assert_fails(
        &verify_files(&dir),
        &[
            &p(&dir.join("kquant-manifest.json")),
            "not a kquant manifest",
        ],
    );
}

#[test]
fn verify_files_manifest_unsafe_file_name() {
    let root = TempDir::new().unwrap();
    let dir = synth_tiny(&root);
    let mpath = dir.join("kquant-manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&fs::read(&mpath).unwrap()).unwrap();
    m["outputs"][0]["file"] = "../escape".into();
    fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
    assert_fails(&verify_files(&dir), &[&p(&mpath), "../escape"]);
}

#[test]
fn verify_files_missing_listed_file() {
    let root = TempDir::new().unwrap();
    let dir = synth_tiny(&root);
    fs::remove_file(dir.join("model.safetensors")).unwrap();
    assert_fails(
        &verify_files(&dir),
        &[
            &p(&dir.join("kquant-manifest.json")),
            "missing",
            "model.safetensors",
        ],
    );
}
