//! The DFlash block drafter kept on a device (`--device cuda|hip|cpu-emu`), when every linear of
//! the draft and the target's lm_head run there: the context (`hidden_norm(fc(taps))`, each
//! layer's context keys with their head norm and rotary, and values) and every block pass —
//! the embedding of `[x_r, MASK × (B−1)]`, the Qwen3 layers (input norm, q/k/v, per-head q/k
//! norms, rotary at r..r+B−1, attention over the context rows < r and the block's own rows,
//! o_proj and the residuals, the SwiGLU MLP), the final norm of slots 1..B−1 and the lm_head's
//! argmax — run as device kernels. The taps go up once per sequence; token ids, positions and
//! row indices go up, one proposal index per slot comes back.
//!
//! The block attention is `kq_attend` with the roots as its replay rows: root `r0 + j` attends
//! context keys `0..r0 + j − 1` (the "depth-0" keys, `start = r0 − 1`) and, as its diagonal
//! keys, its own block's B rows (key `e` of root `j` at slot `j`: the block keys laid out
//! e-major). The f32 runtime (`DFlash::slots`, `DFlash::blocks_ref`) is the reference; tested
//! on `cpu-emu` against the per-linear device path.

use std::sync::Arc;

use super::model::Model;
use crate::gpu::{self, AttendDims, Backend, DevTensor, GpuError, Strided};
use crate::runtime::linears::DeviceLayer;
use crate::runtime::on_device::{attention_fits, layer, upload_table, Mlp, Run, Staged};

/// One layer's linears on the device.
struct LayerOn<'a> {
    q: DeviceLayer<'a>,
    k: DeviceLayer<'a>,
    v: DeviceLayer<'a>,
    o: DeviceLayer<'a>,
    mlp: Mlp<'a>,
}

/// One layer's norms on the device.
struct LayerNorms {
    q: DevTensor,
    k: DevTensor,
    input: DevTensor,
    post: DevTensor,
}

/// Every linear of the drafter on the device: fc, each layer's, the target's lm_head.
fn linears(d: &Model) -> Result<(DeviceLayer<'_>, Vec<LayerOn<'_>>, DeviceLayer<'_>), String> {
    let layers = d
        .layers
        .iter()
        .map(|l| {
            let g = l.attn.gqa().ok_or("the MLA attention runs on the CPU")?;
            Ok(LayerOn {
                q: layer(&g.q)?,
                k: layer(&g.k)?,
                v: layer(&g.v)?,
                o: layer(&g.o)?,
                mlp: (layer(&l.gate)?, layer(&l.up)?, layer(&l.down)?),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((layer(&d.fc)?, layers, layer(&d.lm_head)?))
}

/// The drafter's embedding table and norms on the device, uploaded once at load.
pub struct DeviceStep {
    dev: Arc<dyn Backend>,
    table: DevTensor,
    hidden_norm: DevTensor,
    norm: DevTensor,
    layers: Vec<LayerNorms>,
}

/// Every layer's context keys and values on the device, `[len, kv_heads · head_dim]` each.
struct Context {
    len: usize,
    k: Vec<DevTensor>,
    v: Vec<DevTensor>,
}

impl DeviceStep {
    /// Upload the target's embedding and the norms when every linear is on `dev`; `Ok(Err(why))`
    /// when the step cannot stay there.
    pub(super) fn new(d: &Model, dev: Arc<dyn Backend>) -> gpu::Result<Result<DeviceStep, String>> {
        if d.kind != super::variant::Kind::Dflash {
            return Ok(Err(format!(
                "the {} head and block run on the CPU; the device takes DFlash's step only",
                d.kind.name()
            )));
        }
        if let Err(why) = linears(d).and_then(|_| attention_fits(&*dev, d.head_dim)) {
            return Ok(Err(why));
        }
        let table = match upload_table(&*dev, &d.embed)? {
            Ok(t) => t,
            Err(why) => return Ok(Err(why)),
        };
        let up = |v: &[f32]| dev.upload_tensor(gpu::Host::F32(v));
        let layers = d
            .layers
            .iter()
            .filter_map(|l| l.attn.gqa().map(|g| (l, g)))
            .map(|(l, g)| {
                Ok(LayerNorms {
                    q: up(&g.q_norm)?,
                    k: up(&g.k_norm)?,
                    input: up(&l.input_norm)?,
                    post: up(&l.post_norm)?,
                })
            })
            .collect::<gpu::Result<Vec<_>>>()?;
        Ok(Ok(DeviceStep {
            table,
            hidden_norm: up(&d.hidden_norm)?,
            norm: up(&d.norm)?,
            layers,
            dev,
        }))
    }

    fn run(&self) -> Run<'_> {
        Run { dev: &*self.dev }
    }

    /// The proposals (target ids) of slots 1..b−1 for each of the consecutive roots
    /// `r0..r0 + count` (r0 ≥ 1), the context being the first `len` ≥ r0 + count − 1 rows of
    /// `feats` (`[len, K·ht]`): `DFlash::block_tokens` computed on the device.
    pub(super) fn block_tokens(
        &self,
        d: &Model,
        feats: &[f32],
        len: usize,
        x: &[u32],
        (r0, count): (usize, usize),
        b: usize,
    ) -> Staged<Vec<Vec<u32>>> {
        let (fc, layers, lm_head) =
            linears(d).map_err(|why| ("placement", GpuError::Unsupported("device step", why)))?;
        assert!(r0 >= 1 && r0 + count - 1 <= len && r0 + count <= x.len());
        let run = self.run();
        let cs = run.f32(&d.rope.table(len + b + 1), "rope table")?;
        let ctx = self.context(d, (fc, &layers), feats, len, &cs)?;
        // Roots a bounded number at a time, as the CPU path makes them (the logits held stay
        // under 2^26).
        let per_root = (b - 1) * d.vocab.max(d.h);
        let chunk = ((1usize << 26) / per_root).clamp(1, 64);
        let mut out = Vec::with_capacity(count);
        for c0 in (0..count).step_by(chunk) {
            let n = chunk.min(count - c0);
            let best = self.blocks(d, (&layers, lm_head), &ctx, &cs, x, (r0 + c0, n), b)?;
            out.extend(
                best.chunks(b - 1)
                    .map(|blk| blk.iter().map(|&t| t as u32).collect::<Vec<u32>>()),
            );
        }
        Ok(out)
    }

    /// `DFlash::context` on the device.
    fn context(
        &self,
        d: &Model,
        (fc, layers): (DeviceLayer<'_>, &[LayerOn<'_>]),
        feats: &[f32],
        len: usize,
        cs: &DevTensor,
    ) -> Staged<Context> {
        let run = self.run();
        let (h, hd) = (d.h, d.head_dim);
        let kvd = d.kv_heads * hd;
        let f = run.f32(&feats[..len * d.taps.len() * d.ht], "taps")?;
        let x = run.linear(fc, &f, len, "fc")?;
        drop(f);
        let c = run.normed(&x, &self.hidden_norm, (len, h, d.eps))?;
        let pos = run.index(0..len, cs.len() / d.head_dim, "positions")?;
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for (l, norms) in layers.iter().zip(&self.layers) {
            let k = run.linear(l.k, &c, len, "context keys")?;
            let at = Strided { ld: hd, off: 0 };
            run.rms(&k, &norms.k, &k, (len * d.kv_heads, hd, d.eps), at, at)?;
            self.rope(&k, &pos, cs, len, d.kv_heads, hd)?;
            ks.push(k);
            vs.push(run.linear(l.v, &c, len, "context values")?);
        }
        debug_assert!(ks.iter().all(|k| k.len() == len * kvd));
        Ok(Context { len, k: ks, v: vs })
    }

    /// NeoX rotary on `n` rows of `heads` heads of `hd`.
    fn rope(
        &self,
        t: &DevTensor,
        pos: &DevTensor,
        cs: &DevTensor,
        n: usize,
        heads: usize,
        hd: usize,
    ) -> Staged<()> {
        let at = Strided {
            ld: heads * hd,
            off: 0,
        };
        let geometry = (heads, hd / 2, hd);
        self.run().rope(t, (pos, cs), n, geometry, at, false)
    }

    /// One block pass for the `n` consecutive roots from `r0`: the argmax of slots 1..b−1 of
    /// each, `[n · (b−1)]` draft-vocabulary (= target) ids.
    #[allow(clippy::too_many_arguments)]
    fn blocks(
        &self,
        d: &Model,
        (layers, lm_head): (&[LayerOn<'_>], DeviceLayer<'_>),
        ctx: &Context,
        cs: &DevTensor,
        x: &[u32],
        (r0, n): (usize, usize),
        b: usize,
    ) -> Staged<Vec<usize>> {
        let run = self.run();
        let (h, hd) = (d.h, d.head_dim);
        let kvd = d.kv_heads * hd;
        let m = n * b;
        assert!(r0 >= 1 && r0 - 1 + n <= ctx.len, "roots past the context");
        let toks = (0..n).flat_map(|j| {
            std::iter::once(x[r0 + j] as usize).chain((1..b).map(|_| d.mask_id as usize))
        });
        let ids = run.index(toks, d.vocab, "token ids")?;
        let mut hid = run.embed(&self.table, &ids, m, h)?;
        let positions = cs.len() / hd;
        let pos = run.index(
            (0..n).flat_map(|j| (0..b).map(move |i| r0 + j + i)),
            positions,
            "positions",
        )?;
        // Query row j·b + i belongs to root j; block key e of root j sits at e·n + j.
        let rows = run.index((0..n).flat_map(|j| (0..b).map(move |_| j)), n, "rows")?;
        let slots = run.index((0..b).flat_map(|_| 0..n), n, "slots")?;
        let e_major = run.index(
            (0..b).flat_map(|e| (0..n).map(move |j| j * b + e)),
            m,
            "rows",
        )?;
        for ((l, norms), (ck, cv)) in layers
            .iter()
            .zip(&self.layers)
            .zip(ctx.k.iter().zip(&ctx.v))
        {
            let xn = run.normed(&hid, &norms.input, (m, h, d.eps))?;
            let q = run.linear(l.q, &xn, m, "q_proj")?;
            let k = run.linear(l.k, &xn, m, "k_proj")?;
            let v = run.linear(l.v, &xn, m, "v_proj")?;
            drop(xn);
            let at = Strided { ld: hd, off: 0 };
            run.rms(&q, &norms.q, &q, (m * d.heads, hd, d.eps), at, at)?;
            run.rms(&k, &norms.k, &k, (m * d.kv_heads, hd, d.eps), at, at)?;
            self.rope(&q, &pos, cs, m, d.heads, hd)?;
            self.rope(&k, &pos, cs, m, d.kv_heads, hd)?;
            let (kd, vd) = (
                run.gather(&k, &e_major, m, kvd)?,
                run.gather(&v, &e_major, m, kvd)?,
            );
            drop((k, v));
            let dims = AttendDims {
                m,
                n,
                start: r0 - 1,
                diag: b,
                heads: d.heads,
                kv_heads: d.kv_heads,
                dq: hd,
                dv: hd,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let attn = run.attend(&q, (ck, cv), (&kd, &vd), (&rows, &slots), dims)?;
            hid = run.layer_tail((l.o, l.mlp), &norms.post, (&attn, &hid), (m, h, d.eps))?;
        }
        // Slots 1..b−1 of every root, final-normed, through the target's lm_head.
        let sl = run.index(
            (0..n).flat_map(|j| (1..b).map(move |i| j * b + i)),
            m,
            "slots",
        )?;
        let rows_out = n * (b - 1);
        hid = run.gather(&hid, &sl, rows_out, h)?;
        let normed = run.normed(&hid, &self.norm, (rows_out, h, d.eps))?;
        run.argmax(lm_head, &normed, rows_out, d.vocab)
    }
}
