//! The element-wise step kernels, one thread per value: SwiGLU's `silu(g) · u`
//! (`kq_silu_mul`, [`SiluMul`]), the residual add (`kq_add`, [`Add`]) and the rounding of f32
//! to a linear's 16-bit input (`kq_to_act_*`, [`ToAct`]) — each with its checks, its launch and
//! its CPU replay.

use super::step::{elementwise, half, holds, int, Bufs, DeviceOp, Launch};
use super::tensor::DevTensor;
use crate::gpu::emu_launch::{HostBuf, Replay};
use crate::gpu::source::{args, Kernel};
use crate::gpu::{Elem, Result};

/// What [`SiluMul`] and [`Add`] check alike: both inputs and the output hold `len` f32 each
/// (`names`: the inputs', then the output's, as the errors say them).
fn check_pair(names: [&str; 3], [a, b, out]: [&DevTensor; 3], len: usize) -> Result<()> {
    let f = Elem::F32;
    holds(names[0], a, f, int("len", len)?)?;
    holds(names[1], b, f, len)?;
    holds(names[2], out, f, len)
}

/// The CPU replay [`SiluMul`] and [`Add`] share: `out[i] = f(a[i], b[i])` over `len` f32.
fn replay_pair(
    r: &Replay<'_>,
    [a, b, out]: [&HostBuf; 3],
    len: usize,
    f: impl Fn(f32, f32) -> f32,
) -> Result<()> {
    r.threads_cover(len)?;
    let (a, b) = (a.read::<f32>(len)?, b.read::<f32>(len)?);
    let y: Vec<f32> = a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect();
    out.write(&y)
}

/// `out = silu(g) · u` over `len` values.
pub struct SiluMul<'a> {
    pub g: &'a DevTensor,
    pub u: &'a DevTensor,
    pub out: &'a DevTensor,
    pub len: usize,
}

impl<'a> DeviceOp<'a> for SiluMul<'a> {
    fn check(&self) -> Result<()> {
        check_pair(
            ["gate", "up", "silu out"],
            [self.g, self.u, self.out],
            self.len,
        )
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
        replay_pair(r, [k.g, k.u, k.out], k.len, |a, b| {
            a / (1.0 + (-a).exp()) * b
        })
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
        check_pair(
            ["add a", "add b", "add out"],
            [self.a, self.b, self.out],
            self.len,
        )
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
        replay_pair(r, [k.a, k.b, k.out], k.len, |x, y| x + y)
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
