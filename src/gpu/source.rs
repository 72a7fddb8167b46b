//! The kernel source as one string for NVRTC / hipRTC: `kernels/w4_gemv.cu` with its two local
//! headers inlined (run-time compilers get no include path; the crate may run far from its
//! source tree). The same files are what `kernels/check.sh` compiles offline.

const VENDOR: &str = include_str!("../../kernels/kq_vendor.h");
const TUNE: &str = include_str!("../../kernels/kq_tune.h");
const GEMV: &str = include_str!("../../kernels/w4_gemv.cu");

/// `w4_gemv.cu` with `#include "kq_vendor.h"` / `"kq_tune.h"` replaced by their text.
pub fn w4_gemv() -> String {
    let mut out = String::new();
    for line in GEMV.lines() {
        match line.trim() {
            "#include \"kq_vendor.h\"" => out.push_str(VENDOR),
            "#include \"kq_tune.h\"" => out.push_str(TUNE),
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Kernel entry point names.
pub fn w4a16_name(act: super::Act, per_channel: bool, m: usize) -> String {
    format!(
        "kq_w4a16_gemv_{}_{}_m{m}",
        act.name(),
        if per_channel { "pc" } else { "g" }
    )
}
pub fn w4a8_name(m: usize) -> String {
    format!("kq_w4a8_gemv_m{m}")
}
pub fn quant_act_name(act: super::Act) -> String {
    format!("kq_quant_act_i8_{}", act.name())
}
pub const SPLITK_REDUCE: &str = "kq_splitk_reduce";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assembled_source_is_self_contained_and_names_match() {
        let s = w4_gemv();
        assert!(!s.contains("#include \"kq_"), "local includes inlined");
        for act in [super::super::Act::Bf16, super::super::Act::F16] {
            for m in 1..=8 {
                for pc in [true, false] {
                    assert!(s.contains("kq_w4a16_gemv_##T##_##G##_m##M"));
                    let _ = w4a16_name(act, pc, m);
                }
            }
            assert!(s.contains(&format!("void {}(", quant_act_name(act))));
        }
        assert!(s.contains("KQ_ALL_M(KQ_BF16_PC)") && s.contains("KQ_ALL_M(KQ_W4A8)"));
        assert!(s.contains(&format!("void {SPLITK_REDUCE}(")));
    }
}
