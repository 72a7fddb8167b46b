//! `kquant diff A B [--json] [--min-sqnr DB]`: per-tensor error between two checkpoints, each
//! read as its unquantized tensors (quantized modules are dequantized first): max abs error,
//! RMSE, SQNR (dB) and cosine similarity. Tensors under `--min-sqnr` are flagged.

use std::collections::HashSet;
use std::process::ExitCode;

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::cli::print_json;
use crate::error::Result;
use crate::escape::printable;
use crate::quant::decode::Logical;

/// Arguments of `kquant diff`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Reference checkpoint (usually the original).
    pub a: String,
    /// Checkpoint to compare (usually the quantized one).
    pub b: String,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Flag tensors whose SQNR is below this many dB.
    #[arg(long, default_value_t = 15.0, value_parser = crate::cli::flags::min_sqnr)]
    pub min_sqnr: f64,
}

/// Error statistics of one tensor pair.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stats {
    pub name: String,
    pub shape: Vec<usize>,
    pub max_abs: f64,
    pub rmse: f64,
    /// `10·log10(Σa² / Σ(a−b)²)`; infinite when equal.
    pub sqnr_db: f64,
    pub cosine: f64,
    pub flagged: bool,
}

/// Compare two equal-length vectors (the spec: plain f64 loops).
pub fn stats(name: &str, shape: Vec<usize>, a: &[f32], b: &[f32], min_sqnr: f64) -> Stats {
    let (mut max_abs, mut se, mut sa, mut sb, mut dot) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        let e = (x - y).abs();
        max_abs = max_abs.max(e);
        se += e * e;
        sa += x * x;
        sb += y * y;
        dot += x * y;
    }
    let n = a.len().max(1) as f64;
    let sqnr_db = if se == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (sa / se).log10()
    };
    let cosine = if sa == 0.0 || sb == 0.0 {
        if sa == sb {
            1.0
        } else {
            0.0
        }
    } else {
        dot / (sa.sqrt() * sb.sqrt())
    };
    Stats {
        name: name.into(),
        shape,
        max_abs,
        rmse: (se / n).sqrt(),
        sqnr_db,
        cosine,
        flagged: sqnr_db < min_sqnr,
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (ca, cb) = (Checkpoint::open(&a.a)?, Checkpoint::open(&a.b)?);
    let (la, lb) = (Logical::new(&ca)?, Logical::new(&cb)?);
    let mut rows = Vec::new();
    let mut mismatched = Vec::new();
    // Sets, not scans of the name lists: a checkpoint may hold a hundred thousand tensors.
    let in_a: HashSet<&String> = la.names.iter().collect();
    let in_b: HashSet<&String> = lb.names.iter().collect();
    for name in la.names.iter().filter(|n| in_b.contains(n)) {
        let (sa, sb) = (
            la.shape(name).unwrap_or_default(),
            lb.shape(name).unwrap_or_default(),
        );
        if sa != sb {
            mismatched.push(format!("{name}: {sa:?} vs {sb:?}"));
            continue;
        }
        let (va, vb) = (
            la.read_f32(name).unwrap_or_default(),
            lb.read_f32(name).unwrap_or_default(),
        );
        rows.push(stats(name, sa, &va, &vb, a.min_sqnr));
    }
    let only_a: Vec<&String> = la.names.iter().filter(|n| !in_b.contains(n)).collect();
    let only_b: Vec<&String> = lb.names.iter().filter(|n| !in_a.contains(n)).collect();
    let flagged = rows.iter().filter(|r| r.flagged).count();
    if a.json {
        let doc = serde_json::json!({
            "schema": "kquant.diff/1", "a": a.a, "b": a.b, "min_sqnr_db": a.min_sqnr,
            "tensors": rows.iter().map(|r| serde_json::json!({
                "name": r.name, "shape": r.shape, "max_abs": r.max_abs, "rmse": r.rmse,
                "sqnr_db": if r.sqnr_db.is_finite() { serde_json::json!(r.sqnr_db) } else { serde_json::json!(null) },
                "cosine": r.cosine, "flagged": r.flagged})).collect::<Vec<_>>(),
            "flagged": flagged, "only_in_a": only_a, "only_in_b": only_b, "shape_mismatch": mismatched,
        });
        print_json(&doc);
    } else {
        // Names come from the files: escaped (crate::escape).
        let w = rows
            .iter()
            .map(|r| printable(&r.name).chars().count())
            .max()
            .unwrap_or(4)
            .max(4);
        println!(
            "{:<w$}  {:>10} {:>10} {:>9} {:>9}",
            "tensor", "max_abs", "rmse", "sqnr_dB", "cosine"
        );
        for r in &rows {
            let sq = if r.sqnr_db.is_finite() {
                format!("{:.2}", r.sqnr_db)
            } else {
                "exact".into()
            };
            println!(
                "{:<w$}  {:>10.3e} {:>10.3e} {:>9} {:>9.6}{}",
                printable(&r.name),
                r.max_abs,
                r.rmse,
                sq,
                r.cosine,
                if r.flagged {
                    "  << below --min-sqnr"
                } else {
                    ""
                }
            );
        }
        for n in &only_a {
            println!("only in A: {}", printable(n));
        }
        for n in &only_b {
            println!("only in B: {}", printable(n));
        }
        for m in &mismatched {
            println!("shape differs: {}", printable(m));
        }
        println!(
            "{} tensors compared, {flagged} below {} dB",
            rows.len(),
            a.min_sqnr
        );
    }
    Ok(ExitCode::SUCCESS)
}
