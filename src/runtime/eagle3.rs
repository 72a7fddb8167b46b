//! The EAGLE-3 draft (Llama-style attention) forward on CPU, in the teacher-forced form the
//! exact offline replay needs (shared/reference/verify.md §2.1, §2.5 pass A): depth 0 runs
//! causally over every pair (target taps at t, token x[t+1]); depth k ≥ 1 feeds the previous
//! depth's output back with the ground-truth token x[t+1+k] at RoPE position t+k and attends the
//! depth-0 keys ≤ t plus its own diagonal keys of depths 1..k.
//!
//! Weights are read in any dtype and any quantized layout kquant writes (dequantized at load,
//! `quant::decode`), so a quantized draft runs exactly as its dequantized weights.

use super::ops::{argmax, linear, rms_norm, rope_half, silu, softmax};
use crate::checkpoint::{Checkpoint, Detection, Family};
use crate::error::{Error, Result};
use crate::quant::decode::Logical;
use crate::verify::walk::Matches;

/// A loaded EAGLE-3 draft.
pub struct Eagle3 {
    pub h: usize,
    pub ht: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub inter: usize,
    pub vocab: usize,
    pub draft_vocab: usize,
    pub eps: f32,
    pub theta: f32,
    pub norm_output: bool,
    pub taps: Vec<usize>,
    w: Weights,
}

struct Weights {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    hidden_norm: Vec<f32>,
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    fc: Vec<f32>,
    fc_norm: Option<[Vec<f32>; 3]>,
    norm: Vec<f32>,
    lm_head: Vec<f32>,
    embed: Vec<f32>,
    /// Draft id → target id.
    d2t: Option<Vec<i64>>,
}

fn get(lg: &Logical, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let s = lg.shape(name).ok_or_else(|| Error::Source {
        path: lg.ck.weights.dir.clone(),
        msg: format!("draft has no tensor `{name}`"),
        hint: None,
    })?;
    if s != shape {
        return Err(Error::Tensor {
            path: lg.ck.weights.dir.clone(),
            tensor: name.into(),
            msg: format!("shape {s:?}, expected {shape:?}"),
        });
    }
    Ok(lg.read_f32(name).expect("present"))
}

impl Eagle3 {
    /// Load from a checkpoint detected as an EAGLE-3 Llama-style draft. `embed` supplies the
    /// target's embedding when the draft does not carry one.
    pub fn load(
        ck: &Checkpoint,
        det: &Detection,
        target_embed: Option<Vec<f32>>,
    ) -> Result<Eagle3> {
        if det.family != Family::Eagle3 {
            return Err(Error::Source {
                path: ck.weights.dir.clone(),
                msg: format!(
                    "is `{}`; this runtime runs Llama-style EAGLE-3 drafts",
                    det.family.id()
                ),
                hint: None,
            });
        }
        let d = &det.dims;
        let need = |v: Option<u64>, k: &str| {
            v.map(|x| x as usize).ok_or_else(|| Error::Source {
                path: ck.weights.dir.clone(),
                msg: format!("`{k}` unknown"),
                hint: None,
            })
        };
        let h = need(d.hidden_size, "hidden_size")?;
        let ht = d.target_hidden_size.map(|x| x as usize).unwrap_or(h);
        let heads = need(d.num_attention_heads, "num_attention_heads")?;
        let kv_heads = d.num_key_value_heads.map(|x| x as usize).unwrap_or(heads);
        let head_dim = d.head_dim.map(|x| x as usize).unwrap_or(h / heads);
        let inter = need(d.intermediate_size, "intermediate_size")?;
        let vocab = need(d.vocab_size, "vocab_size")?;
        let draft_vocab = d.draft_vocab_size.map(|x| x as usize).unwrap_or(vocab);
        let c = ck.config.as_ref();
        let num = |k: &str, dflt: f64| {
            c.and_then(|c| c.get(k))
                .and_then(|v| v.as_f64())
                .unwrap_or(dflt)
        };
        let eps = num("rms_norm_eps", 1e-6) as f32;
        let theta = c
            .and_then(|c| {
                c.get("rope_theta")
                    .or_else(|| c.get("rope_parameters").and_then(|r| r.get("rope_theta")))
            })
            .and_then(|v| v.as_f64())
            .unwrap_or(10000.0) as f32;
        let cfg_value = c
            .map(|c| serde_json::Value::Object(c.root.clone()))
            .unwrap_or_default();
        let norm_output = crate::checkpoint::detect::eagle3_feeds_post_norm(det, &cfg_value);
        let taps = det
            .aux_layers
            .as_ref()
            .and_then(|a| a.hidden_states.clone())
            .map(|v| v.into_iter().map(|x| x as usize).collect())
            .unwrap_or_default();
        let p = det
            .layer_prefix
            .clone()
            .unwrap_or_else(|| "midlayer.".into());
        let lg = Logical::new(ck)?;
        let lw = |n: &str, s: &[usize]| get(&lg, &format!("{p}{n}"), s);
        let fc_norm = if lg.shape("fc_norm.0.weight").is_some() {
            Some([
                get(&lg, "fc_norm.0.weight", &[ht])?,
                get(&lg, "fc_norm.1.weight", &[ht])?,
                get(&lg, "fc_norm.2.weight", &[ht])?,
            ])
        } else {
            None
        };
        let embed = match lg.shape("embed_tokens.weight") {
            Some(_) => get(&lg, "embed_tokens.weight", &[vocab, h])?,
            None => target_embed.ok_or_else(|| Error::Source {
                path: ck.weights.dir.clone(),
                msg: "the draft has no embed_tokens and no target embedding was given".into(),
                hint: Some(
                    "pass --target (the target checkpoint) so its embedding can be used".into(),
                ),
            })?,
        };
        if embed.len() != vocab * h {
            return Err(Error::Usage(format!(
                "target embedding has {} values, the draft needs [{vocab}, {h}]",
                embed.len()
            )));
        }
        let d2t = match ck.weights.tensor("d2t") {
            Some(v) if v.shape() == [draft_vocab] => Some(match v.dtype() {
                crate::io::Dtype::I64 => v
                    .data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                _ => v.to_f32().iter().map(|&x| x as i64).collect(),
            }),
            Some(v) => {
                return Err(Error::Tensor {
                    path: ck.weights.dir.clone(),
                    tensor: "d2t".into(),
                    msg: format!("shape {:?}, expected [{draft_vocab}]", v.shape()),
                })
            }
            None => None,
        };
        let (qd, kvd) = (heads * head_dim, kv_heads * head_dim);
        let w = Weights {
            q: lw("self_attn.q_proj.weight", &[qd, 2 * h])?,
            k: lw("self_attn.k_proj.weight", &[kvd, 2 * h])?,
            v: lw("self_attn.v_proj.weight", &[kvd, 2 * h])?,
            o: lw("self_attn.o_proj.weight", &[h, qd])?,
            gate: lw("mlp.gate_proj.weight", &[inter, h])?,
            up: lw("mlp.up_proj.weight", &[inter, h])?,
            down: lw("mlp.down_proj.weight", &[h, inter])?,
            hidden_norm: lw("hidden_norm.weight", &[h])?,
            input_norm: lw("input_layernorm.weight", &[h])?,
            post_norm: lw("post_attention_layernorm.weight", &[h])?,
            fc: get(&lg, "fc.weight", &[h, 3 * ht])?,
            fc_norm,
            norm: get(&lg, "norm.weight", &[h])?,
            lm_head: get(&lg, "lm_head.weight", &[draft_vocab, h])?,
            embed,
            d2t,
        };
        Ok(Eagle3 {
            h,
            ht,
            heads,
            kv_heads,
            head_dim,
            inter,
            vocab,
            draft_vocab,
            eps,
            theta,
            norm_output,
            taps,
            w,
        })
    }

    /// Project the concatenated taps `[n, 3·Ht]` to `[n, H]` (optional per-tap RMSNorm first).
    fn fc(&self, feats: &[f32], n: usize) -> Vec<f32> {
        let x = match &self.w.fc_norm {
            Some(norms) => {
                let mut y = feats.to_vec();
                for r in 0..n {
                    for (j, g) in norms.iter().enumerate() {
                        let s = &mut y
                            [r * 3 * self.ht + j * self.ht..r * 3 * self.ht + (j + 1) * self.ht];
                        let normed = rms_norm(s, self.ht, g, self.eps);
                        s.copy_from_slice(&normed);
                    }
                }
                y
            }
            None => feats.to_vec(),
        };
        linear(&x, n, 3 * self.ht, &self.w.fc, self.h)
    }

    fn embed(&self, tok: u32) -> &[f32] {
        let t = tok as usize;
        &self.w.embed[t * self.h..(t + 1) * self.h]
    }

    /// Draft tokens (target ids) of the logits rows.
    fn tokens(&self, hid: &[f32], n: usize) -> Vec<u32> {
        let normed = rms_norm(hid, self.h, &self.w.norm, self.eps);
        let logits = linear(&normed, n, self.h, &self.w.lm_head, self.draft_vocab);
        logits
            .chunks(self.draft_vocab)
            .map(|row| {
                let i = argmax(row);
                (i as i64 + self.w.d2t.as_ref().map_or(0, |d| d[i])) as u32
            })
            .collect()
    }

    /// Depth-0 draft tokens for every pair t (what the draft proposes after root x[t+1]).
    /// Depth 0 at t depends only on x[..=t+1] and the taps at ..=t, so a sequence can be grown
    /// from it (tests build traces the draft agrees with this way).
    pub fn depth0_tokens(&self, x: &[u32], feats: &[f32]) -> Vec<u32> {
        let pairs = x.len() - 1;
        let m = self.depth_matches_inner(x, feats, 1, 1).1;
        debug_assert_eq!(m.len(), pairs);
        m
    }

    /// Pass A over one sequence: depth matches for `depths` depths. `feats` is `[T, 3·Ht]`
    /// (the taps concatenated low→high), `x` the T tokens, `prompt_len` P.
    pub fn depth_matches(
        &self,
        x: &[u32],
        feats: &[f32],
        prompt_len: usize,
        depths: usize,
    ) -> Matches {
        self.depth_matches_inner(x, feats, prompt_len, depths).0
    }

    fn depth_matches_inner(
        &self,
        x: &[u32],
        feats: &[f32],
        prompt_len: usize,
        depths: usize,
    ) -> (Matches, Vec<u32>) {
        let t_len = x.len();
        let pairs = t_len - 1;
        let (h, hd, nh, nkv) = (self.h, self.head_dim, self.heads, self.kv_heads);
        let group = nh / nkv;
        // Depth 0 over every pair t (token x[t+1], features at t, position t).
        let hid0 = self.fc(&feats[..pairs * 3 * self.ht], pairs);
        let emb0: Vec<f32> = (0..pairs)
            .flat_map(|t| self.embed(x[t + 1]).to_vec())
            .collect();
        let (q0, k0, v0, res0) = self.qkv(&hid0, &emb0, pairs, &(0..pairs).collect::<Vec<_>>());
        let attn0 = self.attend(
            &q0,
            pairs,
            |t, push: &mut dyn FnMut(&[f32], &[f32])| {
                for s in 0..=t {
                    push(
                        &k0[s * nkv * hd..(s + 1) * nkv * hd],
                        &v0[s * nkv * hd..(s + 1) * nkv * hd],
                    );
                }
            },
            group,
        );
        let out0 = self.finish(&attn0, &res0, pairs);
        let start = prompt_len.saturating_sub(1).min(pairs);
        let roots: Vec<usize> = (start..pairs).collect();
        let mut c = vec![0u8; pairs];
        let pick = |v: &[f32], ts: &[usize], width: usize| -> Vec<f32> {
            ts.iter()
                .flat_map(|&t| v[t * width..(t + 1) * width].to_vec())
                .collect()
        };
        let toks = self.tokens(&pick(&out0, &roots, h), roots.len());
        for (i, &t) in roots.iter().enumerate() {
            if x.get(t + 2) == Some(&toks[i]) {
                c[t] |= 1;
            }
        }
        let depth0 = toks.clone();
        // Depths 1..: only roots of the generated region are needed.
        let mut prev = pick(&out0, &roots, h);
        if self.norm_output {
            prev = rms_norm(&prev, h, &self.w.norm, self.eps);
        }
        let mut diag_k: Vec<Vec<f32>> = Vec::new();
        let mut diag_v: Vec<Vec<f32>> = Vec::new();
        for d in 1..depths {
            let n = roots.len();
            let emb: Vec<f32> = roots
                .iter()
                .flat_map(|&t| self.embed(*x.get(t + 1 + d).unwrap_or(&0)).to_vec())
                .collect();
            let pos: Vec<usize> = roots.iter().map(|&t| t + d).collect();
            let (q, k, v, res) = self.qkv(&prev, &emb, n, &pos);
            diag_k.push(k);
            diag_v.push(v);
            let attn = self.attend(
                &q,
                n,
                |i, push: &mut dyn FnMut(&[f32], &[f32])| {
                    let t = roots[i];
                    for s in 0..=t {
                        push(
                            &k0[s * nkv * hd..(s + 1) * nkv * hd],
                            &v0[s * nkv * hd..(s + 1) * nkv * hd],
                        );
                    }
                    for (dk, dv) in diag_k.iter().zip(&diag_v) {
                        push(
                            &dk[i * nkv * hd..(i + 1) * nkv * hd],
                            &dv[i * nkv * hd..(i + 1) * nkv * hd],
                        );
                    }
                },
                group,
            );
            let out = self.finish(&attn, &res, n);
            let toks = self.tokens(&out, n);
            for (i, &t) in roots.iter().enumerate() {
                if x.get(t + 2 + d) == Some(&toks[i]) {
                    c[t] |= 1 << d;
                }
            }
            prev = if self.norm_output {
                rms_norm(&out, h, &self.w.norm, self.eps)
            } else {
                out
            };
        }
        (
            Matches {
                depths,
                prompt_len,
                total_len: t_len,
                c,
            },
            depth0,
        )
    }

    /// Input norms, concat, q/k/v with RoPE. Returns (q, k, v, residual).
    fn qkv(
        &self,
        hid: &[f32],
        emb: &[f32],
        n: usize,
        pos: &[usize],
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let h = self.h;
        let e = rms_norm(emb, h, &self.w.input_norm, self.eps);
        let g = rms_norm(hid, h, &self.w.hidden_norm, self.eps);
        let mut a = vec![0f32; n * 2 * h];
        for r in 0..n {
            a[r * 2 * h..r * 2 * h + h].copy_from_slice(&e[r * h..(r + 1) * h]);
            a[r * 2 * h + h..(r + 1) * 2 * h].copy_from_slice(&g[r * h..(r + 1) * h]);
        }
        let (qd, kvd) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut q = linear(&a, n, 2 * h, &self.w.q, qd);
        let mut k = linear(&a, n, 2 * h, &self.w.k, kvd);
        let v = linear(&a, n, 2 * h, &self.w.v, kvd);
        for r in 0..n {
            rope_half(
                &mut q[r * qd..(r + 1) * qd],
                self.head_dim,
                pos[r],
                self.theta,
            );
            rope_half(
                &mut k[r * kvd..(r + 1) * kvd],
                self.head_dim,
                pos[r],
                self.theta,
            );
        }
        (q, k, v, hid.to_vec())
    }

    /// Scaled dot-product attention of each query row over the keys `keys(row)` supplies.
    fn attend(
        &self,
        q: &[f32],
        n: usize,
        keys: impl Fn(usize, &mut dyn FnMut(&[f32], &[f32])) + Sync,
        group: usize,
    ) -> Vec<f32> {
        use rayon::prelude::*;
        let (hd, nh, qd) = (self.head_dim, self.heads, self.heads * self.head_dim);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![0f32; n * qd];
        out.par_chunks_mut(qd).enumerate().for_each(|(r, o)| {
            let mut ks: Vec<Vec<f32>> = Vec::new();
            let mut vs: Vec<Vec<f32>> = Vec::new();
            keys(r, &mut |k, v| {
                ks.push(k.to_vec());
                vs.push(v.to_vec());
            });
            for head in 0..nh {
                let kvh = head / group;
                let qh = &q[r * qd + head * hd..r * qd + (head + 1) * hd];
                let mut sc: Vec<f32> = ks
                    .iter()
                    .map(|k| {
                        qh.iter()
                            .zip(&k[kvh * hd..(kvh + 1) * hd])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            * scale
                    })
                    .collect();
                softmax(&mut sc);
                let oh = &mut o[head * hd..(head + 1) * hd];
                for (p, v) in sc.iter().zip(&vs) {
                    for (x, y) in oh.iter_mut().zip(&v[kvh * hd..(kvh + 1) * hd]) {
                        *x += p * y;
                    }
                }
            }
        });
        out
    }

    /// o_proj + residual, then the MLP block. Returns the pre-norm hidden state.
    fn finish(&self, attn: &[f32], res: &[f32], n: usize) -> Vec<f32> {
        let h = self.h;
        let o = linear(attn, n, self.heads * self.head_dim, &self.w.o, h);
        let h1: Vec<f32> = o.iter().zip(res).map(|(a, b)| a + b).collect();
        let x = rms_norm(&h1, h, &self.w.post_norm, self.eps);
        let g = linear(&x, n, h, &self.w.gate, self.inter);
        let u = linear(&x, n, h, &self.w.up, self.inter);
        let act: Vec<f32> = g.iter().zip(&u).map(|(a, b)| silu(*a) * b).collect();
        let dn = linear(&act, n, self.inter, &self.w.down, h);
        h1.iter().zip(&dn).map(|(a, b)| a + b).collect()
    }
}

impl super::Drafter for Eagle3 {
    fn taps(&self) -> &[usize] {
        &self.taps
    }
    fn target_hidden(&self) -> usize {
        self.ht
    }
    fn vocab(&self) -> usize {
        self.vocab
    }
    fn depths(&self, steps: usize) -> usize {
        steps
    }
    fn matches(&self, x: &[u32], taps: &[Vec<f32>], prompt_len: usize, steps: usize) -> Matches {
        let ht = self.ht;
        let feats: Vec<f32> = (0..x.len())
            .flat_map(|t| {
                taps.iter()
                    .flat_map(move |tap| tap[t * ht..(t + 1) * ht].to_vec())
            })
            .collect();
        self.depth_matches(x, &feats, prompt_len, steps)
    }
}
