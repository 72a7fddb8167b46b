//! The CPU emulation as a [`Driver`]: [`CpuEmu`], the "cpu" device. Device memory is host
//! memory, and a launch runs that kernel's CPU replay on the arguments and geometry it was given:
//! the GEMVs split by split as the grid splits K ([`super::reference`]), the MMA kernels lane by
//! lane for the vendor's atoms ([`super::emu_mma`]), the dequant-to-dense kernel and the vendor
//! GEMM ([`super::emu_dense`]), and here the int8 activation quantizer, the reduces, the scale
//! epilogue and the row argmax (`kq_argmax_rows`: its per-thread scan and tree reduction), and
//! the step kernels of a device-resident draft step ([`super::emu_ops`]). So the CPU tests run
//! exactly the launches [`super::dispatch`] and [`super::ops`] make on a GPU; a
//! launch whose grid leaves part of its output unwritten, or that reads or writes past a
//! buffer, is an error here (on a GPU it would be garbage).

use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;

use super::dispatch::Device;
use super::driver::{as_bytes, from_bytes, Dim3, Driver, Gemm, Pod};
use super::emu_mma::Vendor;
use super::emu_ops::{self, NormRows, Table};
use super::layout::{words_per_row, W4Layout, CHUNK};
use super::ops::AttendDims;
use super::reference::argmax_before;
use super::source::{Kernel, ARGMAX_THREADS, OPS_THREADS};
use super::tune::{self, Arch, MMA_KTILE, MMA_ROWS};
use super::{emu_dense, emu_mma, reference, Elem, GpuError, Result};

/// The kernels replayed on the CPU with `vendor`'s atoms and launch geometry.
pub struct Emu {
    pub vendor: Vendor,
    /// Launches so far, by entry point (what the tests count: a kept dense copy is dequantized
    /// once, not at every call).
    launches: Mutex<std::collections::BTreeMap<String, usize>>,
    /// Copies between host and "device" so far (what the tests count: a device-resident step
    /// sends its inputs once and reads back token ids only).
    transfers: Mutex<Transfers>,
}

/// Host ↔ device copies: calls and bytes each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfers {
    pub htod_calls: usize,
    pub htod_bytes: usize,
    pub dtoh_calls: usize,
    pub dtoh_bytes: usize,
}

/// The "cpu" device: the kernels' CPU replay behind the one [`super::Backend`].
pub type CpuEmu = Device<Emu>;

impl Device<Emu> {
    /// NVIDIA atoms and sm_90 geometry (the default "cpu" device).
    pub fn nvidia() -> CpuEmu {
        Device::new(Emu::new(Vendor::Nvidia))
    }
    /// AMD MFMA atoms and gfx942 geometry.
    pub fn amd() -> CpuEmu {
        Device::new(Emu::new(Vendor::Amd))
    }

    /// How many times each entry point was launched so far.
    pub fn launches(&self) -> std::collections::BTreeMap<String, usize> {
        self.driver().launches.lock().expect("launches").clone()
    }

    /// The host ↔ device copies so far.
    pub fn transfers(&self) -> Transfers {
        *self.driver().transfers.lock().expect("transfers")
    }
}

fn err(msg: String) -> GpuError {
    GpuError::Backend {
        backend: "cpu",
        msg,
    }
}

/// "Device" bytes in host memory.
pub struct HostBuf(Mutex<Vec<u8>>);

impl HostBuf {
    /// The first `n` values, or an error if the buffer is smaller.
    fn read<T: Pod>(&self, n: usize) -> Result<Vec<T>> {
        let b = self.0.lock().expect("buffer");
        let bytes = n * std::mem::size_of::<T>();
        if b.len() < bytes {
            return Err(err(format!(
                "a kernel reads {bytes} bytes of a {}-byte buffer",
                b.len()
            )));
        }
        Ok(from_bytes(&b, n))
    }
    /// Every whole value of type `T` the buffer holds.
    fn all<T: Pod>(&self) -> Vec<T> {
        from_bytes(&self.0.lock().expect("buffer"), usize::MAX)
    }
    /// Store `v` at the start, or an error if the buffer is smaller.
    fn write<T: Pod>(&self, v: &[T]) -> Result<()> {
        let mut b = self.0.lock().expect("buffer");
        let src = as_bytes(v);
        let len = b.len();
        b.get_mut(..src.len())
            .ok_or_else(|| {
                err(format!(
                    "a kernel writes {} bytes to a {len}-byte buffer",
                    src.len()
                ))
            })?
            .copy_from_slice(src);
        Ok(())
    }
}

/// `have ≥ need`, or an error naming the kernel: its grid leaves outputs unwritten.
fn covers(kernel: &str, what: &str, have: usize, need: usize) -> Result<()> {
    if have >= need {
        Ok(())
    } else {
        Err(err(format!(
            "{kernel}: the launch covers {have} {what}, the output needs {need}"
        )))
    }
}

/// The weights a kernel reads, as a layout (`per_channel` is the kernel's `_pc` / `_g`).
fn weights(
    name: &str,
    (qweight, scales): (&HostBuf, Option<&HostBuf>),
    (n, k, group): (usize, usize, usize),
    per_channel: bool,
) -> Result<W4Layout> {
    if per_channel != (group == k) {
        return Err(err(format!("{name} launched with group {group} and K {k}")));
    }
    Ok(W4Layout {
        n,
        k,
        group,
        qweight: qweight.read(n * words_per_row(k))?,
        // The int8 MMA kernel reads no scales (its reduce applies them).
        scales: match scales {
            Some(s) => s.read(n * k.div_ceil(group))?,
            None => Vec::new(),
        },
    })
}

impl Emu {
    fn new(vendor: Vendor) -> Emu {
        Emu {
            vendor,
            launches: Mutex::default(),
            transfers: Mutex::default(),
        }
    }

    fn count(&self, htod: bool, bytes: usize) {
        let mut t = self.transfers.lock().expect("transfers");
        if htod {
            t.htod_calls += 1;
            t.htod_bytes += bytes;
        } else {
            t.dtoh_calls += 1;
            t.dtoh_bytes += bytes;
        }
    }

    /// One launch, replayed.
    fn run(&self, kernel: &Kernel<'_, HostBuf>, grid: Dim3, block: Dim3) -> Result<()> {
        let v = self.vendor;
        let name = kernel.name();
        *self
            .launches
            .lock()
            .expect("launches")
            .entry(name.clone())
            .or_default() += 1;
        let name = name.as_str();
        let threads = grid.0 as usize * block.0 as usize;
        match *kernel {
            Kernel::W4a16Gemv {
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
            } => {
                let splits = self.gemv(name, grid, block, (n, k), chunks_per_split)?;
                let w = weights(name, (qweight, Some(scales)), (n, k, group), per_channel)?;
                let x = x.read::<u16>(m * k)?;
                let out: Vec<f32> = splits
                    .flat_map(|c| reference::gemv_w4a16(&w, &x, act, m, c))
                    .collect();
                part.write(&out)
            }
            Kernel::W4a8Gemv {
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
            } => {
                let splits = self.gemv(name, grid, block, (n, k), chunks_per_split)?;
                let w = weights(name, (qweight, Some(scales)), (n, k, k), true)?;
                let ap = xq.read::<i8>(m * k.div_ceil(CHUNK) * CHUNK)?;
                let (s, sums) = (xs.read::<f32>(m)?, xsum.read::<i32>(m)?);
                let out: Vec<f32> = splits
                    .flat_map(|c| reference::gemv_w4a8(&w, &ap, &s, &sums, m, c))
                    .collect();
                part.write(&out)
            }
            Kernel::QuantActI8 {
                act,
                x,
                xq,
                xs,
                xsum,
                k,
            } => {
                // One block per token; the block reduces over its warps.
                if block.0 == 0 || block.0 > 1024 || !(block.0 as usize).is_multiple_of(v.lanes()) {
                    return Err(err(format!("{name}: block.x {}", block.0)));
                }
                let m = grid.0 as usize;
                let a = reference::quantize_act_ref(&x.read::<u16>(m * k)?, act, m, k);
                xq.write(&reference::permute_act_i8(&a, m, k))?;
                xs.write(&a.scales)?;
                xsum.write(&a.sums)
            }
            Kernel::SplitkReduce {
                part,
                out,
                mn,
                splits,
            } => {
                covers(name, "threads", threads, mn)?;
                let p = part.read::<f32>(splits * mn)?;
                let y: Vec<f32> = (0..mn)
                    .map(|i| (0..splits).fold(0f32, |acc, s| acc + p[s * mn + i]))
                    .collect();
                out.write(&y)
            }
            Kernel::W4a16Mma {
                act,
                per_channel,
                toks,
                qweight,
                scales,
                x,
                part,
                m,
                n,
                k,
                group,
                tiles_per_split,
            } => {
                let g = self.mma(name, grid, block, (m, n, k), toks, tiles_per_split)?;
                let w = weights(name, (qweight, Some(scales)), (n, k, group), per_channel)?;
                let x = x.read::<u16>(m * k)?;
                part.write(&emu_mma::w4a16(v, &w, &x, act, m, &g))
            }
            Kernel::W4a8Mma {
                toks,
                qweight,
                xq,
                part,
                m,
                n,
                k,
                tiles_per_split,
            } => {
                let g = self.mma(name, grid, block, (m, n, k), toks, tiles_per_split)?;
                let w = weights(name, (qweight, None), (n, k, k), true)?;
                let ap = xq.read::<i8>(m * k.div_ceil(CHUNK) * CHUNK)?;
                part.write(&emu_mma::w4a8(v, &w, &ap, m, &g))
            }
            Kernel::W4a8Reduce {
                part,
                scales,
                xs,
                xsum,
                out,
                m,
                n,
                splits,
            } => {
                covers(name, "threads", threads, m * n)?;
                let p = part.read::<i32>(splits * m * n)?;
                let (ws, s, sums) = (
                    scales.read::<f32>(n)?,
                    xs.read::<f32>(m)?,
                    xsum.read::<i32>(m)?,
                );
                let y: Vec<f32> = (0..m * n)
                    .map(|i| {
                        let (mi, ni) = (i / n, i % n);
                        let mut t =
                            (0..splits).fold(0i32, |acc, sp| acc.wrapping_add(p[sp * m * n + i]));
                        t -= 8 * sums[mi];
                        t as f32 * ws[ni] * s[mi]
                    })
                    .collect();
                out.write(&y)
            }
            Kernel::Dequant {
                act,
                per_channel,
                qweight,
                scales,
                dense,
                n,
                k,
                group,
            } => {
                covers(name, "threads", threads, n * k.div_ceil(CHUNK))?;
                let w = weights(name, (qweight, Some(scales)), (n, k, group), per_channel)?;
                dense.write(&emu_dense::dequant(&w, act))
            }
            Kernel::ScaleCols { out, scales, m, n } => {
                covers(name, "threads", threads, m * n)?;
                let mut y = out.read::<f32>(m * n)?;
                let s = scales.read::<f32>(n)?;
                for row in y.chunks_mut(n) {
                    for (v, s) in row.iter_mut().zip(&s) {
                        *v *= s;
                    }
                }
                out.write(&y)
            }
            Kernel::EmbedRows {
                elem,
                table,
                ids,
                out,
                n,
                h,
            } => {
                covers(name, "threads", threads, n * h)?;
                let ids = ids.read::<i32>(n)?;
                let y = match elem {
                    Elem::Half(a) => emu_ops::embed(Table::Half(a, &table.all::<u16>()), &ids, h),
                    Elem::F32 => emu_ops::embed(Table::F32(&table.all::<f32>()), &ids, h),
                    Elem::I32 => return Err(err(format!("{name}: an int32 table"))),
                }?;
                out.write(&y)
            }
            Kernel::RmsNorm {
                x,
                w,
                out,
                n,
                h,
                in_ld,
                in_off,
                out_ld,
                out_off,
                eps_bits,
            } => {
                if block.0 != OPS_THREADS {
                    return Err(err(format!("{name}: block {block:?}")));
                }
                covers(name, "rows", grid.0 as usize, n)?;
                let xs = x.read::<f32>(n * in_ld)?;
                let mut y = out.read::<f32>(n * out_ld)?;
                let rows = NormRows {
                    n,
                    h,
                    input: (in_ld, in_off),
                    output: (out_ld, out_off),
                    eps: f32::from_bits(eps_bits as u32),
                };
                emu_ops::rms_norm(&xs, &w.read::<f32>(h)?, &mut y, &rows);
                out.write(&y)
            }
            Kernel::Rope {
                x,
                pos,
                cs,
                n,
                heads,
                half,
                ld,
                off,
                head_ld,
                interleaved,
            } => {
                covers(name, "threads", threads, n * heads * half)?;
                let mut y = x.read::<f32>(n * ld)?;
                let p = pos.read::<i32>(n)?;
                let g = emu_ops::RopeAt {
                    n,
                    heads,
                    half,
                    ld,
                    off,
                    head_ld,
                    interleaved: interleaved != 0,
                };
                emu_ops::rope(&mut y, &p, &cs.all::<f32>(), &g)?;
                x.write(&y)
            }
            Kernel::CopyCols {
                src,
                dst,
                n,
                heads,
                w,
                src_ld,
                src_off,
                src_hs,
                dst_ld,
                dst_off,
                dst_hs,
            } => {
                covers(name, "threads", threads, n * heads * w)?;
                let s = src.read::<f32>(n * src_ld)?;
                let mut y = dst.read::<f32>(n * dst_ld)?;
                emu_ops::copy_cols(
                    &s,
                    &mut y,
                    (n, heads, w),
                    (src_ld, src_off, src_hs),
                    (dst_ld, dst_off, dst_hs),
                );
                dst.write(&y)
            }
            Kernel::Attend {
                q,
                k0,
                v0,
                kd,
                vd,
                rows,
                slots,
                out,
                m,
                n,
                start,
                diag,
                heads,
                kv_heads,
                dq,
                dv,
                scale_bits,
            } => {
                self.warp(name, block)?;
                covers(name, "rows", grid.0 as usize, m)?;
                covers(name, "heads", grid.1 as usize, heads)?;
                let dims = AttendDims {
                    m,
                    n,
                    start,
                    diag,
                    heads,
                    kv_heads,
                    dq,
                    dv,
                    scale: f32::from_bits(scale_bits as u32),
                };
                let (kw, vw) = (kv_heads * dq, kv_heads * dv);
                let a = emu_ops::Attend {
                    q: &q.read::<f32>(m * heads * dq)?,
                    k0: &k0.read::<f32>((start + n) * kw)?,
                    v0: &v0.read::<f32>((start + n) * vw)?,
                    kd: &kd.read::<f32>(diag * n * kw)?,
                    vd: &vd.read::<f32>(diag * n * vw)?,
                    rows: &rows.read::<i32>(m)?,
                    slots: &slots.read::<i32>(if diag > 0 { diag * n } else { 0 })?,
                    dims,
                };
                out.write(&emu_ops::attend(&a, v.lanes())?)
            }
            Kernel::SiluMul { g, u, out, len } => {
                covers(name, "threads", threads, len)?;
                out.write(&emu_ops::silu_mul(&g.read(len)?, &u.read(len)?))
            }
            Kernel::Add { a, b, out, len } => {
                covers(name, "threads", threads, len)?;
                let (a, b) = (a.read::<f32>(len)?, b.read::<f32>(len)?);
                let y: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
                out.write(&y)
            }
            Kernel::ToAct { act, x, y, len } => {
                covers(name, "threads", threads, len)?;
                y.write(&emu_ops::to_act(&x.read::<f32>(len)?, act))
            }
            Kernel::GatherRows {
                src,
                idx,
                dst,
                m,
                w,
                dst_off,
            } => {
                covers(name, "threads", threads, m * w)?;
                let rows = emu_ops::gather(&src.all::<f32>(), &idx.read::<i32>(m)?, w)?;
                let mut y = dst.read::<f32>(dst_off + m * w)?;
                y[dst_off..].copy_from_slice(&rows);
                dst.write(&y)
            }
            Kernel::ArgmaxRows { y, idx, m, n } => {
                if block != (ARGMAX_THREADS, 1, 1) {
                    return Err(err(format!("{name}: block {block:?}")));
                }
                covers(name, "rows", grid.0 as usize, m)?;
                let y = y.read::<f32>(m * n)?;
                let out: Vec<i32> = y
                    .chunks(n.max(1))
                    .take(m)
                    .map(|row| argmax_block(row, ARGMAX_THREADS as usize))
                    .collect();
                idx.write(&out)
            }
        }
    }

    /// One warp / wavefront along `threadIdx.x`, as the GEMV and MMA kernels are written.
    fn warp(&self, name: &str, block: Dim3) -> Result<()> {
        let lanes = self.vendor.lanes();
        if block.0 as usize == lanes {
            Ok(())
        } else {
            Err(err(format!(
                "{name}: block.x {}, the warp is {lanes}",
                block.0
            )))
        }
    }

    /// A GEMV launch's K split as the kernel sees it (the chunks each `blockIdx.y` sums),
    /// checked to cover every row and chunk.
    fn gemv(
        &self,
        name: &str,
        grid: Dim3,
        block: Dim3,
        (n, k): (usize, usize),
        chunks_per_split: usize,
    ) -> Result<impl Iterator<Item = Range<usize>>> {
        self.warp(name, block)?;
        let kchunks = k.div_ceil(CHUNK);
        covers(name, "rows", grid.0 as usize * block.1 as usize, n)?;
        covers(name, "chunks", grid.1 as usize * chunks_per_split, kchunks)?;
        Ok((0..grid.1 as usize).map(move |s| {
            let c0 = (s * chunks_per_split).min(kchunks);
            c0..(c0 + chunks_per_split).min(kchunks)
        }))
    }

    /// An MMA launch's geometry as the kernel sees it, checked to cover every row, k-tile and
    /// token.
    fn mma(
        &self,
        name: &str,
        grid: Dim3,
        block: Dim3,
        (m, n, k): (usize, usize, usize),
        toks: usize,
        tiles_per_split: usize,
    ) -> Result<tune::Mma> {
        self.warp(name, block)?;
        let (gx, gy, gz) = (grid.0 as usize, grid.1 as usize, grid.2 as usize);
        covers(name, "rows", gx * MMA_ROWS * block.1 as usize, n)?;
        covers(name, "k-tiles", gy * tiles_per_split, k.div_ceil(MMA_KTILE))?;
        covers(name, "tokens", gz * toks, m)?;
        Ok(tune::Mma {
            block,
            grid,
            splits: gy,
            tiles_per_split,
            toks,
        })
    }
}

/// One block of `kq_argmax_rows` over `row`: thread `t` scans columns `t, t + threads, …`, then
/// the tree reduction over shared memory, in the kernel's order ([`argmax_before`]); `-1` for an
/// empty row.
fn argmax_block(row: &[f32], threads: usize) -> i32 {
    let none = (0f32, usize::MAX);
    let before = |a: (f32, usize), b: (f32, usize)| {
        b.1 != usize::MAX && (a.1 == usize::MAX || argmax_before(a, b))
    };
    let mut s: Vec<(f32, usize)> = (0..threads)
        .map(|t| {
            (t..row.len()).step_by(threads).fold(none, |a, j| {
                if before(a, (row[j], j)) {
                    (row[j], j)
                } else {
                    a
                }
            })
        })
        .collect();
    let mut half = threads / 2;
    while half > 0 {
        for t in 0..half {
            if before(s[t], s[t + half]) {
                s[t] = s[t + half];
            }
        }
        half /= 2;
    }
    match s[0].1 {
        usize::MAX => -1,
        i => i as i32,
    }
}

impl Driver for Emu {
    type Buf = HostBuf;
    const BACKEND: &'static str = "cpu";

    fn name(&self) -> String {
        match self.vendor {
            Vendor::Nvidia => "cpu (kernel emulation, mma.sync atoms)".into(),
            Vendor::Amd => "cpu (kernel emulation, MFMA atoms)".into(),
        }
    }

    fn arch(&self) -> Arch {
        self.vendor.arch()
    }

    fn alloc(&self, bytes: usize) -> Result<HostBuf> {
        Ok(HostBuf(Mutex::new(vec![0; bytes.max(1)])))
    }

    fn size(buf: &HostBuf) -> usize {
        buf.0.lock().expect("buffer").len()
    }

    fn htod<T: Pod>(&self, host: &[T]) -> Result<HostBuf> {
        self.count(true, std::mem::size_of_val(host));
        Ok(HostBuf(Mutex::new(as_bytes(host).to_vec())))
    }

    fn dtoh_f32(&self, buf: &HostBuf, n: usize) -> Result<Vec<f32>> {
        self.count(false, n * 4);
        buf.read(n)
    }

    fn dtoh_i32(&self, buf: &HostBuf, n: usize) -> Result<Vec<i32>> {
        self.count(false, n * 4);
        buf.read(n)
    }

    unsafe fn launch(&self, kernel: &Kernel<'_, HostBuf>, grid: Dim3, block: Dim3) -> Result<()> {
        self.run(kernel, grid, block)
    }

    unsafe fn gemm(&self, g: Gemm, w: &HostBuf, a: &HostBuf, out: &HostBuf) -> Result<()> {
        let y = emu_dense::blas(g, &w.read(g.n * g.k)?, &a.read(g.m * g.k)?);
        out.write(&y)
    }

    fn copy(&self, src: &HostBuf, dst: &mut HostBuf) -> Result<()> {
        let s = src.0.lock().expect("buffer");
        let d = dst.0.get_mut().expect("buffer");
        let len = d.len();
        d.get_mut(..s.len())
            .ok_or_else(|| err(format!("copy of {} bytes into {len}", s.len())))?
            .copy_from_slice(&s);
        Ok(())
    }

    fn time(&self, iters: usize, f: &mut dyn FnMut(usize) -> Result<()>) -> Result<f64> {
        f(0)?;
        let t = Instant::now();
        for i in 0..iters.max(1) {
            f(i + 1)?;
        }
        Ok(t.elapsed().as_secs_f64() / iters.max(1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replayed block (strided per-thread scans, then the tree) returns exactly the plain
    /// scan of `reference::argmax_ref` at every block size, on rows with ties, signed zeros,
    /// infinities, subnormals and NaNs, shorter and longer than the block.
    #[test]
    fn argmax_block_is_the_reference_order() {
        let sub = f32::from_bits(1);
        let rows: Vec<Vec<f32>> = vec![
            vec![1.0],
            vec![f32::NAN],
            vec![-0.0, 0.0],
            vec![0.0, -0.0],
            vec![f32::NEG_INFINITY; 3],
            vec![0.0, sub, sub, 0.0],
            vec![1.0, f32::NAN, 2.0, f32::NAN],
            vec![f32::INFINITY, 1.0, f32::INFINITY],
            (0..1000).map(|i| ((i * 37) % 101) as f32).collect(),
            (0..1000)
                .map(|i| if i == 999 { 5.0 } else { -1.0 })
                .collect(),
            (0..700)
                .map(|i| if i % 300 == 299 { f32::NAN } else { i as f32 })
                .collect(),
        ];
        for row in &rows {
            let want = reference::argmax_ref(row) as i32;
            for threads in [1, 2, 32, 256] {
                assert_eq!(
                    argmax_block(row, threads),
                    want,
                    "{threads} threads: {row:?}"
                );
            }
        }
        assert_eq!(argmax_block(&[], 256), -1);
        // The documented order: the first NaN; else the first of the largest.
        assert_eq!(reference::argmax_ref(&rows[6]), 1);
        assert_eq!(reference::argmax_ref(&rows[2]), 0);
        assert_eq!(reference::argmax_ref(&rows[5]), 1);
        assert_eq!(reference::argmax_ref(&rows[7]), 0);
        assert_eq!(reference::argmax_ref(&rows[8]), 30); // 30·37 = 11·101 − 1
    }
}
