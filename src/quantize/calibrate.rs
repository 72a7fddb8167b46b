//! `kquant quantize --method search|gptq --calibrate TRACE`: the calibrated methods' stage
//! between the plan and the writer. The draft being quantized runs over the trace with the
//! verify replay (every depth of every root, teacher-forced: the inputs it sees while serving,
//! its own recycled hidden states included), and the linear hook collects the second moments
//! of each quantized module's inputs (`runtime::hessian`) — only their diagonals for the scale
//! search; the whole `Σ x xᵀ` for GPTQ, in replays whose accumulators fit `--calibration-memory`.
//! Each module's codes and scales are then chosen on the format's own grid
//! (`quant::codec::IntGrid`) and handed to the writer, which writes them as the format does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::quant::codec::IntGrid;
use crate::quant::math::int4::Int4;
use crate::runtime::hessian::{Hessian, HessianSet};
use crate::runtime::linears::Exec;
use crate::verify::drafters::{load_drafter, replay_first, AfterMiss};
use crate::verify::trace::Trace;

use super::plan::{non_finite, Action, Plan};

/// How the codes of a quantized module are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Round to nearest, the reference tools' recipe (no calibration; byte-identical to them).
    Rtn,
    /// Per run of weights sharing a scale, the scale (RTN's × 1, 8/7.5, 0.99 … 0.60, rounded to
    /// the stored dtype) with the least error weighted by the inputs' second moments.
    Search,
}

/// Where the calibration inputs come from.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// A `kquant-trace/1` directory captured from the draft's target.
    pub trace: PathBuf,
    /// The target checkpoint, for drafts that run with its embedding (and lm_head).
    pub target: Option<String>,
    /// Draft depths per round replayed.
    pub steps: usize,
    /// The first N samples of the trace (all without).
    pub limit: Option<usize>,
}

/// What the stage did, for the report, the manifest and the config.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub method: Method,
    /// The trace directory and the sha256 of its files (manifest first, then the data files
    /// in name order), each file's digest fed to one outer digest.
    pub trace: PathBuf,
    pub trace_sha256: String,
    pub samples: usize,
    /// Input rows (tokens × depths) the modules saw, per shared input.
    pub tokens: u64,
    /// Modules whose codes and scales the method chose.
    pub modules: usize,
    /// Of those, the runs (rows or (row, group)s) whose scale left RTN's.
    pub scales_moved: u64,
    pub runs: u64,
}

/// The files of a trace directory, `manifest.json` first, then the others in name order.
pub fn trace_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io("read", dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    names.sort_by_key(|p| (p.file_name() != Some("manifest.json".as_ref()), p.clone()));
    Ok(names)
}

/// The sha256 of a trace directory: of each file's sha256 (`manifest.json` first, then the
/// others in name order), so a changed sample or tap changes it.
pub fn trace_digest(dir: &Path) -> Result<String> {
    let names = trace_files(dir)?;
    let mut outer = Sha256::new();
    for p in names {
        let mut f = std::fs::File::open(&p).map_err(|e| Error::io("open", &p, e))?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).map_err(|e| Error::io("read", &p, e))?;
        outer.update(p.file_name().unwrap_or_default().as_encoded_bytes());
        outer.update(h.finalize());
    }
    Ok(format!("{:x}", outer.finalize()))
}

/// Run the stage for `plan` (the source `src`): module → the codes and scales `method` chose.
/// `progress(done, total)` is told each replayed sample's generated positions.
pub fn choose(
    plan: &Plan,
    src: &str,
    method: Method,
    cal: &Calibration,
    progress: &dyn Fn(u64, u64),
) -> Result<(BTreeMap<String, Int4>, Report)> {
    let grid: &dyn IntGrid = plan.codec.int_grid().ok_or_else(|| Error::Flags {
        msg: format!(
            "--method {} chooses integer codes under the format's scales; {} in {} has none",
            serde_json::to_value(method)
                .expect("method")
                .as_str()
                .unwrap_or(""),
            plan.recipe.scheme(),
            plan.recipe.format().name()
        ),
        hint: "use a symmetric INT4 scheme (int4-pc, int4-g32/64/128), or --method rtn".into(),
    })?;
    let modules: Vec<(String, &crate::io::TensorInfo, usize, usize)> = plan
        .rows
        .iter()
        .filter_map(|r| match &r.action {
            Action::Quantize { module, rows, cols } => {
                Some((module.clone(), r.tensor, *rows, *cols))
            }
            Action::Copy { .. } => None,
        })
        .collect();
    let mut trace = Trace::open(&cal.trace)?;
    if let Some(n) = cal.limit {
        trace.manifest.samples.truncate(n);
    }
    if trace.manifest.samples.is_empty() {
        return Err(Error::Source {
            path: cal.trace.join("manifest.json"),
            msg: "lists no samples: there is nothing to calibrate on".into(),
            hint: Some("capture a trace with samples (`kquant trace capture`)".into()),
        });
    }
    let target = cal.target.as_deref().map(Checkpoint::open).transpose()?;
    let d = load_drafter(src, target.as_ref(), &Exec::F32)?;
    drop(target);
    trace.require(
        d.taps(),
        d.target_hidden(),
        Some(d.vocab()),
        &format!("draft `{src}`"),
    )?;
    let total: u64 = trace
        .manifest
        .samples
        .iter()
        .map(|s| s.gen_len as u64)
        .sum();
    d.linears()
        .collect_hessians(HessianSet::diagonal(modules.iter().map(|m| m.0.clone())));
    let done = std::sync::atomic::AtomicU64::new(0);
    let walks = replay_first(
        d.as_ref(),
        &trace,
        cal.steps,
        AfterMiss::Run,
        usize::MAX,
        &|n| {
            let k = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
            progress(k, total);
        },
    )?;
    let moments: BTreeMap<String, Arc<Hessian>> =
        d.linears().take_hessians().map_err(|msg| Error::Source {
            path: cal.trace.clone(),
            msg: format!("calibration of `{src}`: {msg}"),
            hint: None,
        })?;
    drop(d);
    let mut chosen = BTreeMap::new();
    let (mut moved, mut runs) = (0u64, 0u64);
    let ck = plan.ck;
    for (module, t, rows, cols) in &modules {
        let h = moments.get(module).ok_or_else(|| Error::Source {
            path: cal.trace.clone(),
            msg: format!(
                "the replay of `{src}` never ran `{module}`: its inputs cannot be measured"
            ),
            hint: Some(
                "exclude it (--exclude), or use --method rtn; the replay runs the draft's decoder linears, fc and lm_head"
                    .into(),
            ),
        })?;
        if h.k != *cols {
            return Err(Error::Source {
                path: ck.weights.dir.clone(),
                msg: format!(
                    "`{module}` reads {} inputs in the replay, its weight has {cols}",
                    h.k
                ),
                hint: None,
            });
        }
        let shard = ck.weights.shard_of(&t.name).expect("routed");
        let w = shard.view(t).to_f32_par();
        shard.release(t);
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(non_finite(shard.path(), &t.name, i, *cols, w[i]));
        }
        let rtn = grid.rtn(&w, *rows, *cols, t.dtype);
        let q = match method {
            Method::Rtn => rtn.clone(),
            Method::Search => {
                crate::quant::search::search(grid, &w, *rows, *cols, &h.diag(), t.dtype)
            }
        };
        runs += q.scales.len() as u64;
        moved += q
            .scales
            .iter()
            .zip(&rtn.scales)
            .filter(|(a, b)| a != b)
            .count() as u64;
        chosen.insert(module.clone(), q);
    }
    let tokens = moments.values().map(|h| h.tokens).max().unwrap_or(0);
    let _ = walks;
    Ok((
        chosen,
        Report {
            method,
            trace: cal.trace.clone(),
            trace_sha256: trace_digest(&cal.trace)?,
            samples: trace.manifest.samples.len(),
            tokens,
            modules: modules.len(),
            scales_moved: moved,
            runs,
        },
    ))
}
