//! The DFlash block drafter (z-lab `DFlashDraftModel`: Qwen3 decoder layers, non-causal inside a
//! block, no embedding or lm_head of its own) on CPU, in the offline form of
//! docs/verify.md, "DFlash replay". The context `hidden_norm(fc(cat taps))` and every layer's
//! context keys/values are computed once per sequence ([`DFlash::context`]); then each root r
//! gets one independent block pass over `[x_r, MASK × (B−1)]` at positions r..r+B−1 that sees the
//! context rows < r and all block rows ([`DFlash::blocks`]), read out through the target's
//! lm_head on slots 1..B−1. Mirrors `DFlash` in fixtures/gen/verify/common.py.
//!
//! Weights are read in any dtype and any quantized layout kquant writes (dequantized at load,
//! `quant::decode`), so a quantized draft runs exactly as its dequantized weights; the draft's
//! linears (fc, q/k/v/o, gate/up/down) go through the hook in [`super::linears`], which can
//! instead run them on a device ([`DFlash::load_on`]). The target's lm_head is a linear of the
//! same set (`lm_head (target)`): the packed product over its stored precision on the CPU (a
//! bounded block of logits at a time, only each row's argmax and runner-up kept), or a device
//! layer whose argmax is reduced there. The target's embedding is read by rows from its mapped
//! file ([`super::embed::Embedding`]).

mod attn;
pub mod conv;
pub mod device;
pub mod heads;
pub mod model;
pub mod variant;

use std::path::Path;

use rayon::prelude::*;
use serde_json::Value;

use super::embed::Embedding;
use super::linears::{Exec, Linear, LinearSet};
use super::on_device::Placed;
use super::rope::Rope;
use super::weights::Loader;
use crate::checkpoint::{AuxLayers, Checkpoint, Config, Detection, Dialect, Dims, Family};
use crate::error::{Error, Result};
use crate::ops::{rms_norm, silu, softmax, Top2};
use crate::quant::decode::Logical;
use crate::runtime::matches::Matches;
use attn::{Attn, Gqa, Widths};
use model::{Layer, Model};

/// Depth-match masks hold one bit per depth in a `u32` (`verify::walk::Matches`).
const MAX_DEPTHS: usize = crate::runtime::matches::MAX_DEPTHS;

/// The target's tensors a DFlash draft runs with: its token embedding and its lm_head, both
/// `[vocab, hidden]`. The embedding is read by rows from the target's mapped file when it is
/// stored unquantized (only the rows of the tokens a replay sees are converted), else dequantized
/// at load; the lm_head is loaded by [`DFlash::load_on`] as a [`Linear`] of the draft's set, kept
/// in its stored precision (bf16 stays bf16) or placed on the device.
pub struct TargetHead<'a> {
    pub vocab: usize,
    pub hidden: usize,
    pub embed: Embedding,
    ck: &'a Checkpoint,
    /// The tensor the lm_head is read from (the embedding's when they are tied).
    lm_head: String,
}

impl<'a> TargetHead<'a> {
    /// Find `model.embed_tokens.weight` and `lm_head.weight` (or their `language_model.` forms)
    /// in a target checkpoint, quantized or not; a target with tied embeddings and no lm_head
    /// uses its embedding.
    pub fn read(target: &'a Checkpoint) -> Result<TargetHead<'a>> {
        let lg = Logical::new(target)?;
        let dir = || target.weights.dir.clone();
        let find = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| lg.shape(n).map(|s| ((*n).to_string(), s)))
        };
        let (en, es) = find(&[
            "model.embed_tokens.weight",
            "language_model.model.embed_tokens.weight",
            "embed_tokens.weight",
        ])
        .ok_or_else(|| Error::Source {
            path: dir(),
            msg: "the target has no `model.embed_tokens.weight`".into(),
            hint: Some(
                "--target-checkpoint must be the target model the draft was trained for".into(),
            ),
        })?;
        if es.len() != 2 {
            return Err(Error::Tensor {
                path: dir(),
                tensor: en,
                msg: format!("shape {es:?}, expected [vocab, hidden]"),
                hint: None,
            });
        }
        let (vocab, hidden) = (es[0], es[1]);
        let tied = target
            .config
            .as_ref()
            .and_then(|c| c.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            == Some(true);
        let head = find(&["lm_head.weight", "language_model.lm_head.weight"]);
        let lm_head = match head {
            Some((n, s)) if s == es => n,
            Some((n, s)) => {
                return Err(Error::Tensor {
                    path: dir(),
                    tensor: n,
                    msg: format!("shape {s:?}, expected {es:?} (the embedding's)"),
                    hint: None,
                })
            }
            None if tied => en.clone(),
            None => return Err(Error::Source {
                path: dir(),
                msg: "the target has no `lm_head.weight` (and does not tie it to the embedding)"
                    .into(),
                hint: Some(
                    "--target-checkpoint must be the full target model the draft was trained for"
                        .into(),
                ),
            }),
        };
        let embed = match Embedding::map(target, &en, vocab, hidden)? {
            Some(m) => m,
            None => Embedding::Dense {
                h: hidden,
                v: lg.read_f32(&en).expect("present"),
            },
        };
        Ok(TargetHead {
            vocab,
            hidden,
            embed,
            ck: target,
            lm_head,
        })
    }
}

/// A loaded DFlash drafter ([`Model`]: its dimensions and weights, with the target's embedding
/// and lm_head), and where its step runs.
pub type DFlash = Placed<Model, device::DeviceStep>;

/// Every layer's context keys (k_norm, then RoPE at the row's position) and values for the
/// first `len` positions of a sequence, `[len, kv_heads · head_dim]` per layer.
pub struct Context {
    pub len: usize,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The draft's widths from the dimensions detection read, each one it needs present and
/// non-zero, the heads grouping evenly and the block one the replay handles.
#[derive(Clone, Copy)]
struct Shape {
    h: usize,
    ht: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    n_layers: usize,
    vocab: usize,
    block_size: usize,
}

impl Shape {
    fn read(dir: &Path, d: &Dims) -> Result<Shape> {
        d.check_bounded()
        .map_err(|m| Error::source(dir, m).with_hint("a dimension of config.json is past any real model's; check the file (`kquant inspect` shows what it reads)"))?;
        let need = |v: Option<u64>, k: &str| match v {
            Some(0) => Err(Error::source(dir, format!("config's `{k}` is 0"))),
            Some(x) => Ok(x as usize),
            None => Err(Error::source(dir, format!("config has no `{k}`"))),
        };
        let h = need(d.hidden_size, "hidden_size")?;
        let ht = d.target_hidden_size.map(|x| x as usize).unwrap_or(h);
        let heads = need(d.num_attention_heads, "num_attention_heads")?;
        let kv_heads = d.num_key_value_heads.map(|x| x as usize).unwrap_or(heads);
        let head_dim = d.head_dim.map(|x| x as usize).unwrap_or(h / heads);
        let inter = need(d.intermediate_size, "intermediate_size")?;
        let n_layers = need(d.num_hidden_layers, "num_hidden_layers")?;
        let vocab = need(d.vocab_size, "vocab_size")?;
        let block_size = need(d.block_size, "block_size")?;
        if kv_heads == 0 || heads % kv_heads != 0 || !head_dim.is_multiple_of(2) {
            let msg = format!("{heads} attention heads over {kv_heads} KV heads of dim {head_dim}: heads must be a multiple of KV heads and head_dim even");
            return Err(Error::source(dir, msg));
        }
        if !(2..=MAX_DEPTHS + 1).contains(&block_size) {
            let msg = format!(
            "block_size {block_size}: the replay handles 2..={} (up to {MAX_DEPTHS} proposals per round)",
            MAX_DEPTHS + 1
        );
            return Err(Error::source(dir, msg));
        }
        Ok(Shape {
            h,
            ht,
            heads,
            kv_heads,
            head_dim,
            inter,
            n_layers,
            vocab,
            block_size,
        })
    }
}

/// `dflash_config.mask_token_id` (or the top-level one), inside the vocabulary.
fn mask_id(dir: &Path, c: &Config, vocab: usize) -> Result<u64> {
    let mask_id = c
        .nested("dflash_config", "mask_token_id")
        .or_else(|| c.get("mask_token_id"))
        .and_then(Value::as_u64)
        .ok_or_else(|| Error::source(dir, "config has no `dflash_config.mask_token_id`"))?;
    if mask_id as usize >= vocab {
        return Err(Error::source(
            dir,
            format!("mask_token_id {mask_id} is outside the vocab of {vocab}"),
        ));
    }
    Ok(mask_id)
}

/// The block the replay runs: full-attention, non-causal, no sliding window, bias-free layers.
fn check_block_kind(dir: &Path, c: &Config) -> Result<()> {
    if let Some(Value::Array(types)) = c.get("layer_types") {
        if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
            return Err(Error::source(
                dir,
                format!("layer type {t}: the replay runs full-attention DFlash layers only"),
            ));
        }
    }
    // What vLLM reads for a block's attention (`qwen3_dflash.py`,
    // `_resolve_layer_attention` / `_dflash_layer_causal`): `is_causal`, then
    // `dflash_config.causal`, make the block causal; `dflash_config.use_swa` a sliding window.
    // The replay runs the non-causal full-attention block of z-lab's drafts only.
    let dc = c.get("dflash_config");
    for (key, v) in [
        ("is_causal", c.get("is_causal")),
        ("dflash_config.causal", dc.and_then(|d| d.get("causal"))),
        ("dflash_config.use_swa", dc.and_then(|d| d.get("use_swa"))),
    ] {
        if v.and_then(Value::as_bool) == Some(true) {
            return Err(Error::source(
                dir,
                format!("`{key}` is true: the replay runs non-causal full-attention DFlash blocks only (what vLLM runs when it is false or absent)"),
            ));
        }
    }
    if c.get("attention_bias").and_then(Value::as_bool) == Some(true) {
        return Err(Error::source(
            dir,
            "attention_bias = true: the replay runs bias-free DFlash layers only",
        ));
    }
    Ok(())
}

/// `target_layer_ids` and the taps they name (HF `hidden_states` indices): distinct and
/// increasing.
fn taps<'d>(dir: &Path, det: &'d Detection) -> Result<(&'d AuxLayers, Vec<usize>)> {
    let aux = det.aux_layers.as_ref().ok_or_else(|| {
        Error::source(dir, "config has no `dflash_config.target_layer_ids`")
            .with_hint("`kquant inspect` shows what the config holds")
    })?;
    let taps: Vec<usize> = aux
        .hidden_states
        .as_ref()
        .ok_or_else(|| {
            Error::source(
                dir,
                format!("the convention of `{}` {:?} is unknown", aux.key, aux.ids),
            )
            .with_hint("`kquant inspect` shows the draft's aux layers")
        })?
        .iter()
        .map(|&i| usize::try_from(i).unwrap_or(usize::MAX))
        .collect();
    // The taps are the target's hidden states the drafter reads, once each, in order; a
    // repeated or negative id, or a depth of 0, describes no target (#38, the extras).
    if taps.is_empty() || taps.contains(&usize::MAX) || !taps.windows(2).all(|w| w[0] < w[1]) {
        return Err(Error::source(
            dir,
            format!(
                "`{}` {:?} must name distinct layers in increasing order",
                aux.key, aux.ids
            ),
        )
        .with_hint("each id is one target layer the drafter reads (`kquant inspect` shows them)"));
    }
    Ok((aux, taps))
}

/// The target's depth, when the config has it (at least one): `num_target_layers`, except in
/// Inferact's K3DSparkModel (`k3` true), where that key counts the taps (K3DSparkConfig checks
/// it against `target_layer_ids`) and the depth is `target_num_hidden_layers`.
fn target_layers(dir: &Path, c: &Config, k3: bool) -> Result<Option<usize>> {
    let key = if k3 {
        "target_num_hidden_layers"
    } else {
        "num_target_layers"
    };
    Ok(match c.get(key) {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) if n > 0 && n as u64 <= crate::checkpoint::detect::MAX_DIM => Some(n),
            _ => {
                return Err(Error::source(
                    dir,
                    format!("`{key}` is {v}: a target has at least one layer"),
                )
                .with_hint("give the target's layer count, or leave the key out"))
            }
        },
    })
}

/// The rotary table: plain, or YaRN (HF applies its attention factor to cos/sin; Qwen3
/// attention keeps the 1/sqrt(head_dim) scale).
fn rope(dir: &Path, c: &Config, head_dim: usize) -> Result<Rope> {
    let theta = c
        .get("rope_theta")
        .or_else(|| c.get("rope_parameters").and_then(|r| r.get("rope_theta")))
        .and_then(Value::as_f64)
        .ok_or_else(|| Error::source(dir, "config has no `rope_theta`"))?;
    if !(theta.is_finite() && theta > 0.0) {
        return Err(Error::source(
            dir,
            format!("`rope_theta` is {theta}: RoPE's base is a positive number"),
        )
        .with_hint(
            "give the rope_theta the draft was trained with (`kquant inspect` shows the config)",
        ));
    }
    let scaling = c
        .get("rope_scaling")
        .filter(|v| !v.is_null())
        .or_else(|| c.get("rope_parameters"));
    if let Some(t) = scaling
        .and_then(|s| s.get("rope_type").or_else(|| s.get("type")))
        .and_then(Value::as_str)
        .filter(|t| !matches!(*t, "default" | "yarn"))
    {
        return Err(Error::source(
            dir,
            format!("rope type `{t}`: the replay handles default and yarn RoPE"),
        ));
    }
    let (rope, _deepseek_softmax_mult) = Rope::from_config(head_dim, theta, scaling);
    Ok(rope)
}

/// Decoder layer `i`'s weights: Qwen3 GQA attention, or the K3 MLA one when `mla` is given.
fn load_layer(vb: &Loader, i: usize, sh: &Shape, mla: Option<&attn::MlaSpec>) -> Result<Layer> {
    let (h, head_dim, inter) = (sh.h, sh.head_dim, sh.inter);
    let (qd, kvd) = (sh.heads * head_dim, sh.kv_heads * head_dim);
    let (a, l) = (
        vb.pp(format!("layers.{i}.self_attn")),
        vb.pp(format!("layers.{i}")),
    );
    let attn = match mla {
        Some(m) => Attn::Mla(Box::new(m.read(&a, h)?)),
        None => Attn::Gqa(Box::new(Gqa {
            q: a.linear("q_proj.weight", qd, h)?,
            k: a.linear("k_proj.weight", kvd, h)?,
            v: a.linear("v_proj.weight", kvd, h)?,
            o: a.linear("o_proj.weight", h, qd)?,
            q_norm: a.get("q_norm.weight", &[head_dim])?,
            k_norm: a.get("k_norm.weight", &[head_dim])?,
        })),
    };
    Ok(Layer {
        attn,
        input_norm: l.get("input_layernorm.weight", &[h])?,
        post_norm: l.get("post_attention_layernorm.weight", &[h])?,
        gate: l.linear("mlp.gate_proj.weight", inter, h)?,
        up: l.linear("mlp.up_proj.weight", inter, h)?,
        down: l.linear("mlp.down_proj.weight", h, inter)?,
    })
}

/// One block's attention: queries `q` `[B, heads·qk]` over the context keys/values
/// `c` (`[r, kv·qk]`, `[r, kv·v]`) then the block's own, into `o` `[B, heads·v]`.
fn attend_block(
    w: &Widths,
    c: (&[f32], &[f32]),
    (q, k, v): (&[f32], &[f32], &[f32]),
    o: &mut [f32],
    b: usize,
) {
    let (qd, kd, vd) = w.rows();
    let group = w.heads / w.kv_heads;
    let nc = c.0.len() / kd;
    let mut sc = vec![0f32; nc + b];
    for i in 0..b {
        for head in 0..w.heads {
            let (kh, qh) = (
                (head / group) * w.qk,
                &q[i * qd + head * w.qk..i * qd + (head + 1) * w.qk],
            );
            for (s, row) in c.0.chunks(kd).chain(k.chunks(kd)).enumerate() {
                sc[s] = dot(qh, &row[kh..kh + w.qk]) * w.scale;
            }
            softmax(&mut sc);
            let vh = (head / group) * w.v;
            let oh = &mut o[i * w.heads * w.v + head * w.v..i * w.heads * w.v + (head + 1) * w.v];
            for (p, row) in sc.iter().zip(c.1.chunks(vd).chain(v.chunks(vd))) {
                for (a, y) in oh.iter_mut().zip(&row[vh..vh + w.v]) {
                    *a += p * y;
                }
            }
        }
    }
}

/// [`attend_block`] written out for one root `r`: key `s` is context row `s` for `s < r`,
/// else block row `s − r`; returns `[B, heads·v]`.
fn attend_ref(
    w: &Widths,
    (ck, cv, r): (&[f32], &[f32], usize),
    (q, k, v): (&[f32], &[f32], &[f32]),
    b: usize,
) -> Vec<f32> {
    let (qd, kd, vd) = w.rows();
    let group = w.heads / w.kv_heads;
    let mut attn = vec![0f32; b * w.heads * w.v];
    for i in 0..b {
        for head in 0..w.heads {
            let (kh, vh) = ((head / group) * w.qk, (head / group) * w.v);
            let qh = &q[i * qd + head * w.qk..i * qd + (head + 1) * w.qk];
            let key = |s: usize| {
                let (t, s) = if s < r { (ck, s) } else { (k, s - r) };
                &t[s * kd + kh..s * kd + kh + w.qk]
            };
            let val = |s: usize| {
                let (t, s) = if s < r { (cv, s) } else { (v, s - r) };
                &t[s * vd + vh..s * vd + vh + w.v]
            };
            let mut p: Vec<f32> = (0..r + b)
                .map(|s| {
                    let mut acc = 0f32;
                    for (a, k) in qh.iter().zip(key(s)) {
                        acc += a * k;
                    }
                    acc * w.scale
                })
                .collect();
            softmax(&mut p);
            let oh =
                &mut attn[i * w.heads * w.v + head * w.v..i * w.heads * w.v + (head + 1) * w.v];
            for (s, ps) in p.iter().enumerate() {
                for (a, y) in oh.iter_mut().zip(val(s)) {
                    *a += ps * y;
                }
            }
        }
    }
    attn
}

impl DFlash {
    /// Load from a checkpoint detected as a DFlash drafter (z-lab names, or TorchSpec's
    /// `context_proj` / `context_norm` / `final_norm`), with the target's embedding and lm_head
    /// (taken, not copied: at Kimi scale they are gigabytes).
    /// Every linear runs in f32 ([`Exec::F32`]).
    pub fn load(ck: &Checkpoint, det: &Detection, target: TargetHead) -> Result<DFlash> {
        DFlash::load_on(ck, det, target, Exec::F32)
    }

    /// [`DFlash::load`] with the quantized linears placed by `exec`.
    pub fn load_on(
        ck: &Checkpoint,
        det: &Detection,
        target: TargetHead,
        exec: Exec,
    ) -> Result<DFlash> {
        let dir = ck.weights.dir.as_path();
        if !matches!(
            det.family,
            Family::Dflash | Family::Dspark | Family::Dflash2
        ) {
            return Err(Error::source(
                dir,
                format!(
                    "is `{}`, not a DFlash, DSpark or DFlash2 drafter",
                    det.family.id()
                ),
            ));
        }
        variant::check_layout(det, dir)?;
        let c = ck.config.as_ref().ok_or_else(|| {
            Error::source(dir, "DFlash draft has no config.json")
                .with_hint("the draft directory must hold the config.json it was exported with")
        })?;
        // vLLM substitutes a separately trained mask embedding for embed_tokens[mask_token_id]
        // when the draft ships one (`qwen3_dflash.py` `_read_mask_embedding`); it is a PyTorch
        // pickle, which kquant does not read, and the replay embeds the mask from the table.
        let mask_pt = ck.weights.dir.join("mask_embedding.pt");
        if mask_pt.exists() {
            return Err(Error::source(
                &mask_pt,
                "a separately trained mask embedding (vLLM uses it in place of embed_tokens[mask_token_id]); the replay embeds the mask token from the embedding table and cannot read a PyTorch pickle",
            )
            .with_hint("verify this draft live on its engine (`kquant verify --endpoint`); the offline replay would measure another model"));
        }
        let mla = attn::MlaSpec::of(det, dir, c)?;
        // A DSpark or DFlash2 draft's block is the one `inspect` reads (`checkpoint::block`:
        // `dspark_block_size` too; keys that disagree were refused above).
        let mut dims = det.dims.clone();
        if let Some(b) = det.block_draft.as_ref().and_then(|b| b.block_size) {
            dims.block_size = Some(b);
        }
        let sh = Shape::read(dir, &dims)?;
        let (h, vocab, head_dim, n_layers) = (sh.h, sh.vocab, sh.head_dim, sh.n_layers);
        let mask_id = mask_id(dir, c, vocab)?;
        check_block_kind(dir, c)?;
        let (aux, taps) = taps(dir, det)?;
        let target_layers = target_layers(dir, c, mla.is_some())?;
        let rope = match &mla {
            Some(_) => Rope::plain(2, 1.0), // each MLA layer holds its own table
            None => rope(dir, c, head_dim)?,
        };
        let eps = attn::norm_eps(dir, c)?;

        if (target.vocab, target.hidden) != (vocab, h) {
            return Err(Error::Source {
                path: ck.weights.dir.clone(),
                msg: format!(
                    "the draft needs the target's embedding and lm_head as [{vocab}, {h}], the target has [{}, {}]",
                    target.vocab, target.hidden
                ),
                hint: Some(
                    "--target-checkpoint must be the target model the draft was trained for"
                        .into(),
                ),
            });
        }
        let lg = Logical::new(ck)?;
        let torchspec = det.dialect == Some(Dialect::Torchspec);
        let (fc_n, hn_n, norm_n) = if torchspec {
            (
                "context_proj.weight",
                "context_norm.weight",
                "final_norm.weight",
            )
        } else {
            ("fc.weight", "hidden_norm.weight", "norm.weight")
        };
        let has_layer = |i: usize| {
            lg.shape(&format!("layers.{i}.input_layernorm.weight"))
                .is_some()
        };
        if has_layer(n_layers) || !has_layer(n_layers - 1) {
            let more = if has_layer(n_layers) { "more" } else { "fewer" };
            return Err(Error::source(
                dir,
                format!("holds {more} decoder layers than num_hidden_layers = {n_layers}"),
            )
            .with_hint("num_hidden_layers must count the draft's `layers.N.*` (`kquant inspect` shows both)"));
        }
        let lin = LinearSet::new(exec);
        let vb = Loader::new(&lg, "DFlash draft").with_linears(&lin);
        let layers = (0..n_layers)
            .map(|i| load_layer(&vb, i, &sh, mla.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let fc = vb.linear(fc_n, h, taps.len() * sh.ht)?;
        let (hidden_norm, norm) = (vb.get(hn_n, &[h])?, vb.get(norm_n, &[h])?);
        let var = variant::read(ck, det, c, &vb, sh.block_size, (h, vocab, n_layers))?;
        if var.max_steps > MAX_DEPTHS {
            let msg = format!(
                "block_size {}: the replay handles up to {MAX_DEPTHS} proposals per round",
                sh.block_size
            );
            return Err(Error::source(dir, msg));
        }
        let lm_head = lin.load_as(
            &Logical::new(target.ck)?,
            &target.lm_head,
            "lm_head (target)",
            vocab,
            h,
        )?;
        DFlash {
            m: Model {
                h,
                ht: sh.ht,
                heads: sh.heads,
                kv_heads: sh.kv_heads,
                head_dim,
                inter: sh.inter,
                vocab,
                block_size: sh.block_size,
                kind: var.kind,
                max_steps: var.max_steps,
                anchor_first: var.anchor_first,
                head: var.head,
                convs: var.convs,
                embed_scale: var.embed_scale,
                mask_id: mask_id as u32,
                eps,
                layer_ids: aux.ids.clone(),
                taps,
                target_layers,
                rope,
                layers,
                fc,
                hidden_norm,
                norm,
                embed: target.embed,
                lm_head,
                lin,
            },
            step: None,
        }
        .placed()
    }

    /// On a device, upload the embedding and the norms too when the whole step can stay there
    /// (`device`); otherwise say why not.
    fn placed(mut self) -> Result<DFlash> {
        self.step =
            super::on_device::place(self.lin.exec(), |dev| device::DeviceStep::new(&self, dev))?;
        Ok(self)
    }

    /// The proposals of slots 1..b−1 for the consecutive `roots` (context: the first `len`
    /// rows of the taps) from the whole step on the device, when it runs there; a device
    /// failure is kept for `take_error` and gives no proposals.
    fn on_device(
        &self,
        taps: &[Vec<f32>],
        len: usize,
        x: &[u32],
        roots: (usize, usize),
        b: usize,
    ) -> Option<Vec<Vec<u32>>> {
        let Some(Ok(step)) = &self.step else {
            return None;
        };
        if roots.0 == 0 {
            return None; // no context row: the CPU path's case
        }
        let feats = self.features(taps, len);
        Some(
            super::linears::device_timed(|| step.block_tokens(self, &feats, len, x, roots, b))
                .unwrap_or_else(|(stage, e)| {
                    self.lin.record_step_fault(stage, e);
                    Vec::new()
                }),
        )
    }

    /// Concatenate the taps row by row: `taps[j]` holds at least `len` rows of `ht` values;
    /// the result is `[len, taps.len() · ht]`.
    pub fn features(&self, taps: &[Vec<f32>], len: usize) -> Vec<f32> {
        assert_eq!(taps.len(), self.taps.len(), "one tap per target_layer_id");
        let ht = self.ht;
        let mut f = Vec::with_capacity(len * taps.len() * ht);
        for t in 0..len {
            for tap in taps {
                f.extend_from_slice(&tap[t * ht..(t + 1) * ht]);
            }
        }
        f
    }

    /// The projected context `hidden_norm(fc(feats))`, `[len, h]`.
    pub fn project(&self, feats: &[f32], len: usize) -> Vec<f32> {
        let x = self.fc.apply(feats, len);
        rms_norm(&x, self.h, &self.hidden_norm, self.eps)
    }

    /// Context keys and values of every layer for the rows of `feats` (`[len, K·ht]`):
    /// `k = RoPE(k_norm(k_proj(ctx)), s)`, `v = v_proj(ctx)` with no input_layernorm on ctx.
    pub fn context(&self, feats: &[f32], len: usize) -> Context {
        self.context_with(feats, len, false)
    }

    /// [`DFlash::context`] on the plain reference matmul.
    pub fn context_ref(&self, feats: &[f32], len: usize) -> Context {
        self.context_with(feats, len, true)
    }

    fn context_with(&self, feats: &[f32], len: usize, reference: bool) -> Context {
        let lin = |l: &Linear, x: &[f32], m: usize| {
            if reference {
                l.apply_ref(x, m)
            } else {
                l.apply(x, m)
            }
        };
        let x = lin(&self.fc, feats, len);
        let ctx = rms_norm(&x, self.h, &self.hidden_norm, self.eps);
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for l in &self.layers {
            let (k, v) = l.attn.context(&ctx, len, self.rope_args(), reference);
            ks.push(k);
            vs.push(v);
        }
        Context { len, k: ks, v: vs }
    }

    fn check_roots(&self, ctx: &Context, x: &[u32], roots: &[usize]) {
        for &r in roots {
            assert!(
                r < x.len(),
                "root {r} has no token (sequence of {})",
                x.len()
            );
            assert!(
                r <= ctx.len,
                "root {r} needs context rows < {r}, have {}",
                ctx.len
            );
        }
    }

    /// Block logits, fast path: for each root r, the predicting rows of the block
    /// `[x_r, MASK × (B−1)]` at positions r..r+B−1 that sees context rows < r and every block
    /// row (non-causal): slots 1..B−1 (DFlash, DFlash2; slot i predicts `x[r+i]`), or every row
    /// for an anchor-first DSpark (row i predicts `x[r+1+i]`).
    /// `b` is the block the engine runs ([`DFlash::rows`]): the draft's `block_size`, or 1 + the
    /// tokens it is asked to propose (vLLM's `1 + num_speculative_tokens`, SGLang's
    /// `--speculative-num-draft-tokens`); DSpark's anchor-first block is the tokens proposed.
    /// Returns `[roots.len(), predicting rows, vocab]` through the target's lm_head. All roots'
    /// rows go through each matmul together; attention runs in parallel over roots.
    pub fn blocks(&self, ctx: &Context, x: &[u32], roots: &[usize], b: usize) -> Vec<f32> {
        let normed = self.slots(ctx, x, roots, b);
        self.lm_head
            .apply(&normed, roots.len() * self.predicting(b))
    }

    /// How many rows of a block of `b` predict: all of DSpark's anchor-first block, else the
    /// masks.
    pub fn predicting(&self, b: usize) -> usize {
        if self.anchor_first {
            b
        } else {
            b - 1
        }
    }

    /// The block rows a step of `steps` proposals runs.
    pub fn rows(&self, steps: usize) -> usize {
        if self.anchor_first {
            steps
        } else {
            steps + 1
        }
    }

    /// The embedded block of each root: `[x_r, MASK × (b−1)]`, scaled by `embed_scale`.
    fn embed_blocks(&self, x: &[u32], roots: &[usize], b: usize) -> Vec<f32> {
        let mut hid = Vec::with_capacity(roots.len() * b * self.h);
        for &r in roots {
            hid.extend_from_slice(&self.embed_row(x[r]));
            for _ in 1..b {
                hid.extend_from_slice(&self.embed_row(self.mask_id));
            }
        }
        if self.embed_scale != 1.0 {
            hid.iter_mut().for_each(|v| *v *= self.embed_scale);
        }
        hid
    }

    /// The final-normed predicting rows of every root's block ([`DFlash::blocks`] up to the
    /// head), `[roots.len() · predicting, h]`.
    fn slots(&self, ctx: &Context, x: &[u32], roots: &[usize], b: usize) -> Vec<f32> {
        self.check_roots(ctx, x, roots);
        self.check_block(b);
        let n = roots.len() * b;
        let pos: Vec<usize> = roots.iter().flat_map(|&r| r..r + b).collect();
        let mut hid = self.embed_blocks(x, roots, b);
        for (li, l) in self.layers.iter().enumerate() {
            let w = self.widths(l);
            let (qd, kd, vd) = w.rows();
            let conv = self.convs.get(li);
            let mut xn = rms_norm(&hid, self.h, &l.input_norm, self.eps);
            let c0 = conv.map(|[a, _]| {
                let (y, c) = a.prepare(&xn, n, b, false);
                xn = y;
                c
            });
            let (q, k, v) = l.attn.block_qkv(&xn, n, &pos, self.rope_args(), false);
            let mut attn = vec![0f32; n * w.heads * w.v];
            attn.par_chunks_mut(b * w.heads * w.v)
                .zip(q.par_chunks(b * qd))
                .zip(k.par_chunks(b * kd))
                .zip(v.par_chunks(b * vd))
                .zip(roots.par_iter())
                .for_each(|((((o, q), k), v), &r)| {
                    let c = (&ctx.k[li][..r * kd], &ctx.v[li][..r * vd]);
                    attend_block(&w, c, (q, k, v), o, b);
                });
            let o = l.attn.out(&attn, n, false);
            self.layer_tail(l, conv, (c0, o), &mut hid, (n, b), false);
        }
        self.final_rows(&hid, b)
    }

    /// The softmax widths of layer `l`.
    fn widths(&self, l: &Layer) -> Widths {
        l.attn.widths((self.heads, self.kv_heads, self.head_dim))
    }

    /// What a GQA layer's RoPE and head norms read: the table, head_dim, eps.
    fn rope_args(&self) -> (&Rope, usize, f32) {
        (&self.rope, self.head_dim, self.eps)
    }

    /// A layer after its attention: the attention convolution's second side (DFlash2), the
    /// residual, post_attention_layernorm, the SiLU MLP (convolved around, DFlash2) and its
    /// residual, on `n` rows of blocks of `b`.
    fn layer_tail(
        &self,
        l: &Layer,
        conv: Option<&[conv::GroupedConv; 2]>,
        (c0, mut o): (Option<conv::Coeff>, Vec<f32>),
        hid: &mut [f32],
        (n, b): (usize, usize),
        reference: bool,
    ) {
        let lin = |w: &Linear, x: &[f32]| {
            if reference {
                w.apply_ref(x, n)
            } else {
                w.apply(x, n)
            }
        };
        if let (Some([a, _]), Some(c)) = (conv, &c0) {
            o = a.finish(&o, c, n, b);
        }
        hid.iter_mut().zip(&o).for_each(|(a, y)| *a += y);
        let mut xn = rms_norm(hid, self.h, &l.post_norm, self.eps);
        let c1 = conv.map(|[_, m]| {
            let (y, c) = m.prepare(&xn, n, b, reference);
            xn = y;
            c
        });
        let g = lin(&l.gate, &xn);
        let u = lin(&l.up, &xn);
        let act: Vec<f32> = g.iter().zip(&u).map(|(a, y)| silu(*a) * y).collect();
        let mut dn = lin(&l.down, &act);
        if let (Some([_, m]), Some(c)) = (conv, &c1) {
            dn = m.finish(&dn, c, n, b);
        }
        hid.iter_mut().zip(&dn).for_each(|(a, y)| *a += y);
    }

    /// The predicting rows of every block of `b` rows in `hid`, final-normed.
    fn final_rows(&self, hid: &[f32], b: usize) -> Vec<f32> {
        let (h, skip) = (self.h, b - self.predicting(b));
        let slots: Vec<f32> = hid
            .chunks(b * h)
            .flat_map(|blk| blk[skip * h..].iter().copied())
            .collect();
        rms_norm(&slots, h, &self.norm, self.eps)
    }

    /// [`DFlash::blocks`], plain reference: one root at a time, reference matmuls, the softmax
    /// written out over context rows < r and the block rows.
    pub fn blocks_ref(&self, ctx: &Context, x: &[u32], roots: &[usize], b: usize) -> Vec<f32> {
        let p = self.predicting(b);
        let normed = self.slots_ref(ctx, x, roots, b);
        self.lm_head.apply_ref(&normed, roots.len() * p)
    }

    /// [`DFlash::slots`], plain reference (the rows [`DFlash::blocks_ref`] reads out).
    pub fn slots_ref(&self, ctx: &Context, x: &[u32], roots: &[usize], b: usize) -> Vec<f32> {
        self.check_roots(ctx, x, roots);
        self.check_block(b);
        let mut out = Vec::with_capacity(roots.len() * self.predicting(b) * self.h);
        for &r in roots {
            let pos: Vec<usize> = (r..r + b).collect();
            let mut hid = self.embed_blocks(x, &[r], b);
            for (li, l) in self.layers.iter().enumerate() {
                let w = self.widths(l);
                let conv = self.convs.get(li);
                let mut xn = rms_norm(&hid, self.h, &l.input_norm, self.eps);
                let c0 = conv.map(|[a, _]| {
                    let (y, c) = a.prepare(&xn, b, b, true);
                    xn = y;
                    c
                });
                let (q, k, v) = l.attn.block_qkv(&xn, b, &pos, self.rope_args(), true);
                let attn = attend_ref(&w, (&ctx.k[li], &ctx.v[li], r), (&q, &k, &v), b);
                let o = l.attn.out(&attn, b, true);
                self.layer_tail(l, conv, (c0, o), &mut hid, (b, b), true);
            }
            out.extend(self.final_rows(&hid, b));
        }
        out
    }

    /// A block of `b` rows: the root and masks, from one proposal to the draft's most.
    fn check_block(&self, b: usize) {
        assert!(
            b >= 1 && (1..=self.max_steps).contains(&self.predicting(b)),
            "a block of {b} rows (at most {} proposals)",
            self.max_steps
        );
    }

    /// Argmax of each slot of [`DFlash::blocks`]' logits: `[roots.len(), b−1]` target ids.
    pub fn block_tokens(
        &self,
        ctx: &Context,
        x: &[u32],
        roots: &[usize],
        b: usize,
    ) -> Vec<Vec<u32>> {
        self.block_top2(ctx, x, roots, b)
            .into_iter()
            .map(|blk| blk.iter().map(|t| t.best as u32).collect())
            .collect()
    }

    /// [`DFlash::block_tokens`] with each slot's runner-up and margin ([`Top2`]; on a device,
    /// the argmax only).
    pub fn block_top2(
        &self,
        ctx: &Context,
        x: &[u32],
        roots: &[usize],
        b: usize,
    ) -> Vec<Vec<Top2>> {
        // The lm_head keeps a bounded block of logits at a time (`Linear::top2_rows`; DSpark's
        // and DFlash2's heads hold a chunk's logits whole); the slots are made a bounded number
        // of roots at a time too.
        let p = self.predicting(b);
        let per_root = p * self.vocab.max(self.h);
        let chunk = ((1usize << 26) / per_root).clamp(1, 64);
        let mut out = Vec::with_capacity(roots.len());
        for rs in roots.chunks(chunk) {
            let anchors: Vec<u32> = rs.iter().map(|&r| x[r]).collect();
            let hid = self.slots(ctx, x, rs, b);
            out.extend(self.head.propose(&self.lm_head, &hid, &anchors, p));
        }
        out
    }

    fn embed_row(&self, tok: u32) -> std::borrow::Cow<'_, [f32]> {
        self.embed.row(tok)
    }
}

impl super::Drafter for DFlash {
    fn taps(&self) -> &[usize] {
        &self.taps
    }
    fn target_hidden(&self) -> usize {
        self.ht
    }
    fn vocab(&self) -> usize {
        self.vocab
    }
    /// The engine's query block is 1 + the tokens proposed (vLLM `dflash.py`:
    /// `num_query_per_req = 1 + self.num_speculative_tokens`; SGLang's block is
    /// `--speculative-num-draft-tokens`), at most the draft's `block_size`.
    ///
    /// DSpark's anchor-first block is the tokens proposed (`num_query_per_req =
    /// num_speculative_steps`), at most its `block_size`.
    fn default_steps(&self) -> usize {
        self.max_steps
    }
    fn max_steps(&self) -> Option<usize> {
        Some(self.max_steps)
    }
    fn target_layers(&self) -> Option<usize> {
        self.target_layers
    }
    /// One block pass per root r = max(P, 1)..T−2 (context < r); pair index t = r − 1, bit k
    /// set when slot k+1's token equals `x[r+1+k]` (fixtures/gen/verify/common.py
    /// `dflash_matches`).
    fn matches(&self, x: &[u32], taps: &[Vec<f32>], prompt_len: usize, steps: usize) -> Matches {
        let t_len = x.len();
        let depths = steps;
        let mut m = Matches::empty(depths, prompt_len, t_len);
        let roots: Vec<usize> = (prompt_len.max(1)..t_len.saturating_sub(1)).collect();
        if let Some(&last) = roots.last() {
            let b = self.rows(depths);
            if let Some(blocks) = self.on_device(taps, last, x, (roots[0], roots.len()), b) {
                for (&r, toks) in roots.iter().zip(blocks) {
                    for (k, &t) in toks.iter().enumerate().take(depths) {
                        m.record(x, r - 1, k, t, None);
                    }
                }
                return m;
            }
            // Root r reads context rows < r.
            let feats = self.features(taps, last);
            let ctx = self.context(&feats, last);
            for (&r, toks) in roots.iter().zip(self.block_top2(&ctx, x, &roots, b)) {
                for (k, t) in toks.iter().enumerate().take(depths) {
                    let runner_up = (t.second != usize::MAX).then_some((t.second as u32, t.margin));
                    m.record(x, r - 1, k, t.best as u32, runner_up);
                }
            }
        }
        m
    }
    fn propose(&self, x: &[u32], taps: &[Vec<f32>], steps: usize) -> Vec<u32> {
        let r = x
            .len()
            .checked_sub(1)
            .expect("propose needs the root token");
        let b = self.rows(steps);
        if let Some(mut blocks) = self.on_device(taps, r, x, (r, 1), b) {
            return blocks.pop().unwrap_or_else(|| vec![0; steps]);
        }
        let feats = self.features(taps, r);
        let ctx = self.context(&feats, r);
        self.block_tokens(&ctx, x, &[r], b).remove(0)
    }
    fn linears(&self) -> &LinearSet {
        &self.lin
    }
    fn device_step(&self) -> Option<std::result::Result<(), String>> {
        super::on_device::placement(&self.step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Drafter, FAST_REL_TOL};
    use serde_json::json;
    use std::path::{Path, PathBuf};

    /// The target's depth: `num_target_layers`, except for K3DSparkModel, whose
    /// `num_target_layers` counts its taps and whose depth is `target_num_hidden_layers`.
    #[test]
    fn the_target_depth_key_follows_the_layout() {
        let c = |v: serde_json::Value| Config {
            path: "config.json".into(),
            root: v.as_object().unwrap().clone(),
        };
        let k3 = c(json!({"num_target_layers": 5, "target_num_hidden_layers": 93}));
        let dir = Path::new(".");
        assert_eq!(target_layers(dir, &k3, true).unwrap(), Some(93));
        assert_eq!(target_layers(dir, &k3, false).unwrap(), Some(5));
        assert_eq!(
            target_layers(dir, &c(json!({"num_target_layers": 5})), true).unwrap(),
            None
        );
        let e = target_layers(dir, &c(json!({"target_num_hidden_layers": 0})), true).unwrap_err();
        assert!(
            e.to_string().contains("`target_num_hidden_layers` is 0"),
            "{e}"
        );
    }

    fn repo(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
    }

    /// A copy of a synthetic tiny DFlash fixture with `patch` merged into its config.
    fn tiny(name: &str, patch: Value) -> (tempfile::TempDir, String) {
        tiny_with(name, patch, &[])
    }

    /// [`tiny`] with `extra` f32 tensors (name, shape, values) added to its weights.
    pub(super) fn tiny_with(
        name: &str,
        patch: Value,
        extra: &[(String, Vec<usize>, Vec<f32>)],
    ) -> (tempfile::TempDir, String) {
        use safetensors::tensor::{Dtype, TensorView};
        let src = repo("fixtures/tiny").join(name);
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("model.safetensors");
        if extra.is_empty() {
            std::fs::copy(src.join("model.safetensors"), &out).unwrap();
        } else {
            let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let mut owned: std::collections::BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> = st
                .tensors()
                .into_iter()
                .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
                .collect();
            for (n, s, v) in extra {
                let b = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                owned.insert(n.clone(), (Dtype::F32, s.clone(), b));
            }
            let views: std::collections::BTreeMap<String, TensorView> = owned
                .iter()
                .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
                .collect();
            safetensors::serialize_to_file(views, None, &out).unwrap();
        }
        let mut cfg: Value =
            serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
        for (k, v) in patch.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        std::fs::write(t.path().join("config.json"), cfg.to_string()).unwrap();
        let p = t.path().to_str().unwrap().to_string();
        (t, p)
    }

    pub(super) fn load(spec: &str) -> Result<DFlash> {
        let ck = Checkpoint::open(spec)?;
        let det = ck.detect()?;
        let tgt = Checkpoint::open(repo("fixtures/tiny/target-kimi-k2").to_str().unwrap())?;
        DFlash::load(&ck, &det, TargetHead::read(&tgt)?)
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2000) as f32 / 500.0 - 2.0
            })
            .collect()
    }

    fn rel_err(a: &[f32], b: &[f32]) -> f32 {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        diff / scale
    }

    /// Both name sets (z-lab, TorchSpec), plain and YaRN RoPE: the fast path agrees with the
    /// plain one within FAST_REL_TOL, and `propose` is the block pass's argmax.
    #[test]
    fn fast_path_matches_the_reference_on_the_tiny_drafts() {
        let yarn =
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8});
        for (name, patch) in [
            (
                "dflash-zlab",
                json!({"block_size": 8, "rope_scaling": yarn}),
            ),
            ("dflash-torchspec", json!({"block_size": 6})),
        ] {
            let (_t, p) = tiny(name, patch);
            let d = load(&p).unwrap();
            assert_eq!(
                d.taps,
                [2, 5],
                "target_layer_ids [1, 4], outputs of layer k"
            );
            assert_eq!(
                (d.default_steps(), d.max_steps()),
                (d.block_size - 1, Some(d.block_size - 1))
            );
            if name == "dflash-zlab" {
                assert!(d.rope.attn_factor > 1.0, "YaRN attention factor applied");
            }
            let len = 20;
            let x: Vec<u32> = (0..len as u32).map(|i| (i * 37 + 5) % 255).collect();
            let taps = vec![data(len * 64, 1), data(len * 64, 2)];
            let feats = d.features(&taps, len);
            let (fast, slow) = (d.context(&feats, len), d.context_ref(&feats, len));
            for l in 0..fast.k.len() {
                assert!(rel_err(&fast.k[l], &slow.k[l]) <= FAST_REL_TOL);
                assert!(rel_err(&fast.v[l], &slow.v[l]) <= FAST_REL_TOL);
            }
            let roots = [0, 3, 11, len - 1];
            // The draft's whole block, and the shorter ones an engine runs for fewer tokens.
            for b in [d.block_size, 4, 2] {
                let (l, r) = (
                    d.blocks(&fast, &x, &roots, b),
                    d.blocks_ref(&slow, &x, &roots, b),
                );
                assert_eq!(l.len(), roots.len() * (b - 1) * d.vocab);
                let e = rel_err(&l, &r);
                assert!(e <= FAST_REL_TOL, "{name} block {b}: {e}");
                let toks = d.block_tokens(&fast, &x, &roots, b);
                assert_eq!(
                    d.propose(&x[..12], &taps, b - 1),
                    toks[2],
                    "{name} block {b}"
                );
            }
            // A shorter block is another computation (the slots attend to each other).
            let whole = d.blocks(&fast, &x, &roots, d.block_size);
            let four = d.blocks(&fast, &x, &roots, 4);
            assert_ne!(whole[..3 * d.vocab], four[..3 * d.vocab]);
        }
    }

    #[test]
    fn unsupported_configs_are_refused_by_name() {
        let msg = |patch: Value| {
            let (_t, p) = tiny("dflash-zlab", patch);
            match load(&p) {
                Ok(_) => panic!("loaded"),
                Err(e) => e.to_string(),
            }
        };
        // More proposals than a match mask holds.
        assert!(msg(json!({"block_size": 40})).contains("block_size 40"));
        assert!(
            msg(json!({"block_size": 8, "dflash_config": {"target_layer_ids": [1, 4]}}))
                .contains("mask_token_id")
        );
        assert!(msg(
            json!({"block_size": 8, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
        )
        .contains("llama3"));
        assert!(msg(
            json!({"block_size": 8, "layer_types": ["full_attention", "sliding_attention"]})
        )
        .contains("sliding_attention"));
        assert!(msg(json!({"block_size": 8, "is_causal": true})).contains("`is_causal` is true"));
        assert!(msg(json!({"block_size": 8, "dflash_config": {"mask_token_id": 255, "target_layer_ids": [1, 4], "causal": true}}))
            .contains("`dflash_config.causal` is true"));
        assert!(msg(json!({"block_size": 8, "dflash_config": {"mask_token_id": 255, "target_layer_ids": [1, 4], "use_swa": true}}))
            .contains("`dflash_config.use_swa` is true"));
        // A separately trained mask embedding (vLLM's mask_embedding.pt) is refused by name.
        let (t, p) = tiny("dflash-zlab", json!({"block_size": 8}));
        std::fs::write(t.path().join("mask_embedding.pt"), b"pickle").unwrap();
        let e = load(&p).err().expect("refused").to_string();
        assert!(
            e.contains("mask_embedding.pt") && e.contains("PyTorch pickle"),
            "{e}"
        );
        // Said false, they are what the replay runs.
        let (_t, p) = tiny("dflash-zlab", json!({"block_size": 8, "is_causal": false}));
        assert!(load(&p).is_ok());
        assert!(msg(json!({"block_size": 8, "vocab_size": 300})).contains("[300, 64]"));
        // #38 extras: repeated tap ids and a target of no layers are refused by name.
        assert!(msg(json!({"block_size": 8, "dflash_config": {"mask_token_id": 255, "target_layer_ids": [1, 1]}}))
            .contains("distinct layers"));
        assert!(msg(json!({"block_size": 8, "num_target_layers": 0})).contains("num_target_layers"));
    }
}
