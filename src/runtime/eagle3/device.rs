//! The EAGLE-3 step kept on a device (`kquant verify --device cuda|hip|cpu-emu`): when every
//! linear of a draft runs there (Llama-style or MLA attention), the whole pass — the per-tap norms
//! and fc over the taps, the embedding gather, the input norms, q/k/v (MLA: the low-rank query
//! with its norm, the latent kv with its norm, the shared rotary key broadcast to every head),
//! rotary, attention over depth 0's keys and the earlier depths' diagonal keys, o_proj, the
//! residuals, the SwiGLU MLP, the final norm and the lm_head's row argmax — runs as device kernels ([`gpu::Op`], `kernels/ops.cu`) on device
//! tensors. Per sample the taps go up once; per depth the fed tokens, positions and live rows go
//! up (a few ints a row) and the proposals' indices come back, nothing else.
//!
//! The f32 runtime (`Eagle3::forward`) is the reference: this is the same computation with the
//! linears' inputs rounded to their 16-bit dtype, as the per-linear device path rounds them, and
//! the reductions in the kernels' order. Tested on `cpu-emu` against both.

use std::sync::Arc;

use super::depth::{not_computed, still_accepted, DepthOut, Feed};
use super::mla_attn::{MlaShape, QProj};
use super::model::Model;
use crate::gpu::ops;
use crate::gpu::{self, AttendDims, Backend, DevTensor, Elem, GpuError, Host, Strided};
use crate::runtime::linears::DeviceLayer;
use crate::runtime::on_device::{attention_fits, layer, upload_table, At, Mlp, Run, Staged};

/// The draft's non-linear weights on the device, uploaded once at load.
pub struct DeviceStep {
    dev: Arc<dyn Backend>,
    table: DevTensor,
    hidden_norm: DevTensor,
    input_norm: DevTensor,
    post_norm: DevTensor,
    final_norm: DevTensor,
    fc_norm: Option<[DevTensor; 3]>,
    /// MLA: the query's low-rank norm (with a `q_a_proj`) and the latent kv's norm.
    q_a_norm: Option<DevTensor>,
    kv_a_norm: Option<DevTensor>,
}

/// The attention's linears on the device.
enum Attn<'a> {
    Llama {
        q: DeviceLayer<'a>,
        k: DeviceLayer<'a>,
        v: DeviceLayer<'a>,
    },
    Mla {
        /// `(q_a, q_b)` with the norm between, or `q_proj` alone.
        q: QLayers<'a>,
        kv_a: DeviceLayer<'a>,
        kv_b: DeviceLayer<'a>,
    },
}

/// MLA's query linears: `(q_a, q_b)` with the norm between, or `q_proj` alone.
type QLayers<'a> = Result<(DeviceLayer<'a>, DeviceLayer<'a>), DeviceLayer<'a>>;

/// Every linear of the step, on the device.
struct Layers<'a> {
    fc: DeviceLayer<'a>,
    attn: Attn<'a>,
    o: DeviceLayer<'a>,
    mlp: Mlp<'a>,
    lm_head: DeviceLayer<'a>,
}

fn layers(e: &Model) -> Result<Layers<'_>, String> {
    let (attn, o) = if let Some(a) = e.attn.llama() {
        let attn = Attn::Llama {
            q: layer(&a.q)?,
            k: layer(&a.k)?,
            v: layer(&a.v)?,
        };
        (attn, layer(&a.o)?)
    } else if let Some(a) = e.attn.mla() {
        let q = match &a.q {
            QProj::Lora { a: qa, b, .. } => Ok((layer(qa)?, layer(b)?)),
            QProj::Full(w) => Err(layer(w)?),
        };
        let attn = Attn::Mla {
            q,
            kv_a: layer(&a.kv_a)?,
            kv_b: layer(&a.kv_b)?,
        };
        (attn, layer(&a.o)?)
    } else {
        return Err("an attention variant the device step does not know".into());
    };
    let w = &e.w;
    Ok(Layers {
        fc: layer(&w.fc)?,
        attn,
        o,
        mlp: (layer(&w.gate)?, layer(&w.up)?, layer(&w.down)?),
        lm_head: layer(&w.lm_head)?,
    })
}

/// Attention widths: query heads, key/value heads, q·k width, value width.
#[derive(Clone, Copy)]
struct Heads {
    heads: usize,
    kv: usize,
    dq: usize,
    dv: usize,
}

impl Heads {
    fn of(e: &Model) -> Heads {
        let a = e.attention();
        Heads {
            heads: a.heads(),
            kv: a.kv_heads(),
            dq: a.qk_dim(),
            dv: a.v_dim(),
        }
    }
}

/// What every depth of one pass shares: the draft and its layers, the fed tokens, the rotary
/// table, depth 0's keys and values, the rows computed (`start..`, `n` of them) and the
/// positions the table covers.
struct Pass<'p> {
    e: &'p Model,
    l: &'p Layers<'p>,
    x: &'p [u32],
    cs: &'p DevTensor,
    kv0: (&'p DevTensor, &'p DevTensor),
    start: usize,
    n: usize,
    positions: usize,
}

/// A pass's state from depth to depth: the rows still computed, their queries and residual
/// stream, the earlier depths' diagonal keys and values, and each row's slot in them.
struct Depths {
    live: Vec<usize>,
    q: DevTensor,
    res: DevTensor,
    diag: (DevTensor, DevTensor),
    slots: Vec<i32>,
}

/// An MLA draft's attention shape and the epsilon of its norms (the device step runs only
/// drafts [`layers`] accepted, so the attention is MLA wherever this is called).
fn mla_of(e: &Model) -> (&MlaShape, f32) {
    let a = e.attn.mla().expect("an MLA draft");
    (&a.shape, a.eps)
}

/// The token ids `toks` as an index tensor bounded by the vocabulary.
fn token_ids(run: Run<'_>, e: &Model, toks: &[u32]) -> Staged<DevTensor> {
    run.index(toks.iter().map(|&t| t as usize), e.vocab, "token ids")
}

impl DeviceStep {
    fn run(&self) -> Run<'_> {
        Run { dev: &*self.dev }
    }

    /// Upload the embedding and the norms of `e` when its whole step can stay on `dev`;
    /// `Ok(Err(why))` when it cannot (a linear on the CPU, MLA attention, a value width the
    /// attention kernel does not hold).
    pub(super) fn new(e: &Model, dev: Arc<dyn Backend>) -> gpu::Result<Result<DeviceStep, String>> {
        if let Err(why) = layers(e) {
            return Ok(Err(why));
        }
        if let Err(why) = attention_fits(&*dev, e.attn.v_dim()) {
            return Ok(Err(why));
        }
        let table = match upload_table(&*dev, &e.w.embed)? {
            Ok(t) => t,
            Err(why) => return Ok(Err(why)),
        };
        let up = |v: &[f32]| dev.upload_tensor(Host::F32(v));
        let fc_norm = match &e.w.fc_norm {
            Some([a, b, c]) => Some([up(a)?, up(b)?, up(c)?]),
            None => None,
        };
        let mla = e.attn.mla();
        let q_a_norm = match mla.map(|a| &a.q) {
            Some(QProj::Lora { norm, .. }) => Some(up(norm)?),
            _ => None,
        };
        let kv_a_norm = mla.map(|a| up(&a.kv_a_norm)).transpose()?;
        Ok(Ok(DeviceStep {
            table,
            hidden_norm: up(&e.w.hidden_norm)?,
            input_norm: up(&e.w.input_norm)?,
            post_norm: up(&e.w.post_norm)?,
            final_norm: up(&e.w.norm)?,
            fc_norm,
            q_a_norm,
            kv_a_norm,
            dev,
        }))
    }

    /// `Eagle3::forward` over rows `start..T-1` for `depths` depths, proposals only (no logits,
    /// no hidden states): the per-row outputs of the f32 runtime's pass, computed on the device.
    /// A failure is an error naming the stage.
    pub(super) fn forward(
        &self,
        e: &Model,
        x: &[u32],
        feats: &[f32],
        start: usize,
        depths: usize,
        feed: Feed,
    ) -> Staged<Vec<DepthOut>> {
        let l =
            layers(e).map_err(|why| ("placement", GpuError::Unsupported("device step", why)))?;
        let pairs = x.len().saturating_sub(1);
        let start = start.min(pairs);
        let n = pairs - start;
        let hd = Heads::of(e);
        let (qd, kw, vw) = (hd.heads * hd.dq, hd.kv * hd.dq, hd.kv * hd.dv);
        let positions = pairs + depths;
        let run = self.run();
        let (hid0, q0, (k0, v0), cs) = self.depth0(e, &l, x, feats, positions)?;
        let tail = run.index(start..pairs, pairs, "rows")?;
        let q = run.gather(&q0, &tail, n, qd)?;
        drop(q0);
        let res = run.gather(&hid0, &tail, n, e.h)?;
        drop(hid0);

        let diag_rows = depths.saturating_sub(1) * n;
        let zeros = |len: usize| self.dev.zeros(Elem::F32, len.max(1)).at("diagonal keys");
        let mut s = Depths {
            live: (0..n).collect(),
            q,
            res,
            diag: (zeros(diag_rows * kw)?, zeros(diag_rows * vw)?),
            slots: vec![0i32; diag_rows],
        };
        let pass = Pass {
            e,
            l: &l,
            x,
            cs: &cs,
            kv0: (&k0, &v0),
            start,
            n,
            positions,
        };
        let mut outs: Vec<DepthOut> = Vec::with_capacity(depths);
        for d in 0..depths {
            if d > 0 {
                self.feed(&pass, &mut s, d, &outs[d - 1].pred, feed)?;
            }
            let out = if s.live.is_empty() {
                not_computed(n)
            } else {
                self.propose(&pass, &mut s, d)?
            };
            outs.push(out);
        }
        Ok(outs)
    }

    /// Depth 0 over every pair (the taps go up once): the fc's hidden states, the queries, the
    /// keys and values every later depth attends, and the rotary table.
    #[allow(clippy::type_complexity)]
    fn depth0(
        &self,
        e: &Model,
        l: &Layers<'_>,
        x: &[u32],
        feats: &[f32],
        positions: usize,
    ) -> Staged<(DevTensor, DevTensor, (DevTensor, DevTensor), DevTensor)> {
        let (run, pairs, ht) = (self.run(), x.len().saturating_sub(1), e.ht);
        let f = run.f32(&feats[..pairs * 3 * ht], "taps")?;
        if let Some(norms) = &self.fc_norm {
            for (j, g) in norms.iter().enumerate() {
                let at = Strided {
                    ld: 3 * ht,
                    off: j * ht,
                };
                let (n, h) = (pairs, ht);
                let norm = ops::RmsNorm {
                    x: &f,
                    w: g,
                    out: &f,
                    n,
                    h,
                    eps: e.eps,
                    input: at,
                    output: at,
                };
                run.op(norm, "fc norms")?;
            }
        }
        let hid0 = run.linear(l.fc, &f, pairs, "fc")?;
        drop(f);
        let emb0 = run.embed(&self.table, &token_ids(run, e, &x[1..=pairs])?, pairs, e.h)?;
        let a0 = self.attn_input(e, &hid0, &emb0, pairs)?;
        drop(emb0);
        let rope = match (e.attn.llama(), e.attn.mla()) {
            (Some(a), _) => &a.rope,
            (_, Some(a)) => &a.rope,
            _ => unreachable!("layers() checked the attention"),
        };
        let cs = run.f32(&rope.table(positions), "rope table")?;
        let pos0 = run.index(0..pairs, positions, "positions")?;
        let (q0, k0, v0) = self.qkv(e, l, &a0, pairs, &pos0, &cs)?;
        Ok((hid0, q0, (k0, v0), cs))
    }

    /// Depth `d` > 0's inputs: the rows still computed (`--after-miss skip`: those whose
    /// proposals `pred` at depth `d − 1` were accepted), their fed tokens through the layer up
    /// to q, k, v, this depth's keys and values into slot block `d − 1`.
    fn feed(&self, p: &Pass<'_>, s: &mut Depths, d: usize, pred: &[u32], feed: Feed) -> Staged<()> {
        let (run, e, n) = (self.run(), p.e, p.n);
        let truth = |i: usize| p.x.get(p.start + i + 1 + d).copied().unwrap_or(0);
        if let Feed::Accepted = feed {
            let keep = still_accepted(&s.live, pred, truth);
            if keep.len() < s.live.len() && !keep.is_empty() {
                let idx = run.index(keep.clone(), s.live.len(), "live rows")?;
                s.res = run.gather(&s.res, &idx, keep.len(), e.h)?;
            }
            s.live = keep.iter().map(|&k| s.live[k]).collect();
        }
        let m = s.live.len();
        if m == 0 {
            return Ok(());
        }
        let toks: Vec<u32> = match feed {
            Feed::Truth | Feed::Accepted => s.live.iter().map(|&i| truth(i)).collect(),
            Feed::Own => s.live.iter().map(|&i| pred[i]).collect(),
        };
        let emb = run.embed(&self.table, &token_ids(run, e, &toks)?, m, e.h)?;
        let ad = self.attn_input(e, &s.res, &emb, m)?;
        let at = s.live.iter().map(|&i| p.start + i + d);
        let pos = run.index(at, p.positions, "positions")?;
        let (qn, kn, vn) = self.qkv(e, p.l, &ad, m, &pos, p.cs)?;
        s.q = qn;
        // This depth's keys and values go to slot block d − 1, row s for live row s.
        let hd = Heads::of(e);
        let iota = run.index(0..m, m, "rows")?;
        let (dk, dv) = (&s.diag.0, &s.diag.1);
        for (src, dst, w) in [(&kn, dk, hd.kv * hd.dq), (&vn, dv, hd.kv * hd.dv)] {
            let op = ops::Gather {
                src,
                idx: &iota,
                dst,
                m,
                w,
                dst_off: (d - 1) * n * w,
            };
            run.op(op, "diagonal keys")?;
        }
        for (k, &i) in s.live.iter().enumerate() {
            s.slots[(d - 1) * n + i] = k as i32;
        }
        Ok(())
    }

    /// Depth `d`'s proposals for the live rows: attention over depth 0's keys and the diagonal
    /// ones, the rest of the layer, the final norm and the lm_head's argmax; the residual
    /// stream moved on.
    fn propose(&self, p: &Pass<'_>, s: &mut Depths, d: usize) -> Staged<DepthOut> {
        let (run, e, l, n) = (self.run(), p.e, p.l, p.n);
        let (hd, m) = (Heads::of(e), s.live.len());
        let rows = run.index(s.live.clone(), n, "rows")?;
        let slots = s.slots[..d * n].iter().map(|&k| k as usize).chain([0]);
        let slot_t = run.index(slots, n.max(1), "slots")?;
        let dims = AttendDims {
            m,
            n,
            start: p.start,
            diag: d,
            heads: hd.heads,
            kv_heads: hd.kv,
            dq: hd.dq,
            dv: hd.dv,
            scale: e.attn.scale(),
        };
        let diag = (&s.diag.0, &s.diag.1);
        let attn = run.attend(&s.q, p.kv0, diag, (&rows, &slot_t), dims)?;
        let rest = (l.o, l.mlp);
        let g = run.layer_tail(rest, &self.post_norm, (&attn, &s.res), (m, e.h, e.eps))?;
        drop(attn);
        let normed = run.normed(&g, &self.final_norm, (m, e.h, e.eps))?;
        let best = run.argmax(l.lm_head, &normed, m, e.draft_vocab)?;
        let mut out = not_computed(n);
        for (&i, b) in s.live.iter().zip(best) {
            out.pred[i] = e.to_target(b);
        }
        s.res = if e.norm_output { normed } else { g };
        Ok(out)
    }

    /// RMSNorm of `m` rows of H of `x` with `w`, into `out` at `at`.
    fn norm(
        &self,
        e: &Model,
        x: &DevTensor,
        w: &DevTensor,
        out: &DevTensor,
        m: usize,
        at: Strided,
    ) -> Staged<()> {
        let whole = Strided { ld: e.h, off: 0 };
        self.run().rms(x, w, out, (m, e.h, e.eps), whole, at)
    }

    /// `cat(input_layernorm(emb), hidden_norm(hid))`, `[m, 2H]`.
    fn attn_input(
        &self,
        e: &Model,
        hid: &DevTensor,
        emb: &DevTensor,
        m: usize,
    ) -> Staged<DevTensor> {
        let h = e.h;
        let out = self.dev.zeros(Elem::F32, m * 2 * h).at("norm")?;
        self.norm(
            e,
            emb,
            &self.input_norm,
            &out,
            m,
            Strided { ld: 2 * h, off: 0 },
        )?;
        self.norm(
            e,
            hid,
            &self.hidden_norm,
            &out,
            m,
            Strided { ld: 2 * h, off: h },
        )?;
        Ok(out)
    }

    /// q, k, v of `m` attention inputs at positions `pos` (`[m, heads·dq]`, `[m, kv·dq]`,
    /// `[m, kv·dv]`), rotary applied to q and k.
    fn qkv(
        &self,
        e: &Model,
        l: &Layers<'_>,
        a: &DevTensor,
        m: usize,
        pos: &DevTensor,
        cs: &DevTensor,
    ) -> Staged<(DevTensor, DevTensor, DevTensor)> {
        match &l.attn {
            Attn::Llama { q, k, v } => self.qkv_llama(e, (*q, *k, *v), a, m, (pos, cs)),
            Attn::Mla { q, kv_a, kv_b } => {
                let (qt, kv) = self.mla_q_kv(e, (q, *kv_a), a, m, (pos, cs))?;
                let (k, v) = self.mla_keys_values(e, *kv_b, &kv, m, (pos, cs))?;
                Ok((qt, k, v))
            }
        }
    }

    /// Llama attention: q, k, v from one rounding of the input per dtype the projections read,
    /// NeoX rotary on q and k.
    fn qkv_llama(
        &self,
        e: &Model,
        (q, k, v): (DeviceLayer<'_>, DeviceLayer<'_>, DeviceLayer<'_>),
        a: &DevTensor,
        m: usize,
        rot: (&DevTensor, &DevTensor),
    ) -> Staged<(DevTensor, DevTensor, DevTensor)> {
        let (hd, run) = (Heads::of(e), self.run());
        let len = a.len();
        let xa = self.dev.zeros(Elem::Half(q.act()), len).at("q/k/v")?;
        run.op(ops::ToAct { x: a, y: &xa, len }, "q/k/v")?;
        let proj = |p: DeviceLayer<'_>| -> Staged<DevTensor> {
            if p.act() == q.act() {
                p.forward(&xa, m).at("q/k/v")
            } else {
                run.linear(p, a, m, "q/k/v")
            }
        };
        let (qt, kt, vt) = (proj(q)?, proj(k)?, proj(v)?);
        for (t, nh) in [(&qt, hd.heads), (&kt, hd.kv)] {
            let at = Strided {
                ld: nh * hd.dq,
                off: 0,
            };
            run.rope(t, rot, m, (nh, hd.dq / 2, hd.dq), at, false)?;
        }
        Ok((qt, kt, vt))
    }

    /// MLA attention's query (low-rank with its norm, or `q_proj`; interleaved rotary on each
    /// head's rope part) and `kv_a = c | k_rope`.
    fn mla_q_kv(
        &self,
        e: &Model,
        (q, kv_a): (&QLayers<'_>, DeviceLayer<'_>),
        a: &DevTensor,
        m: usize,
        rot: (&DevTensor, &DevTensor),
    ) -> Staged<(DevTensor, DevTensor)> {
        let run = self.run();
        let (mla, eps) = mla_of(e);
        let (nh, nope, rd) = (mla.heads, mla.nope, mla.rope_dim);
        let dq = nope + rd;
        let qt = match q {
            Ok((qa, qb)) => {
                let c = run.linear(*qa, a, m, "q_a_proj")?;
                let rank = c.len() / m.max(1);
                let norm = self.q_a_norm.as_ref().expect("uploaded with q_a_proj");
                let at = Strided { ld: rank, off: 0 };
                run.rms(&c, norm, &c, (m, rank, eps), at, at)?;
                run.linear(*qb, &c, m, "q_b_proj")?
            }
            Err(qp) => run.linear(*qp, a, m, "q_proj")?,
        };
        let q_at = Strided {
            ld: nh * dq,
            off: nope,
        };
        run.rope(&qt, rot, m, (nh, rd / 2, dq), q_at, true)?;
        let kv = run.linear(kv_a, a, m, "kv_a_proj_with_mqa")?;
        Ok((qt, kv))
    }

    /// MLA attention's keys and values from `kv_a = c | k_rope`: `kv_b(kv_a_norm(c)) = k_nope
    /// | v` per head, the shared k_rope rotated, then k = each head's k_nope with k_rope after
    /// it.
    fn mla_keys_values(
        &self,
        e: &Model,
        kv_b: DeviceLayer<'_>,
        kv: &DevTensor,
        m: usize,
        rot: (&DevTensor, &DevTensor),
    ) -> Staged<(DevTensor, DevTensor)> {
        let run = self.run();
        let (mla, eps) = mla_of(e);
        let (nh, nope, rd, dv) = (mla.heads, mla.nope, mla.rope_dim, mla.v_dim);
        let (kvlr, dq) = (mla.kv_lora_rank, nope + rd);
        let c = self.dev.zeros(Elem::F32, m * kvlr).at("kv norm")?;
        let norm = self.kv_a_norm.as_ref().expect("uploaded for MLA");
        let (kv_at, c_at) = (
            Strided {
                ld: kvlr + rd,
                off: 0,
            },
            Strided { ld: kvlr, off: 0 },
        );
        run.rms(kv, norm, &c, (m, kvlr, eps), kv_at, c_at)?;
        let kvb = run.linear(kv_b, &c, m, "kv_b_proj")?;
        drop(c);
        let kr_at = Strided {
            ld: kvlr + rd,
            off: kvlr,
        };
        run.rope(kv, rot, m, (1, rd / 2, rd), kr_at, true)?;
        let k = self.dev.zeros(Elem::F32, m * nh * dq).at("keys")?;
        let v = self.dev.zeros(Elem::F32, m * nh * dv).at("values")?;
        let rows = |ld, off| Strided { ld, off };
        let kvb_ld = nh * (nope + dv);
        let copies = [
            // k_nope of each head, the shared k_rope after it, v of each head.
            (
                &kvb,
                &k,
                nope,
                (rows(kvb_ld, 0), nope + dv),
                (rows(nh * dq, 0), dq),
            ),
            (kv, &k, rd, (kr_at, 0), (rows(nh * dq, nope), dq)),
            (
                &kvb,
                &v,
                dv,
                (rows(kvb_ld, nope), nope + dv),
                (rows(nh * dv, 0), dv),
            ),
        ];
        for (src, dst, w, from, to) in copies {
            let op = ops::CopyCols {
                src,
                dst,
                n: m,
                heads: nh,
                w,
                from,
                to,
            };
            run.op(op, "keys")?;
        }
        Ok((k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{CpuEmu, Op, Tensors};
    use crate::ops::{rms_norm, silu, softmax};
    use crate::runtime::rope::Rope;

    /// How far the device RMSNorm (strided per-thread sums, then the tree) may sit from
    /// `ops::rms_norm` (one running sum), relative to the largest output.
    const NORM_REL_TOL: f32 = 1e-6;
    /// How far `kq_attend` (warp-split dot products, online softmax) may sit from the plain
    /// softmax attention, relative to the largest value.
    const ATTEND_REL_TOL: f32 = 1e-5;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        crate::test_rng::Rng(seed).signed_units(n)
    }

    fn max_rel(a: &[f32], b: &[f32]) -> f32 {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        a.iter()
            .zip(b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs() / scale))
    }

    fn devices() -> Vec<CpuEmu> {
        vec![CpuEmu::nvidia(), CpuEmu::amd()]
    }

    /// The step kernels against the f32 runtime's own functions: the embedding gather, the
    /// activation rounding and SwiGLU exactly, the rotary embedding exactly in both forms (the same
    /// table and formula), the strided head copies exactly, RMSNorm within [`NORM_REL_TOL`] (written into strided halves, as the attention
    /// input is), attention within [`ATTEND_REL_TOL`] (grouped heads, depth-0 keys up to each
    /// row's pair and diagonal keys by slot), on both vendors' warp widths.
    #[test]
    fn step_kernels_equal_the_runtimes_functions() {
        for d in devices() {
            let up = |v: &[f32]| d.upload_tensor(Host::F32(v)).unwrap();
            // Embedding, bf16 table.
            let (vocab, h) = (11, 40);
            let tf = rand(vocab * h, 1);
            let bits: Vec<u16> = tf.iter().map(|&v| gpu::Act::Bf16.from_f32(v)).collect();
            let table = d.upload_tensor(Host::Half(gpu::Act::Bf16, &bits)).unwrap();
            let ids = [3i32, 10, 0, 3];
            let idt = d.upload_tensor(Host::Index(&ids, vocab)).unwrap();
            let out = d.zeros(Elem::F32, ids.len() * h).unwrap();
            d.op(&Op::Embed(ops::Embed {
                table: &table,
                ids: &idt,
                out: &out,
                n: ids.len(),
                h,
            }))
            .unwrap();
            let want: Vec<f32> = ids
                .iter()
                .flat_map(|&i| bits[i as usize * h..(i as usize + 1) * h].iter())
                .map(|&b| gpu::Act::Bf16.to_f32(b))
                .collect();
            assert_eq!(d.read_f32(&out).unwrap(), want);

            // RMSNorm into the two halves of [n, 2h] rows, and in place.
            let (n, h) = (5, 300);
            let x = rand(n * h, 2).iter().map(|v| v * 3.0).collect::<Vec<_>>();
            let (wa, wb) = (rand(h, 3), rand(h, 4));
            let (xt, wat, wbt) = (up(&x), up(&wa), up(&wb));
            let cat = d.zeros(Elem::F32, n * 2 * h).unwrap();
            for (w, off) in [(&wat, 0), (&wbt, h)] {
                d.op(&Op::RmsNorm(ops::RmsNorm {
                    x: &xt,
                    w,
                    out: &cat,
                    n,
                    h,
                    eps: 1e-5,
                    input: Strided { ld: h, off: 0 },
                    output: Strided { ld: 2 * h, off },
                }))
                .unwrap();
            }
            let got = d.read_f32(&cat).unwrap();
            let (ra, rb) = (rms_norm(&x, h, &wa, 1e-5), rms_norm(&x, h, &wb, 1e-5));
            for r in 0..n {
                let row = &got[r * 2 * h..(r + 1) * 2 * h];
                assert!(max_rel(&row[..h], &ra[r * h..(r + 1) * h]) <= NORM_REL_TOL);
                assert!(max_rel(&row[h..], &rb[r * h..(r + 1) * h]) <= NORM_REL_TOL);
            }

            // Rotary: 3 rows of 2 heads of 16 at positions 0, 7, 19.
            let rope = Rope::plain(16, 10000.0);
            let (heads, hd, pos) = (2, 16, [0usize, 7, 19]);
            let mut q = rand(pos.len() * heads * hd, 5);
            let qt = up(&q);
            let cs = up(&rope.table(20));
            let pt = d
                .upload_tensor(Host::Index(&pos.map(|p| p as i32), 20))
                .unwrap();
            // `heads` heads of `2·half`, `head_ld` apart from `at`, of the 3 rows at `pos`.
            let rotate = |x: &DevTensor, cs: &DevTensor, half, at, head_ld, interleaved| {
                let op = ops::Rope {
                    x,
                    pos: &pt,
                    cs,
                    n: pos.len(),
                    heads,
                    half,
                    at,
                    head_ld,
                    interleaved,
                };
                d.op(&op.into()).unwrap();
            };
            let at = Strided {
                ld: heads * hd,
                off: 0,
            };
            rotate(&qt, &cs, hd / 2, at, hd, false);
            for (r, &p) in pos.iter().enumerate() {
                rope.apply_neox(&mut q[r * heads * hd..(r + 1) * heads * hd], p);
            }
            assert_eq!(d.read_f32(&qt).unwrap(), q);
            // Interleaved (MLA): the rope part (8) after each head's 24 nope values, YaRN table.
            let cfg = serde_json::json!({"type": "yarn", "factor": 64.0,
                "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0});
            let (yarn, _) = Rope::from_config(8, 10000.0, Some(&cfg));
            let (nope, rd) = (24, 8);
            let mut q = rand(pos.len() * heads * (nope + rd), 13);
            let qt = up(&q);
            let cs = up(&yarn.table(20));
            let at = Strided {
                ld: heads * (nope + rd),
                off: nope,
            };
            rotate(&qt, &cs, rd / 2, at, nope + rd, true);
            for (r, &p) in pos.iter().enumerate() {
                for h in 0..heads {
                    let at = (r * heads + h) * (nope + rd) + nope;
                    yarn.apply_interleaved(&mut q[at..at + rd], p);
                }
            }
            assert_eq!(d.read_f32(&qt).unwrap(), q);
            // A shared block broadcast to every head, beside per-head blocks.
            let src = rand(3 * 10, 14);
            let dst = d.zeros(Elem::F32, 3 * 2 * 6).unwrap();
            for (from, to) in [
                (
                    (Strided { ld: 10, off: 0 }, 4),
                    (Strided { ld: 12, off: 0 }, 6),
                ),
                (
                    (Strided { ld: 10, off: 8 }, 0),
                    (Strided { ld: 12, off: 4 }, 6),
                ),
            ] {
                let w = if from.1 == 0 { 2 } else { 4 };
                d.op(&Op::CopyCols(ops::CopyCols {
                    src: &up(&src),
                    dst: &dst,
                    n: 3,
                    heads: 2,
                    w,
                    from,
                    to,
                }))
                .unwrap();
            }
            let got = d.read_f32(&dst).unwrap();
            for r in 0..3 {
                for h in 0..2 {
                    let row = &got[r * 12 + h * 6..][..6];
                    assert_eq!(row[..4], src[r * 10 + h * 4..][..4]);
                    assert_eq!(row[4..], src[r * 10 + 8..][..2]);
                }
            }

            // SwiGLU and the rounding to bf16.
            let (g, u) = (rand(77, 6), rand(77, 7));
            let (gt, ut) = (up(&g), up(&u));
            d.op(&Op::SiluMul(ops::SiluMul {
                g: &gt,
                u: &ut,
                out: &gt,
                len: 77,
            }))
            .unwrap();
            let want: Vec<f32> = g.iter().zip(&u).map(|(a, b)| silu(*a) * b).collect();
            assert_eq!(d.read_f32(&gt).unwrap(), want);

            // Attention: 4 query heads over 2 key/value heads, 3 of 6 replay rows (start 2),
            // 2 diagonal keys each.
            let (heads, kvh, dq, n, start, diag) = (4, 2, 40, 6, 2, 2);
            let (kw, pairs) = (kvh * dq, start + n);
            let rows = [5i32, 0, 3];
            let m = rows.len();
            let q = rand(m * heads * dq, 8);
            let (k0, v0) = (rand(pairs * kw, 9), rand(pairs * kw, 10));
            let (kd, vd) = (rand(diag * n * kw, 11), rand(diag * n * kw, 12));
            let slots: Vec<i32> = (0..diag * n).map(|i| ((i * 5) % n) as i32).collect();
            let scale = 1.0 / (dq as f32).sqrt();
            let out = d.zeros(Elem::F32, m * heads * dq).unwrap();
            d.op(&Op::Attend(ops::Attend {
                q: &up(&q),
                k0: &up(&k0),
                v0: &up(&v0),
                kd: &up(&kd),
                vd: &up(&vd),
                rows: &d.upload_tensor(Host::Index(&rows, n)).unwrap(),
                slots: &d.upload_tensor(Host::Index(&slots, n)).unwrap(),
                out: &out,
                dims: AttendDims {
                    m,
                    n,
                    start,
                    diag,
                    heads,
                    kv_heads: kvh,
                    dq,
                    dv: dq,
                    scale,
                },
            }))
            .unwrap();
            let mut want = vec![0f32; m * heads * dq];
            for (r, &i) in rows.iter().enumerate() {
                let (i, t) = (i as usize, start + i as usize);
                for head in 0..heads {
                    let kv = head / (heads / kvh);
                    let mut keys: Vec<(&[f32], &[f32])> = (0..=t)
                        .map(|s| (&k0[s * kw..][..kw], &v0[s * kw..][..kw]))
                        .collect();
                    for e in 0..diag {
                        let s = slots[e * n + i] as usize;
                        keys.push((&kd[(e * n + s) * kw..][..kw], &vd[(e * n + s) * kw..][..kw]));
                    }
                    let qh = &q[(r * heads + head) * dq..][..dq];
                    let mut sc: Vec<f32> = keys
                        .iter()
                        .map(|(k, _)| {
                            qh.iter()
                                .zip(&k[kv * dq..])
                                .map(|(a, b)| a * b)
                                .sum::<f32>()
                                * scale
                        })
                        .collect();
                    softmax(&mut sc);
                    let o = &mut want[(r * heads + head) * dq..][..dq];
                    for (p, (_, v)) in sc.iter().zip(&keys) {
                        for (y, x) in o.iter_mut().zip(&v[kv * dq..]) {
                            *y += p * x;
                        }
                    }
                }
            }
            let got = d.read_f32(&out).unwrap();
            assert!(
                max_rel(&got, &want) <= ATTEND_REL_TOL,
                "{}",
                max_rel(&got, &want)
            );
        }
    }
}
