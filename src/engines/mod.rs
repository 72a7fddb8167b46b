//! Which serving engine (vLLM, SGLang, TensorRT-LLM) loads a checkpoint, and why: every such
//! claim kquant makes (`inspect`, `schemes`, the quantize warning, convert's model_type) comes
//! from the two tables here, one claim per row.
//!
//! - [`layout`]: unquantized drafts, by family × dialect × `model_type`;
//! - [`quantized`]: (format, scheme) results, whatever the layout;
//! - [`block`]: DSpark and DFlash2 drafts, by layout and the draft's own findings.
//!
//! vLLM and SGLang claims name the release the engine-loader tier (tests/engines/, each
//! engine's own loader on CPU) checked them with; the rest say `source-derived`.

pub mod block;
pub mod claim;
pub mod layout;
pub mod quantized;
pub mod target;

use serde::Serialize;
use serde_json::Value;

pub use claim::{Claim, Engine, Loads, Served};
use layout::ConfigFacts;

use crate::checkpoint::block::BlockDraft;
use crate::checkpoint::{Checkpoint, Detection, Family};
use crate::quant::identify::{self, Identified};
use crate::quant::registry::{Format, Scheme};

/// One engine's verdict on one checkpoint (an `engines` entry of `kquant inspect --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineSupport {
    pub engine: Engine,
    /// `yes`, `no`, or `depends` (not decidable from the files).
    pub loads: Loads,
    pub why: String,
    /// The release the claim was checked against, or `source-derived`.
    pub checked_with: String,
    /// A step the CPU loader tier could not run.
    pub unproven_on_cpu: Option<String>,
    /// Where the behaviour changed between releases.
    pub version_note: Option<String>,
    /// What a real server of the engine did with a draft like this one (the serving tier).
    pub served: Option<Served>,
    /// The one verdict on serving the draft: `loads` (its files) and whether the engine serves
    /// the draft's family beside its target (`beside_target`, [`with_target`]): `no` where
    /// either is no, `depends` where either depends (or only a build named there serves the
    /// pair), else `yes`.
    pub verdict: Loads,
    /// What the engine's source says stands in the way of serving the draft beside its target
    /// (`crate::engines::target::on_target`); `None` when nothing does or the target is unknown.
    pub beside_target: Option<target::OnTarget>,
}

impl EngineSupport {
    /// The basis printed after the claim (as [`Claim::basis`]).
    pub fn basis(&self) -> String {
        let mut basis = self.checked_with.clone();
        if let Some(u) = &self.unproven_on_cpu {
            basis.push_str(&format!("; unproven: {u}"));
        }
        if let Some(n) = &self.version_note {
            basis.push_str(&format!("; {n}"));
        }
        if let Some(s) = &self.served {
            basis.push_str(&format!("; {}", s.describe()));
        }
        basis
    }
}

impl From<&Claim> for EngineSupport {
    fn from(c: &Claim) -> EngineSupport {
        EngineSupport {
            engine: c.engine,
            loads: c.loads,
            why: c.why.into(),
            checked_with: c.checked_with.into(),
            unproven_on_cpu: c.unproven_on_cpu.map(String::from),
            version_note: c.version_note.map(String::from),
            served: c.served,
            verdict: c.loads,
            beside_target: None,
        }
    }
}

/// Fold what each engine's source says about serving the draft beside its target (`beside`,
/// from `crate::engines::target::of_draft`) into the engines' [`EngineSupport::verdict`], so that
/// `inspect` gives one verdict per engine.
pub fn with_target(engines: &mut [EngineSupport], beside: Option<&target::DraftTarget>) {
    let Some(b) = beside else {
        return;
    };
    for e in engines.iter_mut() {
        let Some(v) = b.serving.iter().find(|v| v.engine == e.engine) else {
            continue;
        };
        e.verdict = match (e.loads, v.serves) {
            (Loads::No, _) | (_, target::Serves::No) => Loads::No,
            _ => Loads::Depends,
        };
        e.beside_target = Some(v.clone());
    }
}

fn join(a: Option<&str>, b: Option<&str>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) if a != b => Some(format!("{a}; {b}")),
        (Some(x), _) | (None, Some(x)) => Some(x.into()),
        (None, None) => None,
    }
}

/// The quantization a checkpoint carries, from its `quantization_config` and ModelOpt's
/// `hf_quant_config.json` (`None`: not quantized by config).
pub fn quantization(ck: &Checkpoint) -> Option<Identified> {
    let qc = ck
        .config
        .as_ref()
        .and_then(|c| c.root.get("quantization_config"));
    let hf: Option<Value> = crate::io::text::read_regular(
        &ck.weights.dir.join("hf_quant_config.json"),
        crate::io::text::MAX_CONFIG,
        "hf_quant_config.json",
    )
    .ok()
    .and_then(|b| serde_json::from_slice(&b).ok());
    identify::identify(qc, hf.as_ref())
}

/// The claims for a detected checkpoint (empty for targets and unknown models): the layout's
/// claim; for a quantized checkpoint, a layout `no` stays `no` (its reason), a scheme `no` is
/// `no` (the scheme's reason), a layout `depends` stays `depends`, and otherwise the scheme's
/// claim holds (with the layout's notes).
pub fn support(ck: &Checkpoint, det: &Detection) -> Vec<EngineSupport> {
    if let Some(bd) = &det.block_draft {
        let scheme = match det
            .quantization
            .quantized
            .then(|| quantization(ck))
            .flatten()
        {
            Some(Identified::Scheme { format, scheme }) => Some((format, scheme)),
            _ => None,
        };
        // SGLang builds `fc` (and DFlash2's kernel projections) plain: quantized, they do not load.
        let sglang_plain = det
            .quantization
            .quantized
            .then(|| block::sglang_plain_quantized(ck.weights.infos()))
            .flatten();
        // vLLM's ignore entries miss its renumbered draft layers (Quark, compressed-tensors).
        let vllm_float_layer = scheme
            .filter(|(f, _)| matches!(f, Format::Quark | Format::CompressedTensors))
            .and_then(|_| block::unquantized_layer_linear(ck.weights.infos()));
        let plain = Plain {
            sglang: sglang_plain,
            vllm: vllm_float_layer,
        };
        return block_support(bd, &det.family, det.quantization.quantized, scheme, plain);
    }
    let facts = ConfigFacts {
        model_type: ck.config.as_ref().and_then(|c| c.model_type()),
        speculators: ck
            .config
            .as_ref()
            .is_some_and(|c| c.root.contains_key("speculators_model_type")),
    };
    let quant = if det.quantization.quantized {
        Some(quantization(ck).unwrap_or_else(|| Identified::Other {
            format: None,
            what: "quantized tensors without a quantization_config".into(),
        }))
    } else {
        None
    };
    let eagle3 = matches!(det.family, Family::Eagle3 | Family::Eagle3Mla);
    let mut out = Vec::new();
    for engine in Engine::ALL {
        let Some(l) = layout::claim(&det.family, det.dialect, facts, engine) else {
            continue;
        };
        let mut s = EngineSupport::from(l);
        if l.loads == Loads::Yes && eagle3 && !det.dims.has_lm_head {
            if let Some(h) = layout::without_lm_head(engine) {
                s.loads = h.loads;
                s.why = format!("{}; {}", l.why, h.why);
                s.checked_with = h.checked_with.into();
            }
        }
        match &quant {
            None => {}
            Some(_) if l.loads == Loads::No => {}
            Some(Identified::Scheme { format, scheme }) => {
                // A server ran the layout unquantized; what it does with these codes is the
                // scheme row's (none where the tier did not serve it).
                s.served = None;
                match quantized::claim_for(*format, *scheme, engine, &det.family) {
                    Some(q) if q.loads == Loads::No => s = EngineSupport::from(q),
                    Some(q) if s.loads == Loads::Depends => s.served = q.served,
                    Some(q) => s = with_scheme(s, q),
                    None => {
                        s.loads = Loads::Depends;
                        s.why = format!(
                            "{} {scheme}: kquant has no {} claim for it",
                            format.name(),
                            engine.name()
                        );
                    }
                }
            }
            Some(Identified::Other { what, .. }) => {
                s.loads = Loads::Depends;
                s.served = None;
                s.why = format!(
                    "quantized ({what}): not a scheme kquant has claims for; layout: {}",
                    s.why
                );
            }
        }
        s.verdict = s.loads;
        out.push(s);
    }
    out
}

/// A layout's claim `s` that loads, with the quantization's claim `q` on top: `q`'s verdict and
/// reason, the layout's after it, both releases where they differ, both unproven steps.
fn with_scheme(s: EngineSupport, q: &Claim) -> EngineSupport {
    EngineSupport {
        engine: s.engine,
        loads: q.loads,
        why: format!("{}; layout: {}", q.why, s.why),
        checked_with: if q.checked_with == s.checked_with {
            s.checked_with
        } else {
            format!(
                "{} (layout), {} (quantization)",
                s.checked_with, q.checked_with
            )
        },
        unproven_on_cpu: join(s.unproven_on_cpu.as_deref(), q.unproven_on_cpu),
        version_note: join(s.version_note.as_deref(), q.version_note),
        served: q.served,
        verdict: q.loads,
        beside_target: None,
    }
}

/// A quantized DSpark / DFlash2 draft's modules an engine cannot take as quantized (SGLang:
/// `fc`, DFlash2's `kernel_projection`) or as float (vLLM: a decoder-layer linear in Quark or
/// compressed-tensors).
struct Plain {
    sglang: Option<String>,
    vllm: Option<String>,
}

impl Plain {
    /// `engine`'s refusal, with the module it names.
    fn refusal(&self, engine: Engine) -> Option<String> {
        match engine {
            Engine::Sglang => self
                .sglang
                .as_deref()
                .map(|m| format!("`{m}` is quantized: {}", block::SGLANG_PLAIN_QUANTIZED)),
            Engine::Vllm => self
                .vllm
                .as_deref()
                .map(|m| format!("`{m}` is not quantized: {}", block::VLLM_LAYER_UNQUANTIZED)),
            Engine::Trtllm => None,
        }
    }
}

/// The engines' claims on a DSpark or DFlash2 draft: the layout's claim, a `no` with the
/// finding's words where the draft's description names one for the engine; for a quantized
/// draft, the scheme's claim for the family where the layout loads (the engine-loader tier ran
/// every scheme × format of both trained fixtures) — `no` where [`Plain`] names a module the
/// engine cannot take — else `depends` (a layout kquant has no
/// definite claim for, or a quantization it does not know).
fn block_support(
    bd: &BlockDraft,
    family: &Family,
    quantized: bool,
    scheme: Option<(Format, Scheme)>,
    plain: Plain,
) -> Vec<EngineSupport> {
    Engine::ALL
        .iter()
        .map(|&e| {
            let c = block::claim(bd.layout, e);
            let mut s = EngineSupport::from(&c);
            // The scheme's claim for the family (the loader tier ran these drafts quantized);
            // a scheme the engine does not load is not loaded here either.
            let scheme_claim = scheme.and_then(|(f, sc)| quantized::claim_for(f, sc, e, family));
            let scheme_no = scheme_claim.filter(|q| q.loads == Loads::No);
            let refusal = match e {
                Engine::Vllm => bd.vllm_refuses(),
                Engine::Sglang => bd.sglang_refuses(),
                Engine::Trtllm => None,
            };
            if let (Some(p), true) = (refusal, c.loads != Loads::No) {
                s.loads = Loads::No;
                s.why = format!("{}; layout: {}", p.what, c.why);
                s.unproven_on_cpu = None;
            } else if let (Some(q), true) = (scheme_no, c.loads != Loads::No) {
                s = EngineSupport::from(q);
            } else if let (Some(what), Loads::Yes) = (plain.refusal(e), c.loads) {
                s.loads = Loads::No;
                s.why = format!("{what}; layout: {}", c.why);
                s.unproven_on_cpu = None;
            } else if let (Some(q), Loads::Yes) = (scheme_claim, c.loads) {
                s = with_scheme(s, q);
            } else if quantized && c.loads != Loads::No {
                s.loads = Loads::Depends;
                s.why = format!(
                    "quantized: kquant has no claim for this quantization of {} drafts; layout: {}",
                    bd.layout.family_name(),
                    c.why
                );
            }
            s.verdict = s.loads;
            s
        })
        .collect()
}

/// `engine`'s refusal of a quantized draft, as [`support`] (and so `inspect`) gives it for the
/// quantization alone: the scheme's `no` row for the draft's family. `convert` writes the
/// engine's own layout, so the source's layout rows do not apply to the result; its quantization
/// is carried over as is. `None` for an unquantized draft, a scheme the engine loads (or kquant
/// has no claim for), or a quantization kquant does not know.
pub fn refuses_quantization(
    ck: &Checkpoint,
    det: &Detection,
    engine: Engine,
) -> Option<(Format, Scheme, &'static Claim)> {
    if !det.quantization.quantized {
        return None;
    }
    let Some(Identified::Scheme { format, scheme }) = quantization(ck) else {
        return None;
    };
    quantized::claim_for(format, scheme, engine, &det.family)
        .filter(|c| c.loads == Loads::No)
        .map(|c| (format, scheme, c))
}

/// What `engine` loads instead of `format`/`scheme` for a `family` draft, as command-line
/// flags: the formats it loads `scheme` in (`--format F`), else every (format, scheme) it loads
/// on a GPU (`--format F --scheme S`); `None` when it loads no quantized draft of the family.
pub fn loads_instead(engine: Engine, family: &Family, scheme: Scheme) -> Option<String> {
    let loads = |f: Format, s: Scheme| {
        quantized::claim_for(f, s, engine, family)
            .is_some_and(|c| c.loads == Loads::Yes && !c.cpu_only)
    };
    let mut pairs: Vec<(Format, Scheme)> = Vec::new();
    for r in quantized::rows() {
        if !pairs.contains(&(r.format, r.scheme)) && loads(r.format, r.scheme) {
            pairs.push((r.format, r.scheme));
        }
    }
    let same: Vec<String> = pairs
        .iter()
        .filter(|(_, s)| *s == scheme)
        .map(|(f, _)| format!("--format {}", f.name()))
        .collect();
    if !same.is_empty() {
        return Some(format!("{} (--scheme {scheme})", same.join(" or ")));
    }
    // One entry per format, its schemes as alternatives: `--format F --scheme A|B`.
    let mut by_format: Vec<(Format, Vec<String>)> = Vec::new();
    for (f, s) in &pairs {
        match by_format.iter_mut().find(|(g, _)| g == f) {
            Some((_, v)) => v.push(s.to_string()),
            None => by_format.push((*f, vec![s.to_string()])),
        }
    }
    let all: Vec<String> = by_format
        .iter()
        .map(|(f, v)| format!("--format {} --scheme {}", f.name(), v.join("|")))
        .collect();
    (!all.is_empty()).then(|| all.join(", or "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::registry::Scheme::{Fp8Pc, Int4Pc};

    /// The formats an engine loads instead of one it refuses: the same scheme in another format
    /// where it has one, else every (format, scheme) it loads on a GPU, grouped by format.
    #[test]
    fn what_an_engine_loads_instead() {
        let e3 = Family::Eagle3;
        assert_eq!(
            loads_instead(Engine::Vllm, &e3, Int4Pc).as_deref(),
            Some("--format compressed-tensors (--scheme int4-pc)")
        );
        assert_eq!(
            loads_instead(Engine::Trtllm, &e3, Int4Pc).as_deref(),
            Some("--format modelopt --scheme int4-g128|fp8-pc|nvfp4|fp8-pt")
        );
        assert_eq!(
            loads_instead(Engine::Trtllm, &e3, Fp8Pc).as_deref(),
            Some("--format modelopt (--scheme fp8-pc)")
        );
        // TensorRT-LLM's DFlash drafter reads no quantized weights.
        assert_eq!(loads_instead(Engine::Trtllm, &Family::Dflash, Int4Pc), None);
    }
}
