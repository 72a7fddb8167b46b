//! The kernel source as one string for NVRTC / hipRTC: `kq_vendor.h` and `kq_tune.h` once, then
//! `w4_gemv.cu` (regime A), `w4_mma.cu` (regime B), `w4_dense.cu` (regime C), `argmax.cu` (each
//! row's argmax, for a device lm_head) and `ops.cu` (the rest of a draft step on the device) with
//! their local includes and `#pragma once` dropped (run-time compilers get no include path; the
//! crate may run far from its source tree). `kernels/check.sh` compiles the same files one by one and this
//! assembled module too (built the same way in shell).
//!
//! Next to it, the host's side of each entry point, written once: its name (the `*_name`
//! functions) and, in [`Kernel`], its argument list in the order of its C signature, which every
//! [`super::driver::Driver`] launches and the CPU emulation reads by field.

use super::{Act, Elem};

/// One kernel argument as the C signature takes it: a device pointer or an `int`.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a, B> {
    Buf(&'a B),
    Int(i32),
}

const VENDOR: &str = include_str!("../../kernels/kq_vendor.h");
const TUNE: &str = include_str!("../../kernels/kq_tune.h");
const GEMV: &str = include_str!("../../kernels/w4_gemv.cu");
const MMA: &str = include_str!("../../kernels/w4_mma.cu");
const DENSE: &str = include_str!("../../kernels/w4_dense.cu");
const ARGMAX: &str = include_str!("../../kernels/argmax.cu");
const OPS: &str = include_str!("../../kernels/ops.cu");

/// The whole module: headers once, then the five kernel files.
pub fn module() -> String {
    let mut out = String::new();
    for file in [VENDOR, TUNE, GEMV, MMA, DENSE, ARGMAX, OPS] {
        for line in file.lines() {
            match line.trim() {
                "#include \"kq_vendor.h\"" | "#include \"kq_tune.h\"" | "#pragma once" => {}
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
    }
    out
}

/// Regime A entry points.
pub fn w4a16_name(act: Act, per_channel: bool, m: usize) -> String {
    format!("kq_w4a16_gemv_{}_{}_m{m}", act.name(), pc_g(per_channel))
}
pub fn w4a8_name(m: usize) -> String {
    format!("kq_w4a8_gemv_m{m}")
}
pub fn quant_act_name(act: Act) -> String {
    format!("kq_quant_act_i8_{}", act.name())
}
pub const SPLITK_REDUCE: &str = "kq_splitk_reduce";

/// Regime B entry points (`toks` tokens per block, [`super::tune::Mma::toks`]).
pub fn w4a16_mma_name(act: Act, per_channel: bool, toks: usize) -> String {
    format!("kq_w4a16_mma_{}_{}_m{toks}", act.name(), pc_g(per_channel))
}
pub fn w4a8_mma_name(toks: usize) -> String {
    format!("kq_w4a8_mma_m{toks}")
}
pub const W4A8_REDUCE: &str = "kq_w4a8_reduce";

/// Regime C entry points.
pub fn dequant_name(act: Act, per_channel: bool) -> String {
    format!("kq_w4_dequant_{}_{}", act.name(), pc_g(per_channel))
}
pub const SCALE_COLS: &str = "kq_scale_cols";

/// Each row's argmax (`argmax.cu`), one block of [`ARGMAX_THREADS`] threads per row.
pub const ARGMAX_ROWS: &str = "kq_argmax_rows";
/// `KQ_ARGMAX_THREADS` in `argmax.cu`: the block size `kq_argmax_rows` is written for.
pub const ARGMAX_THREADS: u32 = 256;

/// The step kernels of `ops.cu`: their block size (`KQ_OPS_THREADS`; `kq_attend` runs one warp
/// per block instead).
pub const OPS_THREADS: u32 = 256;
/// Value dims one lane of `kq_attend` accumulates (`KQ_ATT_VPL`): `v_dim` ≤ this × the warp.
pub const ATT_VALUES_PER_LANE: usize = 8;

/// `kq_embed_rows_{bf16,f16,f32}`: the embedding gather for a table of `elem`.
pub fn embed_name(elem: Elem) -> String {
    format!("kq_embed_rows_{}", elem.name())
}
/// `kq_to_act_{bf16,f16}`: f32 rounded to the activation dtype.
pub fn to_act_name(act: Act) -> String {
    format!("kq_to_act_{}", act.name())
}
pub const RMS_NORM: &str = "kq_rms_norm";
pub const ROPE: &str = "kq_rope";
pub const COPY_COLS: &str = "kq_copy_cols";
pub const ATTEND: &str = "kq_attend";
pub const SILU_MUL: &str = "kq_silu_mul";
pub const ADD: &str = "kq_add";
pub const GATHER_ROWS: &str = "kq_gather_rows";

/// Largest M a GEMV entry point exists for (`KQ_ALL_M` in `w4_gemv.cu`: `_m1` … `_m8`). Not a
/// tuning choice: which M the regime choice sends to the GEMV is `Tune::gemv_max_m`, at most this.
pub const GEMV_MAX_M: usize = 8;

fn pc_g(per_channel: bool) -> &'static str {
    if per_channel {
        "pc"
    } else {
        "g"
    }
}

/// Declares [`Kernel`]: per entry point the fields its name is made of, then its arguments in
/// the C signature's order — every signature takes its pointers first, then its `int`s — so that
/// each argument list is written once, here, and [`Kernel::args`] is generated from it.
macro_rules! kernels {
    ($(
        $(#[doc = $doc:literal])*
        $v:ident { $($meta:ident: $mt:ty),*; ptr $($buf:ident),*; int $($int:ident),* }
    )*) => {
        /// Each entry point's arguments, one struct per entry point named as its [`Kernel`]
        /// variant: the fields its name is made of, its device buffers `B` and its `int`s.
        pub mod args {
            use crate::gpu::{Act, Elem};
            $(
                $(#[doc = $doc])*
                pub struct $v<'a, B> { $(pub $meta: $mt,)* $(pub $buf: &'a B,)* $(pub $int: usize,)* }
            )*
        }

        /// One launch of an entry point of [`module`]: which instantiation, and its arguments
        /// (device buffers `B` and `int`s; what sizes they need is the launcher's business,
        /// [`super::dispatch`] and [`super::ops`]).
        pub enum Kernel<'a, B> {
            $($(#[doc = $doc])* $v(args::$v<'a, B>),)*
        }

        impl<'a, B> Kernel<'a, B> {
            /// The arguments in the C signature's order (`int`s as the kernels take them).
            pub fn args(&self) -> Vec<Arg<'a, B>> {
                match self {
                    $(Kernel::$v(a) => {
                        vec![$(Arg::Buf(a.$buf),)* $(Arg::Int(a.$int as i32),)*]
                    })*
                }
            }
        }

        /// Per entry point: its variant, and how many pointers and `int`s it takes.
        #[cfg(test)]
        const SIGNATURES: &[(&str, usize, usize)] = &[
            $((stringify!($v), [$(stringify!($buf)),*].len(), [$(stringify!($int)),*].len()),)*
        ];
    };
}

kernels! {
    /// `kq_w4a16_gemv_{act}_{pc,g}_m{m}(qw, scales, x, out, N, K, group, chunks_per_split)`:
    /// split `blockIdx.y`'s partial sums into `part[split][m][n]`.
    W4a16Gemv {
        act: Act, per_channel: bool, m: usize;
        ptr qweight, scales, x, part;
        int n, k, group, chunks_per_split
    }
    /// `kq_w4a8_gemv_m{m}(qw, wscale, xq, xscale, xsum, out, N, K, chunks_per_split)`.
    W4a8Gemv {
        m: usize;
        ptr qweight, scales, xq, xs, xsum, part;
        int n, k, chunks_per_split
    }
    /// `kq_quant_act_i8_{act}(x, xq, xscale, xsum, K)`: one block per token (`gridDim.x` = M).
    QuantActI8 {
        act: Act;
        ptr x, xq, xs, xsum;
        int k
    }
    /// `kq_splitk_reduce(part, out, mn, splits)`.
    SplitkReduce {
        ;
        ptr part, out;
        int mn, splits
    }
    /// `kq_w4a16_mma_{act}_{pc,g}_m{toks}(qw, scales, x, out, M, N, K, group, tiles_per_split)`.
    W4a16Mma {
        act: Act, per_channel: bool, toks: usize;
        ptr qweight, scales, x, part;
        int m, n, k, group, tiles_per_split
    }
    /// `kq_w4a8_mma_m{toks}(qw, xq, part, M, N, K, tiles_per_split)`.
    W4a8Mma {
        toks: usize;
        ptr qweight, xq, part;
        int m, n, k, tiles_per_split
    }
    /// `kq_w4a8_reduce(part, ws, xs, xsum, out, M, N, splits)`.
    W4a8Reduce {
        ;
        ptr part, scales, xs, xsum, out;
        int m, n, splits
    }
    /// `kq_w4_dequant_{act}_{pc,g}(qw, scales, w, N, K, group)`.
    Dequant {
        act: Act, per_channel: bool;
        ptr qweight, scales, dense;
        int n, k, group
    }
    /// `kq_scale_cols(y, s, M, N)`.
    ScaleCols {
        ;
        ptr out, scales;
        int m, n
    }
    /// `kq_argmax_rows(y, idx, M, N)`: `idx[row]` (int32) = the argmax of row `row` of the
    /// `[M, N]` f32 `y`; one block per row (`gridDim.x` = M).
    ArgmaxRows {
        ;
        ptr y, idx;
        int m, n
    }
    /// `kq_embed_rows_{elem}(table, ids, out, n, h)`: `out [n, h]` f32 = the rows `ids` of the
    /// `[vocab, h]` table.
    EmbedRows {
        elem: Elem;
        ptr table, ids, out;
        int n, h
    }
    /// `kq_rms_norm(x, w, out, n, h, in_ld, in_off, out_ld, out_off, eps_bits)`: one block per
    /// row.
    RmsNorm {
        ;
        ptr x, w, out;
        int n, h, in_ld, in_off, out_ld, out_off, eps_bits
    }
    /// `kq_rope(x, pos, cs, n, heads, half, ld, off, head_ld, interleaved)`: in place,
    /// `cs [positions, half, 2]`.
    Rope {
        ;
        ptr x, pos, cs;
        int n, heads, half, ld, off, head_ld, interleaved
    }
    /// `kq_copy_cols(src, dst, n, heads, w, src_ld, src_off, src_hs, dst_ld, dst_off, dst_hs)`.
    CopyCols {
        ;
        ptr src, dst;
        int n, heads, w, src_ld, src_off, src_hs, dst_ld, dst_off, dst_hs
    }
    /// `kq_attend(q, k0, v0, kd, vd, rows, slots, out, m, n, start, diag, heads, kv_heads, dq,
    /// dv, scale_bits)`: one warp per (row, head), `grid = (m, heads)`.
    Attend {
        ;
        ptr q, k0, v0, kd, vd, rows, slots, out;
        int m, n, start, diag, heads, kv_heads, dq, dv, scale_bits
    }
    /// `kq_silu_mul(g, u, out, len)`.
    SiluMul {
        ;
        ptr g, u, out;
        int len
    }
    /// `kq_add(a, b, out, len)`.
    Add {
        ;
        ptr a, b, out;
        int len
    }
    /// `kq_to_act_{act}(x, y, len)`.
    ToAct {
        act: Act;
        ptr x, y;
        int len
    }
    /// `kq_gather_rows(src, idx, dst, m, w, dst_off)`.
    GatherRows {
        ;
        ptr src, idx, dst;
        int m, w, dst_off
    }
}

impl<B> Kernel<'_, B> {
    /// The entry point's name.
    pub fn name(&self) -> String {
        match self {
            Kernel::W4a16Gemv(a) => w4a16_name(a.act, a.per_channel, a.m),
            Kernel::W4a8Gemv(a) => w4a8_name(a.m),
            Kernel::QuantActI8(a) => quant_act_name(a.act),
            Kernel::SplitkReduce(_) => SPLITK_REDUCE.into(),
            Kernel::W4a16Mma(a) => w4a16_mma_name(a.act, a.per_channel, a.toks),
            Kernel::W4a8Mma(a) => w4a8_mma_name(a.toks),
            Kernel::W4a8Reduce(_) => W4A8_REDUCE.into(),
            Kernel::Dequant(a) => dequant_name(a.act, a.per_channel),
            Kernel::ScaleCols(_) => SCALE_COLS.into(),
            Kernel::ArgmaxRows(_) => ARGMAX_ROWS.into(),
            Kernel::EmbedRows(a) => embed_name(a.elem),
            Kernel::RmsNorm(_) => RMS_NORM.into(),
            Kernel::Rope(_) => ROPE.into(),
            Kernel::CopyCols(_) => COPY_COLS.into(),
            Kernel::Attend(_) => ATTEND.into(),
            Kernel::SiluMul(_) => SILU_MUL.into(),
            Kernel::Add(_) => ADD.into(),
            Kernel::ToAct(a) => to_act_name(a.act),
            Kernel::GatherRows(_) => GATHER_ROWS.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name a launcher asks for is defined by the assembled source (the macros expand to
    /// these; checked on the macro arguments, as no preprocessor runs here).
    #[test]
    fn assembled_source_is_self_contained_and_names_match() {
        let s = module();
        assert!(!s.contains("#include \"kq_"), "local includes dropped");
        assert!(!s.contains("#pragma once"), "one translation unit");
        for file in [VENDOR, TUNE, GEMV, MMA, DENSE, ARGMAX, OPS] {
            let body = file
                .lines()
                .filter(|l| !l.starts_with("#include \"kq_") && l.trim() != "#pragma once");
            assert!(body.clone().all(|l| s.contains(l)), "every line kept");
            assert_eq!(
                s.matches(body.clone().next().unwrap()).count(),
                1,
                "each file once"
            );
        }
        assert!(s.contains("kq_w4a16_gemv_##T##_##G##_m##M"));
        assert!(s.contains("KQ_ALL_M(KQ_BF16_PC)") && s.contains("KQ_ALL_M(KQ_W4A8)"));
        for act in [Act::Bf16, Act::F16] {
            assert!(s.contains(&format!("void {}(", quant_act_name(act))));
            for pc in [true, false] {
                let _ = w4a16_name(act, pc, 1);
                let n = dequant_name(act, pc);
                let (t, g) = n
                    .trim_start_matches("kq_w4_dequant_")
                    .split_once('_')
                    .unwrap();
                assert!(s.contains(&format!(
                    "KQ_DENSE({t}, {}, {g}, {})",
                    act == Act::Bf16,
                    !pc
                )));
            }
        }
        assert!(s.contains("kq_w4a16_mma_##T##_##G##_m##TOKS"));
        assert!(s.contains("#define KQ_MMA_ALL_M(X) X(16) X(32) X(64) X(128)"));
        assert!(s.contains("#define KQ_MMA_G_M(X) X(16) X(32) X(64)"));
        for m in ["_BF16_PC", "_F16_PC", "8"] {
            assert!(s.contains(&format!("KQ_MMA_ALL_M(KQ_MMA{m})")), "{m}");
        }
        for m in ["BF16_G", "F16_G"] {
            assert!(s.contains(&format!("KQ_MMA_G_M(KQ_MMA_{m})")), "{m}");
        }
        assert_eq!(
            w4a16_mma_name(Act::F16, false, 64),
            "kq_w4a16_mma_f16_g_m64"
        );
        assert_eq!(w4a8_mma_name(128), "kq_w4a8_mma_m128");
        for f in [SPLITK_REDUCE, W4A8_REDUCE, SCALE_COLS] {
            assert!(s.contains(&format!("void {f}(")), "{f}");
        }
        assert!(s.contains(&format!(
            "__launch_bounds__(KQ_ARGMAX_THREADS)\n    {ARGMAX_ROWS}("
        )));
    }

    /// The block size the launcher uses is the one `kq_argmax_rows` is written for (its shared
    /// arrays and launch bounds), and a power of two (the tree reduction halves it).
    #[test]
    fn argmax_threads_is_the_kernels() {
        assert!(ARGMAX.contains(&format!("#define KQ_ARGMAX_THREADS {ARGMAX_THREADS}\n")));
        assert!(ARGMAX_THREADS.is_power_of_two() && ARGMAX_THREADS <= 1024);
    }

    /// The step kernels' names and block sizes are `ops.cu`'s.
    #[test]
    fn ops_names_and_sizes_are_the_kernels() {
        let s = module();
        assert!(OPS.contains(&format!("#define KQ_OPS_THREADS {OPS_THREADS}\n")));
        assert!(OPS.contains(&format!("#define KQ_ATT_VPL {ATT_VALUES_PER_LANE}\n")));
        for e in [Elem::Half(Act::Bf16), Elem::Half(Act::F16), Elem::F32] {
            let t = embed_name(e)
                .trim_start_matches("kq_embed_rows_")
                .to_string();
            assert!(s.contains(&format!("KQ_EMBED({t}, ")), "{t}");
        }
        for a in [Act::Bf16, Act::F16] {
            let t = to_act_name(a).trim_start_matches("kq_to_act_").to_string();
            assert!(s.contains(&format!("KQ_TO_ACT({t}, ")), "{t}");
        }
        for f in [
            RMS_NORM,
            ROPE,
            COPY_COLS,
            ATTEND,
            SILU_MUL,
            ADD,
            GATHER_ROWS,
        ] {
            assert!(s.contains(&format!("    {f}(")), "{f}");
        }
    }

    /// The GEMV entry points exist for M = 1 ..= [`GEMV_MAX_M`].
    #[test]
    fn gemv_max_m_is_the_instantiated_range() {
        let want: String = (1..=GEMV_MAX_M).map(|m| format!(" X({m})")).collect();
        assert!(GEMV.contains(&format!("#define KQ_ALL_M(X){want}\n")));
    }

    /// Each [`Kernel`] takes as many pointers, then `int`s, as its C signature in the kernel
    /// source.
    #[test]
    fn kernel_args_follow_the_c_signatures() {
        let s = module();
        for &(variant, ptrs, ints) in SIGNATURES {
            let marker = match variant {
                "W4a16Gemv" => "kq_w4a16_gemv_##T##_##G##_m##M(",
                "W4a8Gemv" => "kq_w4a8_gemv_m##M(",
                "QuantActI8" => "void kq_quant_act_i8_bf16(",
                "SplitkReduce" => "void kq_splitk_reduce(",
                "W4a16Mma" => "kq_w4a16_mma_##T##_##G##_m##TOKS(",
                "W4a8Mma" => "kq_w4a8_mma_m##TOKS(",
                "W4a8Reduce" => "void kq_w4a8_reduce(",
                "Dequant" => "kq_w4_dequant_##T##_##G(",
                "ScaleCols" => "void kq_scale_cols(",
                "ArgmaxRows" => "kq_argmax_rows(",
                "EmbedRows" => "kq_embed_rows_##T(",
                "RmsNorm" => "kq_rms_norm(",
                "Rope" => "kq_rope(",
                "CopyCols" => "kq_copy_cols(",
                "Attend" => "kq_attend(",
                "SiluMul" => "kq_silu_mul(",
                "Add" => "kq_add(",
                "ToAct" => "kq_to_act_##T(",
                "GatherRows" => "kq_gather_rows(",
                other => panic!("no signature to check {other} against"),
            };
            let at = s.find(marker).unwrap_or_else(|| panic!("{marker}")) + marker.len();
            let params: Vec<String> = s[at..at + s[at..].find(')').unwrap()]
                .replace('\\', " ")
                .split(',')
                .map(|p| p.trim().to_string())
                .collect();
            let want: Vec<bool> = (0..ptrs + ints).map(|i| i < ptrs).collect();
            let got: Vec<bool> = params.iter().map(|p| p.contains('*')).collect();
            assert_eq!(got, want, "{variant}: {params:?}");
            assert!(
                params[ptrs..].iter().all(|p| p.starts_with("int ")),
                "{variant}"
            );
        }
        assert_eq!(SIGNATURES.len(), 19);
    }
}
