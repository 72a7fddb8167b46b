//! `kquant trace import --format vllm-hidden-states DIR -o OUT --layer-ids IDS`: a
//! `kquant-trace/1` from the files vLLM's hidden-states connector wrote
//! (`src/trace/import.rs` does the work; docs/verify.md explains the conventions).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::error::{Error, Result};
use crate::trace::import::{self, Layout, Options};
use crate::verify::profile::{self, DraftFamily};

/// The file format the hidden states are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
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

/// A draft family of the profile: its taps (`hs`), those the trace lacks, its vLLM ids.
type Coverage = (DraftFamily, Vec<usize>, Vec<usize>, Vec<usize>);

/// A kquant-trace/1 from the files vLLM's hidden-states connector wrote.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The files' format.
    #[arg(long, value_enum, required_unless_present = "from")]
    pub format: Option<Format>,
    /// Deprecated spelling of `--format` (accepted with a warning until the next release).
    #[arg(long, value_enum, hide = true, conflicts_with = "format")]
    pub from: Option<Format>,
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
    /// Print one JSON document (kquant.trace-import/1) on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Check everything (every file's header and values, the prompts, the output name) and
    /// print what would be written; write nothing.
    #[arg(long)]
    pub dry_run: bool,
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
    let mut notes = Vec::new();
    let format = match (a.format, a.from) {
        (Some(f), _) => f,
        (None, Some(f)) => {
            notes.push(
                "`--from` is deprecated for trace import: say --format (accepted until the next release)"
                    .to_string(),
            );
            f
        }
        (None, None) => unreachable!("clap requires --format unless --from is given"),
    };
    let Format::VllmHiddenStates = format;
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
            notes.push(
                "`--out` is deprecated: write `--output` (or `-o`), as every other command does"
                    .to_string(),
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
        dry_run: a.dry_run,
    };
    for w in &notes {
        eprintln!("warning: {w}");
    }
    let r = import::import(&o)?;
    for w in &r.warnings {
        eprintln!("warning: {}", crate::escape::printable(w));
    }
    let families: Vec<Coverage> = prof
        .iter()
        .flat_map(|p| {
            DraftFamily::ALL.iter().filter_map(|f| {
                let t = p.taps.get(*f)?;
                let missing: Vec<usize> =
                    t.hs.iter()
                        .copied()
                        .filter(|h| !r.taps.contains(h))
                        .collect();
                Some((*f, t.hs.clone(), missing, t.vllm_ids()))
            })
        })
        .collect();
    let next = if r.written {
        format!(
            "kquant verify --draft DRAFT --baseline BASELINE --trace {}",
            o.out.display()
        )
    } else {
        "the same command without --dry-run".to_string()
    };
    if a.json {
        let mut all_warnings = notes.clone();
        all_warnings.extend(r.warnings.iter().cloned());
        let doc = serde_json::json!({
            "schema": "kquant.trace-import/1",
            "format": "vllm-hidden-states",
            "dir": o.dir.display().to_string(),
            "output": o.out.display().to_string(),
            "dry_run": a.dry_run,
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
                "peak_rss_bytes": peak_rss_bytes(),
            },
            "coverage": families.iter().map(|(f, hs, missing, _)| serde_json::json!({
                "family": f.name(), "taps": hs, "missing": missing,
            })).collect::<Vec<_>>(),
            "warnings": all_warnings,
            "next": next,
        });
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
        return Ok(ExitCode::SUCCESS);
    }
    if a.dry_run {
        println!("dry run: nothing written; all files, values and prompts check out");
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
        for (f, hs, missing, ids) in &families {
            if missing.is_empty() {
                println!(
                    "  {} drafts of {} (taps hs{hs:?}): covered",
                    f.name(),
                    crate::escape::printable(&p.name),
                );
            } else {
                println!(
                    "  {} drafts of {} (taps hs{hs:?}): missing hs{missing:?} (capture with --layer-ids {})",
                    f.name(),
                    crate::escape::printable(&p.name),
                    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
                );
            }
        }
    }
    println!("next: {next}");
    Ok(ExitCode::SUCCESS)
}

/// This process's peak resident set so far (`VmHWM` of /proc/self/status), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
