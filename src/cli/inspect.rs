//! `kquant inspect SRC [--json] [--tensors]`: header-only summary of a checkpoint.

use std::process::ExitCode;

use serde_json::{json, Value};

use crate::checkpoint::block::BlockDraft;
use crate::checkpoint::quant_state::QuantState;
use crate::checkpoint::{Checkpoint, Detection, Dims};
use crate::cli::print_json;
use crate::cli::{human_bytes, human_count};
use crate::engines::{self, EngineSupport};
use crate::error::Result;
use crate::escape::printable;
use crate::io::source::Origin;
use crate::quant::identify::Identified;
use crate::quant::order_check::OrderCheck;

/// Arguments of `kquant inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A checkpoint directory, a `.safetensors` file, or a hub id `org/name[@revision]`.
    pub src: String,
    /// Print the stable JSON document (docs/inspect.md) on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Also list every tensor (name, dtype, shape, bytes).
    #[arg(long)]
    pub tensors: bool,
    /// The unquantized checkpoint SRC was made from: re-quantizes a few rows of each Quark
    /// INT4 module to find the nibble order the data really uses (Quark's file-to-file export
    /// writes sequential nibbles under a config that says `reorder`).
    #[arg(long)]
    pub source: Option<String>,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let ck = Checkpoint::open(&a.src)?;
    let det = ck.detect()?;
    let mut engines = engines::support(&ck, &det);
    let beside = engines::target::of_draft(&ck, &det, &crate::target::profile::builtin_or_empty());
    engines::with_target(&mut engines, beside.as_ref());
    let drafting = engines::target::of_target(&ck, &det);
    let scheme = det
        .quantization
        .quantized
        .then(|| engines::quantization(&ck))
        .flatten();
    let order = match &a.source {
        Some(s) => Some(crate::quant::order_check::check(
            &ck,
            &Checkpoint::open(s)?,
        )?),
        None => None,
    };
    if a.json {
        let mut doc = to_json(&a.src, &ck, &det, &engines, scheme.as_ref());
        doc["draft_target"] = serde_json::to_value(&beside).expect("JSON");
        if !drafting.is_empty() {
            doc["drafting"] = serde_json::to_value(drafting).expect("JSON");
        }
        if let Some(o) = &order {
            doc["pack_order_check"] = serde_json::to_value(o).expect("JSON");
        }
        print_json(&doc);
    } else {
        print_human(&a.src, &ck, &det, &engines, scheme.as_ref(), a.tensors);
        if let Some(b) = &beside {
            print_beside(b);
        }
        print_drafting(drafting);
        if let Some(o) = &order {
            print_pack_order(o);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `pack order` row of `--source`: whether the data uses the nibble order the config says.
fn print_pack_order(o: &[OrderCheck]) {
    let bad: Vec<&str> = o
        .iter()
        .filter(|c| c.mismatch())
        .map(|c| c.module.as_str())
        .collect();
    if o.is_empty() {
        println!(
            "{:<12}no Quark per-channel INT4 module to compare with the source",
            "pack order"
        );
    } else if bad.is_empty() {
        println!(
            "{:<12}data matches the config's pack_method in all {} modules",
            "pack order",
            o.len()
        );
    } else {
        let c = &o.iter().find(|c| c.mismatch()).unwrap();
        println!(
            "{:<12}MISMATCH in {} of {} modules: config says `{}` but the data is `{}` (Quark file-to-file export); readers that trust the config decode wrong weights: {}",
            "pack order", bad.len(), o.len(), c.config_says, c.data_is, printable(&bad.join(", "))
        );
    }
}

fn source_json(spec: &str, ck: &Checkpoint) -> Value {
    let (kind, extra) = match &ck.weights.origin {
        Origin::Dir(_) => ("directory", Value::Null),
        Origin::File(_) => ("file", Value::Null),
        Origin::Hub { id, snapshot } => (
            "hub",
            json!({"repo": id.repo, "revision": id.revision, "snapshot": snapshot}),
        ),
    };
    json!({
        "spec": spec,
        "kind": kind,
        "hub": extra,
        "dir": ck.weights.dir,
        "config": ck.weights.config_path,
        "index": ck.weights.index_path,
        "files": ck.weights.shards.iter().map(|s| json!({"path": s.path(), "bytes": s.file_len(), "tensors": s.tensors().len()})).collect::<Vec<_>>(),
    })
}

/// `quantization.scheme` of the `--json` document: the registry's (format, scheme), or what
/// the config describes instead.
fn scheme_json(id: Option<&Identified>) -> Value {
    match id {
        None => Value::Null,
        Some(Identified::Scheme { format, scheme }) => {
            json!({"format": format.name(), "scheme": scheme, "other": null})
        }
        Some(Identified::Other { format, what }) => {
            json!({"format": format.map(|f| f.name()), "scheme": null, "other": what})
        }
    }
}

/// The `--json` document (schema `kquant.inspect/1`, documented in docs/inspect.md).
pub fn to_json(
    spec: &str,
    ck: &Checkpoint,
    det: &Detection,
    engines: &[EngineSupport],
    scheme: Option<&Identified>,
) -> Value {
    let (by, all) = ck.totals();
    let mut quantization = serde_json::to_value(&det.quantization).expect("JSON");
    quantization["scheme"] = scheme_json(scheme);
    json!({
        "schema": "kquant.inspect/1",
        "source": source_json(spec, ck),
        "family": det.family.id(),
        "target_kind": det.target_kind.map(|t| t.id()),
        "reason": det.reason,
        "dialect": det.dialect.map(|d| d.id()),
        "layer_prefix": det.layer_prefix,
        "architectures": ck.config.as_ref().map(|c| c.architectures()),
        "model_type": ck.config.as_ref().and_then(|c| c.model_type()),
        "dims": det.dims,
        "aux_layers": det.aux_layers,
        "block_draft": det.block_draft,
        "quantization": quantization,
        "engines": engines,
        "notes": det.notes,
        "parameters": all.params,
        "bytes": all.bytes,
        "dtypes": by.iter().map(|(k, t)| (k.clone(), json!({"tensors": t.tensors, "parameters": t.params, "bytes": t.bytes}))).collect::<serde_json::Map<_, _>>(),
        "tensors": ck.weights.infos().map(|t| json!({"name": t.name, "dtype": t.dtype.name(), "shape": t.shape, "bytes": t.nbytes()})).collect::<Vec<_>>(),
    })
}

/// One row of the summary: the key in 12 columns, then the value. Every value may quote the
/// config or tensor names: escaped, so a name cannot write to the terminal (crate::escape).
fn row(k: &str, v: String) {
    println!("{k:<12}{}", printable(&v));
}

/// The human summary, section by section.
fn print_human(
    spec: &str,
    ck: &Checkpoint,
    det: &Detection,
    engines: &[EngineSupport],
    scheme: Option<&Identified>,
    tensors: bool,
) {
    print_source(spec, ck);
    print_family(det);
    print_engines(engines);
    print_dims(&det.dims);
    print_aux_layers(det);
    if let Some(b) = &det.block_draft {
        print_block_draft(b);
    }
    print_params(ck);
    row("quant", quant_summary(&det.quantization, scheme));
    for n in &det.notes {
        row("note", n.clone());
    }
    if tensors {
        print_tensors(ck);
    }
}

/// `source`: the spec, where it was found and its number of files.
fn print_source(spec: &str, ck: &Checkpoint) {
    let files = ck.weights.shards.len();
    let kind = match &ck.weights.origin {
        Origin::Dir(_) => "directory",
        Origin::File(_) => "file",
        Origin::Hub { .. } => "hub cache",
    };
    row(
        "source",
        format!(
            "{spec} ({kind}, {files} safetensors file{})",
            if files == 1 { "" } else { "s" }
        ),
    );
}

/// `family` (with its target kind and the reason), `dialect` (with its layer prefix).
fn print_family(det: &Detection) {
    let fam = match (det.family.id(), det.target_kind) {
        (f, Some(t)) => format!("{f} ({})", t.id()),
        (f, None) => f.to_string(),
    };
    row("family", fam);
    row("", format!("because {}", det.reason));
    if let Some(d) = det.dialect {
        let p = det
            .layer_prefix
            .as_deref()
            .map(|p| format!(" (`{p}*`)"))
            .unwrap_or_default();
        row("dialect", format!("{}{p}", d.id()));
    }
}

/// `engines`: one row per engine, its one verdict: the claim on the draft's files, and where
/// the engine cannot serve the draft beside its target (or only from a build), that first.
fn print_engines(engines: &[EngineSupport]) {
    for (i, e) in engines.iter().enumerate() {
        let basis = e.basis();
        let what = match &e.beside_target {
            None => format!("{} [{basis}]", e.why),
            Some(v) => format!(
                "{}: {} [{}]; the files: {} ({}) [{basis}]",
                match v.serves {
                    engines::target::Serves::No =>
                        format!("cannot serve it beside {}", v.architecture),
                    engines::target::Serves::FromBuild => format!(
                        "serves it beside {} only from a recent build",
                        v.architecture
                    ),
                },
                v.why,
                v.source,
                e.loads.id(),
                e.why
            ),
        };
        row(
            if i == 0 { "engines" } else { "" },
            format!("{:<7}{:<8}{what}", e.engine.id(), e.verdict.id()),
        );
    }
}

/// `target`: the draft's target as its shape names it (what each engine can do beside it is in
/// the `engines` rows' verdicts).
fn print_beside(b: &engines::target::DraftTarget) {
    row(
        "target",
        format!("{} ({})", b.target.architecture, b.target.known_from),
    );
    if let Some(t) = &b.trained_on {
        row(
            "",
            format!(
                "trained on the {} stream (published draft {} in profile {})",
                t.stream.id(),
                t.draft,
                t.profile
            ),
        );
    }
    for d in &b.streams {
        let against = match &b.trained_on {
            Some(t) if t.stream == d.stream => ", the one it was trained on".to_string(),
            Some(t) => format!(", not the {} it was trained on", t.stream.id()),
            None => String::new(),
        };
        row(
            "",
            format!(
                "{:<7}hands it the {} stream{against}{} [{}: {}]",
                d.engine.id(),
                d.stream.id(),
                d.switch.map(|s| format!("; {s}")).unwrap_or_default(),
                d.release,
                d.source
            ),
        );
    }
}

/// `drafting`: on a target with attention residuals, each engine's draft methods beside it and
/// the stream it taps for them.
fn print_drafting(rows: &[engines::target::Drafting]) {
    for (i, d) in rows.iter().enumerate() {
        let families: Vec<&str> = d.families.iter().map(|f| f.id()).collect();
        row(
            if i == 0 { "drafting" } else { "" },
            format!(
                "{:<7}taps {} for {}: {} [{}: {}]",
                d.engine.id(),
                d.stream.id(),
                families.join(", "),
                d.methods,
                d.release,
                d.source
            ),
        );
        if let Some(s) = d.switch {
            row("", format!("{:<7}{s}", ""));
        }
    }
}

/// `dims` (those the config sets) and `has` (the optional tensors present).
fn print_dims(d: &Dims) {
    #[rustfmt::skip]
    let named = [
        ("hidden", d.hidden_size), ("target_hidden", d.target_hidden_size),
        ("layers", d.num_hidden_layers), ("heads", d.num_attention_heads),
        ("kv_heads", d.num_key_value_heads), ("head_dim", d.head_dim),
        ("q_lora", d.q_lora_rank), ("kv_lora", d.kv_lora_rank),
        ("intermediate", d.intermediate_size), ("vocab", d.vocab_size),
        ("draft_vocab", d.draft_vocab_size), ("block", d.block_size),
        ("experts", d.n_routed_experts),
    ];
    let mut parts: Vec<String> = named
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k} {v}")))
        .collect();
    if let (Some(n), Some(r), Some(v)) = (d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim) {
        parts.push(format!("nope/rope/v {n}/{r}/{v}"));
    }
    let flags: Vec<&str> = [
        ("d2t", d.has_d2t),
        ("t2d", d.has_t2d),
        ("embed_tokens", d.has_embed_tokens),
        ("lm_head", d.has_lm_head),
    ]
    .iter()
    .filter(|(_, b)| *b)
    .map(|(n, _)| *n)
    .collect();
    row("dims", parts.join(" · "));
    row(
        "has",
        if flags.is_empty() {
            "-".into()
        } else {
            flags.join(", ")
        },
    );
}

/// `aux layers`: the ids with their convention, or (for a draft family) that there are none.
fn print_aux_layers(det: &Detection) {
    match &det.aux_layers {
        Some(x) => {
            let conv = x.convention.map(|c| c.id()).unwrap_or("convention unknown");
            let hs = x
                .hidden_states
                .as_ref()
                .map(|h| format!(" = hidden_states {h:?}"))
                .unwrap_or_default();
            row(
                "aux layers",
                format!("{:?} from `{}`: {conv}{hs}", x.ids, x.key),
            );
            row("", x.reason.clone());
        }
        None if det.family.is_draft() => row(
            "aux layers",
            "none in config: engines use their defaults for the target".into(),
        ),
        None => {}
    }
}

/// A DSpark or DFlash2 draft: its layout, block, anchor, heads, taps as each engine reads them,
/// vocabulary, and the findings (`problem` rows).
fn print_block_draft(b: &BlockDraft) {
    row(
        "layout",
        format!("{}: {}", b.layout.id(), b.layout.describe()),
    );
    row(
        "block",
        match (b.block_size, &b.block_size_key) {
            (Some(n), Some(k)) => format!("{n} (`{k}`)"),
            _ => "none in config (the launch sets the draft tokens per step)".into(),
        },
    );
    row(
        "anchor",
        format!(
            "{}: {} · sample_from_anchor {} ({})",
            b.anchor.layout.id(),
            b.anchor.layout.describe(),
            b.anchor.sample_from_anchor,
            b.anchor.from
        ),
    );
    print_block_heads(b);
    if let Some(t) = &b.num_target_layers {
        row(
            "targets",
            format!("num_target_layers {}: {}", t.value, t.meaning()),
        );
    }
    for (i, t) in b.taps.iter().enumerate() {
        row(
            if i == 0 { "taps" } else { "" },
            format!("{:<7}{:<4} {:?}: {}", t.engine, t.shift, t.ids, t.how),
        );
    }
    let v = &b.vocab;
    let n = |x: Option<u64>| x.map(|x| x.to_string()).unwrap_or_else(|| "?".into());
    row(
        "vocab",
        format!(
            "draft {}{} of target {}{}{}{}",
            n(v.draft_vocab_size),
            if v.draft_vocab_default {
                " (no draft_vocab_size: vocab_size)"
            } else {
                ""
            },
            n(v.vocab_size),
            if v.reduced { " (reduced)" } else { "" },
            if v.d2t { ", d2t" } else { ", no d2t" },
            if v.lm_head {
                ", own lm_head"
            } else {
                ", the target's lm_head"
            }
        ),
    );
    for p in &b.problems {
        row("problem", p.what.clone());
    }
}

/// The heads' rows of a block draft: DSpark's `markov` and `confidence`, DFlash2's `conv`,
/// `selector` and `attention`.
fn print_block_heads(b: &BlockDraft) {
    if let Some(m) = &b.markov {
        let rank = match (m.rank, &m.key) {
            (Some(r), Some(k)) => format!(
                "rank {r} (`{k}`{})",
                if m.at_root { "" } else { ", not at the root" }
            ),
            _ => "no rank in config".into(),
        };
        row(
            "markov",
            format!(
                "{rank}, head {}; markov_w1 {}, markov_w2 {}",
                m.head_type.as_deref().unwrap_or("not named"),
                shape_or_missing(&m.w1),
                shape_or_missing(&m.w2)
            ),
        );
    }
    if let Some(c) = &b.confidence {
        row(
            "confidence",
            if c.enabled {
                format!(
                    "yes, {} Markov (`{}`); proj {}",
                    if c.with_markov { "with" } else { "without" },
                    c.key.as_deref().unwrap_or(""),
                    shape_or_missing(&c.proj)
                )
            } else {
                format!("no head enabled; proj {}", shape_or_missing(&c.proj))
            },
        );
    }
    if let Some(h) = &b.dflash2 {
        let n = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
        row(
            "conv",
            format!(
                "kernel {}, group {}, in {} layers",
                n(h.conv_kernel_size),
                n(h.conv_group_size),
                h.conv_layers
            ),
        );
        row(
            "selector",
            format!(
                "rank {}, top-k {}{}",
                n(h.selector_rank),
                n(h.selector_top_k),
                if h.selector { "" } else { " (no tensors)" }
            ),
        );
        if let Some(a) = &h.attention_mode {
            row("attention", format!("`dflash_config.attention_mode` {a}"));
        }
    }
}

fn shape_or_missing(s: &Option<Vec<usize>>) -> String {
    s.as_ref()
        .map(|s| format!("{s:?}"))
        .unwrap_or_else(|| "missing".into())
}

/// `params`: the totals, then one row per dtype.
fn print_params(ck: &Checkpoint) {
    let (by, all) = ck.totals();
    row(
        "params",
        format!(
            "{} in {} tensors, {}",
            human_count(all.params),
            all.tensors,
            human_bytes(all.bytes)
        ),
    );
    for (k, t) in &by {
        row(
            "",
            format!(
                "{k:<8}{:>6} tensors {:>12} params {:>12}",
                t.tensors,
                human_count(t.params),
                human_bytes(t.bytes)
            ),
        );
    }
}

/// The `quant` row: the method, the scheme kquant knows it as, the module count, the packed
/// weights and `hf_quant_config.json`; `none` for an unquantized checkpoint.
fn quant_summary(q: &QuantState, scheme: Option<&Identified>) -> String {
    if !q.quantized {
        return "none".into();
    }
    let packed: Vec<String> = q
        .packed_weights
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    let scheme = match scheme {
        Some(Identified::Scheme { format, scheme }) => {
            format!(" · --format {} --scheme {scheme}", format.name())
        }
        Some(Identified::Other { what, .. }) => format!(" · {what} (no kquant scheme)"),
        None => String::new(),
    };
    format!(
        "{}{scheme} · {} quantized modules · packed/low-precision weights: {}{}",
        q.method
            .as_deref()
            .unwrap_or("tensors only, no quantization_config"),
        q.quantized_modules,
        if packed.is_empty() {
            "none".into()
        } else {
            packed.join(", ")
        },
        if q.hf_quant_config {
            " · hf_quant_config.json"
        } else {
            ""
        }
    )
}

/// `--tensors`: every tensor's name, dtype, shape and bytes.
fn print_tensors(ck: &Checkpoint) {
    println!();
    let w = ck
        .weights
        .infos()
        .map(|t| printable(&t.name).chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:<w$}  {:<8} {:<20} {:>12}",
        "name", "dtype", "shape", "bytes"
    );
    for t in ck.weights.infos() {
        println!(
            "{:<w$}  {:<8} {:<20} {:>12}",
            printable(&t.name),
            t.dtype.name(),
            format!("{:?}", t.shape),
            t.nbytes()
        );
    }
}
