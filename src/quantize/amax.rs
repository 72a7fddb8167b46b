//! `kquant calibrate` as a library: the activation range NVFP4 W4A4's static input scales need.
//! The draft replays the trace (pass A of docs/verify.md, the f32 runtime: teacher-forced
//! depths over the trace's target taps and tokens) with an observer on every linear's input,
//! and each module's `max |x|` is written as the `kquant.input-amax/1` file that `quantize
//! --scheme nvfp4 --input-amax` reads (`quant::input_amax`; module = the draft's own tensor
//! name without `.weight`). Fused siblings (q/k/v, gate/up, …) are recorded one by one;
//! `quantize` shares their largest. `cli::calibrate` parses the arguments and renders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::quant::input_amax::{FILE_KIND, SCHEMA};
use crate::replay::walk::Walk;
use crate::replay::{load_drafter, replay_each, steps_for, AfterMiss, Pass};
use crate::runtime::linears::Exec;
use crate::runtime::Drafter;
use crate::trace::file::Trace;

/// What `kquant calibrate` was asked for.
#[derive(Debug, Clone)]
pub struct Request {
    /// The draft to calibrate (the unquantized one the NVFP4 checkpoint will be made from).
    pub draft: String,
    /// A `kquant-trace/1` directory captured from the target.
    pub trace: PathBuf,
    /// The target checkpoint, for drafts that run with its embedding (and lm_head).
    pub target_checkpoint: Option<String>,
    /// Replay only the first N samples.
    pub limit: Option<usize>,
    /// Draft tokens per step (the draft's own default without).
    pub steps: Option<usize>,
}

/// A draft loaded over its trace, ready to replay.
pub struct Observer {
    req: Request,
    trace: Trace,
    d: Box<dyn Drafter>,
    limit: usize,
    /// Things the user should know before the replay (a draft that is already quantized).
    pub warnings: Vec<String>,
}

/// What the replay observed.
#[derive(Debug, Clone)]
pub struct Observed {
    /// Each module's input `max |x|`.
    pub amax: BTreeMap<String, f32>,
    /// Samples replayed.
    pub samples: usize,
    pub steps: usize,
    /// The replay's accept length (micro-averaged over the samples).
    pub accept_length: f64,
}

impl Observer {
    /// Open the trace (and target), load the draft and check that the trace fits it.
    pub fn load(req: &Request) -> Result<Observer> {
        let trace = Trace::open(&req.trace)?;
        let target = req
            .target_checkpoint
            .as_deref()
            .map(Checkpoint::open)
            .transpose()?;
        let d = load_drafter(&req.draft, target.as_ref(), &Exec::F32)?;
        crate::replay::check_fits(d.as_ref(), &trace, &req.draft)?;
        let limit = req.limit.unwrap_or(usize::MAX);
        if limit == 0 {
            return Err(Error::Usage("--limit 0 replays nothing".into()));
        }
        let (_, quantized) = d.linears().placement();
        let mut warnings = Vec::new();
        if !quantized.is_empty() {
            warnings.push(format!(
                "`{}` is already quantized ({} module(s)): the ranges observed are those of \
                 its dequantized weights; calibrate the original draft for a fresh quantization",
                req.draft,
                quantized.len()
            ));
        }
        Ok(Observer {
            req: req.clone(),
            trace,
            d,
            limit,
            warnings,
        })
    }

    /// Replay the trace with the observer on; refused when an input was not finite or no
    /// linear ran.
    pub fn run(self) -> Result<Observed> {
        let d = self.d.as_ref();
        let steps = steps_for(d, self.req.steps, &self.req.draft)?;
        d.linears().observe(true);
        let pass = Pass {
            steps,
            after_miss: AfterMiss::Run,
            limit: self.limit,
            progress: &|_| {},
        };
        let walks = replay_each(d, &self.trace, &pass, |w, _| w)?;
        d.linears().observe(false);
        let amax = d.linears().input_amax();
        if let Some((m, _)) = amax.iter().find(|(_, v)| !v.is_finite()) {
            return Err(Error::Source {
                path: self.req.trace.clone(),
                msg: format!("the input of `{m}` was not finite during the replay"),
                hint: Some("check the trace's taps (`kquant trace` writes finite bf16)".into()),
            });
        }
        if amax.is_empty() {
            return Err(Error::Source {
                path: self.req.trace.clone(),
                msg: "the replay ran no linear (no generated positions in the samples replayed)"
                    .into(),
                hint: Some("raise --limit or use a trace with generated tokens".into()),
            });
        }
        Ok(Observed {
            amax,
            samples: walks.len(),
            steps,
            accept_length: Walk::sum(&walks).al_walk(),
        })
    }
}

impl Observed {
    /// Write the `kquant.input-amax/1` file to `output`. Regenerated on every run: replaced
    /// when kquant wrote it, refused otherwise (`io::output`).
    pub fn write(&self, req: &Request, output: &Path) -> Result<()> {
        let doc = serde_json::json!({
            "schema": SCHEMA,
            "amax": self.amax,
            "draft": req.draft,
            "trace": req.trace,
            "samples": self.samples,
            "steps": self.steps,
            "observed": "max |x| over every input row of each linear in the f32 replay (pass A)",
        });
        let mut bytes = serde_json::to_vec_pretty(&doc).expect("JSON");
        bytes.push(b'\n');
        crate::io::output::write_file(
            output,
            FILE_KIND,
            true,
            &[PathBuf::from(&req.draft), req.trace.clone()],
            &bytes,
        )?;
        Ok(())
    }

    /// The smallest and the largest amax.
    pub fn range(&self) -> (f32, f32) {
        self.amax
            .values()
            .fold((f32::INFINITY, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)))
    }
}

/// What a user does with the input-amax file next: quantize the draft to NVFP4 W4A4 in each
/// format that carries it (docs/quantize.md).
pub fn next_steps(draft: &str, amax: &Path) -> Vec<String> {
    ["compressed-tensors", "modelopt"]
        .iter()
        .map(|f| {
            format!(
                "kquant quantize {draft} -o OUT --scheme nvfp4 --format {f} --input-amax {}",
                amax.display()
            )
        })
        .collect()
}
