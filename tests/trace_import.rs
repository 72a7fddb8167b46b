//! `kquant trace import --format vllm-hidden-states` through the binary: connector-like files
//! (written with the `safetensors` crate, as vLLM's `save_file` writes them) in both layouts and
//! in BF16/F16/F32 import to exactly the values they hold (rounded to BF16); malformed files
//! are refused with exit 2 naming the file; and the tiny fixture's trace, written out as vLLM
//! connector files, imports back to the same tokens and taps.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{kquant, root};
use kquant::trace::file::Trace;
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

/// `kquant trace import FORMAT_FLAG vllm-hidden-states SRC OUT_FLAG OUT EXTRA…`, the flags
/// spelled as given (`--format` / the old `--from`; `-o` / `--output` / the old `--out`).
fn import_spelled(
    format_flag: &str,
    out_flag: &str,
    src: &Path,
    out: &Path,
    extra: &[&str],
) -> Output {
    let mut args = vec![
        "trace",
        "import",
        format_flag,
        "vllm-hidden-states",
        src.to_str().unwrap(),
        out_flag,
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    kquant(&args)
}

/// `kquant trace import --format vllm-hidden-states SRC -o OUT EXTRA…`.
fn import(src: &Path, out: &Path, extra: &[&str]) -> Output {
    import_spelled("--format", "-o", src, out, extra)
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
        import_spelled(
            "--format",
            flag,
            &src,
            out,
            &["--layer-ids", "1,2", "--num-layers", "4"],
        )
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

/// A connector file whose hidden size is 0 is refused naming it (it used to divide by zero),
/// with `--dry-run` too.
#[test]
fn a_hidden_size_of_zero_is_refused_not_a_panic() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("hs");
    std::fs::create_dir(&src).unwrap();
    write_raw(
        &src.join("0-aaaaaaaa.safetensors"),
        vec![
            ("hidden_states", StDtype::BF16, vec![4, 3, 0], Vec::new()),
            ("token_ids", StDtype::I64, vec![4], i64_bytes(&[1, 2, 3, 4])),
        ],
    );
    for extra in [
        &["--layer-ids", "1,2,3", "--num-layers", "4"][..],
        &["--layer-ids", "1,2,3", "--num-layers", "4", "--dry-run"][..],
    ] {
        let e = refused(&import(&src, &t.path().join("out"), extra));
        assert!(e.contains("hidden size 0") && e.contains("hint:"), "{e}");
        assert!(!t.path().join("out").exists());
    }
}

/// `scripts/vllm_capture.py` (the capture script users run on their vLLM cluster) end to end on
/// CPU: the script runs under vLLM 0.33.0's own Python (the engine tier's venv) with its engine
/// replaced by `tests/vllm_capture/harness.py`, which validates every argument against vLLM's
/// own classes and writes each request's file through vLLM's own cache-only layer and
/// `ExampleHiddenStatesConnector`, with the tiny fixture trace's hidden states. Then the
/// `kquant trace import` command the script prints runs as printed, and `kquant verify` on the
/// result must equal `kquant verify` on the fixture trace.
///
/// The venv: `KQUANT_VLLM_PYTHON`, else the one `tests/engines/venv.sh vllm` builds
/// (`${KQUANT_ENGINE_CACHE:-~/.cache/kquant/engines}/vllm-0.33.0-<sha256 of the constraints,
/// 12 hex>`, complete when `.complete` exists). The two tests that need it are ignored unless
/// asked for (`-- --include-ignored`: `.ci/run` builds the venv before the tests and asks), and
/// asked for without it they fail.
mod vllm_capture {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    use super::common::{kquant_cmd, root};
    use kquant::trace::file::Trace;

    const FIXTURE_TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";
    const TARGET: &str = "fixtures/kimi-k2.5-tiny/target";
    const HELDOUT: &str = "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl";

    /// The vLLM 0.33.0 venv's python, found as the engine tier finds it; a missing venv fails the
    /// (ignored unless asked for) test that needs it.
    fn vllm_python() -> PathBuf {
        super::common::engine_python("KQUANT_VLLM_PYTHON", "vllm-0.33.0")
    }

    /// The script through the harness: `harness.py --trace FIXTURE [--probe] -- ARGS`.
    fn capture(py: &Path, probe: bool, args: &[&str]) -> Output {
        let mut c = Command::new(py);
        c.current_dir(root())
            .arg("tests/vllm_capture/harness.py")
            .args(["--trace", FIXTURE_TRACE]);
        if probe {
            c.arg("--probe");
        }
        c.arg("--").args(args);
        c.output().unwrap()
    }

    fn text(o: &Output) -> (String, String) {
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// `kquant verify --json -` of the tiny EAGLE-3 draft on a trace, without the trace's path.
    fn verify(trace: &str) -> serde_json::Value {
        let args: Vec<String> = [
            "verify",
            "--draft",
            "fixtures/kimi-k2.5-tiny/eagle3",
            "--target-checkpoint",
            TARGET,
            "--trace",
            trace,
            "--json",
            "-",
        ]
        .map(String::from)
        .to_vec();
        let o = kquant_cmd().args(&args).output().unwrap();
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "verify {trace}: {err}");
        let mut v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v.as_object_mut().unwrap().remove("trace");
        v
    }

    /// A tokenizer like the fixture target's, with an identity chat template (the content of each
    /// message, nothing else), so that `messages` and chat-mode `text` give the fixture's tokens.
    fn identity_template_tokenizer(dir: &Path) -> PathBuf {
        let tok = dir.join("tok");
        std::fs::create_dir(&tok).unwrap();
        std::fs::copy(
            root().join(TARGET).join("tokenizer.json"),
            tok.join("tokenizer.json"),
        )
        .unwrap();
        let mut cfg: serde_json::Value = serde_json::from_slice(
            &std::fs::read(root().join(TARGET).join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}".into();
        std::fs::write(tok.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        tok
    }

    /// The held-out prompts, a third each as `tokens`, `text` and chat `messages`.
    fn mixed_prompts(dir: &Path) -> PathBuf {
        let src = std::fs::read_to_string(root().join(HELDOUT)).unwrap();
        let mut out = String::new();
        for (i, line) in src.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            let r: serde_json::Value = serde_json::from_str(line).unwrap();
            let mut rec = serde_json::json!({
                "id": r["id"],
                "category": r["category"],
                "dataset": "kquant-heldout",
            });
            match i % 3 {
                0 => rec["tokens"] = r["tokens"].clone(),
                1 => rec["text"] = r["text"].clone(),
                _ => rec["messages"] = serde_json::json!([{"role": "user", "content": r["text"]}]),
            }
            out.push_str(&rec.to_string());
            out.push('\n');
        }
        let p = dir.join("mixed.jsonl");
        std::fs::write(&p, out).unwrap();
        p
    }

    /// The whole path on the tiny target: 60 prompts (token ids, text and chat messages) captured
    /// by the script, imported with the command it prints, give the fixture trace back exactly
    /// (tokens, taps, prompt split, categories) and the same `kquant verify` report.
    #[test]
    #[ignore = "needs the vLLM 0.33.0 venv (bash tests/engines/venv.sh vllm); .ci/run runs this"]
    fn the_capture_script_through_vllm_reproduces_the_fixture_trace() {
        let py = vllm_python();
        let d = tempfile::tempdir().unwrap();
        let tok = identity_template_tokenizer(d.path());
        let prompts = mixed_prompts(d.path());
        let out = d.path().join("cap");
        let o = capture(
            &py,
            true,
            &[
                "--model",
                TARGET,
                "--tokenizer",
                tok.to_str().unwrap(),
                "--prompts",
                prompts.to_str().unwrap(),
                "--layer-ids",
                "3,1,2",
                "--out",
                out.to_str().unwrap(),
                "--max-tokens",
                "96",
                "--ignore-eos",
                "--chat-template-kwargs",
                r#"{"unused_flag": true}"#,
                "--kquant-target",
                "kimi-k2.5-tiny",
            ],
        );
        let (stdout, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
        // The harness's validation bites: each wrong argument is refused by vLLM itself.
        assert!(
            stdout.contains("probe: 7 of 7 wrong arguments refused"),
            "{stdout}"
        );
        // Both passes went through vLLM's connector; pass 1's files were removed.
        assert!(
            stdout.contains("harness: 120 requests through vLLM's connector"),
            "{stdout}"
        );
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 62, "{names:?}");
        assert!(names.contains(&"prompts.jsonl".into()) && names.contains(&"capture.json".into()));
        assert!(!names.iter().any(|n| n.ends_with(".lock")), "{names:?}");
        // vLLM's internal request ids (`{n}-{8 chars}`), pass 2 numbered after pass 1's 60.
        for n in names.iter().filter(|n| n.ends_with(".safetensors")) {
            let (num, rest) = n.split_once('-').unwrap();
            let num: u64 = num.parse().unwrap();
            assert!((60..120).contains(&num), "{n}");
            assert_eq!(rest.len(), 8 + ".safetensors".len(), "{n}");
        }

        // The printed command, run as printed.
        let cmd = stdout
            .lines()
            .find(|l| l.trim_start().starts_with("kquant trace import"))
            .unwrap_or_else(|| panic!("no import command printed:\n{stdout}"));
        let words: Vec<String> = cmd.split_whitespace().skip(1).map(String::from).collect();
        let imp = kquant_cmd().args(&words).output().unwrap();
        let (iout, ierr) = text(&imp);
        assert_eq!(imp.status.code(), Some(0), "{cmd}\n{iout}\n{ierr}");
        assert!(!ierr.contains("warning"), "{ierr}");
        assert!(iout.contains("60 samples"), "{iout}");
        let traced = words[words.iter().position(|w| w == "-o").unwrap() + 1].clone();
        assert_eq!(Path::new(&traced), d.path().join("cap.trace"));

        // The same trace as the fixture's: tokens, taps, prompt split, categories.
        let orig = Trace::open(&root().join(FIXTURE_TRACE)).unwrap();
        let back = Trace::open(Path::new(&traced)).unwrap();
        let (m, b) = (&orig.manifest, &back.manifest);
        assert_eq!(b.taps, m.taps);
        assert_eq!(b.target["name"], "kimi-k2.5-tiny");
        assert_eq!(b.samples.len(), m.samples.len());
        for (x, y) in m.samples.iter().zip(&b.samples) {
            assert_eq!(
                (x.prompt_len, x.gen_len, &x.category, &x.finish_reason),
                (y.prompt_len, y.gen_len, &y.category, &y.finish_reason),
                "sample {}",
                x.id
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

        // And the same verdict: accept length, per category, every figure of the report.
        let mut a = verify(FIXTURE_TRACE);
        let c = verify(&traced);
        // The stream: the fixture (made before kquant recorded it) implies `residual`; the
        // import records the capture script's (#41); the same stream either way.
        assert_eq!(
            b.tap_stream,
            Some(kquant::target::stream::TapStream::Residual)
        );
        assert_eq!(a["tap_stream"]["trace"], "residual");
        assert_eq!(c["tap_stream"]["trace"], "residual");
        assert_eq!(a["tap_stream"]["trace_known"], "implied");
        assert_eq!(c["tap_stream"]["trace_known"], "recorded");
        a["tap_stream"]["trace_known"] = "recorded".into();
        assert_eq!(a, c);
        let al = a["draft"]["accept_length"].as_f64().unwrap();
        assert!((2.9..3.1).contains(&al), "{a}");
    }

    /// Bad input stops the script before any engine is built: exit 2, an `error:` line saying
    /// what is wrong, and nothing written. `--dry-run` prints the plan and writes nothing.
    #[test]
    #[ignore = "needs the vLLM 0.33.0 venv (bash tests/engines/venv.sh vllm); .ci/run runs this"]
    fn the_capture_script_refuses_bad_input_before_loading_an_engine() {
        let py = vllm_python();
        let d = tempfile::tempdir().unwrap();
        let p = |name: &str, body: &str| {
            let f = d.path().join(name);
            std::fs::write(&f, body).unwrap();
            f.to_str().unwrap().to_string()
        };
        let text_prompt = p("text.jsonl", "{\"id\": 1, \"text\": \"def f(x):\"}\n");
        let no_prompt = p("none.jsonl", "{\"id\": 1, \"category\": \"code\"}\n");
        let dup = p(
            "dup.jsonl",
            "{\"id\": 1, \"tokens\": [1, 2]}\n{\"id\": 1, \"tokens\": [3]}\n",
        );
        let big = p("big.jsonl", "{\"tokens\": [1, 2, 4000]}\n");
        // `--continuations`: a live report without `live`, one without token ids, one that
        // misses a prompt.
        let not_live = p("not-live.json", "{\"schema\": \"kquant.verify/1\"}");
        let no_ids = p(
            "no-ids.json",
            &format!("{{\"live\": {{\"prompts\": \"{HELDOUT}\", \"draft\": {{\"requests\": [{{\"id\": \"0\", \"steps\": 3}}]}}}}}}"),
        );
        let short = p(
            "short.json",
            &format!("{{\"live\": {{\"prompts\": \"{HELDOUT}\", \"draft\": {{\"requests\": [{{\"id\": \"0\", \"token_ids\": [5, 6]}}]}}}}}}"),
        );
        let busy = d.path().join("busy");
        std::fs::create_dir(&busy).unwrap();
        std::fs::write(busy.join("old.safetensors"), b"x").unwrap();
        let fresh = d.path().join("fresh");
        let fresh_s = fresh.to_str().unwrap().to_string();
        let busy_s = busy.to_str().unwrap().to_string();

        let cases: Vec<(Vec<&str>, &str)> = vec![
            (
                vec![
                    "--prompts",
                    HELDOUT,
                    "--layer-ids",
                    "1,5",
                    "--out",
                    &fresh_s,
                ],
                "--layer-ids 5 is past the last hidden state of a 4-layer target",
            ),
            (
                vec![
                    "--prompts",
                    HELDOUT,
                    "--layer-ids",
                    "1,2,1",
                    "--out",
                    &fresh_s,
                ],
                "lists an id twice",
            ),
            (
                vec![
                    "--prompts",
                    HELDOUT,
                    "--layer-ids",
                    "1,2,3",
                    "--out",
                    &busy_s,
                ],
                "is not empty",
            ),
            (
                vec![
                    "--prompts",
                    &text_prompt,
                    "--layer-ids",
                    "1,2,3",
                    "--out",
                    &fresh_s,
                ],
                "has no chat template",
            ),
            (
                vec![
                    "--prompts",
                    &no_prompt,
                    "--layer-ids",
                    "1,2,3",
                    "--out",
                    &fresh_s,
                ],
                "has none of tokens, messages, text",
            ),
            (
                vec!["--prompts", &dup, "--layer-ids", "1,2,3", "--out", &fresh_s],
                "id '1' is also at",
            ),
            (
                vec!["--prompts", &big, "--layer-ids", "1,2,3", "--out", &fresh_s],
                "token 4000 is outside the target's vocabulary of 2048",
            ),
            (
                vec![
                    "--prompts",
                    HELDOUT,
                    "--layer-ids",
                    "1,2,3",
                    "--out",
                    &fresh_s,
                    "--max-model-len",
                    "100",
                ],
                "60 prompts do not fit --max-model-len 100",
            ),
            (
                vec![
                    "--prompts",
                    HELDOUT,
                    "--layer-ids",
                    "1,2,3",
                    "--out",
                    &fresh_s,
                    "--engine-arg",
                    "enable_prefix_caching=true",
                ],
                "set by this script for the capture recipe",
            ),
        ];
        let mut cases = cases;
        for (file, want) in [
            (&not_live, "not a `kquant verify --endpoint --json` report"),
            (&no_ids, "has no `token_ids`"),
            (&short, "59 prompts have no continuation in `live.draft`"),
        ] {
            cases.push((
                vec![
                    "--prompts",
                    HELDOUT,
                    "--layer-ids",
                    "1,2,3",
                    "--out",
                    &fresh_s,
                    "--continuations",
                    file,
                ],
                want,
            ));
        }
        for (args, want) in cases {
            let mut all = vec!["--model", TARGET];
            all.extend(&args);
            let o = capture(&py, false, &all);
            let (out, err) = text(&o);
            assert_eq!(o.status.code(), Some(2), "{args:?}\n{out}\n{err}");
            assert!(
                err.contains("error: ") && err.contains(want),
                "{args:?}: want {want:?}\n{err}"
            );
            assert!(!err.contains("Traceback"), "{err}");
            assert!(!fresh.exists(), "{args:?} wrote {}", fresh.display());
            assert!(
                !out.contains("harness:"),
                "{args:?} built an engine:\n{out}"
            );
        }

        // --dry-run: the plan (disk arithmetic included), no engine, nothing written.
        let o = capture(
            &py,
            false,
            &[
                "--model",
                TARGET,
                "--prompts",
                HELDOUT,
                "--layer-ids",
                "1,2,3",
                "--out",
                &fresh_s,
                "--max-tokens",
                "96",
                "--dry-run",
            ],
        );
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
        assert!(
            out.contains("at most 10055 tokens x 3 taps x 256 x 2 bytes"),
            "{out}"
        );
        assert!(
            out.contains("\"eagle_aux_hidden_state_layer_ids\": [1, 2, 3]"),
            "{out}"
        );
        assert!(!fresh.exists() && !out.contains("harness:"), "{out}");
    }

    /// Plain `python3` (no vLLM, no transformers: the target's shape from its config.json): the
    /// script's checks of a `--continuations` live report, which run before vLLM is imported,
    /// exercised through `--dry-run`. Refused (exit 2, `error:`, nothing written): a report of
    /// another prompt file, a category that differs, an id listed twice, ids the prompt file
    /// does not have, a token id outside the target's vocabulary. Accepted: the same file; the
    /// disk line then counts the continuations' lengths, not `--max-tokens`. And a Kimi-Linear
    /// target gets a warning naming the vLLM build that captures it and the CPU capture.
    #[test]
    fn the_capture_script_checks_continuations_before_vllm_with_plain_python() {
        let d = tempfile::tempdir().unwrap();
        let heldout = root().join(HELDOUT).display().to_string();
        let records: Vec<serde_json::Value> = std::fs::read_to_string(&heldout)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // A live report in kquant's shape: every prompt, a continuation of 5 tokens each.
        let report = |prompts: &str, edit: &dyn Fn(&mut Vec<serde_json::Value>)| {
            let mut reqs: Vec<serde_json::Value> = records
                .iter()
                .map(|r| {
                    serde_json::json!({"id": r["id"], "category": r["category"],
                        "token_ids": [5, 6, 7, 8, 9], "finish_reason": "length"})
                })
                .collect();
            edit(&mut reqs);
            serde_json::json!({"live": {"prompts": prompts, "draft": {"requests": reqs},
                "baseline": null}})
            .to_string()
        };
        let p = |name: &str, body: String| {
            let f = d.path().join(name);
            std::fs::write(&f, body).unwrap();
            f.to_str().unwrap().to_string()
        };
        let other = p("other.jsonl", "{\"id\": 0, \"tokens\": [1, 2]}\n".into());
        let good = p("good.json", report(&heldout, &|_| {}));
        let same_name = p(
            "same-name.json",
            report("/elsewhere/heldout.jsonl", &|_| {}),
        );
        let another = p("another.json", report(&other, &|_| {}));
        let category = p(
            "category.json",
            report(&heldout, &|r| r[3]["category"] = "prose".into()),
        );
        let dup = p(
            "dup.json",
            report(&heldout, &|r| {
                let x = r[1].clone();
                r.push(x)
            }),
        );
        let extra = p(
            "extra.json",
            report(&heldout, &|r| {
                r.push(serde_json::json!({"id": 999, "category": "code", "token_ids": [1]}))
            }),
        );
        let vocab = p(
            "vocab.json",
            report(&heldout, &|r| {
                r[2]["token_ids"] = serde_json::json!([5, 2048])
            }),
        );
        let fresh = d.path().join("fresh");
        let fresh_s = fresh.to_str().unwrap().to_string();
        let run = |model: &str, extra: &[&str]| {
            let mut c = Command::new(std::env::var_os("KQUANT_PYTHON").unwrap_or("python3".into()));
            c.current_dir(root()).args([
                "scripts/vllm_capture.py",
                "--model",
                model,
                "--prompts",
                &heldout,
                "--layer-ids",
                "1,2,3",
                "--out",
                &fresh_s,
                "--max-tokens",
                "96",
                "--dry-run",
            ]);
            c.args(extra);
            let o = c.output().expect("python3 on the PATH (or KQUANT_PYTHON)");
            assert!(!fresh.exists(), "{extra:?} wrote {}", fresh.display());
            o
        };
        for (file, want) in [
            (&another, "the live run read its prompts from"),
            (&category, "category 'prose'"),
            (&dup, "lists request id '1' twice"),
            (&extra, "1 requests whose ids the prompt files do not have"),
            (
                &vocab,
                "token 2048 is outside the target's vocabulary of 2048",
            ),
        ] {
            let o = run(TARGET, &["--continuations", file]);
            let (out, err) = text(&o);
            assert_eq!(o.status.code(), Some(2), "{want}\n{out}\n{err}");
            assert!(
                err.contains("error: ") && err.contains(want) && !err.contains("Traceback"),
                "want {want:?}\n{err}"
            );
        }
        // Without continuations: the disk line counts --max-tokens (60 × 96 + the prompts).
        let o = run(TARGET, &[]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
        assert!(
            out.contains("at most 10055 tokens x 3 taps x 256 x 2 bytes"),
            "{out}"
        );
        // With them: 60 × 5 tokens, not 60 × 96; a report of the same file under another path.
        for file in [&good, &same_name] {
            let o = run(TARGET, &["--continuations", file]);
            let (out, err) = text(&o);
            assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
            assert!(
                out.contains(&format!(
                    "at most {} tokens x 3 taps",
                    10055 - 60 * 96 + 60 * 5
                )),
                "{out}"
            );
        }
        // Kimi-Linear: the dry run warns which capture works.
        let o = run("fixtures/kimi-linear-tiny/target", &[]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
        let w = err
            .lines()
            .find(|l| l.starts_with("warning: ") && l.contains("KimiLinearForCausalLM"))
            .unwrap_or_else(|| panic!("no Kimi-Linear warning:\n{err}"));
        assert!(
            w.contains("SupportsEagle3") && w.contains("kquant trace capture"),
            "{w}"
        );
        let o = run(TARGET, &[]);
        assert!(!text(&o).1.contains("KimiLinearForCausalLM"));
        // A target whose shape cannot be read: the disk line says so (#38.23: it was left out).
        let empty = d.path().join("no-config");
        std::fs::create_dir(&empty).unwrap();
        let o = run(empty.to_str().unwrap(), &[]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
        assert!(out.contains("disk        unknown:"), "{out}");
    }

    /// The tap stream (#41), with plain `python3` and no vLLM: on the Kimi-K3 target the script
    /// taps `partial` by default and `mixture` when asked, and sets vLLM's switch
    /// (`VLLM_KIMI_K3_AUX_ATTN_RES_STREAM`, 0 or 1) before vLLM is imported (a stand-in `vllm`
    /// package on `PYTHONPATH` reports the variable as it is imported, then stops the run);
    /// `partial`/`mixture` on a target without attention residuals, and `residual` on K3, are
    /// refused (exit 2, before anything is written).
    #[test]
    fn the_capture_script_sets_the_tap_stream_before_vllm_is_imported() {
        const K3: &str = "fixtures/kimi-k3-tiny/target-random";
        let d = tempfile::tempdir().unwrap();
        let fake = d.path().join("fake");
        std::fs::create_dir_all(fake.join("vllm")).unwrap();
        std::fs::write(
            fake.join("vllm/__init__.py"),
            "import os, sys\nsys.stderr.write('fake-vllm: switch=%s\\n' % os.environ.get('VLLM_KIMI_K3_AUX_ATTN_RES_STREAM'))\nsys.exit(7)\n",
        )
        .unwrap();
        let mut n = 0;
        let mut run = |model: &str, extra: &[&str], dry: bool, env: Option<&str>| {
            n += 1;
            let out = d.path().join(format!("out{n}"));
            let mut c = Command::new(std::env::var_os("KQUANT_PYTHON").unwrap_or("python3".into()));
            c.current_dir(root())
                .env("PYTHONPATH", &fake)
                .env_remove("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM")
                .args([
                    "scripts/vllm_capture.py",
                    "--model",
                    model,
                    "--prompts",
                    HELDOUT,
                ])
                .args(["--limit", "2", "--layer-ids", "1,2,3", "--max-tokens", "4"])
                .arg("--out")
                .arg(&out)
                .args(extra);
            if dry {
                c.arg("--dry-run");
            }
            if let Some(v) = env {
                c.env("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", v);
            }
            let o = c.output().expect("python3 on the PATH (or KQUANT_PYTHON)");
            let (so, se) = text(&o);
            (o.status.code(), so, se, out)
        };
        // The plan names the stream and the switch.
        for (extra, want) in [
            (
                &[][..],
                "stream      partial (VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=0)",
            ),
            (
                &["--stream", "partial"][..],
                "stream      partial (VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=0)",
            ),
            (
                &["--stream", "mixture"][..],
                "stream      mixture (VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1)",
            ),
        ] {
            let (code, so, se, out) = run(K3, extra, true, None);
            assert_eq!(code, Some(0), "{extra:?}\n{so}\n{se}");
            assert!(so.contains(want), "{want}\n{so}");
            assert!(!out.exists());
        }
        let (code, so, se, _) = run(TARGET, &[], true, None);
        assert_eq!(code, Some(0), "{so}\n{se}");
        assert!(so.contains("stream      residual\n"), "{so}");
        // Refused before anything is written.
        for (model, extra, want) in [
            (TARGET, "mixture", "has no attention residuals"),
            (TARGET, "partial", "has no attention residuals"),
            (K3, "residual", "KimiK3ForConditionalGeneration"),
        ] {
            let (code, so, se, out) = run(model, &["--stream", extra], false, None);
            assert_eq!(code, Some(2), "{model} {extra}\n{so}\n{se}");
            assert!(
                se.contains("error: ") && se.contains(want) && se.contains("hint: "),
                "{se}"
            );
            assert!(!se.contains("fake-vllm") && !out.exists(), "{se}");
        }
        // The switch is in the environment when vLLM is imported: 1 for mixture, 0 for partial
        // (over a 1 the shell had set, with a warning), untouched on a target without it.
        for (model, extra, env, want) in [
            (
                K3,
                &["--stream", "mixture"][..],
                None,
                "fake-vllm: switch=1",
            ),
            (K3, &[][..], Some("1"), "fake-vllm: switch=0"),
            (TARGET, &[][..], None, "fake-vllm: switch=None"),
        ] {
            let (code, so, se, _) = run(model, extra, false, env);
            assert_eq!(code, Some(7), "{extra:?}\n{so}\n{se}");
            assert!(se.contains(want), "{want}\n{se}");
            assert_eq!(env.is_some(), se.contains("warning: VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1 in the environment is replaced by 0"), "{se}");
        }
    }

    /// The bundled prompt sets (quant-configs/prompts/, read by the capture script and by kquant)
    /// are one `{"id", "dataset", "category", "text"}` object per line, keys in that order,
    /// non-empty strings, ids unique, with the counts and categories their README states.
    #[test]
    fn the_bundled_prompt_sets_have_the_documented_schema() {
        let dir = root().join("quant-configs/prompts");
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        for (file, dataset, count, cats) in [
            (
                "mt_bench.jsonl",
                "mt_bench",
                80,
                &[
                    "writing",
                    "roleplay",
                    "reasoning",
                    "math",
                    "coding",
                    "extraction",
                    "stem",
                    "humanities",
                ][..],
            ),
            ("gsm8k.jsonl", "gsm8k", 100, &["math"][..]),
            ("humaneval.jsonl", "humaneval", 164, &["code"][..]),
        ] {
            assert!(
                readme.contains(&format!("`{file}`")),
                "README misses {file}"
            );
            let body = std::fs::read_to_string(dir.join(file)).unwrap();
            let mut ids = std::collections::HashSet::new();
            let mut per_cat = std::collections::BTreeMap::<String, usize>::new();
            for (n, line) in body.lines().enumerate() {
                let v: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{file}:{}: {e}", n + 1));
                let o = v.as_object().unwrap();
                let keys: Vec<&str> = o.keys().map(String::as_str).collect();
                assert_eq!(
                    keys,
                    ["id", "dataset", "category", "text"],
                    "{file}:{}",
                    n + 1
                );
                for (k, x) in o {
                    let s = x
                        .as_str()
                        .unwrap_or_else(|| panic!("{file}:{}: {k}", n + 1));
                    assert!(!s.is_empty(), "{file}:{}: empty {k}", n + 1);
                }
                assert_eq!(o["dataset"], dataset, "{file}:{}", n + 1);
                assert!(
                    ids.insert(o["id"].as_str().unwrap().to_string()),
                    "{file}: id twice"
                );
                *per_cat
                    .entry(o["category"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
            assert_eq!(ids.len(), count, "{file}");
            let mut want: Vec<&str> = cats.to_vec();
            want.sort_unstable();
            assert_eq!(
                per_cat.keys().map(String::as_str).collect::<Vec<_>>(),
                want,
                "{file}"
            );
        }
    }
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
        import_spelled(
            flag,
            "-o",
            &src,
            out,
            &["--layer-ids", "1,2,3", "--num-layers", "4"],
        )
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

/// The engine's own count (`accept_length_engine`) is predicted offline only from a trace that
/// records where each request stops (`stop_len`, `trace capture --lookahead K`). An imported
/// trace has none (the cluster path generates no lookahead), and docs/verify.md says that the
/// prediction is the CPU capture's only.
#[test]
fn an_imported_trace_records_no_stop_and_the_docs_say_the_engine_count_is_cpu_capture_only() {
    let d = tempfile::tempdir().unwrap();
    let src = conn_dir(d.path(), 3, 6, H);
    let out = d.path().join("trace");
    let o = kquant(&[
        "trace",
        "import",
        "--format",
        "vllm-hidden-states",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--layer-ids",
        "1,2,3",
        "--num-layers",
        "4",
    ]);
    ok(&o);
    let t = Trace::open(&out).unwrap();
    assert!(t.manifest.samples.iter().all(|s| s.stop_len.is_none()));
    let doc = std::fs::read_to_string(root().join("docs/verify.md")).unwrap();
    let para = doc
        .split("\n\n")
        .find(|p| p.starts_with("**Predicting the engine's own count offline.**"))
        .expect("the paragraph");
    let para = para.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        para.contains("CPU capture only")
            && para.contains("`scripts/vllm_capture.py`")
            && para.contains("`trace import`")
            && para.contains("`accept_length_engine` is `null`"),
        "{para}"
    );
}

/// The tap stream an import records (#41): `residual` on a target without attention
/// residuals (and `partial`/`mixture` refused there); on an attention-residual profile,
/// `--stream`, else `capture.json`'s `tap_stream` (the capture script's), which must agree with
/// the flag; with neither, none recorded and a warning says so. A bad `capture.json` value is
/// refused.
#[test]
fn an_import_records_the_tap_stream_from_the_flag_or_the_capture_script() {
    let d = tempfile::tempdir().unwrap();
    let src = conn_dir(d.path(), 2, 5, H);
    let prof = crate::trace_stream::k3_like_profile(
        d.path(),
        "k3-small",
        (4, H, 2048),
        serde_json::json!([]),
    );
    let prof = prof.to_str().unwrap();
    let mut n = 0;
    let mut run = |extra: &[&str]| {
        n += 1;
        let out = d.path().join(format!("t{n}"));
        let mut a = vec!["--layer-ids", "1,2,3"];
        a.extend(extra);
        (import(&src, &out, &a), out)
    };
    let stream = |out: &Path| {
        common::read_json(&out.join("manifest.json"))
            .get("tap_stream")
            .cloned()
    };
    let (o, out) = run(&["--num-layers", "4"]);
    ok(&o);
    assert_eq!(stream(&out), Some("residual".into()));
    let (o, _) = run(&["--num-layers", "4", "--stream", "mixture"]);
    assert!(refused(&o).contains("has no attention residuals"));
    let (o, out) = run(&["--target", prof]);
    let err = ok(&o);
    assert!(
        err.contains("warning: the target has attention residuals and nothing says which stream"),
        "{err}"
    );
    assert_eq!(stream(&out), None);
    let (o, out) = run(&["--target", prof, "--stream", "partial", "--json"]);
    ok(&o);
    assert_eq!(stream(&out), Some("partial".into()));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["tap_stream"], "partial");
    std::fs::write(src.join("capture.json"), r#"{"tap_stream": "mixture"}"#).unwrap();
    let (o, out) = run(&["--target", prof]);
    let err = ok(&o);
    assert!(!err.contains("nothing says which stream"), "{err}");
    assert_eq!(stream(&out), Some("mixture".into()));
    let (o, _) = run(&["--target", prof, "--stream", "partial"]);
    assert!(refused(&o).contains("records tap_stream `mixture`"));
    std::fs::write(src.join("capture.json"), r#"{"tap_stream": "prefix"}"#).unwrap();
    let (o, _) = run(&["--target", prof]);
    let err = refused(&o);
    assert!(
        err.contains("capture.json") && err.contains("hint:"),
        "{err}"
    );
}
