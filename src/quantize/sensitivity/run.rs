//! The sensitivity measurement (`kquant sensitivity`): each module group quantized alone,
//! written in the recipe's format through `quantize`'s plan and writer into a scratch
//! directory, and replayed against the original draft over the trace (`verify::offline`); then
//! every group together, and with `pick` the exclusion sets the arithmetic in the parent
//! module proposes, until one meets the gate. The CLI turns its flags into a [`Request`] and
//! renders the [`Outcome`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::report::{Doc, GroupDoc, Pick, Trial, SCHEMA};
use super::{bias, candidates, groups, next_trial, Candidate, Group, MAX_GROUPS};
use crate::checkpoint::detect::Family;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::io::output::{self, Kind};
use crate::io::writer::WriteOptions;
use crate::quant::format::Format;
use crate::quant::math::int4::Int4;
use crate::quant::registry::Scheme;
use crate::quantize::calibrate::{self, Calibration, Method};
use crate::quantize::drive::Job;
use crate::quantize::plan::{Action, Plan};
use crate::quantize::{self as quantize, Recipe, Request as QuantizeRequest};
use crate::replay::AfterMiss;
use crate::runtime::linears::Exec;
use crate::trace::file::Trace;
use crate::verify::gate::{self, Thresholds};
use crate::verify::offline::{run_draft, Source};
use crate::verify::report::{agreement_of, Run};

/// What a sensitivity run is asked: the flags, typed.
#[derive(Debug, Clone)]
pub struct Request {
    /// The original (BF16/F16) draft.
    pub src: String,
    /// The target, the trace to evaluate on (or the live capture) and the steps replayed.
    pub source: Source,
    /// The scheme, the format and a preset for them and the Quark settings (its exclude list
    /// is not used); `exclude`: the modules never quantized nor measured (Quark fnmatch
    /// patterns, comma-separated).
    pub recipe: QuantizeRequest,
    pub method: Method,
    /// A calibration trace for `search`/`gptq`.
    pub calibrate: Option<PathBuf>,
    pub calibration_memory: u64,
    /// The gate every measurement and the picked set must meet.
    pub thresholds: Thresholds,
    pub pick: bool,
    pub max_trials: usize,
    /// Where the picked preset will be written: refused when it is `config`.
    pub write_preset: Option<PathBuf>,
    /// The command line, for the scratch variants' manifests.
    pub command: Vec<String>,
}

impl Request {
    /// The quantize request of a variant: the recipe with every module matching `patterns`
    /// left unquantized (the preset's exclude list is not used).
    fn recipe_excluding(&self, patterns: &[String]) -> QuantizeRequest {
        QuantizeRequest {
            exclude: Some(patterns.join(",")),
            ..self.recipe.clone()
        }
    }
}

/// What the run measured, and the document `--json` prints.
pub struct Outcome {
    /// The `kquant.sensitivity/1` document.
    pub doc: Doc,
    pub groups: Vec<Group>,
    /// Each group quantized alone, in `groups`' order.
    pub single: Vec<Measured>,
    /// Every group quantized.
    pub every: Measured,
    pub baseline_al: f64,
    /// With `pick`: the exclusion set that met the gate, its preset and `quantize` line.
    pub picked: Option<Measured>,
    pub preset: Option<Value>,
    pub command: Option<String>,
    /// Exclusion sets `pick` measured.
    pub trials: usize,
    /// The draft's bytes before quantization.
    pub bytes_before: u64,
    pub scheme: Scheme,
    pub format: Format,
    /// Whether any serving engine loads the recipe as written for this draft's family.
    pub loads_anywhere: bool,
}

pub use super::report::Measured;

/// How an existing `--write-preset` file is recognised as one kquant wrote.
pub const PRESET: Kind = Kind::File {
    what: "kquant sensitivity preset",
    flag: "--write-preset",
    is_ours: |b| {
        serde_json::from_slice::<Value>(b).is_ok_and(|v| {
            v["description"]
                .as_str()
                .is_some_and(|d| d.starts_with(PRESET_MARK))
        })
    },
};
pub const PRESET_MARK: &str = "Picked by kquant sensitivity";

/// What `pick` measured: each exclusion set tried with its measurement, and the one that met
/// the gate.
type Picked = (Vec<(Candidate, Measured)>, Option<Measured>);

/// Everything a variant needs besides its exclusions.
struct Bench<'a> {
    a: &'a Request,
    ck: &'a Checkpoint,
    det: &'a crate::checkpoint::Detection,
    trace: &'a Trace,
    target: Option<&'a Checkpoint>,
    baseline: &'a Run,
    chosen: &'a std::collections::BTreeMap<String, Int4>,
    base: Vec<String>,
    groups: &'a [Group],
}

impl Bench<'_> {
    /// Quantize every group but `excluded` (indices), write it, replay it, compare.
    fn measure(&self, excluded: &[usize]) -> Result<Measured> {
        let mut patterns = self.base.clone();
        for &i in excluded {
            patterns.extend(self.groups[i].patterns.iter().cloned());
        }
        let recipe = quantize::resolve(
            self.ck,
            self.det,
            &self.a.src,
            &self.a.recipe_excluding(&patterns),
        )?;
        let mut plan = Plan::new(self.ck, &recipe, false)?;
        let want: BTreeSet<&str> = self
            .groups
            .iter()
            .enumerate()
            .filter(|(i, _)| !excluded.contains(i))
            .flat_map(|(_, g)| g.modules.iter().map(String::as_str))
            .collect();
        let got: BTreeSet<&str> = plan
            .rows
            .iter()
            .filter_map(|r| match &r.action {
                Action::Quantize { module, .. } => Some(module.as_str()),
                Action::Copy { .. } => None,
            })
            .collect();
        assert_eq!(want, got, "a variant quantizes exactly its groups");
        plan.chosen = self
            .chosen
            .iter()
            .filter(|(m, _)| got.contains(m.as_str()))
            .map(|(m, q)| (m.clone(), q.clone()))
            .collect();
        let dir = tempfile::tempdir().map_err(|e| Error::io("create", Path::new("$TMPDIR"), e))?;
        let out = dir.path().join("variant");
        let wopts = WriteOptions {
            command: self.a.command.clone(),
            ..Default::default()
        };
        let (mut job, _) = Job::start(&plan, &out, wopts, &self.det.family, &self.a.src)?;
        job.write(&|_| {})?;
        job.finish(&self.a.src)?;
        let (run, _) = run_draft(
            &out.to_string_lossy(),
            self.trace,
            self.target,
            self.a.source.steps,
            AfterMiss::Run,
            &Exec::F32,
        )?;
        let (delta, ci95) = gate::paired_delta(&run.samples, &self.baseline.samples);
        let idx: Vec<usize> = (0..run.samples.len()).collect();
        let g = agreement_of(&run, self.baseline, &idx);
        let all: Vec<_> = run.samples.iter().collect();
        Ok(Measured {
            excluded: excluded
                .iter()
                .map(|&i| self.groups[i].name.clone())
                .collect(),
            quantized: got.len(),
            bytes_after: plan.bytes_after(),
            accept_length: gate::micro_al(&all),
            delta,
            ci95,
            agreement: g.as_ref().and_then(|g| g.overall()),
            agreement_per_depth: g.map(|g| g.rates()).unwrap_or_default(),
            passed: gate::decide(gate::micro_al(&all), Some(delta), self.a.thresholds).passed,
        })
    }

    /// `pick`: every group quantized if that passes, else the exclusion sets, cheapest first
    /// among those predicted to pass, each prediction shifted by the misses so far, until one
    /// meets the gate or `max_trials` were measured.
    fn pick(&self, every: &Measured, single: &[Measured]) -> Result<Picked> {
        let mut trials = Vec::new();
        let mut picked: Option<Measured> = None;
        if every.passed {
            picked = Some(every.clone());
        } else {
            let deltas: Vec<f64> = single.iter().map(|m| m.delta).collect();
            let cands = candidates(self.groups, every.delta, &deltas);
            let mut tried = vec![false; cands.len()];
            let mut misses: Vec<(f64, f64)> = Vec::new();
            while trials.len() < self.a.max_trials {
                let Some(i) = next_trial(
                    &cands,
                    &tried,
                    bias(&misses),
                    self.a.thresholds.max_regression,
                ) else {
                    break;
                };
                tried[i] = true;
                let c = &cands[i];
                let names: Vec<&str> = c
                    .exclude
                    .iter()
                    .map(|&i| self.groups[i].name.as_str())
                    .collect();
                eprintln!(
                    "sensitivity: pick [{}/{}] leave {} unquantized (predicted ΔAL {:+.3}, {:+.3} after the misses so far)",
                    trials.len() + 1,
                    self.a.max_trials,
                    names.join(", "),
                    c.predicted,
                    c.predicted + bias(&misses)
                );
                let m = self.measure(&c.exclude)?;
                let pass = m.passed;
                misses.push((c.predicted, m.delta));
                trials.push((c.clone(), m.clone()));
                if pass {
                    picked = Some(m);
                    break;
                }
            }
        }
        Ok((trials, picked))
    }
}

/// Measure: the baseline replay, every group together, each group alone, and with `pick` the
/// exclusion sets, cheapest first among those predicted to pass.
pub fn run(a: &Request) -> Result<Outcome> {
    refuse_preset_over_config(a)?;
    let mut tmp = None;
    let (prof, trace) = a.source.open(&mut tmp)?;
    if trace.manifest.samples.iter().all(|s| s.gen_len == 0) {
        return Err(Error::Source {
            path: trace.dir.join("manifest.json"),
            msg: "has no generated position to replay: a sensitivity over nothing measures nothing"
                .into(),
            hint: Some("evaluate on a trace with samples (`kquant trace capture`)".into()),
        });
    }
    let target_at = a.source.target_checkpoint(prof.as_ref())?;
    let target = target_at.as_deref().map(Checkpoint::open).transpose()?;
    let ck = Checkpoint::open(&a.src)?;
    let det = ck.detect()?;
    let base = a
        .recipe
        .exclude
        .as_deref()
        .map(crate::quant::exclude::parse_patterns)
        .unwrap_or_default();

    // Every group quantized: the modules, their groups, and (calibrated methods) the codes,
    // chosen once on the original draft's inputs, which no variant changes.
    let recipe = quantize::resolve(&ck, &det, &a.src, &a.recipe_excluding(&base))?;
    let plan = Plan::new(&ck, &recipe, false)?;
    let groups = groups_of(a, &plan, &recipe, &base)?;
    let chosen = choose_codes(a, &plan, target_at.as_deref())?;
    let (baseline, steps) = run_draft(
        &a.src,
        &trace,
        target.as_ref(),
        a.source.steps,
        AfterMiss::Run,
        &Exec::F32,
    )?;
    let all_samples: Vec<_> = baseline.samples.iter().collect();
    let baseline_al = gate::micro_al(&all_samples);
    let bench = Bench {
        a,
        ck: &ck,
        det: &det,
        trace: &trace,
        target: target.as_ref(),
        baseline: &baseline,
        chosen: &chosen,
        base: base.clone(),
        groups: &groups,
    };
    let n = groups.len();
    let step = |k: usize, what: &str| eprintln!("sensitivity: [{k}/{}] {what}", n + 1);
    step(1, "every group quantized");
    let every = bench.measure(&[])?;
    let mut single = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        step(i + 2, &format!("`{}` alone", g.name));
        let others: Vec<usize> = (0..n).filter(|&j| j != i).collect();
        single.push(bench.measure(&others)?);
    }

    let (trials, picked) = if a.pick {
        bench.pick(&every, &single)?
    } else {
        (Vec::new(), None)
    };

    let exclude_of = |m: &Measured| -> Vec<String> {
        let mut p = base.clone();
        for name in &m.excluded {
            let g = groups.iter().find(|g| &g.name == name).expect("a group");
            p.extend(g.patterns.iter().cloned());
        }
        p
    };
    let samples = trace.manifest.samples.len();
    let preset = picked
        .as_ref()
        .map(|m| preset_of(a, &recipe, det.family.id(), samples, m, &exclude_of(m)));
    let command = picked
        .as_ref()
        .map(|m| command_of(a, &recipe, &exclude_of(m), target_at.as_deref()));
    let doc = Doc {
        schema: SCHEMA,
        draft: a.src.clone(),
        scheme: recipe.scheme(),
        format: recipe.format().name(),
        method: a.method,
        calibration: a.calibrate.clone(),
        trace: a
            .source
            .trace
            .as_ref()
            .map_or("live capture".to_string(), |t| t.display().to_string()),
        samples,
        steps,
        exclude: base.clone(),
        baseline_accept_length: baseline_al,
        max_regression: a.thresholds.max_regression,
        every_group: every.clone(),
        groups: group_docs(&groups, &single),
        pick: a.pick.then(|| Pick {
            trials: trial_docs(&trials),
            picked: picked.clone(),
            preset: preset.clone(),
            command: command.clone(),
        }),
    };
    Ok(Outcome {
        doc,
        scheme: recipe.scheme(),
        format: recipe.format(),
        loads_anywhere: loads_anywhere(recipe.format(), recipe.scheme(), &det.family),
        bytes_before: plan.bytes_before(),
        trials: trials.len(),
        groups,
        single,
        every,
        baseline_al,
        picked,
        preset,
        command,
    })
}

/// The module groups of every module the recipe quantizes: refused when it quantizes none,
/// or when `--pick` would search too many.
fn groups_of(a: &Request, plan: &Plan, recipe: &Recipe, base: &[String]) -> Result<Vec<Group>> {
    let modules: Vec<(String, u64, u64)> = plan
        .rows
        .iter()
        .filter_map(|r| match &r.action {
            Action::Quantize { module, .. } => {
                Some((module.clone(), r.tensor.nbytes(), r.bytes_after()))
            }
            Action::Copy { .. } => None,
        })
        .collect();
    if modules.is_empty() {
        return Err(Error::Flags {
            msg: format!(
                "--scheme {} quantizes no module of `{}` under --exclude {:?}",
                recipe.scheme(),
                a.src,
                base.join(",")
            ),
            hint:
                "exclude fewer modules; `kquant quantize --dry-run` shows what a recipe quantizes"
                    .into(),
        });
    }
    let groups = groups(&modules);
    if a.pick && groups.len() > MAX_GROUPS {
        return Err(Error::Flags {
            msg: format!(
                "--pick searches the subsets of at most {MAX_GROUPS} module groups; `{}` has {}",
                a.src,
                groups.len()
            ),
            hint: "fix some with --exclude (they are then never quantized), or run without --pick"
                .into(),
        });
    }
    Ok(groups)
}

/// Each group quantized alone, as the document states it.
fn group_docs(groups: &[Group], single: &[Measured]) -> Vec<GroupDoc> {
    groups
        .iter()
        .zip(single)
        .map(|(g, m)| GroupDoc {
            group: g.clone(),
            measured: m.clone(),
        })
        .collect()
}

/// The exclusion sets `--pick` measured, as the document states them.
fn trial_docs(trials: &[(Candidate, Measured)]) -> Vec<Trial> {
    trials
        .iter()
        .map(|(c, m)| Trial {
            predicted: c.predicted,
            cost_bytes: c.cost,
            measured: m.clone(),
        })
        .collect()
}

/// The preset written may not be the preset read: refused before any measurement.
fn refuse_preset_over_config(a: &Request) -> Result<()> {
    if let (Some(w), Some(c)) = (&a.write_preset, &a.recipe.config) {
        let same = match (std::fs::canonicalize(w), std::fs::canonicalize(c)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        };
        if same {
            return Err(Error::Flags {
                msg: format!(
                    "--write-preset {} is the --config preset this run reads",
                    w.display()
                ),
                hint: "write the picked preset to another file".into(),
            });
        }
    }
    Ok(())
}

/// The codes a calibrated method chooses, once, on the original draft's inputs (none for RTN).
fn choose_codes(
    a: &Request,
    plan: &Plan,
    target_at: Option<&str>,
) -> Result<BTreeMap<String, Int4>> {
    Ok(match (a.method, &a.calibrate) {
        (Method::Rtn, None) => Default::default(),
        (Method::Rtn, Some(_)) => {
            return Err(Error::Flags {
                msg: "--calibrate with --method rtn: round to nearest uses no calibration".into(),
                hint: "add --method search or gptq, or drop --calibrate".into(),
            })
        }
        (_, None) => {
            return Err(Error::Flags {
                msg: "--method search and gptq need calibration inputs".into(),
                hint: "give --calibrate TRACE: a trace of other prompts than the evaluation --trace (`kquant trace capture`)".into(),
            })
        }
        (m, Some(t)) => {
            if a.source.trace.as_deref() == Some(t.as_path()) {
                eprintln!("warning: --calibrate is the evaluation --trace: the method is measured on the prompts it was fitted to, which flatters it");
            }
            let cal = Calibration {
                trace: t.clone(),
                target: target_at.map(String::from),
                steps: a.source.steps,
                limit: None,
                memory: a.calibration_memory,
            };
            let pb = crate::progress::Deferred::new("calibrate", "positions");
            let (chosen, _) = calibrate::choose(plan, &a.src, m, &cal, &|done, total| {
                pb.set(done, total)
            })?;
            pb.finish_and_clear();
            chosen
        }
    })
}

/// The picked set as a `quantize --config` preset.
fn preset_of(
    a: &Request,
    recipe: &Recipe,
    family: &str,
    samples: usize,
    m: &Measured,
    exclude: &[String],
) -> Value {
    let method = serde_json::to_value(a.method).expect("method");
    let mut p = json!({
        "description": format!("{PRESET_MARK} on `{}` ({} samples): ΔAL {:+.4} [{:+.4}, {:+.4}] with --method {}, gate {}", a.src, samples, m.delta, m.ci95[0], m.ci95[1], a.method.name(), a.thresholds.max_regression),
        "family": [family],
        "scheme": recipe.scheme(),
        "format": recipe.format(),
        "exclude": exclude,
        "loads": "see `kquant schemes`",
    });
    // The measurement holds for these codes: `quantize --config` uses the method (and
    // asks for --calibrate).
    if method.as_str() != Some("rtn") {
        p["method"] = method.clone();
    }
    if recipe.format() == Format::Quark {
        p["quark_layout"] = json!(recipe.choice.quark.layout);
        p["quark_version"] = json!(recipe.choice.quark.version);
        p["quark_sequential"] = json!(
            recipe.choice.quark.layout == crate::quant::quark::Layout::Model
                && recipe.choice.quark.order == crate::quant::math::pack::Order::Sequential
        );
    }
    p
}

/// The `quantize` line that writes the picked set, runnable as printed (every path one shell
/// word): a calibrated method also names the target the calibration ran (`target_at`: the
/// `--target-checkpoint`, or the live profile's target), without which `quantize` refuses.
fn command_of(a: &Request, recipe: &Recipe, exclude: &[String], target_at: Option<&str>) -> String {
    use crate::convert::layout::sh_quote;
    let mut c = format!(
        "kquant quantize {} -o OUT --scheme {} --format {} --exclude '{}'",
        sh_quote(&a.src),
        recipe.scheme(),
        recipe.format().name(),
        exclude.join(",")
    );
    if let Some(t) = &a.calibrate {
        c += &format!(
            " --method {} --calibrate {}",
            a.method.name(),
            sh_quote(&t.to_string_lossy())
        );
        if let Some(tc) = target_at {
            c += &format!(" --target-checkpoint {}", sh_quote(tc));
        }
    }
    c
}

/// Write the picked preset to `path`: never over a source (the draft, the preset read), and
/// over an existing file only when kquant wrote it ([`PRESET`]).
pub fn write_preset(a: &Request, path: &Path, preset: &Value) -> Result<()> {
    let sources: Vec<PathBuf> = std::iter::once(PathBuf::from(&a.src))
        .chain(
            a.recipe
                .config
                .as_ref()
                .map(PathBuf::from)
                .filter(|c| c.is_file()),
        )
        .collect();
    output::write_file(
        path,
        PRESET,
        true,
        &sources,
        &serde_json::to_vec_pretty(preset).expect("JSON"),
    )?;
    Ok(())
}

/// Whether any serving engine loads `scheme` written as `format` for a draft of `family`.
fn loads_anywhere(format: Format, scheme: Scheme, family: &Family) -> bool {
    use crate::engines::{quantized, Engine, Loads};
    Engine::ALL.iter().any(|&e| {
        quantized::claim_for(format, scheme, e, family).is_some_and(|c| c.loads == Loads::Yes)
    })
}
