//! Hostile inputs through the real binary: patterns, indexes, hub ids, names with control
//! characters, odd source paths, trace manifests and numeric flags. Each case must end in a
//! clear `error:` (exit 2) or a normal result, quickly, never a panic (exit 101) or a signal.

use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::{kquant, kquant_cmd, stderr, Rng};

/// The standard error of a run, as text.
/// A refusal: exit 2 with an `error:` line and a `hint:` line.
fn assert_refused(o: &Output, what: &str) -> String {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{what}: {e}");
    assert!(e.starts_with("error:"), "{what}: {e}");
    assert!(e.contains("\nhint:"), "{what}: no hint line: {e}");
    e
}

/// Run `kquant ARGS…` and require it to finish within `limit`.
fn timed(args: &[&str], limit: Duration) -> Output {
    let t = Instant::now();
    let o = kquant(args);
    let took = t.elapsed();
    assert!(took < limit, "{args:?} took {took:?}");
    o
}

// 1. Exclusion patterns.

/// A module pattern with 14 `*`: the old recursive matcher tried every way of splitting each
/// name among the stars (minutes per name); the iterative one is linear per star.
#[test]
fn exclude_pattern_with_many_stars_is_fast() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let miss = format!("{}X", "*?".repeat(14));
    let o = timed(
        &[
            "quantize",
            "fixtures/tiny/eagle3-vllm",
            "-o",
            out.to_str().unwrap(),
            "--dry-run",
            "--exclude",
            &miss,
        ],
        Duration::from_secs(5),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let plan = String::from_utf8_lossy(&o.stdout);
    assert!(!plan.contains("excluded by"), "{plan}");
    // Many stars that do match: every MLP projection is excluded.
    let hit = "*l*a*y*e*r*s*.*0*.*m*l*p*.*_*p*r*o*j";
    let o = timed(
        &[
            "quantize",
            "fixtures/tiny/eagle3-vllm",
            "-o",
            out.to_str().unwrap(),
            "--dry-run",
            "--exclude",
            hit,
        ],
        Duration::from_secs(5),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let plan = String::from_utf8_lossy(&o.stdout);
    assert_eq!(plan.matches("excluded by").count(), 3, "{plan}");
}

/// Megabyte patterns (through a preset file: one command-line argument is limited to 128 KiB)
/// neither crash nor take long: one of unclosed `[`, and a megabyte of `*` before `lm_head`.
#[test]
fn megabyte_exclude_patterns_do_not_crash() {
    let t = tempfile::tempdir().unwrap();
    let preset = t.path().join("preset.json");
    let doc = serde_json::json!({
        "description": "hostile patterns",
        "scheme": "int4-pc",
        "format": "quark",
        "exclude": ["[".repeat(1 << 20), format!("{}lm_head", "*".repeat(1 << 20))],
        "loads": "nowhere",
    });
    std::fs::write(&preset, serde_json::to_vec(&doc).unwrap()).unwrap();
    let out = t.path().join("out");
    let o = timed(
        &[
            "quantize",
            "fixtures/tiny/eagle3-vllm",
            "-o",
            out.to_str().unwrap(),
            "--config",
            preset.to_str().unwrap(),
            "--json",
        ],
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cfg = common::read_json(&out.join("config.json"));
    let ex = &cfg["quantization_config"]["exclude"];
    assert!(
        ex.as_array().unwrap().iter().any(|e| e == "lm_head"),
        "{ex}"
    );
}

// 2. Index checks.

/// A directory with `config.json` and an index of `n` entries, entry i in shard `s{i % shards}`.
fn big_index(dir: &Path, n: usize, shards: usize) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        "fixtures/tiny/eagle3-vllm/config.json",
        dir.join("config.json"),
    )
    .unwrap();
    let mut s = String::from(r#"{"metadata":{"total_size":1},"weight_map":{"#);
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!(r#""t{i}.weight":"s{}.safetensors""#, i % shards));
    }
    s.push_str("}}");
    std::fs::write(dir.join("model.safetensors.index.json"), s).unwrap();
}

/// 200k entries over 100k shard names: listing the distinct shards was quadratic (minutes);
/// now the missing first shard is reported at once.
#[test]
fn huge_index_is_checked_quickly() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("ck");
    big_index(&dir, 200_000, 100_000);
    let o = timed(&["inspect", dir.to_str().unwrap()], Duration::from_secs(5));
    let e = assert_refused(&o, "missing shards");
    assert!(
        e.contains("shard `s0.safetensors` is listed for tensor `t0.weight` but does not exist"),
        "{e}"
    );
}

// 3. Hub ids.

/// `kquant ARGS…` with the hub cache at `cache` and the hub switched off.
fn kquant_offline_hub(cache: &Path, args: &[&str]) -> Output {
    kquant_cmd()
        .env("HF_HUB_CACHE", cache)
        .env("HF_HUB_OFFLINE", "1")
        .args(args)
        .output()
        .unwrap()
}

/// `org/name@/abs/dir` used to load `/abs/dir` (the revision joined under `snapshots/`
/// replaced the whole path): now the revision is refused.
#[test]
fn hub_revision_cannot_name_a_directory_outside_the_cache() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("hub");
    std::fs::create_dir_all(&cache).unwrap();
    let dir = common::root().join("fixtures/tiny/eagle3-vllm");
    for rev in [
        dir.to_str().unwrap().to_string(),
        format!("../../../../../../../../..{}", dir.to_str().unwrap()),
    ] {
        let spec = format!("org/name@{rev}");
        let o = kquant_offline_hub(&cache, &["inspect", &spec]);
        let e = assert_refused(&o, &spec);
        assert!(e.contains("revision"), "{e}");
        assert!(e.contains("hint: a revision is a branch"), "{e}");
    }
}

/// A cache whose `refs/main` points out of it (`../../../outside`): the snapshot it leads to
/// is refused, not loaded.
#[test]
fn hub_refs_pointing_out_of_the_cache_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("hub");
    let folder = cache.join("models--org--name");
    std::fs::create_dir_all(folder.join("refs")).unwrap();
    std::fs::create_dir_all(folder.join("snapshots")).unwrap();
    std::fs::write(folder.join("refs/main"), "../../../outside").unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(
            common::root().join("fixtures/tiny/eagle3-vllm").join(f),
            outside.join(f),
        )
        .unwrap();
    }
    let o = kquant_offline_hub(&cache, &["inspect", "org/name"]);
    let e = assert_refused(&o, "refs out of the cache");
    assert!(e.contains("outside the snapshots"), "{e}");
}

// 5. Source paths that cannot be opened.

#[test]
fn source_path_errors_name_their_cause() {
    let t = tempfile::tempdir().unwrap();
    let l = t.path().join("loop");
    std::os::unix::fs::symlink(&l, &l).unwrap();
    let e = assert_refused(&kquant(&["inspect", l.to_str().unwrap()]), "loop");
    assert!(
        e.contains("is a symlink loop") && e.contains("loop`"),
        "{e}"
    );
    assert!(!e.contains("hub id"), "{e}");

    let d = t.path().join("dangling");
    std::os::unix::fs::symlink(t.path().join("gone"), &d).unwrap();
    let e = assert_refused(&kquant(&["inspect", d.to_str().unwrap()]), "dangling");
    assert!(
        e.contains("which does not exist") && e.contains("gone"),
        "{e}"
    );

    let e = assert_refused(
        &kquant(&["inspect", "fixtures/tiny/eagle3-vllm/config.json/model"]),
        "file as a directory",
    );
    assert!(e.contains("not a directory"), "{e}");

    // A shard of an indexed checkpoint that is a symlink loop is not "missing".
    let ck = t.path().join("ck");
    big_index(&ck, 1, 1);
    let shard = ck.join("s0.safetensors");
    std::os::unix::fs::symlink(&shard, &shard).unwrap();
    let e = assert_refused(&kquant(&["inspect", ck.to_str().unwrap()]), "shard loop");
    assert!(
        e.contains("s0.safetensors") && e.contains("symlink loop"),
        "{e}"
    );
}

// 4. Names with control characters.

/// The name of the hostile tensor: it clears the screen, recolours and starts a fake line.
const EVIL: &str = "evil\u{1b}[2J\u{1b}[31m\nfake line\u{202e}.weight";

/// A single-file checkpoint holding one tensor named [`EVIL`] and one plain one.
fn evil_file(dir: &Path) -> std::path::PathBuf {
    let header = serde_json::json!({
        EVIL: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "plain.weight": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
    });
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let p = dir.join("evil.safetensors");
    common::write_safetensors(&p, &h, [0u8; 16]);
    p
}

/// Nothing a file names reaches the terminal raw.
fn assert_no_raw_controls(text: &str, what: &str) {
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}') && !text.contains("\nfake line"),
        "{what}: {text:?}"
    );
}

#[test]
fn control_characters_in_names_are_escaped_in_human_output() {
    let t = tempfile::tempdir().unwrap();
    let f = evil_file(t.path());
    let fs = f.to_str().unwrap();

    let o = kquant(&["inspect", fs, "--tensors"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_no_raw_controls(&out, "inspect");
    assert!(
        out.contains("evil\\x1b[2J\\x1b[31m\\nfake line\\u{202e}.weight"),
        "{out}"
    );

    // JSON keeps the exact name.
    let j = common::kquant_json(&["inspect", fs, "--json"]);
    let names: Vec<&str> = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&EVIL), "{names:?}");

    let o = kquant(&["diff", fs, fs]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_no_raw_controls(&out, "diff");
    assert!(out.contains("evil\\x1b[2J"), "{out}");

    let out_dir = t.path().join("q");
    let o = kquant(&["quantize", fs, "-o", out_dir.to_str().unwrap(), "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_no_raw_controls(&out, "quantize --dry-run");
    assert!(out.contains("evil\\x1b[2J"), "{out}");

    // An error quoting the name: an index that does not list it.
    let ck = t.path().join("ck");
    std::fs::create_dir_all(&ck).unwrap();
    std::fs::copy(
        "fixtures/tiny/eagle3-vllm/config.json",
        ck.join("config.json"),
    )
    .unwrap();
    std::fs::copy(&f, ck.join("a.safetensors")).unwrap();
    std::fs::write(
        ck.join("model.safetensors.index.json"),
        r#"{"weight_map": {"plain.weight": "a.safetensors"}}"#,
    )
    .unwrap();
    let o = kquant(&["inspect", ck.to_str().unwrap()]);
    let e = assert_refused(&o, "index naming the evil tensor");
    assert_no_raw_controls(&e, "error");
    assert!(e.contains("evil\\x1b[2J"), "{e}");
}

// 6. Trace manifests.

const TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";

/// A copy of the fixture trace at `dir` (the shard linked, not copied) holding only samples 0
/// (code) and 20 (prose), with `edit` applied to its manifest.
fn small_trace(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    std::fs::create_dir_all(dir).unwrap();
    std::os::unix::fs::symlink(
        common::root().join(TRACE).join("shard-00000.safetensors"),
        dir.join("shard-00000.safetensors"),
    )
    .unwrap();
    let mut m = common::read_json(&Path::new(TRACE).join("manifest.json"));
    let keep: Vec<serde_json::Value> = m["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["id"] == 0 || s["id"] == 20)
        .cloned()
        .collect();
    m["samples"] = keep.into();
    edit(&mut m);
    std::fs::write(dir.join("manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
}

/// `kquant verify` on `trace` with the fixture target, plus `extra` (the fixture EAGLE-3 draft
/// unless `extra` names one).
fn verify_on(trace: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["verify"];
    if !extra.contains(&"--draft") {
        args.extend(["--draft", "fixtures/kimi-k2.5-tiny/eagle3"]);
    }
    args.extend([
        "--target-checkpoint",
        "fixtures/kimi-k2.5-tiny/target",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    args.extend_from_slice(extra);
    kquant(&args)
}

#[test]
fn trace_lengths_that_overflow_are_refused_with_their_true_values() {
    let t = tempfile::tempdir().unwrap();
    let cases: [(&str, u64, u64, &str); 3] = [
        (
            "sum",
            1 << 63,
            1 << 63,
            "prompt_len 9223372036854775808 + gen_len 9223372036854775808 overflows",
        ),
        (
            "sum-max",
            u64::MAX,
            1,
            "prompt_len 18446744073709551615 + gen_len 1 overflows",
        ),
        (
            "product",
            1 << 62,
            0,
            "4611686018427387904 tokens × hidden_size 256 overflows",
        ),
    ];
    for (name, p, g, want) in cases {
        let dir = t.path().join(name);
        small_trace(&dir, |m| {
            m["samples"][0]["prompt_len"] = p.into();
            m["samples"][0]["gen_len"] = g.into();
        });
        let e = assert_refused(&verify_on(&dir, &[]), name);
        assert!(e.contains(want), "{name}: {e}");
    }
}

/// Random mutations of the numeric and name fields of a valid manifest, each through the
/// binary: always a result (exit 0) or a refusal (exit 2), never a panic or a signal.
#[test]
fn mutated_trace_manifests_exit_0_or_2() {
    use serde_json::json;
    let t = tempfile::tempdir().unwrap();
    // Length fields get length-like values (edges of u64, sums that wrap); the other fields
    // any hostile value, wrong types included.
    let lengths: [&[&str]; 5] = [
        &["samples", "0", "prompt_len"],
        &["samples", "0", "gen_len"],
        &["samples", "1", "prompt_len"],
        &["samples", "1", "gen_len"],
        &["hidden_size"],
    ];
    let others: [&[&str]; 6] = [
        &["samples", "1", "id"],
        &["samples", "0", "shard"],
        &["num_layers"],
        &["vocab_size"],
        &["taps", "0"],
        &["shards", "0", "file"],
    ];
    let length_values = [
        json!(0),
        json!(1),
        json!(20),
        json!(96),
        json!(1u64 << 62),
        json!(1u64 << 63),
        json!(u64::MAX - 95),
        json!(u64::MAX),
    ];
    let values = [
        json!(0),
        json!(-1),
        json!(20),
        json!(u32::MAX),
        json!(u64::MAX),
        json!(1e300),
        json!("../shard-00000.safetensors"),
        json!(null),
    ];
    // Each case sets one to three fields, mostly lengths.
    type Case<'a> = Vec<(&'a [&'a str], serde_json::Value)>;
    let mut rng = Rng(0x005e_ed0f_7ace);
    let cases: Vec<Case> = (0..12)
        .map(|_| {
            let n = 1 + (rng.next() % 3) as usize;
            (0..n)
                .map(|_| match rng.next() % 3 {
                    0 => (rng.pick(&others), rng.pick(&values)),
                    _ => (rng.pick(&lengths), rng.pick(&length_values)),
                })
                .collect()
        })
        .collect();
    let outcomes: Vec<(String, Option<i32>, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .chunks(6)
            .enumerate()
            .map(|(k, chunk)| {
                let base = t.path().join(format!("w{k}"));
                s.spawn(move || {
                    let mut out = Vec::new();
                    for (i, case) in chunk.iter().enumerate() {
                        let dir = base.join(i.to_string());
                        small_trace(&dir, |m| {
                            for (path, value) in case {
                                let at = path.iter().fold(&mut *m, |v, key| {
                                    match key.parse::<usize>() {
                                        Ok(n) => &mut v[n],
                                        Err(_) => &mut v[*key],
                                    }
                                });
                                *at = value.clone();
                            }
                        });
                        let o = verify_on(&dir, &["--per-category", "1"]);
                        let what: Vec<String> =
                            case.iter().map(|(p, v)| format!("{p:?} = {v}")).collect();
                        out.push((what.join(", "), o.status.code(), stderr(&o)));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    for (what, code, err) in &outcomes {
        assert!(matches!(code, Some(0 | 2)), "{what}: exit {code:?}: {err}");
        if *code == Some(2) {
            assert!(
                err.starts_with("error:") && err.contains("hint:"),
                "{what}: {err}"
            );
        }
    }
    assert!(
        outcomes.iter().any(|o| o.1 == Some(2)),
        "no mutation was refused: {outcomes:?}"
    );
}

/// The seeds of the `hub_id` and `trace_manifest` fuzz targets are accepted by their parsers
/// (except the hostile hub ids, which are refused), and no prefix of any of them panics.
#[test]
fn new_fuzz_targets_seeds() {
    use kquant::io::hub::HubId;
    use kquant::trace::file::parse_manifest;
    let seeds = |kind: &str| {
        let mut v: Vec<_> = std::fs::read_dir(common::root().join("fuzz/seeds").join(kind))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        assert!(!v.is_empty(), "{kind}");
        v
    };
    for p in seeds("trace_manifest") {
        let b = std::fs::read(&p).unwrap();
        parse_manifest(&b).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        for end in 0..b.len() {
            let _ = parse_manifest(&b[..end]);
        }
    }
    for p in seeds("hub_id") {
        let s = std::fs::read_to_string(&p).unwrap();
        let hostile = ["absolute", "dotdot"].iter().any(|n| p.ends_with(n));
        assert_eq!(HubId::parse_checked(&s).is_err(), hostile, "{s}");
        for end in (0..s.len()).filter(|&e| s.is_char_boundary(e)) {
            let _ = HubId::parse_checked(&s[..end]);
        }
    }
}

// 7. Numeric flags and the verify gate.

/// Every numeric flag of every command with values it must refuse at parse time: not a
/// number, `nan`, infinities, negative, zero where it means nothing, past its cap, past u64.
/// Each must end in exit 2 with an `error:` line naming the flag and a `hint:` line.
#[test]
fn every_numeric_flag_refuses_bad_values() {
    const HUGE: &str = "99999999999999999999999999";
    let counts: &[&str] = &["0", "-1", "nan", "inf", "1.5", "x", "", HUGE];
    let verify = &["verify", "--draft", "d"][..];
    let calibrate = &["calibrate", "--draft", "d", "--trace", "t", "-o", "o"][..];
    let capture = &[
        "trace",
        "capture",
        "--target-checkpoint",
        "t",
        "--prompts",
        "p",
        "-o",
        "o",
    ][..];
    let import = &[
        "trace",
        "import",
        "--format",
        "vllm-hidden-states",
        "dir",
        "-o",
        "o",
    ][..];
    let import_ids = &[
        "trace",
        "import",
        "--format",
        "vllm-hidden-states",
        "dir",
        "-o",
        "o",
        "--layer-ids",
        "1",
    ][..];
    let replay = &["bench", "replay", "d"][..];
    let gemm = &["bench", "gemm"][..];
    let convert = &["convert", "eagle3", "s", "-o", "o", "--to", "vllm"][..];
    let sizes: &[&str] = &["0", "-1", "nan", "inf", "0.5", "x", "5XB"];
    let table: Vec<(&[&str], &str, Vec<&str>)> = vec![
        (verify, "--steps", [counts, &["33", "4294967297"]].concat()),
        (verify, "--limit", [counts, &["10000001"]].concat()),
        (
            verify,
            "--max-regression",
            vec![
                "nan", "NaN", "inf", "-inf", "1e309", "1001", "-1001", "x", "",
            ],
        ),
        (
            verify,
            "--min-accept",
            vec!["nan", "inf", "-inf", "-1", "34", "x"],
        ),
        (calibrate, "--limit", counts.to_vec()),
        (calibrate, "--steps", [counts, &["33"]].concat()),
        (
            capture,
            "--gen-len",
            [counts, &["1048577", "18446744073709551615"]].concat(),
        ),
        (capture, "--limit", counts.to_vec()),
        (capture, "--taps", vec!["-1", "nan", "4097", HUGE, "1,-2"]),
        (
            import,
            "--layer-ids",
            vec!["-1", "nan", "4097", HUGE, "1,x"],
        ),
        (import_ids, "--hidden-size", [counts, &["1048577"]].concat()),
        (import_ids, "--num-layers", [counts, &["4097"]].concat()),
        (
            replay,
            "--synthetic-trace",
            [counts, &["1", "1048577"]].concat(),
        ),
        (replay, "--prompt-len", [counts, &["1048576"]].concat()),
        (replay, "--samples", [counts, &["1000001"]].concat()),
        (replay, "--steps", [counts, &["33"]].concat()),
        (gemm, "--m", [counts, &["16385", "1,0"]].concat()),
        (gemm, "--rows", [counts, &["1048577"]].concat()),
        (gemm, "--group", [counts, &["1048577"]].concat()),
        (gemm, "--iters", [counts, &["100001"]].concat()),
        (
            &["bench", "quantize", "s"],
            "--repeat",
            [counts, &["1001"]].concat(),
        ),
        (
            &["bench", "convert", "s"],
            "--repeat",
            [counts, &["1001"]].concat(),
        ),
        (convert, "--steps", [counts, &["33"]].concat()),
        (
            convert,
            "--aux-layers",
            vec!["-2", "nan", "1.5", "4097", HUGE, "1,x"],
        ),
        (convert, "--max-shard-size", sizes.to_vec()),
        (
            &["quantize", "s", "-o", "o"],
            "--max-shard-size",
            sizes.to_vec(),
        ),
        (
            &["dequantize", "s", "-o", "o"],
            "--max-shard-size",
            sizes.to_vec(),
        ),
        (
            &[
                "quantize",
                "s",
                "-o",
                "o",
                "--method",
                "gptq",
                "--calibrate",
                "t",
            ],
            "--calibration-memory",
            sizes.to_vec(),
        ),
        (
            &[
                "quantize",
                "s",
                "-o",
                "o",
                "--method",
                "gptq",
                "--calibrate",
                "t",
            ],
            "--steps",
            [counts, &["33"]].concat(),
        ),
        (
            &["synth", "--preset", "p", "-o", "o"],
            "--max-shard-size",
            sizes.to_vec(),
        ),
        (
            &["diff", "a", "b"],
            "--min-sqnr",
            vec!["nan", "inf", "-inf", "1e309", "1001", "-1001", "x"],
        ),
    ];
    let mut runs = 0;
    for (base, flag, values) in &table {
        for v in values {
            let mut args = base.to_vec();
            let arg = format!("{flag}={v}");
            args.push(&arg);
            let o = kquant(&args);
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
            assert!(e.starts_with("error:"), "{args:?}: {e}");
            assert!(e.contains(flag), "{args:?}: the error names the flag: {e}");
            assert!(e.contains("\nhint:"), "{args:?}: {e}");
            runs += 1;
        }
    }
    assert!(runs > 200, "{runs}");
}

/// The fixture EAGLE-3 MLA draft against the EAGLE-3 one (the baseline) on `trace`.
fn verify_against_baseline(trace: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "--draft",
        "fixtures/kimi-k2.5-tiny/eagle3-mla",
        "--baseline",
        "fixtures/kimi-k2.5-tiny/eagle3",
    ];
    args.extend_from_slice(extra);
    verify_on(trace, &args)
}

/// A draft that fails the gate on the real trace (the MLA draft against the Llama one) must not
/// pass on nothing: `--limit 0`, a trace without samples, samples without generated tokens, or
/// thresholds that switch the gate off.
#[test]
fn a_verify_that_measured_nothing_is_never_a_pass() {
    let t = tempfile::tempdir().unwrap();
    let two = t.path().join("two");
    small_trace(&two, |_| {});
    let o = verify_against_baseline(&two, &[]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "fails on real samples: {}",
        stderr(&o)
    );

    let e = assert_refused(
        &verify_against_baseline(&two, &["--limit", "0"]),
        "--limit 0",
    );
    assert!(e.contains("--limit"), "{e}");

    let empty = t.path().join("empty");
    small_trace(&empty, |m| m["samples"] = serde_json::json!([]));
    let e = assert_refused(&verify_against_baseline(&empty, &[]), "no samples");
    assert!(e.contains("lists no samples"), "{e}");

    // Samples whose generated part is cut off: a prompt and nothing to predict.
    let nothing = t.path().join("nothing");
    small_trace(&nothing, |m| {
        for s in m["samples"].as_array_mut().unwrap() {
            let total = s["prompt_len"].as_u64().unwrap() + s["gen_len"].as_u64().unwrap();
            s["prompt_len"] = total.into();
            s["gen_len"] = 0.into();
        }
    });
    let e = assert_refused(
        &verify_against_baseline(&nothing, &[]),
        "no generated tokens",
    );
    assert!(e.contains("measured nothing"), "{e}");

    for (flag, v) in [
        ("--max-regression", "nan"),
        ("--max-regression", "inf"),
        ("--min-accept", "nan"),
    ] {
        let e = assert_refused(&verify_against_baseline(&two, &[flag, v]), flag);
        assert!(e.contains(flag) && e.contains("finite"), "{e}");
    }
}

// 8. Sizes that drive allocations.

/// `trace capture --gen-len` is bounded by a hard cap at parse time (a huge value used to
/// abort on allocation) and by the target's `max_position_embeddings` before any work.
#[test]
fn capture_gen_len_is_bounded() {
    let t = tempfile::tempdir().unwrap();
    // The tiny target with max_position_embeddings 16 (its shards linked, not copied).
    let target = t.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let src = common::root().join("fixtures/tiny/target-kimi-k2");
    for f in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ] {
        std::os::unix::fs::symlink(src.join(f), target.join(f)).unwrap();
    }
    let mut cfg = common::read_json(&src.join("config.json"));
    cfg["max_position_embeddings"] = 16.into();
    std::fs::write(
        target.join("config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    let prompts = t.path().join("p.jsonl");
    std::fs::write(&prompts, "{\"id\": 7, \"tokens\": [1, 2, 3]}\n").unwrap();
    let capture = |gen_len: &str, out: &str| {
        kquant(&[
            "trace",
            "capture",
            "--target-checkpoint",
            target.to_str().unwrap(),
            "--prompts",
            prompts.to_str().unwrap(),
            "-o",
            t.path().join(out).to_str().unwrap(),
            "--taps",
            "1",
            "--gen-len",
            gen_len,
        ])
    };
    for huge in ["18446744073709551615", "1048577"] {
        let e = assert_refused(&capture(huge, "huge"), huge);
        assert!(e.contains("--gen-len") && e.contains("1..=1048576"), "{e}");
    }
    let e = assert_refused(&capture("14", "long"), "past max_position_embeddings");
    assert!(
        e.contains(
            "prompt 7 has 3 tokens, and 3 + 14 exceeds the target's max_position_embeddings 16"
        ),
        "{e}"
    );
    assert!(e.contains("hint: lower --gen-len to at most 13"), "{e}");
    assert!(!t.path().join("long").exists());
    let o = capture("13", "fits");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let m = common::read_json(&t.path().join("fits/manifest.json"));
    assert_eq!(m["samples"][0]["gen_len"], 13);
}

/// `bench replay` and `bench gemm` refuse, before allocating, sizes whose product is past
/// their caps although each flag is within its own range.
#[test]
fn bench_sizes_are_bounded_before_allocating() {
    let o = timed(
        &[
            "bench",
            "replay",
            "fixtures/kimi-k2.5-tiny/eagle3",
            "--target-checkpoint",
            "fixtures/kimi-k2.5-tiny/target",
            "--synthetic-trace",
            "1048576",
            "--samples",
            "1000000",
        ],
        Duration::from_secs(10),
    );
    let e = assert_refused(&o, "synthetic trace too large");
    assert!(e.contains("synthetic trace of 1000000 sample(s)"), "{e}");
    let o = timed(
        &[
            "bench",
            "gemm",
            "--shapes",
            "1048576x1048576",
            "--rows",
            "1048576",
            "--m",
            "1",
        ],
        Duration::from_secs(10),
    );
    let e = assert_refused(&o, "gemm shape too large");
    assert!(e.contains("more than 4294967296 elements"), "{e}");
}

/// A config whose aux-layer id is i64::MAX: converting it between conventions (+1) overflowed
/// (a panic in debug builds); now the config is refused, naming the key.
#[test]
fn absurd_aux_layer_ids_in_a_config_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("draft");
    std::fs::create_dir_all(&d).unwrap();
    let src = common::root().join("fixtures/tiny/eagle3-specforge");
    std::os::unix::fs::symlink(src.join("model.safetensors"), d.join("model.safetensors")).unwrap();
    let mut cfg = common::read_json(&src.join("config.json"));
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = serde_json::json!([1, i64::MAX]);
    std::fs::write(d.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    let e = assert_refused(&kquant(&["inspect", d.to_str().unwrap()]), "aux id");
    assert!(
        e.contains("eagle_config.eagle_aux_hidden_state_layer_ids")
            && e.contains("9223372036854775807"),
        "{e}"
    );
}

/// Every prompt file kquant reads (`verify --endpoint --prompts`, `trace capture --prompts`,
/// `trace prompts --input`, `trace import --prompts`), and the tokenizer it reads with, is
/// refused at once when it is `/dev/zero` (an endless line) or a FIFO no one writes (a read that
/// would block forever): the regular-file and size checks checkpoints get. A run past a minute
/// is killed and fails the test.
#[test]
fn prompt_files_that_never_end_are_refused_at_once() {
    let t = tempfile::tempdir().unwrap();
    let fifo = t.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = t.path().join("out");
    let (o, tgt) = (out.to_str().unwrap(), "fixtures/kimi-k2.5-tiny/target");
    let hs = t.path().join("hs");
    std::fs::create_dir(&hs).unwrap();
    for bad in ["/dev/zero", fifo.to_str().unwrap()] {
        let cases: Vec<Vec<&str>> = vec![
            vec![
                "verify",
                "--endpoint",
                "http://127.0.0.1:9",
                "--prompts",
                bad,
            ],
            vec![
                "trace",
                "capture",
                "--target-checkpoint",
                tgt,
                "--prompts",
                bad,
                "-o",
                o,
            ],
            vec![
                "trace",
                "prompts",
                "--tokenizer",
                tgt,
                "--prompts",
                bad,
                "-o",
                o,
            ],
            vec![
                "trace",
                "prompts",
                "--tokenizer",
                bad,
                "--prompts",
                "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl",
                "-o",
                o,
            ],
        ];
        for args in cases {
            let mut child = kquant_cmd()
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let t0 = Instant::now();
            while child.try_wait().unwrap().is_none() {
                if t0.elapsed() > Duration::from_secs(60) {
                    let _ = child.kill();
                    panic!("{args:?} was still reading after a minute");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let o = child.wait_with_output().unwrap();
            let e = assert_refused(&o, &format!("{args:?}"));
            assert!(e.contains("not a regular file"), "{args:?}: {e}");
            assert!(!out.exists());
        }
    }
}

// #38.11/12: hostile dimensions in a config.

/// A copy of the fixture checkpoint `dir` in `t/name` with `edits` applied to its config.json
/// (only config.json and the weights: what a runtime reads).
fn planted(t: &Path, name: &str, dir: &str, edits: &[(&str, serde_json::Value)]) -> String {
    let src = common::root().join(dir);
    let out = t.join(name);
    std::fs::create_dir(&out).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), out.join(e.file_name())).unwrap();
    }
    let mut cfg: serde_json::Value = common::read_json(&out.join("config.json"));
    for (k, v) in edits {
        cfg[*k] = v.clone();
    }
    std::fs::write(out.join("config.json"), cfg.to_string()).unwrap();
    out.to_str().unwrap().to_string()
}

/// `kquant verify` of `draft` on the tiny fixture trace, one prompt of each category, and
/// `extra` flags.
fn verify_on_tiny(draft: &str, extra: &[&str]) -> Output {
    let mut a = vec![
        "verify",
        "--target",
        "kimi-k2.5-tiny",
        "--trace",
        "fixtures/kimi-k2.5-tiny/trace",
        "--per-category",
        "1",
        "--draft",
        draft,
    ];
    a.extend_from_slice(extra);
    kquant(&a)
}

/// A head count or head dimension whose products wrap a `usize`, and a rope dimension that
/// would size a 2 TB table: for every draft family (replayed by `verify`) and every target
/// (run by `trace capture`) a clean `error:` naming the key, exit 2, never a panic or an abort.
/// So is an `eos_token_id` that does not fit a token id (it used to wrap to another token).
#[test]
fn wrapping_dimensions_in_a_config_are_refused_for_every_family() {
    use serde_json::json;
    let t = tempfile::tempdir().unwrap();
    let wrap = json!(1u64 << 62);
    let drafts = [
        (
            "eagle3",
            "fixtures/kimi-k2.5-tiny/eagle3",
            vec![
                ("num_attention_heads", wrap.clone()),
                ("num_key_value_heads", json!(2)),
            ],
        ),
        (
            "eagle3-head-dim",
            "fixtures/kimi-k2.5-tiny/eagle3",
            vec![("head_dim", wrap.clone())],
        ),
        (
            "eagle3-mla",
            "fixtures/kimi-k2.5-tiny/eagle3-mla",
            vec![("qk_rope_head_dim", json!(1u64 << 40))],
        ),
        (
            "dflash",
            "fixtures/kimi-k2.5-tiny/dflash",
            vec![
                ("num_attention_heads", wrap.clone()),
                ("num_key_value_heads", json!(2)),
            ],
        ),
    ];
    for (name, dir, edits) in drafts {
        let d = planted(t.path(), name, dir, &edits);
        let o = verify_on_tiny(
            &d,
            &["--target-checkpoint", "fixtures/kimi-k2.5-tiny/target"],
        );
        let e = assert_refused(&o, name);
        assert!(e.contains(edits[0].0), "{name}: {e}");
    }
    let targets = [
        (
            "k2-rope",
            "fixtures/kimi-k2.5-tiny/target",
            "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl",
            ("qk_rope_head_dim", json!(1u64 << 40)),
        ),
        (
            "k2-heads",
            "fixtures/kimi-k2.5-tiny/target",
            "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl",
            ("num_attention_heads", wrap.clone()),
        ),
        (
            "k2-eos",
            "fixtures/kimi-k2.5-tiny/target",
            "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl",
            ("eos_token_id", json!((1u64 << 32) + 5)),
        ),
        (
            "kl-rope",
            "fixtures/kimi-linear-tiny/target",
            "fixtures/kimi-linear-tiny/prompts/heldout.jsonl",
            ("qk_rope_head_dim", json!(1u64 << 40)),
        ),
        (
            "kl-heads",
            "fixtures/kimi-linear-tiny/target",
            "fixtures/kimi-linear-tiny/prompts/heldout.jsonl",
            ("num_attention_heads", wrap.clone()),
        ),
    ];
    for (name, dir, prompts, edit) in targets {
        let d = planted(t.path(), name, dir, std::slice::from_ref(&edit));
        let out = t.path().join(format!("{name}-trace"));
        let o = kquant(&[
            "trace",
            "capture",
            "--target-checkpoint",
            &d,
            "--prompts",
            prompts,
            "--per-category",
            "1",
            "--gen-len",
            "2",
            "-o",
            out.to_str().unwrap(),
        ]);
        let e = assert_refused(&o, name);
        assert!(e.contains(edit.0), "{name}: {e}");
        assert!(!out.exists(), "{name}");
    }
}

// #38.4: NaN in a target or a trace.

/// Write bf16 NaN (0x7fc0) over every value of tensor `name` in the safetensors file `f`.
fn plant_nan(f: &Path, name: &str) {
    let mut bytes = std::fs::read(f).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &h[name];
    assert_eq!(t["dtype"], "BF16", "{name}");
    let (a, b) = (
        t["data_offsets"][0].as_u64().unwrap() as usize,
        t["data_offsets"][1].as_u64().unwrap() as usize,
    );
    for v in bytes[8 + n + a..8 + n + b].chunks_exact_mut(2) {
        v.copy_from_slice(&0x7fc0u16.to_le_bytes());
    }
    std::fs::write(f, bytes).unwrap();
}

/// One NaN in a target made a failing draft pass: `trace capture` wrote all-NaN taps and a
/// continuation of argmaxes over NaN (token 0 everywhere), which the draft "predicted". Now the
/// capture is refused (no trace written), and a trace whose taps hold a NaN is refused by
/// `verify` (exit 2, never a pass), even when its shard hashes were made to match.
#[test]
fn a_nan_in_the_target_or_the_trace_never_passes_a_gate() {
    use sha2::{Digest, Sha256};
    let t = tempfile::tempdir().unwrap();
    let target = planted(t.path(), "target", "fixtures/kimi-k2.5-tiny/target", &[]);
    plant_nan(
        &Path::new(&target).join("model.safetensors"),
        "model.layers.1.input_layernorm.weight",
    );
    let out = t.path().join("trace");
    let o = kquant(&[
        "trace",
        "capture",
        "--target-checkpoint",
        &target,
        "--prompts",
        "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl",
        "--per-category",
        "1",
        "--gen-len",
        "4",
        "-o",
        out.to_str().unwrap(),
    ]);
    let e = assert_refused(&o, "capture from a NaN target");
    assert!(e.contains("not finite"), "{e}");
    assert!(!out.exists());

    // The fixture trace with sample 0's first tap NaN, its manifest's hash made to match.
    let tr = t.path().join("nan-trace");
    std::fs::create_dir(&tr).unwrap();
    let fix = common::root().join("fixtures/kimi-k2.5-tiny/trace");
    for f in ["manifest.json", "shard-00000.safetensors"] {
        std::fs::copy(fix.join(f), tr.join(f)).unwrap();
    }
    let shard = tr.join("shard-00000.safetensors");
    plant_nan(&shard, "s0.tap.1");
    let mut m: serde_json::Value = common::read_json(&tr.join("manifest.json"));
    m["shards"][0]["sha256"] =
        format!("{:x}", Sha256::digest(std::fs::read(&shard).unwrap())).into();
    std::fs::write(tr.join("manifest.json"), m.to_string()).unwrap();
    let o = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5-tiny",
        "--trace",
        tr.to_str().unwrap(),
        "--draft",
        "fixtures/kimi-k2.5-tiny/eagle3",
        "--per-category",
        "2",
        "--min-accept",
        "1.5",
    ]);
    let e = assert_refused(&o, "verify on a NaN trace");
    assert!(e.contains("sample 0") && e.contains("not finite"), "{e}");
}

/// A `d2t` offset that maps a draft id outside the target's vocabulary (here past `i64`) used
/// to wrap to another token silently; now the tensor and the id are named, exit 2.
#[test]
fn a_hostile_d2t_is_named() {
    let t = tempfile::tempdir().unwrap();
    let d = planted(t.path(), "eagle3", "fixtures/kimi-k2.5-tiny/eagle3", &[]);
    let f = Path::new(&d).join("model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(h["d2t"]["dtype"], "I64");
    let a = 8 + n + h["d2t"]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[a + 8 * 7..a + 8 * 8].copy_from_slice(&i64::MAX.to_le_bytes());
    std::fs::write(&f, bytes).unwrap();
    let o = verify_on_tiny(&d, &[]);
    let e = assert_refused(&o, "hostile d2t");
    assert!(e.contains("`d2t`") && e.contains("draft id 7"), "{e}");
}

/// Samples longer than the draft's `max_position_embeddings` used to be replayed without a
/// word; now a `warning:` says how many and which first (the replay still runs).
#[test]
fn samples_past_the_drafts_positions_are_said() {
    let t = tempfile::tempdir().unwrap();
    let d = planted(
        t.path(),
        "eagle3",
        "fixtures/kimi-k2.5-tiny/eagle3",
        &[("max_position_embeddings", serde_json::json!(64))],
    );
    let o = verify_on_tiny(&d, &[]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(
        e.contains("warning:") && e.contains("max_position_embeddings (64)"),
        "{e}"
    );
}
