//! What a draft step kept on a device is made of, shared by the EAGLE-3 step
//! (`eagle3::device`) and the DFlash one (`dflash::device`): [`Run`] wraps a [`Backend`] with
//! the few moves every step makes — upload values and checked indices, round a linear's input to
//! its dtype and run it, gather embedding rows and tensor rows, RMSNorm between strided rows, the
//! residual adds, SwiGLU, and an lm_head's row argmax a bounded block of logits at a time — each
//! failure naming the stage it happened in ([`Staged`]). The embedding table goes up as it is
//! stored ([`upload_table`]).

use std::sync::Arc;

use crate::gpu::ops::{self, AttendDims, Op};
use crate::gpu::{self, Backend, DevTensor, Elem, GpuError, Host, Strided};
use crate::io::Dtype;
use crate::runtime::embed::{Embedding, Stored};
use crate::runtime::linears::{DeviceLayer, Exec, Linear, Step};

/// A SwiGLU MLP's linears on the device: `(gate, up, down)`.
pub type Mlp<'a> = (DeviceLayer<'a>, DeviceLayer<'a>, DeviceLayer<'a>);

/// A step's result, or the stage that failed and why.
pub type Staged<T> = Result<T, (&'static str, GpuError)>;

/// Name the stage of a device call's failure.
pub trait At<T> {
    fn at(self, stage: &'static str) -> Staged<T>;
}

impl<T> At<T> for gpu::Result<T> {
    fn at(self, stage: &'static str) -> Staged<T> {
        self.map_err(|e| (stage, e))
    }
}

/// Logits a step holds at once (rows of an lm_head's output per argmax block).
pub const LOGITS_PER_BLOCK: usize = 1 << 26;

/// The layer of `l` on the device, or why a step cannot stay there.
pub fn layer(l: &Linear) -> Result<DeviceLayer<'_>, String> {
    l.device_layer()
        .ok_or_else(|| format!("`{}` runs on the CPU", l.module))
}

/// `why` when the attention kernel cannot hold a value head of `dv` on `dev`.
pub fn attention_fits(dev: &dyn Backend, dv: usize) -> Result<(), String> {
    let most = gpu::source::ATT_VALUES_PER_LANE * dev.arch().tune().warp as usize;
    if dv > most {
        Err(format!(
            "a value head width of {dv} (the attention kernel holds {most} per warp)"
        ))
    } else {
        Ok(())
    }
}

/// The embedding table on `dev` as it is held (f32, or the mapped file's bf16 / f16 / f32
/// bytes), or why not (another dtype).
pub fn upload_table(dev: &dyn Backend, e: &Embedding) -> gpu::Result<Result<DevTensor, String>> {
    Ok(Ok(match e.stored() {
        Stored::F32(v) => dev.upload_tensor(Host::F32(v))?,
        Stored::Bytes(Dtype::BF16, b) => {
            dev.upload_tensor(Host::Le(Elem::Half(gpu::Act::Bf16), b))?
        }
        Stored::Bytes(Dtype::F16, b) => {
            dev.upload_tensor(Host::Le(Elem::Half(gpu::Act::F16), b))?
        }
        Stored::Bytes(Dtype::F32, b) => dev.upload_tensor(Host::Le(Elem::F32, b))?,
        Stored::Bytes(other, _) => return Ok(Err(format!("an embedding stored as {other:?}"))),
    }))
}

/// Where a draft's step runs under `exec`: `None` on the CPU; on a device, the step `make`
/// builds (uploading what it needs) or why it cannot stay there, or the per-linear path asked
/// for.
pub fn place<S>(
    exec: &Exec,
    make: impl FnOnce(Arc<dyn Backend>) -> gpu::Result<Result<S, String>>,
) -> gpu::Result<Option<Result<S, String>>> {
    Ok(match exec {
        Exec::Device {
            dev,
            step: Step::Whole,
            ..
        } => Some(make(dev.clone())?),
        Exec::Device {
            step: Step::PerLinear,
            ..
        } => Some(Err("--step per-linear".into())),
        _ => None,
    })
}

/// A draft as it runs: its model (read through, `Deref`: `d.h`, `d.taps`, …) and where its step
/// runs — the whole step on a device, why it could not stay there, or `None` (no device). The
/// model is what the forward, the loader and the device step read; the placement is the draft's
/// own (`eagle3::Eagle3`, `dflash::DFlash`).
pub struct Placed<M, S> {
    pub(super) m: M,
    pub(super) step: Option<Result<S, String>>,
}

impl<M, S> std::ops::Deref for Placed<M, S> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.m
    }
}

/// `Drafter::device_step` of a placed step.
pub fn placement<S>(step: &Option<Result<S, String>>) -> Option<Result<(), String>> {
    step.as_ref()
        .map(|s| s.as_ref().map(|_| ()).map_err(Clone::clone))
}

/// A step's moves on one device.
#[derive(Clone, Copy)]
pub struct Run<'d> {
    pub dev: &'d dyn Backend,
}

impl Run<'_> {
    /// Queue one step op, a failure named `stage`.
    pub fn op<'t>(&self, op: impl Into<Op<'t>>, stage: &'static str) -> Staged<()> {
        self.dev.op(&op.into()).at(stage)
    }

    pub fn f32(&self, v: &[f32], stage: &'static str) -> Staged<DevTensor> {
        self.dev.upload_tensor(Host::F32(v)).at(stage)
    }

    /// Indices, each checked to be below `bound`.
    pub fn index(
        &self,
        v: impl IntoIterator<Item = usize>,
        bound: usize,
        stage: &'static str,
    ) -> Staged<DevTensor> {
        let v: Vec<i32> = v
            .into_iter()
            .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
            .collect();
        self.dev.upload_tensor(Host::Index(&v, bound)).at(stage)
    }

    /// `len` zeroed f32.
    pub fn zeros(&self, len: usize, stage: &'static str) -> Staged<DevTensor> {
        self.dev.zeros(Elem::F32, len).at(stage)
    }

    /// `x` (f32 `[m, k]`) rounded to the layer's dtype, then the layer: `[m, n]` f32.
    pub fn linear(
        &self,
        l: DeviceLayer<'_>,
        x: &DevTensor,
        m: usize,
        stage: &'static str,
    ) -> Staged<DevTensor> {
        let len = x.len();
        let xa = self.dev.zeros(Elem::Half(l.act()), len).at(stage)?;
        self.op(ops::ToAct { x, y: &xa, len }, stage)?;
        l.forward(&xa, m).at(stage)
    }

    /// Rows `ids` of `table`, `[n, h]` f32.
    pub fn embed(
        &self,
        table: &DevTensor,
        ids: &DevTensor,
        n: usize,
        h: usize,
    ) -> Staged<DevTensor> {
        let out = self.zeros(n * h, "embedding")?;
        self.op(
            ops::Embed {
                table,
                ids,
                out: &out,
                n,
                h,
            },
            "embedding",
        )?;
        Ok(out)
    }

    /// Rows `idx` of `src` (rows of `w`), `[m, w]`.
    pub fn gather(
        &self,
        src: &DevTensor,
        idx: &DevTensor,
        m: usize,
        w: usize,
    ) -> Staged<DevTensor> {
        let out = self.zeros(m * w, "gather")?;
        self.op(
            ops::Gather {
                src,
                idx,
                dst: &out,
                m,
                w,
                dst_off: 0,
            },
            "gather",
        )?;
        Ok(out)
    }

    /// RMSNorm of `n` rows of `h` (epsilon `eps`) from `x` at `input` into `out` at `output`.
    pub fn rms(
        &self,
        x: &DevTensor,
        w: &DevTensor,
        out: &DevTensor,
        (n, h, eps): (usize, usize, f32),
        input: Strided,
        output: Strided,
    ) -> Staged<()> {
        self.op(
            ops::RmsNorm {
                x,
                w,
                out,
                n,
                h,
                eps,
                input,
                output,
            },
            "norm",
        )
    }

    /// RMSNorm of `n` whole rows of `h` into a new tensor.
    pub fn normed(
        &self,
        x: &DevTensor,
        w: &DevTensor,
        (n, h, eps): (usize, usize, f32),
    ) -> Staged<DevTensor> {
        let out = self.zeros(n * h, "norm")?;
        let at = Strided { ld: h, off: 0 };
        self.rms(x, w, &out, (n, h, eps), at, at)?;
        Ok(out)
    }

    /// `out = a + b`, `len` values.
    pub fn add(&self, a: &DevTensor, b: &DevTensor, out: &DevTensor, len: usize) -> Staged<()> {
        self.op(ops::Add { a, b, out, len }, "residual")
    }

    /// The SwiGLU MLP on `x` (`[m, h]`): `down(silu(gate(x)) · up(x))`, `[m, h]`.
    pub fn mlp(&self, (gate, up, down): Mlp<'_>, x: &DevTensor, m: usize) -> Staged<DevTensor> {
        let g = self.linear(gate, x, m, "gate_proj")?;
        let u = self.linear(up, x, m, "up_proj")?;
        let len = g.len();
        self.op(
            ops::SiluMul {
                g: &g,
                u: &u,
                out: &g,
                len,
            },
            "silu",
        )?;
        drop(u);
        self.linear(down, &g, m, "down_proj")
    }

    /// Rotary embedding in place on `n` rows of `x`, row `r` at position `pos[r]` of the table
    /// `cs`: `heads` heads of `2·half` values, `head_ld` apart, from `at`; NeoX or interleaved
    /// pairs.
    pub fn rope(
        &self,
        x: &DevTensor,
        (pos, cs): (&DevTensor, &DevTensor),
        n: usize,
        (heads, half, head_ld): (usize, usize, usize),
        at: Strided,
        interleaved: bool,
    ) -> Staged<()> {
        let op = ops::Rope {
            x,
            pos,
            cs,
            n,
            heads,
            half,
            at,
            head_ld,
            interleaved,
        };
        self.op(op, "rotary")
    }

    /// Attention of the query rows `rows` of `q` over depth 0's keys and values `k0v0` and the
    /// diagonal ones `kdvd` (each query's at `slots`): `[m, heads·dv]`.
    pub fn attend(
        &self,
        q: &DevTensor,
        (k0, v0): (&DevTensor, &DevTensor),
        (kd, vd): (&DevTensor, &DevTensor),
        (rows, slots): (&DevTensor, &DevTensor),
        dims: AttendDims,
    ) -> Staged<DevTensor> {
        let out = self.zeros(dims.m * dims.heads * dims.dv, "attention")?;
        let op = ops::Attend {
            q,
            k0,
            v0,
            kd,
            vd,
            rows,
            slots,
            out: &out,
            dims,
        };
        self.op(op, "attention")?;
        Ok(out)
    }

    /// The rest of a decoder layer after attention: `h1 = res + o_proj(attn)`, then
    /// `h1 + mlp(post_norm(h1))` (`[m, h]`, epsilon `eps`).
    pub fn layer_tail(
        &self,
        (o, mlp): (
            DeviceLayer<'_>,
            (DeviceLayer<'_>, DeviceLayer<'_>, DeviceLayer<'_>),
        ),
        post_norm: &DevTensor,
        (attn, res): (&DevTensor, &DevTensor),
        (m, h, eps): (usize, usize, f32),
    ) -> Staged<DevTensor> {
        let h1 = self.linear(o, attn, m, "o_proj")?;
        self.add(&h1, res, &h1, m * h)?;
        let xn = self.normed(&h1, post_norm, (m, h, eps))?;
        let dn = self.mlp(mlp, &xn, m)?;
        self.add(&h1, &dn, &dn, m * h)?;
        Ok(dn)
    }

    /// The lm_head's argmax of each of the `m` rows of `x` (a block of rows at a time, so the
    /// logits held stay bounded).
    pub fn argmax(
        &self,
        lm_head: DeviceLayer<'_>,
        x: &DevTensor,
        m: usize,
        vocab: usize,
    ) -> Staged<Vec<usize>> {
        let block = (LOGITS_PER_BLOCK / vocab.max(1)).max(1);
        let w = x.len() / m.max(1);
        let mut best = Vec::with_capacity(m);
        for r0 in (0..m).step_by(block) {
            let rows = block.min(m - r0);
            let part;
            let xb = if rows == m {
                x
            } else {
                let idx = self.index(r0..r0 + rows, m, "lm_head")?;
                part = self.gather(x, &idx, rows, w)?;
                &part
            };
            let logits = self.linear(lm_head, xb, rows, "lm_head")?;
            best.extend(self.dev.argmax_dev(&logits, rows, vocab).at("argmax")?);
        }
        Ok(best)
    }
}
