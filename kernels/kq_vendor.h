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
KQ_DEVICE float kq_expf(float x) { return __builtin_expf(x); }
KQ_DEVICE float kq_sqrtf(float x) { return __builtin_sqrtf(x); }
// f32 -> f16 / bf16 bits, round to nearest even (finite inputs).
KQ_DEVICE kq_u16 kq_f32_to_f16(float f) { return __builtin_bit_cast(kq_u16, (_Float16)f); }
KQ_DEVICE kq_u16 kq_f32_to_bf16(float f) {
    const kq_u32 u = kq_as_u32(f);
    return (kq_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Two offset-binary nibbles at bits 0..3 and 16..19 of q -> bf16x2 of (u0 - 8, u1 - 8). gfx94x has
// no packed bf16 VALU: each half goes through f32 (2^23 + u, minus 2^23 + 8, exact), and small
// integers are exact in bf16, so taking the high 16 bits is exact.
KQ_DEVICE kq_u32 kq_dequant_bf16x2(kq_u32 q) {
    const float lo = kq_as_float((q & 0xfu) | 0x4b000000u) - 8388616.f;
    const float hi = kq_as_float(((q >> 16) & 0xfu) | 0x4b000000u) - 8388616.f;
    return (kq_as_u32(lo) >> 16) | (kq_as_u32(hi) & 0xffff0000u);
}

// ---- Matrix-core atoms for regime B (w4_mma.cu). One wavefront computes
// D[16 weight rows x 16 tokens] += A[16 x K] . B[K x 16] with CDNA3 MFMA. Operand ownership
// (AMD's CDNA3 layout, as tabulated in flashinfer's gpu_iface/backend/hip/mma_layouts for
// v_mfma_f32_16x16x16f16): A[i][k] sits in lane i + 16*(k/4), item k%4; B[k][j] in lane
// j + 16*(k/4), item k%4; C/D[i][j] in lane j + 16*(i/4), item i%4. The i8 atom
// (v_mfma_i32_16x16x32_i8) has 8 items per lane: k/8 and k%8. Mirrored in src/gpu/fragment.rs.
#define KQ_MMA_TOK 16   // tokens (B columns) per atom
#define KQ_MMA_SLOTS 1  // weight rows per lane
KQ_DEVICE int kq_mma_row(int lane, int slot) { return (lane & 15) + 0 * slot; }
KQ_DEVICE int kq_mma_quad(int lane) { return lane >> 4; }  // 32-weight chunk of a 128-k tile
KQ_DEVICE int kq_mma_btok(int lane) { return lane & 15; }
KQ_DEVICE int kq_mma_drow(int lane, int i) { return 4 * (lane >> 4) + i; }
KQ_DEVICE int kq_mma_dtok(int lane, int i) { return (lane & 15) + 0 * i; }
typedef _Float16 kq_h4v __attribute__((ext_vector_type(4)));
typedef short kq_s4v __attribute__((ext_vector_type(4)));
typedef float kq_f4v __attribute__((ext_vector_type(4)));
typedef int kq_i4v __attribute__((ext_vector_type(4)));
KQ_DEVICE unsigned long long kq_pack64(kq_u32 lo, kq_u32 hi) {
    return (unsigned long long)lo | ((unsigned long long)hi << 32);
}
// lo/hi: per slot, the two f16x2 registers of this step (k items 0,1 and 2,3); b0/b1 likewise.
KQ_DEVICE void kq_mma_f16(float* d, const kq_u32* lo, const kq_u32* hi, kq_u32 b0, kq_u32 b1) {
    kq_f4v c = {d[0], d[1], d[2], d[3]};
    c = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(kq_h4v, kq_pack64(lo[0], hi[0])),
                                              __builtin_bit_cast(kq_h4v, kq_pack64(b0, b1)), c, 0, 0, 0);
    d[0] = c.x; d[1] = c.y; d[2] = c.z; d[3] = c.w;
}
KQ_DEVICE void kq_mma_bf16(float* d, const kq_u32* lo, const kq_u32* hi, kq_u32 b0, kq_u32 b1) {
    kq_f4v c = {d[0], d[1], d[2], d[3]};
    c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(kq_s4v, kq_pack64(lo[0], hi[0])),
                                                  __builtin_bit_cast(kq_s4v, kq_pack64(b0, b1)), c, 0, 0, 0);
    d[0] = c.x; d[1] = c.y; d[2] = c.z; d[3] = c.w;
}
// int8: lo/hi are the two 4-byte halves of the lane's 8 k items; exact int32 accumulation.
KQ_DEVICE void kq_mma_i8(int* d, const kq_u32* lo, const kq_u32* hi, kq_u32 b0, kq_u32 b1) {
    kq_i4v c = {d[0], d[1], d[2], d[3]};
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
    c = __builtin_amdgcn_mfma_i32_16x16x32_i8((long)kq_pack64(lo[0], hi[0]), (long)kq_pack64(b0, b1), c, 0, 0, 0);
#else
    // CDNA1/2 have no k32 int8 MFMA: two k16 ones (the k order inside a step is free, see w4_mma.cu).
    c = __builtin_amdgcn_mfma_i32_16x16x16i8((int)lo[0], (int)b0, c, 0, 0, 0);
    c = __builtin_amdgcn_mfma_i32_16x16x16i8((int)hi[0], (int)b1, c, 0, 0, 0);
#endif
    d[0] = c.x; d[1] = c.y; d[2] = c.z; d[3] = c.w;
}

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
KQ_DEVICE float kq_expf(float x) { return expf(x); }
KQ_DEVICE float kq_sqrtf(float x) { return sqrtf(x); }
KQ_DEVICE kq_u16 kq_f32_to_f16(float f) {
    kq_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
KQ_DEVICE kq_u16 kq_f32_to_bf16(float f) {
    kq_u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// Two offset-binary nibbles at bits 0..3 and 16..19 of q -> bf16x2 of (u0 - 8, u1 - 8):
// (q & 0x000f000f) | 0x43004300 is the bf16 pair 128 + u (7 mantissa bits, ulp 1 at 128), then
// one fma.rn.bf16x2 (sm_80+) with 1.0 and -136.0; exact.
KQ_DEVICE kq_u32 kq_dequant_bf16x2(kq_u32 q) {
    kq_u32 r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;"
        : "=r"(r)
        : "r"(kq_and_or(q, 0x000f000fu, 0x43004300u)), "r"(0x3f803f80u), "r"(0xc308c308u));
    return r;
}

// ---- Tensor-core atoms for regime B (w4_mma.cu): mma.sync m16n8k16 (f16/bf16 -> f32) and
// m16n8k32 (s8 -> s32), sm_80 and later (sm_90, sm_100, sm_120 from one PTX). PTX ISA, "Matrix
// Fragments for mma.m16n8k16 with floating point type" (groupID = %laneid >> 2,
// threadID_in_group = %laneid % 4):
//   A: row = groupID for ai where 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise;
//      col = (threadID_in_group * 2) + (i & 0x1) for ai where i < 4, ... + 8 for ai where i >= 4
//   B: row = (threadID_in_group * 2) + (i & 0x1) for bi where i < 2, ... + 8 for bi where i >= 2;
//      col = groupID
//   C/D: row = groupID for ci where i < 2, groupID + 8 for ci where i >= 2;
//      col = (threadID_in_group * 2) + (i & 0x1)
// and for mma.m16n8k32 with .s8: A row = groupID for ai where 0 <= i < 4 || 8 <= i < 12,
// groupID + 8 otherwise; col = (threadID_in_group * 4) + (i & 0x3) for i < 8, + 16 for i >= 8;
// B row = (threadID_in_group * 4) + (i & 0x3) for bi where i < 4, + 16 for i >= 4, col = groupID.
// Mirrored (and checked to be permutations) in src/gpu/fragment.rs.
#define KQ_MMA_TOK 8    // tokens (B columns) per atom
#define KQ_MMA_SLOTS 2  // weight rows per lane: groupID and groupID + 8
KQ_DEVICE int kq_mma_row(int lane, int slot) { return (lane >> 2) + 8 * slot; }
KQ_DEVICE int kq_mma_quad(int lane) { return lane & 3; }  // 32-weight chunk of a 128-k tile
KQ_DEVICE int kq_mma_btok(int lane) { return lane >> 2; }
KQ_DEVICE int kq_mma_drow(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
KQ_DEVICE int kq_mma_dtok(int lane, int i) { return 2 * (lane & 3) + (i & 1); }
// lo/hi: per slot, the f16x2 registers of this step (k items 0,1 and 2,3 of the lane's four);
// A = {a0a1, a2a3, a4a5, a6a7} = {lo[0], lo[1], hi[0], hi[1]}; B = {b0b1, b2b3} = {b0, b1}.
KQ_DEVICE void kq_mma_f16(float* d, const kq_u32* lo, const kq_u32* hi, kq_u32 b0, kq_u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(lo[0]), "r"(lo[1]), "r"(hi[0]), "r"(hi[1]), "r"(b0), "r"(b1));
}
KQ_DEVICE void kq_mma_bf16(float* d, const kq_u32* lo, const kq_u32* hi, kq_u32 b0, kq_u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(lo[0]), "r"(lo[1]), "r"(hi[0]), "r"(hi[1]), "r"(b0), "r"(b1));
}
// int8: A = {a0..a3, a4..a7, a8..a11, a12..a15} = {lo[0], lo[1], hi[0], hi[1]}; exact int32.
KQ_DEVICE void kq_mma_i8(int* d, const kq_u32* lo, const kq_u32* hi, kq_u32 b0, kq_u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(lo[0]), "r"(lo[1]), "r"(hi[0]), "r"(hi[1]), "r"(b0), "r"(b1));
}
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

// One kq-w4-gemv/1 word (nibble i = element [0,2,4,6,1,3,5,7][i], offset binary u = q + 8) as four
// register pairs (e0,e1) (e2,e3) (e4,e5) (e6,e7) of exact codes q. f16: the magic-number trick
// ((w & 0x000f000f) | 0x64006400 is 1024 + u, minus 1032; the high nibbles give 1024 + 16u,
// times 1/16 minus 72), one and-or + one f16x2 op per pair.
KQ_DEVICE void kq_dequant_f16x4(kq_u32 q, kq_u32* p) {
    const kq_u32 LO = 0x000f000fu, HI = 0x00f000f0u, EX = 0x64006400u;
    const kq_u32 SUB = 0x64086408u;  // {1032, 1032}
    const kq_u32 MUL = 0x2c002c00u;  // {1/16, 1/16}
    const kq_u32 ADD = 0xd480d480u;  // {-72, -72}
    p[0] = kq_hsub2(kq_and_or(q, LO, EX), SUB);       // (e0, e1): nibbles 0, 4
    p[1] = kq_hfma2(kq_and_or(q, HI, EX), MUL, ADD);  // (e2, e3): nibbles 1, 5
    q >>= 8;
    p[2] = kq_hsub2(kq_and_or(q, LO, EX), SUB);       // (e4, e5): nibbles 2, 6
    p[3] = kq_hfma2(kq_and_or(q, HI, EX), MUL, ADD);  // (e6, e7): nibbles 3, 7
}
// bf16 (7 mantissa bits: no 16u trick): one shift per pair, then kq_dequant_bf16x2.
KQ_DEVICE void kq_dequant_bf16x4(kq_u32 q, kq_u32* p) {
    p[0] = kq_dequant_bf16x2(q);
    p[1] = kq_dequant_bf16x2(q >> 4);
    p[2] = kq_dequant_bf16x2(q >> 8);
    p[3] = kq_dequant_bf16x2(q >> 12);
}
