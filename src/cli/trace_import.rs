//! `kquant trace import --format vllm-hidden-states DIR -o OUT --layer-ids IDS`: a
//! `kquant-trace/1` from the files vLLM's hidden-states connector wrote
//! (`src/trace/import.rs` does the work; docs/verify.md explains the conventions).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::print_json;
use crate::error::Result;
use crate::escape::printable;
use crate::target::profile;
use crate::trace::import::{self, Coverage, Imported, Layout, Options, Request};

/// The file format the hidden states are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImportFormat {
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
    /// The files' format.
    #[arg(long, value_enum, required_unless_present = "from")]
    pub format: Option<ImportFormat>,
    /// Deprecated spelling of `--format` (accepted with a warning until the next release).
    #[arg(long, value_enum, hide = true, conflicts_with = "format")]
    pub from: Option<ImportFormat>,
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
    /// The hidden-state stream the files hold, on a target with attention residuals (Kimi-K3):
    /// `partial` (vLLM's default) or `mixture` (vLLM with VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1)
    /// [default: `tap_stream` of DIR/capture.json, which scripts/vllm_capture.py writes; else
    /// not recorded, with a warning]. `residual` on any other target, where it is implied.
    #[arg(long, value_enum)]
    pub stream: Option<crate::target::stream::TapStream>,
    /// Decoder blocks of the target (when no profile gives it).
    #[arg(long, value_parser = crate::cli::flags::layers)]
    pub num_layers: Option<usize>,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// Print one JSON document (kquant.trace-import/1) on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Check everything (every file's header and values, the prompts, the output name) and
    /// print what would be written; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// A renamed flag's value: the new spelling's, else the old one's with `note` added to the
/// warnings (clap requires one of them).
fn renamed<T>(new: Option<T>, old: Option<T>, note: &str, notes: &mut Vec<String>) -> T {
    match (new, old) {
        (Some(v), _) => v,
        (None, Some(v)) => {
            notes.push(note.to_string());
            v
        }
        (None, None) => unreachable!("clap requires the flag unless its old spelling is given"),
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let mut notes = Vec::new();
    let format = renamed(
        a.format,
        a.from,
        "`--from` is deprecated for trace import: say --format (accepted until the next release)",
        &mut notes,
    );
    let ImportFormat::VllmHiddenStates = format;
    let prof = a.target.as_deref().map(profile::load).transpose()?;
    let out = renamed(
        a.output,
        a.out,
        "`--out` is deprecated: write `--output` (or `-o`), as every other command does",
        &mut notes,
    );
    let req = Request {
        dir: a.dir,
        out,
        layer_ids: a.layer_ids,
        layout: match a.layout {
            LayoutArg::Auto => None,
            LayoutArg::TapsFirst => Some(Layout::TapsFirst),
            LayoutArg::TokensFirst => Some(Layout::TokensFirst),
        },
        prompts: a.prompts,
        hidden_size: a.hidden_size,
        num_layers: a.num_layers,
        target: prof,
        stream: a.stream,
        force: a.force,
        dry_run: a.dry_run,
    };
    let o = Options::resolve(req)?;
    for w in &notes {
        eprintln!("warning: {w}");
    }
    let r = import::import(&o)?;
    let stream = o.stream.map_or("unknown (not recorded)", |s| s.id());
    for w in &r.warnings {
        eprintln!("warning: {}", printable(w));
    }
    let families = import::coverage(o.asked.target.as_ref(), &r.taps);
    let next = r.next_step(&o.asked.out);
    if a.json {
        let mut all_warnings = notes.clone();
        all_warnings.extend(r.warnings.iter().cloned());
        let mut doc = to_json(&o.asked, &r, &families, &all_warnings, &next);
        doc["tap_stream"] = serde_json::json!(o.stream);
        print_json(&doc);
        return Ok(ExitCode::SUCCESS);
    }
    print_human(&o.asked, &r, &families, stream);
    println!("next: {next}");
    Ok(ExitCode::SUCCESS)
}

/// The `--json` document (`kquant.trace-import/1`).
fn to_json(
    o: &Request,
    r: &Imported,
    families: &[Coverage],
    warnings: &[String],
    next: &str,
) -> serde_json::Value {
    serde_json::json!({
        "schema": "kquant.trace-import/1",
        "format": "vllm-hidden-states",
        "dir": o.dir.display().to_string(),
        "output": o.out.display().to_string(),
        "dry_run": o.dry_run,
        "written": r.written,
        "samples": r.samples,
        "tokens": r.tokens,
        "taps": r.taps,
        "layer_ids": o.layer_ids,
        "hidden_size": r.hidden_size,
        "layout": r.layout.name(),
        "source_dtypes": r.dtypes.iter().map(|d| d.name()).collect::<Vec<_>>(),
        "bytes": r.bytes,
        "memory": {
            "peak_buffer_bytes": r.peak_buffer,
            "largest_request_bytes": r.largest_request,
            "peak_rss_bytes": crate::io::process::peak_rss(),
        },
        "coverage": families.iter().map(|c| serde_json::json!({
            "family": c.family.id(), "taps": c.taps, "missing": c.missing,
        })).collect::<Vec<_>>(),
        "warnings": warnings,
        "next": next,
    })
}

/// The summary: what was imported (or checked), and each draft family's coverage by the
/// target profile.
fn print_human(o: &Request, r: &Imported, families: &[Coverage], stream: &str) {
    if o.dry_run {
        println!("dry run: nothing written; all files, values and prompts check out");
    }
    println!(
        "{}: {} samples, {} tokens, taps hs{:?} (vLLM ids {:?}; tap stream {stream}), hidden size {}, {} {}",
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
    let Some(name) = o.target.as_ref().map(|p| p.name.as_str()) else {
        return;
    };
    for c in families {
        let (f, hs, missing) = (c.family.id(), &c.taps, &c.missing);
        if missing.is_empty() {
            println!(
                "  {f} drafts of {} (taps hs{hs:?}): covered",
                printable(name),
            );
        } else {
            println!(
                "  {f} drafts of {} (taps hs{hs:?}): missing hs{missing:?} (capture with --layer-ids {})",
                printable(name),
                c.vllm_ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
            );
        }
    }
}
