//! The element-wise step kernels, one thread per value: SwiGLU's `silu(g) · u`
//! (`kq_silu_mul`, [`SiluMul`]), the residual add (`kq_add`, [`Add`]) and the rounding of f32
//! to a linear's 16-bit input (`kq_to_act_*`, [`ToAct`]) — each with its checks, its launch and
//! its CPU replay.

use super::step::{elementwise, half, holds, int, Bufs, DeviceOp, Launch};
use super::tensor::DevTensor;
use crate::gpu::emu_launch::{HostBuf, Replay};
use crate::gpu::source::{args, Kernel};
use crate::gpu::{Elem, Result};

/// `out = silu(g) · u` over `len` values.
pub struct SiluMul<'a> {
    pub g: &'a DevTensor,
    pub u: &'a DevTensor,
    pub out: &'a DevTensor,
    pub len: usize,
}

impl<'a> DeviceOp<'a> for SiluMul<'a> {
    fn check(&self) -> Result<()> {
        let (f, len) = (Elem::F32, self.len);
        holds("gate", self.g, f, int("len", len)?)?;
        holds("up", self.u, f, len)?;
        holds("silu out", self.out, f, len)
    }

    fn launch<B: 'a>(&self, b: &Bufs<'a, '_, B>, _warp: u32) -> Result<Launch<'a, B>> {
        let (gr, bl) = elementwise(self.len);
        let k = Kernel::SiluMul(args::SiluMul {
            g: b(self.g)?,
            u: b(self.u)?,
            out: b(self.out)?,
            len: self.len,
        });
        Ok((k, gr, bl))
    }
}

impl SiluMul<'_> {
    /// `kq_silu_mul` on the CPU.
    pub fn replay(k: &args::SiluMul<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
        r.threads_cover(k.len)?;
        let (g, u) = (k.g.read::<f32>(k.len)?, k.u.read::<f32>(k.len)?);
        let y: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&a, &b)| a / (1.0 + (-a).exp()) * b)
            .collect();
        k.out.write(&y)
    }
}

/// `out = a + b` over `len` values.
pub struct Add<'a> {
    pub a: &'a DevTensor,
    pub b: &'a DevTensor,
    pub out: &'a DevTensor,
    pub len: usize,
}

impl<'a> DeviceOp<'a> for Add<'a> {
    fn check(&self) -> Result<()> {
        let (f, len) = (Elem::F32, self.len);
        holds("add a", self.a, f, int("len", len)?)?;
        holds("add b", self.b, f, len)?;
        holds("add out", self.out, f, len)
    }

    fn launch<B: 'a>(&self, b: &Bufs<'a, '_, B>, _warp: u32) -> Result<Launch<'a, B>> {
        let (gr, bl) = elementwise(self.len);
        let k = Kernel::Add(args::Add {
            a: b(self.a)?,
            b: b(self.b)?,
            out: b(self.out)?,
            len: self.len,
        });
        Ok((k, gr, bl))
    }
}

impl Add<'_> {
    /// `kq_add` on the CPU.
    pub fn replay(k: &args::Add<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
        r.threads_cover(k.len)?;
        let (a, b) = (k.a.read::<f32>(k.len)?, k.b.read::<f32>(k.len)?);
        let y: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        k.out.write(&y)
    }
}

/// `y` (16-bit) = `x` rounded, `len` values.
pub struct ToAct<'a> {
    pub x: &'a DevTensor,
    pub y: &'a DevTensor,
    pub len: usize,
}

impl<'a> DeviceOp<'a> for ToAct<'a> {
    fn check(&self) -> Result<()> {
        holds("to_act in", self.x, Elem::F32, int("len", self.len)?)?;
        let a = half(self.y, "to_act out")?;
        holds("to_act out", self.y, Elem::Half(a), self.len)
    }

    fn launch<B: 'a>(&self, b: &Bufs<'a, '_, B>, _warp: u32) -> Result<Launch<'a, B>> {
        let (gr, bl) = elementwise(self.len);
        let k = Kernel::ToAct(args::ToAct {
            act: half(self.y, "to_act out")?,
            x: b(self.x)?,
            y: b(self.y)?,
            len: self.len,
        });
        Ok((k, gr, bl))
    }
}

impl ToAct<'_> {
    /// `kq_to_act_*` on the CPU: round to nearest even, as `cvt.rn` (the half crate's
    /// conversion).
    pub fn replay(k: &args::ToAct<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
        r.threads_cover(k.len)?;
        let x = k.x.read::<f32>(k.len)?;
        let y: Vec<u16> = x.iter().map(|&v| k.act.from_f32(v)).collect();
        k.y.write(&y)
    }
}
