//! `kquant sensitivity SRC --trace T|--target LIVE [--scheme …] [--method …] [--pick]`: where a
//! quantization recipe costs accept length. Each group of modules (`quantize::sensitivity`) is
//! quantized alone, written in the recipe's format, and replayed against the original draft
//! over the trace: ΔAL, its paired 95 % interval and the proposal agreement per group, and the
//! same with every group quantized. `--pick` then measures exclusion sets, cheapest first
//! among those the single-group losses predict to pass (the prediction corrected by each miss),
//! until one meets `--max-regression`,
//! and prints (`--write-preset`: writes) the preset.
//! Exit 0; with `--pick`, 1 when no set tried meets the gate; 2 on error.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::checkpoint::Checkpoint;
use crate::cli::verify::{open_trace, run_draft, target_spec, TraceSource};
use crate::cli::{flags, human_bytes};
use crate::error::{Error, Result};
use crate::escape::printable;
use crate::io::output::{self, Kind};
use crate::io::writer::WriteOptions;
use crate::quant::format::Format;
use crate::quant::math::int4::Int4;
use crate::quant::registry::SCHEMES;
use crate::quantize::calibrate::{self, Calibration, Method};
use crate::quantize::drive::Job;
use crate::quantize::plan::{Action, Plan};
use crate::quantize::sensitivity::{bias, candidates, groups, next_trial, Group, MAX_GROUPS};
use crate::quantize::{self, Request};
use crate::runtime::linears::Exec;
use crate::verify::drafters::AfterMiss;
use crate::verify::gate::{self, Thresholds};
use crate::verify::profile;
use crate::verify::report::{agreement_of, Run};
use crate::verify::trace::Trace;

/// Arguments of `kquant sensitivity`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The original (BF16/F16) draft: directory, `.safetensors` file or hub id.
    pub src: String,
    /// Target profile (`kquant targets`); a live one (`kimi-k2.5-tiny`) captures the trace
    /// when no `--trace` is given.
    #[arg(long)]
    pub target: Option<String>,
    /// The kquant-trace/1 directory to evaluate on. Calibrate on another one: a method
    /// measured on its own calibration prompts flatters itself.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// With a live `--target` and no `--trace`: capture these prompts (jsonl) instead of the
    /// profile's bundled set.
    #[arg(long, value_name = "FILE", conflicts_with = "trace")]
    pub prompts: Option<PathBuf>,
    /// Target checkpoint: its embedding (and DFlash's lm_head) for the drafts [default: a live
    /// profile's target]. Also used by the calibration replay.
    #[arg(long)]
    pub target_checkpoint: Option<String>,
    #[command(flatten)]
    pub per_category: flags::PerCategory,
    #[command(flatten)]
    pub steps: flags::Steps,
    /// Quantization scheme, as `quantize --scheme` [default: int4-pc, or the preset's].
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(SCHEMES.iter().map(|s| s.id.id())))]
    pub scheme: Option<String>,
    /// Output format the variants are written in [default: quark, or the preset's].
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// A preset (name or file) for the scheme, format and Quark settings; its exclude list is
    /// not used (give `--exclude`).
    #[arg(long)]
    pub config: Option<String>,
    /// Modules never quantized nor measured (comma-separated Quark fnmatch patterns)
    /// [default: none: `fc` and `lm_head` are measured like every other group].
    #[arg(long)]
    pub exclude: Option<String>,
    /// How the codes are chosen, as `quantize --method`.
    #[arg(long, value_enum, default_value_t = Method::Rtn)]
    pub method: Method,
    #[command(flatten)]
    pub cal: flags::Calibrate,
    /// The gate every measurement and the picked exclusion set must meet.
    #[command(flatten)]
    pub gate: flags::Gate,
    /// Look for the cheapest exclusion set (fewest bytes left unquantized) whose measured ΔAL
    /// meets `--max-regression`, and print it as a preset and a `quantize` command line.
    #[arg(long)]
    pub pick: bool,
    /// Most exclusion sets `--pick` measures (at least 1).
    #[arg(long, default_value_t = 12, value_parser = flags::limit, requires = "pick")]
    pub max_trials: usize,
    /// Write the picked preset here (a `quantize --config` file).
    #[arg(long, value_name = "FILE", requires = "pick")]
    pub write_preset: Option<PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// One quantized variant, measured against the original.
#[derive(Debug, Clone, serde::Serialize)]
struct Measured {
    /// Groups left unquantized (besides `--exclude`).
    excluded: Vec<String>,
    /// Modules quantized.
    quantized: usize,
    bytes_after: u64,
    accept_length: f64,
    delta: f64,
    ci95: [f64; 2],
    agreement: Option<f64>,
    agreement_per_depth: Vec<Option<f64>>,
    passed: bool,
}

/// How an existing `--write-preset` file is recognised as one kquant wrote.
const PRESET: Kind = Kind::File {
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
const PRESET_MARK: &str = "Picked by kquant sensitivity";

/// Everything a variant needs besides its exclusions.
struct Bench<'a> {
    a: &'a Args,
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
    fn request(&self, patterns: &[String]) -> Request {
        Request {
            scheme: self.a.scheme.clone(),
            format: self.a.format,
            config: self.a.config.clone(),
            exclude: Some(patterns.join(",")),
            ..Default::default()
        }
    }

    /// Quantize every group but `excluded` (indices), write it, replay it, compare.
    fn measure(&self, excluded: &[usize]) -> Result<Measured> {
        let mut patterns = self.base.clone();
        for &i in excluded {
            patterns.extend(self.groups[i].patterns.iter().cloned());
        }
        let recipe = quantize::resolve(self.ck, self.det, &self.a.src, &self.request(&patterns))?;
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
            command: crate::cli::command_line(),
            ..Default::default()
        };
        let (mut job, _) = Job::start(&plan, &out, wopts, &self.det.family, &self.a.src)?;
        job.write(&|_| {})?;
        job.finish(&self.a.src)?;
        let (run, _) = run_draft(
            &out.to_string_lossy(),
            self.trace,
            self.target,
            self.a.steps.steps,
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
            passed: delta >= -self.a.gate.max_regression,
        })
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    a.per_category.warn_spelling("sensitivity");
    // The preset written may not be the preset read: refused before any measurement.
    if let (Some(w), Some(c)) = (&a.write_preset, &a.config) {
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
    let th = Thresholds {
        max_regression: a.gate.max_regression,
        min_accept: None,
    };
    th.check().map_err(|msg| Error::Flags {
        msg,
        hint: "give a finite --max-regression".into(),
    })?;
    let prof = a.target.as_deref().map(profile::load).transpose()?;
    let mut tmp = None;
    let src = TraceSource {
        trace: a.trace.as_deref(),
        prompts: a.prompts.as_deref(),
        limit: a.per_category.value(),
    };
    let trace = open_trace(&src, prof.as_ref(), &mut tmp)?;
    if trace.manifest.samples.iter().all(|s| s.gen_len == 0) {
        return Err(Error::Source {
            path: trace.dir.join("manifest.json"),
            msg: "has no generated position to replay: a sensitivity over nothing measures nothing"
                .into(),
            hint: Some("evaluate on a trace with samples (`kquant trace capture`)".into()),
        });
    }
    let target_at = target_spec(a.target_checkpoint.as_deref(), prof.as_ref())?;
    let target = target_at.as_deref().map(Checkpoint::open).transpose()?;
    let ck = Checkpoint::open(&a.src)?;
    let det = ck.detect()?;
    let base = a
        .exclude
        .as_deref()
        .map(crate::quant::exclude::parse_patterns)
        .unwrap_or_default();

    // Every group quantized: the modules, their groups, and (calibrated methods) the codes,
    // chosen once on the original draft's inputs, which no variant changes.
    let request = Request {
        scheme: a.scheme.clone(),
        format: a.format,
        config: a.config.clone(),
        exclude: Some(base.join(",")),
        ..Default::default()
    };
    let recipe = quantize::resolve(&ck, &det, &a.src, &request)?;
    let plan = Plan::new(&ck, &recipe, false)?;
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
    let chosen = match (a.method, &a.cal.calibrate) {
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
            if a.trace.as_deref() == Some(t.as_path()) {
                eprintln!("warning: --calibrate is the evaluation --trace: the method is measured on the prompts it was fitted to, which flatters it");
            }
            let cal = Calibration {
                trace: t.clone(),
                target: target_at.clone(),
                steps: a.steps.steps,
                limit: None,
                memory: a.cal.calibration_memory,
            };
            let pb = super::progress_items(0, "calibrate", "positions");
            let (chosen, _) = calibrate::choose(&plan, &a.src, m, &cal, &|done, total| {
                pb.set_length(total);
                pb.set_position(done);
            })?;
            pb.finish_and_clear();
            chosen
        }
    };
    let (baseline, steps) = run_draft(
        &a.src,
        &trace,
        target.as_ref(),
        a.steps.steps,
        AfterMiss::Run,
        &Exec::F32,
    )?;
    let all_samples: Vec<_> = baseline.samples.iter().collect();
    let baseline_al = gate::micro_al(&all_samples);
    let bench = Bench {
        a: &a,
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

    let mut trials = Vec::new();
    let mut picked: Option<Measured> = None;
    if a.pick {
        if every.passed {
            picked = Some(every.clone());
        } else {
            let deltas: Vec<f64> = single.iter().map(|m| m.delta).collect();
            let cands = candidates(&groups, every.delta, &deltas);
            let mut tried = vec![false; cands.len()];
            let mut misses: Vec<(f64, f64)> = Vec::new();
            while trials.len() < a.max_trials {
                let Some(i) = next_trial(&cands, &tried, bias(&misses), a.gate.max_regression)
                else {
                    break;
                };
                tried[i] = true;
                let c = &cands[i];
                let names: Vec<&str> = c.exclude.iter().map(|&i| groups[i].name.as_str()).collect();
                eprintln!(
                    "sensitivity: pick [{}/{}] leave {} unquantized (predicted ΔAL {:+.3}, {:+.3} after the misses so far)",
                    trials.len() + 1,
                    a.max_trials,
                    names.join(", "),
                    c.predicted,
                    c.predicted + bias(&misses)
                );
                let m = bench.measure(&c.exclude)?;
                let pass = m.passed;
                misses.push((c.predicted, m.delta));
                trials.push((c.clone(), m.clone()));
                if pass {
                    picked = Some(m);
                    break;
                }
            }
        }
    }

    let exclude_of = |m: &Measured| -> Vec<String> {
        let mut p = base.clone();
        for name in &m.excluded {
            let g = groups.iter().find(|g| &g.name == name).expect("a group");
            p.extend(g.patterns.iter().cloned());
        }
        p
    };
    let method = serde_json::to_value(a.method).expect("method");
    let preset = picked.as_ref().map(|m| {
        let mut p = json!({
            "description": format!("{PRESET_MARK} on `{}` ({} samples): ΔAL {:+.4} [{:+.4}, {:+.4}] with --method {}, gate {}", a.src, trace.manifest.samples.len(), m.delta, m.ci95[0], m.ci95[1], method.as_str().unwrap_or(""), a.gate.max_regression),
            "family": [det.family.id()],
            "scheme": recipe.scheme(),
            "format": recipe.format(),
            "exclude": exclude_of(m),
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
    });
    let command = picked.as_ref().map(|m| {
        let mut c = format!(
            "kquant quantize {} -o OUT --scheme {} --format {} --exclude '{}'",
            a.src,
            recipe.scheme(),
            recipe.format().name(),
            exclude_of(m).join(",")
        );
        if let Some(t) = &a.cal.calibrate {
            c += &format!(
                " --method {} --calibrate {}",
                method.as_str().unwrap_or(""),
                t.display()
            );
        }
        c
    });
    let group_json: Vec<Value> = groups
        .iter()
        .zip(&single)
        .map(|(g, m)| {
            json!({"group": g.name, "modules": g.modules, "patterns": g.patterns, "bytes_before": g.bytes_before, "bytes_after": g.bytes_after, "measured": m})
        })
        .collect();
    let doc = json!({
        "schema": "kquant.sensitivity/1",
        "draft": a.src,
        "scheme": recipe.scheme(),
        "format": recipe.format().name(),
        "method": method,
        "calibration": a.cal.calibrate,
        "trace": a.trace.as_ref().map_or("live capture".to_string(), |t| t.display().to_string()),
        "samples": trace.manifest.samples.len(),
        "steps": steps,
        "exclude": base,
        "baseline_accept_length": baseline_al,
        "max_regression": a.gate.max_regression,
        "every_group": every,
        "groups": group_json,
        "pick": a.pick.then(|| json!({
            "trials": trials.iter().map(|(c, m)| json!({"predicted": c.predicted, "cost_bytes": c.cost, "measured": m})).collect::<Vec<_>>(),
            "picked": picked,
            "preset": preset,
            "command": command,
        })),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
    } else {
        print!("{}", table(&doc, &groups, &single, &every, baseline_al));
        if a.pick {
            match (&picked, &preset) {
                (Some(m), Some(p)) => {
                    println!(
                        "\npicked: leave {} unquantized: ΔAL {:+.4} [{:+.4}, {:+.4}], {} (of {} before)",
                        if m.excluded.is_empty() { "no further group".to_string() } else { m.excluded.join(", ") },
                        m.delta,
                        m.ci95[0],
                        m.ci95[1],
                        human_bytes(m.bytes_after),
                        human_bytes(plan.bytes_before())
                    );
                    println!("preset: {}", printable(&p.to_string()));
                    println!("command: {}", printable(command.as_deref().unwrap_or("")));
                    if !loads_anywhere(recipe.format(), recipe.scheme(), &det.family) {
                        eprintln!(
                            "warning: no serving engine loads --scheme {} --format {} as written (`kquant schemes`): the preset gates what kquant and Quark-compatible pipelines run; to gate what vLLM or SGLang serve, pass --format compressed-tensors",
                            recipe.scheme(),
                            recipe.format().name()
                        );
                    }
                }
                _ if trials.is_empty() => println!(
                    "\npicked: none: no exclusion set short of quantizing nothing is predicted (every group's ΔAL minus the excluded groups' own) to meet --max-regression {}",
                    a.gate.max_regression
                ),
                _ => println!(
                    "\npicked: none of the {} exclusion set(s) tried meets --max-regression {} (--max-trials tries more)",
                    trials.len(),
                    a.gate.max_regression
                ),
            }
        }
    }
    if let (Some(path), Some(p)) = (&a.write_preset, &preset) {
        // Never over a source: the draft, and the preset read.
        let sources: Vec<PathBuf> = std::iter::once(PathBuf::from(&a.src))
            .chain(a.config.as_ref().map(PathBuf::from).filter(|c| c.is_file()))
            .collect();
        output::write_file(
            path,
            PRESET,
            true,
            &sources,
            &serde_json::to_vec_pretty(p).expect("JSON"),
        )?;
    }
    Ok(if a.pick && picked.is_none() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The printed table: one row per group quantized alone, then every group together.
fn table(
    doc: &Value,
    groups: &[Group],
    single: &[Measured],
    every: &Measured,
    base: f64,
) -> String {
    let mut s = format!(
        "sensitivity of {} ({} {}, method {}), {} samples, baseline AL {:.3}\n",
        printable(doc["draft"].as_str().unwrap_or("")),
        doc["scheme"].as_str().unwrap_or(""),
        doc["format"].as_str().unwrap_or(""),
        doc["method"].as_str().unwrap_or(""),
        doc["samples"],
        base
    );
    s += &format!(
        "{:<18} {:>7} {:>10} {:>10} {:>8} {:>20} {:>9}\n",
        "quantize only", "modules", "size", "quantized", "ΔAL", "95% CI", "agree"
    );
    let row = |name: &str, m: &Measured, before: u64, after: u64| {
        format!(
            "{:<18} {:>7} {:>10} {:>10} {:>+8.4} {:>20} {:>9}\n",
            printable(name),
            m.quantized,
            human_bytes(before),
            human_bytes(after),
            m.delta,
            format!("[{:+.4}, {:+.4}]", m.ci95[0], m.ci95[1]),
            m.agreement.map_or("-".into(), |g| format!("{g:.4}"))
        )
    };
    for (g, m) in groups.iter().zip(single) {
        s += &row(&g.name, m, g.bytes_before, g.bytes_after);
    }
    let (b, q) = groups
        .iter()
        .fold((0, 0), |(b, q), g| (b + g.bytes_before, q + g.bytes_after));
    s += &row("every group", every, b, q);
    s
}

/// Whether any serving engine loads `scheme` written as `format` for a draft of `family`.
fn loads_anywhere(
    format: crate::quant::format::Format,
    scheme: crate::quant::registry::Scheme,
    family: &crate::checkpoint::detect::Family,
) -> bool {
    use crate::engines::{quantized, Engine, Loads};
    Engine::ALL.iter().any(|&e| {
        quantized::claim_for(format, scheme, e, family).is_some_and(|c| c.loads == Loads::Yes)
    })
}
