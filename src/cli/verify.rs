//! `kquant verify --draft D [--baseline B|prompt-lookup] --trace T`: exact offline replay of
//! the engine's greedy speculative loop over a captured trace, and the regression gate.
//! Exit 0 pass, 1 gate failed, 2 error.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::verify::drafters::{load_drafter, replay};
use crate::verify::gate::{decide, Thresholds};
use crate::verify::report::{self, Run};
use crate::verify::trace::Trace;
use crate::verify::walk::{walk, Walk};
use crate::verify::{gate, ngram};

/// Arguments of `kquant verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The draft to check (usually the quantized one).
    #[arg(long)]
    pub draft: String,
    /// What to compare against: another draft (usually the original) or `prompt-lookup`.
    #[arg(long)]
    pub baseline: Option<String>,
    /// A kquant-trace/1 directory (tokens + target taps) captured from the target.
    #[arg(long)]
    pub trace: PathBuf,
    /// Target checkpoint: its embedding for an EAGLE-3 draft that carries none, its embedding
    /// and lm_head for a DFlash draft (required there).
    #[arg(long)]
    pub target_checkpoint: Option<String>,
    /// Draft depths per round (chain length; a DFlash draft proposes block_size − 1 whatever
    /// this says).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Fail when ΔAL (draft − baseline) < −this.
    #[arg(long, default_value_t = 0.03)]
    pub max_regression: f64,
    /// Fail when the draft's accept length is below this.
    #[arg(long)]
    pub min_accept: Option<f64>,
    /// Write the JSON report here (`-` for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write JUnit XML here.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Where the draft's quantized linears run: `cpu` (the f32 runtime), `cuda[:N]`, `hip[:N]`
    /// (builds with `--features cuda` / `hip`; see docs/kernels.md).
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Replay one draft over the trace. Returns its run and its depths per round.
fn run_draft(
    spec: &str,
    trace: &Trace,
    target: Option<&Checkpoint>,
    steps: usize,
    exec: &crate::runtime::linears::Exec,
) -> Result<(Run, usize)> {
    let d = load_drafter(spec, target, exec)?;
    trace.require(
        d.taps(),
        d.target_hidden(),
        Some(d.vocab()),
        &format!("draft `{spec}`"),
    )?;
    let samples = replay(d.as_ref(), trace, steps)?;
    Ok((
        Run {
            name: spec.to_string(),
            samples,
        },
        d.depths(steps),
    ))
}

pub fn run(a: Args) -> Result<ExitCode> {
    let exec = crate::runtime::linears::Exec::device(crate::gpu::linear::verify_device(&a.device)?);
    let trace = Trace::open(&a.trace)?;
    let target = a
        .target_checkpoint
        .as_deref()
        .map(Checkpoint::open)
        .transpose()?;
    let (draft, depths) = run_draft(&a.draft, &trace, target.as_ref(), a.steps, &exec)?;
    let baseline = match a.baseline.as_deref() {
        None => None,
        Some("prompt-lookup") => {
            let mut samples: Vec<Walk> = Vec::new();
            for s in &trace.manifest.samples {
                samples.push(walk(&ngram::matches(
                    &trace.tokens(s)?,
                    s.prompt_len,
                    depths,
                )));
            }
            Some(Run {
                name: "prompt-lookup".into(),
                samples,
            })
        }
        Some(b) => Some(run_draft(b, &trace, target.as_ref(), a.steps, &exec)?.0),
    };
    let th = Thresholds {
        max_regression: a.max_regression,
        min_accept: a.min_accept,
    };
    let all: Vec<&Walk> = draft.samples.iter().collect();
    let delta = baseline
        .as_ref()
        .map(|b| gate::paired_delta(&draft.samples, &b.samples).0);
    let decision = decide(gate::micro_al(&all), delta, th);
    let cats: Vec<String> = trace
        .manifest
        .samples
        .iter()
        .map(|s| {
            if s.category.is_empty() {
                "all".into()
            } else {
                s.category.clone()
            }
        })
        .collect();
    let rep = report::build(&draft, baseline.as_ref(), &cats, th, &decision, depths);
    let json_to_stdout = a.json.as_deref() == Some(std::path::Path::new("-"));
    if json_to_stdout {
        println!("{}", serde_json::to_string_pretty(&rep).expect("JSON"));
    } else {
        print!("{}", report::table(&rep));
    }
    if let Some(p) = a.json.as_ref().filter(|_| !json_to_stdout) {
        std::fs::write(p, serde_json::to_vec_pretty(&rep).expect("JSON"))
            .map_err(|e| Error::io("write", p, e))?;
    }
    if let Some(p) = &a.junit {
        std::fs::write(p, report::junit(&rep)).map_err(|e| Error::io("write", p, e))?;
    }
    Ok(if decision.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
