//! The EAGLE-3 step kept on a device (`kquant verify --device cuda|hip|cpu-emu`): when every
//! linear of a Llama-style draft runs there, the whole pass — the per-tap norms and fc over the
//! taps, the embedding gather, the input norms, q/k/v, rotary, attention over depth 0's keys and
//! the earlier depths' diagonal keys, o_proj, the residuals, the SwiGLU MLP, the final norm and
//! the lm_head's row argmax — runs as device kernels ([`gpu::Op`], `kernels/ops.cu`) on device
//! tensors. Per sample the taps go up once; per depth the fed tokens, positions and live rows go
//! up (a few ints a row) and the proposals' indices come back, nothing else.
//!
//! The f32 runtime (`Eagle3::forward`) is the reference: this is the same computation with the
//! linears' inputs rounded to their 16-bit dtype, as the per-linear device path rounds them, and
//! the reductions in the kernels' order. Tested on `cpu-emu` against both.

use std::sync::Arc;

use super::{DepthOut, Eagle3, Feed, NOT_COMPUTED};
use crate::gpu::{self, AttendDims, Backend, DevTensor, Elem, GpuError, Host, Op, Strided};
use crate::io::Dtype;
use crate::runtime::embed::Stored;
use crate::runtime::linears::{DeviceLayer, Linear};

/// The draft's non-linear weights on the device, uploaded once at load.
pub(super) struct DeviceStep {
    dev: Arc<dyn Backend>,
    table: DevTensor,
    hidden_norm: DevTensor,
    input_norm: DevTensor,
    post_norm: DevTensor,
    final_norm: DevTensor,
    fc_norm: Option<[DevTensor; 3]>,
}

/// Logits a device step holds at once (rows of the lm_head's output per argmax block).
const LOGITS_PER_BLOCK: usize = 1 << 26;

/// The layer of `l` on the device, or why the step cannot stay there.
fn layer(l: &Linear) -> Result<DeviceLayer<'_>, String> {
    l.device_layer()
        .ok_or_else(|| format!("`{}` runs on the CPU", l.module))
}

/// Every linear of the step, on the device.
struct Layers<'a> {
    fc: DeviceLayer<'a>,
    q: DeviceLayer<'a>,
    k: DeviceLayer<'a>,
    v: DeviceLayer<'a>,
    o: DeviceLayer<'a>,
    gate: DeviceLayer<'a>,
    up: DeviceLayer<'a>,
    down: DeviceLayer<'a>,
    lm_head: DeviceLayer<'a>,
}

fn layers(e: &Eagle3) -> Result<Layers<'_>, String> {
    let a = e
        .attn
        .llama()
        .ok_or("MLA attention (not yet a device step)")?;
    let w = &e.w;
    Ok(Layers {
        fc: layer(&w.fc)?,
        q: layer(&a.q)?,
        k: layer(&a.k)?,
        v: layer(&a.v)?,
        o: layer(&a.o)?,
        gate: layer(&w.gate)?,
        up: layer(&w.up)?,
        down: layer(&w.down)?,
        lm_head: layer(&w.lm_head)?,
    })
}

/// What a step's stage names in an error.
type Staged<T> = Result<T, (&'static str, GpuError)>;

trait At<T> {
    fn at(self, stage: &'static str) -> Staged<T>;
}

impl<T> At<T> for gpu::Result<T> {
    fn at(self, stage: &'static str) -> Staged<T> {
        self.map_err(|e| (stage, e))
    }
}

impl DeviceStep {
    /// Upload the embedding and the norms of `e` when its whole step can stay on `dev`;
    /// `Ok(Err(why))` when it cannot (a linear on the CPU, MLA attention, a value width the
    /// attention kernel does not hold).
    pub(super) fn new(
        e: &Eagle3,
        dev: Arc<dyn Backend>,
    ) -> gpu::Result<Result<DeviceStep, String>> {
        if let Err(why) = layers(e) {
            return Ok(Err(why));
        }
        let lanes = dev.arch().tune().warp as usize;
        let dv = e.attn.v_dim();
        if dv > gpu::source::ATT_VALUES_PER_LANE * lanes {
            return Ok(Err(format!(
                "a head width of {dv} (the attention kernel holds {} per warp)",
                gpu::source::ATT_VALUES_PER_LANE * lanes
            )));
        }
        let table = match e.w.embed.stored() {
            Stored::F32(v) => dev.upload_tensor(Host::F32(v))?,
            Stored::Bytes(Dtype::BF16, b) => {
                dev.upload_tensor(Host::Le(Elem::Half(gpu::Act::Bf16), b))?
            }
            Stored::Bytes(Dtype::F16, b) => {
                dev.upload_tensor(Host::Le(Elem::Half(gpu::Act::F16), b))?
            }
            Stored::Bytes(Dtype::F32, b) => dev.upload_tensor(Host::Le(Elem::F32, b))?,
            Stored::Bytes(other, _) => {
                return Ok(Err(format!("an embedding stored as {other:?}")));
            }
        };
        let up = |v: &[f32]| dev.upload_tensor(Host::F32(v));
        let fc_norm = match &e.w.fc_norm {
            Some([a, b, c]) => Some([up(a)?, up(b)?, up(c)?]),
            None => None,
        };
        Ok(Ok(DeviceStep {
            table,
            hidden_norm: up(&e.w.hidden_norm)?,
            input_norm: up(&e.w.input_norm)?,
            post_norm: up(&e.w.post_norm)?,
            final_norm: up(&e.w.norm)?,
            fc_norm,
            dev,
        }))
    }

    /// `Eagle3::forward` over rows `start..T-1` for `depths` depths, proposals only (no logits,
    /// no hidden states): the per-row outputs of the f32 runtime's pass, computed on the device.
    /// A failure is an error naming the stage.
    pub(super) fn forward(
        &self,
        e: &Eagle3,
        x: &[u32],
        feats: &[f32],
        start: usize,
        depths: usize,
        feed: Feed,
    ) -> Staged<Vec<DepthOut>> {
        let l =
            layers(e).map_err(|why| ("placement", GpuError::Unsupported("device step", why)))?;
        let a = e.attn.llama().expect("layers() checked the attention");
        let dev = &*self.dev;
        let pairs = x.len().saturating_sub(1);
        let start = start.min(pairs);
        let n = pairs - start;
        let (h, ht) = (e.h, e.ht);
        let (heads, kvh, hd) = (a.heads, a.kv_heads, a.head_dim);
        let (qd, kd) = (heads * hd, kvh * hd);
        let positions = pairs + depths;
        let ids = |toks: &[u32]| -> Staged<DevTensor> {
            let v: Vec<i32> = toks
                .iter()
                .map(|&t| t.min(i32::MAX as u32) as i32)
                .collect();
            dev.upload_tensor(Host::Index(&v, e.vocab)).at("token ids")
        };
        let index = |v: Vec<usize>, bound: usize, what: &'static str| -> Staged<DevTensor> {
            let v: Vec<i32> = v.into_iter().map(|i| i as i32).collect();
            dev.upload_tensor(Host::Index(&v, bound)).at(what)
        };

        // Depth 0 over every pair: the taps go up once.
        let f = dev
            .upload_tensor(Host::F32(&feats[..pairs * 3 * ht]))
            .at("taps")?;
        if let Some(norms) = &self.fc_norm {
            for (j, g) in norms.iter().enumerate() {
                let at = Strided {
                    ld: 3 * ht,
                    off: j * ht,
                };
                dev.op(&Op::RmsNorm {
                    x: &f,
                    w: g,
                    out: &f,
                    n: pairs,
                    h: ht,
                    eps: e.eps,
                    input: at,
                    output: at,
                })
                .at("fc norms")?;
            }
        }
        let hid0 = self.linear(l.fc, &f, pairs, "fc")?;
        drop(f);
        let toks0: Vec<u32> = x[1..=pairs].to_vec();
        let emb0 = self.embed(&ids(&toks0)?, pairs, h)?;
        let a0 = self.attn_input(e, &hid0, &emb0, pairs)?;
        drop(emb0);
        let cs = dev
            .upload_tensor(Host::F32(&a.rope.table(positions)))
            .at("rope table")?;
        let pos0 = index((0..pairs).collect(), positions, "positions")?;
        let (q0, k0, v0) = self.qkv(&l, &a0, pairs, &pos0, &cs, (heads, kvh, hd))?;
        drop(a0);
        let tail = index((start..pairs).collect(), pairs, "rows")?;
        let mut q = self.gather(&q0, &tail, n, qd)?;
        drop(q0);
        let mut res = self.gather(&hid0, &tail, n, h)?;
        drop(hid0);

        let diag_rows = depths.saturating_sub(1) * n;
        let zeros = |len: usize| dev.zeros(Elem::F32, len.max(1)).at("diagonal keys");
        let (dk, dvv) = (zeros(diag_rows * kd)?, zeros(diag_rows * kd)?);
        let mut slots = vec![0i32; diag_rows];
        let mut live: Vec<usize> = (0..n).collect();
        let mut outs: Vec<DepthOut> = Vec::with_capacity(depths);
        for d in 0..depths {
            let truth = |i: usize| x.get(start + i + 1 + d).copied().unwrap_or(0);
            if d > 0 {
                if let Feed::Accepted = feed {
                    let prev = &outs[d - 1].pred;
                    let keep: Vec<usize> = (0..live.len())
                        .filter(|&s| prev[live[s]] == truth(live[s]))
                        .collect();
                    if keep.len() < live.len() && !keep.is_empty() {
                        let idx = index(keep.clone(), live.len(), "live rows")?;
                        res = self.gather(&res, &idx, keep.len(), h)?;
                    }
                    live = keep.iter().map(|&s| live[s]).collect();
                }
                let m = live.len();
                if m > 0 {
                    let toks: Vec<u32> = match feed {
                        Feed::Truth | Feed::Accepted => live.iter().map(|&i| truth(i)).collect(),
                        Feed::Own => live.iter().map(|&i| outs[d - 1].pred[i]).collect(),
                    };
                    let emb = self.embed(&ids(&toks)?, m, h)?;
                    let ad = self.attn_input(e, &res, &emb, m)?;
                    let pos = index(
                        live.iter().map(|&i| start + i + d).collect(),
                        positions,
                        "positions",
                    )?;
                    let (qn, kn, vn) = self.qkv(&l, &ad, m, &pos, &cs, (heads, kvh, hd))?;
                    q = qn;
                    // This depth's keys and values go to slot block d − 1, row s for live row s.
                    let iota = index((0..m).collect(), m, "rows")?;
                    for (src, dst) in [(&kn, &dk), (&vn, &dvv)] {
                        dev.op(&Op::Gather {
                            src,
                            idx: &iota,
                            dst,
                            m,
                            w: kd,
                            dst_off: (d - 1) * n * kd,
                        })
                        .at("diagonal keys")?;
                    }
                    for (s, &i) in live.iter().enumerate() {
                        slots[(d - 1) * n + i] = s as i32;
                    }
                }
            }
            let m = live.len();
            if m == 0 {
                outs.push(not_computed(n));
                continue;
            }
            let rows = index(live.clone(), n, "rows")?;
            let slot_t = index(
                slots[..d * n]
                    .iter()
                    .map(|&s| s as usize)
                    .chain([0])
                    .collect(),
                n.max(1),
                "slots",
            )?;
            let attn = dev.zeros(Elem::F32, m * qd).at("attention")?;
            dev.op(&Op::Attend {
                q: &q,
                k0: &k0,
                v0: &v0,
                kd: &dk,
                vd: &dvv,
                rows: &rows,
                slots: &slot_t,
                out: &attn,
                dims: AttendDims {
                    m,
                    n,
                    start,
                    diag: d,
                    heads,
                    kv_heads: kvh,
                    dq: hd,
                    dv: hd,
                    scale: e.attn.scale(),
                },
            })
            .at("attention")?;
            let g = self.finish(e, &l, &attn, &res, m)?;
            drop(attn);
            let normed = dev.zeros(Elem::F32, m * h).at("norm")?;
            self.norm(
                e,
                &g,
                &self.final_norm,
                &normed,
                m,
                Strided { ld: h, off: 0 },
            )?;
            let best = self.argmax(&l, &normed, m, e.draft_vocab)?;
            let mut out = not_computed(n);
            for (&i, b) in live.iter().zip(best) {
                out.pred[i] = e.to_target(b);
            }
            res = if e.norm_output { normed } else { g };
            outs.push(out);
        }
        Ok(outs)
    }

    /// `x` (f32 `[m, k]`) rounded to the layer's dtype, then the layer: `[m, n]` f32.
    fn linear(
        &self,
        l: DeviceLayer<'_>,
        x: &DevTensor,
        m: usize,
        stage: &'static str,
    ) -> Staged<DevTensor> {
        let len = x.len();
        let xa = self.dev.zeros(Elem::Half(l.act()), len).at(stage)?;
        self.dev.op(&Op::ToAct { x, y: &xa, len }).at(stage)?;
        l.forward(&xa, m).at(stage)
    }

    fn embed(&self, ids: &DevTensor, n: usize, h: usize) -> Staged<DevTensor> {
        let out = self.dev.zeros(Elem::F32, n * h).at("embedding")?;
        self.dev
            .op(&Op::Embed {
                table: &self.table,
                ids,
                out: &out,
                n,
                h,
            })
            .at("embedding")?;
        Ok(out)
    }

    fn gather(&self, src: &DevTensor, idx: &DevTensor, m: usize, w: usize) -> Staged<DevTensor> {
        let out = self.dev.zeros(Elem::F32, m * w).at("gather")?;
        self.dev
            .op(&Op::Gather {
                src,
                idx,
                dst: &out,
                m,
                w,
                dst_off: 0,
            })
            .at("gather")?;
        Ok(out)
    }

    /// RMSNorm of `m` rows of H of `x` with `w`, into `out` at `at`.
    fn norm(
        &self,
        e: &Eagle3,
        x: &DevTensor,
        w: &DevTensor,
        out: &DevTensor,
        m: usize,
        at: Strided,
    ) -> Staged<()> {
        self.dev
            .op(&Op::RmsNorm {
                x,
                w,
                out,
                n: m,
                h: e.h,
                eps: e.eps,
                input: Strided { ld: e.h, off: 0 },
                output: at,
            })
            .at("norm")
    }

    /// `cat(input_layernorm(emb), hidden_norm(hid))`, `[m, 2H]`.
    fn attn_input(
        &self,
        e: &Eagle3,
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

    /// q, k, v of `m` attention inputs at positions `pos`, rotary applied to q and k.
    fn qkv(
        &self,
        l: &Layers<'_>,
        a: &DevTensor,
        m: usize,
        pos: &DevTensor,
        cs: &DevTensor,
        (heads, kvh, hd): (usize, usize, usize),
    ) -> Staged<(DevTensor, DevTensor, DevTensor)> {
        // One rounding of the input per dtype the projections read.
        let len = a.len();
        let xa = self.dev.zeros(Elem::Half(l.q.act()), len).at("q/k/v")?;
        self.dev.op(&Op::ToAct { x: a, y: &xa, len }).at("q/k/v")?;
        let proj = |p: DeviceLayer<'_>| -> Staged<DevTensor> {
            if p.act() == l.q.act() {
                p.forward(&xa, m).at("q/k/v")
            } else {
                self.linear(p, a, m, "q/k/v")
            }
        };
        let (q, k, v) = (proj(l.q)?, proj(l.k)?, proj(l.v)?);
        for (t, nh) in [(&q, heads), (&k, kvh)] {
            self.dev
                .op(&Op::Rope {
                    x: t,
                    pos,
                    cs,
                    n: m,
                    heads: nh,
                    half: hd / 2,
                    at: Strided {
                        ld: nh * hd,
                        off: 0,
                    },
                })
                .at("rotary")?;
        }
        Ok((q, k, v))
    }

    /// o_proj + residual, then the MLP block: the pre-norm hidden state `[m, H]`.
    fn finish(
        &self,
        e: &Eagle3,
        l: &Layers<'_>,
        attn: &DevTensor,
        res: &DevTensor,
        m: usize,
    ) -> Staged<DevTensor> {
        let (h, dev) = (e.h, &*self.dev);
        let h1 = self.linear(l.o, attn, m, "o_proj")?;
        dev.op(&Op::Add {
            a: &h1,
            b: res,
            out: &h1,
            len: m * h,
        })
        .at("residual")?;
        let xn = dev.zeros(Elem::F32, m * h).at("norm")?;
        self.norm(e, &h1, &self.post_norm, &xn, m, Strided { ld: h, off: 0 })?;
        let g = self.linear(l.gate, &xn, m, "gate_proj")?;
        let u = self.linear(l.up, &xn, m, "up_proj")?;
        drop(xn);
        let len = m * e.inter;
        dev.op(&Op::SiluMul {
            g: &g,
            u: &u,
            out: &g,
            len,
        })
        .at("silu")?;
        drop(u);
        let dn = self.linear(l.down, &g, m, "down_proj")?;
        dev.op(&Op::Add {
            a: &h1,
            b: &dn,
            out: &dn,
            len: m * h,
        })
        .at("residual")?;
        Ok(dn)
    }

    /// The lm_head's argmax of each of the `m` rows of `x` (a block of rows at a time, so the
    /// logits held stay bounded).
    fn argmax(&self, l: &Layers<'_>, x: &DevTensor, m: usize, vocab: usize) -> Staged<Vec<usize>> {
        let block = (LOGITS_PER_BLOCK / vocab.max(1)).max(1);
        let w = x.len() / m.max(1);
        let mut best = Vec::with_capacity(m);
        for r0 in (0..m).step_by(block) {
            let rows = block.min(m - r0);
            let part;
            let xb = if rows == m {
                x
            } else {
                let idx = self
                    .dev
                    .upload_tensor(Host::Index(
                        &(r0 as i32..(r0 + rows) as i32).collect::<Vec<_>>(),
                        m,
                    ))
                    .at("lm_head")?;
                part = self.gather(x, &idx, rows, w)?;
                &part
            };
            let logits = self.linear(l.lm_head, xb, rows, "lm_head")?;
            best.extend(self.dev.argmax_dev(&logits, rows, vocab).at("argmax")?);
        }
        Ok(best)
    }
}

/// A depth's outputs before any row is computed.
pub(super) fn not_computed(n: usize) -> DepthOut {
    DepthOut {
        logits: vec![],
        hidden: vec![],
        pred: vec![NOT_COMPUTED; n],
        second: vec![NOT_COMPUTED; n],
        margin: vec![f32::NAN; n],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::CpuEmu;
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
    /// activation rounding and SwiGLU exactly, the rotary embedding exactly (the same table and
    /// formula), RMSNorm within [`NORM_REL_TOL`] (written into strided halves, as the attention
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
            d.op(&Op::Embed {
                table: &table,
                ids: &idt,
                out: &out,
                n: ids.len(),
                h,
            })
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
                d.op(&Op::RmsNorm {
                    x: &xt,
                    w,
                    out: &cat,
                    n,
                    h,
                    eps: 1e-5,
                    input: Strided { ld: h, off: 0 },
                    output: Strided { ld: 2 * h, off },
                })
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
            d.op(&Op::Rope {
                x: &qt,
                pos: &pt,
                cs: &cs,
                n: pos.len(),
                heads,
                half: hd / 2,
                at: Strided {
                    ld: heads * hd,
                    off: 0,
                },
            })
            .unwrap();
            for (r, &p) in pos.iter().enumerate() {
                rope.apply_neox(&mut q[r * heads * hd..(r + 1) * heads * hd], p);
            }
            assert_eq!(d.read_f32(&qt).unwrap(), q);

            // SwiGLU and the rounding to bf16.
            let (g, u) = (rand(77, 6), rand(77, 7));
            let (gt, ut) = (up(&g), up(&u));
            d.op(&Op::SiluMul {
                g: &gt,
                u: &ut,
                out: &gt,
                len: 77,
            })
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
            d.op(&Op::Attend {
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
            })
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
