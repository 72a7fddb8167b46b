//! The GEMV kernels against the CPU reference (dequantize + f32 GEMM) on every device this
//! build has: the CPU emulation always, CUDA under `--features cuda`, HIP under `--features hip`
//! (a missing runtime is skipped with a note on stderr; `KQUANT_REQUIRE_GPU=1` makes it fail).
//! Shapes: the Kimi draft's K values with a slice of N on the CPU (the full N under
//! `KQUANT_GPU_FULL_SHAPES=1`, meant for a GPU), M ∈ {1, 2, 4, 8}.

use kquant::gpu::reference::{
    abs_l1, act_to_f32, first_violation, gemm_ref, quantize_act_ref, w4a8_abs_l1, w4a8_ref,
    W4A16_REL_L1_TOL, W4A8_REL_L1_TOL,
};
use kquant::gpu::{devices, Act, Backend, W4Layout};
use kquant::io::Dtype;
use kquant::quant::{compressed_tensors, int4};

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
const MS: [usize; 4] = [1, 2, 4, 8];

fn slice_n(n: usize) -> usize {
    if std::env::var("KQUANT_GPU_FULL_SHAPES").as_deref() == Ok("1") {
        n
    } else {
        16 // a few rows of every shape: K (the reduction) is what the kernels loop over
    }
}

fn activations(m: usize, k: usize, act: Act) -> Vec<u16> {
    matrix(m, k, Dtype::F32, 1.0, 0.01)
        .into_iter()
        .map(|v| act.from_f32(v))
        .collect()
}

fn check_w4a16(dev: &dyn Backend, w: &W4Layout, act: Act, what: &str) {
    for m in MS {
        let x = activations(m, w.k, act);
        let xf = act_to_f32(&x, act);
        let want = gemm_ref(w, &xf, m);
        let got = dev.w4a16(w, &x, act, m).expect("launch");
        if let Some((i, g, r, b)) =
            first_violation(&got, &want, &abs_l1(w, &xf, m), W4A16_REL_L1_TOL)
        {
            panic!(
                "{}: W4A16 {what} {} m={m} n={} k={}: y[{i}] = {g}, reference {r}, bound {b}",
                dev.name(),
                act.name(),
                w.n,
                w.k
            );
        }
    }
}

fn check_w4a8(dev: &dyn Backend, w: &W4Layout, act: Act) {
    for m in MS {
        let x = activations(m, w.k, act);
        let a = quantize_act_ref(&x, act, m, w.k);
        let want = w4a8_ref(w, &a, m);
        let got = dev.w4a8(w, &x, act, m).expect("launch");
        if let Some((i, g, r, b)) =
            first_violation(&got, &want, &w4a8_abs_l1(w, &a, m), W4A8_REL_L1_TOL)
        {
            panic!(
                "{}: W4A8 {} m={m} n={} k={}: y[{i}] = {g}, reference {r}, bound {b}",
                dev.name(),
                act.name(),
                w.n,
                w.k
            );
        }
    }
}

/// The shared body: every device, every Kimi shape, per channel (Quark recipe) and per group
/// 128 (compressed-tensors recipe), W4A16 in bf16 and f16, W4A8 per channel.
fn run_all(dev: &dyn Backend) {
    for (k, n) in KIMI {
        let n = slice_n(n);
        let w = matrix(n, k, Dtype::BF16, 0.05, -0.002);
        let pc = W4Layout::from_int4(&int4::quantize(&w, n, k, k, Dtype::BF16)).unwrap();
        let g128 =
            W4Layout::from_int4(&compressed_tensors::quantize(&w, n, k, 128, Dtype::BF16)).unwrap();
        for act in [Act::Bf16, Act::F16] {
            check_w4a16(dev, &pc, act, "per-channel");
            check_w4a16(dev, &g128, act, "group-128");
        }
        check_w4a8(dev, &pc, Act::Bf16);
    }
}

#[test]
fn gemv_matches_reference_on_every_device() {
    let devs = devices();
    for d in &devs {
        eprintln!("gpu_gemm: device {}", d.name());
        run_all(d.as_ref());
    }
}

/// Small odd shapes exercise the tails: K not a multiple of 32, N not a multiple of the rows
/// per block.
#[test]
fn tails_on_every_device() {
    for d in devices() {
        for (k, n) in [(40, 3), (72, 9), (1000, 5)] {
            let w = matrix(n, k, Dtype::BF16, 0.05, 0.0);
            let pc = W4Layout::from_int4(&int4::quantize(&w, n, k, k, Dtype::BF16)).unwrap();
            check_w4a16(d.as_ref(), &pc, Act::Bf16, "tail");
            check_w4a8(d.as_ref(), &pc, Act::F16);
        }
    }
}

#[test]
fn preconditions_are_checked() {
    let w = matrix(4, 36, Dtype::BF16, 0.05, 0.0);
    let l = W4Layout::from_int4(&int4::quantize(&w, 4, 36, 36, Dtype::BF16)).unwrap();
    for d in devices() {
        assert!(d.w4a16(&l, &[0; 36 * 9], Act::Bf16, 9).is_err(), "M > 8");
        assert!(d.w4a16(&l, &[0; 36], Act::Bf16, 1).is_err(), "K % 8 != 0");
    }
}
