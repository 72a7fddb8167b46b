//! `gpu::DeviceLinear` / `gpu::DeviceLinears` on the trained tiny Kimi EAGLE-3 draft
//! (`fixtures/kimi-k2.5-tiny/eagle3`, read at run time), quantized int4-pc with lm_head
//! included: every quantized module is uploaded once to each device (`common::device_tests!`:
//! the kernels' CPU replay always, the GPU in the `#[ignore]`d tier under its feature) and
//! (1) matches the f32 runtime's matmul (`ops::linear` over the dequantized weights,
//! what `Eagle3` runs) within each regime's named bound (`w4a16_tol`) in all three regimes, and (2) on the trace's
//! real target hidden states, fc → final norm → lm_head through the device gives the same greedy
//! draft tokens as the f32 runtime wherever the f32 top-2 logit margin exceeds what bf16
//! activations can move (the kernels read bf16; the runtime keeps f32).
//!
//! The whole draft forward through the device (`runtime::linears`, `verify --device`) is
//! tests/verify_device.rs.

use crate::common::{self, device_tests};

use std::path::Path;
use std::sync::Arc;

use kquant::checkpoint::Checkpoint;
use kquant::gpu::reference::{argmax_ref, first_violation, w4a16_tol};
use kquant::gpu::{Act, Backend, DeviceLinear, DeviceLinears};
use kquant::ops;
use kquant::quant::decode::Logical;
use kquant::runtime::eagle3::Eagle3;
use kquant::trace::file::Trace;

const DRAFT: &str = "fixtures/kimi-k2.5-tiny/eagle3";
const TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";

fn quantized(dir: &Path) -> std::path::PathBuf {
    let src = common::root().join(DRAFT);
    assert!(
        src.join("model.safetensors").exists(),
        "{DRAFT} is missing: the trained tiny Kimi fixtures (fixtures/gen/verify) are needed"
    );
    let out = dir.join("q");
    let o = common::kquant(&[
        "quantize",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--exclude",
        "",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

fn bf16_round(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| Act::Bf16.to_f32(Act::Bf16.from_f32(v)))
        .collect()
}

/// `y` of the layer through the device vs the f32 runtime's matmul on the same (bf16-rounded)
/// activations, within the named bound.
fn check_layer(dev: &dyn Backend, lin: &DeviceLinear, w: &[f32], name: &str, m: usize) {
    let k = lin.k();
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i as u32).wrapping_mul(2654435761) >> 8) as f32 / (1 << 24) as f32 - 0.5)
        .collect();
    let xr = bf16_round(&x);
    let got = lin.forward(&x, m).unwrap();
    // The argmax reduced on the device is that of these very outputs.
    let best: Vec<usize> = got.chunks(lin.n()).map(argmax_ref).collect();
    assert_eq!(lin.argmax_rows(&x, m).unwrap(), best, "{name} m={m}");
    let want = ops::linear(&xr, m, k, w, lin.n());
    let wa: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    let xa: Vec<f32> = xr.iter().map(|v| v.abs()).collect();
    let l1 = ops::linear(&xa, m, k, &wa, lin.n());
    let tol = w4a16_tol(dev.regime(m), Act::Bf16, true);
    if let Some((i, g, r, b)) = first_violation(&got, &want, &l1, tol) {
        panic!("{name} m={m}: y[{i}] = {g}, f32 runtime {r}, bound {b}");
    }
}

device_tests! {
    fn every_quantized_linear_matches_the_f32_runtime(dev) {
        every_quantized_linear(dev);
    }

    fn greedy_tokens_match_the_f32_runtime_on_trace_hidden_states(dev) {
        greedy_tokens(dev);
    }
}

fn every_quantized_linear(dev: Arc<dyn Backend>) {
    let t = tempfile::tempdir().unwrap();
    let ck = Checkpoint::open(quantized(t.path()).to_str().unwrap()).unwrap();
    let lg = Logical::new(&ck).unwrap();
    eprintln!("gpu_linear: every quantized linear on {}", dev.name());
    let (lins, skipped) = DeviceLinears::load(dev.clone(), &lg, Act::Bf16).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let names: Vec<&str> = lins.names().collect();
    assert_eq!(
        names.len(),
        9,
        "fc, q/k/v/o, gate/up/down, lm_head: {names:?}"
    );
    for name in names {
        let lin = lins.get(name).unwrap();
        let w = lg.read_f32(name).unwrap();
        for m in [1, 9, 130] {
            check_layer(dev.as_ref(), lin, &w, name, m);
        }
    }
}

fn greedy_tokens(dev: Arc<dyn Backend>) {
    let t = tempfile::tempdir().unwrap();
    let ck = Checkpoint::open(quantized(t.path()).to_str().unwrap()).unwrap();
    let det = ck.detect().unwrap();
    let lg = Logical::new(&ck).unwrap();
    let trace = Trace::open(&common::root().join(TRACE)).unwrap();
    // The draft's own dimensions, taps and eps, as the runtime reads them (its weights stay on
    // the CPU; the target embedding it needs is irrelevant here, so a zero one is passed).
    let d = &det.dims;
    let vocab = d.vocab_size.unwrap() as usize;
    let h = d.hidden_size.unwrap() as usize;
    let e3 = Eagle3::load(&ck, &det, Some(vec![0.0; vocab * h])).unwrap();
    assert_eq!(e3.taps.len(), 3);
    let (w_fc, w_head) = (
        lg.read_f32("fc.weight").unwrap(),
        lg.read_f32("lm_head.weight").unwrap(),
    );
    let norm = lg.read_f32("norm.weight").unwrap();
    let d2t: Vec<i64> = ck
        .weights
        .tensor("d2t")
        .unwrap()
        .data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let (dv, ht) = (e3.draft_vocab, e3.ht);
    let fc = DeviceLinear::from_logical(dev.clone(), &lg, "fc.weight", Act::Bf16).unwrap();
    let head = DeviceLinear::from_logical(dev.clone(), &lg, "lm_head.weight", Act::Bf16).unwrap();
    let (mut checked, mut rows, mut same) = (0usize, 0usize, 0usize);
    for s in trace.manifest.samples.iter().take(4) {
        let taps: Vec<Vec<f32>> = e3.taps.iter().map(|&i| trace.tap(s, i).unwrap()).collect();
        let tl = trace.tokens(s).unwrap().len();
        let feats: Vec<f32> = (0..tl)
            .flat_map(|r| {
                taps.iter()
                    .flat_map(move |tp| tp[r * ht..(r + 1) * ht].to_vec())
            })
            .collect();
        // f32 runtime: fc, norm, lm_head on f32 activations.
        let hid = ops::linear(&feats, tl, 3 * e3.ht, &w_fc, h);
        let logits = ops::linear(&ops::rms_norm(&hid, h, &norm, e3.eps), tl, h, &w_head, dv);
        // The device: the same chain through gpu::Linear (bf16 activations).
        let hid_d = fc.forward(&feats, tl).unwrap();
        let logits_d = head
            .forward(&ops::rms_norm(&hid_d, h, &norm, e3.eps), tl)
            .unwrap();
        let l1 = ops::linear(
            &bf16_round(&ops::rms_norm(&hid, h, &norm, e3.eps))
                .iter()
                .map(|v| v.abs())
                .collect::<Vec<_>>(),
            tl,
            h,
            &w_head.iter().map(|v| v.abs()).collect::<Vec<_>>(),
            dv,
        );
        for r in 0..tl {
            rows += 1;
            let (a, b) = (
                &logits[r * dv..(r + 1) * dv],
                &logits_d[r * dv..(r + 1) * dv],
            );
            let top = ops::argmax(a);
            if ops::argmax(a) == ops::argmax(b) {
                same += 1;
            }
            // Rounding the lm_head input to bf16 moves logit j by at most 2⁻⁸·Σ_k|w·x| (= l1[j]);
            // the fc input is the trace's bf16 taps (rounding is exact) and fc's own f32
            // reordering reaches the logits through the norm at a far smaller scale: 1.5·2⁻⁸.
            let slack = |j: usize| 1.5 / 256.0 * l1[r * dv + j];
            if (0..dv).any(|j| j != top && a[top] - a[j] <= slack(top) + slack(j)) {
                continue;
            }
            checked += 1;
            let tok = |i: usize| i as i64 + d2t[i];
            assert_eq!(
                tok(ops::argmax(b)),
                tok(top),
                "sample {} position {r}: device token differs from the f32 runtime",
                s.id
            );
        }
    }
    eprintln!(
        "gpu_linear on {}: {checked} of {rows} positions had a decisive margin and matched; \
     {same} of {rows} equal overall",
        dev.name()
    );
    // Not vacuous: most positions must be decisive (79 % on the current fixture).
    assert!(
        rows > 0 && checked * 5 >= rows * 3,
        "only {checked} of {rows} positions decisive"
    );
}
