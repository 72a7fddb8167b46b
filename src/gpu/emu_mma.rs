//! CPU replay of the regime-B kernels (`kernels/w4_mma.cu`), lane by lane: every lane loads its
//! 128-bit weight chunk and 16-byte activation pieces from the packed buffers exactly as the
//! kernel does (roles from `kq_vendor.h`: [`Vendor`]), dequantizes with the kernel's bit-level
//! magic-number arithmetic, assembles the atom registers in the kernel's order, and the atom is
//! executed only through the documented operand ownership ([`super::fragment`]): gather A and B
//! from all lanes, `D = A·B + C`, scatter D back. The epilogue stores each lane's split-K
//! partials where the kernel stores them (the reduces are separate kernels, replayed by
//! [`super::emu`]). A wrong lane role, register order or k permutation therefore shows up as a
//! wrong result against [`super::reference`].
//!
//! Accumulation inside one atom is modelled as exact products summed in f32 in k order; the
//! hardware's internal order/precision is unspecified, which the W4A16 bound absorbs. Int8 atoms
//! are exact.

// Loops run over lane ids and step indices exactly as the kernel's threads and unrolled loops
// do; the index is the point, not an iterator over one array.
#![allow(clippy::needless_range_loop)]

use rayon::prelude::*;

use super::fragment::Atom;
use super::layout::{W4Layout, CHUNK, PAD_WORD};
use super::tune::{self, Arch, MMA_KTILE, MMA_ROWS};
use super::Act;

/// Whose atoms and lane roles to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// `mma.sync` m16n8k16 / m16n8k32, warp 32.
    Nvidia,
    /// MFMA 16x16x16 / 16x16x32, wavefront 64.
    Amd,
}

impl Vendor {
    /// The architecture whose launch geometry (split-K) is replayed.
    pub fn arch(self) -> Arch {
        match self {
            Vendor::Nvidia => Arch::Sm90,
            Vendor::Amd => Arch::Gfx942,
        }
    }
    pub fn lanes(self) -> usize {
        match self {
            Vendor::Nvidia => 32,
            Vendor::Amd => 64,
        }
    }
    /// `KQ_MMA_TOK`.
    pub fn tok(self) -> usize {
        match self {
            Vendor::Nvidia => 8,
            Vendor::Amd => 16,
        }
    }
    /// `KQ_MMA_SLOTS`.
    pub fn slots(self) -> usize {
        match self {
            Vendor::Nvidia => 2,
            Vendor::Amd => 1,
        }
    }
    // The lane roles of kq_vendor.h (the kernel's choice, not the hardware's).
    fn row(self, lane: usize, slot: usize) -> usize {
        match self {
            Vendor::Nvidia => (lane >> 2) + 8 * slot,
            Vendor::Amd => lane & 15,
        }
    }
    fn quad(self, lane: usize) -> usize {
        match self {
            Vendor::Nvidia => lane & 3,
            Vendor::Amd => lane >> 4,
        }
    }
    fn btok(self, lane: usize) -> usize {
        match self {
            Vendor::Nvidia => lane >> 2,
            Vendor::Amd => lane & 15,
        }
    }
    fn drow(self, lane: usize, i: usize) -> usize {
        match self {
            Vendor::Nvidia => (lane >> 2) + 8 * (i >> 1),
            Vendor::Amd => 4 * (lane >> 4) + i,
        }
    }
    fn dtok(self, lane: usize, i: usize) -> usize {
        match self {
            Vendor::Nvidia => 2 * (lane & 3) + (i & 1),
            Vendor::Amd => lane & 15,
        }
    }
    fn atom(self, int8: bool) -> Atom {
        match (self, int8) {
            (Vendor::Nvidia, false) => Atom::NvM16n8k16,
            (Vendor::Nvidia, true) => Atom::NvM16n8k32S8,
            (Vendor::Amd, false) => Atom::Amd16x16x16,
            (Vendor::Amd, true) => Atom::Amd16x16x32I8,
        }
    }
    /// A registers as `kq_mma_*` passes them: NVIDIA `{lo[0], lo[1], hi[0], hi[1]}`, AMD
    /// `{lo[0], hi[0]}` (one 64-bit operand).
    fn a_regs(self, lo: &[u32; 2], hi: &[u32; 2]) -> [u32; 4] {
        match self {
            Vendor::Nvidia => [lo[0], lo[1], hi[0], hi[1]],
            Vendor::Amd => [lo[0], hi[0], 0, 0],
        }
    }
}

// ------------------------------------------------------------------ bit-level dequant (kq_vendor.h)

fn f16x2(lo: f32, hi: f32) -> u32 {
    half::f16::from_f32(lo).to_bits() as u32 | ((half::f16::from_f32(hi).to_bits() as u32) << 16)
}
fn f16_halves(v: u32) -> (f32, f32) {
    (
        half::f16::from_bits(v as u16).to_f32(),
        half::f16::from_bits((v >> 16) as u16).to_f32(),
    )
}

/// `kq_dequant_f16x4`: `sub.f16x2` / `fma.rn.f16x2` on the and-or'ed words (every intermediate
/// is exact, so one rounding to f16 models the instruction).
pub fn dequant_f16x4(q: u32) -> [u32; 4] {
    let (lo, hi, ex) = (0x000f_000f_u32, 0x00f0_00f0_u32, 0x6400_6400_u32);
    let sub = |v: u32| {
        let (a, b) = f16_halves(v);
        f16x2(a - 1032.0, b - 1032.0)
    };
    let fma = |v: u32| {
        let (a, b) = f16_halves(v);
        f16x2(a.mul_add(0.0625, -72.0), b.mul_add(0.0625, -72.0))
    };
    let q8 = q >> 8;
    [
        sub((q & lo) | ex),
        fma((q & hi) | ex),
        sub((q8 & lo) | ex),
        fma((q8 & hi) | ex),
    ]
}

/// `kq_dequant_bf16x2` (the CUDA form: and-or into 128.0, `fma.rn.bf16x2` with 1.0 and −136.0).
pub fn dequant_bf16x2(q: u32) -> u32 {
    let v = (q & 0x000f_000f) | 0x4300_4300;
    let f = |h: u16| half::bf16::from_f32(half::bf16::from_bits(h).to_f32() * 1.0 - 136.0);
    f(v as u16).to_bits() as u32 | ((f((v >> 16) as u16).to_bits() as u32) << 16)
}

/// `kq_dequant_bf16x4`.
pub fn dequant_bf16x4(q: u32) -> [u32; 4] {
    [
        dequant_bf16x2(q),
        dequant_bf16x2(q >> 4),
        dequant_bf16x2(q >> 8),
        dequant_bf16x2(q >> 12),
    ]
}

fn dequant_pairs(q: u32, act: Act) -> [u32; 4] {
    match act {
        Act::F16 => dequant_f16x4(q),
        Act::Bf16 => dequant_bf16x4(q),
    }
}

// ------------------------------------------------------------------ the atom, by documented ownership

/// One warp's registers for one atom: A (≤ 4 × u32 per lane) and B (2 × u32 per lane).
struct Regs {
    a: Vec<[u32; 4]>,
    b: Vec<[u32; 2]>,
}

impl Regs {
    fn new(lanes: usize) -> Regs {
        Regs {
            a: vec![[0; 4]; lanes],
            b: vec![[0; 2]; lanes],
        }
    }
}

fn item16(regs: &[u32], i: usize) -> u16 {
    (regs[i / 2] >> (16 * (i % 2))) as u16
}
fn item8(regs: &[u32], i: usize) -> i8 {
    (regs[i / 4] >> (8 * (i % 4))) as u8 as i8
}

/// 16-bit activation bits to f32 (a table for f16: the replay decodes every operand of every
/// atom).
fn decoder(act: Act) -> impl Fn(u16) -> f32 {
    static F16: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    let t = F16.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| half::f16::from_bits(h).to_f32())
            .collect()
    });
    move |h| match act {
        Act::F16 => t[h as usize],
        Act::Bf16 => f32::from_bits((h as u32) << 16),
    }
}

/// The documented ownership of `atom` as flat indices: A item → `row·k + col`, B item →
/// `k·n + col`, D item → `row·n + col`, per `(lane, item)`.
struct Maps {
    atom: Atom,
    a: Vec<usize>,
    b: Vec<usize>,
    d: Vec<usize>,
}

impl Maps {
    fn new(atom: Atom) -> Maps {
        let (k, n) = (atom.k(), atom.n());
        let mut m = Maps {
            atom,
            a: vec![],
            b: vec![],
            d: vec![],
        };
        for lane in 0..atom.lanes() {
            for i in 0..atom.a_items() {
                let (r, c) = atom.a(lane, i);
                m.a.push(r * k + c);
            }
            for i in 0..atom.b_items() {
                let (r, c) = atom.b(lane, i);
                m.b.push(r * n + c);
            }
            for i in 0..atom.d_items() {
                let (r, c) = atom.d(lane, i);
                m.d.push(r * n + c);
            }
        }
        m
    }

    /// A `[16][k]` of a float atom, gathered from every lane's registers.
    fn gather_a(&self, dec: &impl Fn(u16) -> f32, regs: &[[u32; 4]]) -> Vec<f32> {
        let ni = self.atom.a_items();
        let mut a = vec![f32::NAN; self.atom.m() * self.atom.k()];
        for (lane, r) in regs.iter().enumerate() {
            for i in 0..ni {
                a[self.a[lane * ni + i]] = dec(item16(r, i));
            }
        }
        a
    }

    /// B `[k][n]` of a float atom, gathered from every lane's registers.
    fn gather_b(&self, dec: &impl Fn(u16) -> f32, regs: &[[u32; 2]], b: &mut [f32]) {
        let ni = self.atom.b_items();
        for (lane, r) in regs.iter().enumerate() {
            for i in 0..ni {
                b[self.b[lane * ni + i]] = dec(item16(r, i));
            }
        }
    }

    /// `D = A·B + C` over the lanes' accumulators (`acc[lane]` holds that lane's 4 C/D items);
    /// exact products summed in f32 in k order. `c` is scratch of `16·n`.
    fn mma_f(&self, a: &[f32], b: &[f32], acc: &mut [[f32; 4]], c: &mut [f32]) {
        let (k, n) = (self.atom.k(), self.atom.n());
        for (lane, d) in acc.iter().enumerate() {
            for (i, v) in d.iter().enumerate() {
                c[self.d[lane * 4 + i]] = *v;
            }
        }
        for row in 0..self.atom.m() {
            let ar = &a[row * k..(row + 1) * k];
            for col in 0..n {
                let mut sum = c[row * n + col];
                for (kk, av) in ar.iter().enumerate() {
                    sum += av * b[kk * n + col];
                }
                c[row * n + col] = sum;
            }
        }
        for (lane, d) in acc.iter_mut().enumerate() {
            for (i, v) in d.iter_mut().enumerate() {
                *v = c[self.d[lane * 4 + i]];
            }
        }
    }

    /// The int8 atom: exact `D = A·B + C` in i32 (wrapping, as the hardware's 32-bit
    /// accumulator).
    fn mma_i8(&self, r: &Regs, acc: &mut [[i32; 4]]) {
        let (k, n) = (self.atom.k(), self.atom.n());
        let (na, nb) = (self.atom.a_items(), self.atom.b_items());
        let mut a = vec![0i32; self.atom.m() * k];
        let mut b = vec![0i32; k * n];
        let mut c = vec![0i32; self.atom.m() * n];
        for lane in 0..self.atom.lanes() {
            for i in 0..na {
                a[self.a[lane * na + i]] = item8(&r.a[lane], i) as i32;
            }
            for i in 0..nb {
                b[self.b[lane * nb + i]] = item8(&r.b[lane], i) as i32;
            }
            for (i, v) in acc[lane].iter().enumerate() {
                c[self.d[lane * 4 + i]] = *v;
            }
        }
        for row in 0..self.atom.m() {
            for col in 0..n {
                let mut sum = c[row * n + col];
                for kk in 0..k {
                    sum = sum.wrapping_add(a[row * k + kk] * b[kk * n + col]);
                }
                c[row * n + col] = sum;
            }
        }
        for (lane, d) in acc.iter_mut().enumerate() {
            for (i, v) in d.iter_mut().enumerate() {
                *v = c[self.d[lane * 4 + i]];
            }
        }
    }
}

// ------------------------------------------------------------------ the kernels

/// Launch parameters shared by both kernels.
struct Launch {
    v: Vendor,
    n: usize,
    k: usize,
    m: usize,
    kchunks: usize,
    ktiles: usize,
    g: tune::Mma,
}

impl Launch {
    fn new(v: Vendor, w: &W4Layout, m: usize, g: &tune::Mma) -> Launch {
        let kchunks = w.k.div_ceil(CHUNK);
        Launch {
            v,
            n: w.n,
            k: w.k,
            m,
            kchunks,
            ktiles: kchunks.div_ceil(4),
            g: *g,
        }
    }
    fn nt(&self) -> usize {
        self.g.toks / self.v.tok()
    }
    /// The lane's 128-bit chunk of k-tile `kt` for each slot (`fill` where the kernel skips).
    fn load_w(&self, w: &W4Layout, n0: usize, lane: usize, kt: usize, fill: u32) -> [[u32; 4]; 2] {
        let c = kt * 4 + self.v.quad(lane);
        let mut out = [[fill; 4]; 2];
        for (s, o) in out.iter_mut().enumerate().take(self.v.slots()) {
            let row = n0 + self.v.row(lane, s);
            if c < self.kchunks && row < self.n {
                let base = row * self.kchunks * 4 + c * 4;
                o.copy_from_slice(&w.qweight[base..base + 4]);
            }
        }
        out
    }
    /// The partials `(split, tok, row, value)` one warp stores from its accumulators `acc`
    /// (`[lane][token tile][i]`) at warp tile `n0`, token tile `m0`: each lane's `i`-th value
    /// at its row and token, `value(row, acc)`, inside the output only.
    fn store<A: Copy, T>(
        &self,
        acc: &[Vec<[A; 4]>],
        (n0, split, m0): (usize, usize, usize),
        value: impl Fn(usize, A) -> T,
    ) -> Vec<(usize, usize, usize, T)> {
        let v = self.v;
        let mut out = Vec::new();
        for (lane, acc) in acc.iter().enumerate() {
            for i in 0..4 {
                let row = n0 + v.drow(lane, i);
                if row >= self.n {
                    continue;
                }
                for (t, a) in acc.iter().enumerate() {
                    let tok = m0 + t * v.tok() + v.dtok(lane, i);
                    if tok < self.m {
                        out.push((split, tok, row, value(row, a[i])));
                    }
                }
            }
        }
        out
    }
    /// Every (warp tile, split, token tile) of the grid, in parallel; each call of `warp`
    /// returns its stored partials `(split, tok, row, value)`.
    fn run<T: Send>(
        &self,
        warp: impl Fn(usize, usize, usize) -> Vec<(usize, usize, usize, T)> + Sync,
    ) -> Vec<(usize, usize, usize, T)> {
        let (tiles, splits, z) = (
            self.n.div_ceil(MMA_ROWS),
            self.g.splits,
            self.g.grid.2 as usize,
        );
        (0..tiles * splits * z)
            .into_par_iter()
            .flat_map_iter(|i| {
                let (wt, split, zi) = (i / (splits * z), (i / z) % splits, i % z);
                warp(wt * MMA_ROWS, split, zi * self.g.toks)
            })
            .collect()
    }
}

/// `kq_w4a16_mma_*` replayed for `v` at the launch geometry `g`: the partials it stores,
/// `part [splits, m, n]` f32.
pub fn w4a16(v: Vendor, w: &W4Layout, x: &[u16], act: Act, m: usize, g: &tune::Mma) -> Vec<f32> {
    let grouped = !w.per_channel();
    let l = Launch::new(v, w, m, g);
    let (lanes, nt) = (v.lanes(), l.nt());
    let maps = Maps::new(v.atom(false));
    let dec = decoder(act);
    let gcount = w.groups();
    let xword = |tok: usize, k: usize, j: usize| -> u32 {
        let i = tok * l.k + k + 2 * j;
        x[i] as u32 | ((x[i + 1] as u32) << 16)
    };
    // One pass of kq_mma_tile_a16 over k-tile `kt` into `acc[lane][nt]`.
    let tile = |acc: &mut Vec<Vec<[f32; 4]>>,
                wl: &[[[u32; 4]; 2]],
                use_: &dyn Fn(usize) -> bool,
                m0: usize,
                kt: usize| {
        let (mut r0, mut r1) = (Regs::new(lanes), Regs::new(lanes));
        let mut b = vec![0f32; maps.atom.k() * maps.atom.n()];
        let mut c = vec![0f32; maps.atom.m() * maps.atom.n()];
        let mut d: Vec<[f32; 4]> = vec![[0.0; 4]; lanes];
        for j in 0..4 {
            for lane in 0..lanes {
                let (mut lo0, mut hi0, mut lo1, mut hi1) =
                    ([0u32; 2], [0u32; 2], [0u32; 2], [0u32; 2]);
                for s in 0..v.slots() {
                    let p = if use_(lane) {
                        dequant_pairs(wl[lane][s][j], act)
                    } else {
                        [0; 4]
                    };
                    (lo0[s], hi0[s], lo1[s], hi1[s]) = (p[0], p[1], p[2], p[3]);
                }
                r0.a[lane] = v.a_regs(&lo0, &hi0);
                r1.a[lane] = v.a_regs(&lo1, &hi1);
            }
            let (a0, a1) = (maps.gather_a(&dec, &r0.a), maps.gather_a(&dec, &r1.a));
            for t in 0..nt {
                for lane in 0..lanes {
                    let tok = m0 + t * v.tok() + v.btok(lane);
                    let k = kt * MMA_KTILE + v.quad(lane) * CHUNK + 8 * j;
                    let xv = if tok < l.m && k < l.k {
                        [0, 1, 2, 3].map(|i| xword(tok, k, i))
                    } else {
                        [0; 4]
                    };
                    r0.b[lane] = [xv[0], xv[1]];
                    r1.b[lane] = [xv[2], xv[3]];
                }
                for (dv, a) in d.iter_mut().zip(acc.iter()) {
                    *dv = a[t];
                }
                maps.gather_b(&dec, &r0.b, &mut b);
                maps.mma_f(&a0, &b, &mut d, &mut c);
                maps.gather_b(&dec, &r1.b, &mut b);
                maps.mma_f(&a1, &b, &mut d, &mut c);
                for (a, dv) in acc.iter_mut().zip(&d) {
                    a[t] = *dv;
                }
            }
        }
    };
    let parts = l.run(|n0, split, m0| {
        let t0 = split * l.g.tiles_per_split;
        let t1 = (t0 + l.g.tiles_per_split).min(l.ktiles);
        let mut acc = vec![vec![[0f32; 4]; nt]; lanes];
        for kt in t0..t1 {
            let wl: Vec<[[u32; 4]; 2]> = (0..lanes)
                .map(|lane| l.load_w(w, n0, lane, kt, PAD_WORD))
                .collect();
            if !grouped {
                tile(&mut acc, &wl, &|_| true, m0, kt);
                continue;
            }
            let g0 = kt * MMA_KTILE / w.group;
            let g1 = ((kt * MMA_KTILE + MMA_KTILE).min(l.k) - 1) / w.group;
            for g in g0..=g1 {
                let mut tmp = vec![vec![[0f32; 4]; nt]; lanes];
                let gme = |lane: usize| (kt * MMA_KTILE + v.quad(lane) * CHUNK) / w.group == g;
                tile(&mut tmp, &wl, &gme, m0, kt);
                for lane in 0..lanes {
                    for i in 0..4 {
                        let row = n0 + v.drow(lane, i);
                        let s = if row < l.n {
                            w.scales[row * gcount + g]
                        } else {
                            0.0
                        };
                        for t in 0..nt {
                            acc[lane][t][i] += tmp[lane][t][i] * s;
                        }
                    }
                }
            }
        }
        l.store(&acc, (n0, split, m0), |row, a| {
            a * if grouped { 1.0 } else { w.scales[row] }
        })
    });
    stored(&parts, l.g.splits, m, w.n, 0f32)
}

/// The stored partials `(split, tok, row, value)` as the `part [splits, m, n]` buffer (every
/// entry is stored by exactly one lane; `zero` is never left where the grid covers the output).
fn stored<T: Copy>(
    parts: &[(usize, usize, usize, T)],
    splits: usize,
    m: usize,
    n: usize,
    zero: T,
) -> Vec<T> {
    let mut part = vec![zero; splits * m * n];
    for &(s, tok, row, v) in parts {
        part[(s * m + tok) * n + row] = v;
    }
    part
}

/// `kq_w4a8_mma_*` replayed for `v` at the launch geometry `g` (per channel, no scales read) on
/// the int8 activations `ap` as `kq_quant_act_i8` stores them (rows of `⌈k/32⌉·32` bytes): the
/// int32 partials it stores, `part [splits, m, n]`.
pub fn w4a8(v: Vendor, w: &W4Layout, ap: &[i8], m: usize, g: &tune::Mma) -> Vec<i32> {
    let l = Launch::new(v, w, m, g);
    let (lanes, nt) = (v.lanes(), l.nt());
    let maps = Maps::new(v.atom(true));
    let kp = l.kchunks * CHUNK;
    let xword = |tok: usize, byte: usize| -> u32 {
        let i = tok * kp + byte;
        u32::from_le_bytes([
            ap[i] as u8,
            ap[i + 1] as u8,
            ap[i + 2] as u8,
            ap[i + 3] as u8,
        ])
    };
    let parts = l.run(|n0, split, m0| {
        let t0 = split * l.g.tiles_per_split;
        let t1 = (t0 + l.g.tiles_per_split).min(l.ktiles);
        let mut acc = vec![vec![[0i32; 4]; nt]; lanes];
        for kt in t0..t1 {
            let wl: Vec<[[u32; 4]; 2]> = (0..lanes)
                .map(|lane| l.load_w(w, n0, lane, kt, 0))
                .collect();
            for jj in 0..2 {
                let mut r = [Regs::new(lanes), Regs::new(lanes)];
                for lane in 0..lanes {
                    for (h, rh) in r.iter_mut().enumerate() {
                        let (mut lo, mut hi) = ([0u32; 2], [0u32; 2]);
                        for s in 0..v.slots() {
                            let q = wl[lane][s][2 * jj + h];
                            lo[s] = q & 0x0f0f_0f0f;
                            hi[s] = (q >> 4) & 0x0f0f_0f0f;
                        }
                        rh.a[lane] = v.a_regs(&lo, &hi);
                    }
                }
                for t in 0..nt {
                    for lane in 0..lanes {
                        let tok = m0 + t * v.tok() + v.btok(lane);
                        let c = kt * 4 + v.quad(lane);
                        let kb = kt * MMA_KTILE + v.quad(lane) * CHUNK + 16 * jj;
                        let xv = if tok < l.m && c < l.kchunks {
                            [0, 4, 8, 12].map(|o| xword(tok, kb + o))
                        } else {
                            [0; 4]
                        };
                        r[0].b[lane] = [xv[0], xv[1]];
                        r[1].b[lane] = [xv[2], xv[3]];
                    }
                    let mut d: Vec<[i32; 4]> = acc.iter().map(|a| a[t]).collect();
                    maps.mma_i8(&r[0], &mut d);
                    maps.mma_i8(&r[1], &mut d);
                    for (lane, dv) in d.into_iter().enumerate() {
                        acc[lane][t] = dv;
                    }
                }
            }
        }
        l.store(&acc, (n0, split, m0), |_, a| a)
    });
    stored(&parts, l.g.splits, m, w.n, 0i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::layout::{decode_word, dequant8_magic, encode_word};

    #[test]
    fn bit_level_dequant_gives_the_codes() {
        for seed in 0..256u32 {
            let c: [i8; 8] = std::array::from_fn(|i| {
                ((seed.wrapping_mul(2654435761) >> (3 * i)) % 16) as i8 - 8
            });
            let w = encode_word(&c);
            assert_eq!(decode_word(w), c);
            let want = c.map(|v| v as f32);
            let f = dequant_f16x4(w);
            let b = dequant_bf16x4(w);
            for p in 0..4 {
                assert_eq!(
                    f16_halves(f[p]),
                    (want[2 * p], want[2 * p + 1]),
                    "f16 {w:08x}"
                );
                let bf = |h: u32| half::bf16::from_bits(h as u16).to_f32();
                assert_eq!(
                    (bf(b[p]), bf(b[p] >> 16)),
                    (want[2 * p], want[2 * p + 1]),
                    "bf16"
                );
            }
            assert_eq!(dequant8_magic(w), want);
        }
    }
}
