//! `kquant verify --device`: the device is checked before anything is read, so a build without
//! the device's feature or an unknown device exits 2 with a hint (`--device cpu`, the default,
//! is the f32 runtime that tests/verify.rs covers).

use crate::common;

use common::kquant;

fn verify_on(device: &str) -> std::process::Output {
    kquant(&[
        "verify",
        "--draft",
        "fixtures/kimi-k2.5-tiny/eagle3",
        "--trace",
        "fixtures/kimi-k2.5-tiny/trace",
        "--device",
        device,
    ])
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_exits_2_with_a_hint() {
    let out = verify_on("cuda");
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("error: device `cuda`: this kquant was built without the `cuda` feature"),
        "{e}"
    );
    assert!(e.contains("hint: rebuild with --features cuda"), "{e}");
}

#[cfg(not(feature = "hip"))]
#[test]
fn hip_without_the_feature_exits_2_with_a_hint() {
    let out = verify_on("hip:0");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hint: rebuild with --features hip"));
}

#[test]
fn unknown_device_exits_2() {
    let out = verify_on("gpu");
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("unknown device `gpu`") && e.contains("hint: use --device cpu"),
        "{e}"
    );
}

// ---- The routing, through the CPU replay of the kernels (`--device cpu-emu`) ----

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kquant::checkpoint::Checkpoint;
use kquant::gpu::CpuEmu;
use kquant::replay::load_drafter;
use kquant::runtime::linears::Exec;
use kquant::runtime::Drafter;
use kquant::trace::file::Trace;
use kquant::verify::walk::{walk, Matches, Walk};

const DRAFT: &str = "fixtures/kimi-k2.5-tiny/eagle3";
const TARGET: &str = "fixtures/kimi-k2.5-tiny/target";
const TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";

/// Largest share of depth-match bits (over every root of the replayed samples and every depth)
/// that may differ between the device replay and the f32 runtime on the same quantized draft:
/// the kernels read bf16 activations, the runtime f32, so a proposal whose f32 top-2 logit
/// margin is below what bf16 rounding moves can flip (measured: see docs/verify.md, `--device`).
const DEVICE_MASK_DIFF_MAX: f64 = 0.01;
/// Largest |Δ walk AL| between the two over the replayed samples.
const DEVICE_WALK_AL_TOL: f64 = 0.01;

/// `kquant quantize DRAFT --scheme int4-pc --format FORMAT` into `dir`.
fn quantized(dir: &Path, format: &str) -> PathBuf {
    let out = dir.join(format);
    let o = kquant(&[
        "quantize",
        DRAFT,
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--format",
        format,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

fn replay(d: &dyn Drafter, trace: &Trace, samples: usize) -> Vec<Matches> {
    trace
        .manifest
        .samples
        .iter()
        .take(samples)
        .map(|s| {
            let x = trace.tokens(s).unwrap();
            let taps: Vec<Vec<f32>> = d.taps().iter().map(|&t| trace.tap(s, t).unwrap()).collect();
            d.matches(&x, &taps, s.prompt_len, d.default_steps())
        })
        .collect()
}

/// How two replays of the same samples agree: replayed roots, depth-match bits (and how many
/// differ, how many are set in the first), roots with a differing bit, and each one's walk AL.
struct Agreement {
    roots: usize,
    bits: usize,
    diff: usize,
    ones: usize,
    diff_roots: usize,
    al: (f64, f64),
}

fn agreement(a: &[Matches], b: &[Matches]) -> Agreement {
    let mut g = Agreement {
        roots: 0,
        bits: 0,
        diff: 0,
        ones: 0,
        diff_roots: 0,
        al: (0.0, 0.0),
    };
    let (mut wa, mut wb) = (Walk::default(), Walk::default());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (x.depths, x.prompt_len, x.total_len),
            (y.depths, y.prompt_len, y.total_len)
        );
        for t in x.prompt_len.saturating_sub(1)..x.c.len() {
            let d = (x.c[t] ^ y.c[t]).count_ones() as usize;
            g.roots += 1;
            g.bits += x.depths;
            g.diff += d;
            g.ones += x.c[t].count_ones() as usize;
            g.diff_roots += usize::from(d > 0);
        }
        wa.add(&walk(x));
        wb.add(&walk(y));
    }
    g.al = (wa.al_walk(), wb.al_walk());
    g
}

/// The fixture EAGLE-3 draft quantized int4-pc (compressed-tensors and Quark): on the CPU
/// emulation device every quantized linear (fc, q/k/v/o, gate/up/down) runs through
/// `gpu::DeviceLinear` and the unquantized lm_head through `gpu::DenseLinear`, none falls back,
/// and the replay's depth-match bitmasks and walk AL equal the
/// f32 runtime's on the same checkpoint up to the bf16-activation near-ties bounded above.
/// `KQUANT_DEVICE_SAMPLES` replays more samples (default 12; the emulation is slow in debug).
#[test]
fn cpu_emu_replay_matches_the_f32_runtime() {
    let n: usize = std::env::var("KQUANT_DEVICE_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let t = tempfile::tempdir().unwrap();
    let target = Checkpoint::open(common::root().join(TARGET).to_str().unwrap()).unwrap();
    let trace = Trace::open(&common::root().join(TRACE)).unwrap();
    let emu = Exec::device(Some(Arc::new(CpuEmu::nvidia())));
    for format in ["compressed-tensors", "quark"] {
        let q = quantized(t.path(), format);
        let spec = q.to_str().unwrap();
        let f = load_drafter(spec, Some(&target), &Exec::F32).unwrap();
        let d = load_drafter(spec, Some(&target), &emu).unwrap();
        let (on, off) = d.linears().placement();
        assert_eq!(on.len(), 8, "{format}: on the device {on:?}, off {off:?}");
        assert!(off.is_empty(), "{format}: {off:?}");
        assert!(on.contains(&"fc".to_string()) && on.contains(&"midlayer.mlp.down_proj".into()));
        let dense = d.linears().dense_placement();
        assert_eq!(dense, (vec!["lm_head".to_string()], vec![]), "{format}");
        assert_eq!(
            f.linears().placement().0.len(),
            0,
            "f32 runtime: nothing on a device"
        );
        let (a, b) = (replay(f.as_ref(), &trace, n), replay(d.as_ref(), &trace, n));
        assert!(d.linears().take_error().is_none());
        let Agreement {
            roots,
            bits,
            diff,
            diff_roots,
            al: (al_f, al_d),
            ..
        } = agreement(&a, &b);
        eprintln!(
            "{format}: {n} samples, {roots} roots: {diff} of {bits} match bits differ \
             ({diff_roots} roots); walk AL f32 {al_f:.4}, cpu-emu {al_d:.4}"
        );
        assert!(roots > 100, "too few roots replayed: {roots}");
        // #38.23: docs/verify.md quotes the whole trace's figures (`KQUANT_DEVICE_SAMPLES=60`).
        if n == 60 {
            let doc = std::fs::read_to_string(common::root().join("docs/verify.md")).unwrap();
            let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
            let said = format!("walk AL {al_f:.4} (f32) vs {al_d:.4}");
            assert!(
                flat.contains(&said),
                "docs/verify.md should say `{said}` ({format})"
            );
            assert!(
                flat.contains(&format!("{diff} of 17 280 depth-match bits"))
                    || flat.contains(&format!(
                        "{format_name} {diff} bits",
                        format_name = if format == "quark" {
                            "Quark"
                        } else {
                            "compressed-tensors"
                        }
                    )),
                "docs/verify.md: {diff} bits ({format})"
            );
        }
        assert!(
            diff as f64 <= DEVICE_MASK_DIFF_MAX * bits as f64,
            "{format}: {diff} of {bits} match bits differ"
        );
        assert!(
            (al_f - al_d).abs() <= DEVICE_WALK_AL_TOL,
            "{format}: {al_f} vs {al_d}"
        );
    }
}

/// A trace of the fixture trace's first `n` samples in `dir`: the manifest trimmed, the shard
/// copied.
fn first_samples(dir: &Path, n: usize) -> PathBuf {
    let tr = dir.join("trace");
    std::fs::create_dir(&tr).unwrap();
    let src = common::root().join(TRACE);
    let mut m: serde_json::Value = common::read_json(&src.join("manifest.json"));
    m["samples"].as_array_mut().unwrap().truncate(n);
    std::fs::write(tr.join("manifest.json"), m.to_string()).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            std::fs::copy(&p, tr.join(p.file_name().unwrap())).unwrap();
        }
    }
    tr
}

/// `kquant verify --draft DRAFT --trace TRACE --target-checkpoint TARGET --device DEVICE --json -`:
/// the report and stderr.
fn verify_json(draft: &str, trace: &Path, device: &str) -> (serde_json::Value, String) {
    let o = kquant(&[
        "verify",
        "--draft",
        draft,
        "--trace",
        trace.to_str().unwrap(),
        "--target-checkpoint",
        TARGET,
        "--device",
        device,
        "--json",
        "-",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    (v, String::from_utf8_lossy(&o.stderr).to_string())
}

fn accept_length(v: &serde_json::Value) -> f64 {
    v["draft"]["accept_length"].as_f64().unwrap()
}

/// `kquant verify --device cpu-emu` end to end on a quantized draft over the first samples of
/// the trace: the routing line on stderr (the 8 quantized linears on the INT4 kernels, the
/// unquantized lm_head through the BLAS, nothing left on the CPU), and the same report as
/// `--device cpu` where the replays agree (walk AL within the bound above).
#[test]
fn verify_cli_routes_a_quantized_draft_through_the_device() {
    let t = tempfile::tempdir().unwrap();
    let q = quantized(t.path(), "compressed-tensors");
    let tr = first_samples(t.path(), 4);
    let (emu, err) = verify_json(q.to_str().unwrap(), &tr, "cpu-emu");
    assert!(
        err.contains("8 quantized linear(s) on cpu (kernel emulation")
            && err.contains("; 1 unquantized linear(s) on cpu (kernel emulation")
            && err.contains("(vendor BLAS in the stored bf16/f16): lm_head")
            && !err.contains("on the CPU"),
        "{err}"
    );
    let (cpu, err_cpu) = verify_json(q.to_str().unwrap(), &tr, "cpu");
    assert!(!err_cpu.contains("device:"), "{err_cpu}");
    assert!(
        (accept_length(&emu) - accept_length(&cpu)).abs() <= DEVICE_WALK_AL_TOL,
        "{emu} vs {cpu}"
    );
}

/// The whole draft on the device: `kquant verify --device cpu-emu` on the unquantized (BF16)
/// fixture drafts puts every linear — lm_head and fc included — on the device through the
/// dense path (EAGLE-3: all 9; DFlash: its own linears and the target's lm_head), nothing on
/// the CPU, and the accept length is within `DEVICE_WALK_AL_TOL` of `--device cpu` (the f32
/// runtime; the device reads bf16 activations).
#[test]
fn verify_cli_runs_an_unquantized_draft_wholly_on_the_device() {
    let t = tempfile::tempdir().unwrap();
    let tr = first_samples(t.path(), 4);
    for (draft, linears, names) in [
        (DRAFT, 9, "fc, lm_head, midlayer.mlp.down_proj"),
        ("fixtures/kimi-k2.5-tiny/dflash", 0, "lm_head (target)"),
    ] {
        let (emu, err) = verify_json(draft, &tr, "cpu-emu");
        assert!(
            err.contains("0 quantized linear(s) on cpu (kernel emulation")
                && err.contains(names)
                && !err.contains("on the CPU"),
            "{draft}: {err}"
        );
        if linears > 0 {
            assert!(
                err.contains(&format!("; {linears} unquantized linear(s) on cpu")),
                "{err}"
            );
        }
        let (cpu, _) = verify_json(draft, &tr, "cpu");
        let (a, b) = (accept_length(&emu), accept_length(&cpu));
        eprintln!("{draft}: accept length cpu-emu {b:.4} vs cpu {a:.4}");
        assert!(
            (a - b).abs() <= DEVICE_WALK_AL_TOL,
            "{draft}: {emu} vs {cpu}"
        );
    }
}

/// `spec` on the emulation twice: the whole step on the device, and per linear (each says so).
fn whole_and_per_linear(
    spec: &str,
    target: &Checkpoint,
) -> (Arc<CpuEmu>, Box<dyn Drafter>, Box<dyn Drafter>) {
    let emu = Arc::new(CpuEmu::nvidia());
    let whole = Exec::device(Some(emu.clone()));
    let w = load_drafter(spec, Some(target), &whole).unwrap();
    let p = load_drafter(spec, Some(target), &whole.per_linear()).unwrap();
    assert_eq!(w.device_step(), Some(Ok(())), "{spec}");
    assert!(matches!(p.device_step(), Some(Err(_))), "{spec}");
    (emu, w, p)
}

/// The whole EAGLE-3 step on the device (`runtime::eagle3::device`: norms, embedding gather,
/// rotary, attention, SwiGLU and the residuals as device kernels, `kernels/ops.cu`) against the
/// per-linear device path (the linears on the device, the rest of the step in f32 on the CPU):
/// both round each linear's input to bf16, so their replays differ only by the kernels'
/// reduction order — bounded here as the per-linear path is against the f32 runtime. On the
/// quantized fixture draft and on the unquantized one (every linear through the vendor BLAS).
/// Across the whole-step replay, the taps of a sample go up once and the rest of what crosses
/// is token ids, positions and row indices up, one proposal index per computed row back (the
/// emulation counts every copy); the per-linear path copies activations both ways.
#[test]
fn the_whole_step_on_the_device_equals_the_per_linear_path_and_moves_token_ids_only() {
    let t = tempfile::tempdir().unwrap();
    let target = Checkpoint::open(common::root().join(TARGET).to_str().unwrap()).unwrap();
    let trace = Trace::open(&common::root().join(TRACE)).unwrap();
    let q = quantized(t.path(), "compressed-tensors");
    let plain = common::root().join(DRAFT);
    for spec in [q.to_str().unwrap(), plain.to_str().unwrap()] {
        let (emu, w, p) = whole_and_per_linear(spec, &target);
        assert_eq!(
            load_drafter(spec, Some(&target), &Exec::F32)
                .unwrap()
                .device_step(),
            None
        );

        // One sample, counted: what crosses in the whole-step replay.
        let s = &trace.manifest.samples[0];
        let x = trace.tokens(s).unwrap();
        let taps: Vec<Vec<f32>> = w.taps().iter().map(|&j| trace.tap(s, j).unwrap()).collect();
        let depths = w.default_steps();
        let before = emu.transfers();
        let m = w.matches(&x, &taps, s.prompt_len, depths);
        let moved = emu.transfers();
        assert!(w.linears().take_error().is_none());
        let pairs = x.len() - 1;
        let rows = pairs - (s.prompt_len - 1);
        let ht = w.target_hidden();
        let taps_bytes = pairs * 3 * ht * 4;
        let (dtoh, htod) = (
            moved.dtoh_bytes - before.dtoh_bytes,
            moved.htod_bytes - before.htod_bytes,
        );
        assert_eq!(
            dtoh,
            4 * rows * depths,
            "{spec}: one index per row and depth back"
        );
        assert_eq!(moved.dtoh_calls - before.dtoh_calls, depths, "{spec}");
        // Besides the taps: the rotary table (positions × head_dim f32) and int32 ids, positions,
        // rows and slots, a few per row and depth.
        let rope_bytes = (pairs + depths) * 64 * 4 * 2;
        let ints = 4 * (3 * pairs + depths * (4 * rows + 1) + rows * depths * depths);
        assert!(
            htod >= taps_bytes && htod <= taps_bytes + rope_bytes + ints,
            "{spec}: {htod} bytes up, taps {taps_bytes}"
        );
        let before = emu.transfers();
        let mp = p.matches(&x, &taps, s.prompt_len, depths);
        let per = emu.transfers();
        eprintln!(
            "{spec}: one sample of {pairs} pairs, {depths} depths: whole step {htod} B up / {dtoh} \
             B back; per linear {} B up / {} B back",
            per.htod_bytes - before.htod_bytes,
            per.dtoh_bytes - before.dtoh_bytes
        );
        assert!(per.dtoh_bytes - before.dtoh_bytes > 20 * dtoh, "{spec}");
        assert_eq!(m.c.len(), mp.c.len());

        // The replays agree as the device path agrees with the f32 runtime.
        let (a, b) = (replay(p.as_ref(), &trace, 8), replay(w.as_ref(), &trace, 8));
        assert!(w.linears().take_error().is_none() && p.linears().take_error().is_none());
        let Agreement {
            bits,
            diff,
            al: (al_p, al_w),
            ..
        } = agreement(&a, &b);
        eprintln!("{spec}: {diff} of {bits} match bits differ; walk AL per linear {al_p:.4}, whole step {al_w:.4}");
        assert!(bits > 500);
        assert!(
            diff as f64 <= DEVICE_MASK_DIFF_MAX * bits as f64,
            "{spec}: {diff} of {bits}"
        );
        assert!(
            (al_p - al_w).abs() <= DEVICE_WALK_AL_TOL,
            "{spec}: {al_p} vs {al_w}"
        );
    }
}

/// The MLA EAGLE-3 drafts (DeepSeek MLA attention: low-rank query with its norm, latent kv with its
/// norm, one rotary key shared by the heads, interleaved YaRN rotary) run their whole step on the
/// device too, unquantized (every linear through the vendor BLAS) and int4-pc: the proposals of
/// the engine chain and pass A's match bits over a sequence the f32 draft agrees with equal the
/// per-linear path's within the device bounds.
#[test]
fn mla_drafts_run_the_whole_step_on_the_device() {
    let t = tempfile::tempdir().unwrap();
    let target = Checkpoint::open(
        common::root()
            .join("fixtures/tiny/target-kimi-k2")
            .to_str()
            .unwrap(),
    )
    .unwrap();
    let src = "fixtures/tiny/eagle3-mla-torchspec";
    let q = t.path().join("int4");
    let o = kquant(&[
        "quantize",
        src,
        "-o",
        q.to_str().unwrap(),
        "--scheme",
        "int4-pc",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plain = common::root().join(src);
    for spec in [plain.to_str().unwrap(), q.to_str().unwrap()] {
        let (_, w, p) = whole_and_per_linear(spec, &target);
        let f = load_drafter(spec, Some(&target), &Exec::F32).unwrap();
        // Taps and a prompt at random, then a continuation the f32 draft proposes itself, so
        // that the depths match often.
        let (len, prompt, ht) = (64usize, 16usize, w.target_hidden());
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let taps: Vec<Vec<f32>> = w
            .taps()
            .iter()
            .map(|_| {
                (0..len * ht)
                    .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                    .collect()
            })
            .collect();
        let mut x: Vec<u32> = (0..prompt).map(|_| (next() % 256) as u32).collect();
        while x.len() < len {
            x.push(f.propose(&x, &taps, 1)[0]);
        }
        let steps = w.default_steps();
        let (mw, mp) = (
            w.matches(&x, &taps, prompt, steps),
            p.matches(&x, &taps, prompt, steps),
        );
        assert!(w.linears().take_error().is_none(), "{spec}");
        let (mut bits, mut diff, mut ones) = (0usize, 0usize, 0usize);
        for t in prompt - 1..mw.c.len() {
            bits += steps;
            diff += (mw.c[t] ^ mp.c[t]).count_ones() as usize;
            ones += mw.c[t].count_ones() as usize;
        }
        eprintln!("{spec}: {diff} of {bits} match bits differ ({ones} set)");
        assert!(
            ones * 4 > bits,
            "{spec}: the sequence is the draft's own: {ones} of {bits}"
        );
        assert!(
            diff as f64 <= DEVICE_MASK_DIFF_MAX * bits as f64,
            "{spec}: {diff} of {bits}"
        );
        // The engine chain from every prefix: whole step against per linear.
        let (mut same, mut all) = (0usize, 0usize);
        for end in (prompt..len).step_by(4) {
            let (a, b) = (
                w.propose(&x[..end], &taps, steps),
                p.propose(&x[..end], &taps, steps),
            );
            all += a.len();
            same += a.iter().zip(&b).filter(|(u, v)| u == v).count();
        }
        assert!(w.linears().take_error().is_none(), "{spec}");
        assert!(
            same * 100 >= all * 97,
            "{spec}: {same} of {all} proposals equal"
        );
    }
}

/// The DFlash drafter's whole step on the device (`runtime::dflash::device`: the context keys
/// and values, then every block pass — embedding, per-head q/k norms, rotary, attention over the
/// context rows before the root and the block's own rows, the MLP — and the target lm_head's
/// argmax) against its per-linear device path, unquantized and int4-pc: the replay's match bits
/// and walk AL within the device bounds, the engine's proposals, and what crosses — the taps once
/// a sequence and one index per slot back.
#[test]
fn the_dflash_step_on_the_device_equals_the_per_linear_path() {
    let t = tempfile::tempdir().unwrap();
    let target = Checkpoint::open(common::root().join(TARGET).to_str().unwrap()).unwrap();
    let trace = Trace::open(&common::root().join(TRACE)).unwrap();
    let src = "fixtures/kimi-k2.5-tiny/dflash";
    let q = t.path().join("int4");
    let o = kquant(&[
        "quantize",
        src,
        "-o",
        q.to_str().unwrap(),
        "--scheme",
        "int4-pc",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plain = common::root().join(src);
    for spec in [plain.to_str().unwrap(), q.to_str().unwrap()] {
        let (emu, w, p) = whole_and_per_linear(spec, &target);

        let s = &trace.manifest.samples[0];
        let x = trace.tokens(s).unwrap();
        let taps: Vec<Vec<f32>> = w.taps().iter().map(|&j| trace.tap(s, j).unwrap()).collect();
        let depths = w.default_steps();
        let before = emu.transfers();
        w.matches(&x, &taps, s.prompt_len, depths);
        let moved = emu.transfers();
        assert!(w.linears().take_error().is_none(), "{spec}");
        let roots = x.len() - 1 - s.prompt_len.max(1);
        let dtoh = moved.dtoh_bytes - before.dtoh_bytes;
        assert_eq!(dtoh, 4 * roots * depths, "{spec}: one index per slot back");
        let taps_bytes = (roots + s.prompt_len.max(1) - 1) * taps.len() * w.target_hidden() * 4;
        let htod = moved.htod_bytes - before.htod_bytes;
        assert!(
            htod >= taps_bytes && htod < 2 * taps_bytes,
            "{spec}: {htod} up, taps {taps_bytes}"
        );

        let (a, b) = (replay(p.as_ref(), &trace, 6), replay(w.as_ref(), &trace, 6));
        assert!(w.linears().take_error().is_none() && p.linears().take_error().is_none());
        let Agreement {
            bits,
            diff,
            ones,
            al: (al_p, al_w),
            ..
        } = agreement(&a, &b);
        eprintln!(
            "{spec}: {diff} of {bits} match bits differ ({ones} set); walk AL per linear {al_p:.4}, whole step {al_w:.4}"
        );
        assert!(bits > 500 && ones > bits / 10, "{spec}: {ones} of {bits}");
        assert!(
            diff as f64 <= DEVICE_MASK_DIFF_MAX * bits as f64,
            "{spec}: {diff} of {bits}"
        );
        assert!(
            (al_p - al_w).abs() <= DEVICE_WALK_AL_TOL,
            "{spec}: {al_p} vs {al_w}"
        );
        for end in [2, 40, x.len() - 1] {
            assert_eq!(
                w.propose(&x[..end], &taps, depths),
                p.propose(&x[..end], &taps, depths),
                "{spec}: prefix of {end}"
            );
        }
    }
}
