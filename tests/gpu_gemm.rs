//! The three kernel regimes against the CPU reference (dequantize + f32 GEMM; exact integer W4A8)
//! on every device, each test in tiers (`common::device_tests!`): `::cpu_emu`, the kernels' CPU
//! replay through the same launch sequence (regime B lane by lane over the documented `mma.sync`
//! operand maps; separate tests replay the AMD MFMA maps), always; `::cuda` under
//! `--features cuda` and `::hip` under `--features hip`, `#[ignore]`d (they need the GPU and fail
//! without it; `-- --ignored` runs them). Shapes: the Kimi draft's K values with a slice of N
//! (the full N on a GPU under `KQUANT_GPU_FULL_SHAPES=1`); M ∈ {1,2,4,8} for regime A,
//! {9,16,32,64,128} for B, {129,256} for C.

use crate::common::{self, device_tests};

use kquant::gpu::reference::{
    act_to_f32, first_violation, quantize_act_ref, w4a16_tol, Prepared, W4A8_REL_L1_TOL,
};
use kquant::gpu::{Act, Backend, CpuEmu, Regime, W4Layout};
use kquant::io::Dtype;
use kquant::quant::compressed_tensors;
use kquant::quant::math::int4;

/// Deterministic values in `[-a, a)` plus `b`, rounded to `dtype` (bf16 weights / f32 activations).
fn matrix(rows: usize, cols: usize, dtype: Dtype, a: f32, b: f32) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2654435761).rotate_left(13) ^ 0x9e37_79b9;
            let v = (h % 20001) as f32 / 10000.0 - 1.0;
            int4::round_to(dtype, v * a + b)
        })
        .collect()
}

/// (K, N) of the Kimi-K2.5 EAGLE-3 draft's linears: fc, qkv, o, gate_up, down (+ an 18432 MLP).
const KIMI: [(usize, usize); 6] = [
    (21504, 7168),
    (14336, 24576),
    (8192, 7168),
    (7168, 24576),
    (12288, 7168),
    (18432, 7168),
];
const MS_A: [usize; 4] = [1, 2, 4, 8];
const MS_B: [usize; 5] = [9, 16, 32, 64, 128];
const MS_C: [usize; 2] = [129, 256];

/// The rows of N a device takes: all on a GPU under `KQUANT_GPU_FULL_SHAPES=1`, else 16.
fn slice_n(dev: &dyn Backend, n: usize) -> usize {
    if !common::is_emulation(dev) && std::env::var("KQUANT_GPU_FULL_SHAPES").as_deref() == Ok("1") {
        n
    } else {
        16 // one MMA warp tile of every shape: K (the reduction) is what the kernels loop over
    }
}

fn activations(m: usize, k: usize, act: Act) -> Vec<u16> {
    matrix(m, k, Dtype::F32, 1.0, 0.01)
        .into_iter()
        .map(|v| act.from_f32(v))
        .collect()
}

fn check_w4a16(
    dev: &dyn Backend,
    w: &W4Layout,
    act: Act,
    what: &str,
    ms: &[usize],
    regime: Regime,
) {
    let d = dev.upload(w).expect("upload");
    let p = Prepared::new(w);
    for &m in ms {
        let x = activations(m, w.k, act);
        let xf = act_to_f32(&x, act);
        let want = p.gemm(&xf, m);
        let got = dev.w4a16_on(&d, &x, act, m, regime).expect("launch");
        let tol = w4a16_tol(regime, act, w.per_channel());
        let l1 = p.abs_l1(&xf, m);
        let ctx = format!(
            "W4A16 {} {what} {} m={m} n={} k={}",
            regime.name(),
            act.name(),
            w.n,
            w.k
        );
        within(dev, &ctx, (&got, &want, &l1), tol);
    }
}

/// `got` within `rel · Σ_k |w·x| + ABS_FLOOR` of `want`, `l1` holding the `Σ_k |w·x|`; the largest
/// `|y − y_ref| / Σ_k |w·x|` goes to stderr (`--nocapture`): what a hardware run records beside
/// each bound (docs/kernels.md, "measured").
fn within(dev: &dyn Backend, ctx: &str, (got, want, l1): (&[f32], &[f32], &[f32]), rel: f32) {
    let worst = got
        .iter()
        .zip(want)
        .zip(l1)
        .map(|((g, r), s)| ((g - r).abs() / s.max(f32::MIN_POSITIVE)) as f64)
        .fold(0.0f64, f64::max);
    eprintln!(
        "measured: {} {ctx}: max |Δ|/Σ|w·x| = {worst:.2e} (bound {rel:.1e})",
        dev.name()
    );
    if let Some((i, g, r, b)) = first_violation(got, want, l1, rel) {
        panic!(
            "{}: {ctx}: y[{i}] = {g}, reference {r}, bound {b}",
            dev.name()
        );
    }
}

/// W4A8: within the named bound for the GEMV (float split-K partials), bit-exact for the MMA
/// kernel (int32 partials reduced exactly, the reference's float epilogue).
fn check_w4a8(dev: &dyn Backend, w: &W4Layout, act: Act, ms: &[usize], regime: Regime) {
    let d = dev.upload(w).expect("upload");
    let p = Prepared::new(w);
    for &m in ms {
        let x = activations(m, w.k, act);
        let a = quantize_act_ref(&x, act, m, w.k);
        let want = p.w4a8(&a, m);
        let got = dev.w4a8_on(&d, &x, act, m, regime).expect("launch");
        let ctx = format!(
            "W4A8 {} {} m={m} n={} k={}",
            regime.name(),
            act.name(),
            w.n,
            w.k
        );
        if regime == Regime::Gemv {
            let l1 = p.w4a8_abs_l1(&a, m);
            within(dev, &ctx, (&got, &want, &l1), W4A8_REL_L1_TOL);
        } else {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "{}: {ctx}: not bit-exact",
                dev.name()
            );
        }
    }
}

/// Per channel (the Quark recipe) and per group 128 (the compressed-tensors recipe).
fn kimi_layouts(dev: &dyn Backend, k: usize, n: usize) -> (W4Layout, W4Layout) {
    let n = slice_n(dev, n);
    let w = matrix(n, k, Dtype::BF16, 0.05, -0.002);
    let pc = W4Layout::from_int4(&int4::quantize(&w, n, k, k, Dtype::BF16)).unwrap();
    let g128 =
        W4Layout::from_int4(&compressed_tensors::quantize(&w, n, k, 128, Dtype::BF16)).unwrap();
    (pc, g128)
}

/// One regime on one device over every Kimi shape: W4A16 per channel and group 128 in bf16
/// and f16, W4A8 per channel. The CPU replay (debug builds run it at a few MFLOP/s) takes every
/// M for per-channel bf16, group-128 f16 and W4A8, and for the other two combinations, which
/// share all code paths with those, the first and last M (regime C: the first); GPUs take every
/// combination.
fn run_kimi(dev: &dyn Backend, regime: Regime, ms: &[usize], shapes: &[(usize, usize)]) {
    let ends = [ms[0], ms[ms.len() - 1]];
    let some: &[usize] = match (common::is_emulation(dev), regime) {
        (false, _) => ms,
        (true, Regime::Dense) => &ms[..1],
        (true, _) => &ends,
    };
    for &(k, n) in shapes {
        let (pc, g128) = kimi_layouts(dev, k, n);
        check_w4a16(dev, &pc, Act::Bf16, "per-channel", ms, regime);
        check_w4a16(dev, &g128, Act::F16, "group-128", ms, regime);
        check_w4a16(dev, &pc, Act::F16, "per-channel", some, regime);
        check_w4a16(dev, &g128, Act::Bf16, "group-128", some, regime);
        check_w4a8(dev, &pc, Act::Bf16, ms, regime);
    }
}

device_tests! {
    fn gemv_matches_reference_on_every_device(d) {
        eprintln!("gpu_gemm: regime A on {}", d.name());
        run_kimi(d.as_ref(), Regime::Gemv, &MS_A, &KIMI);
    }

    fn mma_matches_reference_on_every_device(d) {
        eprintln!("gpu_gemm: regime B on {}", d.name());
        run_kimi(d.as_ref(), Regime::Mma, &MS_B, &KIMI);
    }

    fn dense_matches_reference_on_every_device(d) {
        eprintln!("gpu_gemm: regime C on {}", d.name());
        run_kimi(d.as_ref(), Regime::Dense, &MS_C, &KIMI);
    }

    /// Small odd shapes exercise the tails in every regime: K not a multiple of 32 / 128, N not
    /// a multiple of 16, M not a multiple of the token tile, groups of 32, 64, 96 and 128 that
    /// split a 128-weight k-tile.
    fn tails_on_every_device(d) {
        tails(d.as_ref());
    }

    /// The plain calls pick the regime by M (A ≤ `gemv_max_m` < B ≤ `mma_max_m` < C, per arch)
    /// and agree with the explicit ones.
    fn dispatch_by_m(d) {
        dispatch(d.as_ref());
    }

    fn preconditions_are_checked(d) {
        preconditions(d.as_ref());
    }

    /// Weights uploaded kept (a replay's layers) give exactly what per-call dequantization
    /// gives, in every regime, call after call and across activation dtypes.
    fn kept_weights_give_the_per_call_results(d) {
        kept(d.as_ref());
    }
}

fn kept(d: &dyn Backend) {
    for (k, n, group) in [(264, 20, 264), (448, 18, 64)] {
        let w = matrix(n, k, Dtype::BF16, 0.05, 0.001);
        let q = if group == k {
            int4::quantize(&w, n, k, k, Dtype::BF16)
        } else {
            compressed_tensors::quantize(&w, n, k, group, Dtype::BF16)
        };
        let l = W4Layout::from_int4(&q).unwrap();
        let (plain, kept) = (d.upload(&l).unwrap(), d.upload_kept(&l).unwrap());
        for act in [Act::Bf16, Act::F16, Act::Bf16] {
            for (m, regime) in [
                (1, Regime::Gemv),
                (9, Regime::Mma),
                (130, Regime::Dense),
                (3, Regime::Dense),
            ] {
                let x = activations(m, k, act);
                let want = d.w4a16_on(&plain, &x, act, m, regime).unwrap();
                for call in 0..2 {
                    assert_eq!(
                        d.w4a16_on(&kept, &x, act, m, regime).unwrap(),
                        want,
                        "{} k={k} group={group} {act:?} m={m} {regime:?} call {call}",
                        d.name()
                    );
                }
                if regime == Regime::Dense {
                    let best: Vec<usize> = want
                        .chunks(n)
                        .map(kquant::gpu::reference::argmax_ref)
                        .collect();
                    assert_eq!(d.w4a16_argmax_on(&kept, &x, act, m, regime).unwrap(), best);
                }
            }
        }
    }
}

/// On the emulation the launches can be counted: kept weights are dequantized once per
/// activation dtype, not at every regime-C call; plain ones at every call.
#[test]
fn kept_weights_are_dequantized_once() {
    let d = CpuEmu::nvidia();
    let (k, n) = (264, 20);
    let w = matrix(n, k, Dtype::BF16, 0.05, 0.0);
    let l = W4Layout::from_int4(&int4::quantize(&w, n, k, k, Dtype::BF16)).unwrap();
    let dequants = |d: &CpuEmu| -> usize {
        d.launches()
            .iter()
            .filter(|(name, _)| name.contains("dequant"))
            .map(|(_, c)| c)
            .sum()
    };
    let kept = d.upload_kept(&l).unwrap();
    let x = activations(130, k, Act::Bf16);
    for _ in 0..3 {
        d.w4a16_on(&kept, &x, Act::Bf16, 130, Regime::Dense)
            .unwrap();
    }
    assert_eq!(dequants(&d), 1, "{:?}", d.launches());
    let xf = activations(130, k, Act::F16);
    d.w4a16_on(&kept, &xf, Act::F16, 130, Regime::Dense)
        .unwrap();
    assert_eq!(dequants(&d), 2, "another dtype, another dense copy");
    let plain = d.upload(&l).unwrap();
    for _ in 0..3 {
        d.w4a16_on(&plain, &x, Act::Bf16, 130, Regime::Dense)
            .unwrap();
    }
    assert_eq!(dequants(&d), 5, "{:?}", d.launches());
}

/// The AMD MFMA lane roles and operand maps, replayed on the CPU (the HIP kernel itself is only
/// compile-checked here): the smallest and largest Kimi K, every regime-B M.
#[test]
fn mma_amd_replay_matches_reference() {
    let amd = CpuEmu::amd();
    run_kimi(&amd, Regime::Mma, &MS_B, &[KIMI[0], KIMI[3]]);
}

/// The tails on the AMD replay (wavefront 64, gfx942 geometry).
#[test]
fn tails_on_the_amd_replay() {
    tails(&CpuEmu::amd());
}

fn tails(d: &dyn Backend) {
    for (k, n) in [(40, 3), (72, 9), (1000, 5), (264, 17), (8, 1)] {
        let w = matrix(n, k, Dtype::BF16, 0.05, 0.0);
        let pc = W4Layout::from_int4(&int4::quantize(&w, n, k, k, Dtype::BF16)).unwrap();
        check_w4a16(d, &pc, Act::Bf16, "tail", &[1, 3, 8], Regime::Gemv);
        check_w4a16(d, &pc, Act::F16, "tail", &[1, 9, 17, 40], Regime::Mma);
        check_w4a16(d, &pc, Act::Bf16, "tail", &[1, 9, 17, 40], Regime::Mma);
        check_w4a16(d, &pc, Act::Bf16, "tail", &[3, 130], Regime::Dense);
        check_w4a8(d, &pc, Act::F16, &[1, 5], Regime::Gemv);
        check_w4a8(d, &pc, Act::F16, &[1, 9, 23], Regime::Mma);
    }
    for (k, n, group) in [(96, 5, 32), (448, 18, 64), (384, 7, 96), (640, 3, 128)] {
        let w = matrix(n, k, Dtype::BF16, 0.05, 0.001);
        let g = W4Layout::from_int4(&compressed_tensors::quantize(&w, n, k, group, Dtype::BF16))
            .unwrap();
        for act in [Act::Bf16, Act::F16] {
            check_w4a16(d, &g, act, "group tail", &[2, 7], Regime::Gemv);
            check_w4a16(d, &g, act, "group tail", &[1, 9, 33, 70], Regime::Mma);
            check_w4a16(d, &g, act, "group tail", &[5, 131], Regime::Dense);
        }
    }
}

fn dispatch(d: &dyn Backend) {
    let (k, n) = (264, 20);
    let w = matrix(n, k, Dtype::BF16, 0.05, 0.0);
    let pc = W4Layout::from_int4(&int4::quantize(&w, n, k, k, Dtype::BF16)).unwrap();
    let dw = d.upload(&pc).unwrap();
    // Each boundary of the device's own thresholds (Hopper's, as measured, has no GEMV).
    let t = d.arch().tune();
    let mut cases = vec![
        (t.gemv_max_m + 1, Regime::Mma),
        (t.mma_max_m, Regime::Mma),
        (t.mma_max_m + 1, Regime::Dense),
    ];
    if t.gemv_max_m > 0 {
        cases.push((t.gemv_max_m, Regime::Gemv));
    }
    // Kept weights (a replay's) leave the MMA kernel where it falls behind bf16 itself.
    assert!(t.mma_max_m_kept <= t.mma_max_m);
    assert_eq!(d.regime_kept(t.mma_max_m_kept), Regime::Mma, "{}", d.name());
    assert_eq!(d.regime_kept(t.mma_max_m_kept + 1), Regime::Dense);
    let kept = d.upload_kept(&pc).unwrap();
    assert!(kept.kept && !dw.kept);
    assert_eq!(kept.regime_on(d, t.mma_max_m_kept + 1), Regime::Dense);
    assert_eq!(
        dw.regime_on(d, t.mma_max_m_kept + 1),
        d.regime(t.mma_max_m_kept + 1)
    );
    for (m, regime) in cases {
        assert_eq!(d.regime(m), regime, "{} m={m}", d.name());
        let x = activations(m, k, Act::Bf16);
        let auto = d.w4a16(&pc, &x, Act::Bf16, m).unwrap();
        assert_eq!(auto, d.w4a16_on(&dw, &x, Act::Bf16, m, regime).unwrap());
        let auto8 = d.w4a8(&pc, &x, Act::Bf16, m).unwrap();
        assert_eq!(auto8, d.w4a8_on(&dw, &x, Act::Bf16, m, regime).unwrap());
    }
}

fn preconditions(d: &dyn Backend) {
    let w = matrix(4, 36, Dtype::BF16, 0.05, 0.0);
    let l = W4Layout::from_int4(&int4::quantize(&w, 4, 36, 36, Dtype::BF16)).unwrap();
    let w2 = matrix(4, 64, Dtype::BF16, 0.05, 0.0);
    let l2 = W4Layout::from_int4(&int4::quantize(&w2, 4, 64, 64, Dtype::BF16)).unwrap();
    let g =
        W4Layout::from_int4(&compressed_tensors::quantize(&w2, 4, 64, 32, Dtype::BF16)).unwrap();
    let dl = d.upload(&l).unwrap();
    let dl2 = d.upload(&l2).unwrap();
    let dg = d.upload(&g).unwrap();
    for r in [Regime::Gemv, Regime::Mma, Regime::Dense] {
        assert!(
            d.w4a16_on(&dl, &[0; 36], Act::Bf16, 1, r).is_err(),
            "K % 8 != 0"
        );
        assert!(
            d.w4a16_on(&dl2, &[0; 63], Act::Bf16, 1, r).is_err(),
            "x length"
        );
        assert!(d.w4a16_on(&dl2, &[], Act::Bf16, 0, r).is_err(), "M = 0");
        assert!(
            d.w4a8_on(&dg, &[0; 64], Act::Bf16, 1, r).is_err(),
            "W4A8 group"
        );
    }
    let x9 = vec![0u16; 64 * 9];
    assert!(
        d.w4a16_on(&dl2, &x9, Act::Bf16, 9, Regime::Gemv).is_err(),
        "GEMV M > 8"
    );
    assert!(d.w4a16_on(&dl2, &x9, Act::Bf16, 9, Regime::Mma).is_ok());
}

/// The prepared device check (scripts/gpu_check.sh, docs/kernels.md) fits one 10-minute device
/// call, its steps' limits summed, and refuses to run off the device (no `$OUT`) or without
/// the carried binaries.
#[test]
fn the_device_check_fits_one_device_call() {
    let script = common::root().join("scripts/gpu_check.sh");
    let o = std::process::Command::new("bash")
        .arg(&script)
        .arg("--dry-run")
        .output()
        .unwrap();
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    let total: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("at most ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{s}"));
    assert!(total <= 590, "{s}");
    for step in [
        "libs", "compile", "tier", "full", "gemm", "replay", "quant", "gate", "verify",
    ] {
        assert!(
            s.lines().any(|l| l.starts_with(&format!("{step}: "))),
            "{s}"
        );
    }
    let o = std::process::Command::new("bash")
        .arg(&script)
        .arg("run")
        .env_remove("OUT")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("$OUT"));
    // Without the carried binaries (a checkout that did not run `build`; never the case on
    // the device), `run` stops before touching anything.
    if !common::root()
        .join("target/gpu-bin/kquant-tests.gz")
        .exists()
    {
        let t = tempfile::tempdir().unwrap();
        let o = std::process::Command::new("bash")
            .arg(&script)
            .arg("run")
            .env("OUT", t.path())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("gpu_check.sh build"));
    }
    let o = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "no mode: the usage");
    assert!(String::from_utf8_lossy(&o.stdout).contains("bash scripts/gpu_check.sh build"));
}
