//! The verify report as types (`kquant.verify/1`): what offline and live verify fill, what
//! the JSON printer serializes and the table and JUnit writers read. The fields are in the
//! order the JSON document has its keys; a field skipped when `None` is a key some reports
//! do not have, a plain `Option` one that is `null` there.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

use crate::engines::Engine;
use crate::replay::AfterMiss;
use crate::verify::degenerate::Degenerate;
use crate::verify::gate::GateOn;
use crate::verify::prompt_sets::{SetFormat, TextMode};
use crate::verify::published::Check;
use crate::verify::synthetic::Synthetic;

/// The `schema` of a verify report.
pub const SCHEMA: &str = "kquant.verify/1";

/// A verify report: the gate's figures over every sample and per category, then what only
/// an offline or a live verify states ([`Tail`]).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    /// What the interval of the gated Δ can and cannot say about this verdict.
    pub interval_notes: Vec<String>,
    /// Which count each accept length is (docs/verify.md, "Which accept length").
    pub conventions: Conventions,
    #[serde(serialize_with = "gate_on_field")]
    pub gated_on: GateOn,
    pub steps: usize,
    pub samples: usize,
    pub draft: Stats,
    pub baseline: Option<Stats>,
    pub delta: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    /// The draft's and the baseline's proposals compared position by position,
    /// teacher-forced (null without a baseline that keeps them).
    pub agreement: Option<AgreementDoc>,
    pub max_regression: f64,
    pub min_accept: Option<f64>,
    pub passed: bool,
    pub reasons: Vec<String>,
    pub per_category: BTreeMap<String, Category>,
    /// Teacher-forced samples and a baseline: the paired all-positions Δ.
    #[serde(flatten)]
    pub all_positions: Option<AllPositions>,
    #[serde(flatten)]
    pub tail: Option<Tail>,
    /// The draft's measured per-position rates in the engines' synthetic-acceptance form
    /// (docs/verify.md, "Synthetic acceptance rates").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synthetic_acceptance: Option<Synthetic>,
    /// Figures that come from degenerate output (docs/verify.md, "Degenerate output").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degenerate: Option<Degenerate>,
}

fn gate_on_field<S: Serializer>(on: &GateOn, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(on.field())
}

/// The report's `conventions`: which count each accept length is.
#[derive(Debug, Clone, Serialize)]
pub struct Conventions {
    pub accept_length: &'static str,
    pub accept_length_engine: &'static str,
    pub accept_length_sglang_request: &'static str,
    pub accept_length_all_positions: &'static str,
}

/// The conventions every report states.
pub const CONVENTIONS: Conventions = Conventions {
    accept_length: "walked, gated by default: tokens committed per verify step, the bonus token counted, per token over the set (Σ committed / Σ verify steps)",
    accept_length_engine: "the engine's own count: also the drafts a request's final step accepted before the cut at max_tokens or EOS (vLLM's per-request metrics and Prometheus counters); null where a sample has no lookahead past its stop",
    accept_length_sglang_request: "SGLang's meta_info convention: completion tokens / verify steps, the prefill-sampled token counted once per request",
    accept_length_all_positions: "teacher-forced, not walked: 1 + the leading proposals equal to the target's greedy continuation, averaged over every root position (anchor) of the generated region, each block's proposals from one parallel pass; the offline figure DFlash cards quote (the Kimi-Linear drafter's 5.2106 on Math500); gated with --gate-on all-positions (delta_all_positions, ci95_all_positions)",
};

/// One drafter's figures over a set of samples.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub accept_length: f64,
    pub accept_length_engine: Option<f64>,
    pub accept_length_sglang_request: f64,
    /// Teacher-forced figures: `None` for a live measurement (no teacher-forced positions).
    pub accept_length_all_positions: Option<f64>,
    pub conditional_acceptance: Option<Vec<Option<f64>>>,
    /// Not measured when pass A skipped the depths after a miss (`--after-miss skip`).
    pub unconditional_acceptance: Option<Vec<f64>>,
    pub simulated_accept_length: Option<f64>,
    pub rounds: u64,
    pub name: String,
    /// Offline: each sample as an engine would report its request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<Vec<OfflineRequest>>,
}

/// The proposal agreement between the draft and the baseline.
#[derive(Debug, Clone, Serialize)]
pub struct AgreementDoc {
    pub per_depth: Vec<Option<f64>>,
    pub overall: Option<f64>,
    pub compared: Vec<u64>,
    pub agree: Vec<u64>,
}

/// One category's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Category {
    pub n: usize,
    pub draft: f64,
    pub baseline: Option<f64>,
    pub draft_engine: Option<f64>,
    pub baseline_engine: Option<f64>,
    pub delta: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    pub agreement: Option<AgreementDoc>,
    /// Teacher-forced samples (offline): the all-positions figures.
    #[serde(flatten)]
    pub all_positions: Option<CategoryAllPositions>,
}

/// A category's teacher-forced all-positions figures.
#[derive(Debug, Clone, Serialize)]
pub struct CategoryAllPositions {
    pub draft_all_positions: f64,
    pub baseline_all_positions: Option<f64>,
    pub delta_all_positions: Option<f64>,
    pub ci95_all_positions: Option<[f64; 2]>,
}

/// The paired all-positions Δ over every sample and its interval.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AllPositions {
    pub delta_all_positions: Option<f64>,
    pub ci95_all_positions: Option<[f64; 2]>,
}

/// What only an offline or only a live verify states, after the gate's figures.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Tail {
    Offline(Box<OfflineTail>),
    Live(Box<LiveTail>),
}

/// An offline verify's trace, work cap, warnings and near-ties.
#[derive(Debug, Clone, Serialize)]
pub struct OfflineTail {
    /// `--published`: the card's teacher-forced figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published: Option<Vec<Check>>,
    pub target: Option<String>,
    pub trace: String,
    /// The work cap, stated: what a figure over a capped trace stands for.
    pub limit_per_category: Option<usize>,
    pub samples_replayed: usize,
    pub after_miss: AfterMiss,
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub near_ties: Option<NearTies>,
    /// The trace's tap stream and the drafts' training streams (`verify::stream`).
    pub tap_stream: crate::verify::stream::StreamCheck,
}

/// A live verify's prompts and each deployment's run.
#[derive(Debug, Clone, Serialize)]
pub struct LiveTail {
    pub target: Option<String>,
    pub published: Option<Vec<Check>>,
    /// Always `null`: a live verify replays no trace.
    pub trace: Option<String>,
    pub limit_per_category: Option<usize>,
    pub samples_replayed: usize,
    pub live: Live,
}

/// One offline sample as an engine would report its request.
#[derive(Debug, Clone, Serialize)]
pub struct OfflineRequest {
    pub id: u64,
    pub category: String,
    pub steps: u64,
    pub committed: u64,
    pub accepted: Option<u64>,
    pub accept_length: f64,
    pub accept_length_engine: Option<f64>,
    pub tokens: usize,
    /// The prompt file's own id, where it is not the sample's number (`verify-join`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub near_tie_steps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps_range: Option<[u64; 2]>,
}

/// `verify --near-ties MARGIN`: the accept lengths as the range near-ties span.
#[derive(Debug, Clone, Serialize)]
pub struct NearTies {
    pub margin: f64,
    pub convention: &'static str,
    pub draft: TieSide,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<TieSide>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<[f64; 2]>,
}

/// One run's near-tie range.
#[derive(Debug, Clone, Serialize)]
pub struct TieSide {
    /// [every near-tie a miss, every helpful near-tie a match].
    pub accept_length: [f64; 2],
    pub requests_with_ties: usize,
    pub steps: u64,
}

/// What a live verify sent and each deployment answered.
#[derive(Debug, Clone, Serialize)]
pub struct Live {
    pub prompts: String,
    pub prompt_format: SetFormat,
    pub text_mode: TextMode,
    pub max_tokens: usize,
    pub concurrency: usize,
    pub convention: &'static str,
    pub draft: LiveSide,
    pub baseline: Option<LiveSide>,
    pub same_output: Option<SameOutput>,
    pub warnings: Vec<String>,
}

/// One deployment's run.
#[derive(Debug, Clone, Serialize)]
pub struct LiveSide {
    pub endpoint: String,
    pub engine: Engine,
    pub version: Option<String>,
    pub model: String,
    pub num_spec_tokens: Option<u64>,
    pub answered_by: Vec<String>,
    pub measured: usize,
    pub sources: Vec<String>,
    pub failed: Vec<Failed>,
    pub warnings: Vec<Finding>,
    pub retried: usize,
    pub requests: Vec<LiveRequest>,
}

/// A request that failed: never measured.
#[derive(Debug, Clone, Serialize)]
pub struct Failed {
    pub id: String,
    pub category: String,
    pub error: String,
    pub attempts: usize,
}

/// A preflight finding, as the report states it.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub msg: String,
    pub hint: String,
}

/// A measured request: what the engine reported for it.
#[derive(Debug, Clone, Serialize)]
pub struct LiveRequest {
    pub id: String,
    pub category: String,
    pub steps: u64,
    pub accepted: u64,
    pub accept_length_engine: f64,
    pub committed: u64,
    pub accept_length: f64,
    pub completion_tokens: u64,
    pub finish_reason: Option<String>,
    pub source: String,
    pub attempts: usize,
    pub token_ids: Option<Vec<u32>>,
    pub model: Option<String>,
}

/// The two deployments' greedy outputs compared.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SameOutput {
    pub compared: usize,
    pub equal: usize,
}

impl Report {
    /// The offline tail, where this is an offline report.
    pub fn offline(&self) -> Option<&OfflineTail> {
        match &self.tail {
            Some(Tail::Offline(o)) => Some(o),
            _ => None,
        }
    }

    /// The live tail, where this is a live report.
    pub fn live(&self) -> Option<&LiveTail> {
        match &self.tail {
            Some(Tail::Live(l)) => Some(l),
            _ => None,
        }
    }

    /// `--published`: the card figures held against the measurement.
    pub fn published(&self) -> &[Check] {
        let p = match &self.tail {
            Some(Tail::Offline(o)) => o.published.as_ref(),
            Some(Tail::Live(l)) => l.published.as_ref(),
            None => None,
        };
        p.map_or(&[], Vec::as_slice)
    }
}
