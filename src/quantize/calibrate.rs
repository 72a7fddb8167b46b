//! `kquant quantize --method search|gptq --calibrate TRACE`: the calibrated methods' stage
//! between the plan and the writer. The draft being quantized runs over the trace with the
//! verify replay (every depth of every root, teacher-forced: the inputs it sees while serving,
//! its own recycled hidden states included), and the linear hook collects the second moments
//! of each quantized module's inputs (`runtime::hessian`) — only their diagonals for the scale
//! search; the whole `Σ x xᵀ` for GPTQ, in replays whose accumulators fit `--calibration-memory`.
//! Each module's codes and scales are then chosen on the format's own grid
//! (`quant::codec::IntGrid`) and handed to the writer, which writes them as the format does.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::quant::codec::IntGrid;
use crate::quant::math::int4::Int4;
use crate::replay::{load_drafter, replay, steps_for, AfterMiss};
use crate::runtime::hessian::{Hessian, HessianSet};
use crate::runtime::linears::Exec;
use crate::trace::file::Trace;

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
    /// GPTQ (`quant::gptq`, llm-compressor's and Quark's defaults) under the format's RTN
    /// scales, on each module's `Σ x xᵀ` over the trace.
    Gptq,
    /// The scale search's scales (on the diagonal of the same `Σ x xᵀ`), then GPTQ's codes
    /// under them (as llm-compressor runs GPTQ after an MSE observer chose the scales).
    #[serde(rename = "search-gptq")]
    SearchGptq,
}

impl Method {
    /// Whether the method needs each module's whole `Σ x xᵀ` (GPTQ), not only its diagonal.
    pub fn gptq(self) -> bool {
        matches!(self, Method::Gptq | Method::SearchGptq)
    }

    /// The name `--method` takes and the records carry.
    pub fn name(self) -> &'static str {
        match self {
            Method::Rtn => "rtn",
            Method::Search => "search",
            Method::Gptq => "gptq",
            Method::SearchGptq => "search-gptq",
        }
    }
}

/// The method `quantize` runs and its calibration inputs: `--method` (`flag`), else the
/// `--config` preset's (a preset picked on calibrated codes holds only for them, so it needs
/// `--calibrate` unless `--method` says otherwise), else round to nearest. `cal` is what
/// `--calibrate` and its companions gave; refused where it does not fit the method.
pub fn resolve_method(
    flag: Option<Method>,
    config: Option<&str>,
    cal: Option<Calibration>,
) -> Result<(Method, Option<Calibration>)> {
    let preset_method = match config {
        Some(spec) => crate::quant::preset::load(spec)?
            .method
            .map(|m| {
                <Method as clap::ValueEnum>::from_str(&m, false).map_err(|_| Error::Flags {
                    msg: format!("--config {spec}: `method` is `{m}`, not a quantize method"),
                    hint: "use rtn, search, gptq or search-gptq".into(),
                })
            })
            .transpose()?,
        None => None,
    };
    let method = flag.or(preset_method).unwrap_or(Method::Rtn);
    if let (None, Some(m), None) = (flag, preset_method, &cal) {
        if m != Method::Rtn {
            return Err(Error::Flags {
                msg: format!(
                    "--config {} was measured with --method {}: its accept length holds for those codes, which need calibration inputs",
                    config.unwrap_or(""),
                    m.name()
                ),
                hint: "give --calibrate TRACE (the preset's description names the trace it was picked on), or --method rtn to quantize to nearest knowingly".into(),
            });
        }
    }
    match (method, cal) {
        (Method::Rtn, None) => Ok((method, None)),
        (Method::Rtn, Some(_)) => Err(Error::Flags {
            msg: "--calibrate with --method rtn: round to nearest uses no calibration".into(),
            hint: "add --method search, or drop --calibrate".into(),
        }),
        (m, None) => Err(Error::Flags {
            msg: format!("--method {} needs calibration inputs", m.name()),
            hint: "give --calibrate TRACE (a trace captured from the draft's target: `kquant trace capture`)".into(),
        }),
        (m, Some(c)) => Ok((m, Some(c))),
    }
}

/// Run the stage for `plan` ([`choose`]) and hand it the codes and scales chosen, with the
/// record `config.json` keeps of them (`kquant_quantization`: the method, the calibration
/// trace's digest, GPTQ's settings, the producer).
pub fn apply(
    plan: &mut Plan,
    src: &str,
    method: Method,
    cal: &Calibration,
    progress: &dyn Fn(u64, u64),
) -> Result<Report> {
    let (chosen, r) = choose(plan, src, method, cal, progress)?;
    plan.chosen = chosen;
    plan.record = Some(serde_json::json!({
        "method": method.name(),
        "calibration": {"trace_sha256": r.trace_sha256, "samples": r.samples, "input_rows": r.tokens, "steps": r.steps, "categories": r.categories},
        "gptq": method.gptq().then(|| serde_json::json!({"block_size": 128, "damp_frac": 0.01, "act_order": true, "retries": 5})),
        "producer": format!("kquant {}", env!("CARGO_PKG_VERSION")),
    }));
    Ok(r)
}

/// Where the calibration inputs come from.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// A `kquant-trace/1` directory captured from the draft's target.
    pub trace: PathBuf,
    /// The target checkpoint, for drafts that run with its embedding (and lm_head).
    pub target: Option<String>,
    /// Draft tokens per step replayed (the draft's own default without).
    pub steps: Option<usize>,
    /// The first N samples of the trace (all without).
    pub limit: Option<usize>,
    /// Bytes the accumulated `Σ x xᵀ` of one replay may take (GPTQ).
    pub memory: u64,
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
    /// Each prompt category's share of the trace's generated positions (`""` for samples
    /// without one): what kind of text the codes were fitted to.
    pub categories: BTreeMap<String, f64>,
    /// Input rows (tokens × depths) the modules saw, per shared input.
    pub tokens: u64,
    /// Modules whose codes and scales the method chose.
    pub modules: usize,
    /// Of those, the runs (rows or (row, group)s) whose scale differs from RTN's, and those
    /// whose codes do (GPTQ keeps RTN's scales and moves codes; the search moves scales).
    pub scales_changed: u64,
    pub codes_changed: u64,
    pub runs: u64,
    /// Replays of the trace (GPTQ: as many as the Hessians' memory budget needs).
    pub replays: usize,
    /// Draft tokens per step replayed.
    pub steps: usize,
    /// GPTQ's loss summed over every module (llm-compressor's `Σ ((w − q) / U_jj)² / 2`).
    pub gptq_loss: Option<f64>,
    /// Modules whose calibration inputs were all zero (no signal to fit): rounded to nearest.
    pub kept_rtn: Vec<String>,
}

/// Each category's share of a trace's generated positions.
pub fn category_shares(trace: &Trace) -> BTreeMap<String, f64> {
    let mut n: BTreeMap<String, u64> = BTreeMap::new();
    for s in &trace.manifest.samples {
        *n.entry(s.category.clone()).or_default() += s.gen_len as u64;
    }
    let total = n.values().sum::<u64>().max(1) as f64;
    n.into_iter().map(|(c, k)| (c, k as f64 / total)).collect()
}

/// One quantized module: its name, its weight tensor, its rows and columns.
type Module<'p> = (String, &'p crate::io::TensorInfo, usize, usize);

/// Run the stage for `plan` (the source `src`): module → the codes and scales `method` chose.
/// `progress(done, total)` is told each replayed sample's generated positions.
pub fn choose(
    plan: &Plan,
    src: &str,
    method: Method,
    cal: &Calibration,
    progress: &dyn Fn(u64, u64),
) -> Result<(BTreeMap<String, Int4>, Report)> {
    let grid = int_grid(plan, method)?;
    let modules: Vec<Module> = plan
        .rows
        .iter()
        .filter_map(|r| match &r.action {
            Action::Quantize { module, rows, cols } => {
                Some((module.clone(), r.tensor, *rows, *cols))
            }
            Action::Copy { .. } => None,
        })
        .collect();
    let trace = open_trace(cal)?;
    // GPTQ needs each module's whole Σ x xᵀ (k² f32): replays whose accumulators fit the
    // budget, each collecting a share of the modules; the search needs only the diagonals.
    let full = method.gptq();
    let passes = passes(&modules, full, cal.memory);
    let total: u64 = trace
        .manifest
        .samples
        .iter()
        .map(|s| s.gen_len as u64)
        .sum::<u64>()
        * passes.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let mut chosen = BTreeMap::new();
    let (mut moved, mut runs, mut tokens) = ((0u64, 0u64), 0u64, 0u64);
    let mut gptq_loss = 0f64;
    let mut kept_rtn = Vec::new();
    let ck = plan.ck;
    // The steps each replay resolved (the same every pass).
    let mut steps = cal.steps.unwrap_or_default();
    for pass in &passes {
        let wanted: Vec<String> = pass.iter().map(|&i| modules[i].0.clone()).collect();
        let (mut moments, s) = collect(src, &trace, cal, wanted, full, &|n| {
            let k = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
            progress(k, total);
        })?;
        steps = s;
        for &i in pass {
            let module = &modules[i].0;
            // Each module's matrix is dropped once its codes are chosen.
            let h = measured(&mut moments, &modules[i], src, cal, ck)?;
            // Inputs that are all zero carry no signal: GPTQ would zero every column (as
            // llm-compressor does a dead one) and the search has nothing to weigh.
            let method = if h.diag().iter().all(|&v| v == 0.0) {
                kept_rtn.push(module.clone());
                Method::Rtn
            } else {
                method
            };
            tokens = tokens.max(h.tokens);
            let c = choose_one(plan, grid, method, &modules[i], &h)?;
            runs += c.q.scales.len() as u64;
            moved.0 += c.moved.0;
            moved.1 += c.moved.1;
            gptq_loss += c.loss;
            let q = c.q;
            chosen.insert(module.clone(), q);
        }
    }
    Ok((
        chosen,
        Report {
            method,
            trace: cal.trace.clone(),
            trace_sha256: crate::trace::file::digest(&cal.trace)?,
            samples: trace.manifest.samples.len(),
            categories: category_shares(&trace),
            tokens,
            modules: modules.len(),
            scales_changed: moved.0,
            codes_changed: moved.1,
            runs,
            replays: passes.len(),
            steps,
            gptq_loss: full.then_some(gptq_loss),
            kept_rtn,
        },
    ))
}

/// The format's integer grid `--method` chooses codes on (only symmetric INT4 schemes have one).
fn int_grid<'a>(plan: &'a Plan, method: Method) -> Result<&'a dyn IntGrid> {
    plan.codec.int_grid().ok_or_else(|| Error::Flags {
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
    })
}

/// The calibration trace (its first `--calibration-samples`), which must list a sample.
fn open_trace(cal: &Calibration) -> Result<Trace> {
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
    Ok(trace)
}

/// A module's `Σ x xᵀ` from the replay (taken out of `moments`), checked: the replay ran the
/// module, over as many inputs as its weight has columns, all finite.
fn measured(
    moments: &mut BTreeMap<String, Arc<Hessian>>,
    (module, _, _, cols): &Module,
    src: &str,
    cal: &Calibration,
    ck: &Checkpoint,
) -> Result<Arc<Hessian>> {
    let h = moments.remove(module).ok_or_else(|| Error::Source {
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
    // Inputs that are not numbers: the trace (or the draft on it) is broken, and no
    // method may choose codes from them.
    if let Some(j) = h.sum.iter().position(|v| !v.is_finite()) {
        return Err(Error::Source {
            path: cal.trace.clone(),
            msg: format!(
                "the calibration replay gives `{module}` non-finite inputs (Σ x xᵀ entry {j} is {}): the trace holds NaN or infinite hidden states, or the draft overflows on them",
                h.sum[j]
            ),
            hint: Some("capture the trace again (`kquant trace capture`, or `trace import` of a clean capture); a calibrated method never runs on non-finite inputs".into()),
        });
    }
    Ok(h)
}

/// The codes and scales `method` chooses for one module, its weight read from the source a
/// chunk of rows at a time (each chunk's pages released once read).
fn choose_one(
    plan: &Plan,
    grid: &dyn IntGrid,
    method: Method,
    (module, t, rows, cols): &Module,
    h: &Hessian,
) -> Result<Chosen> {
    let ck = plan.ck;
    let shard = ck.weights.shard_of(&t.name).expect("routed");
    let view = shard.view(t);
    let row_bytes = *cols * t.dtype.size();
    let read = |r: std::ops::Range<usize>| -> Result<Vec<f32>> {
        let mut w = Vec::new();
        crate::io::dtype::to_f32_par_into(
            t.dtype,
            &view.data[r.start * row_bytes..r.end * row_bytes],
            &mut w,
        );
        // The chunk's source pages are not read again.
        shard.release_range(t, (r.start * row_bytes) as u64, (r.end * row_bytes) as u64);
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(non_finite(
                shard.path(),
                &t.name,
                r.start * cols + i,
                *cols,
                w[i],
            ));
        }
        Ok(w)
    };
    let gptq_error = |e: crate::quant::gptq::GptqError| {
        Error::Source {
        path: ck.weights.dir.clone(),
        msg: format!("GPTQ of `{module}`: {e}"),
        hint: Some("a calibration trace with more tokens gives a better-conditioned Σ x xᵀ; or --method search".into()),
    }
    };
    let chunk = chunk_rows(*rows, *cols, CHUNK_BYTES);
    let c = choose_module(
        grid,
        method,
        &read,
        *rows,
        *cols,
        h,
        t.dtype,
        chunk,
        &gptq_error,
    );
    shard.release(t);
    c
}

/// The modules (indices into `modules`) each replay collects: all at once for the diagonals;
/// for whole matrices, in order, as many as fit `budget` (`k² · 4` bytes each, counted without
/// the sharing of q/k/v or gate/up; a module larger than the budget alone).
fn passes(modules: &[Module], full: bool, budget: u64) -> Vec<Vec<usize>> {
    if !full {
        return vec![(0..modules.len()).collect()];
    }
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut used = 0u64;
    for (i, m) in modules.iter().enumerate() {
        let b = (m.3 as u64).pow(2) * 4;
        match out.last_mut() {
            Some(p) if used + b <= budget => {
                p.push(i);
                used += b;
            }
            _ => {
                out.push(vec![i]);
                used = b;
            }
        }
    }
    out
}

/// One replay of the trace by the draft `src` (loaded for it and dropped after, so that GPTQ
/// runs without it in memory), collecting the input moments of `wanted`.
fn collect(
    src: &str,
    trace: &Trace,
    cal: &Calibration,
    wanted: Vec<String>,
    full: bool,
    progress: &dyn Fn(u64),
) -> Result<(BTreeMap<String, Arc<Hessian>>, usize)> {
    let target = cal.target.as_deref().map(Checkpoint::open).transpose()?;
    // The replay never multiplies an unquantized lm_head: read only what it multiplies.
    let d = load_drafter(src, target.as_ref(), &Exec::F32Lazy)?;
    drop(target);
    crate::replay::check_fits(d.as_ref(), trace, src)?;
    let steps = steps_for(d.as_ref(), cal.steps, src)?;
    d.linears().collect_hessians(if full {
        HessianSet::new(wanted)
    } else {
        HessianSet::diagonal(wanted)
    });
    replay(d.as_ref(), trace, steps, AfterMiss::Run, progress)?;
    Ok((d.linears().take_hessians(), steps))
}

/// Rows of a `cols`-wide module chosen at a time: as many as keep their f32 copy within
/// `budget` (at least one). GPTQ's f32 copy of the Kimi-shape lm_head alone (163 840 × 7168)
/// is 4.7 GB.
pub(crate) fn chunk_rows(rows: usize, cols: usize, budget: u64) -> usize {
    ((budget / (cols.max(1) as u64 * 4)) as usize).clamp(1, rows.max(1))
}

/// The f32 copy of one chunk of a module's rows [`choose`] holds at a time.
const CHUNK_BYTES: u64 = 1 << 30;

/// One module's choice and how much of it differs from round to nearest.
pub(crate) struct Chosen {
    pub q: Int4,
    /// Runs (rows, or (row, group)s) whose scale differs from RTN's, and whose codes do.
    pub moved: (u64, u64),
    /// GPTQ's loss over the rows (0 for the other methods).
    pub loss: f64,
}

/// The codes and scales `method` chooses for a `[rows, cols]` module read `chunk` rows at a
/// time by `read(row range)`. Every method's choice for a row depends only on that row (its
/// RTN scales are the row's own: [`IntGrid::rtn`] is per row or per (row, group)) and on the
/// shared `h`, so the chunks give the whole module's result exactly (GPTQ factors `h` again
/// for each chunk: a few seconds at 7168 columns).
#[allow(clippy::too_many_arguments)]
pub(crate) fn choose_module(
    grid: &dyn IntGrid,
    method: Method,
    read: &dyn Fn(std::ops::Range<usize>) -> Result<Vec<f32>>,
    rows: usize,
    cols: usize,
    h: &Hessian,
    model: crate::io::Dtype,
    chunk: usize,
    gptq_error: &dyn Fn(crate::quant::gptq::GptqError) -> Error,
) -> Result<Chosen> {
    use crate::quant::gptq::{self, Config, Grid, Layer};
    let mut out: Option<Int4> = None;
    let (mut moved, mut loss) = ((0u64, 0u64), 0f64);
    let diag = (method != Method::Rtn && method != Method::Gptq).then(|| h.diag());
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + chunk.max(1)).min(rows);
        let n = r1 - r0;
        let w = read(r0..r1)?;
        let rtn = grid.rtn(&w, n, cols, model);
        let scaled = match (method, &diag) {
            (Method::Search | Method::SearchGptq, Some(d)) => {
                crate::quant::search::search(grid, &w, n, cols, d, model)
            }
            _ => rtn.clone(),
        };
        let q = if method.gptq() {
            let (qmin, qmax) = grid.range();
            let layer = Layer {
                weight: &w,
                rows: n,
                cols,
                scales: &scaled.scales,
                group: scaled.group,
                grid: Grid {
                    qmin: qmin as i32,
                    qmax: qmax as i32,
                    scale_dtype: grid.scale_dtype(model),
                },
            };
            // The sweep uses the matrix as its workspace.
            let mut work = h.sum.clone();
            let o = gptq::quantize(&layer, &mut work, &Config::default()).map_err(gptq_error)?;
            loss += o.loss.iter().sum::<f64>();
            Int4 {
                codes: o.codes,
                ..scaled
            }
        } else {
            scaled
        };
        let g = q.group.max(1);
        for ((a, b), (c, d)) in q
            .scales
            .iter()
            .zip(&rtn.scales)
            .zip(q.codes.chunks(g).zip(rtn.codes.chunks(g)))
        {
            moved.0 += u64::from(a != b);
            moved.1 += u64::from(c != d);
        }
        match &mut out {
            None => out = Some(q),
            Some(o) => {
                o.rows += q.rows;
                o.scales.extend_from_slice(&q.scales);
                o.codes.extend_from_slice(&q.codes);
            }
        }
        r0 = r1;
    }
    Ok(Chosen {
        q: out.expect("rows > 0"),
        moved,
        loss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Dtype;
    use crate::quant::math::pack::Order;
    use crate::quant::quark::{int4_group::Int4PerGroup, Layout, Options, Version};
    use crate::test_rng::Rng;

    /// Every method's choice read a few rows at a time is the whole module's, byte for byte
    /// (the lm_head of the Kimi-shape draft is chosen in chunks).
    #[test]
    fn chunks_give_the_whole_modules_choice() {
        let (rows, cols, tokens) = (37, 64, 200);
        let mut rng = Rng(0x5eed_c4a1);
        let w: Vec<f32> = rng
            .signed_units(rows * cols)
            .iter()
            .map(|v| crate::quant::math::int4::round_to(Dtype::BF16, v * 0.1))
            .collect();
        let x: Vec<f32> = rng.signed_units(tokens * cols);
        let h = Hessian {
            k: cols,
            sum: crate::runtime::hessian::outer_sum_ref(&x, tokens, cols),
            full: true,
            tokens: tokens as u64,
        };
        let grid = Int4PerGroup {
            opts: Options {
                layout: Layout::Model,
                version: Version::V013,
                order: Order::Reorder,
            },
            group: 32,
        };
        let read = |r: std::ops::Range<usize>| Ok(w[r.start * cols..r.end * cols].to_vec());
        let err = |e: crate::quant::gptq::GptqError| Error::Flags {
            msg: e.to_string(),
            hint: String::new(),
        };
        let choose = |method, chunk| {
            choose_module(
                &grid,
                method,
                &read,
                rows,
                cols,
                &h,
                Dtype::BF16,
                chunk,
                &err,
            )
            .unwrap()
        };
        for method in [
            Method::Rtn,
            Method::Search,
            Method::Gptq,
            Method::SearchGptq,
        ] {
            let whole = choose(method, rows);
            assert_eq!(whole.q.rows, rows);
            if method != Method::Rtn {
                assert!(
                    whole.moved.0 + whole.moved.1 > 0,
                    "{method:?} moves something"
                );
                if method == Method::Gptq {
                    assert_eq!(whole.moved.0, 0, "GPTQ keeps RTN's scales");
                }
            }
            for chunk in [1, 5, 16, 36] {
                let c = choose(method, chunk);
                assert_eq!(c.q, whole.q, "{method:?}, {chunk} rows at a time");
                assert_eq!(c.moved, whole.moved);
                assert!((c.loss - whole.loss).abs() <= 1e-9 * whole.loss.abs().max(1.0));
            }
        }
        assert_eq!(chunk_rows(163_840, 7168, CHUNK_BYTES), 37_449);
        assert_eq!(chunk_rows(10, 7168, CHUNK_BYTES), 10);
        assert_eq!(chunk_rows(10, 1 << 40, 1), 1);
    }
}
