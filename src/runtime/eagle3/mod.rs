//! The EAGLE-3 draft forward on CPU, for both attention variants (Llama-style GQA in
//! `llama_attn`, DeepSeek MLA in `mla_attn`; everything else — fc over the taps, the two input
//! norms, residual, SwiGLU MLP, final norm, lm_head, d2t — is shared here).
//!
//! Two forms: the teacher-forced pass the exact offline replay needs (docs/verify.md, "What it computes"
//! §2.1, §2.5 pass A; `Eagle3Base.forward_ttt` in fixtures/gen/verify/common.py): depth 0 runs
//! causally over every pair (target taps at t, token x[t+1]); depth k ≥ 1 feeds the previous
//! depth's output back with the ground-truth token x[t+1+k] at RoPE position t+k and attends the
//! depth-0 keys ≤ t plus its own diagonal keys of depths 1..k. And the engine's draft step
//! ([`Drafter::propose`](super::Drafter::propose)): the same chain from the last pair, each depth
//! fed the draft's own previous proposal instead of the ground truth.
//!
//! Weights are read in any dtype and any quantized layout kquant writes (dequantized at load,
//! `quant::decode`), so a quantized draft runs exactly as its dequantized weights; every linear
//! (fc, the attention projections, gate/up/down, lm_head) goes through the hook in
//! [`super::linears`], which can instead run the quantized ones on a device ([`Eagle3::load_on`]).

mod attention;
mod depth;
pub mod device;
mod llama_attn;
mod load;
mod mla_attn;
mod model;
mod source;

pub use super::embed::Embedding;
pub use attention::{Attention, Qkv};
pub use depth::{DepthOut, NOT_COMPUTED};
pub use llama_attn::LlamaAttention;
pub use mla_attn::{MlaAttention, MlaShape};
pub use model::Model;

use super::linears::LinearSet;
use super::on_device::Placed;
use crate::ops::{rms_norm, silu, softmax, top2};
use crate::runtime::matches::Matches;
use depth::{not_computed, still_accepted, Feed};

/// A loaded EAGLE-3 draft (Llama-style or MLA): its [`Model`], and where its step runs.
pub type Eagle3 = Placed<Model, device::DeviceStep>;

impl Eagle3 {
    /// On a device, upload the embedding and the norms too when the whole step can stay there
    /// (`device`); otherwise say why not.
    fn place_step(&mut self) -> crate::error::Result<()> {
        self.step =
            super::on_device::place(self.lin.exec(), |dev| device::DeviceStep::new(self, dev))?;
        Ok(())
    }

    /// Project the concatenated taps `[n, 3·Ht]` to `[n, H]` (optional per-tap RMSNorm first).
    pub fn fc(&self, feats: &[f32], n: usize) -> Vec<f32> {
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
        self.w.fc.apply(&x, n)
    }

    /// Embedding rows of `toks`, `[toks.len(), H]`.
    fn embed(&self, toks: impl IntoIterator<Item = u32>) -> Vec<f32> {
        self.w.embed.rows(toks)
    }

    /// Depth-0 draft tokens for every pair t (what the draft proposes after root x[t+1]).
    /// Depth 0 at t depends only on x[..=t+1] and the taps at ..=t, so a sequence can be grown
    /// from it (tests build traces the draft agrees with this way).
    pub fn depth0_tokens(&self, x: &[u32], feats: &[f32]) -> Vec<u32> {
        self.forward(x, feats, 0, 1, Feed::Truth, false)
            .pop()
            .map(|d| d.pred)
            .unwrap_or_default()
    }

    /// The teacher-forced pass (`forward_ttt` of the Python reference) over every pair
    /// t = 0..T-2: per depth k < `depths`, the logits, the layer output and the proposal of each
    /// row. `feats` is `[≥ T-1, 3·Ht]` (the taps concatenated low→high), `x` the T tokens. Row
    /// t of depth k is fed x[t+1+k] (token 0 past the end, as the reference pads), so rows
    /// t > T-2-k are padding.
    pub fn teacher_forced(&self, x: &[u32], feats: &[f32], depths: usize) -> Vec<DepthOut> {
        self.forward(x, feats, 0, depths, Feed::Truth, true)
    }

    /// Pass A over one sequence: depth matches for `depths` depths. `feats` is `[≥ T-1, 3·Ht]`
    /// (the taps concatenated low→high), `x` the T tokens, `prompt_len` P.
    pub fn depth_matches(
        &self,
        x: &[u32],
        feats: &[f32],
        prompt_len: usize,
        depths: usize,
    ) -> Matches {
        self.matches_fed(x, feats, prompt_len, depths, Feed::Truth)
    }

    /// Depth matches over one sequence, each depth fed as `feed` says. With `Feed::Accepted`
    /// ([`Drafter::matches_accepted`](super::Drafter::matches_accepted)) depth k of a root is
    /// computed only where its depths < k all matched: the leading-match counts (so the walk's
    /// accept length, the all-positions mean and the conditional rates) are the full pass's
    /// exactly, at the cost of the accepted rows only; the bits after a root's first miss are
    /// 0, so the unconditional rates cannot be read.
    fn matches_fed(
        &self,
        x: &[u32],
        feats: &[f32],
        prompt_len: usize,
        depths: usize,
        feed: Feed,
    ) -> Matches {
        let pairs = x.len().saturating_sub(1);
        let start = prompt_len.saturating_sub(1).min(pairs);
        let outs = self.forward(x, feats, start, depths, feed, false);
        let mut m = Matches::empty(depths, prompt_len, x.len());
        for (d, out) in outs.iter().enumerate() {
            for (i, &p) in out.pred.iter().enumerate() {
                let second = out.second[i];
                let runner_up = (second != NOT_COMPUTED).then_some((second, out.margin[i]));
                m.record(x, start + i, d, p, runner_up);
            }
        }
        m
    }

    /// `[rows, 3·Ht]`: the taps of each of the first `rows` positions, concatenated.
    fn feats(&self, taps: &[Vec<f32>], rows: usize) -> Vec<f32> {
        let ht = self.ht;
        (0..rows)
            .flat_map(|t| taps.iter().flat_map(move |tap| &tap[t * ht..(t + 1) * ht]))
            .copied()
            .collect()
    }

    /// The draft over rows (pairs) `start..T-1` for `depths` depths. Depth 0 keys cover every
    /// pair (a row attends all depth-0 keys ≤ t); queries, outputs and later depths only the
    /// rows asked for.
    fn forward(
        &self,
        x: &[u32],
        feats: &[f32],
        start: usize,
        depths: usize,
        feed: Feed,
        keep_logits: bool,
    ) -> Vec<DepthOut> {
        let pairs = x.len().saturating_sub(1);
        let start = start.min(pairs);
        let n = pairs - start;
        if n == 0 {
            return (0..depths).map(|_| not_computed(0)).collect();
        }
        assert!(
            feats.len() >= pairs * 3 * self.ht,
            "taps: {} values, need [{pairs}, {}]",
            feats.len(),
            3 * self.ht
        );
        // On a device that holds the whole step, pass A and the chain run there.
        if let Some(Ok(step)) = &self.step {
            if !keep_logits && self.lin.collects(&self.w.lm_head.module).is_none() {
                return super::linears::device_timed(|| {
                    step.forward(self, x, feats, start, depths, feed)
                })
                .unwrap_or_else(|(stage, e)| {
                    self.lin.record_step_fault(stage, e);
                    (0..depths).map(|_| not_computed(n)).collect()
                });
            }
        }
        let a = self.attention();
        let (h, qd) = (self.h, a.heads() * a.qk_dim());
        let (kd, vd) = (a.kv_heads() * a.qk_dim(), a.kv_heads() * a.v_dim());
        let rows = |v: &[f32], width: usize| v[start * width..pairs * width].to_vec();
        // Depth 0: pair t is (taps at t, token x[t+1]) at position t.
        let hid0 = self.fc(&feats[..pairs * 3 * self.ht], pairs);
        let emb0 = self.embed((0..pairs).map(|t| x[t + 1]));
        let pos0: Vec<usize> = (0..pairs).collect();
        let kv0 = a.qkv(&self.attn_input(&hid0, &emb0, pairs), pairs, &pos0);
        let mut q = rows(&kv0.q, qd);
        let mut res = rows(&hid0, h);
        // The rows (indices into start..pairs) a depth computes: every row, or with
        // `Feed::Accepted` those whose depths so far all matched (a row's outputs do not depend
        // on the rows beside it, so they are the full pass's rows exactly).
        let mut live: Vec<usize> = (0..n).collect();
        // Each later depth's keys and values, over its live rows, and the slot of row i in them.
        let mut diag: Vec<(Vec<f32>, Vec<f32>, Vec<usize>)> = Vec::new();
        let mut outs: Vec<DepthOut> = Vec::new();
        for d in 0..depths {
            let truth = |i: usize| x.get(start + i + 1 + d).copied().unwrap_or(0);
            if d > 0 {
                if let Feed::Accepted = feed {
                    let keep = still_accepted(&live, &outs[d - 1].pred, truth);
                    res = keep
                        .iter()
                        .flat_map(|&s| res[s * h..(s + 1) * h].iter().copied())
                        .collect();
                    live = keep.iter().map(|&s| live[s]).collect();
                }
                let m = live.len();
                let toks: Vec<u32> = match feed {
                    Feed::Truth | Feed::Accepted => live.iter().map(|&i| truth(i)).collect(),
                    Feed::Own => live.iter().map(|&i| outs[d - 1].pred[i]).collect(),
                };
                let emb = self.embed(toks.iter().copied());
                let pos: Vec<usize> = live.iter().map(|&i| start + i + d).collect();
                let e = a.qkv(&self.attn_input(&res, &emb, m), m, &pos);
                q = e.q;
                let mut slot = vec![usize::MAX; n];
                for (s, &i) in live.iter().enumerate() {
                    slot[i] = s;
                }
                diag.push((e.k, e.v, slot));
            }
            let m = live.len();
            if m == 0 {
                outs.push(not_computed(n));
                continue;
            }
            let attn = self.attend(&q, m, |r| {
                let i = live[r];
                let t = start + i;
                let mut kv: Vec<(&[f32], &[f32])> = (0..=t)
                    .map(|s| (&kv0.k[s * kd..(s + 1) * kd], &kv0.v[s * vd..(s + 1) * vd]))
                    .collect();
                kv.extend(diag.iter().map(|(k, v, slot)| {
                    let s = slot[i];
                    (&k[s * kd..(s + 1) * kd], &v[s * vd..(s + 1) * vd])
                }));
                kv
            });
            let g = self.finish(&attn, &res, m);
            let (out, next) = self.depth_out(g, &live, n, feed, keep_logits);
            res = next;
            outs.push(out);
        }
        outs
    }

    /// Depth outputs from the layer output `g` (`[live.len(), H]`) of the rows `live` (of
    /// `n`): the final norm, then the lm_head's proposal and runner-up per row (the logits
    /// too with `keep_logits`; nothing where a calibration only records the lm_head's input);
    /// and the residual the next depth is fed.
    fn depth_out(
        &self,
        g: Vec<f32>,
        live: &[usize],
        n: usize,
        feed: Feed,
        keep_logits: bool,
    ) -> (DepthOut, Vec<f32>) {
        let (h, m) = (self.h, live.len());
        let normed = rms_norm(&g, h, &self.w.norm, self.eps);
        // A calibration reads none of the lm_head's outputs (the teacher-forced depths are
        // fed the trace's tokens, not the proposals): it records the lm_head's input when it
        // quantizes the lm_head, and skips the product.
        let collects = self.lin.collects(&self.w.lm_head.module);
        if matches!(feed, Feed::Truth) && !keep_logits && collects.is_some() {
            if collects == Some(true) {
                self.w.lm_head.observe_only(&normed);
            }
            let res = if self.norm_output { normed } else { g.clone() };
            return (
                DepthOut {
                    hidden: g,
                    ..not_computed(n)
                },
                res,
            );
        }
        // Pass A and the chain need only each row's argmax and runner-up; the logits are
        // kept for the teacher-forced pass the tests compare with the reference.
        let (logits, best) = if keep_logits {
            let l = self.w.lm_head.apply(&normed, m);
            let best = l.chunks(self.draft_vocab).map(top2).collect::<Vec<_>>();
            (l, best)
        } else {
            (Vec::new(), self.w.lm_head.top2_rows(&normed, m))
        };
        let mut pred = vec![NOT_COMPUTED; n];
        let mut second = vec![NOT_COMPUTED; n];
        let mut margin = vec![f32::NAN; n];
        for (&i, b) in live.iter().zip(best) {
            pred[i] = self.to_target(b.best);
            if b.second != usize::MAX {
                second[i] = self.to_target(b.second);
                margin[i] = b.margin;
            }
        }
        let res = if self.norm_output { normed } else { g.clone() };
        (
            DepthOut {
                logits,
                hidden: g,
                pred,
                second,
                margin,
            },
            res,
        )
    }

    /// `cat(input_layernorm(emb), hidden_norm(hid))`, the `[n, 2H]` attention input.
    fn attn_input(&self, hid: &[f32], emb: &[f32], n: usize) -> Vec<f32> {
        let h = self.h;
        let e = rms_norm(emb, h, &self.w.input_norm, self.eps);
        let g = rms_norm(hid, h, &self.w.hidden_norm, self.eps);
        let mut a = vec![0f32; n * 2 * h];
        for r in 0..n {
            a[r * 2 * h..r * 2 * h + h].copy_from_slice(&e[r * h..(r + 1) * h]);
            a[r * 2 * h + h..(r + 1) * 2 * h].copy_from_slice(&g[r * h..(r + 1) * h]);
        }
        a
    }

    /// Scaled dot-product attention of each query row over the (key, value) entries
    /// `entries(row)` lists (`[kv_heads · qk_dim]` and `[kv_heads · v_dim]` each). Returns
    /// `[n, heads · v_dim]`.
    fn attend<'k>(
        &self,
        q: &[f32],
        n: usize,
        entries: impl Fn(usize) -> Vec<(&'k [f32], &'k [f32])> + Sync,
    ) -> Vec<f32> {
        use rayon::prelude::*;
        let a = self.attention();
        let (nh, dq, dv) = (a.heads(), a.qk_dim(), a.v_dim());
        let (group, scale) = (nh / a.kv_heads(), a.scale());
        let mut out = vec![0f32; n * nh * dv];
        out.par_chunks_mut(nh * dv).enumerate().for_each(|(r, o)| {
            let kv = entries(r);
            for head in 0..nh {
                let kvh = head / group;
                let qh = &q[(r * nh + head) * dq..(r * nh + head + 1) * dq];
                let mut sc: Vec<f32> = kv
                    .iter()
                    .map(|(k, _)| {
                        qh.iter()
                            .zip(&k[kvh * dq..(kvh + 1) * dq])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            * scale
                    })
                    .collect();
                softmax(&mut sc);
                let oh = &mut o[head * dv..(head + 1) * dv];
                for (p, (_, v)) in sc.iter().zip(&kv) {
                    for (x, y) in oh.iter_mut().zip(&v[kvh * dv..(kvh + 1) * dv]) {
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
        let o = self.attn.out(attn, n);
        let h1: Vec<f32> = o.iter().zip(res).map(|(a, b)| a + b).collect();
        let x = rms_norm(&h1, h, &self.w.post_norm, self.eps);
        let g = self.w.gate.apply(&x, n);
        let u = self.w.up.apply(&x, n);
        let act: Vec<f32> = g.iter().zip(&u).map(|(a, b)| silu(*a) * b).collect();
        let dn = self.w.down.apply(&act, n);
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
    fn matches(&self, x: &[u32], taps: &[Vec<f32>], prompt_len: usize, steps: usize) -> Matches {
        let feats = self.feats(taps, x.len().saturating_sub(1));
        self.depth_matches(x, &feats, prompt_len, steps)
    }
    fn matches_accepted(
        &self,
        x: &[u32],
        taps: &[Vec<f32>],
        prompt_len: usize,
        steps: usize,
    ) -> Option<Matches> {
        let feats = self.feats(taps, x.len().saturating_sub(1));
        Some(self.matches_fed(x, &feats, prompt_len, steps, Feed::Accepted))
    }
    fn propose(&self, x: &[u32], taps: &[Vec<f32>], steps: usize) -> Vec<u32> {
        let pairs = x.len().saturating_sub(1);
        if pairs == 0 {
            return Vec::new();
        }
        let feats = self.feats(taps, pairs);
        self.forward(x, &feats, pairs - 1, steps, Feed::Own, false)
            .into_iter()
            .map(|d| d.pred[0])
            .collect()
    }
    fn linears(&self) -> &LinearSet {
        &self.lin
    }
    fn device_step(&self) -> Option<Result<(), String>> {
        super::on_device::placement(&self.step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Checkpoint, Family};
    use crate::io::writer::{TensorSpec, WriteOptions, Writer};
    use crate::io::Dtype;
    use crate::ops::gemm::{matmul_nt, Rows};
    use crate::runtime::linears::Exec;
    use crate::runtime::rope::Rope;
    use crate::runtime::Drafter;
    use std::path::{Path, PathBuf};

    fn fixture(rel: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
    }

    fn load(rel: &str) -> Eagle3 {
        load_on(rel, Exec::F32)
    }

    fn load_on(rel: &str, exec: Exec) -> Eagle3 {
        let ck = Checkpoint::open(fixture(rel).to_str().unwrap()).unwrap();
        let det = ck.detect().unwrap();
        let embed = Checkpoint::open(fixture("fixtures/tiny/target-kimi-k2").to_str().unwrap())
            .unwrap()
            .weights
            .tensor("model.embed_tokens.weight")
            .unwrap()
            .to_f32();
        Eagle3::load_on(&ck, &det, Some(embed), exec).unwrap()
    }

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
        rand(n, seed)
            .iter()
            .map(|v| ((v + 1.0) * 0.5 * vocab as f32) as u32 % vocab as u32)
            .collect()
    }

    /// A copy of fixture `src` in `out` with tensors renamed (`rename`), `extra` tensors (F32)
    /// added, names matching `drop` left out, and config.json edited by `edit`.
    fn rewrite(
        src: &str,
        out: &Path,
        rename: impl Fn(&str) -> String,
        drop: impl Fn(&str) -> bool,
        extra: &[(&str, Vec<usize>, Vec<f32>)],
        edit: impl Fn(&mut serde_json::Value),
    ) {
        let w = crate::io::source::open(fixture(src).to_str().unwrap()).unwrap();
        let mut specs: Vec<TensorSpec> = w
            .infos()
            .filter(|t| !drop(&t.name))
            .map(|t| TensorSpec::new(rename(&t.name), t.dtype, t.shape.clone()))
            .collect();
        for (n, shape, _) in extra {
            specs.push(TensorSpec::new(*n, Dtype::F32, shape.clone()));
        }
        let mut wr = Writer::create(out, specs, WriteOptions::default()).unwrap();
        for name in wr.order().into_iter().map(String::from).collect::<Vec<_>>() {
            match extra.iter().find(|e| e.0 == name) {
                Some((_, _, v)) => {
                    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    wr.write(&name, &b).unwrap();
                }
                None => {
                    let orig = w.infos().find(|t| rename(&t.name) == name).unwrap();
                    wr.write(&name, w.tensor(&orig.name).unwrap().data).unwrap();
                }
            }
        }
        let mut cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture(src).join("config.json")).unwrap())
                .unwrap();
        edit(&mut cfg);
        wr.add_file("config.json", &serde_json::to_vec(&cfg).unwrap())
            .unwrap();
        wr.finish().unwrap();
    }

    /// The layer prefix (`midlayer.` vs `layers.0.`) changes nothing, and a forward over rows
    /// `start..` is exactly those rows of the full teacher-forced pass (the replay asks for
    /// the generated region only).
    #[test]
    fn mla_layouts_agree_and_rows_do_not_depend_on_start() {
        let a = load("fixtures/tiny/eagle3-mla-torchspec");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("d");
        rewrite(
            "fixtures/tiny/eagle3-mla-torchspec",
            &out,
            |n| n.replace("midlayer.", "layers.0."),
            |_| false,
            &[],
            |_| {},
        );
        let b = load(out.to_str().unwrap());
        assert_eq!(b.attention().heads(), a.attention().heads());
        assert_eq!(
            (a.family.clone(), b.family.clone()),
            (Family::Eagle3Mla, Family::Eagle3Mla)
        );
        let t_len = 24;
        let x = tokens(t_len, a.vocab, 3);
        let feats = rand(t_len * 3 * a.ht, 5);
        let fa = a.teacher_forced(&x, &feats, 3);
        let fb = b.teacher_forced(&x, &feats, 3);
        for (p, q) in fa.iter().zip(&fb) {
            assert_eq!(p.logits, q.logits);
            assert_eq!(p.hidden, q.hidden);
        }
        for d in [&a, &load("fixtures/tiny/eagle3-specforge")] {
            let full = d.teacher_forced(&x, &feats, 3);
            for start in [1, 9, t_len - 2] {
                let part = d.forward(&x, &feats, start, 3, Feed::Truth, true);
                for (p, q) in part.iter().zip(&full) {
                    assert_eq!(p.pred, q.pred[start..]);
                    assert_eq!(p.logits, q.logits[start * d.draft_vocab..]);
                    assert_eq!(p.hidden, q.hidden[start * d.h..]);
                }
            }
        }
    }

    /// The chain's proposals are what the teacher-forced pass predicts when x continues with
    /// them (both families).
    #[test]
    fn propose_is_the_teacher_forced_chain() {
        for rel in [
            "fixtures/tiny/eagle3-mla-torchspec",
            "fixtures/tiny/eagle3-specforge",
        ] {
            let d = load(rel);
            let t_len = 20;
            let feats = rand((t_len + 3) * 3 * d.ht, 7);
            let taps: Vec<Vec<f32>> = (0..3)
                .map(|j| {
                    (0..t_len - 1)
                        .flat_map(|t| feats[(t * 3 + j) * d.ht..(t * 3 + j + 1) * d.ht].to_vec())
                        .collect()
                })
                .collect();
            let x = tokens(t_len, d.vocab, 11);
            let p = d.propose(&x, &taps, 3);
            assert_eq!(p.len(), 3);
            let mut ext = x.clone();
            ext.extend(&p);
            let tf = d.teacher_forced(&ext, &feats, 3);
            for k in 0..3 {
                assert_eq!(tf[k].pred[t_len - 2], p[k], "{rel} depth {k}");
            }
            assert!(
                d.propose(&x[..1], &taps, 3).is_empty(),
                "no pair before the root"
            );
        }
    }

    /// The MLA fixture with `q_lora_rank`, the source of [`q_proj_variant`].
    const MLA: &str = "fixtures/tiny/eagle3-mla-torchspec";

    /// [`MLA`] loaded, with the shape of the `q_proj` that replaces its low-rank query:
    /// `(draft, 2H, heads · qk_dim)`.
    fn mla_with_lora() -> (Eagle3, usize, usize) {
        let lora = load(MLA);
        let a = lora.attention();
        let (h2, qd) = (2 * lora.h, a.heads() * a.qk_dim());
        (lora, h2, qd)
    }

    /// The MLA fixture `src` in `out` with `q_lora_rank: null`: one `q_proj` (`[qd, 2H]`, F32)
    /// instead of q_a / q_a_layernorm / q_b.
    fn q_proj_variant(src: &str, out: &Path, q_proj: Vec<f32>, shape: [usize; 2]) {
        rewrite(
            src,
            out,
            |n| n.to_string(),
            |n| n.contains(".q_a_") || n.contains(".q_b_"),
            &[("midlayer.self_attn.q_proj.weight", shape.to_vec(), q_proj)],
            |c| c["q_lora_rank"] = serde_json::Value::Null,
        );
    }

    /// `q_lora_rank: null`: one `q_proj` on the 2H input replaces q_a/q_a_layernorm/q_b; the
    /// keys and values are untouched.
    #[test]
    fn mla_q_proj_without_q_lora() {
        let (src, (lora, h2, qd)) = (MLA, mla_with_lora());
        let a = lora.attention();
        let q_proj = rand(qd * h2, 13);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("d");
        q_proj_variant(src, &out, q_proj.clone(), [qd, h2]);
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture(src).join("config.json")).unwrap())
                .unwrap();
        let full = load(out.to_str().unwrap());
        let f = full.attention();
        assert_eq!(
            (f.heads(), f.qk_dim(), f.scale()),
            (a.heads(), a.qk_dim(), a.scale())
        );
        let n = 5;
        let x = rand(n * h2, 17);
        let pos = [0, 3, 7, 100, 4095];
        let (p, q) = (f.qkv(&x, n, &pos), a.qkv(&x, n, &pos));
        assert_eq!((&p.k, &p.v), (&q.k, &q.v));
        let mut want = matmul_nt(&x, n, h2, Rows::F32(&q_proj), qd);
        // The reference rotation: the config's YaRN table on the last 8 (rope) dims of each
        // 16 + 8 query head.
        let (nope, rope_dim) = (16, 8);
        assert_eq!(a.qk_dim(), nope + rope_dim);
        let (rope, _) = Rope::from_config(rope_dim, 50000.0, Some(&cfg["rope_scaling"]));
        let dq = a.qk_dim();
        for (r, &ps) in pos.iter().enumerate() {
            for head in 0..a.heads() {
                let s = &mut want[(r * a.heads() + head) * dq..(r * a.heads() + head + 1) * dq];
                rope.apply_interleaved(&mut s[nope..], ps);
            }
        }
        assert_eq!(p.q, want);
    }

    /// The whole step on the device with MLA's full `q_proj` (no `q_lora_rank`) and with the
    /// Llama draft: every row's proposal at every depth equals the per-linear device path's (both
    /// round each linear's input to bf16; the kernels' reduction order may flip a near-tie, at most
    /// one row in 30), for the teacher-forced pass and for the rows a miss leaves (`Accepted`).
    #[test]
    fn the_device_step_proposes_what_the_per_linear_path_proposes() {
        let (src, (_, h2, qd)) = (MLA, mla_with_lora());
        // bf16-exact values: an F32 weight the device takes as it is.
        let q_proj: Vec<f32> = rand(qd * h2, 13)
            .iter()
            .map(|&v| half::bf16::from_f32(v * 0.2).to_f32())
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("d");
        q_proj_variant(src, &out, q_proj, [qd, h2]);
        let emu = || Exec::device(Some(std::sync::Arc::new(crate::gpu::CpuEmu::nvidia())));
        for rel in [out.to_str().unwrap(), "fixtures/tiny/eagle3-specforge"] {
            let (w, p) = (load_on(rel, emu()), load_on(rel, emu().per_linear()));
            assert_eq!(w.device_step(), Some(Ok(())), "{rel}");
            let t_len = 40;
            let x = tokens(t_len, w.vocab, 21);
            let feats = rand(t_len * 3 * w.ht, 23);
            for feed in [Feed::Truth, Feed::Accepted, Feed::Own] {
                let (a, b) = (
                    w.forward(&x, &feats, 5, 3, feed, false),
                    p.forward(&x, &feats, 5, 3, feed, false),
                );
                assert!(w.lin.take_error().is_none() && p.lin.take_error().is_none());
                let (mut same, mut all) = (0, 0);
                for (u, v) in a.iter().zip(&b) {
                    assert_eq!(u.pred.len(), v.pred.len());
                    all += u.pred.len();
                    same += u.pred.iter().zip(&v.pred).filter(|(s, t)| s == t).count();
                }
                assert!(same * 30 >= all * 29, "{rel}: {same} of {all}");
            }
        }
    }
}
