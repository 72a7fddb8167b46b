//! `kquant trace import --format vllm-hidden-states` through the binary: connector-like files
//! (written with the `safetensors` crate, as vLLM's `save_file` writes them) in both layouts and
//! in BF16/F16/F32 import to exactly the values they hold (rounded to BF16); malformed files
//! are refused with exit 2 naming the file; and the tiny fixture's trace, written out as vLLM
//! connector files, imports back to the same tokens and taps.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{kquant, root};
use kquant::verify::trace::Trace;
use safetensors::tensor::{serialize_to_file, TensorView};
use safetensors::Dtype as StDtype;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    TapsFirst,
    TokensFirst,
}

/// A value that names its slot, position and channel (so a mix-up shows), with a fractional
/// part BF16 cannot hold exactly when `fine` is set.
fn val(j: usize, t: usize, c: usize, fine: bool) -> f32 {
    let base = (j as f32 + 1.0) * 8.0 + t as f32 * 0.25 - c as f32 * 0.5;
    if fine {
        base + 0.001 * (c as f32 + 1.0)
    } else {
        base
    }
}

/// `taps[j]` as `[T, H]` rows.
fn taps_for(n: usize, t: usize, h: usize, fine: bool) -> Vec<Vec<f32>> {
    (0..n)
        .map(|j| {
            (0..t)
                .flat_map(|p| (0..h).map(move |c| val(j, p, c, fine)))
                .collect()
        })
        .collect()
}

fn encode(dtype: StDtype, v: &[f32]) -> Vec<u8> {
    match dtype {
        StDtype::BF16 => v
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        StDtype::F16 => v
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        StDtype::F32 => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        d => panic!("{d:?}"),
    }
}

/// What a stored value reads back as: the source dtype's value, rounded to BF16.
fn expect(dtype: StDtype, x: f32) -> f32 {
    let src = match dtype {
        StDtype::F16 => half::f16::from_f32(x).to_f32(),
        StDtype::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    };
    half::bf16::from_f32(src).to_f32()
}

/// Stack `taps` the way vLLM does in `layout`.
fn stack(taps: &[Vec<f32>], t: usize, h: usize, layout: Layout) -> (Vec<usize>, Vec<f32>) {
    let n = taps.len();
    match layout {
        Layout::TapsFirst => (vec![n, t, h], taps.concat()),
        Layout::TokensFirst => {
            let mut v = Vec::with_capacity(n * t * h);
            for p in 0..t {
                for tap in taps {
                    v.extend_from_slice(&tap[p * h..(p + 1) * h]);
                }
            }
            (vec![t, n, h], v)
        }
    }
}

/// One connector file from raw parts (any names, dtypes and shapes).
fn write_raw(path: &Path, tensors: Vec<(&str, StDtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    serialize_to_file(views, Some(meta), path).unwrap();
}

fn bf(v: &[f32]) -> Vec<u8> {
    encode(StDtype::BF16, v)
}

fn i64_bytes(tokens: &[u32]) -> Vec<u8> {
    tokens
        .iter()
        .flat_map(|&t| (t as i64).to_le_bytes())
        .collect()
}

/// A connector file `{req_id}.safetensors`: `hidden_states` stacked in `layout`, `token_ids` I64.
fn write_conn(
    dir: &Path,
    req_id: &str,
    taps: &[Vec<f32>],
    tokens: &[u32],
    h: usize,
    layout: Layout,
    dtype: StDtype,
) -> PathBuf {
    let (shape, v) = stack(taps, tokens.len(), h, layout);
    let p = dir.join(format!("{req_id}.safetensors"));
    write_raw(
        &p,
        vec![
            ("hidden_states", dtype, shape, encode(dtype, &v)),
            (
                "token_ids",
                StDtype::I64,
                vec![tokens.len()],
                i64_bytes(tokens),
            ),
        ],
    );
    // The connector's lock companion, which the importer must skip.
    std::fs::write(dir.join(format!("{req_id}.safetensors.lock")), b"").unwrap();
    p
}

fn import(src: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "trace",
        "import",
        "--format",
        "vllm-hidden-states",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    kquant(&args)
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn refused(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    err
}

const H: usize = 8;

#[test]
fn both_layouts_and_three_dtypes_import_exactly() {
    // vLLM ids given out of order: the stack holds them ascending (hs[1], hs[2], hs[4]).
    let ids = "4,1,2";
    let hs = [1usize, 2, 4];
    let lens = [5usize, 7, 3];
    for (layout, dtype, force_layout) in [
        (Layout::TapsFirst, StDtype::BF16, None),
        (Layout::TokensFirst, StDtype::BF16, None),
        (Layout::TokensFirst, StDtype::F16, Some("tokens-first")),
        (Layout::TapsFirst, StDtype::F32, Some("taps-first")),
        (Layout::TokensFirst, StDtype::F32, None),
    ] {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("hs");
        std::fs::create_dir(&src).unwrap();
        let fine = dtype != StDtype::BF16;
        let mut want = Vec::new();
        for (r, &t) in lens.iter().enumerate() {
            let taps = taps_for(3, t, H, fine);
            // Shift each request's values so requests cannot be swapped unnoticed.
            let taps: Vec<Vec<f32>> = taps
                .into_iter()
                .map(|v| v.into_iter().map(|x| x + 100.0 * r as f32).collect())
                .collect();
            let tokens: Vec<u32> = (0..t as u32).map(|i| 3 * i + r as u32).collect();
            // Request ids 10, 2, 33: the import orders them numerically.
            let rid = ["10", "2", "33"][r];
            write_conn(&src, rid, &taps, &tokens, H, layout, dtype);
            want.push((rid.parse::<u64>().unwrap(), tokens, taps));
        }
        want.sort_by_key(|w| w.0);
        let prompts = d.path().join("prompts.jsonl");
        // File order (numeric request ids 2, 10, 33), no keys.
        std::fs::write(
            &prompts,
            "{\"prompt_len\": 2, \"category\": \"code\"}\n{\"prompt_len\": 4, \"category\": \"math\", \"dataset\": \"gsm8k\"}\n\n{\"prompt_len\": 1, \"category\": \"chat\", \"finish_reason\": \"stop\"}\n",
        )
        .unwrap();
        let out = d.path().join("trace");
        let mut extra = vec![
            "--layer-ids",
            ids,
            "--num-layers",
            "4",
            "--prompts",
            prompts.to_str().unwrap(),
        ];
        if let Some(l) = force_layout {
            extra.extend_from_slice(&["--layout", l]);
        }
        let err = ok(&import(&src, &out, &extra));
        assert!(err.contains("not ascending"), "{err}");
        if dtype != StDtype::BF16 {
            assert!(err.contains("rounded"), "{err}");
        }
        let tr = Trace::open(&out).unwrap();
        let m = &tr.manifest;
        assert_eq!(m.taps, hs.to_vec());
        assert_eq!((m.hidden_size, m.num_layers), (H, 4));
        assert_eq!(
            m.target["import"]["layout"],
            match layout {
                Layout::TapsFirst => "taps-first",
                Layout::TokensFirst => "tokens-first",
            }
        );
        assert_eq!(m.samples.len(), 3);
        let meta = [
            (2, "code", "", "unknown"),
            (4, "math", "gsm8k", "unknown"),
            (1, "chat", "", "stop"),
        ];
        for ((s, (id, tokens, taps)), (p, cat, ds, fin)) in m.samples.iter().zip(&want).zip(meta) {
            assert_eq!(s.id, *id);
            assert_eq!((s.prompt_len, s.gen_len), (p, tokens.len() - p));
            assert_eq!(
                (
                    s.category.as_str(),
                    s.dataset.as_str(),
                    s.finish_reason.as_str()
                ),
                (cat, ds, fin)
            );
            assert_eq!(&tr.tokens(s).unwrap(), tokens);
            for (j, &i) in hs.iter().enumerate() {
                let got = tr.tap(s, i).unwrap();
                let exp: Vec<f32> = taps[j].iter().map(|&x| expect(dtype, x)).collect();
                assert_eq!(got, exp, "{layout:?} {dtype:?} sample {id} hs[{i}]");
            }
        }
        // The F32 cases really round (the check above is not vacuous).
        if dtype == StDtype::F32 {
            assert_ne!(expect(dtype, want[0].2[0][0]), want[0].2[0][0]);
        }
    }
}

/// `--out` is the old spelling of `--output`: accepted for one release, with a warning, and the
/// trace is the same.
#[test]
fn deprecated_out_spelling_still_imports_with_a_warning() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("hs");
    std::fs::create_dir(&src).unwrap();
    let tokens: Vec<u32> = (0..5).collect();
    write_conn(
        &src,
        "1",
        &taps_for(2, 5, H, false),
        &tokens,
        H,
        Layout::TokensFirst,
        StDtype::BF16,
    );
    let base = |flag: &str, out: &Path| {
        kquant(&[
            "trace",
            "import",
            "--format",
            "vllm-hidden-states",
            src.to_str().unwrap(),
            flag,
            out.to_str().unwrap(),
            "--layer-ids",
            "1,2",
            "--num-layers",
            "4",
        ])
    };
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    let new = ok(&base("--output", &a));
    assert!(!new.contains("deprecated"), "{new}");
    let old = ok(&base("--out", &b));
    assert!(
        old.contains("warning: `--out` is deprecated: write `--output`"),
        "{old}"
    );
    let (x, y) = (
        std::fs::read_to_string(a.join("manifest.json")).unwrap(),
        std::fs::read_to_string(b.join("manifest.json")).unwrap(),
    );
    assert_eq!(
        x.replace(a.to_str().unwrap(), "X"),
        y.replace(b.to_str().unwrap(), "X")
    );
}

#[test]
fn a_square_file_takes_the_layout_of_its_siblings_and_alone_is_ambiguous() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("hs");
    std::fs::create_dir(&src).unwrap();
    // Request 0: T = 3 = n_taps (fits both layouts); request 1: T = 5 shows tokens-first.
    let sq = taps_for(3, 3, H, false);
    write_conn(
        &src,
        "0",
        &sq,
        &[1, 2, 3],
        H,
        Layout::TokensFirst,
        StDtype::BF16,
    );
    let long = taps_for(3, 5, H, false);
    write_conn(
        &src,
        "1",
        &long,
        &[1, 2, 3, 4, 5],
        H,
        Layout::TokensFirst,
        StDtype::BF16,
    );
    let out = d.path().join("t");
    let err = ok(&import(
        &src,
        &out,
        &["--layer-ids", "1,2,3", "--num-layers", "4"],
    ));
    assert!(err.contains("fits both layouts"), "{err}");
    assert!(err.contains("no --prompts"), "{err}");
    let tr = Trace::open(&out).unwrap();
    let s = &tr.manifest.samples[0];
    assert_eq!((s.prompt_len, s.gen_len), (1, 2));
    assert_eq!(tr.tap(s, 2).unwrap(), sq[1]);

    // Alone, the square file cannot be read without --layout.
    std::fs::remove_file(src.join("1.safetensors")).unwrap();
    let err = refused(&import(
        &src,
        &d.path().join("u"),
        &["--layer-ids", "1,2,3", "--num-layers", "4"],
    ));
    assert!(
        err.contains("0.safetensors") && err.contains("--layout"),
        "{err}"
    );
    assert!(!d.path().join("u").exists());
    // With it, both readings are possible and give different taps.
    let a = d.path().join("a");
    ok(&import(
        &src,
        &a,
        &[
            "--layer-ids",
            "1,2,3",
            "--num-layers",
            "4",
            "--layout",
            "tokens-first",
        ],
    ));
    let b = d.path().join("b");
    ok(&import(
        &src,
        &b,
        &[
            "--layer-ids",
            "1,2,3",
            "--num-layers",
            "4",
            "--layout",
            "taps-first",
        ],
    ));
    let (ta, tb) = (Trace::open(&a).unwrap(), Trace::open(&b).unwrap());
    let (sa, sb) = (&ta.manifest.samples[0], &tb.manifest.samples[0]);
    assert_eq!(ta.tap(sa, 2).unwrap(), sq[1]);
    assert_ne!(tb.tap(sb, 2).unwrap(), sq[1]);
}

/// A directory holding one good request (`0`) and one built by `bad` (`7`).
fn with_bad(bad: impl FnOnce(&Path)) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("hs");
    std::fs::create_dir(&src).unwrap();
    write_conn(
        &src,
        "0",
        &taps_for(3, 4, H, false),
        &[1, 2, 3, 4],
        H,
        Layout::TokensFirst,
        StDtype::BF16,
    );
    bad(&src);
    (d, src)
}

#[test]
fn malformed_files_are_refused_with_exit_2_naming_the_file() {
    let ids = ["--layer-ids", "1,2,3", "--num-layers", "4"];
    type Case = (&'static str, Box<dyn FnOnce(&Path)>, &'static str);
    let cases: Vec<Case> = vec![
        (
            "T mismatch",
            Box::new(|s: &Path| {
                let (shape, v) = stack(&taps_for(3, 6, H, false), 6, H, Layout::TokensFirst);
                write_raw(
                    &s.join("7.safetensors"),
                    vec![
                        ("hidden_states", StDtype::BF16, shape, bf(&v)),
                        (
                            "token_ids",
                            StDtype::I64,
                            vec![5],
                            i64_bytes(&[1, 2, 3, 4, 5]),
                        ),
                    ],
                );
            }),
            "T = 5",
        ),
        (
            "rank 2",
            Box::new(|s: &Path| {
                let v = taps_for(3, 5, H, false).concat();
                write_raw(
                    &s.join("7.safetensors"),
                    vec![
                        ("hidden_states", StDtype::BF16, vec![5, 3 * H], bf(&v)),
                        (
                            "token_ids",
                            StDtype::I64,
                            vec![5],
                            i64_bytes(&[1, 2, 3, 4, 5]),
                        ),
                    ],
                );
            }),
            "is rank 2",
        ),
        (
            "NaN",
            Box::new(|s: &Path| {
                let mut t = taps_for(3, 5, H, false);
                t[2][3 * H + 4] = f32::NAN;
                write_conn(
                    s,
                    "7",
                    &t,
                    &[1, 2, 3, 4, 5],
                    H,
                    Layout::TokensFirst,
                    StDtype::F32,
                );
            }),
            "NaN at tap slot 2 (hs[3]), token position 3, channel 4",
        ),
        (
            "inf",
            Box::new(|s: &Path| {
                let mut t = taps_for(3, 5, H, false);
                t[0][0] = f32::INFINITY;
                write_conn(
                    s,
                    "7",
                    &t,
                    &[1, 2, 3, 4, 5],
                    H,
                    Layout::TokensFirst,
                    StDtype::BF16,
                );
            }),
            "inf at tap slot 0 (hs[1]), token position 0",
        ),
        (
            "mixed layouts",
            Box::new(|s: &Path| {
                let t = taps_for(3, 5, H, false);
                write_conn(
                    s,
                    "7",
                    &t,
                    &[1, 2, 3, 4, 5],
                    H,
                    Layout::TapsFirst,
                    StDtype::BF16,
                );
            }),
            "the directory mixes vLLM versions",
        ),
        (
            "missing token_ids",
            Box::new(|s: &Path| {
                let (shape, v) = stack(&taps_for(3, 5, H, false), 5, H, Layout::TokensFirst);
                write_raw(
                    &s.join("7.safetensors"),
                    vec![("hidden_states", StDtype::BF16, shape, bf(&v))],
                );
            }),
            "has no `token_ids` tensor",
        ),
        (
            "missing hidden_states",
            Box::new(|s: &Path| {
                write_raw(
                    &s.join("7.safetensors"),
                    vec![("token_ids", StDtype::I64, vec![2], i64_bytes(&[1, 2]))],
                );
            }),
            "has no `hidden_states` tensor",
        ),
        (
            "integer hidden states",
            Box::new(|s: &Path| {
                write_raw(
                    &s.join("7.safetensors"),
                    vec![
                        (
                            "hidden_states",
                            StDtype::I32,
                            vec![5, 3, H],
                            vec![0; 5 * 3 * H * 4],
                        ),
                        (
                            "token_ids",
                            StDtype::I64,
                            vec![5],
                            i64_bytes(&[1, 2, 3, 4, 5]),
                        ),
                    ],
                );
            }),
            "is I32, expected BF16, F16 or F32",
        ),
        (
            "float token ids",
            Box::new(|s: &Path| {
                let (shape, v) = stack(&taps_for(3, 2, H, false), 2, H, Layout::TokensFirst);
                write_raw(
                    &s.join("7.safetensors"),
                    vec![
                        ("hidden_states", StDtype::BF16, shape, bf(&v)),
                        (
                            "token_ids",
                            StDtype::F32,
                            vec![2],
                            encode(StDtype::F32, &[1.0, 2.0]),
                        ),
                    ],
                );
            }),
            "expected an integer type",
        ),
        (
            "negative token",
            Box::new(|s: &Path| {
                let (shape, v) = stack(&taps_for(3, 2, H, false), 2, H, Layout::TokensFirst);
                write_raw(
                    &s.join("7.safetensors"),
                    vec![
                        ("hidden_states", StDtype::BF16, shape, bf(&v)),
                        (
                            "token_ids",
                            StDtype::I64,
                            vec![2],
                            [1i64, -5].iter().flat_map(|t| t.to_le_bytes()).collect(),
                        ),
                    ],
                );
            }),
            "position 1 holds token -5",
        ),
        (
            "another hidden size",
            Box::new(|s: &Path| {
                write_conn(
                    s,
                    "7",
                    &taps_for(3, 4, 2 * H, false),
                    &[1, 2, 3, 4],
                    2 * H,
                    Layout::TokensFirst,
                    StDtype::BF16,
                );
            }),
            "has hidden size 16, but",
        ),
        (
            "empty token ids",
            Box::new(|s: &Path| {
                write_raw(
                    &s.join("7.safetensors"),
                    vec![
                        ("hidden_states", StDtype::BF16, vec![0, 3, H], vec![]),
                        ("token_ids", StDtype::I64, vec![0], vec![]),
                    ],
                );
            }),
            "is empty",
        ),
        (
            "zstd-compressed",
            Box::new(|s: &Path| std::fs::write(s.join("7.safetensors.zst"), b"(zstd)").unwrap()),
            "zstd-compressed",
        ),
        (
            "truncated",
            Box::new(|s: &Path| std::fs::write(s.join("7.safetensors"), b"\x10\0\0").unwrap()),
            "invalid safetensors",
        ),
    ];
    for (what, make, needle) in cases {
        let (d, src) = with_bad(make);
        let out = d.path().join("trace");
        let err = refused(&import(&src, &out, &ids));
        assert!(err.contains("7.safetensors"), "{what}: {err}");
        assert!(err.contains(needle), "{what}: {err}");
        assert!(!out.exists(), "{what}: nothing may be written");
        // A value refused mid-stream (after request 0 was written) leaves no partial trace.
        let left: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "hs")
            .collect();
        assert!(left.is_empty(), "{what}: left {left:?}");
    }
}

#[test]
fn bad_arguments_and_prompts_are_refused() {
    let (d, src) = with_bad(|s| {
        write_conn(
            s,
            "1-ab12",
            &taps_for(3, 5, H, false),
            &[5, 6, 7, 8, 9],
            H,
            Layout::TokensFirst,
            StDtype::BF16,
        );
    });
    let out = d.path().join("trace");
    let o = out.to_str().unwrap();
    let run = |extra: &[&str]| import(&src, &out, extra);
    // Usage errors.
    let e = refused(&run(&["--layer-ids", "1,2,2", "--num-layers", "4"]));
    assert!(e.contains("twice"), "{e}");
    let e = refused(&run(&["--layer-ids", "1,2,5", "--num-layers", "4"]));
    assert!(e.contains("past the last hidden state"), "{e}");
    let e = refused(&run(&["--layer-ids", "1,2,3"]));
    assert!(e.contains("--target") && e.contains("--num-layers"), "{e}");
    let e = refused(&run(&[
        "--layer-ids",
        "1,2,3",
        "--target",
        "kimi-k2.5-tiny",
        "--num-layers",
        "5",
    ]));
    assert!(e.contains("disagrees"), "{e}");
    let e = refused(&run(&["--layer-ids", "1,2", "--num-layers", "4"]));
    assert!(e.contains("--layer-ids gives 2 taps"), "{e}");
    let e = refused(&run(&[
        "--layer-ids",
        "1,2,3",
        "--num-layers",
        "4",
        "--hidden-size",
        "16",
    ]));
    assert!(e.contains("has hidden size 8, but --hidden-size"), "{e}");
    let e = refused(&run(&[
        "--layer-ids",
        "1,2,3",
        "--num-layers",
        "4",
        "--layout",
        "taps-first",
    ]));
    assert!(
        e.contains("0.safetensors") && e.contains("not the --layout taps-first shape [3, 4, 8]"),
        "{e}"
    );
    // The profile's vocabulary (2048) bounds the tokens; its hidden size (256) the taps.
    let e = refused(&run(&[
        "--layer-ids",
        "1,2,3",
        "--target",
        "kimi-k2.5-tiny",
    ]));
    assert!(e.contains("has hidden size 8"), "{e}");

    // Prompts: keyed by req_id (the leading number of `1-ab12` matches too), tokens checked.
    let p = d.path().join("p.jsonl");
    let base = [
        "--layer-ids",
        "1,2,3",
        "--num-layers",
        "4",
        "--prompts",
        p.to_str().unwrap(),
    ];
    std::fs::write(&p, "{\"req_id\": \"1\", \"tokens\": [5, 6], \"category\": \"b\"}\n{\"req_id\": 0, \"prompt_len\": 3, \"category\": \"a\"}\n").unwrap();
    ok(&run(&base));
    let tr = Trace::open(&out).unwrap();
    let got: Vec<(u64, usize, &str)> = tr
        .manifest
        .samples
        .iter()
        .map(|s| (s.id, s.prompt_len, s.category.as_str()))
        .collect();
    assert_eq!(got, vec![(0, 3, "a"), (1, 2, "b")]);
    assert_eq!(
        tr.manifest.target["import"]["req_ids"],
        serde_json::json!(["0", "1-ab12"])
    );
    // An existing output needs --force.
    let e = refused(&run(&base));
    assert!(e.contains("already exists") && e.contains(o), "{e}");
    let mut forced = base.to_vec();
    forced.push("--force");
    ok(&run(&forced));
    for (body, needle) in [
        ("{\"req_id\": \"1\", \"tokens\": [5, 7]}\n{\"req_id\": 0, \"prompt_len\": 3}\n", "differs from the prompt tokens of its --prompts record at position 1 (6 vs 7)"),
        ("{\"req_id\": \"1\", \"prompt_len\": 9}\n{\"req_id\": 0, \"prompt_len\": 3}\n", "gives prompt_len 9"),
        ("{\"req_id\": \"1\", \"prompt_len\": 2}\n{\"req_id\": 5, \"prompt_len\": 3}\n", "0.safetensors"),
        ("{\"req_id\": \"1\", \"prompt_len\": 2}\n{\"prompt_len\": 3}\n", "give it on every line or on none"),
        ("{\"prompt_len\": 2}\n", "has 1 records but the directory has 2"),
        ("{\"req_id\": \"1\"}\n{\"req_id\": 0, \"prompt_len\": 3}\n", "neither prompt_len nor tokens"),
        ("{\"req_id\": \"1\", \"prompt_len\": 2}\n{\"req_id\": 0, \"prompt_len\": 3}\n{\"req_id\": 9, \"prompt_len\": 3}\n", "have no connector file"),
        ("not json\n", "line 1: not a prompt record"),
    ] {
        std::fs::write(&p, body).unwrap();
        let e = refused(&run(&forced));
        assert!(e.contains(needle), "{needle}: {e}");
    }
}

/// The tiny fixture's trace, written out as current-vLLM connector files (one per sample,
/// `[T, n_taps, H]` BF16, I64 token ids) and imported back with the matching vLLM ids, gives
/// the same tokens, taps and prompt split.
#[test]
fn the_tiny_fixture_trace_round_trips_through_vllm_connector_files() {
    let fixture = root().join("fixtures/kimi-k2.5-tiny/trace");
    let orig = Trace::open(&fixture).unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
    let m = &orig.manifest;
    assert_eq!(m.tap_convention, "hf_output_hidden_states");
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("hs");
    std::fs::create_dir(&src).unwrap();
    for s in &m.samples {
        let tokens = orig.tokens(s).unwrap();
        let taps: Vec<Vec<f32>> = m.taps.iter().map(|&i| orig.tap(s, i).unwrap()).collect();
        write_conn(
            &src,
            &s.id.to_string(),
            &taps,
            &tokens,
            m.hidden_size,
            Layout::TokensFirst,
            StDtype::BF16,
        );
    }
    // vLLM id k = hs[k]: the manifest's HF indices are the ids to give vLLM.
    let ids: Vec<String> = m.taps.iter().map(|t| t.to_string()).collect();
    let out = d.path().join("trace");
    let stdout = {
        let o = import(
            &src,
            &out,
            &[
                "--layer-ids",
                &ids.join(","),
                "--target",
                "kimi-k2.5-tiny",
                "--prompts",
                "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl",
            ],
        );
        ok(&o);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    for fam in ["eagle3", "eagle3-mla", "dflash"] {
        assert!(
            stdout.contains(&format!("{fam} drafts of kimi-k2.5-tiny")),
            "{stdout}"
        );
    }
    assert!(!stdout.contains("missing"), "{stdout}");
    let back = Trace::open(&out).unwrap();
    let b = &back.manifest;
    assert_eq!(b.taps, m.taps);
    assert_eq!(
        (b.hidden_size, b.num_layers, b.vocab_size),
        (m.hidden_size, m.num_layers, m.vocab_size)
    );
    assert_eq!(b.target["name"], "kimi-k2.5-tiny");
    assert_eq!(b.samples.len(), m.samples.len());
    for (x, y) in m.samples.iter().zip(&b.samples) {
        assert_eq!(
            (x.id, x.prompt_len, x.gen_len, &x.category),
            (y.id, y.prompt_len, y.gen_len, &y.category)
        );
        assert_eq!(
            orig.tokens(x).unwrap(),
            back.tokens(y).unwrap(),
            "sample {}",
            x.id
        );
        for &i in &m.taps {
            assert_eq!(
                orig.tap(x, i).unwrap(),
                back.tap(y, i).unwrap(),
                "sample {} hs[{i}]",
                x.id
            );
        }
    }
}

/// An imported trace is one `kquant verify` replays: the first fixture sample, imported from a
/// `[T, n_taps, H]` connector file, through the tiny EAGLE-3 draft against prompt lookup.
#[test]
fn kquant_verify_replays_an_imported_trace() {
    let fixture = root().join("fixtures/kimi-k2.5-tiny/trace");
    let orig = Trace::open(&fixture).unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
    let m = &orig.manifest;
    let s = &m.samples[0];
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("hs");
    std::fs::create_dir(&src).unwrap();
    let taps: Vec<Vec<f32>> = m.taps.iter().map(|&i| orig.tap(s, i).unwrap()).collect();
    let tokens = orig.tokens(s).unwrap();
    write_conn(
        &src,
        "0",
        &taps,
        &tokens,
        m.hidden_size,
        Layout::TokensFirst,
        StDtype::BF16,
    );
    let prompts = d.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        format!(
            "{{\"prompt_len\": {}, \"category\": \"{}\"}}\n",
            s.prompt_len, s.category
        ),
    )
    .unwrap();
    let out = d.path().join("trace");
    ok(&import(
        &src,
        &out,
        &[
            "--layer-ids",
            "1,2,3",
            "--target",
            "kimi-k2.5-tiny",
            "--prompts",
            prompts.to_str().unwrap(),
        ],
    ));
    let o = kquant(&[
        "verify",
        "--draft",
        "fixtures/kimi-k2.5-tiny/eagle3",
        "--target-checkpoint",
        "fixtures/kimi-k2.5-tiny/target",
        "--baseline",
        "prompt-lookup",
        "--trace",
        out.to_str().unwrap(),
        "--json",
        "-",
    ]);
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let al = r["draft"]["accept_length"].as_f64().unwrap();
    assert!((1.0..=4.0).contains(&al), "{r}");
    assert!(r["per_category"][&s.category].is_object(), "{r}");
}

/// A directory of `n` tokens-first BF16 requests of `t` tokens, taps 1,2,3, hidden `h`.
fn conn_dir(d: &Path, n: usize, t: usize, h: usize) -> PathBuf {
    let src = d.join("hs");
    std::fs::create_dir(&src).unwrap();
    for r in 0..n {
        let tokens: Vec<u32> = (0..t as u32).map(|p| (p * 7 + r as u32) % 2048).collect();
        write_conn(
            &src,
            &r.to_string(),
            &taps_for(3, t, h, false),
            &tokens,
            h,
            Layout::TokensFirst,
            StDtype::BF16,
        );
    }
    src
}

#[test]
fn deprecated_from_spelling_still_imports_with_a_warning() {
    let d = tempfile::tempdir().unwrap();
    let src = conn_dir(d.path(), 2, 5, H);
    let run = |flag: &str, out: &Path| {
        kquant(&[
            "trace",
            "import",
            flag,
            "vllm-hidden-states",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--layer-ids",
            "1,2,3",
            "--num-layers",
            "4",
        ])
    };
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    let new = ok(&run("--format", &a));
    assert!(!new.contains("deprecated"), "{new}");
    let old = ok(&run("--from", &b));
    assert!(
        old.contains("warning: `--from` is deprecated for trace import: say --format (accepted until the next release)"),
        "{old}"
    );
    assert_eq!(
        std::fs::read(a.join("shard-00000.safetensors")).unwrap(),
        std::fs::read(b.join("shard-00000.safetensors")).unwrap()
    );
    // Not both, and one of them is required.
    let both = kquant(&[
        "trace",
        "import",
        "--format",
        "vllm-hidden-states",
        "--from",
        "vllm-hidden-states",
        src.to_str().unwrap(),
        "-o",
        "x",
        "--layer-ids",
        "1,2,3",
        "--num-layers",
        "4",
    ]);
    assert_eq!(both.status.code(), Some(2));
    let none = kquant(&[
        "trace",
        "import",
        src.to_str().unwrap(),
        "-o",
        "x",
        "--layer-ids",
        "1,2,3",
        "--num-layers",
        "4",
    ]);
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("--format"));
}

#[test]
fn json_reports_what_was_imported() {
    let d = tempfile::tempdir().unwrap();
    let src = conn_dir(d.path(), 3, 6, H);
    let out = d.path().join("trace");
    let o = import(
        &src,
        &out,
        &[
            "--layer-ids",
            "1,2,3",
            "--target",
            "kimi-k2.5-tiny",
            "--hidden-size",
            "8",
            "--json",
        ],
    );
    // The tiny profile's hidden size is 256: the flag disagrees, and that is an error.
    refused(&o);
    let o = kquant(&[
        "trace",
        "import",
        "--format",
        "vllm-hidden-states",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--layer-ids",
        "3,1,2",
        "--num-layers",
        "4",
        "--json",
    ]);
    ok(&o);
    let doc: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("one JSON document on stdout");
    assert_eq!(doc["schema"], "kquant.trace-import/1");
    assert_eq!(doc["output"], out.to_str().unwrap());
    assert_eq!(
        (doc["samples"].as_u64(), doc["tokens"].as_u64()),
        (Some(3), Some(18))
    );
    assert_eq!(doc["taps"], serde_json::json!([1, 2, 3]));
    assert_eq!(doc["layer_ids"], serde_json::json!([3, 1, 2]));
    assert_eq!(
        (doc["dry_run"].as_bool(), doc["written"].as_bool()),
        (Some(false), Some(true))
    );
    assert_eq!(doc["bytes"], 3 * 6 * (4 + 2 * 3 * H) as u64);
    let w: Vec<&str> = doc["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(w.iter().any(|w| w.contains("not ascending")), "{w:?}");
    assert!(w.iter().any(|w| w.contains("no --prompts")), "{w:?}");
    assert!(doc["next"]
        .as_str()
        .unwrap()
        .contains(&format!("--trace {}", out.display())));
    assert!(Trace::open(&out).is_ok());
}

#[test]
fn dry_run_checks_every_value_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let src = conn_dir(d.path(), 2, 5, H);
    let out = d.path().join("trace");
    let ids = ["--layer-ids", "1,2,3", "--num-layers", "4"];
    let listing = || {
        let mut v: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = listing();
    let o = import(&src, &out, &[&ids[..], &["--dry-run"]].concat());
    ok(&o);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("dry run: nothing written"), "{stdout}");
    assert!(stdout.contains("2 samples, 10 tokens"), "{stdout}");
    assert_eq!(
        listing(),
        before,
        "a dry run leaves nothing, not even a lock"
    );
    let o = import(&src, &out, &[&ids[..], &["--dry-run", "--json"]].concat());
    let doc: serde_json::Value = serde_json::from_slice(&ok_out(&o)).unwrap();
    assert_eq!(
        (doc["dry_run"].as_bool(), doc["written"].as_bool()),
        (Some(true), Some(false))
    );
    // A NaN in the values is found by the dry run too.
    let mut t = taps_for(3, 5, H, false);
    t[1][2 * H + 5] = f32::NAN;
    write_conn(
        &src,
        "9",
        &t,
        &[1, 2, 3, 4, 5],
        H,
        Layout::TokensFirst,
        StDtype::BF16,
    );
    let err = refused(&import(&src, &out, &[&ids[..], &["--dry-run"]].concat()));
    assert!(
        err.contains("9.safetensors")
            && err.contains("NaN at tap slot 1 (hs[2]), token position 2, channel 5"),
        "{err}"
    );
    std::fs::remove_file(src.join("9.safetensors")).unwrap();
    // An existing output is refused as the real run would refuse it.
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("mine.txt"), b"x").unwrap();
    let err = refused(&import(&src, &out, &[&ids[..], &["--dry-run"]].concat()));
    assert!(err.contains("already exists"), "{err}");
    let err = refused(&import(
        &src,
        &out,
        &[&ids[..], &["--dry-run", "--force"]].concat(),
    ));
    assert!(err.contains("not an output kquant wrote"), "{err}");
    assert_eq!(std::fs::read(out.join("mine.txt")).unwrap(), b"x");
}

fn ok_out(o: &Output) -> Vec<u8> {
    ok(o);
    o.stdout.clone()
}

/// The import streams: what it holds at once is one piece of one tap, not the trace. 12
/// requests of 1024 tokens × 3 taps × hidden 1024 in BF16 (72 MiB of hidden states); the
/// in-memory import this replaced held every value as f32 plus the BF16 bytes (~216 MiB).
#[test]
fn memory_is_bounded_by_one_request_not_the_trace() {
    const T: usize = 1024;
    const HID: usize = 1024;
    let d = tempfile::tempdir().unwrap();
    let src = conn_dir(d.path(), 12, T, HID);
    let out = d.path().join("trace");
    let o = import(
        &src,
        &out,
        &["--layer-ids", "1,2,3", "--num-layers", "4", "--json"],
    );
    let doc: serde_json::Value = serde_json::from_slice(&ok_out(&o)).unwrap();
    let m = &doc["memory"];
    let request = (T * 3 * HID * 2) as u64;
    let input = 12 * request;
    assert_eq!(m["largest_request_bytes"], request);
    let buffer = m["peak_buffer_bytes"].as_u64().unwrap();
    assert!(
        buffer <= request && buffer <= 5 << 20,
        "conversion buffer {buffer} B"
    );
    // The process's own peak (VmHWM): the binary, the writer's 16 MiB of staging blocks, one
    // mapped request and one buffer; well under the 72 MiB of input it read.
    let rss = m["peak_rss_bytes"].as_u64().unwrap();
    assert!(rss < input, "peak RSS {rss} B for {input} B of input");
    eprintln!("peak RSS {rss} B, buffer {buffer} B, input {input} B");
    let t = Trace::open(&out).unwrap();
    let s = &t.manifest.samples[11];
    let want: Vec<f32> = taps_for(3, T, HID, false)[1]
        .iter()
        .map(|&x| expect(StDtype::BF16, x))
        .collect();
    assert!(t.tap(s, 2).unwrap() == want, "request 11, hs[2] differs");
}
