//! The quantize plan: what happens to every source tensor (quantized, or copied and why), the
//! shape checks, the pre-pass for the statistics a scheme needs, the codec built from them, the
//! output tensors and sizes, and the unquantized-module list as the format writes it. Nothing
//! is written; `--dry-run` renders this ([`Plan::to_json`], or `cli::quantize`'s table).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde_json::{json, Value};

use super::Recipe;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::io::writer::TensorSpec;
use crate::io::TensorInfo;
use crate::quant::codec::{first_non_finite_par, Codec};
use crate::quant::exclude::{excluded_by, module_of, not_candidate};
use crate::quant::format::Format;
use crate::quant::fused;
use crate::quant::math::rowwise;
use crate::quant::registry::Scheme;
use crate::quant::stats::{Needs, Stats};

/// What happens to one source tensor.
#[derive(Debug, Clone)]
pub enum Action {
    Quantize {
        module: String,
        rows: usize,
        cols: usize,
    },
    Copy {
        reason: String,
    },
}

/// One source tensor in the plan.
#[derive(Debug)]
pub struct Row<'a> {
    pub tensor: &'a TensorInfo,
    pub action: Action,
    /// The output tensors it becomes, in the codec's order (itself, when copied).
    pub outputs: Vec<TensorSpec>,
}

impl Row<'_> {
    pub fn quantized(&self) -> bool {
        matches!(self.action, Action::Quantize { .. })
    }
    /// Bytes of its output tensors.
    pub fn bytes_after(&self) -> u64 {
        self.outputs.iter().map(TensorSpec::nbytes).sum()
    }
}

/// The whole plan.
pub struct Plan<'a> {
    pub ck: &'a Checkpoint,
    pub recipe: &'a Recipe,
    /// Every source tensor, in the source's order.
    pub rows: Vec<Row<'a>>,
    pub codec: Box<dyn Codec>,
    /// The unquantized-module list exactly as the format writes it.
    pub unquantized: Vec<String>,
    /// Codes and scales a calibrated method chose (`quantize::calibrate`), by module; the
    /// writer writes these through the codec's integer grid instead of encoding the weight.
    pub chosen: BTreeMap<String, crate::quant::math::int4::Int4>,
    /// What chose them (`config.json` key `kquant_quantization`: the method and the
    /// calibration trace's digest); `None` for round to nearest.
    pub record: Option<Value>,
}

impl<'a> Plan<'a> {
    /// Plan `ck` under `recipe`. Refuses a tensor the choice cannot write before reading any
    /// weight; then, for a scheme that needs statistics, runs the pre-pass (which reads every
    /// quantized weight, except on `dry_run`) and builds the codec from them.
    pub fn new(ck: &'a Checkpoint, recipe: &'a Recipe, dry_run: bool) -> Result<Plan<'a>> {
        let mut actions: Vec<(&TensorInfo, Action)> = Vec::new();
        for t in ck.weights.infos() {
            let module = module_of(&t.name).to_string();
            let why = recipe.kept(&t.name).or_else(|| not_candidate(t));
            let action = match (why, excluded_by(&recipe.patterns, &module)) {
                (Some(why), Some(p)) => Action::Copy {
                    reason: format!("{why}; matches `{p}`"),
                },
                (Some(why), None) => Action::Copy { reason: why.into() },
                (None, Some(p)) => Action::Copy {
                    reason: format!("excluded by `{p}`"),
                },
                (None, None) if t.shape.contains(&0) => Action::Copy {
                    reason: "empty".into(),
                },
                (None, None) => Action::Quantize {
                    module,
                    rows: t.shape[0],
                    cols: t.shape[1],
                },
            };
            actions.push((t, action));
        }
        check_shapes(ck, &actions, recipe)?;
        let stats = match recipe.choice.scheme.needs {
            Needs::Nothing => Stats::default(),
            Needs::Modules => Stats {
                quantized: quantized_modules(&actions),
                ..Stats::default()
            },
            Needs::FusedWeightAmax => prepass(ck, &actions, recipe.scheme(), dry_run)?,
        };
        let codec = recipe.choice.build(&stats)?;

        // The config lists the concrete module names the format lists, then (Quark and
        // compressed-tensors) their engine patterns, or (ModelOpt) TensorRT-LLM's names.
        let quantized: HashSet<&str> = actions
            .iter()
            .filter(|(_, a)| matches!(a, Action::Quantize { .. }))
            .map(|(t, _)| t.name.as_str())
            .collect();
        let mut file_order: Vec<&TensorInfo> = ck.weights.infos().collect();
        file_order.sort_by_key(|t| (t.start, t.name.clone()));
        let modules = recipe.format().unquantized_modules(
            recipe.choice.quark.layout,
            &file_order,
            &recipe.patterns,
            &|t| quantized.contains(t.name.as_str()),
        );
        let unquantized = if codec.lists_every_weight() {
            let weights: Vec<(String, usize)> = file_order
                .iter()
                .map(|t| (t.name.clone(), t.shape.len()))
                .collect();
            let q: Vec<String> = quantized.iter().map(|n| module_of(n).to_string()).collect();
            crate::quant::modelopt::drafter::drafter_exclude_modules(&weights, &q)
        } else {
            recipe.format().written_list(&modules)
        };

        let rows = actions
            .into_iter()
            .map(|(t, action)| {
                let outputs = match &action {
                    Action::Copy { .. } => {
                        vec![TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone())]
                    }
                    Action::Quantize { module, rows, cols } => {
                        codec.specs(module, *rows, *cols, t.dtype)
                    }
                };
                Row {
                    tensor: t,
                    action,
                    outputs,
                }
            })
            .collect();
        Ok(Plan {
            ck,
            recipe,
            rows,
            codec,
            unquantized,
            chosen: BTreeMap::new(),
            record: None,
        })
    }

    /// Source tensor bytes.
    pub fn bytes_before(&self) -> u64 {
        self.rows.iter().map(|r| r.tensor.nbytes()).sum()
    }
    /// Output tensor bytes.
    pub fn bytes_after(&self) -> u64 {
        self.rows.iter().map(Row::bytes_after).sum()
    }
    /// How many tensors are quantized.
    pub fn quantized(&self) -> usize {
        self.rows.iter().filter(|r| r.quantized()).count()
    }
    /// Every output tensor, in plan order.
    pub fn specs(&self) -> Vec<TensorSpec> {
        self.rows.iter().flat_map(|r| r.outputs.clone()).collect()
    }

    /// The `--dry-run --json` document (`kquant.quantize-plan/1`).
    pub fn to_json(&self) -> Value {
        let scheme = self.recipe.scheme();
        json!({
            "schema": "kquant.quantize-plan/1",
            "scheme": scheme, "format": self.recipe.format().name(),
            "tensors": self.rows.iter().map(|r| {
                let t = r.tensor;
                match &r.action {
                    Action::Quantize { .. } => json!({"name": t.name, "action": "quantize", "scheme": scheme, "bytes_before": t.nbytes(), "bytes_after": r.bytes_after()}),
                    Action::Copy { reason } => json!({"name": t.name, "action": "excluded", "reason": reason, "bytes_before": t.nbytes(), "bytes_after": t.nbytes()}),
                }
            }).collect::<Vec<_>>(),
            "exclude": self.unquantized, "bytes_before": self.bytes_before(), "bytes_after": self.bytes_after(),
        })
    }
}

/// Refuse the tensors the choice cannot write (group size, ModelOpt's odd output rows) before
/// anything is read or written: every one at once, named with its shape and why, and a hint
/// that can be followed (the modules to exclude, and the schemes this format writes that have
/// no such constraint).
fn check_shapes(ck: &Checkpoint, actions: &[(&TensorInfo, Action)], recipe: &Recipe) -> Result<()> {
    let bad: Vec<(&TensorInfo, &String, String)> = actions
        .iter()
        .filter_map(|(t, act)| match act {
            Action::Quantize { module, rows, cols } => recipe
                .choice
                .refuse_shape(*rows, *cols)
                .map(|why| (*t, module, why)),
            Action::Copy { .. } => None,
        })
        .collect();
    let Some((first, _, _)) = bad.first() else {
        return Ok(());
    };
    let path = ck
        .weights
        .shard_of(&first.name)
        .map(|sh| sh.path().to_path_buf())
        .unwrap_or_else(|| ck.weights.dir.clone());
    // The codec describes itself; the shape checks run before it exists (a codec that needs
    // statistics is built after the pre-pass), so build one without.
    let describe = recipe
        .choice
        .build(&Stats::default())
        .map(|c| c.describe())
        .unwrap_or_default();
    let list = bad
        .iter()
        .map(|(t, _, why)| {
            format!(
                "`{}` {:?}: {why}",
                crate::escape::printable(&t.name),
                t.shape
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let mut modules: Vec<&str> = bad.iter().map(|(_, m, _)| m.as_str()).collect();
    modules.dedup();
    // Schemes this format writes whose constraints every offending shape meets.
    let format = recipe.format();
    let fits: Vec<&str> = crate::quant::registry::SCHEMES
        .iter()
        .filter(|s| s.id != recipe.scheme())
        .filter(|s| {
            s.carriers
                .iter()
                .any(|c| c.format == format && c.implemented())
        })
        .filter(|s| {
            bad.iter().all(|(t, _, _)| {
                let (rows, cols) = (t.shape[0], t.shape[t.shape.len() - 1]);
                s.group.is_none_or(|g| cols.is_multiple_of(g))
                    && s.carriers
                        .iter()
                        .filter(|c| c.format == format)
                        .all(|c| !c.even_rows || rows.is_multiple_of(2))
            })
        })
        .map(|s| s.id.id())
        .collect();
    let other = if fits.is_empty() {
        format!(
            "no other scheme --format {} writes takes these shapes",
            format.name()
        )
    } else {
        format!(
            "or a scheme --format {} writes that takes these shapes: {}",
            format.name(),
            fits.join(", ")
        )
    };
    Err(Error::Source {
        path,
        msg: format!(
            "{} tensor(s) cannot be written as --scheme {} ({describe}): {list}",
            bad.len(),
            recipe.scheme()
        ),
        hint: Some(format!(
            "keep them unquantized with --exclude {} (the patterns already excluded, and these modules); {other}",
            recipe
                .patterns
                .iter()
                .map(String::as_str)
                .chain(modules.iter().copied())
                .collect::<Vec<_>>()
                .join(",")
        )),
    })
}

/// The pre-pass of a scheme whose per-tensor scale fused siblings share: refuse a fused family
/// (q/k/v, gate/up, …) that is only partly quantized (the engines load it as one Linear with
/// one scale, and the reference tools refuse it too), then read each quantized weight once for
/// its amax (not on `--dry-run`).
/// The modules the plan quantizes, in file order.
fn quantized_modules(actions: &[(&TensorInfo, Action)]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|(_, act)| match act {
            Action::Quantize { module, .. } => Some(module.clone()),
            Action::Copy { .. } => None,
        })
        .collect()
}

fn prepass(
    ck: &Checkpoint,
    actions: &[(&TensorInfo, Action)],
    scheme: Scheme,
    dry_run: bool,
) -> Result<Stats> {
    let candidates: Vec<&str> = actions
        .iter()
        .filter(|(t, _)| not_candidate(t).is_none())
        .map(|(t, _)| module_of(&t.name))
        .collect();
    let quantized = quantized_modules(actions);
    let qset: HashSet<&str> = quantized.iter().map(String::as_str).collect();
    let families = fused::families(candidates);
    if let Some((q, rest)) = fused::partial(&families, &qset) {
        return Err(Error::Flags {
            msg: format!(
                "--scheme {scheme} quantizes {} but not its fused sibling(s) {}: engines load them as one Linear with one per-tensor scale",
                q.join(", "),
                rest.join(", ")
            ),
            hint: format!(
                "exclude all of {} or none of them",
                q.iter().chain(&rest).copied().collect::<Vec<_>>().join(", ")
            ),
        });
    }
    let families: Vec<Vec<String>> = families
        .into_iter()
        .filter(|f| qset.contains(f[0].as_str()))
        .collect();
    let weight_amax = if dry_run {
        None
    } else {
        let mut m = BTreeMap::new();
        for (t, act) in actions {
            if let Action::Quantize { module, cols, .. } = act {
                let shard = ck.weights.shard_of(&t.name).expect("routed");
                let wf = shard.view(t).to_f32_par();
                shard.release(t);
                if let Some(i) = first_non_finite_par(&wf) {
                    return Err(non_finite(shard.path(), &t.name, i, *cols, wf[i]));
                }
                m.insert(module.clone(), rowwise::amax(&wf));
            }
        }
        Some(m)
    };
    Ok(Stats {
        quantized,
        families,
        weight_amax,
    })
}

/// The refusal of a non-finite weight: flat index `i` of a `[_, cols]` tensor, value `v`.
pub(crate) fn non_finite(path: &Path, name: &str, i: usize, cols: usize, v: f32) -> Error {
    Error::Tensor {
        path: path.into(),
        tensor: name.into(),
        msg: format!(
            "row {} column {} is {v} — refusing to quantize non-finite weights",
            i / cols,
            i % cols,
        ),
        hint: Some(format!(
            "NaN or infinite weights come from a diverged or corrupted checkpoint: re-export `{name}` from a good training step (kquant quantizes only finite weights)"
        )),
    }
}

/// The warning for a DSpark plan that quantizes the Markov projection (an explicit `--exclude`
/// without it): what vLLM 0.33 does with it in each format.
pub fn markov_w2_warning(plan: &Plan) -> Option<String> {
    const NAME: &str = "markov_head.markov_w2.weight";
    if !plan
        .rows
        .iter()
        .any(|r| r.tensor.name == NAME && r.quantized())
    {
        return None;
    }
    let (format, scheme) = (plan.recipe.format(), plan.recipe.scheme());
    let head = "`markov_head.markov_w2` (DSpark's Markov projection, vLLM's `ParallelLMHead`) is quantized";
    Some(match format {
        Format::Quark => format!(
            "{head}: vLLM's Quark config quantizes no `ParallelLMHead`, so it builds it unquantized and cannot load these tensors; add `markov_head.markov_w2` to --exclude"
        ),
        Format::Modelopt if scheme == Scheme::Nvfp4A16 => return None,
        _ => format!(
            "{head}: vLLM loads it, but a launch with `dspark_draft_topk` raises (`apply_bias_gathered` reads it unquantized unless ModelOpt nvfp4-a16); add `markov_head.markov_w2` to --exclude to keep that option"
        ),
    })
}
