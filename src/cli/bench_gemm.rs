//! `kquant bench gemm`: measured (never asserted) speed of the INT4 GEMM kernels on one device.
//! For each shape it measures, in the same run, a device-to-device copy of the packed weight
//! bytes (the bandwidth ceiling), then per M the kernel the device picks (regime A/B/C; `--regime`
//! times the named ones instead, to find where their curves cross), and a
//! dense bf16 GEMM of the same shape with the vendor BLAS; every timing cycles over enough
//! weight copies to exceed twice the last-level cache, so weights stream from memory. It reports
//! time, GB/s of packed weight bytes, % of the copy bandwidth and the speed-up over bf16, with
//! the goals (≥ 85 % of copy at M = 1, ≥ 3× bf16 at M ≤ 16). On `--device cpu` the kernels run as
//! their CPU replay and the "BLAS" is the f32 reference GEMM: the figures are only reported, with
//! the note first and no GPU goal (none met, none missed; `goal` null in `--json`).

use std::process::ExitCode;

use serde_json::json;

use crate::cli::print_json;
use crate::error::{Error, Result};
use crate::gpu::layout::{encode_word, words_per_row, PAD_WORD};
use crate::gpu::source::GEMV_MAX_M;
use crate::gpu::{self, Act, Bench, DeviceW4, Regime, W4Layout};

/// Arguments of `kquant bench gemm`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Device: `cpu` (kernel replay), `cuda[:N]` (needs --features cuda), `hip[:N]` (needs
    /// --features hip).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// `kimi` (the Kimi-K2.5 EAGLE-3 draft's fc, qkv, o, gate_up, down) or a comma-separated list
    /// of `KxN` (or of K,N pairs: `7168,24576,8192,7168`).
    #[arg(long, default_value = "kimi")]
    pub shapes: String,
    /// Token counts M.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8, 16, 32, 64, 128, 256], value_parser = crate::cli::flags::tokens_m)]
    pub m: Vec<usize>,
    /// Output rows per shape (default: all on a GPU, 64 on the CPU, whose replay is slow).
    #[arg(long, value_parser = crate::cli::flags::dim)]
    pub rows: Option<usize>,
    /// Group size along K (default: per channel).
    #[arg(long, value_parser = crate::cli::flags::dim)]
    pub group: Option<usize>,
    /// Activation dtype.
    #[arg(long, default_value = "bf16", value_parser = ["bf16", "f16"])]
    pub act: String,
    /// Timed calls per measurement (after one warm-up; default 50 on a GPU, 1 on the CPU).
    #[arg(long, value_parser = crate::cli::flags::iters)]
    pub iters: Option<usize>,
    /// Kernel regimes to time at every M: `auto` (the one the device picks for M on a replay's
    /// kept weights), or a comma-separated list of `gemv`, `mma`, `dense` to time each at every
    /// M it takes (GEMV takes M ≤ 8) and so find where their curves cross.
    #[arg(long, value_delimiter = ',', default_value = "auto", value_parser = ["auto", "gemv", "mma", "dense"])]
    pub regime: Vec<String>,
    /// Print the figures as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `(name, K, N)` of the Kimi-K2.5 EAGLE-3 draft's linears (TorchSpec config: hidden 7168,
/// 64 × 128 heads with 64 KV heads, intermediate 12288).
pub const KIMI: [(&str, usize, usize); 5] = [
    ("fc", 21504, 7168),
    ("qkv", 14336, 24576),
    ("o", 8192, 7168),
    ("gate_up", 7168, 24576),
    ("down", 12288, 7168),
];

/// What `--shapes` takes, with the shapes `kimi` stands for.
fn shapes_hint() -> String {
    let kimi: Vec<String> = KIMI
        .iter()
        .map(|(n, k, nn)| format!("{n} {k}x{nn}"))
        .collect();
    format!(
        "--shapes takes `kimi` ({}), or K×N pairs as `KxN,KxN,…` or `K,N,K,N,…`, each K a positive multiple of 8 (e.g. `7168x2048`)",
        kimi.join(", ")
    )
}

/// `kimi`, `KxN,KxN…` or `K,N,K,N…`.
pub fn parse_shapes(s: &str) -> Result<Vec<(String, usize, usize)>> {
    if s == "kimi" {
        return Ok(KIMI
            .iter()
            .map(|&(n, k, nn)| (n.to_string(), k, nn))
            .collect());
    }
    let bad = || Error::Flags {
        msg: format!("--shapes `{s}`: expected `kimi`, `KxN,…` or `K,N,…`"),
        hint: shapes_hint(),
    };
    let num = |t: &str| t.trim().parse::<usize>().map_err(|_| bad());
    let pairs: Vec<(usize, usize)> = if s.contains('x') {
        s.split(',')
            .map(|t| {
                let (k, n) = t.split_once('x').ok_or_else(bad)?;
                Ok((num(k)?, num(n)?))
            })
            .collect::<Result<_>>()?
    } else {
        let v: Vec<usize> = s.split(',').map(num).collect::<Result<_>>()?;
        if !v.len().is_multiple_of(2) {
            return Err(bad());
        }
        v.chunks(2).map(|p| (p[0], p[1])).collect()
    };
    if pairs.is_empty() || pairs.iter().any(|&(k, n)| k == 0 || n == 0 || k % 8 != 0) {
        return Err(Error::Flags {
            msg: format!("--shapes `{s}`: K and N must be positive and K a multiple of 8"),
            hint: shapes_hint(),
        });
    }
    Ok(pairs
        .into_iter()
        .map(|(k, n)| (format!("{k}x{n}"), k, n))
        .collect())
}

/// Deterministic weights in the kernel layout (random codes, scales ~0.01), built directly so
/// real shapes need no f32 matrix.
fn weights(n: usize, k: usize, group: usize) -> W4Layout {
    let wpr = words_per_row(k);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut qweight = vec![PAD_WORD; n * wpr];
    for r in 0..n {
        for j in 0..k.div_ceil(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let codes: [i8; 8] = std::array::from_fn(|i| {
                if 8 * j + i < k {
                    ((state >> (4 * i)) & 0xf) as i8 - 8
                } else {
                    0
                }
            });
            qweight[r * wpr + j] = encode_word(&codes);
        }
    }
    let groups = k.div_ceil(group);
    W4Layout {
        n,
        k,
        group,
        qweight,
        scales: (0..n * groups)
            .map(|i| 0.01 + (i % 7) as f32 * 1e-3)
            .collect(),
    }
}

/// Most weight elements (N × K) of one benchmarked shape: 2 GiB of INT4 codes, 8 GiB as the
/// bf16 BLAS copy.
pub const MAX_ELEMENTS: usize = 1 << 32;

/// Refuse a shape whose weights (`n × k`) or activations and outputs (`m × k`, `m × n`) would
/// not fit a benchmark's memory, before anything is allocated.
fn check_size(name: &str, n: usize, k: usize, ms: &[usize]) -> Result<()> {
    let m = ms.iter().copied().max().unwrap_or(1);
    let fits = |a: usize, b: usize| a.checked_mul(b).is_some_and(|e| e <= MAX_ELEMENTS);
    if fits(n, k) && fits(m, k) && fits(m, n) {
        return Ok(());
    }
    Err(Error::Flags {
        msg: format!(
            "shape {name}: {n} rows × K {k} with M up to {m} is more than {MAX_ELEMENTS} elements per matrix"
        ),
        hint: "benchmark smaller shapes (--shapes KxN, --rows, --m)".into(),
    })
}

/// The regimes `--regime` names for `m` tokens, in order, without repeats: `auto` is the device's
/// own choice on kept weights (a replay's); GEMV is left out above its largest M (`GEMV_MAX_M`).
fn regimes(names: &[String], dev: &dyn Bench, m: usize) -> Vec<Regime> {
    let mut out = Vec::new();
    for name in names {
        let r = match name.as_str() {
            "gemv" if m > GEMV_MAX_M => continue,
            "gemv" => Regime::Gemv,
            "mma" => Regime::Mma,
            "dense" => Regime::Dense,
            _ => dev.regime_kept(m),
        };
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

fn goal(m: usize, pct_copy: f64, speedup: Option<f64>) -> (Option<&'static str>, Option<bool>) {
    if m == 1 {
        (Some("≥85% of copy"), Some(pct_copy >= 85.0))
    } else if m <= 16 {
        (Some("≥3× bf16 BLAS"), speedup.map(|s| s >= 3.0))
    } else {
        (None, None)
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let shapes = parse_shapes(&a.shapes)?;
    if a.m.is_empty() || a.m.contains(&0) {
        return Err(Error::Usage("--m: token counts must be ≥ 1".into()));
    }
    let act = if a.act == "f16" { Act::F16 } else { Act::Bf16 };
    let dev: Box<dyn Bench> = gpu::open(&a.device)?;
    let cpu = a.device == "cpu";
    let iters = a.iters.unwrap_or(if cpu { 1 } else { 50 });
    let llc = dev.arch().tune().llc_bytes;
    let mut rows_out = Vec::new();
    let mut crossovers = Vec::new();
    if !a.json {
        println!(
            "device {}  act {}  LLC {} MB (rotating > 2× LLC)  iters {iters}",
            dev.name(),
            act.name(),
            llc >> 20
        );
        if let Some(o) = dev.module_origin() {
            println!("{}", crate::escape::printable(&o));
        }
        if cpu {
            println!(
                "note: cpu runs the kernels' CPU replay and an f32 reference GEMM as the \"BLAS\"; the \
                 figures say nothing about a GPU, and the GPU goals are not applied"
            );
        }
        println!(
            "{:<10} {:>6} {:>6} {:>4} {:>6} {:>11} {:>9} {:>7} {:>11} {:>8}{}",
            "shape",
            "K",
            "N",
            "M",
            "regime",
            "time",
            "GB/s",
            "% copy",
            "bf16 BLAS",
            "speed-up",
            if cpu { "" } else { "  goal" }
        );
    }
    for (name, k, n_full) in &shapes {
        let r = Run {
            dev: dev.as_ref(),
            a: &a,
            act,
            iters,
            llc,
            cpu,
        };
        crossovers.push(r.shape(name, *k, *n_full, &mut rows_out)?);
    }
    if a.json {
        let doc = json!({
            "schema": "kquant.bench.gemm/1",
            "device": dev.name(),
            "kernels": dev.module_origin(),
            "act": act.name(),
            "iters": iters,
            "llc_bytes": llc,
            "emulated": cpu,
            "results": rows_out,
            "crossovers": crossovers.iter().map(|c| json!({
                "shape": c.shape, "int4_slower_than_bf16_from_m": c.slower_from,
                "regime_c_from_m": c.dense_from,
            })).collect::<Vec<_>>(),
        });
        print_json(&doc);
    }
    Ok(ExitCode::SUCCESS)
}

/// One `bench gemm` run's settings, for [`Run::shape`].
struct Run<'a> {
    dev: &'a dyn Bench,
    a: &'a Args,
    act: Act,
    iters: usize,
    llc: usize,
    cpu: bool,
}

impl Run<'_> {
    /// Time one shape at every M (a row each, printed or pushed to `rows_out`); its crossover.
    fn shape(
        &self,
        name: &str,
        k: usize,
        n_full: usize,
        rows_out: &mut Vec<serde_json::Value>,
    ) -> Result<Crossover> {
        let Run {
            dev,
            a,
            act,
            iters,
            llc,
            cpu,
        } = *self;
        let n = a.rows.unwrap_or(if cpu { 64 } else { n_full }).min(n_full);
        let group = a.group.unwrap_or(k);
        check_size(name, n, k, &a.m)?;
        let w = weights(n, k, group);
        w.check()?;
        let bytes = w.weight_bytes();
        let copies = (2 * llc).div_ceil(bytes) + 1;
        let ws: Vec<DeviceW4> = (0..copies)
            .map(|_| dev.upload(&w))
            .collect::<std::result::Result<_, _>>()?;
        let copy_bw = dev.copy_bandwidth(bytes, iters)?;
        let bf16_copies = (2 * llc).div_ceil(n * k * 2) + 1;
        let mut timed = Vec::new();
        for &m in &a.m {
            let bf16 = dev.time_dense_bf16(n, k, m, bf16_copies, iters)?;
            let blas = Some(bf16);
            for regime in regimes(&a.regime, dev, m) {
                let t = dev.time_w4a16(&ws, act, m, regime, iters)?;
                timed.push(Timed {
                    m,
                    regime,
                    seconds: t,
                    bf16,
                });
                let gbs = bytes as f64 / t / 1e9;
                let pct = 100.0 * (bytes as f64 / t) / copy_bw;
                let speedup = blas.map(|b| b / t);
                // The goals are a GPU kernel's: the CPU replay is held to none.
                let (goal_text, met) = if cpu {
                    (None, None)
                } else {
                    goal(m, pct, speedup)
                };
                if !a.json {
                    println!(
                "{:<10} {:>6} {:>6} {:>4} {:>6} {:>9.1}µs {:>9.2} {:>6.1}% {:>11} {:>8}  {}",
                name,
                k,
                n,
                m,
                regime.name(),
                t * 1e6,
                gbs,
                pct,
                blas.map_or("—".into(), |b| format!("{:.1}µs", b * 1e6)),
                speedup.map_or("—".into(), |s| format!("{s:.2}×")),
                match (goal_text, met) {
                    (Some(g), Some(true)) => format!("{g}: met"),
                    (Some(g), Some(false)) => format!("{g}: MISSED"),
                    (Some(g), None) => format!("{g}: —"),
                    _ => String::new(),
                }
            );
                }
                rows_out.push(json!({
                    "shape": name, "k": k, "n": n, "n_full": n_full, "m": m, "group": group,
                    "regime": regime.name(), "seconds": t, "weight_bytes": bytes,
                    "weight_gb_per_s": gbs, "copy_gb_per_s": copy_bw / 1e9, "pct_of_copy": pct,
                    "bf16_blas_seconds": blas, "speedup_vs_bf16": speedup,
                    "goal": goal_text, "goal_met": met, "weight_copies": copies,
                }));
            }
        }
        let t = dev.arch().tune();
        let c = Crossover {
            shape: name.to_string(),
            slower_from: slower_from(&timed),
            dense_from: t.mma_max_m_kept + 1,
        };
        if !a.json {
            println!("{}", c.line());
        }
        Ok(c)
    }
}

/// One measured INT4 call beside the bf16 GEMM of the same M.
struct Timed {
    m: usize,
    regime: Regime,
    seconds: f64,
    bf16: f64,
}

/// The smallest measured M at which the fastest INT4 kernel measured (regimes A and B; regime C
/// is the dequantize + GEMM, not a kernel of its own) is slower than bf16 — the crossover above
/// which a replay's kept dense copy (regime C after its first call: the vendor GEMM alone) is
/// the faster choice. `None` when no measured M is.
fn slower_from(timed: &[Timed]) -> Option<usize> {
    let mut ms: Vec<usize> = timed.iter().map(|t| t.m).collect();
    ms.sort_unstable();
    ms.dedup();
    ms.into_iter().find(|&m| {
        let best = timed
            .iter()
            .filter(|t| t.m == m && t.regime != Regime::Dense)
            .map(|t| t.seconds)
            .fold(f64::INFINITY, f64::min);
        let bf16 = timed.iter().find(|t| t.m == m).map_or(f64::NAN, |t| t.bf16);
        best.is_finite() && best > bf16
    })
}

/// A shape's crossover, measured, and the regime the device picks.
struct Crossover {
    shape: String,
    slower_from: Option<usize>,
    /// The device's tuning sends M from here to regime C.
    dense_from: usize,
}

impl Crossover {
    fn line(&self) -> String {
        let measured = match self.slower_from {
            Some(m) => format!("INT4 kernels slower than bf16 from M = {m} (of the M measured)"),
            None => "INT4 kernels no slower than bf16 at any M measured".into(),
        };
        format!(
            "crossover {}: {measured}; picks regime C (kept dense copy in a replay: the vendor GEMM) from M = {}{}",
            self.shape,
            self.dense_from,
            match self.slower_from {
                Some(m) if m < self.dense_from => " — below the crossover measured: the tuning row should move",
                _ => "",
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crossover_is_the_first_m_where_int4_loses_to_bf16() {
        let t = |m, regime, seconds, bf16| Timed {
            m,
            regime,
            seconds,
            bf16,
        };
        let rows = [
            t(1, Regime::Mma, 1.0, 3.0),
            t(16, Regime::Gemv, 5.0, 3.0),
            t(16, Regime::Mma, 2.0, 3.0), // the faster kernel counts
            t(32, Regime::Mma, 4.0, 3.0),
            t(32, Regime::Dense, 1.0, 3.0), // regime C is not a kernel of its own
            t(64, Regime::Mma, 2.0, 3.0),
        ];
        assert_eq!(slower_from(&rows), Some(32));
        assert_eq!(slower_from(&rows[..3]), None);
        let c = Crossover {
            shape: "fc".into(),
            slower_from: Some(32),
            dense_from: 65,
        };
        assert!(
            c.line().contains("from M = 32") && c.line().contains("should move"),
            "{}",
            c.line()
        );
        let c = Crossover {
            slower_from: None,
            ..c
        };
        assert!(!c.line().contains("should move"));
    }

    #[test]
    fn shapes_parse() {
        assert_eq!(parse_shapes("kimi").unwrap().len(), 5);
        let s = parse_shapes("7168x24576,64x8").unwrap();
        assert_eq!(s[1], ("64x8".to_string(), 64, 8));
        assert_eq!(parse_shapes("7168,24576,8192,7168").unwrap().len(), 2);
        assert!(parse_shapes("7168,24576,8192").is_err());
        assert!(parse_shapes("36x4").is_err(), "K % 8");
        assert!(parse_shapes("axb").is_err());
    }

    #[test]
    fn synthetic_weights_are_a_valid_layout() {
        for (n, k, g) in [(3, 40, 40), (5, 256, 128)] {
            let w = weights(n, k, g);
            w.check().unwrap();
            let q = w.to_int4();
            assert!(q.codes.iter().any(|&c| c < 0) && q.codes.iter().any(|&c| c > 0));
            assert_eq!(
                W4Layout::from_int4(&q).unwrap(),
                w,
                "padding nibbles are code 0"
            );
        }
    }
}
