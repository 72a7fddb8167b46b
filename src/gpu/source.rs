//! The kernel source as one string for NVRTC / hipRTC: `kq_vendor.h` and `kq_tune.h` once, then
//! `w4_gemv.cu` (regime A), `w4_mma.cu` (regime B) and `w4_dense.cu` (regime C) with their local
//! includes and `#pragma once` dropped (run-time compilers get no include path; the crate may
//! run far from its source tree). `kernels/check.sh` compiles the same files one by one and this
//! assembled module too (built the same way in shell).

use super::Act;

const VENDOR: &str = include_str!("../../kernels/kq_vendor.h");
const TUNE: &str = include_str!("../../kernels/kq_tune.h");
const GEMV: &str = include_str!("../../kernels/w4_gemv.cu");
const MMA: &str = include_str!("../../kernels/w4_mma.cu");
const DENSE: &str = include_str!("../../kernels/w4_dense.cu");

/// The whole module: headers once, then the three kernel files.
pub fn module() -> String {
    let mut out = String::new();
    for file in [VENDOR, TUNE, GEMV, MMA, DENSE] {
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
    format!(
        "kq_w4a16_gemv_{}_{}_m{m}",
        act.name(),
        if per_channel { "pc" } else { "g" }
    )
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
    format!(
        "kq_w4a16_mma_{}_{}_m{toks}",
        act.name(),
        if per_channel { "pc" } else { "g" }
    )
}
pub fn w4a8_mma_name(toks: usize) -> String {
    format!("kq_w4a8_mma_m{toks}")
}
pub const W4A8_REDUCE: &str = "kq_w4a8_reduce";

/// Regime C entry points.
pub fn dequant_name(act: Act, per_channel: bool) -> String {
    format!(
        "kq_w4_dequant_{}_{}",
        act.name(),
        if per_channel { "pc" } else { "g" }
    )
}
pub const SCALE_COLS: &str = "kq_scale_cols";

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
        for file in [VENDOR, TUNE, GEMV, MMA, DENSE] {
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
    }
}
