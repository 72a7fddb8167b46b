//! [`Device`]: the one [`Backend`], over any [`Driver`]. What a W4A16 / W4A8 call does is
//! written here once for CUDA, HIP and the CPU emulation: the regime's kernels in order, their
//! launch geometry ([`super::tune`]), the scratch buffers they need (grown on demand, so timed
//! loops allocate nothing) and each launch's [`Kernel`] (argument lists: [`super::source`]), with
//! the buffer sizes each launch relies on stated once, at the launch. The same for the dense
//! (unquantized) path: the vendor GEMM on the uploaded weight, and `kq_argmax_rows` after it (or
//! after a W4A16 call) when only each row's argmax comes back. The CPU tests therefore run
//! the very launch sequence a GPU runs, with the CPU replay of each kernel ([`super::emu`]).

use std::sync::{Mutex, MutexGuard};

use super::dense::{check_dense, check_dense_call};
use super::driver::{Dim3, Driver, Gemm};
use super::layout::{W4Layout, CHUNK};
use super::source::{args, Kernel, ARGMAX_THREADS};
use super::tune::{self, Arch, Regime};
use super::{check_call, check_w4a8, Act, Backend, DeviceDense, DeviceW4, GpuError, Result};

/// Threads per block of the element-wise kernels (the reduces, `kq_scale_cols`) and of
/// `kq_quant_act_i8` (a multiple of every warp width, at most 1024).
const THREADS: u32 = 256;

/// Grid and block of an element-wise kernel over `len` outputs.
fn elementwise(len: usize) -> (Dim3, Dim3) {
    (
        (len.div_ceil(THREADS as usize) as u32, 1, 1),
        (THREADS, 1, 1),
    )
}

/// Weights on a device (what a [`DeviceW4`] uploaded by a [`Device`] holds).
pub(super) struct W4Bufs<B> {
    qweight: B,
    scales: B,
    /// Weights uploaded with [`Backend::upload_kept`]: regime C's dense matrix (`kq_w4_dense`'s
    /// output, in the activation dtype it was made for), made at the first call and kept.
    kept: Option<Mutex<Option<(Act, B)>>>,
}

/// An unquantized weight on a device (what a [`DeviceDense`] uploaded by a [`Device`] holds).
pub(super) struct DenseBuf<B>(pub(super) B);

/// Reusable device buffers: split-K partials (f32 and int32), the dense matrix of regime C, and
/// the int8 activations with their scales and sums.
pub(super) struct Scratch<B> {
    part: Option<B>,
    part_i: Option<B>,
    dense: Option<B>,
    xq: Option<B>,
    xs: Option<B>,
    xsum: Option<B>,
}

/// `slot`, reallocated (zeroed) when it holds fewer than `bytes`.
fn grow<'s, D: Driver>(d: &D, slot: &'s mut Option<D::Buf>, bytes: usize) -> Result<&'s D::Buf> {
    if slot.as_ref().is_none_or(|b| D::size(b) < bytes) {
        *slot = Some(d.alloc(bytes)?);
    }
    Ok(slot.as_ref().expect("just set"))
}

/// One call's operands on the device: `x` holds `m·k` activations in `act`, `out` `m·n` f32.
pub(super) struct Call<'a, B> {
    pub w: &'a DeviceW4,
    pub bufs: &'a W4Bufs<B>,
    pub x: &'a B,
    pub act: Act,
    pub m: usize,
    pub out: &'a B,
}

/// One device that runs the kernels through its [`Driver`].
pub struct Device<D: Driver> {
    driver: D,
    scratch: Mutex<Scratch<D::Buf>>,
}

impl<D: Driver> Device<D> {
    pub fn new(driver: D) -> Device<D> {
        Device {
            driver,
            scratch: Mutex::new(Scratch {
                part: None,
                part_i: None,
                dense: None,
                xq: None,
                xs: None,
                xsum: None,
            }),
        }
    }

    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// The scratch buffers; held for a whole call (or timed loop), so calls from several threads
    /// take turns.
    pub(super) fn scratch(&self) -> MutexGuard<'_, Scratch<D::Buf>> {
        self.scratch.lock().expect("scratch")
    }

    /// The device buffers of weights this device uploaded.
    pub(super) fn bufs<'w>(&self, w: &'w DeviceW4) -> Result<&'w W4Bufs<D::Buf>> {
        w.get::<W4Bufs<D::Buf>>(D::BACKEND)
    }

    /// `out[i] = Σ_split part[split][i]` (`kq_splitk_reduce`).
    fn reduce(&self, part: &D::Buf, out: &D::Buf, mn: usize, splits: usize) -> Result<()> {
        let (grid, block) = elementwise(mn);
        let k = Kernel::SplitkReduce(args::SplitkReduce {
            part,
            out,
            mn,
            splits,
        });
        // SAFETY: part holds splits·mn f32 (grown by the caller), out mn f32.
        unsafe { self.driver.launch(&k, grid, block) }
    }

    /// Regime A: the GEMV `kernel` (made over the split-K partials in `slot`, grown to
    /// `splits·m·n` f32, and the chunks each split sums) on the geometry for `n × k`, then the
    /// splits reduced into `out` (`m·n` f32).
    fn gemv<'k>(
        &self,
        slot: &'k mut Option<D::Buf>,
        (n, k, m): (usize, usize, usize),
        out: &D::Buf,
        kernel: impl FnOnce(&'k D::Buf, usize) -> Kernel<'k, D::Buf>,
    ) -> Result<()> {
        let d = &self.driver;
        let g = tune::gemv(d.arch(), n, k);
        let part = grow(d, slot, g.splits * m * n * 4)?;
        let kernel = kernel(part, g.chunks_per_split);
        // SAFETY: part holds splits·m·n f32; m ≤ GEMV_MAX_M (check_call).
        unsafe { d.launch(&kernel, g.grid, g.block) }?;
        self.reduce(part, out, m * n, g.splits)
    }

    /// W4A16 in `regime` on device operands. Queued, not waited for.
    pub(super) fn run_w4a16(
        &self,
        c: &Call<'_, D::Buf>,
        regime: Regime,
        sc: &mut Scratch<D::Buf>,
    ) -> Result<()> {
        let d = &self.driver;
        let (n, k, m, group) = (c.w.n, c.w.k, c.m, c.w.group);
        let (per_channel, act) = (c.w.per_channel(), c.act);
        let (qweight, scales, x) = (&c.bufs.qweight, &c.bufs.scales, c.x);
        // Throughout: the weights hold n rows of ⌈k/32⌉ 16-byte chunks and their scales (n, or
        // n·⌈k/group⌉), x m·k activations with k % 8 == 0 (check_call: rows are read 16 bytes at
        // a time), out m·n f32.
        match regime {
            Regime::Gemv => self.gemv(&mut sc.part, (n, k, m), c.out, |part, chunks_per_split| {
                Kernel::W4a16Gemv(args::W4a16Gemv {
                    act,
                    per_channel,
                    m,
                    qweight,
                    scales,
                    x,
                    part,
                    n,
                    k,
                    group,
                    chunks_per_split,
                })
            }),
            Regime::Mma => {
                let g = tune::mma(d.arch(), n, k, m, !per_channel);
                let part = grow(d, &mut sc.part, g.splits * m * n * 4)?;
                let kernel = Kernel::W4a16Mma(args::W4a16Mma {
                    act,
                    per_channel,
                    toks: g.toks,
                    qweight,
                    scales,
                    x,
                    part,
                    m,
                    n,
                    k,
                    group,
                    tiles_per_split: g.tiles_per_split,
                });
                // SAFETY: part holds splits·m·n f32, and every (split, tok < m, row < n) of it
                // is written.
                unsafe { d.launch(&kernel, g.grid, g.block) }?;
                self.reduce(part, c.out, m * n, g.splits)
            }
            Regime::Dense => {
                let dequant = |dense: &D::Buf| {
                    let kernel = Kernel::Dequant(args::Dequant {
                        act,
                        per_channel,
                        qweight,
                        scales,
                        dense,
                        n,
                        k,
                        group,
                    });
                    let block = (tune::DENSE_THREADS, 1, 1);
                    // SAFETY: dense holds n·k 16-bit values (both callers size it so).
                    unsafe { d.launch(&kernel, tune::dense(n, k), block) }
                };
                // Kept weights: dequantized once (per activation dtype), then only the GEMM.
                let mut kept = c.bufs.kept.as_ref().map(|s| s.lock().expect("kept dense"));
                let dense: &D::Buf = match kept.as_deref_mut() {
                    Some(slot) => {
                        if slot.as_ref().is_none_or(|(a, _)| *a != act) {
                            let buf = d.alloc(n * k * 2)?;
                            dequant(&buf)?;
                            *slot = Some((act, buf));
                        }
                        &slot.as_ref().expect("just set").1
                    }
                    None => {
                        let dense = grow(d, &mut sc.dense, n * k * 2)?;
                        dequant(dense)?;
                        dense
                    }
                };
                let gemm = Gemm { n, k, m, act };
                // SAFETY: dense n·k and x m·k values of act, out m·n f32.
                unsafe { d.gemm(gemm, dense, x, c.out) }?;
                if per_channel {
                    let (grid, block) = elementwise(m * n);
                    let kernel = Kernel::ScaleCols(args::ScaleCols {
                        out: c.out,
                        scales,
                        m,
                        n,
                    });
                    // SAFETY: out holds m·n f32, scales n.
                    unsafe { d.launch(&kernel, grid, block) }?;
                }
                Ok(())
            }
        }
    }

    /// W4A8 in `regime` on device operands (per channel): activations quantized per token to
    /// int8 first. Queued, not waited for.
    pub(super) fn run_w4a8(
        &self,
        c: &Call<'_, D::Buf>,
        regime: Regime,
        sc: &mut Scratch<D::Buf>,
    ) -> Result<()> {
        let d = &self.driver;
        let (n, k, m) = (c.w.n, c.w.k, c.m);
        let (qweight, scales) = (&c.bufs.qweight, &c.bufs.scales);
        let kp = k.div_ceil(CHUNK) * CHUNK;
        let xq = grow(d, &mut sc.xq, m * kp)?;
        let xs = grow(d, &mut sc.xs, m * 4)?;
        let xsum = grow(d, &mut sc.xsum, m * 4)?;
        let kernel = Kernel::QuantActI8(args::QuantActI8 {
            act: c.act,
            x: c.x,
            xq,
            xs,
            xsum,
            k,
        });
        // SAFETY: one block per token: x holds m·k values, xq m rows of kp bytes (16-byte
        // aligned rows), xs and xsum m each.
        unsafe { d.launch(&kernel, (m as u32, 1, 1), (THREADS, 1, 1)) }?;
        match regime {
            Regime::Gemv => self.gemv(&mut sc.part, (n, k, m), c.out, |part, chunks_per_split| {
                Kernel::W4a8Gemv(args::W4a8Gemv {
                    m,
                    qweight,
                    scales,
                    xq,
                    xs,
                    xsum,
                    part,
                    n,
                    k,
                    chunks_per_split,
                })
            }),
            Regime::Mma | Regime::Dense => {
                let g = tune::mma(d.arch(), n, k, m, false);
                let part = grow(d, &mut sc.part_i, g.splits * m * n * 4)?;
                let kernel = Kernel::W4a8Mma(args::W4a8Mma {
                    toks: g.toks,
                    qweight,
                    xq,
                    part,
                    m,
                    n,
                    k,
                    tiles_per_split: g.tiles_per_split,
                });
                // SAFETY: part holds splits·m·n int32, every (split, tok < m, row < n) written.
                unsafe { d.launch(&kernel, g.grid, g.block) }?;
                let (grid, block) = elementwise(m * n);
                let kernel = Kernel::W4a8Reduce(args::W4a8Reduce {
                    part,
                    scales,
                    xs,
                    xsum,
                    out: c.out,
                    m,
                    n,
                    splits: g.splits,
                });
                // SAFETY: part splits·m·n int32, scales n, xs and xsum m, out m·n f32.
                unsafe { d.launch(&kernel, grid, block) }
            }
        }
    }

    /// Copy the weights to the device; `keep`: regime C's dense matrix is kept after the first
    /// call ([`Backend::upload_kept`]).
    fn upload_with(&self, w: &W4Layout, keep: bool) -> Result<DeviceW4> {
        w.check()?;
        let bufs = W4Bufs {
            qweight: self.driver.htod(&w.qweight)?,
            scales: self.driver.htod(&w.scales)?,
            kept: keep.then(|| Mutex::new(None)),
        };
        Ok(DeviceW4::new(w, keep, Box::new(bufs)))
    }

    /// Upload `x`, run `run`, and read the result back.
    fn call(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        run: impl FnOnce(&Call<'_, D::Buf>, &mut Scratch<D::Buf>) -> Result<()>,
    ) -> Result<Vec<f32>> {
        let out = self.call_into(w, x, act, m, run)?;
        self.driver.dtoh_f32(&out, m * w.n)
    }

    /// Upload `x` and queue `run`: the `m·n` f32 output stays on the device.
    fn call_into(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        run: impl FnOnce(&Call<'_, D::Buf>, &mut Scratch<D::Buf>) -> Result<()>,
    ) -> Result<D::Buf> {
        let bufs = self.bufs(w)?;
        let xd = self.driver.htod(x)?;
        let out = self.driver.alloc(m * w.n * 4)?;
        let mut sc = self.scratch();
        let c = Call {
            w,
            bufs,
            x: &xd,
            act,
            m,
            out: &out,
        };
        run(&c, &mut sc)?;
        Ok(out)
    }

    /// Upload `x` and queue the vendor GEMM of the dense path: the `m·n` f32 output stays on
    /// the device.
    fn dense_into(&self, w: &DeviceDense, x: &[u16], m: usize) -> Result<D::Buf> {
        check_dense_call(w, x.len(), m)?;
        let DenseBuf(wd) = w.get::<DenseBuf<D::Buf>>(D::BACKEND)?;
        let xd = self.driver.htod(x)?;
        let out = self.driver.alloc(m * w.n * 4)?;
        let g = Gemm {
            n: w.n,
            k: w.k,
            m,
            act: w.dtype,
        };
        // SAFETY: wd holds n·k and xd m·k values of w.dtype (check_dense_call), out m·n f32.
        unsafe { self.driver.gemm(g, wd, &xd, &out) }?;
        Ok(out)
    }

    /// `kq_argmax_rows` over the `m·n` f32 of `y` on the device, and the `m` indices back.
    pub(super) fn argmax_of(&self, y: &D::Buf, m: usize, n: usize) -> Result<Vec<usize>> {
        let grid = u32::try_from(m)
            .ok()
            .filter(|_| m > 0 && n > 0 && i32::try_from(n).is_ok())
            .ok_or_else(|| GpuError::Unsupported("argmax", format!("{m} rows of {n}")))?;
        let idx = self.driver.alloc(m * 4)?;
        let kernel = Kernel::ArgmaxRows(args::ArgmaxRows { y, idx: &idx, m, n });
        // SAFETY: y holds m·n f32 (the caller's), idx m int32; one block of ARGMAX_THREADS
        // threads per row, the block size the kernel is written for.
        unsafe {
            self.driver
                .launch(&kernel, (grid, 1, 1), (ARGMAX_THREADS, 1, 1))
        }?;
        self.driver
            .dtoh_i32(&idx, m)?
            .into_iter()
            .map(|i| {
                usize::try_from(i)
                    .ok()
                    .filter(|&i| i < n)
                    .ok_or_else(|| GpuError::Backend {
                        backend: D::BACKEND,
                        msg: format!("kq_argmax_rows returned {i} for a row of {n}"),
                    })
            })
            .collect()
    }
}

impl<D: Driver> Backend for Device<D> {
    fn name(&self) -> String {
        self.driver.name()
    }

    fn arch(&self) -> Arch {
        self.driver.arch()
    }

    fn module_origin(&self) -> Option<String> {
        self.driver.module_origin()
    }

    fn upload(&self, w: &W4Layout) -> Result<DeviceW4> {
        self.upload_with(w, false)
    }

    fn upload_kept(&self, w: &W4Layout) -> Result<DeviceW4> {
        self.upload_with(w, true)
    }

    fn w4a16_on(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        regime: Regime,
    ) -> Result<Vec<f32>> {
        check_call(w, x.len(), m, regime)?;
        self.call(w, x, act, m, |c, sc| self.run_w4a16(c, regime, sc))
    }

    fn w4a8_on(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        regime: Regime,
    ) -> Result<Vec<f32>> {
        check_call(w, x.len(), m, regime)?;
        check_w4a8(w)?;
        self.call(w, x, act, m, |c, sc| self.run_w4a8(c, regime, sc))
    }

    fn w4a16_argmax_on(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        regime: Regime,
    ) -> Result<Vec<usize>> {
        check_call(w, x.len(), m, regime)?;
        let out = self.call_into(w, x, act, m, |c, sc| self.run_w4a16(c, regime, sc))?;
        self.argmax_of(&out, m, w.n)
    }

    fn upload_dense(&self, w: &[u16], n: usize, k: usize, dtype: Act) -> Result<DeviceDense> {
        check_dense(w.len(), n, k)?;
        let buf = DenseBuf(self.driver.htod(w)?);
        Ok(DeviceDense::new(n, k, dtype, Box::new(buf)))
    }

    fn dense_on(&self, w: &DeviceDense, x: &[u16], m: usize) -> Result<Vec<f32>> {
        let out = self.dense_into(w, x, m)?;
        self.driver.dtoh_f32(&out, m * w.n)
    }

    fn dense_argmax_on(&self, w: &DeviceDense, x: &[u16], m: usize) -> Result<Vec<usize>> {
        let out = self.dense_into(w, x, m)?;
        self.argmax_of(&out, m, w.n)
    }
}
