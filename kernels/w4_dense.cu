// w4_dense.cu — regime C (M > 128): dequantize kq-w4-gemv/1 weights to a dense [N, K] bf16 / f16
// matrix for the vendor GEMM (cuBLAS / hipBLAS GemmEx, f32 output), plus the per-channel epilogue.
//
// Per channel the dense matrix holds the exact codes q (integers in [-8, 7] are exact in both
// dtypes) and the scale is applied to the f32 GEMM output by kq_scale_cols: numerically the same
// sums as the reference (dequantize + f32 GEMM), bound W4A16_REL_L1_TOL. Per group the scale
// varies along K and cannot follow the GEMM: the dense weight is q * s rounded to nearest even in
// the activation dtype (what vLLM's ROCm dequant + rocBLAS path does), bound
// W4A16_DENSE_GROUP_REL_TOL_{BF16,F16} (the dtype's unit roundoff on top).
// One thread per 32-weight chunk (one 128-bit load, four 16-byte stores); K % 8 == 0.
#include "kq_vendor.h"
#include "kq_tune.h"

template <bool BF16, bool GROUPED>
KQ_DEVICE void kq_w4_dequant(const kq_u32x4* __restrict__ qw, const float* __restrict__ scales,
                             kq_u16* __restrict__ w, int N, int K, int group) {
    const int kchunks = (K + 31) / 32;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * kchunks) return;
    const int n = (int)(idx / kchunks), c = (int)(idx % kchunks);
    const kq_u32x4 q = qw[idx];
    const kq_u32 words[4] = {q.x, q.y, q.z, q.w};
    const float s = GROUPED ? scales[(size_t)n * ((K + group - 1) / group) + (c * 32) / group] : 1.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int k = c * 32 + 8 * j;
        if (k >= K) break;
        kq_u32 p[4];
        if (GROUPED || !BF16) kq_dequant_f16x4(words[j], p);  // exact codes as f16 pairs
        else kq_dequant_bf16x4(words[j], p);
        if (GROUPED) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float lo = kq_h2_lo(p[i]) * s, hi = kq_h2_hi(p[i]) * s;
                p[i] = BF16 ? (kq_u32)kq_f32_to_bf16(lo) | ((kq_u32)kq_f32_to_bf16(hi) << 16)
                            : (kq_u32)kq_f32_to_f16(lo) | ((kq_u32)kq_f32_to_f16(hi) << 16);
            }
        }
        *(kq_u32x4*)(w + (size_t)n * K + k) = kq_u32x4{p[0], p[1], p[2], p[3]};
    }
}

#define KQ_DENSE(T, BF, G, GR)                                                                     \
    extern "C" __global__ void kq_w4_dequant_##T##_##G(const kq_u32x4* qw, const float* scales,    \
                                                       kq_u16* w, int N, int K, int group) {       \
        kq_w4_dequant<BF, GR>(qw, scales, w, N, K, group);                                         \
    }
KQ_DENSE(bf16, true, pc, false)
KQ_DENSE(bf16, true, g, true)
KQ_DENSE(f16, false, pc, false)
KQ_DENSE(f16, false, g, true)

// y[m][n] *= s[n] (the per-channel scale after the GEMM of exact codes).
extern "C" __global__ void kq_scale_cols(float* y, const float* s, int M, int N) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * N) return;
    y[i] *= s[i % N];
}
