//! The CPU emulation as a [`Driver`]: [`CpuEmu`], the "cpu" device. Device memory is host
//! memory, and a launch runs that kernel's CPU replay on the arguments and geometry it was given:
//! the GEMVs split by split as the grid splits K ([`super::reference`]), the MMA kernels lane by
//! lane for the vendor's atoms ([`super::emu_mma`]), the dequant-to-dense kernel and the vendor
//! GEMM ([`super::emu_dense`]), and here the int8 activation quantizer, the reduces, the scale
//! epilogue and the row argmax (`kq_argmax_rows`: its per-thread scan and tree reduction), and
//! the step kernels of a device-resident draft step (each replayed beside its op, [`super::ops`]).
//! [`Emu::run`] dispatches one line per entry point. So the CPU tests run exactly the launches
//! [`super::dispatch`] and [`super::ops`] make on a GPU; a launch whose grid leaves part of its
//! output unwritten, or that reads or writes past a buffer, is an error here (on a GPU it would
//! be garbage: [`super::emu_launch`]).

use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;

use super::dispatch::Device;
use super::driver::{as_bytes, Dim3, Driver, Gemm, Pod};
use super::emu_launch::{err, HostBuf, Replay};
use super::emu_mma::Vendor;
use super::layout::{words_per_row, W4Layout, CHUNK};
use super::ops;
use super::reference::argmax_before;
use super::source::{args, Kernel, ARGMAX_THREADS};
use super::tune::{self, Arch, MMA_KTILE, MMA_ROWS};
use super::{emu_dense, emu_mma, reference, Result};

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

    /// One launch, replayed: one line per entry point.
    fn run(&self, kernel: &Kernel<'_, HostBuf>, grid: Dim3, block: Dim3) -> Result<()> {
        let name = kernel.name();
        *self
            .launches
            .lock()
            .expect("launches")
            .entry(name.clone())
            .or_default() += 1;
        let r = Replay {
            name: &name,
            grid,
            block,
            vendor: self.vendor,
        };
        match kernel {
            Kernel::W4a16Gemv(k) => w4a16_gemv(k, &r),
            Kernel::W4a8Gemv(k) => w4a8_gemv(k, &r),
            Kernel::QuantActI8(k) => quant_act_i8(k, &r),
            Kernel::SplitkReduce(k) => splitk_reduce(k, &r),
            Kernel::W4a16Mma(k) => w4a16_mma(k, &r),
            Kernel::W4a8Mma(k) => w4a8_mma(k, &r),
            Kernel::W4a8Reduce(k) => w4a8_reduce(k, &r),
            Kernel::Dequant(k) => dequant(k, &r),
            Kernel::ScaleCols(k) => scale_cols(k, &r),
            Kernel::ArgmaxRows(k) => argmax_rows(k, &r),
            Kernel::EmbedRows(k) => ops::Embed::replay(k, &r),
            Kernel::RmsNorm(k) => ops::RmsNorm::replay(k, &r),
            Kernel::Rope(k) => ops::Rope::replay(k, &r),
            Kernel::CopyCols(k) => ops::CopyCols::replay(k, &r),
            Kernel::Attend(k) => ops::Attend::replay(k, &r),
            Kernel::SiluMul(k) => ops::SiluMul::replay(k, &r),
            Kernel::Add(k) => ops::Add::replay(k, &r),
            Kernel::ToAct(k) => ops::ToAct::replay(k, &r),
            Kernel::GatherRows(k) => ops::Gather::replay(k, &r),
        }
    }
}

/// Regime A's W4A16 GEMV: each split's partial sums ([`reference::gemv_w4a16`]).
fn w4a16_gemv(k: &args::W4a16Gemv<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    let splits = gemv_splits(r, (k.n, k.k), k.chunks_per_split)?;
    let shape = (k.n, k.k, k.group);
    let w = weights(r.name, (k.qweight, Some(k.scales)), shape, k.per_channel)?;
    let x = k.x.read::<u16>(k.m * k.k)?;
    let out: Vec<f32> = splits
        .flat_map(|c| reference::gemv_w4a16(&w, &x, k.act, k.m, c))
        .collect();
    k.part.write(&out)
}

/// Regime A's W4A8 GEMV on the int8 activations ([`reference::gemv_w4a8`]).
fn w4a8_gemv(k: &args::W4a8Gemv<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    let splits = gemv_splits(r, (k.n, k.k), k.chunks_per_split)?;
    let w = weights(r.name, (k.qweight, Some(k.scales)), (k.n, k.k, k.k), true)?;
    let ap = k.xq.read::<i8>(k.m * k.k.div_ceil(CHUNK) * CHUNK)?;
    let (s, sums) = (k.xs.read::<f32>(k.m)?, k.xsum.read::<i32>(k.m)?);
    let out: Vec<f32> = splits
        .flat_map(|c| reference::gemv_w4a8(&w, &ap, &s, &sums, k.m, c))
        .collect();
    k.part.write(&out)
}

/// `kq_quant_act_i8_*`: one block per token; the block reduces over its warps.
fn quant_act_i8(k: &args::QuantActI8<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    let block = r.block;
    if block.0 == 0 || block.0 > 1024 || !(block.0 as usize).is_multiple_of(r.lanes()) {
        return Err(r.err(format_args!("block.x {}", block.0)));
    }
    let m = r.grid.0 as usize;
    let a = reference::quantize_act_ref(&k.x.read::<u16>(m * k.k)?, k.act, m, k.k);
    k.xq.write(&reference::permute_act_i8(&a, m, k.k))?;
    k.xs.write(&a.scales)?;
    k.xsum.write(&a.sums)
}

/// `kq_splitk_reduce`: the splits' partial sums added in split order.
fn splitk_reduce(k: &args::SplitkReduce<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    let (mn, splits) = (k.mn, k.splits);
    r.threads_cover(mn)?;
    let p = k.part.read::<f32>(splits * mn)?;
    let y: Vec<f32> = (0..mn)
        .map(|i| (0..splits).fold(0f32, |acc, s| acc + p[s * mn + i]))
        .collect();
    k.out.write(&y)
}

/// Regime B's W4A16 MMA, lane by lane ([`emu_mma::w4a16`]).
fn w4a16_mma(k: &args::W4a16Mma<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    let g = mma_geometry(r, (k.m, k.n, k.k), k.toks, k.tiles_per_split)?;
    let shape = (k.n, k.k, k.group);
    let w = weights(r.name, (k.qweight, Some(k.scales)), shape, k.per_channel)?;
    let x = k.x.read::<u16>(k.m * k.k)?;
    k.part
        .write(&emu_mma::w4a16(r.vendor, &w, &x, k.act, k.m, &g))
}

/// The int8 MMA, lane by lane ([`emu_mma::w4a8`]): exact int32 partials, no scales.
fn w4a8_mma(k: &args::W4a8Mma<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    let g = mma_geometry(r, (k.m, k.n, k.k), k.toks, k.tiles_per_split)?;
    let w = weights(r.name, (k.qweight, None), (k.n, k.k, k.k), true)?;
    let ap = k.xq.read::<i8>(k.m * k.k.div_ceil(CHUNK) * CHUNK)?;
    k.part.write(&emu_mma::w4a8(r.vendor, &w, &ap, k.m, &g))
}

/// `kq_w4a8_reduce`: the int32 partials summed (wrapping, as the kernel's int adds), the
/// zero-point term taken off, then both scales.
fn w4a8_reduce(k: &args::W4a8Reduce<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    let (m, n, splits) = (k.m, k.n, k.splits);
    r.threads_cover(m * n)?;
    let p = k.part.read::<i32>(splits * m * n)?;
    let (ws, s, sums) = (
        k.scales.read::<f32>(n)?,
        k.xs.read::<f32>(m)?,
        k.xsum.read::<i32>(m)?,
    );
    let y: Vec<f32> = (0..m * n)
        .map(|i| {
            let (mi, ni) = (i / n, i % n);
            let mut t = (0..splits).fold(0i32, |acc, sp| acc.wrapping_add(p[sp * m * n + i]));
            t -= 8 * sums[mi];
            t as f32 * ws[ni] * s[mi]
        })
        .collect();
    k.out.write(&y)
}

/// Regime C's dequantization to a dense matrix ([`emu_dense::dequant`]).
fn dequant(k: &args::Dequant<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    r.threads_cover(k.n * k.k.div_ceil(CHUNK))?;
    let shape = (k.n, k.k, k.group);
    let w = weights(r.name, (k.qweight, Some(k.scales)), shape, k.per_channel)?;
    k.dense.write(&emu_dense::dequant(&w, k.act))
}

/// `kq_scale_cols`: each column of `[m, n]` times its scale, in place.
fn scale_cols(k: &args::ScaleCols<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    let (m, n) = (k.m, k.n);
    r.threads_cover(m * n)?;
    let mut y = k.out.read::<f32>(m * n)?;
    let s = k.scales.read::<f32>(n)?;
    for row in y.chunks_mut(n) {
        for (v, s) in row.iter_mut().zip(&s) {
            *v *= s;
        }
    }
    k.out.write(&y)
}

/// `kq_argmax_rows`: one block of [`ARGMAX_THREADS`] per row ([`argmax_block`]).
fn argmax_rows(k: &args::ArgmaxRows<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
    if r.block != (ARGMAX_THREADS, 1, 1) {
        return Err(r.err(format_args!("block {:?}", r.block)));
    }
    let (m, n) = (k.m, k.n);
    r.rows_cover(m)?;
    let y = k.y.read::<f32>(m * n)?;
    let out: Vec<i32> = y
        .chunks(n.max(1))
        .take(m)
        .map(|row| argmax_block(row, ARGMAX_THREADS as usize))
        .collect();
    k.idx.write(&out)
}

/// A GEMV launch's K split as the kernel sees it (the chunks each `blockIdx.y` sums), checked
/// to cover every row and chunk.
fn gemv_splits(
    r: &Replay<'_>,
    (n, k): (usize, usize),
    chunks_per_split: usize,
) -> Result<impl Iterator<Item = Range<usize>>> {
    r.warp()?;
    let kchunks = k.div_ceil(CHUNK);
    let (grid, block) = (r.grid, r.block);
    r.covers("rows", grid.0 as usize * block.1 as usize, n)?;
    r.covers("chunks", grid.1 as usize * chunks_per_split, kchunks)?;
    Ok((0..grid.1 as usize).map(move |s| {
        let c0 = (s * chunks_per_split).min(kchunks);
        c0..(c0 + chunks_per_split).min(kchunks)
    }))
}

/// An MMA launch's geometry as the kernel sees it, checked to cover every row, k-tile and
/// token.
fn mma_geometry(
    r: &Replay<'_>,
    (m, n, k): (usize, usize, usize),
    toks: usize,
    tiles_per_split: usize,
) -> Result<tune::Mma> {
    r.warp()?;
    let (grid, block) = (r.grid, r.block);
    let (gx, gy, gz) = (grid.0 as usize, grid.1 as usize, grid.2 as usize);
    r.covers("rows", gx * MMA_ROWS * block.1 as usize, n)?;
    r.covers("k-tiles", gy * tiles_per_split, k.div_ceil(MMA_KTILE))?;
    r.covers("tokens", gz * toks, m)?;
    Ok(tune::Mma {
        block,
        grid,
        splits: gy,
        tiles_per_split,
        toks,
    })
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
    use crate::gpu::ops::{AttendDims, Host, Op, Strided};
    use crate::gpu::{Act, CpuEmu, Elem, Tensors};

    /// #38.11: geometries whose sizes wrap a `usize` are refused, never checked as the wrapped
    /// (small) product: a `kq_rope` of 2^62 + 1 heads used to pass and read outside its tensor.
    #[test]
    fn wrapping_geometries_are_refused() {
        let d = CpuEmu::nvidia();
        let x = d.upload_tensor(Host::F32(&[0.5; 16])).unwrap();
        let cs = d.upload_tensor(Host::F32(&[1.0; 8])).unwrap();
        let pos = d.upload_tensor(Host::Index(&[0, 1], 2)).unwrap();
        let big = (1usize << 62) + 1;
        for (heads, head_ld, half, ld) in [
            // (heads-1)·head_ld wraps to 0: the row end looks like 2·half.
            (big, 4, 1, 16),
            (2, 1usize << 63, 1, 16),
            // Overlapping heads (head_ld 0) whose launch covers 2^62 threads.
            (big, 0, 1, 16),
            (2, 2, usize::MAX / 2 + 1, 16),
        ] {
            let rope = Op::Rope(ops::Rope {
                x: &x,
                pos: &pos,
                cs: &cs,
                n: 1,
                heads,
                half,
                at: Strided { ld, off: 0 },
                head_ld,
                interleaved: false,
            });
            let e = d.op(&rope).err().unwrap_or_else(|| {
                panic!("rope {heads} heads every {head_ld} of {half} pairs passed")
            });
            let _ = e.to_string();
        }
        let copy = Op::CopyCols(ops::CopyCols {
            src: &x,
            dst: &x,
            n: 1,
            heads: big,
            w: 1,
            from: (Strided { ld: 16, off: 0 }, 4),
            to: (Strided { ld: 16, off: 0 }, 4),
        });
        assert!(d.op(&copy).is_err());
        let norm = Op::RmsNorm(ops::RmsNorm {
            x: &x,
            w: &x,
            out: &x,
            n: 1,
            h: 4,
            eps: 1e-6,
            input: Strided {
                ld: 16,
                off: usize::MAX - 1,
            },
            output: Strided { ld: 16, off: 0 },
        });
        assert!(d.op(&norm).is_err());
        assert!(d.launches().is_empty(), "{:?}", d.launches());
    }

    /// A bad size, element type or index bound is an error before any launch.
    #[test]
    fn ops_that_would_read_or_write_outside_their_tensors_are_refused() {
        let d = CpuEmu::nvidia();
        let f = |v: &[f32]| d.upload_tensor(Host::F32(v)).unwrap();
        let table = f(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]); // 3 rows of 2
        let out = d.zeros(Elem::F32, 4).unwrap();
        let ok_ids = d.upload_tensor(Host::Index(&[2, 0], 3)).unwrap();
        let embed = |ids, out, n| {
            Op::Embed(ops::Embed {
                table: &table,
                ids,
                out,
                n,
                h: 2,
            })
        };
        d.op(&embed(&ok_ids, &out, 2)).unwrap();
        assert_eq!(d.read_f32(&out).unwrap(), [5.0, 6.0, 1.0, 2.0]);
        // An index past its bound is refused at upload; a bound past the table at the op.
        let e = d.upload_tensor(Host::Index(&[3], 3)).err().unwrap();
        assert!(e.to_string().contains("index 3 outside 0..3"), "{e}");
        assert!(d.upload_tensor(Host::Index(&[-1], 3)).is_err());
        let wide = d.upload_tensor(Host::Index(&[0, 1], 4)).unwrap();
        let e = d.op(&embed(&wide, &out, 2)).err().unwrap();
        assert!(e.to_string().contains("indices up to 4"), "{e}");
        // Too few ids, too small an output, an output of the wrong type.
        assert!(d.op(&embed(&ok_ids, &out, 3)).is_err());
        let small = d.zeros(Elem::F32, 3).unwrap();
        assert!(d.op(&embed(&ok_ids, &small, 2)).is_err());
        let half = d.zeros(Elem::Half(Act::Bf16), 4).unwrap();
        assert!(d.op(&embed(&ok_ids, &half, 2)).is_err());
        // Index tensors come from the host only; raw bytes must be whole values.
        assert!(d.zeros(Elem::I32, 4).is_err());
        assert!(d.upload_tensor(Host::Le(Elem::F32, &[0u8; 6])).is_err());
        // A norm row that runs past its stride.
        let x = f(&[1.0; 8]);
        let norm = Op::RmsNorm(ops::RmsNorm {
            x: &x,
            w: &table,
            out: &x,
            n: 2,
            h: 4,
            eps: 1e-6,
            input: Strided { ld: 4, off: 1 },
            output: Strided { ld: 4, off: 0 },
        });
        assert!(d.op(&norm).is_err());
        // Attention whose keys do not cover the rows it is asked for.
        let dims = AttendDims {
            m: 1,
            n: 2,
            start: 1,
            diag: 0,
            heads: 1,
            kv_heads: 1,
            dq: 2,
            dv: 2,
            scale: 1.0,
        };
        let rows = d.upload_tensor(Host::Index(&[1], 2)).unwrap();
        let (q, kv) = (f(&[1.0, 0.0]), f(&[0.5; 4]));
        let att = d.zeros(Elem::F32, 2).unwrap();
        let e = d
            .op(&Op::Attend(ops::Attend {
                q: &q,
                k0: &kv,
                v0: &kv,
                kd: &kv,
                vd: &kv,
                rows: &rows,
                slots: &rows,
                out: &att,
                dims,
            }))
            .err()
            .unwrap();
        assert!(e.to_string().contains("depth-0 keys"), "{e}");
        assert!(
            d.launches().keys().all(|k| k == "kq_embed_rows_f32"),
            "{:?}",
            d.launches()
        );
    }

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
