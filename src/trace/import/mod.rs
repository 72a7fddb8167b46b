//! `kquant trace import --format vllm-hidden-states`: turn what vLLM's `extract_hidden_states`
//! speculator and `ExampleHiddenStatesConnector` write (one `{req_id}.safetensors` per request,
//! holding `hidden_states` and `token_ids`) into a `kquant-trace/1`.
//!
//! The facts this rests on are in docs/verify.md, "Importing vLLM hidden states":
//! - the tap ids are the ones given to vLLM (`eagle_aux_hidden_state_layer_ids`); vLLM's id k is
//!   captured before block k, i.e. HF `hidden_states[k]`, and id L (= `num_hidden_layers`) is
//!   the last block's output before the final norm, which is what a trace's `hs[L]` means;
//! - vLLM appends the taps as its layer loop passes them, so slot j of the stack holds the j-th
//!   smallest id, whatever order the ids were given in;
//! - older vLLM stacks them `[n_taps, T, H]` ("taps-first"), current vLLM writes
//!   `[T, n_taps, H]` ("tokens-first"); the layout is told from the shapes.
//!
//! The import streams: a first pass checks every file's header, shapes, dtypes and token ids
//! (no values read), then the values are converted request by request, in the trace's write
//! order, and checked finite as they are written through [`TraceWriter`] (one request's file
//! mapped at a time, one piece of one tap in memory). The trace is built in the claim's staging
//! directory and renamed into place at the end, so a bad value leaves no output.
//!
//! The steps, one file each: [`layout`] (the files' tensors and tap numbering), [`request`]
//! (the flags resolved against the target profile, the families' coverage), [`files`] (pass 1,
//! the headers), [`records`] (`--prompts` paired with the files), [`stream`] (pass 2, the
//! values); [`import`] runs them in order.

pub mod files;
pub mod layout;
pub mod records;
pub mod request;
pub mod stream;

use std::path::Path;

pub use layout::{tap_slots, vllm_id_to_hs, Layout, HIDDEN, TOKENS};
pub use records::{read_prompts, PromptRecord};
pub use request::{coverage, Coverage, Imported, Options, Request};

use crate::error::{Error, Result};
use crate::io::Dtype;
use crate::trace::file::{self, Manifest, SampleSpec, TraceWriter};
use files::{Checked, ConnFile};

/// Import the connector files of `o.asked.dir` into a trace at `o.asked.out`.
pub fn import(o: &Options) -> Result<Imported> {
    let a = &o.asked;
    let slots = tap_slots(&a.layer_ids, o.num_layers)?;
    let n = slots.len();
    // Claimed before the long work (a second run or an existing output is refused at once);
    // a dry run only checks what the claim would refuse, and writes nothing.
    let claim = if a.dry_run {
        preflight(&a.out, a.force, &a.dir)?;
        None
    } else {
        Some(file::claim(&a.out, a.force, std::slice::from_ref(&a.dir))?)
    };
    let files = files::list(&a.dir)?;
    let mut warnings = Vec::new();
    if o.stream.is_none() {
        warnings.push(format!(
            "the target has attention residuals and nothing says which stream vLLM tapped (no --stream, no tap_stream in {}): the trace records none, and verify cannot check a draft's stream against it; vLLM 0.33.0 taps `partial` unless VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1 (`mixture`): pass --stream",
            a.dir.join(request::CAPTURE_JSON).display()
        ));
    }
    if a.layer_ids.windows(2).any(|w| w[0] > w[1]) {
        warnings.push(format!(
            "--layer-ids {:?} are not ascending; vLLM stacks taps in layer order, so slot j is read as the j-th smallest id",
            a.layer_ids
        ));
    }
    let (checked, hidden) = files::check_all(&files, n, o.hidden_size, o.vocab_size)?;
    let (layout, notes) = files::resolve_layout(&files, &checked, a.layout, n)?;
    warnings.extend(notes);
    let metas = records::samples(&files, &checked, a.prompts.as_deref(), &mut warnings)?;
    let dtypes = source_dtypes(&checked, &mut warnings);
    let manifest = manifest(o, &files, layout, &dtypes, hidden, &slots);
    let specs: Vec<SampleSpec> = metas
        .into_iter()
        .zip(&checked)
        .map(|(meta, c)| SampleSpec {
            meta,
            len: c.tokens.len(),
            taps: slots.clone(),
            top1: false,
        })
        .collect();
    let order = file::write_order(&specs, hidden);
    let bytes: u64 = checked
        .iter()
        .map(|c| c.tokens.len() as u64 * (4 + 2 * (n * hidden) as u64))
        .sum();
    let largest_request = checked
        .iter()
        .map(|c| (c.tokens.len() * n * hidden * c.dtype.size()) as u64)
        .max()
        .unwrap_or(0);
    let writer = match claim {
        Some(c) => Some(TraceWriter::new(c, manifest, specs)?),
        None => None,
    };
    let written = writer.is_some();
    let peak_buffer = stream::Values {
        files: &files,
        checked: &checked,
        slots: &slots,
        layout,
        hidden,
        writer,
    }
    .run(order)?;
    Ok(Imported {
        samples: files.len(),
        tokens: checked.iter().map(|c| c.tokens.len()).sum(),
        taps: slots,
        layout,
        hidden_size: hidden,
        dtypes,
        warnings,
        bytes,
        largest_request,
        peak_buffer,
        written,
    })
}

/// The dtypes of the files' `hidden_states`, sorted; a warning when any is not BF16 (the
/// trace's own).
fn source_dtypes(checked: &[Checked], warnings: &mut Vec<String>) -> Vec<Dtype> {
    let mut dtypes: Vec<Dtype> = checked.iter().map(|c| c.dtype).collect();
    dtypes.sort();
    dtypes.dedup();
    if dtypes.iter().any(|d| *d != Dtype::BF16) {
        warnings.push(format!(
            "hidden_states are {}; the trace stores BF16 (rounded to nearest even)",
            dtypes
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join("/")
        ));
    }
    dtypes
}

/// The trace's manifest: the profile's `target` record with the import's own added (where the
/// files came from, how they were read), the shape and taps.
fn manifest(
    o: &Options,
    files: &[ConnFile],
    layout: Layout,
    dtypes: &[Dtype],
    hidden: usize,
    slots: &[usize],
) -> Manifest {
    let a = &o.asked;
    let mut target = match &o.target {
        serde_json::Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    target.insert(
        "import".into(),
        serde_json::json!({
            "from": "vllm-hidden-states",
            "dir": a.dir.display().to_string(),
            "engine": "vllm",
            "layer_ids": a.layer_ids,
            "layer_id_convention": "vllm: id k = hidden_states[k]; id num_layers = last block output before the final norm",
            "layout": layout.name(),
            "source_dtypes": dtypes.iter().map(|d| d.name()).collect::<Vec<_>>(),
            "prompt_split": if a.prompts.is_some() { "from --prompts" } else { "unknown (prompt_len 1)" },
            "req_ids": files.iter().map(|f| f.req_id.clone()).collect::<Vec<_>>(),
        }),
    );
    Manifest {
        format: file::FORMAT.into(),
        target: serde_json::Value::Object(target),
        hidden_size: hidden,
        num_layers: o.num_layers,
        vocab_size: o.vocab_size,
        taps: slots.to_vec(),
        tap_convention: file::TAP_CONVENTION.into(),
        taps_pre_norm: true,
        tap_stream: o.stream,
        dtype: "bf16".into(),
        greedy_selfcheck: None,
        samples: vec![],
        shards: vec![],
        extra: Default::default(),
    }
}

/// What the output claim would refuse, checked without claiming (for `--dry-run`): an
/// existing output without `--force`, or one kquant did not write; an output that is, or
/// holds, the source directory.
fn preflight(out: &Path, force: bool, dir: &Path) -> Result<()> {
    let oerr = |msg: String, hint: &str| Error::Output {
        path: out.into(),
        msg,
        hint: Some(hint.into()),
    };
    if let (Ok(o), Ok(d)) = (std::fs::canonicalize(out), std::fs::canonicalize(dir)) {
        if d.starts_with(&o) {
            return Err(oerr(
                format!(
                    "is or holds the source `{}`, which this command reads",
                    dir.display()
                ),
                "write the output somewhere else: kquant never writes over its inputs",
            ));
        }
    }
    if std::fs::symlink_metadata(out).is_ok() {
        if !force {
            return Err(oerr(
                "already exists".into(),
                "pass --force to replace it (kquant replaces only outputs it wrote), or choose another -o",
            ));
        }
        crate::io::output::is_kquants(out, crate::io::output::Kind::Trace).map_err(|why| {
            oerr(
                format!("exists and is not an output kquant wrote ({why}); refusing to replace it"),
                "move it away yourself, or choose another -o",
            )
        })?;
    }
    Ok(())
}
