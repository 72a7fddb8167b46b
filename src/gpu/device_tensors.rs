//! The one [`Tensors`] implementation, written once for every [`Driver`] on [`Device`]:
//! tensors uploaded with their bounds checked, zeroed and read back, each step op checked then
//! launched, and the linears and the row argmax on tensors through the regimes' launches.

use super::dense::{check_dense_call, DeviceDense};
use super::dispatch::{Call, DenseBuf, Device};
use super::driver::{Driver, Gemm};
use super::ops::{DevTensor, Host, Op};
use super::tensors::Tensors;
use super::{check_call, DeviceW4, Elem, GpuError, Result};

impl<D: Driver> Device<D> {
    /// The driver's buffer of `t`.
    pub(super) fn buf<'t>(&self, t: &'t DevTensor) -> Result<&'t D::Buf> {
        t.get::<D::Buf>(D::BACKEND)
    }

    /// Launch a step kernel ([`Op::launch`]: checked first).
    fn run_op(&self, op: &Op<'_>) -> Result<()> {
        let warp = self.driver().arch().tune().warp;
        let (kernel, grid, block) = op.launch(&|t| self.buf(t), warp)?;
        // SAFETY: `Op::check` (in `Op::launch`): every tensor holds what the kernel reads and
        // writes at this geometry, and every index tensor's values are inside what it indexes.
        unsafe { self.driver().launch(&kernel, grid, block) }
    }

    /// A tensor holding `data` (indices and raw bytes checked first).
    fn upload_host(&self, data: Host<'_>) -> Result<DevTensor> {
        data.check()?;
        let (buf, bound) = match data {
            Host::F32(v) => (self.driver().htod(v)?, None),
            Host::Half(_, v) => (self.driver().htod(v)?, None),
            Host::Index(v, bound) => (self.driver().htod(v)?, Some(bound)),
            Host::Le(_, b) => (self.driver().htod(b)?, None),
        };
        Ok(DevTensor::new(
            data.elem(),
            data.len(),
            bound,
            Box::new(buf),
        ))
    }

    /// A zeroed f32 or 16-bit tensor (index tensors are uploaded, with their bound).
    fn zeros_of(&self, elem: Elem, len: usize) -> Result<DevTensor> {
        if elem == Elem::I32 {
            return Err(GpuError::Layout(
                "index tensors are uploaded (their values checked), not allocated".into(),
            ));
        }
        let buf = self.driver().alloc(len * elem.size())?;
        Ok(DevTensor::new(elem, len, None, Box::new(buf)))
    }
}

impl<D: Driver> Tensors for Device<D> {
    fn upload_tensor(&self, data: Host<'_>) -> Result<DevTensor> {
        self.upload_host(data)
    }

    fn zeros(&self, elem: Elem, len: usize) -> Result<DevTensor> {
        self.zeros_of(elem, len)
    }

    fn read_f32(&self, t: &DevTensor) -> Result<Vec<f32>> {
        if t.elem() != Elem::F32 {
            return Err(GpuError::Layout(format!(
                "reading a {} tensor as f32",
                t.elem().name()
            )));
        }
        self.driver().dtoh_f32(self.buf(t)?, t.len())
    }

    fn op(&self, op: &Op<'_>) -> Result<()> {
        self.run_op(op)
    }

    fn w4a16_dev(&self, w: &DeviceW4, x: &DevTensor, m: usize, out: &DevTensor) -> Result<()> {
        let Elem::Half(act) = x.elem() else {
            return Err(GpuError::Layout(
                "W4A16 activations must be bf16 or f16".into(),
            ));
        };
        let regime = w.regime_on(self, m);
        check_call(w, m * w.k, m, regime)?;
        tensor_holds(x, m * w.k, "x")?;
        tensor_holds(out, m * w.n, "out")?;
        if out.elem() != Elem::F32 {
            return Err(GpuError::Layout("W4A16 output must be f32".into()));
        }
        let c = Call {
            w,
            bufs: self.bufs(w)?,
            x: self.buf(x)?,
            act,
            m,
            out: self.buf(out)?,
        };
        let mut sc = self.scratch();
        self.run_w4a16(&c, regime, &mut sc)
    }

    fn dense_dev(&self, w: &DeviceDense, x: &DevTensor, m: usize, out: &DevTensor) -> Result<()> {
        check_dense_call(w, m * w.k, m)?;
        if x.elem() != Elem::Half(w.dtype) || out.elem() != Elem::F32 {
            return Err(GpuError::Layout(format!(
                "dense GEMM of a {} weight on {} activations into {}",
                w.dtype.name(),
                x.elem().name(),
                out.elem().name()
            )));
        }
        tensor_holds(x, m * w.k, "x")?;
        tensor_holds(out, m * w.n, "out")?;
        let DenseBuf(wd) = w.get::<DenseBuf<D::Buf>>(D::BACKEND)?;
        let g = Gemm {
            n: w.n,
            k: w.k,
            m,
            act: w.dtype,
        };
        // SAFETY: wd holds n·k and x at least m·k values of w.dtype, out m·n f32 (checked).
        unsafe { self.driver().gemm(g, wd, self.buf(x)?, self.buf(out)?) }
    }

    fn argmax_dev(&self, y: &DevTensor, m: usize, n: usize) -> Result<Vec<usize>> {
        if y.elem() != Elem::F32 {
            return Err(GpuError::Layout("argmax of a non-f32 tensor".into()));
        }
        tensor_holds(y, m * n, "y")?;
        self.argmax_of(self.buf(y)?, m, n)
    }
}

/// `t` holds at least `need` values.
fn tensor_holds(t: &DevTensor, need: usize, what: &str) -> Result<()> {
    if t.len() >= need {
        Ok(())
    } else {
        Err(GpuError::Layout(format!(
            "{what} holds {} values, the call needs {need}",
            t.len()
        )))
    }
}
