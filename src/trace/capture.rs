//! Capturing a `kquant-trace/1` with a CPU target runtime (`runtime::target`), the way
//! fixtures/gen/verify/make_trace.py does with transformers: per prompt, a greedy continuation
//! of `gen_len` tokens with the KV cache (EOS committed like any token unless asked to stop at
//! it), then ONE capture forward over prompt + continuation whose hidden states give the taps
//! and whose argmax gives `target_top1`. Where that argmax disagrees with the recorded next token
//! in the generated region, the continuation is regenerated without the cache; mismatches that
//! remain are counted in `greedy_selfcheck` and the sample is cut after the first.

use std::path::Path;

use serde_json::{json, Value};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::io::manifest::hash_file;
use crate::ops::argmax;
use crate::runtime::deepseek::Forward;
use crate::runtime::target::Target;
use crate::target::stream::TapStream;
use crate::trace::file::{Manifest, NewSample, SampleMeta, FORMAT, TAP_CONVENTION};

/// One prompt of the input JSONL.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub id: u64,
    /// The prompt file's id where it is not a whole number (kept in the trace as `prompt_id`).
    pub name: Option<String>,
    pub category: String,
    pub dataset: Option<String>,
    pub turn: u32,
    pub tokens: Vec<u32>,
}

/// The prompts `trace capture` takes: the first `per_category` of each category (file order
/// kept), then the first `limit`; and the categories `limit` left with no prompt at all, each
/// with the number of its prompts dropped (in file order), so that a category-sorted file cut
/// by `--limit` is said to be.
pub fn select_prompts(
    prompts: Vec<Prompt>,
    per_category: Option<usize>,
    limit: Option<usize>,
) -> (Vec<Prompt>, Vec<(String, usize)>) {
    let mut seen: std::collections::HashMap<String, usize> = Default::default();
    let mut kept: Vec<Prompt> = prompts
        .into_iter()
        .filter(|p| {
            let n = seen.entry(p.category.clone()).or_default();
            *n += 1;
            *n <= per_category.unwrap_or(usize::MAX)
        })
        .collect();
    let cut = kept.split_off(limit.unwrap_or(usize::MAX).min(kept.len()));
    let held: std::collections::HashSet<&str> = kept.iter().map(|p| p.category.as_str()).collect();
    let mut index: std::collections::HashMap<&str, usize> = Default::default();
    let mut dropped: Vec<(String, usize)> = Vec::new();
    for p in cut.iter().filter(|p| !held.contains(p.category.as_str())) {
        let i = *index.entry(p.category.as_str()).or_insert_with(|| {
            dropped.push((p.category.clone(), 0));
            dropped.len() - 1
        });
        dropped[i].1 += 1;
    }
    (kept, dropped)
}

/// Read prompts: one JSON object per line with token ids in `tokens` (make_heldout.py),
/// `prompt_ids` or `input_ids`; `id` (default: the line's index among prompts), `category`,
/// `dataset`, `turn` optional. Text-only lines are refused: kquant does not tokenize.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>> {
    let text =
        crate::io::text::read_regular_text(path, crate::io::text::MAX_PROMPTS, "prompt file")?;
    let err = |line: usize, msg: String| Error::Source {
        path: path.into(),
        msg: format!("line {line}: {msg}"),
        hint: Some("one JSON object per line with token ids in `tokens` (or `prompt_ids`)".into()),
    };
    let mut out: Vec<Prompt> = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value =
            serde_json::from_str(line).map_err(|e| err(i + 1, format!("not JSON: {e}")))?;
        let ids = ["tokens", "prompt_ids", "input_ids"]
            .iter()
            .find_map(|k| v.get(k).and_then(Value::as_array));
        let Some(ids) = ids else {
            let text_only = v.get("prompt").or_else(|| v.get("text")).is_some();
            return Err(err(
                i + 1,
                if text_only {
                    "has text but no token ids; tokenize the prompts first: `kquant trace prompts --tokenizer TARGET --prompts FILE -o TOKENIZED`".into()
                } else {
                    "has no `tokens` / `prompt_ids` array".into()
                },
            ));
        };
        let tokens = ids
            .iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&x| x <= u32::MAX as u64)
                    .map(|x| x as u32)
            })
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| err(i + 1, "token ids must be non-negative integers".into()))?;
        if tokens.is_empty() {
            return Err(err(i + 1, "the prompt is empty".into()));
        }
        // A whole-number id is the sample's; any other (`test-0`, `HumanEval/0`) is kept as the
        // prompt's own name beside the sample's number (the line's index among prompts).
        let name = v
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()))
            .map(String::from);
        let id = v
            .get("id")
            .and_then(|x| {
                x.as_u64().or_else(|| {
                    x.as_str()
                        .filter(|_| name.is_none())
                        .and_then(|s| s.parse().ok())
                })
            })
            .unwrap_or(out.len() as u64);
        if out.iter().any(|p| p.id == id) {
            return Err(err(i + 1, format!("id {id} appears twice")));
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(String::from);
        out.push(Prompt {
            id,
            name,
            category: s("category").unwrap_or_default(),
            dataset: s("dataset"),
            turn: v.get("turn").and_then(Value::as_u64).unwrap_or(0) as u32,
            tokens,
        });
    }
    Ok(out)
}

/// How to capture.
#[derive(Debug, Clone)]
pub struct Options {
    /// Greedy tokens to generate per prompt (`max_new_tokens`).
    pub gen_len: usize,
    /// HF `hidden_states` indices to store.
    pub taps: Vec<usize>,
    /// Stop a continuation after an EOS token (default: EOS is committed like any token).
    pub stop_at_eos: bool,
    /// Greedy tokens past the stop (EOS ignored), kept as lookahead so that a replay can count
    /// the engine's final step as vLLM does, before its cut (`SampleMeta::stop_len`); 0: none.
    pub lookahead: usize,
    /// Store the taps as float32 (what an engine serving in float32 feeds the draft) instead
    /// of bf16.
    pub f32_taps: bool,
    /// The hidden-state stream tapped (`residual`; `partial` or `mixture` on an
    /// attention-residual target: `trace::stream::for_target` decides and checks it), recorded
    /// as the manifest's `tap_stream`.
    pub stream: TapStream,
}

/// One captured sample.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Prompt + continuation.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// (tap, `[T, H]`) in `Options::taps` order.
    pub taps: Vec<(usize, Vec<f32>)>,
    /// Argmax of the capture pass per position.
    pub top1: Vec<u32>,
    /// Generated-region positions where `top1` disagreed with the next token after the
    /// uncached regeneration (counted in `greedy_selfcheck`; the sample is cut after the first).
    pub mismatches: usize,
    /// Whether the cached continuation disagreed with the capture pass and was regenerated.
    pub regenerated: bool,
    /// `length` or `stop` (ended at EOS with `stop_at_eos`).
    pub finish_reason: &'static str,
    /// Where the engine stops (tokens, prompt included) when lookahead follows it.
    pub stop_len: Option<usize>,
    /// Where the capture forward's logits or the kept taps are NaN or infinite, if anywhere.
    pub non_finite: Option<String>,
}

/// Positions `t` in `p-1 .. T-1` whose argmax is not `x[t+1]`.
fn mismatches(top1: &[u32], x: &[u32], p: usize) -> Vec<usize> {
    (p.saturating_sub(1)..x.len().saturating_sub(1))
        .filter(|&t| top1[t] != x[t + 1])
        .collect()
}

fn top1(f: &Forward, vocab: usize) -> Vec<u32> {
    f.logits.chunks(vocab).map(|r| argmax(r) as u32).collect()
}

/// make_trace.py's `greedy_nocache`: every token from a fresh full forward.
fn greedy_nocache(m: &Target, prompt: &[u32], n: usize, stop: &[u32]) -> Result<Vec<u32>> {
    let mut x = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < n {
        let t = argmax(&m.session().extend(&x)?) as u32;
        out.push(t);
        x.push(t);
        if stop.contains(&t) {
            break;
        }
    }
    Ok(out)
}

/// Where the capture forward's logits or the taps it keeps hold a value that is not finite:
/// `(what, position)`. A trace made of them would feed a draft NaN taps and a continuation of
/// argmaxes over NaN, which every draft "predicts" (#38.4), so capture refuses it.
fn non_finite(f: &Forward, vocab: usize, taps: &[(usize, Vec<f32>)], h: usize) -> Option<String> {
    if let Some(i) = crate::ops::first_non_finite(&f.logits) {
        return Some(format!(
            "the target's logits are not finite ({}) at position {}",
            f.logits[i],
            i / vocab.max(1)
        ));
    }
    taps.iter().find_map(|(t, v)| {
        crate::ops::first_non_finite(v).map(|i| {
            format!(
                "tap {t} (hidden state) is not finite ({}) at position {}",
                v[i],
                i / h.max(1)
            )
        })
    })
}

/// Capture one prompt. Where the target's logits or taps are not finite, `non_finite` says
/// where, and [`write_trace`] refuses the prompt.
pub fn capture(m: &Target, prompt: &[u32], o: &Options) -> Result<Captured> {
    let p = prompt.len();
    let stop = if o.stop_at_eos {
        m.eos().to_vec()
    } else {
        vec![]
    };
    let join = |g: &[u32]| -> Vec<u32> { prompt.iter().chain(g).copied().collect() };
    // The continuation up to the engine's stop, then `lookahead` more tokens past it (EOS
    // ignored), each from the cached loop or from fresh full forwards; and the stop.
    let generate = |nocache: bool| -> Result<(Vec<u32>, usize)> {
        let greedy = |x: &[u32], n: usize, stop: &[u32]| {
            if nocache {
                greedy_nocache(m, x, n, stop)
            } else {
                m.greedy(x, n, stop)
            }
        };
        let mut g = greedy(prompt, o.gen_len, &stop)?;
        let stop_len = p + g.len();
        if o.lookahead > 0 {
            let more = greedy(&join(&g), o.lookahead, &[])?;
            g.extend(more);
        }
        Ok((g, stop_len))
    };
    let (mut gen, mut stop_len) = generate(false)?;
    let mut x = join(&gen);
    let mut f = m.forward_stream(&x, o.stream)?;
    let mut t1 = top1(&f, m.vocab());
    let mut bad = mismatches(&t1, &x, p);
    let regenerated = !bad.is_empty();
    if regenerated {
        (gen, stop_len) = generate(true)?;
        x = join(&gen);
        f = m.forward_stream(&x, o.stream)?;
        t1 = top1(&f, m.vocab());
        bad = mismatches(&t1, &x, p);
    }
    if let Some(&first) = bad.first() {
        gen.truncate(first + 1 - p);
        x = join(&gen);
        f = m.forward_stream(&x, o.stream)?;
        t1 = top1(&f, m.vocab());
    }
    let stop_len = stop_len.min(x.len());
    let stopped = stop.contains(&x[stop_len - 1]);
    let taps: Vec<(usize, Vec<f32>)> = o
        .taps
        .iter()
        .map(|&i| (i, f.hidden_states[i].clone()))
        .collect();
    Ok(Captured {
        non_finite: non_finite(&f, m.vocab(), &taps, m.hidden()),
        taps,
        tokens: x,
        prompt_len: p,
        top1: t1,
        mismatches: bad.len(),
        regenerated,
        finish_reason: if stopped { "stop" } else { "length" },
        stop_len: (o.lookahead > 0).then_some(stop_len),
    })
}

/// Check `taps` against a target of `layers` blocks: HF indices `0..layers` (index `layers` is
/// reported after the final norm, and a trace stores pre-norm taps), sorted, no repeats.
pub fn check_taps(taps: &[usize], layers: usize) -> Result<()> {
    if taps.is_empty() {
        return Err(Error::Flags {
            msg: "--taps is empty".into(),
            hint: format!(
                "give HF hidden_states indices in 0..={}, comma-separated (`kquant targets` \
                 prints each draft family's)",
                layers.saturating_sub(1)
            ),
        });
    }
    if let Some(t) = taps.iter().find(|&&t| t >= layers) {
        return Err(Error::Flags {
            msg: format!(
                "tap {t} is not a pre-norm hidden state of this {layers}-layer target; HF's \
                 hidden_states[{layers}] comes after the final norm"
            ),
            hint: format!(
                "taps are HF hidden_states indices in 0..={} (`kquant targets` prints each \
                 draft family's)",
                layers - 1
            ),
        });
    }
    if taps.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Error::Flags {
            msg: format!("--taps {taps:?} must be increasing, without repeats"),
            hint: {
                let mut t = taps.to_vec();
                t.sort_unstable();
                t.dedup();
                format!(
                    "--taps {}",
                    t.iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                )
            },
        });
    }
    Ok(())
}

/// Refuse, before any work, a capture whose prompt + continuation would not fit the target's
/// `max_position_embeddings` (positions past it are not what the target was trained or served
/// on), or which generates nothing.
pub fn check_lengths(prompts: &[Prompt], gen_len: usize, max_pos: usize) -> Result<()> {
    if gen_len == 0 {
        return Err(Error::Flags {
            msg: "--gen-len 0 generates nothing: the trace would have no generated position to replay".into(),
            hint: "give --gen-len 1 or more (96 by default)".into(),
        });
    }
    let Some(p) = prompts.iter().max_by_key(|p| p.tokens.len()) else {
        return Ok(());
    };
    let total = p.tokens.len().checked_add(gen_len);
    if total.is_none_or(|t| t > max_pos) {
        return Err(Error::Flags {
            msg: format!(
                "--gen-len {gen_len}: prompt {} has {} tokens, and {} + {gen_len} exceeds the target's max_position_embeddings {max_pos}",
                p.id,
                p.tokens.len(),
                p.tokens.len()
            ),
            hint: format!(
                "lower --gen-len to at most {} (or leave the longest prompts out)",
                max_pos.saturating_sub(p.tokens.len())
            ),
        });
    }
    Ok(())
}

/// `sha256:` of the weights: the single file's hash, or of the `name sha256` lines of every
/// shard (sorted) when there are several.
fn revision(ck: &Checkpoint) -> Result<String> {
    let files = ck.weights.files();
    if let [one] = files.as_slice() {
        return Ok(format!("sha256:{}", hash_file(one)?.sha256));
    }
    let mut lines: Vec<String> = files
        .iter()
        .map(|f| {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            Ok(format!("{name} {}\n", hash_file(f)?.sha256))
        })
        .collect::<Result<_>>()?;
    lines.sort();
    use sha2::Digest;
    let h = sha2::Sha256::digest(lines.concat().as_bytes());
    Ok(format!("sha256:{}", crate::io::hash::hex(&h)))
}

/// What the weights are stored as: the quantization method, else the embedding's dtype.
fn quantization(ck: &Checkpoint) -> String {
    let q = ck
        .config
        .as_ref()
        .and_then(|c| c.root.get("quantization_config"))
        .and_then(|q| q.get("quant_method"))
        .and_then(Value::as_str);
    if let Some(q) = q {
        return q.to_string();
    }
    ck.weights
        .infos()
        .find(|t| t.name.ends_with("embed_tokens.weight"))
        .map(|t| t.dtype.name().to_lowercase())
        .unwrap_or_else(|| "unknown".into())
}

/// The manifest make_trace.py writes, with kquant as the engine. `name` is the target as the
/// user named it; `samples` and `greedy_selfcheck` as captured.
pub fn manifest(
    ck: &Checkpoint,
    m: &Target,
    name: &str,
    o: &Options,
    samples: Vec<SampleMeta>,
    greedy_selfcheck: u64,
) -> Result<Manifest> {
    let tok = ck.weights.dir.join("tokenizer.json");
    let tokenizer = if tok.is_file() {
        json!(hash_file(&tok)?.sha256)
    } else {
        Value::Null
    };
    // The weights alone do not fix the continuation: the config (rope scaling, norms, the
    // router) does too, so it has its own digest, which `trace merge` compares (#38.9).
    let config = match &ck.weights.config_path {
        Some(c) => json!(format!("sha256:{}", hash_file(c)?.sha256)),
        None => Value::Null,
    };
    let target = json!({
        "name": name,
        "architecture": m.architecture(),
        "revision": revision(ck)?,
        "config_sha256": config,
        "quantization": quantization(ck),
        "engine": "kquant",
        "engine_version": env!("CARGO_PKG_VERSION"),
        "compute_dtype": "float32 (weights upcast)",
        "attention_backend": "kquant CPU (eager math)",
        "tp": 1,
        "ep": 1,
    });
    let stop_ids: Vec<u32> = if o.stop_at_eos {
        m.eos().to_vec()
    } else {
        vec![]
    };
    let mut extra = json!({
        "tokenizer_sha256": tokenizer,
        "chat_template_sha256": null,
        "thinking": false,
        "system_prompt": null,
        "sampling": {"temperature": 0, "max_new_tokens": o.gen_len,
                     "ignore_eos": !o.stop_at_eos, "stop_ids": stop_ids},
    });
    if o.lookahead > 0 {
        // Tokens past each stop (`SampleMeta::stop_len`), EOS ignored there.
        extra["sampling"]["lookahead"] = json!(o.lookahead);
    }
    Ok(Manifest {
        format: FORMAT.into(),
        target,
        hidden_size: m.hidden(),
        num_layers: m.num_layers(),
        vocab_size: Some(m.vocab()),
        taps: o.taps.clone(),
        tap_convention: TAP_CONVENTION.into(),
        taps_pre_norm: true,
        tap_stream: Some(o.stream),
        dtype: if o.f32_taps { "f32" } else { "bf16" }.into(),
        greedy_selfcheck: Some(greedy_selfcheck),
        samples,
        shards: vec![],
        extra: extra.as_object().expect("object").clone(),
    })
}

/// What [`write_trace`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub samples: usize,
    pub tokens: usize,
    /// Σ greedy self-check mismatches (continuation token ≠ the capture pass's argmax).
    pub selfcheck: u64,
    /// Samples whose continuation was regenerated without the KV cache.
    pub regenerated: usize,
}

/// Capture every prompt with the target `m` (loaded from `ck`, named `name` in the manifest)
/// and write the `kquant-trace/1` to the claimed `out` (`trace::write`), with a
/// progress bar on stderr. `dataset` names samples whose prompt line names none.
#[allow(clippy::too_many_arguments)]
pub fn write_trace(
    ck: &Checkpoint,
    m: &Target,
    name: &str,
    prompts: &[Prompt],
    o: &Options,
    dataset: &str,
    out: crate::io::output::Claim,
) -> Result<Written> {
    check_taps(&o.taps, m.num_layers())?;
    crate::trace::stream::for_target(Some(o.stream), m.attention_residuals(), name, "--stream")?;
    check_lengths(prompts, o.gen_len.saturating_add(o.lookahead), m.max_pos())?;
    let pb = crate::progress::items(prompts.len() as u64, "capture", "samples");
    let mut caps = Vec::with_capacity(prompts.len());
    for p in prompts {
        let c = capture(m, &p.tokens, o)?;
        if let Some(why) = &c.non_finite {
            return Err(Error::Source {
                path: ck.weights.dir.clone(),
                msg: format!("prompt {}: {why}; no trace is written from it", p.id),
                hint: Some(
                    "the target checkpoint computes NaN or infinity here: check its weights \
                     (`kquant diff` against the original, `kquant inspect --tensors`) or \
                     re-download it"
                        .into(),
                ),
            });
        }
        caps.push(c);
        pb.inc(1);
    }
    pb.finish_and_clear();
    let metas: Vec<SampleMeta> = prompts
        .iter()
        .zip(&caps)
        .map(|(p, c)| SampleMeta {
            id: p.id,
            category: p.category.clone(),
            dataset: p.dataset.clone().unwrap_or_else(|| dataset.to_string()),
            shard: String::new(),
            prompt_len: c.prompt_len,
            gen_len: c.tokens.len() - c.prompt_len,
            finish_reason: c.finish_reason.into(),
            turn: p.turn,
            stop_len: c.stop_len,
            prompt_id: p.name.clone(),
        })
        .collect();
    let selfcheck: u64 = caps.iter().map(|c| c.mismatches as u64).sum();
    let samples: Vec<NewSample> = metas
        .iter()
        .zip(&caps)
        .map(|(meta, c)| NewSample {
            meta: meta.clone(),
            tokens: &c.tokens,
            taps: c.taps.iter().map(|(i, v)| (*i, v.as_slice())).collect(),
            target_top1: Some(&c.top1),
        })
        .collect();
    let man = manifest(ck, m, name, o, metas.clone(), selfcheck)?;
    crate::trace::file::write(out, man, &samples)?;
    Ok(Written {
        samples: caps.len(),
        tokens: caps.iter().map(|c| c.tokens.len()).sum(),
        selfcheck,
        regenerated: caps.iter().filter(|c| c.regenerated).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_read_and_refuse() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.jsonl");
        std::fs::write(
            &p,
            "{\"id\": 7, \"category\": \"code\", \"tokens\": [1, 2]}\n\n{\"prompt_ids\": [3]}\n",
        )
        .unwrap();
        let v = read_prompts(&p).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].id, v[0].category.as_str(), &v[0].tokens),
            (7, "code", &vec![1, 2])
        );
        assert_eq!((v[1].id, v[1].tokens.clone()), (1, vec![3]));
        std::fs::write(&p, "{\"prompt\": \"hello\"}\n").unwrap();
        let e = read_prompts(&p).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("tokenize"), "{e}");
        std::fs::write(
            &p,
            "{\"id\": 1, \"tokens\": [1]}\n{\"id\": 1, \"tokens\": [2]}\n",
        )
        .unwrap();
        assert!(read_prompts(&p).unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn taps_and_mismatches() {
        assert!(check_taps(&[1, 2, 3], 4).is_ok());
        assert!(check_taps(&[1, 4], 4)
            .unwrap_err()
            .to_string()
            .contains("final norm"));
        assert!(check_taps(&[2, 1], 4).is_err());
        // x = [p0, p1 | g0, g1]: top1 at 1 predicts g0, at 2 predicts g1.
        assert_eq!(
            mismatches(&[9, 5, 6, 0], &[1, 2, 5, 6], 2),
            Vec::<usize>::new()
        );
        assert_eq!(mismatches(&[9, 5, 7, 0], &[1, 2, 5, 6], 2), vec![2]);
    }

    #[test]
    fn capture_is_self_consistent_on_the_tiny_target() {
        let root = env!("CARGO_MANIFEST_DIR");
        let ck = Checkpoint::open(&format!("{root}/fixtures/tiny/target-kimi-k2")).unwrap();
        let m = Target::load(&ck).unwrap();
        let o = Options {
            gen_len: 6,
            taps: vec![1, 2],
            stop_at_eos: false,
            lookahead: 0,
            f32_taps: false,
            stream: TapStream::Residual,
        };
        let c = capture(&m, &[5, 6, 7], &o).unwrap();
        assert_eq!((c.tokens.len(), c.prompt_len, c.mismatches), (9, 3, 0));
        assert!(!c.regenerated);
        assert_eq!(
            &c.top1[2..8],
            &c.tokens[3..9],
            "argmax of the capture pass = continuation"
        );
        assert_eq!(c.taps.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(c.taps[0].1.len(), 9 * m.hidden());
    }
}
