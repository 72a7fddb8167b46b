//! The write path under adversarial use, through the real binary: outputs never over a source,
//! `--force` only over what kquant wrote, two writers never both win, kills at named points and
//! at random moments of every writing command leave either nothing or a whole output under the
//! final name (and the next run cleans up), signals remove partial outputs, a source that
//! shrinks under a memory-mapped read is an `error:` (exit 2), and the messages say what is
//! wrong. `KQUANT_KILL_ROUNDS` (default 2) sets the random kills per command and case;
//! `fuzz/kill-soak.sh` runs many.

use crate::common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use common::{kquant, kquant_cmd, read_json, root, stderr, Rng};
use sha2::{Digest, Sha256};

const TINY: &str = "fixtures/tiny/eagle3-specforge";
const EAGLE3: &str = "fixtures/kimi-k2.5-tiny/eagle3";
const TARGET: &str = "fixtures/kimi-k2.5-tiny/target";
const PROMPTS: &str = "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl";
const TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";

fn run_env(args: &[&OsStr], env: &[(&str, &str)]) -> Output {
    let mut c = kquant_cmd();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn code(o: &Output) -> Option<i32> {
    o.status.code()
}

/// Names in `dir` (sorted).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn sha(p: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(p).unwrap()))
}

fn tree_hash(dir: &Path) -> Vec<(String, String)> {
    names(dir)
        .into_iter()
        .map(|n| {
            let h = sha(&dir.join(&n));
            (n, h)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The writing commands, each with how to tell that an output under the final name is whole.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Out {
    Checkpoint,
    Trace,
    Json,
    Junit,
}

struct Cmd {
    name: &'static str,
    args: Vec<String>,
    out: Out,
    /// The flag that allows a replacement (reports are replaced without one).
    force: Option<&'static str>,
}

impl Cmd {
    fn argv(&self, o: &Path, force: bool) -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = Vec::new();
        for a in &self.args {
            if a == "{o}" {
                v.push(o.as_os_str().to_owned());
            } else {
                v.push(a.into());
            }
        }
        if force {
            if let Some(f) = self.force {
                v.push(f.into());
            }
        }
        v
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Every command that writes an output (`quantized` is a quantized draft for `dequantize`;
/// beside it, `hs` holds vLLM hidden-states connector files for `trace import`).
fn commands(quantized: &Path) -> Vec<Cmd> {
    let q = quantized.to_str().unwrap();
    let hs = quantized.with_file_name("hs");
    let hs = hs.to_str().unwrap();
    vec![
        Cmd {
            name: "quantize",
            args: s(&[
                "quantize",
                TINY,
                "-o",
                "{o}",
                "--scheme",
                "int4-pc",
                "--exclude",
                "fc,lm_head",
            ]),
            out: Out::Checkpoint,
            force: Some("--force"),
        },
        Cmd {
            name: "convert",
            args: s(&["convert", "eagle3", TINY, "--to", "vllm", "-o", "{o}"]),
            out: Out::Checkpoint,
            force: Some("--force"),
        },
        Cmd {
            name: "dequantize",
            args: s(&["dequantize", q, "-o", "{o}"]),
            out: Out::Checkpoint,
            force: Some("--force"),
        },
        Cmd {
            name: "synth",
            args: s(&["synth", "--preset", "tiny-dflash-zlab", "-o", "{o}"]),
            out: Out::Checkpoint,
            force: Some("--force"),
        },
        Cmd {
            name: "trace capture",
            args: s(&[
                "trace",
                "capture",
                "--target-checkpoint",
                TARGET,
                "--prompts",
                PROMPTS,
                "-o",
                "{o}",
                "--limit",
                "1",
                "--gen-len",
                "3",
            ]),
            out: Out::Trace,
            force: Some("--force"),
        },
        Cmd {
            name: "trace import",
            args: s(&[
                "trace",
                "import",
                "--format",
                "vllm-hidden-states",
                hs,
                "-o",
                "{o}",
                "--layer-ids",
                "1,2,3",
                "--target",
                "kimi-k2.5-tiny",
            ]),
            out: Out::Trace,
            force: Some("--force"),
        },
        Cmd {
            name: "calibrate",
            args: s(&[
                "calibrate",
                "--draft",
                EAGLE3,
                "--trace",
                TRACE,
                "--target-checkpoint",
                TARGET,
                "--limit",
                "1",
                "-o",
                "{o}",
            ]),
            out: Out::Json,
            force: None,
        },
        Cmd {
            name: "verify --junit",
            args: s(&[
                "verify",
                "--draft",
                EAGLE3,
                "--baseline",
                EAGLE3,
                "--trace",
                TRACE,
                "--target-checkpoint",
                TARGET,
                "--limit",
                "1",
                "--junit",
                "{o}",
            ]),
            out: Out::Junit,
            force: None,
        },
    ]
}

/// vLLM hidden-states connector files (one request, `[T, 3 taps, H]` BF16 + `token_ids`) of
/// the tiny fixture trace's first sample, in `t/hs`, for `trace import`.
fn connector_files(t: &Path) {
    use kquant::trace::file::Trace;
    let tr = Trace::open(&root().join(TRACE)).unwrap();
    let m = &tr.manifest;
    let s = &m.samples[0];
    let tokens = tr.tokens(s).unwrap();
    let taps: Vec<Vec<f32>> = [1usize, 2, 3]
        .iter()
        .map(|&i| tr.tap(s, i).unwrap())
        .collect();
    let (n, h) = (tokens.len(), m.hidden_size);
    let mut data = Vec::new();
    for k in 0..n {
        for tap in &taps {
            for x in &tap[k * h..(k + 1) * h] {
                data.extend_from_slice(&half::bf16::from_f32(*x).to_le_bytes());
            }
        }
    }
    let hs_len = data.len();
    for tok in &tokens {
        data.extend_from_slice(&(*tok as i64).to_le_bytes());
    }
    let header = serde_json::json!({
        "hidden_states": {"dtype": "BF16", "shape": [n, 3, h], "data_offsets": [0, hs_len]},
        "token_ids": {"dtype": "I64", "shape": [n], "data_offsets": [hs_len, data.len()]},
    });
    let dir = t.join("hs");
    std::fs::create_dir_all(&dir).unwrap();
    common::write_safetensors(
        &dir.join(format!("{}.safetensors", s.id)),
        header.to_string().as_bytes(),
        data,
    );
}

/// A quantized tiny draft (for `dequantize`) in `t`, and connector files beside it.
fn quantized_draft(t: &Path) -> PathBuf {
    connector_files(t);
    let q = t.join("q");
    let o = kquant(&[
        "quantize",
        TINY,
        "-o",
        q.to_str().unwrap(),
        "--scheme",
        "int4-g32",
        "--exclude",
        "fc,lm_head",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    q
}

/// The output under `p` is whole (None: nothing there). Panics on a partial one.
fn whole(p: &Path, kind: Out) -> Option<String> {
    let m = std::fs::symlink_metadata(p).ok()?;
    let id = match kind {
        Out::Checkpoint => {
            let o = kquant_cmd().arg("verify-files").arg(p).output().unwrap();
            assert_eq!(code(&o), Some(0), "{}: {}", p.display(), stderr(&o));
            sha(&p.join("kquant-manifest.json"))
        }
        Out::Trace => {
            assert!(m.is_dir());
            let man = read_json(&p.join("manifest.json"));
            let mut files = vec!["manifest.json".to_string()];
            for sh in man["shards"].as_array().unwrap() {
                let f = sh["file"].as_str().unwrap();
                assert_eq!(sha(&p.join(f)), sh["sha256"].as_str().unwrap(), "{f}");
                files.push(f.into());
            }
            files.sort();
            assert_eq!(
                names(p),
                files,
                "a trace holds its manifest and shards only"
            );
            sha(&p.join("manifest.json"))
        }
        Out::Json => {
            let v = read_json(p);
            assert!(v["schema"].as_str().unwrap().starts_with("kquant."));
            sha(p)
        }
        Out::Junit => {
            let b = std::fs::read_to_string(p).unwrap();
            assert!(
                b.starts_with("<?xml") && b.ends_with("</testsuite>\n"),
                "{b}"
            );
            sha(p)
        }
    };
    Some(id)
}

/// Only `keep` is left in `dir`: no staging, lock or old copies.
fn only(dir: &Path, keep: &[&str]) {
    let mut want: Vec<String> = keep.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(names(dir), want, "leftovers in {}", dir.display());
}

fn ok(c: &Cmd, o: &Path, force: bool) -> Output {
    let r = run_env(
        &c.argv(o, force)
            .iter()
            .map(|a| a.as_os_str())
            .collect::<Vec<_>>(),
        &[],
    );
    assert_eq!(code(&r), Some(0), "{}: {}", c.name, stderr(&r));
    r
}

// ---------------------------------------------------------------------------------------------
// Sources and --force.

#[test]
fn an_output_is_never_a_source_nor_holds_one() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(root().join(TINY).join(f), src.join(f)).unwrap();
    }
    let before = tree_hash(&src);
    let s = src.to_str().unwrap();
    let file = src.join("model.safetensors");
    for (input, out) in [(s, s), (file.to_str().unwrap(), s)] {
        for force in [false, true] {
            let mut args = vec![
                "quantize",
                input,
                "-o",
                out,
                "--scheme",
                "int4-pc",
                "--exclude",
                "fc,lm_head",
            ];
            if force {
                args.push("--force");
            }
            let o = kquant(&args);
            let e = stderr(&o);
            assert_eq!(code(&o), Some(2), "{e}");
            assert!(
                e.contains("which this command reads") && e.contains("hint:"),
                "{e}"
            );
        }
    }
    // A kquant output used as the source of the next step is protected the same way.
    let conv = t.path().join("conv");
    let c = conv.to_str().unwrap();
    assert_eq!(
        code(&kquant(&["convert", "eagle3", s, "--to", "vllm", "-o", c])),
        Some(0)
    );
    let o = kquant(&["convert", "eagle3", c, "--to", "sglang", "-o", c, "--force"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    // A link to the source as -o.
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&src, &link).unwrap();
    let o = kquant(&[
        "quantize",
        s,
        "-o",
        link.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--force",
    ]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    // convert --target-checkpoint: the target's files are sources too.
    let o = kquant(&[
        "convert",
        "eagle3",
        TINY,
        "--to",
        "trtllm",
        "--target-checkpoint",
        s,
        "-o",
        s,
        "--force",
    ]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert_eq!(tree_hash(&src), before, "the source is untouched");
    assert!(whole(&conv, Out::Checkpoint).is_some());
}

/// #38.2: every path a command reads — not only its source — is held against its output:
/// the same, inside, containing, through symbolic links. `--target-checkpoint T -o T --force`
/// replaced the target it reads when T was an output kquant wrote.
#[test]
fn every_path_a_command_reads_is_held_against_its_output() {
    let t = tempfile::tempdir().unwrap();
    let tgt = t.path().join("target");
    let tg = tgt.to_str().unwrap();
    let plain = |extra: &[&str]| {
        let mut a = vec![
            "quantize",
            TINY,
            "--scheme",
            "int4-pc",
            "--exclude",
            "fc,lm_head",
        ];
        a.extend_from_slice(extra);
        kquant(&a)
    };
    // GPTQ reads a target checkpoint beside its calibration trace.
    let q = |extra: &[&str]| {
        let mut a = vec![
            "quantize",
            EAGLE3,
            "--scheme",
            "int4-pc",
            "--exclude",
            "fc,lm_head",
            "--method",
            "gptq",
            "--calibrate",
            TRACE,
        ];
        a.extend_from_slice(extra);
        kquant(&a)
    };
    assert_eq!(
        code(&plain(&["-o", tg])),
        Some(0),
        "a kquant output to read"
    );
    let before = tree_hash(&tgt);
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&tgt, &link).unwrap();
    let inner = tgt.join("inner");
    let refused = |o: &Output, what: &str| {
        let e = stderr(o);
        assert_eq!(code(o), Some(2), "{what}: {e}");
        assert!(
            e.contains("which this command reads") && e.contains("hint:"),
            "{what}: {e}"
        );
    };
    refused(
        &q(&["--target-checkpoint", tg, "-o", tg, "--force"]),
        "the same",
    );
    refused(
        &q(&[
            "--target-checkpoint",
            link.to_str().unwrap(),
            "-o",
            tg,
            "--force",
        ]),
        "through a link",
    );
    refused(
        &q(&["--target-checkpoint", tg, "-o", inner.to_str().unwrap()]),
        "inside",
    );
    let held = tgt.join("config.json");
    refused(
        &q(&[
            "--target-checkpoint",
            held.to_str().unwrap(),
            "-o",
            tg,
            "--force",
        ]),
        "containing",
    );
    assert_eq!(tree_hash(&tgt), before, "the target is untouched");
    assert!(!inner.exists());
    // A report inside the trace it gates on, and a preset that is the output.
    let tr = t.path().join("trace");
    std::fs::create_dir(&tr).unwrap();
    for f in ["manifest.json", "shard-00000.safetensors"] {
        std::fs::copy(root().join(TRACE).join(f), tr.join(f)).unwrap();
    }
    let junit = tr.join("verify.xml");
    let o = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5-tiny",
        "--draft",
        EAGLE3,
        "--trace",
        tr.to_str().unwrap(),
        "--per-category",
        "1",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    refused(&o, "--junit inside --trace");
    assert!(!junit.exists());
    let preset = t.path().join("preset.json");
    std::fs::write(&preset, r#"{"scheme": "int4-pc"}"#).unwrap();
    let o = kquant(&[
        "quantize",
        TINY,
        "--config",
        preset.to_str().unwrap(),
        "-o",
        preset.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&preset).unwrap(),
        r#"{"scheme": "int4-pc"}"#
    );
}

/// #38.3: `bench replay --write-trace DIR` is a writer like the others: an existing DIR is
/// refused without `--force`, and `--force` replaces only a trace kquant wrote.
#[test]
fn bench_replay_write_trace_needs_force_to_replace() {
    let t = tempfile::tempdir().unwrap();
    let tr = t.path().join("trace");
    let trs = tr.to_str().unwrap();
    let run = |force: bool| {
        let mut a = vec![
            "bench",
            "replay",
            "fixtures/kimi-k2.5-tiny/eagle3-mla",
            "--synthetic-trace",
            "16",
            "--write-trace",
            trs,
        ];
        if force {
            a.push("--force");
        }
        kquant(&a)
    };
    assert_eq!(code(&run(false)), Some(0));
    let first = tree_hash(&tr);
    let o = run(false);
    let e = stderr(&o);
    assert_eq!(code(&o), Some(2), "{e}");
    assert!(e.contains("already exists") && e.contains("--force"), "{e}");
    assert_eq!(tree_hash(&tr), first);
    assert_eq!(code(&run(true)), Some(0), "{}", stderr(&run(true)));
    // Not kquant's: refused even with --force.
    let mine = t.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), b"user data").unwrap();
    let o = kquant(&[
        "bench",
        "replay",
        "fixtures/kimi-k2.5-tiny/eagle3-mla",
        "--synthetic-trace",
        "16",
        "--write-trace",
        mine.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read(mine.join("notes.txt")).unwrap(), b"user data");
}

#[test]
fn force_replaces_only_what_kquant_wrote() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let o_ = out.to_str().unwrap();
    let q = |force: bool| {
        let mut a = vec!["quantize", TINY, "-o", o_, "--scheme", "int4-pc"];
        if force {
            a.push("--force");
        }
        kquant(&a)
    };
    // A directory kquant did not write: refused, untouched.
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("mine.txt"), b"user data").unwrap();
    let o = q(true);
    let e = stderr(&o);
    assert_eq!(code(&o), Some(2), "{e}");
    assert!(
        e.contains("not an output kquant wrote") && e.contains("hint:"),
        "{e}"
    );
    assert_eq!(std::fs::read(out.join("mine.txt")).unwrap(), b"user data");
    std::fs::remove_dir_all(&out).unwrap();
    // A plain file: refused.
    std::fs::write(&out, b"user data").unwrap();
    assert_eq!(code(&q(true)), Some(2));
    assert_eq!(std::fs::read(&out).unwrap(), b"user data");
    std::fs::remove_file(&out).unwrap();
    // kquant's own output: replaced; with a file added by the user: refused, naming it.
    assert_eq!(code(&q(false)), Some(0));
    let o = q(false);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    assert_eq!(code(&q(true)), Some(0));
    std::fs::write(out.join("NOTES.md"), b"mine").unwrap();
    let o = q(true);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("`NOTES.md`"), "{}", stderr(&o));
    std::fs::remove_file(out.join("NOTES.md")).unwrap();
    // A symbolic link to a kquant output is not replaced either.
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    let o = kquant(&[
        "quantize",
        TINY,
        "-o",
        link.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--force",
    ]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    // Reports: a file that is not kquant's report is refused, kquant's is replaced.
    let junit = t.path().join("junit.xml");
    std::fs::write(&junit, b"<xml>someone else's</xml>").unwrap();
    let junit_cmd = commands(Path::new("-"))
        .into_iter()
        .find(|c| c.name == "verify --junit")
        .unwrap();
    let v = |p: &Path| {
        kquant_cmd()
            .args(junit_cmd.argv(p, false))
            .output()
            .unwrap()
    };
    let o = v(&junit);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read(&junit).unwrap(), b"<xml>someone else's</xml>");
    std::fs::remove_file(&junit).unwrap();
    assert_eq!(code(&v(&junit)), Some(0));
    assert_eq!(code(&v(&junit)), Some(0), "kquant's own report is replaced");
    only(t.path(), &["junit.xml", "link", "out"]);
}

#[test]
fn a_replacement_whose_old_copy_cannot_be_deleted_still_succeeds() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let args = [
        "quantize",
        TINY,
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--force",
    ];
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    assert_eq!(code(&run_env(&args, &[])), Some(0));
    for env in [
        vec![("KQUANT_FAULT", "keep-old")],
        vec![("KQUANT_FAULT", "keep-old"), ("KQUANT_NO_RENAMEAT2", "1")],
    ] {
        let o = run_env(&args, &env);
        let e = stderr(&o);
        assert_eq!(code(&o), Some(0), "{e}");
        assert!(
            e.contains("warning:") && e.contains("could not be deleted"),
            "{e}"
        );
        assert!(whole(&out, Out::Checkpoint).is_some());
        // The next run deletes the old copy and says so.
        let o = run_env(&args, &[]);
        assert_eq!(code(&o), Some(0));
        assert!(stderr(&o).contains("warning: removed"), "{}", stderr(&o));
        only(t.path(), &["out"]);
    }
}

// ---------------------------------------------------------------------------------------------
// Two writers.

#[test]
fn a_second_writer_is_refused_while_the_first_holds_the_output() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    // Hold the output's lock as a running kquant would.
    let lock = std::fs::File::create(t.path().join(".out.kquant-lock")).unwrap();
    std::fs::write(t.path().join(".out.kquant-lock"), b"4242\nout\n").unwrap();
    use std::os::fd::AsRawFd;
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    for force in [false, true] {
        let mut a = vec![
            "quantize",
            TINY,
            "-o",
            out.to_str().unwrap(),
            "--scheme",
            "int4-pc",
        ];
        if force {
            a.push("--force");
        }
        let o = kquant(&a);
        let e = stderr(&o);
        assert_eq!(code(&o), Some(2), "{e}");
        assert!(
            e.contains("another kquant run (pid 4242)") && e.contains("hint:"),
            "{e}"
        );
    }
    assert!(!out.exists());
    drop(lock);
    let o = kquant(&[
        "quantize",
        TINY,
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "int4-pc",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    only(t.path(), &["out"]);
}

#[test]
fn racing_writers_never_both_win() {
    let t = tempfile::tempdir().unwrap();
    let d = quantized_draft(t.path());
    for c in commands(&d).into_iter().filter(|c| c.force.is_some()) {
        for round in 0..3 {
            let dir = t
                .path()
                .join(format!("race-{}-{round}", c.name.replace(' ', "-")));
            std::fs::create_dir(&dir).unwrap();
            let out = dir.join("out");
            let argv = c.argv(&out, false);
            let kids: Vec<Child> = (0..3)
                .map(|_| {
                    kquant_cmd()
                        .args(&argv)
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            let outs: Vec<Output> = kids
                .into_iter()
                .map(|k| k.wait_with_output().unwrap())
                .collect();
            let won = outs.iter().filter(|o| code(o) == Some(0)).count();
            let errs: Vec<String> = outs.iter().map(stderr).collect();
            assert_eq!(won, 1, "{}: exactly one writer wins: {errs:#?}", c.name);
            for o in outs.iter().filter(|o| code(o) != Some(0)) {
                let e = stderr(o);
                assert_eq!(code(o), Some(2), "{e}");
                assert!(
                    e.contains("another kquant run") || e.contains("already exists"),
                    "{}: {e}",
                    c.name
                );
            }
            assert!(whole(&out, c.out).is_some());
            only(&dir, &["out"]);
        }
    }
}

#[test]
fn two_captures_to_different_names_do_not_share_anything() {
    let t = tempfile::tempdir().unwrap();
    let d = quantized_draft(t.path());
    let c = commands(&d)
        .into_iter()
        .find(|c| c.name == "trace capture")
        .unwrap();
    let (a, b) = (t.path().join("a.trace"), t.path().join("a.other"));
    let kids: Vec<Child> = [&a, &b]
        .iter()
        .map(|o| {
            kquant_cmd()
                .args(c.argv(o, false))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for k in kids {
        let o = k.wait_with_output().unwrap();
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    }
    assert!(whole(&a, Out::Trace).is_some() && whole(&b, Out::Trace).is_some());
    only(t.path(), &["a.other", "a.trace", "hs", "q"]);
}

// ---------------------------------------------------------------------------------------------
// Kills.

/// SIGKILL at each named point of the claim, fresh and replacing, for every writing command:
/// the final name holds nothing or a whole output (the old one or the new one), and the next
/// run succeeds and leaves nothing else behind.
#[test]
fn kills_at_every_step_of_the_write_path() {
    let t = tempfile::tempdir().unwrap();
    let d = quantized_draft(t.path());
    for c in commands(&d) {
        let dir = t.path().join(c.name.replace(' ', "-"));
        std::fs::create_dir(&dir).unwrap();
        let out = dir.join("out");
        let argv = c.argv(&out, true);
        let argv: Vec<&OsStr> = argv.iter().map(|a| a.as_os_str()).collect();
        // Fresh output: killed before it is in place, nothing under the name.
        for point in ["locked", "staged"] {
            let o = run_env(&argv, &[("KQUANT_FAULT", point)]);
            assert_eq!(
                o.status.signal(),
                Some(libc::SIGKILL),
                "{}: {}",
                c.name,
                stderr(&o)
            );
            assert!(whole(&out, c.out).is_none(), "{} killed at {point}", c.name);
        }
        ok(&c, &out, true);
        only(&dir, &["out"]);
        whole(&out, c.out).unwrap();
        // Replacement: killed at every step, the name always holds a whole output.
        for (point, env) in [
            ("staged", None),
            ("exchanged", None),
            ("moved-aside", Some(("KQUANT_NO_RENAMEAT2", "1"))),
        ] {
            let mut e = vec![("KQUANT_FAULT", point)];
            e.extend(env);
            let o = run_env(&argv, &e);
            assert_eq!(
                o.status.signal(),
                Some(libc::SIGKILL),
                "{}: {}",
                c.name,
                stderr(&o)
            );
            match point {
                // Between the two renames of the fallback, the name is empty until the next
                // claim puts the old output back.
                "moved-aside" => assert!(whole(&out, c.out).is_none()),
                _ => assert!(whole(&out, c.out).is_some(), "{} at {point}", c.name),
            }
            let o = ok(&c, &out, true);
            let e = stderr(&o);
            assert!(
                e.contains("warning:"),
                "{}: the leftover is reported: {e}",
                c.name
            );
            if point == "moved-aside" {
                assert!(e.contains("was restored"), "{e}");
            }
            whole(&out, c.out).unwrap();
            only(&dir, &["out"]);
        }
    }
}

fn rounds() -> usize {
    std::env::var("KQUANT_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// SIGKILL (and SIGTERM) at random moments of every writing command, fresh and replacing.
#[test]
fn kills_at_random_moments_of_every_writing_command() {
    let t = tempfile::tempdir().unwrap();
    let d = quantized_draft(t.path());
    let mut rng = Rng(0x6b71_7561_6e74);
    for c in commands(&d) {
        let dir = t.path().join(c.name.replace(' ', "-"));
        std::fs::create_dir(&dir).unwrap();
        let out = dir.join("out");
        // How long a whole run takes here.
        let t0 = Instant::now();
        ok(&c, &out, false);
        let full = t0.elapsed().as_micros() as u64;
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        for round in 0..rounds() {
            for (replace, sig) in [
                (false, libc::SIGKILL),
                (true, libc::SIGKILL),
                (false, libc::SIGTERM),
                (true, libc::SIGTERM),
            ] {
                if replace && !out.exists() {
                    ok(&c, &out, false);
                }
                if !replace {
                    std::fs::remove_dir_all(&dir).unwrap();
                    std::fs::create_dir(&dir).unwrap();
                }
                let wait = Duration::from_micros(rng.below(full + full / 4));
                let mut k = kquant_cmd()
                    .args(c.argv(&out, replace))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                std::thread::sleep(wait);
                unsafe { libc::kill(k.id() as i32, sig) };
                let st = k.wait().unwrap();
                let now = whole(&out, c.out);
                let ctx = format!(
                    "{} round {round} replace {replace} sig {sig} after {wait:?}",
                    c.name
                );
                if replace {
                    assert!(now.is_some(), "{ctx}: the old or the new output is there");
                }
                if st.code().is_some() {
                    assert_eq!(st.code(), Some(0), "{ctx}");
                    assert!(now.is_some(), "{ctx}");
                } else if sig == libc::SIGTERM {
                    // A caught SIGTERM removes its partial output itself (a lock file alone can
                    // stay if the signal came in the microseconds between its creation and
                    // the claim's registration; the next run takes it over).
                    let mut keep = vec![];
                    if now.is_some() {
                        keep.push("out");
                    }
                    let mut left = names(&dir);
                    left.retain(|n| n != ".out.kquant-lock");
                    assert_eq!(left, keep, "{ctx}");
                }
                // The next run cleans up whatever a kill left.
                ok(&c, &out, true);
                only(&dir, &["out"]);
            }
        }
    }
}

/// The adversary's extras: a (dangling) symbolic link under the lock's name is refused and
/// never followed (nothing is created where it points), and a lock file that cannot be written
/// (a full disk, `KQUANT_FAULT=lock-enospc`) is removed, not left empty.
#[test]
fn lock_files_are_never_links_and_never_left_empty() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let victim = t.path().join("elsewhere").join("victim");
    std::os::unix::fs::symlink(&victim, t.path().join(".out.kquant-lock")).unwrap();
    let q = |env: &[(&str, &str)]| {
        let args = [
            "quantize",
            TINY,
            "-o",
            out.to_str().unwrap(),
            "--scheme",
            "int4-pc",
        ];
        let a: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        run_env(&a, env)
    };
    std::fs::create_dir(t.path().join("elsewhere")).unwrap();
    let o = q(&[]);
    let e = stderr(&o);
    assert_eq!(code(&o), Some(2), "{e}");
    assert!(e.contains("symbolic link") && e.contains("hint:"), "{e}");
    assert!(!victim.exists() && !out.exists());
    std::fs::remove_file(t.path().join(".out.kquant-lock")).unwrap();
    let o = q(&[("KQUANT_FAULT", "lock-enospc")]);
    let e = stderr(&o);
    assert_eq!(code(&o), Some(2), "{e}");
    assert!(e.contains("lock file") && e.contains("disk is full"), "{e}");
    assert_eq!(names(t.path()), vec!["elsewhere".to_string()]);
}

#[test]
fn leftovers_of_other_outputs_are_reported() {
    let t = tempfile::tempdir().unwrap();
    let stale = t.path().join(".other.kquant-partial");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("model.safetensors"), vec![0u8; 1000]).unwrap();
    let old_style = t.path().join(".x.kquant-tmp-12345");
    std::fs::create_dir(&old_style).unwrap();
    let old_trace = t.path().join("t.kquant-trace-tmp");
    std::fs::create_dir(&old_trace).unwrap();
    let out = t.path().join("out");
    let o = kquant(&[
        "quantize",
        TINY,
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "int4-pc",
    ]);
    let e = stderr(&o);
    assert_eq!(code(&o), Some(0), "{e}");
    for p in [&stale, &old_style, &old_trace] {
        assert!(e.contains(&format!("warning: `{}`", p.display())), "{e}");
    }
    assert!(
        stale.exists(),
        "another output's leftover is reported, not deleted"
    );
    // Re-running the command of `other` cleans it.
    let other = t.path().join("other");
    let o = kquant(&[
        "quantize",
        TINY,
        "-o",
        other.to_str().unwrap(),
        "--scheme",
        "int4-pc",
    ]);
    assert!(stderr(&o).contains("removed"), "{}", stderr(&o));
    assert!(!stale.exists());
}

// ---------------------------------------------------------------------------------------------
// A source that shrinks while it is read.

/// A Llama EAGLE-3 draft large enough that quantizing it takes a while (≈100 MB of BF16).
fn big_draft(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut cfg = read_json(&root().join(TINY).join("config.json"));
    let (h, i, heads, kv, hd) = (1536usize, 6144usize, 12usize, 4usize, 128usize);
    cfg["hidden_size"] = h.into();
    cfg["intermediate_size"] = i.into();
    cfg["num_attention_heads"] = heads.into();
    cfg["num_key_value_heads"] = kv.into();
    cfg["head_dim"] = hd.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let (v, dv) = (256usize, 128usize);
    let t: Vec<(&str, &str, Vec<usize>)> = vec![
        ("d2t", "I64", vec![dv]),
        ("fc.weight", "BF16", vec![h, 3 * h]),
        ("lm_head.weight", "BF16", vec![dv, h]),
        ("midlayer.hidden_norm.weight", "BF16", vec![h]),
        ("midlayer.input_layernorm.weight", "BF16", vec![h]),
        ("midlayer.mlp.down_proj.weight", "BF16", vec![h, i]),
        ("midlayer.mlp.gate_proj.weight", "BF16", vec![i, h]),
        ("midlayer.mlp.up_proj.weight", "BF16", vec![i, h]),
        ("midlayer.post_attention_layernorm.weight", "BF16", vec![h]),
        (
            "midlayer.self_attn.k_proj.weight",
            "BF16",
            vec![kv * hd, 2 * h],
        ),
        (
            "midlayer.self_attn.o_proj.weight",
            "BF16",
            vec![h, heads * hd],
        ),
        (
            "midlayer.self_attn.q_proj.weight",
            "BF16",
            vec![heads * hd, 2 * h],
        ),
        (
            "midlayer.self_attn.v_proj.weight",
            "BF16",
            vec![kv * hd, 2 * h],
        ),
        ("norm.weight", "BF16", vec![h]),
        ("t2d", "BOOL", vec![v]),
    ];
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    for (name, dt, shape) in &t {
        let n: usize = shape.iter().product();
        let start = data.len();
        match *dt {
            "I64" => (0..n).for_each(|k| data.extend_from_slice(&(k as i64).to_le_bytes())),
            "BOOL" => (0..n).for_each(|k| data.push((k < dv) as u8)),
            _ => (0..n).for_each(|k| {
                // Finite BF16 values in about ±0.06.
                let b: u16 = (0x3d00 + (k as u16 % 0x80)) | (((k / 7) as u16 & 1) << 15);
                data.extend_from_slice(&b.to_le_bytes())
            }),
        }
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    common::write_safetensors(
        &dir.join("model.safetensors"),
        serde_json::Value::Object(header).to_string().as_bytes(),
        data,
    );
}

#[test]
fn a_source_truncated_while_quantize_reads_it_is_an_error_not_a_crash() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("big");
    big_draft(&src);
    let shard = src.join("model.safetensors");
    let full = std::fs::metadata(&shard).unwrap().len();
    let out = t.path().join("out");
    let args = |o: &Path| {
        vec![
            "quantize".to_string(),
            src.to_str().unwrap().into(),
            "-o".into(),
            o.to_str().unwrap().into(),
            "--scheme".into(),
            "int4-pc".into(),
            "--exclude".into(),
            "fc,lm_head".into(),
        ]
    };
    // A whole run first, for its time.
    let t0 = Instant::now();
    let o = kquant_cmd().args(args(&out)).output().unwrap();
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let took = t0.elapsed();
    std::fs::remove_dir_all(&out).unwrap();
    let bytes = std::fs::read(&shard).unwrap();
    for k in 0..8u32 {
        std::fs::write(&shard, &bytes).unwrap();
        let child = kquant_cmd()
            .args(args(&out))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(took * (k + 1) / 12);
        // Cut the weights (the header stays readable).
        std::fs::OpenOptions::new()
            .write(true)
            .open(&shard)
            .unwrap()
            .set_len(full / 8)
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let e = stderr(&o);
        assert!(
            o.status.signal().is_none(),
            "killed by a signal: {:?} {e}",
            o.status
        );
        if code(&o) == Some(0) {
            // It had read everything before the cut: clear its output for the next round.
            std::fs::remove_dir_all(&out).unwrap();
            continue;
        }
        assert_eq!(code(&o), Some(2), "{e}");
        assert!(
            e.contains("error:") && e.contains("model.safetensors") && e.contains("hint:"),
            "{e}"
        );
        assert!(!out.exists());
        only(t.path(), &["big"]);
    }
}

// ---------------------------------------------------------------------------------------------
// Names and paths.

#[test]
fn output_paths_that_are_odd_but_valid_work_in_every_writing_command() {
    let t = tempfile::tempdir().unwrap();
    let d = quantized_draft(t.path());
    for c in commands(&d) {
        let dir = t.path().join(c.name.replace(' ', "-"));
        std::fs::create_dir(&dir).unwrap();
        // Not UTF-8, and the longest name a directory takes.
        let bad = dir.join(OsStr::from_bytes(b"out-\xff\xfe"));
        let long = dir.join("n".repeat(255));
        for o in [&bad, &long] {
            ok(&c, o, false);
            whole(o, c.out).unwrap();
        }
        // A regular file as the parent: named as such.
        std::fs::write(dir.join("plain"), b"x").unwrap();
        let argv = c.argv(&dir.join("plain").join("out"), false);
        let o = kquant_cmd().args(&argv).output().unwrap();
        let e = stderr(&o);
        assert_eq!(code(&o), Some(2), "{}: {e}", c.name);
        assert!(
            e.contains("is not a directory") && e.contains("hint:"),
            "{}: {e}",
            c.name
        );
        let argv = c.argv(&dir.join("missing").join("out"), false);
        let o = kquant_cmd().args(&argv).output().unwrap();
        assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
        // 256 bytes: too long for any filesystem, said so.
        let argv = c.argv(&dir.join("n".repeat(256)), false);
        let o = kquant_cmd().args(&argv).output().unwrap();
        assert_eq!(code(&o), Some(2));
        assert!(stderr(&o).contains("bytes long"), "{}", stderr(&o));
        let mut want = vec![
            "n".repeat(255),
            "out-\u{fffd}\u{fffd}".to_string(),
            "plain".to_string(),
        ];
        want.sort();
        let mut got: Vec<String> = names(&dir);
        got.sort();
        assert_eq!(got, want, "{}: only the outputs are left", c.name);
    }
}

#[test]
fn verify_files_does_not_trust_the_manifest_it_checks() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let o = kquant(&[
        "quantize",
        TINY,
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--max-shard-size",
        "20KB",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let shards: Vec<String> = names(&out)
        .into_iter()
        .filter(|n| n.starts_with("model-"))
        .collect();
    assert!(shards.len() > 1);
    // Delete a shard and take it out of the manifest.
    let mp = out.join("kquant-manifest.json");
    let mut m = read_json(&mp);
    let victim = &shards[1];
    m["outputs"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["file"] != victim.as_str());
    std::fs::write(&mp, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    std::fs::remove_file(out.join(victim)).unwrap();
    let o = kquant(&["verify-files", out.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(code(&o), Some(2), "{e}");
    assert!(
        e.contains("not a whole checkpoint") && e.contains(victim.as_str()),
        "{e}"
    );
    // Single-file output: the weights and their entry removed.
    let one = t.path().join("one");
    assert_eq!(
        code(&kquant(&[
            "quantize",
            TINY,
            "-o",
            one.to_str().unwrap(),
            "--scheme",
            "int4-pc"
        ])),
        Some(0)
    );
    let mp = one.join("kquant-manifest.json");
    let mut m = read_json(&mp);
    m["outputs"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["file"] != "model.safetensors");
    std::fs::write(&mp, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    std::fs::remove_file(one.join("model.safetensors")).unwrap();
    let o = kquant(&["verify-files", one.to_str().unwrap(), "--json"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
}

/// A refused output is one `error:`: the engine warning of the scheme (Quark INT4 per channel
/// loads nowhere) comes only once the output is claimed.
#[test]
fn refused_output_prints_no_engine_warning_first() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("taken");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), b"someone's").unwrap();
    let o = kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--exclude",
        "fc,lm_head",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("error:") && !err.contains("warning:"), "{err}");
    // And the same run to a free name still warns.
    let o = kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        t.path().join("free").to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--exclude",
        "fc,lm_head",
    ]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("warning: no serving engine loads"));
}

/// Flag errors say what exists instead of "see kquant --help": the schemes, the formats a scheme
/// is written as (and the schemes a format takes), the tap range of the target.
#[test]
fn flag_errors_name_what_exists() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let run = |args: &[&str]| {
        let o = common::kquant(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let src = "fixtures/kimi-k2.5-tiny/eagle3";
    let e = run(&[
        "quantize",
        src,
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "int5",
    ]);
    assert!(e.contains("[possible values: int4-pc, "), "{e}");
    assert!(
        e.contains("hint: pick one of the possible values above; `kquant schemes`"),
        "{e}"
    );
    assert!(!e.contains("kquant --help"), "{e}");
    // The same from a --config preset (read from a file, not checked by clap).
    let cfg = t.path().join("p.json");
    std::fs::write(&cfg, r#"{"scheme": "int5"}"#).unwrap();
    let e = run(&[
        "quantize",
        src,
        "-o",
        out.to_str().unwrap(),
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(e.contains("not a kquant quantize preset"), "{e}");
    assert!(
        e.contains("hint: a preset is a JSON object with the fields of the built-in ones"),
        "{e}"
    );
    assert!(
        !e.contains("config.json"),
        "a preset is not config.json: {e}"
    );
    let e = run(&[
        "quantize",
        src,
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "w4a8-fp8",
        "--format",
        "modelopt",
    ]);
    assert!(
        e.contains("--scheme w4a8-fp8 cannot be written as --format modelopt"),
        "{e}"
    );
    assert!(
        e.contains("hint: --scheme w4a8-fp8 is written as --format quark; or keep --format modelopt with one of: int4-g128, fp8-pc"),
        "{e}"
    );
    let e = run(&[
        "quantize",
        src,
        "-o",
        out.to_str().unwrap(),
        "--format",
        "compressed-tensors",
        "--quark-layout",
        "model",
    ]);
    assert!(
        e.contains("not --format compressed-tensors")
            && e.contains("hint: drop the --quark-* flags"),
        "{e}"
    );
    let e = run(&[
        "trace",
        "capture",
        "--target-checkpoint",
        "fixtures/kimi-k2.5-tiny/target",
        "--prompts",
        "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl",
        "--taps",
        "1,9",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        e.contains("tap 9 is not a pre-norm hidden state of this 4-layer target"),
        "{e}"
    );
    assert!(
        e.contains("hint: taps are HF hidden_states indices in 0..=3"),
        "{e}"
    );
}

/// #27.17: a reader that goes away (`… 2>&1 | head -1`) does not end a run. A calibrated
/// quantize whose stdout and stderr are closed after the first line finishes with exit 0 and
/// the same bytes as a quiet run, leaving no lock or partial file; `inspect` piped into
/// `head -1` exits 0 (not 141). Whatever the timing: head may close the pipe before or after
/// any of the writes, and every outcome but one is a failure.
#[test]
fn a_closed_stdout_and_stderr_do_not_cost_the_output() {
    let d = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_kquant");
    let r = root();
    let quantize = |out: &Path| {
        format!(
            "'{bin}' quantize '{e}' -o '{o}' --scheme int4-pc --exclude fc,lm_head --method gptq \
             --calibrate '{t}' --target-checkpoint '{g}'",
            e = r.join(EAGLE3).display(),
            o = out.display(),
            t = r.join(TRACE).display(),
            g = r.join(TARGET).display(),
        )
    };
    let piped = d.path().join("piped");
    let sh = |cmd: String| {
        let o = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{cmd} 2>&1 | head -1 >/dev/null; echo \"${{PIPESTATUS[0]}}\""
            ))
            .current_dir(d.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(sh(quantize(&piped)), "0", "quantize with its reader gone");
    let quiet = d.path().join("quiet");
    let o = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("{} >/dev/null 2>&1", quantize(&quiet)))
        .status()
        .unwrap();
    assert_eq!(o.code(), Some(0));
    // The manifest names its output path and time; the weights and config are the result.
    let result = |p: &Path| {
        tree_hash(p)
            .into_iter()
            .filter(|(n, _)| n != "kquant-manifest.json")
            .collect::<Vec<_>>()
    };
    assert_eq!(result(&piped), result(&quiet));
    assert!(piped.join("kquant-manifest.json").is_file());
    let left: Vec<String> = names(d.path())
        .into_iter()
        .filter(|n| n.contains("kquant-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let inspect = format!("'{bin}' inspect '{}' --tensors", r.join(TARGET).display());
    assert_eq!(sh(inspect), "0", "inspect | head -1");
}
