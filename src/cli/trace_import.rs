//! `kquant trace import --from vllm-hidden-states DIR -o OUT --layer-ids IDS`: a
//! `kquant-trace/1` from the files vLLM's hidden-states connector wrote
//! (`src/verify/import_vllm.rs` does the work; docs/verify.md explains the conventions).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::error::{Error, Result};
use crate::verify::import_vllm::{self, Layout, Options};
use crate::verify::profile::{self, Family};

/// Where the hidden states come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum From {
    /// vLLM `extract_hidden_states` + `ExampleHiddenStatesConnector`: `{req_id}.safetensors`
    /// with `hidden_states` and `token_ids`.
    VllmHiddenStates,
}

/// How `hidden_states` stacks the taps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LayoutArg {
    /// Tell it from the shapes.
    Auto,
    /// `[n_taps, T, H]` (vLLM's first connector).
    TapsFirst,
    /// `[T, n_taps, H]` (current vLLM).
    TokensFirst,
}

/// A kquant-trace/1 from the files vLLM's hidden-states connector wrote.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Source format.
    #[arg(long, value_enum)]
    pub from: From,
    /// The directory the connector wrote (its `shared_storage_path`).
    pub dir: PathBuf,
    /// The trace directory to write.
    #[arg(short = 'o', long, required_unless_present = "out")]
    pub output: Option<PathBuf>,
    /// Deprecated spelling of `--output` (accepted with a warning until the next release).
    #[arg(long, hide = true, conflicts_with = "output")]
    pub out: Option<PathBuf>,
    /// The tap ids given to vLLM (`eagle_aux_hidden_state_layer_ids`), comma-separated, in vLLM's
    /// convention: id k is HF hidden_states[k]; id num_hidden_layers is the last block's output.
    #[arg(long, value_delimiter = ',', required = true, value_parser = crate::cli::flags::layer_id)]
    pub layer_ids: Vec<usize>,
    /// How `hidden_states` stacks the taps.
    #[arg(long, value_enum, default_value = "auto")]
    pub layout: LayoutArg,
    /// JSON lines with prompt_len (or the prompt's tokens) and optionally category, dataset,
    /// finish_reason per request, matched by req_id (or id), else in file order.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Expected hidden size (checked against every file).
    #[arg(long, value_parser = crate::cli::flags::dim)]
    pub hidden_size: Option<usize>,
    /// Target profile (a name from `kquant targets`, or a JSON file): layer count, hidden size
    /// and vocabulary to check against, recorded in the manifest.
    #[arg(long)]
    pub target: Option<String>,
    /// Decoder blocks of the target (when no profile gives it).
    #[arg(long, value_parser = crate::cli::flags::layers)]
    pub num_layers: Option<usize>,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub force: bool,
}

fn agree(
    what: &str,
    flag: Option<usize>,
    prof: Option<usize>,
    name: &str,
) -> Result<Option<usize>> {
    match (flag, prof) {
        (Some(a), Some(b)) if a != b => Err(Error::Usage(format!(
            "--{what} {a} disagrees with target profile `{name}` ({b})"
        ))),
        (a, b) => Ok(a.or(b)),
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let From::VllmHiddenStates = a.from;
    let prof = a.target.as_deref().map(profile::load).transpose()?;
    let pname = prof.as_ref().map_or("", |p| p.name.as_str());
    let num_layers = agree(
        "num-layers",
        a.num_layers,
        prof.as_ref().and_then(|p| p.num_layers.known().copied()),
        pname,
    )?
    .ok_or_else(|| {
        Error::Usage(
            "the target's layer count is needed to read vLLM's tap ids: pass --target PROFILE (see `kquant targets`) or --num-layers L".into(),
        )
    })?;
    let hidden_size = agree(
        "hidden-size",
        a.hidden_size,
        prof.as_ref().and_then(|p| p.hidden_size.known().copied()),
        pname,
    )?;
    let vocab_size = prof.as_ref().and_then(|p| p.vocab_size.known().copied());
    let target = match &prof {
        Some(p) => serde_json::json!({"name": p.name, "hf_id": p.hf_id, "engine": "vllm"}),
        None => serde_json::json!({"engine": "vllm"}),
    };
    let out = match (a.output, a.out) {
        (Some(o), _) => o,
        (None, Some(o)) => {
            eprintln!(
                "warning: `--out` is deprecated: write `--output` (or `-o`), as every other command does"
            );
            o
        }
        (None, None) => unreachable!("clap requires --output unless --out is given"),
    };
    let o = Options {
        dir: a.dir,
        out,
        layer_ids: a.layer_ids,
        layout: match a.layout {
            LayoutArg::Auto => None,
            LayoutArg::TapsFirst => Some(Layout::TapsFirst),
            LayoutArg::TokensFirst => Some(Layout::TokensFirst),
        },
        prompts: a.prompts,
        hidden_size,
        num_layers,
        vocab_size,
        target,
        force: a.force,
    };
    let r = import_vllm::import(&o)?;
    for w in &r.warnings {
        eprintln!("warning: {}", crate::escape::printable(w));
    }
    println!(
        "{}: {} samples, {} tokens, taps hs{:?} (vLLM ids {:?}), hidden size {}, {} {}",
        o.out.display(),
        r.samples,
        r.tokens,
        r.taps,
        o.layer_ids,
        r.hidden_size,
        r.layout.name(),
        r.dtypes
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join("/"),
    );
    if let Some(p) = &prof {
        for f in Family::ALL {
            if let Some(t) = p.taps.get(f) {
                let missing: Vec<usize> =
                    t.hs.iter()
                        .copied()
                        .filter(|h| !r.taps.contains(h))
                        .collect();
                if missing.is_empty() {
                    println!(
                        "  {} drafts of {} (taps hs{:?}): covered",
                        f.name(),
                        crate::escape::printable(&p.name),
                        t.hs
                    );
                } else {
                    println!(
                        "  {} drafts of {} (taps hs{:?}): missing hs{missing:?} (capture with --layer-ids {})",
                        f.name(),
                        crate::escape::printable(&p.name),
                        t.hs,
                        t.vllm_ids().iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
