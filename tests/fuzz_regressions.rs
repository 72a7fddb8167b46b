//! What the cargo-fuzz targets in `fuzz/` check, without the fuzzer: every seed in
//! `fuzz/seeds/**` goes through both parsers, and inputs the fuzz targets (or their
//! differential check) turned up are pinned here as byte literals.
//!
//! The properties are those of `fuzz/fuzz_targets/{header,index}.rs`:
//! - `kquant::io::header::parse` never panics, and whatever it accepts the `safetensors` crate
//!   accepts too, with the same tensor names, dtypes, shapes, data byte ranges and
//!   `__metadata__` (kquant may refuse more than safetensors does, never less);
//! - `kquant::io::index::parse` never panics, and an index it accepts has a non-empty
//!   `weight_map`, only plain shard file names and no tensor listed twice.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use kquant::error::{HeaderError, IndexError};
use kquant::io::header::{self, Header};
use kquant::io::index::{self, is_plain_file_name, Index};
use safetensors::SafeTensors;

/// Parse with kquant; if it accepts, check that `safetensors` accepts and agrees.
fn check_header(bytes: &[u8]) -> Result<Header, HeaderError> {
    let header = header::parse(bytes)?;
    if let Err(e) = SafeTensors::deserialize(bytes) {
        panic!("kquant accepted a file that safetensors refuses: {e}");
    }
    let (n, meta) = SafeTensors::read_metadata(bytes).expect("deserialize accepted it");
    assert_eq!(header.json_len, n as u64, "header length");
    assert_eq!(header.tensors.len(), meta.tensors().len(), "tensor count");
    for t in &header.tensors {
        let info = meta
            .info(&t.name)
            .unwrap_or_else(|| panic!("safetensors has no tensor `{}`", t.name));
        assert_eq!(
            t.dtype.name(),
            info.dtype.to_string(),
            "dtype of `{}`",
            t.name
        );
        assert_eq!(t.shape, info.shape, "shape of `{}`", t.name);
        assert_eq!(
            (t.start, t.end),
            (info.data_offsets.0 as u64, info.data_offsets.1 as u64),
            "data offsets of `{}`",
            t.name
        );
    }
    let theirs: Option<BTreeMap<String, String>> = meta
        .metadata()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    assert_eq!(header.metadata, theirs, "__metadata__");
    Ok(header)
}

/// Parse with kquant; if it accepts, check the index invariants.
fn check_index(bytes: &[u8]) -> Result<Index, IndexError> {
    let index = index::parse(bytes)?;
    assert!(!index.weight_map.is_empty(), "accepted an empty weight_map");
    let mut seen = HashSet::new();
    for (tensor, shard) in &index.weight_map {
        assert!(is_plain_file_name(shard), "unsafe shard name {shard:?}");
        assert!(seen.insert(tensor), "tensor {tensor:?} listed twice");
    }
    Ok(index)
}

fn seed_files(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(kind);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seeds in {}", dir.display());
    files
}

/// Every seed is valid for its own target, and every seed goes through both parsers.
#[test]
fn seeds_pass_both_parsers() {
    for path in seed_files("header") {
        let bytes = fs::read(&path).unwrap();
        let h = check_header(&bytes)
            .unwrap_or_else(|e| panic!("header seed {} refused: {e}", path.display()));
        let data: u64 = h.tensors.iter().map(|t| t.nbytes()).sum();
        assert_eq!(
            h.data_offset() + data,
            bytes.len() as u64,
            "{}",
            path.display()
        );
        let _ = check_index(&bytes);
    }
    for path in seed_files("index") {
        let bytes = fs::read(&path).unwrap();
        check_index(&bytes)
            .unwrap_or_else(|e| panic!("index seed {} refused: {e}", path.display()));
        let _ = check_header(&bytes);
    }
}

/// Every prefix of each small seed (truncated files) is refused or agreed on, never a panic.
#[test]
fn truncated_seeds_never_disagree() {
    for kind in ["header", "index"] {
        for path in seed_files(kind) {
            let bytes = fs::read(&path).unwrap();
            if bytes.len() > 8192 {
                continue;
            }
            for end in 0..bytes.len() {
                let _ = check_header(&bytes[..end]);
                let _ = check_index(&bytes[..end]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs the fuzzer found
// ---------------------------------------------------------------------------------------------

/// Found by `cargo fuzz run header` (differential check), minimised with `cargo fuzz tmin`:
/// tensor `t` names `dtype` twice. kquant kept the last (`U8`) and accepted the file; the
/// `safetensors` crate refuses a repeated field (here it fails on the first, `""`). A reader
/// taking the first value would see a different tensor, so kquant now refuses any repeated key
/// inside a header entry.
#[test]
fn fuzz_repeated_dtype_in_entry_is_refused() {
    let bytes = b"s\0\0\0\0\0\0\0{\"\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},\"t\":{\"dtype\":\"\",\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[4,7]}}\0\0\0\0\0\0\0";
    assert!(SafeTensors::deserialize(bytes).is_err());
    match check_header(bytes) {
        Err(HeaderError::Json(msg)) => assert!(msg.contains("duplicate key `dtype`"), "{msg}"),
        other => panic!("expected a duplicate-key refusal, got {other:?}"),
    }
}

/// The fuzzer's first (unminimised) crash for the same bug, cut down by hand: `data_offsets`
/// twice with different ranges. kquant read `[4,4]`; a first-wins reader reads `[0,0]`.
#[test]
fn fuzz_repeated_data_offsets_in_entry_is_refused() {
    let bytes = b"\x7f\0\0\0\0\0\0\0{\"e\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[0,0],\"data_offsets\":[4,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}\0\0\0\0";
    assert_eq!(bytes.len(), 8 + 0x7f + 4);
    assert!(SafeTensors::deserialize(bytes).is_err());
    match check_header(bytes) {
        Err(HeaderError::Json(msg)) => {
            assert!(msg.contains("duplicate key `data_offsets`"), "{msg}")
        }
        other => panic!("expected a duplicate-key refusal, got {other:?}"),
    }
}

/// Around the fix: repeated keys are refused at any depth below the top level (including in
/// `__metadata__`, which `safetensors` would read last-wins), unknown fields are still
/// ignored, and a tensor listed twice in an index's `weight_map` is still reported as such.
#[test]
fn repeated_keys_below_the_top_level() {
    fn file(json: &str, data: &[u8]) -> Vec<u8> {
        let mut f = (json.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(json.as_bytes());
        f.extend_from_slice(data);
        f
    }
    let meta = file(r#"{"__metadata__":{"k":"a","k":"b"}}"#, &[]);
    assert!(matches!(check_header(&meta), Err(HeaderError::Json(_))));
    let nested = file(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{"y":1,"y":2}}}"#,
        &[0],
    );
    assert!(matches!(check_header(&nested), Err(HeaderError::Json(_))));
    let extra = file(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{"y":1,"z":[{}]}}}"#,
        &[0],
    );
    assert_eq!(check_header(&extra).unwrap().tensors.len(), 1);
    let dup_top = file(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        &[0],
    );
    assert!(matches!(
        check_header(&dup_top),
        Err(HeaderError::DuplicateTensor(_))
    ));
    assert!(matches!(
        check_index(br#"{"weight_map":{"a":"s","a":"t"}}"#),
        Err(IndexError::DuplicateEntry(_))
    ));
    assert!(matches!(
        check_index(br#"{"weight_map":{"a":{"b":1,"b":2}}}"#),
        Err(IndexError::Shape)
    ));
}
