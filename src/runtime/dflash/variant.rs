//! Which block drafter a checkpoint is, read from its config and tensors: plain DFlash, DSpark
//! (vLLM `Qwen3DSparkModel` layout: a Markov head and an optional confidence head on the DFlash
//! backbone; the anchor row predicts unless `sample_from_anchor` is false) or DFlash2
//! (`DFlash2DraftModel`: grouped convolutions in every layer and the candidate selector), with
//! the head and convolutions they add. The keys and defaults are vLLM 0.32/0.33's
//! (`qwen3_dspark.py`, `dspark/speculator.py`, `qwen3_dflash2.py`,
//! `transformers_utils/configs/speculators/algos.py`).

use serde_json::Value;

use super::conv::{GroupedConv, Kernel};
use super::heads::{Confidence, Head, Markov, Selector};
use crate::checkpoint::block::{AnchorLayout, Layout};
use crate::checkpoint::{Checkpoint, Config, Detection, Family};
use crate::error::{Error, Result};
use crate::runtime::weights::Loader;

/// The block drafter kinds the replay runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dflash,
    Dspark,
    Dflash2,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Dflash => "DFlash",
            Kind::Dspark => "DSpark",
            Kind::Dflash2 => "DFlash2",
        }
    }

    /// What the tensors say: DSpark's Markov head, DFlash2's selector, or neither.
    pub fn of(vb: &Loader) -> Kind {
        if vb.has("markov_head.markov_w1.weight") {
            Kind::Dspark
        } else if vb.has("candidate_selector.predecessor_codebook") {
            Kind::Dflash2
        } else {
            Kind::Dflash
        }
    }
}

/// What a kind adds to the DFlash backbone.
pub struct Variant {
    pub kind: Kind,
    pub head: Head,
    /// Per layer: the attention and MLP convolutions (DFlash2), else empty.
    pub convs: Vec<[GroupedConv; 2]>,
    /// DSpark with `sample_from_anchor` (the default, not for speculators-format drafts): the
    /// block is `[x_r, MASK × (N−1)]` and every row predicts the next token; otherwise DFlash's
    /// `[x_r, MASK × N]` with the masks predicting their own positions.
    pub anchor_first: bool,
    /// The most proposals a step takes: DFlash's `block_size − 1`, DSpark's `block_size`.
    pub max_steps: usize,
    /// `dflash_config.input_embedding_scale` (DFlash2; vLLM scales every embedding row by it).
    pub embed_scale: f32,
}

fn flag(c: &Config, key: &str) -> Option<bool> {
    c.get(key)
        .or_else(|| c.nested("dflash_config", key))
        .or_else(|| c.nested("dspark_config", key))
        .and_then(Value::as_bool)
}

fn number(c: &Config, obj: Option<&str>, key: &str) -> Option<f64> {
    match obj {
        Some(o) => c.nested(o, key),
        None => c.get(key),
    }
    .filter(|v| !v.is_null())
    .and_then(Value::as_f64)
}

/// `Err` when `v`, tensor `name` of a head, holds a NaN or an infinity: a NaN logit is what
/// `torch.argmax` picks in the engines, and what the replay's argmax never picks (#38.4), so
/// the gate would measure another draft than the one served.
fn finite(dir: &std::path::Path, name: &str, v: &[f32]) -> Result<()> {
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::source(
            dir,
            format!("tensor `{name}` holds {} at flat index {i}: the engines' argmax picks a NaN logit (torch.argmax) where the replay's never does, so the gate would measure another draft", v[i]),
        )
        .with_hint("the draft's weights are damaged: export them again from the training checkpoint")),
    }
}

/// Tensor `name` (`shape`), checked [`finite`].
fn finite_get(vb: &Loader, dir: &std::path::Path, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let v = vb.get(name, shape)?;
    finite(dir, name, &v)?;
    Ok(v)
}

/// The whole number `key` of `dflash_config`, within `1..=max`.
fn count(dir: &std::path::Path, c: &Config, key: &str, max: u64) -> Result<usize> {
    match c.nested("dflash_config", key).and_then(Value::as_u64) {
        Some(n) if (1..=max).contains(&n) => Ok(n as usize),
        Some(n) => Err(Error::source(
            dir,
            format!("`dflash_config.{key}` is {n}: it must be 1..={max}"),
        )
        .with_hint("the DFlash2 keys give the widths of the convolution and selector tensors; `kquant inspect` shows the tensors' shapes")),
        None => Err(Error::source(
            dir,
            format!("DFlash2 config has no `dflash_config.{key}`"),
        )
        .with_hint("a DFlash2DraftModel config names conv_kernel_size, conv_group_size, selector_rank and selector_top_k in dflash_config")),
    }
}

/// The layouts the replay runs: DFlash, DSpark and DFlash2 on the Qwen3 GQA backbone, and
/// Inferact's MLA `K3DSparkModel` (`k3-dspark`). DFlash2 with `attention_mode: mla` is refused by
/// name: no engine builds it; so is a DSpark or DFlash2 draft whose config contradicts itself or
/// its tensors (`BlockDraft::contradiction`).
pub fn check_layout(det: &Detection, dir: &std::path::Path) -> Result<()> {
    match det.block_draft.as_ref().map(|b| b.layout) {
        Some(l @ Layout::Dflash2Mla) => Err(Error::source(
            dir,
            format!(
                "is a {} draft in the `{}` layout (an MLA backbone): the replay runs the Qwen3 GQA backbone of vLLM's `DFlash2DraftModel` (neither vLLM nor SGLang builds an MLA DFlash2)",
                l.family_name(),
                l.id()
            ),
        )
        .with_hint("`kquant inspect` says which engines load it; an MLA DFlash2 is not replayed")),
        _ => match det.block_draft.as_ref().and_then(|b| b.contradiction()) {
            Some(why) => Err(Error::source(dir, format!("cannot be replayed as written: {why}"))
                .with_hint("fix its config.json (in a copy of the draft) so that its keys agree with each other, the vocabulary and the tensors; `kquant inspect` lists every problem")),
            None => Ok(()),
        },
    }
}

/// Read the variant of the block drafter in `ck`: `block_size` is the config's, `h` the draft's
/// hidden size, `vocab` the target's. The family detection gave must be the one the tensors
/// hold (a Markov head for DSpark, a selector for DFlash2, neither for DFlash).
pub fn read(
    ck: &Checkpoint,
    det: &Detection,
    c: &Config,
    vb: &Loader,
    block_size: usize,
    (h, vocab, n_layers): (usize, usize, usize),
) -> Result<Variant> {
    let dir = ck.weights.dir.as_path();
    let kind = Kind::of(vb);
    let want = match det.family {
        Family::Dspark => Kind::Dspark,
        Family::Dflash2 => Kind::Dflash2,
        _ => Kind::Dflash,
    };
    if kind != want {
        let held = match kind {
            Kind::Dspark => "a Markov head (`markov_head.*`)",
            Kind::Dflash2 => "a candidate selector (`candidate_selector.*`)",
            Kind::Dflash => "neither a Markov head nor a candidate selector",
        };
        return Err(Error::source(
            dir,
            format!(
                "is detected as `{}` but its tensors hold {held}: a {} drafter",
                det.family.id(),
                kind.name()
            ),
        )
        .with_hint("the config and the weights are of different drafts (`kquant inspect` shows what each says)"));
    }
    if let Some(mode) = c
        .nested("dflash_config", "attention_mode")
        .and_then(Value::as_str)
    {
        if mode != "gqa" {
            return Err(Error::source(
                dir,
                format!("`dflash_config.attention_mode` is `{mode}`: the replay runs the GQA backbone vLLM and SGLang load (neither reads attention_mode; both build q/k/v_proj)"),
            )
            .with_hint("an MLA-backbone block drafter loads in neither vLLM 0.33 nor SGLang 0.5.23 (`kquant inspect` says which engines load it)"));
        }
    }
    let plain = Variant {
        kind,
        head: Head::Argmax,
        convs: Vec::new(),
        anchor_first: false,
        max_steps: block_size - 1,
        embed_scale: 1.0,
    };
    match kind {
        Kind::Dflash => Ok(plain),
        Kind::Dspark => dspark(ck, det, c, vb, block_size, (h, vocab), plain),
        Kind::Dflash2 => dflash2(ck, c, vb, (h, vocab, n_layers), plain),
    }
}

fn dspark(
    ck: &Checkpoint,
    det: &Detection,
    c: &Config,
    vb: &Loader,
    block_size: usize,
    (h, vocab): (usize, usize),
    plain: Variant,
) -> Result<Variant> {
    let dir = ck.weights.dir.as_path();
    let w1 = "markov_head.markov_w1.weight";
    let rank = match vb.shape(w1).as_deref() {
        Some(&[v, r]) if v == vocab && r > 0 => r,
        other => {
            return Err(vb.error(
                w1,
                format!("shape {other:?}, expected [{vocab}, rank] (indexed by target token id)"),
            ))
        }
    };
    if let Some(r) = c.get("markov_rank").and_then(Value::as_u64) {
        if r as usize != rank {
            return Err(Error::source(
                dir,
                format!("config's markov_rank {r} disagrees with `{w1}` (rank {rank})"),
            ));
        }
    }
    if let Some(t) = c.str("markov_head_type").filter(|t| *t != "vanilla") {
        return Err(Error::source(
            dir,
            format!(
                "markov_head_type `{t}`: vLLM 0.32/0.33 implement the `vanilla` Markov head only"
            ),
        )
        .with_hint("a gated or rnn Markov head loads in SGLang only; the replay follows vLLM"));
    }
    let draft_vocab = c
        .get("draft_vocab_size")
        .and_then(Value::as_u64)
        .map_or(vocab, |v| v as usize);
    let (own_head, d2t) = if draft_vocab < vocab {
        let hint = "a reduced-vocabulary draft ships its own `lm_head.weight` and `d2t`; otherwise its draft_vocab_size is the target's vocab_size";
        if !vb.has("lm_head.weight") {
            return Err(Error::source(dir, format!("draft_vocab_size {draft_vocab} < the target's {vocab} but no `lm_head.weight`: vLLM refuses a reduced-vocabulary DSpark draft without its own lm_head")).with_hint(hint));
        }
        let d2t = crate::runtime::d2t::read(ck, draft_vocab, vocab)?.ok_or_else(|| {
            Error::source(dir, format!("draft_vocab_size {draft_vocab} < the target's {vocab} but no `d2t`: vLLM refuses a reduced-vocabulary DSpark draft without it")).with_hint(hint)
        })?;
        (
            Some(vb.linear("lm_head.weight", draft_vocab, h)?),
            Some(d2t),
        )
    } else {
        (None, None)
    };
    let w2n = "markov_head.markov_w2.weight";
    finite(dir, w2n, &vb.get(w2n, &[draft_vocab, rank])?)?;
    let w2 = vb.linear(w2n, draft_vocab, rank)?;
    let confidence = if flag(c, "enable_confidence_head") == Some(true)
        && vb.has("confidence_head.proj.weight")
    {
        let with_markov = flag(c, "confidence_head_with_markov") == Some(true);
        let width = h + if with_markov { rank } else { 0 };
        Some(Confidence {
            with_markov,
            w: finite_get(vb, dir, "confidence_head.proj.weight", &[1, width])?,
            b: if vb.has("confidence_head.proj.bias") {
                vb.get("confidence_head.proj.bias", &[1])?[0]
            } else {
                0.0
            },
        })
    } else {
        None
    };
    let topk = match c.get("dspark_draft_topk") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(k) if k >= 1 && (k as usize) <= draft_vocab => Some(k as usize),
            _ => {
                return Err(Error::source(
                    dir,
                    format!("dspark_draft_topk is {v}: it must be 1..={draft_vocab}"),
                ))
            }
        },
    };
    let scale = number(c, None, "logit_scale").unwrap_or(1.0) as f32;
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::source(
            dir,
            format!("logit_scale {scale}: it must be positive"),
        ));
    }
    // The anchor layout detection read (`checkpoint::block`): vLLM's default is anchor-first,
    // speculators' DSpark converts with `sample_from_anchor` false (the 1 + N layout).
    let anchor_first = match det.block_draft.as_ref() {
        Some(b) => b.anchor.layout == AnchorLayout::AnchorFirst,
        None => c
            .get("sample_from_anchor")
            .and_then(Value::as_bool)
            .unwrap_or(c.get("speculators_model_type").is_none()),
    };
    Ok(Variant {
        head: Head::Markov(Markov {
            rank,
            w1: finite_get(vb, dir, w1, &[vocab, rank])?,
            w2,
            scale,
            topk,
            confidence,
            own_head,
            d2t,
        }),
        anchor_first,
        max_steps: block_size,
        ..plain
    })
}

fn dflash2(
    ck: &Checkpoint,
    c: &Config,
    vb: &Loader,
    (h, vocab, n_layers): (usize, usize, usize),
    plain: Variant,
) -> Result<Variant> {
    let dir = ck.weights.dir.as_path();
    let taps = count(dir, c, "conv_kernel_size", 64)?;
    let group = count(dir, c, "conv_group_size", h as u64)?;
    if !h.is_multiple_of(group) {
        return Err(Error::source(
            dir,
            format!("conv_group_size {group} must divide hidden_size {h}"),
        ));
    }
    let rank = count(dir, c, "selector_rank", 1 << 16)?;
    let top_k = count(dir, c, "selector_top_k", vocab as u64)?;
    let conv = |name: String| -> Result<GroupedConv> {
        Ok(GroupedConv {
            kernel: Kernel {
                taps,
                group,
                h,
                base: vb.get(&format!("{name}.base_kernel"), &[2, taps, h])?,
            },
            proj: vb.linear(
                &format!("{name}.kernel_projection.weight"),
                2 * taps * (h / group),
                h,
            )?,
        })
    };
    let convs = (0..n_layers)
        .map(|i| {
            Ok([
                conv(format!("layers.{i}.attention_conv"))?,
                conv(format!("layers.{i}.mlp_conv"))?,
            ])
        })
        .collect::<Result<Vec<_>>>()?;
    let softcap = number(c, Some("dflash_config"), "final_logit_softcapping")
        .filter(|&s| s > 0.0)
        .map(|s| s as f32);
    let scale = number(c, Some("dflash_config"), "output_multiplier").unwrap_or(1.0) as f32;
    let embed_scale =
        number(c, Some("dflash_config"), "input_embedding_scale").unwrap_or(1.0) as f32;
    if !(scale.is_finite() && scale > 0.0 && embed_scale.is_finite()) {
        return Err(Error::source(dir, format!("output_multiplier {scale} / input_embedding_scale {embed_scale}: the multiplier must be positive and both finite")));
    }
    let cs = "candidate_selector";
    Ok(Variant {
        head: Head::Selector(Selector {
            rank,
            top_k,
            pred: finite_get(
                vb,
                dir,
                &format!("{cs}.predecessor_codebook"),
                &[vocab, rank],
            )?,
            succ: finite_get(vb, dir, &format!("{cs}.successor_codebook"), &[vocab, rank])?,
            hproj: {
                let n = format!("{cs}.hidden_projection.weight");
                finite(dir, &n, &vb.get(&n, &[rank, h])?)?;
                vb.linear(&n, rank, h)?
            },
            scale,
            softcap,
        }),
        convs,
        embed_scale,
        ..plain
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::load;
    use super::super::DFlash;
    use crate::runtime::{Drafter, FAST_REL_TOL};
    use serde_json::{json, Value};

    const H: usize = 64;
    const V: usize = 256;

    fn data(n: usize, seed: u32, amp: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let u = (i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed.wrapping_mul(97))
                    % 2000;
                amp * (u as f32 / 1000.0 - 1.0)
            })
            .collect()
    }

    /// The synthetic tiny z-lab DFlash (hidden 64, vocab 256) with `extra` f32 tensors added and
    /// `patch` merged into its config.
    fn variant(
        patch: Value,
        extra: &[(String, Vec<usize>, Vec<f32>)],
    ) -> (tempfile::TempDir, String) {
        super::super::tests::tiny_with("dflash-zlab", patch, extra)
    }

    fn rel_err(a: &[f32], b: &[f32]) -> f32 {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    }

    fn argmax(x: &[f32]) -> usize {
        (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
    }

    const RANK: usize = 8;

    fn dspark(extra_cfg: Value) -> (tempfile::TempDir, String, Vec<f32>, Vec<f32>) {
        let (w1, w2) = (data(V * RANK, 3, 1.0), data(V * RANK, 4, 1.0));
        let mut cfg = json!({"architectures": ["Qwen3DSparkModel"], "block_size": 6,
            "markov_rank": RANK, "enable_confidence_head": true,
            "confidence_head_with_markov": true});
        for (k, v) in extra_cfg.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        let (t, p) = variant(
            cfg,
            &[
                (
                    "markov_head.markov_w1.weight".into(),
                    vec![V, RANK],
                    w1.clone(),
                ),
                (
                    "markov_head.markov_w2.weight".into(),
                    vec![V, RANK],
                    w2.clone(),
                ),
                (
                    "confidence_head.proj.weight".into(),
                    vec![1, H + RANK],
                    data(H + RANK, 5, 0.1),
                ),
                ("confidence_head.proj.bias".into(), vec![1], vec![0.25]),
            ],
        );
        (t, p, w1, w2)
    }

    fn inputs(d: &DFlash, len: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
        let x: Vec<u32> = (0..len as u32).map(|i| (i * 37 + 5) % 255).collect();
        let taps = (0..d.taps.len())
            .map(|j| data(len * d.ht, 10 + j as u32, 2.0))
            .collect();
        (x, taps)
    }

    /// DSpark: the anchor-first block (every row read out), the fast rows within FAST_REL_TOL of
    /// the plain ones, and the sequential Markov walk against the same walk written out here
    /// over the reference logits; `propose` is `matches`' block; top-k 1 is the base argmax.
    #[test]
    fn dspark_walks_the_markov_bias_over_the_anchor_first_block() {
        let (_t, p, w1, w2) = dspark(json!({}));
        let d = load(&p).unwrap();
        assert_eq!(d.kind, super::Kind::Dspark);
        assert!(d.anchor_first);
        assert_eq!((d.default_steps(), d.max_steps()), (6, Some(6)));
        let len = 24;
        let (x, taps) = inputs(&d, len);
        let feats = d.features(&taps, len);
        let (fast, slow) = (d.context(&feats, len), d.context_ref(&feats, len));
        let roots = [1, 7, 15, len - 1];
        for steps in [6, 3] {
            let b = d.rows(steps);
            assert_eq!(b, steps, "anchor-first: one row per proposal");
            let (f, r) = (
                d.slots(&fast, &x, &roots, b),
                d.slots_ref(&slow, &x, &roots, b),
            );
            assert_eq!(f.len(), roots.len() * steps * H);
            assert!(rel_err(&f, &r) <= FAST_REL_TOL, "steps {steps}");
            let logits = d.blocks_ref(&slow, &x, &roots, b);
            let got = d.block_tokens(&fast, &x, &roots, b);
            for (j, &root) in roots.iter().enumerate() {
                let mut prev = x[root] as usize;
                for (i, &tok) in got[j].iter().enumerate() {
                    let row = &logits[(j * steps + i) * V..(j * steps + i + 1) * V];
                    let z: Vec<f32> = (0..V)
                        .map(|v| {
                            row[v]
                                + (0..RANK)
                                    .map(|q| w2[v * RANK + q] * w1[prev * RANK + q])
                                    .sum::<f32>()
                        })
                        .collect();
                    assert_eq!(tok as usize, argmax(&z), "root {root} row {i}");
                    prev = tok as usize;
                }
            }
            assert_eq!(d.propose(&x[..16], &taps, steps), got[2]);
        }
        // The Markov bias matters here: the walk is not the base argmax everywhere.
        let b = d.rows(6);
        let base = d.blocks(&fast, &x, &roots, b);
        let plain: Vec<u32> = base.chunks(V).map(|r| argmax(r) as u32).collect();
        let walked: Vec<u32> = d.block_tokens(&fast, &x, &roots, b).concat();
        assert_ne!(plain, walked);
        // dspark_draft_topk 1: only each row's best base logit survives.
        let (_t1, p1, _, _) = dspark(json!({"dspark_draft_topk": 1}));
        let d1 = load(&p1).unwrap();
        let top1: Vec<u32> = d1
            .block_tokens(&d1.context(&feats, len), &x, &roots, b)
            .concat();
        assert_eq!(top1, plain);
    }

    /// speculators' DSpark (`sample_from_anchor` false by default there): DFlash's 1 + N block.
    #[test]
    fn speculators_dspark_runs_the_one_plus_n_block() {
        let (_t, p, _, _) = dspark(json!({"speculators_model_type": "dspark"}));
        let d = load(&p).unwrap();
        assert!(!d.anchor_first);
        assert_eq!((d.rows(6), d.predicting(7)), (7, 6));
        let (_t, p, _, _) =
            dspark(json!({"speculators_model_type": "dspark", "sample_from_anchor": true}));
        assert!(load(&p).unwrap().anchor_first);
    }

    /// DFlash2 with identity convolutions and a zero successor codebook is DFlash (the walk's
    /// edge term vanishes and the best unary candidate wins); with real ones the fast rows stay
    /// within FAST_REL_TOL of the plain ones and the proposals change.
    #[test]
    fn dflash2_is_dflash_at_identity_and_its_own_model_otherwise() {
        let (_t0, p0) = variant(json!({"block_size": 8}), &[]);
        let plain = load(&p0).unwrap();
        let dc = json!({"mask_token_id": 255, "target_layer_ids": [1, 4], "conv_kernel_size": 2,
            "conv_group_size": 16, "selector_rank": 4, "selector_top_k": 5});
        let cfg =
            json!({"architectures": ["DFlash2DraftModel"], "block_size": 8, "dflash_config": dc});
        let (taps, group, rank) = (2usize, 16usize, 4usize);
        let ng = H / group;
        let tensors = |identity: bool| {
            let mut t = Vec::new();
            for i in 0..2 {
                for c in ["attention_conv", "mlp_conv"] {
                    let base = if identity {
                        (0..2 * taps * H)
                            .map(|j| {
                                if (j / H).is_multiple_of(taps) {
                                    1.0
                                } else {
                                    0.0
                                }
                            })
                            .collect()
                    } else {
                        data(2 * taps * H, 20 + i, 0.8)
                    };
                    let proj = if identity {
                        vec![0.0; 2 * taps * ng * H]
                    } else {
                        data(2 * taps * ng * H, 30 + i, 0.1)
                    };
                    t.push((
                        format!("layers.{i}.{c}.base_kernel"),
                        vec![2, taps, H],
                        base,
                    ));
                    t.push((
                        format!("layers.{i}.{c}.kernel_projection.weight"),
                        vec![2 * taps * ng, H],
                        proj,
                    ));
                }
            }
            let succ = if identity {
                vec![0.0; V * rank]
            } else {
                data(V * rank, 41, 2.0)
            };
            t.push((
                "candidate_selector.predecessor_codebook".into(),
                vec![V, rank],
                data(V * rank, 40, 2.0),
            ));
            t.push((
                "candidate_selector.successor_codebook".into(),
                vec![V, rank],
                succ,
            ));
            t.push((
                "candidate_selector.hidden_projection.weight".into(),
                vec![rank, H],
                data(rank * H, 42, 1.0),
            ));
            t
        };
        let (_t1, p1) = variant(cfg.clone(), &tensors(true));
        let id = load(&p1).unwrap();
        assert_eq!(id.kind, super::Kind::Dflash2);
        let len = 24;
        let (x, tp) = inputs(&id, len);
        let feats = id.features(&tp, len);
        let roots = [1, 7, 15, len - 1];
        let (c0, c1) = (plain.context(&feats, len), id.context(&feats, len));
        for b in [8, 4] {
            assert_eq!(
                id.block_tokens(&c1, &x, &roots, b),
                plain.block_tokens(&c0, &x, &roots, b)
            );
        }
        let (_t2, p2) = variant(cfg, &tensors(false));
        let d = load(&p2).unwrap();
        let (fast, slow) = (d.context(&feats, len), d.context_ref(&feats, len));
        for b in [8, 3] {
            let (f, r) = (
                d.slots(&fast, &x, &roots, b),
                d.slots_ref(&slow, &x, &roots, b),
            );
            assert!(rel_err(&f, &r) <= FAST_REL_TOL, "block {b}");
        }
        assert_ne!(
            d.block_tokens(&fast, &x, &roots, 8),
            plain.block_tokens(&c0, &x, &roots, 8)
        );
        assert_eq!(
            d.propose(&x[..16], &tp, 7),
            d.block_tokens(&fast, &x, &[15], 8)[0]
        );
    }

    /// What the replay cannot run is refused by name.
    #[test]
    fn unsupported_variants_are_refused_by_name() {
        let msg = |cfg: Value| {
            let (_t, p, _, _) = dspark(cfg);
            load(&p).err().expect("refused").to_string()
        };
        assert!(msg(json!({"markov_head_type": "gated"})).contains("`vanilla` Markov head only"));
        assert!(msg(json!({"markov_rank": 16})).contains("disagrees"));
        assert!(msg(json!({"draft_vocab_size": 128})).contains("lm_head"));
        assert!(msg(json!({"dspark_draft_topk": 0})).contains("dspark_draft_topk"));
        let selector = [
            (
                "candidate_selector.predecessor_codebook".to_string(),
                vec![V, 4],
                data(V * 4, 1, 1.0),
            ),
            (
                "candidate_selector.successor_codebook".to_string(),
                vec![V, 4],
                data(V * 4, 2, 1.0),
            ),
            (
                "candidate_selector.hidden_projection.weight".to_string(),
                vec![4, H],
                data(4 * H, 3, 1.0),
            ),
        ];
        let (_t, p) = variant(
            json!({"architectures": ["DFlash2DraftModel"], "dflash_config": {"mask_token_id": 255,
                "target_layer_ids": [1, 4], "attention_mode": "mla"}}),
            &selector,
        );
        let e = load(&p).err().unwrap().to_string();
        assert!(e.contains("`dflash2-mla` layout (an MLA backbone)"), "{e}");
        // A config of one family over the weights of another is refused, not run as either.
        let (_t, p) = variant(
            json!({"architectures": ["Qwen3DSparkModel"], "block_size": 6,
            "markov_rank": RANK}),
            &[],
        );
        let e = load(&p).err().unwrap().to_string();
        assert!(e.contains("ambiguous family"), "{e}");
    }
}
