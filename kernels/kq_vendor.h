// kq_vendor.h — the one place where CUDA and HIP differ (cf. llama.cpp ggml-cuda/vendors/hip.h).
// Kernels are written in CUDA spelling and include only this header and kq_tune.h: no
// cuda_fp16.h / hip_fp16.h / <stdint.h> (NVRTC has no built-in cuda_fp16.h, hipRTC's built-in
// headers are unverified), so every fp16 / bf16 operation below is inline PTX on CUDA and clang
// vector extensions on HIP.
#pragma once

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(__HIPCC_RTC__) || defined(__HIP_DEVICE_COMPILE__)
#define KQ_HIP 1
#else
#define KQ_CUDA 1
#endif

typedef unsigned int kq_u32;
typedef unsigned short kq_u16;

// A 16-byte word, loaded with one 128-bit instruction (ld.global.v4 / global_load_dwordx4).
struct alignas(16) kq_u32x4 {
    kq_u32 x, y, z, w;
};

#if defined(KQ_HIP)
// ------------------------------------------------------------------------------------ HIP
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>  // offline builds (check.sh); hipRTC has these built in
#endif
#define KQ_WARP 64
#define KQ_DEVICE __device__ inline __attribute__((always_inline))
#define kq_shfl_xor(v, lane) __shfl_xor((v), (lane), KQ_WARP)
typedef _Float16 kq_h2v __attribute__((ext_vector_type(2)));

KQ_DEVICE float kq_as_float(kq_u32 u) { return __builtin_bit_cast(float, u); }
KQ_DEVICE kq_u32 kq_as_u32(float f) { return __builtin_bit_cast(kq_u32, f); }
// (a & b) | c — v_and_or_b32 on gfx9 when b, c sit in SGPRs.
KQ_DEVICE kq_u32 kq_and_or(kq_u32 a, kq_u32 b, kq_u32 c) { return (a & b) | c; }
// Packed f16x2 arithmetic on the raw bits: v_pk_add_f16 / v_pk_fma_f16.
KQ_DEVICE kq_u32 kq_hsub2(kq_u32 a, kq_u32 b) {
    return __builtin_bit_cast(kq_u32, __builtin_bit_cast(kq_h2v, a) - __builtin_bit_cast(kq_h2v, b));
}
KQ_DEVICE kq_u32 kq_hfma2(kq_u32 a, kq_u32 b, kq_u32 c) {
    kq_h2v x = __builtin_bit_cast(kq_h2v, a), y = __builtin_bit_cast(kq_h2v, b),
           z = __builtin_bit_cast(kq_h2v, c);
    return __builtin_bit_cast(kq_u32, x * y + z);
}
KQ_DEVICE float kq_h2_lo(kq_u32 h) { return (float)__builtin_bit_cast(kq_h2v, h).x; }
KQ_DEVICE float kq_h2_hi(kq_u32 h) { return (float)__builtin_bit_cast(kq_h2v, h).y; }
KQ_DEVICE float kq_f16_to_f32(kq_u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
// Signed 4×int8 dot product with int32 accumulation (v_dot4_i32_i8 / v_dot4c_i32_i8), exact.
KQ_DEVICE int kq_dp4a(int a, int b, int c) { return __builtin_amdgcn_sdot4(a, b, c, false); }
KQ_DEVICE float kq_rint(float x) { return __builtin_rintf(x); }
KQ_DEVICE float kq_fabs(float x) { return __builtin_fabsf(x); }
KQ_DEVICE float kq_fmax(float a, float b) { return __builtin_fmaxf(a, b); }

#else
// ------------------------------------------------------------------------------------ CUDA
#define KQ_WARP 32
#define KQ_DEVICE __device__ inline __attribute__((always_inline))
#define kq_shfl_xor(v, lane) __shfl_xor_sync(0xffffffffu, (v), (lane), KQ_WARP)

KQ_DEVICE float kq_as_float(kq_u32 u) { return __int_as_float((int)u); }
KQ_DEVICE kq_u32 kq_as_u32(float f) { return (kq_u32)__float_as_int(f); }
// (a & b) | c in one lop3 (immLut 0xEA = (0xF0 & 0xCC) | 0xAA).
KQ_DEVICE kq_u32 kq_and_or(kq_u32 a, kq_u32 b, kq_u32 c) {
    kq_u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
KQ_DEVICE kq_u32 kq_hsub2(kq_u32 a, kq_u32 b) {
    kq_u32 r;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
KQ_DEVICE kq_u32 kq_hfma2(kq_u32 a, kq_u32 b, kq_u32 c) {
    kq_u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
KQ_DEVICE float kq_h2_lo(kq_u32 h) {
    float f;
    asm("{ .reg .b16 l, u; mov.b32 {l, u}, %1; cvt.f32.f16 %0, l; }" : "=f"(f) : "r"(h));
    return f;
}
KQ_DEVICE float kq_h2_hi(kq_u32 h) {
    float f;
    asm("{ .reg .b16 l, u; mov.b32 {l, u}, %1; cvt.f32.f16 %0, u; }" : "=f"(f) : "r"(h));
    return f;
}
KQ_DEVICE float kq_f16_to_f32(kq_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
KQ_DEVICE int kq_dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
KQ_DEVICE float kq_rint(float x) { return rintf(x); }
KQ_DEVICE float kq_fabs(float x) { return fabsf(x); }
KQ_DEVICE float kq_fmax(float a, float b) { return fmaxf(a, b); }
#endif

// bf16 -> f32 is a shift on both vendors.
KQ_DEVICE float kq_bf16_to_f32(kq_u16 h) { return kq_as_float((kq_u32)h << 16); }

// Sum over the lanes of one warp / wavefront (xor butterfly, every lane gets the total).
KQ_DEVICE float kq_warp_sum(float v) {
#pragma unroll
    for (int o = KQ_WARP / 2; o > 0; o >>= 1) v += kq_shfl_xor(v, o);
    return v;
}
KQ_DEVICE int kq_warp_sum_i(int v) {
#pragma unroll
    for (int o = KQ_WARP / 2; o > 0; o >>= 1) v += kq_shfl_xor(v, o);
    return v;
}
KQ_DEVICE float kq_warp_max(float v) {
#pragma unroll
    for (int o = KQ_WARP / 2; o > 0; o >>= 1) v = kq_fmax(v, kq_shfl_xor(v, o));
    return v;
}
