// w4_gemv.cu — regime A (M <= 8) INT4 per-output-channel GEMV, W4A16 and W4A8.
// One source in CUDA spelling; compiled as HIP through kq_vendor.h (kernels/check.sh does both).
//
// Weight layout "kq-w4-gemv/1" (the Rust repacker src/gpu/layout.rs writes it):
//   qweight  u32 [N, Kp/8], Kp = K rounded up to 32, row-major, K-contiguous per output channel,
//            so every row is a whole number of 16-byte chunks (32 weights per 128-bit load);
//   nibbles  offset-binary u = q + 8 (0..15), order [0,2,4,6,1,3,5,7] inside each word (nibble i
//            of word j holds element 8j + ORDER[i]; Quark's "reorder"); padding nibbles are 8 (q=0);
//   scales   f32 [N, G]: G = 1 per channel, else G = ceil(K/group) with group % 32 == 0.
// Math (W4A16): y[m,n] = s[n] * sum_k q[n,k] * x[m,k]; q is made exact in f16 by the magic-number
// trick (Marlin), products and sums are f32. W4A8: y = s_w[n] * s_x[m] * (sum_k u*a - 8*sum_k a),
// exact int32 inside, one float epilogue.
// Split-K: gridDim.y splits; with more than one split each writes partials
// part[split][m][n] and kq_splitk_reduce sums them in split order (deterministic, no atomics).
#include "kq_vendor.h"
#include "kq_tune.h"

// Eight weights of one word -> f32 codes in element order (the [0,2,4,6,1,3,5,7] nibble order makes
// each (and|or) yield a half2 of two consecutive elements).
KQ_DEVICE void kq_dequant8(kq_u32 q, float* w) {
    kq_u32 p[4];
    kq_dequant_f16x4(q, p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[2 * i] = kq_h2_lo(p[i]);
        w[2 * i + 1] = kq_h2_hi(p[i]);
    }
}

template <bool BF16>
KQ_DEVICE float kq_act(kq_u16 h) {
    return BF16 ? kq_bf16_to_f32(h) : kq_f16_to_f32(h);
}

// Dot of 8 dequantized weights with 8 activations given as one 16-byte word.
template <bool BF16>
KQ_DEVICE float kq_dot8(const float* w, kq_u32x4 x) {
    kq_u32 v[4] = {x.x, x.y, x.z, x.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        s += w[2 * i] * kq_act<BF16>((kq_u16)(v[i] & 0xffffu));
        s += w[2 * i + 1] * kq_act<BF16>((kq_u16)(v[i] >> 16));
    }
    return s;
}

// One warp / wavefront per output channel (threadIdx.y), lanes stride over 32-weight chunks of
// this block's K split.
template <int M, bool BF16, bool GROUPED>
KQ_DEVICE void kq_w4a16_gemv(const kq_u32x4* __restrict__ qw, const float* __restrict__ scales,
                             const kq_u16* __restrict__ x, float* __restrict__ out, int N, int K,
                             int group, int chunks_per_split) {
    const int lane = threadIdx.x;
    const int n = blockIdx.x * blockDim.y + threadIdx.y;
    if (n >= N) return;  // uniform per warp: shuffles below stay full-warp
    const int kchunks = (K + 31) / 32;
    const int c0 = blockIdx.y * chunks_per_split;
    const int c1 = min(c0 + chunks_per_split, kchunks);
    const kq_u32x4* row = qw + (size_t)n * kchunks;
    const int G = GROUPED ? (K + group - 1) / group : 1;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;

    for (int c = c0 + lane; c < c1; c += KQ_WARP * KQ_GEMV_UNROLL) {
        kq_u32x4 q[KQ_GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < KQ_GEMV_UNROLL; ++u) {  // all weight loads first
            const int cc = c + u * KQ_WARP;
            if (cc < c1) q[u] = row[cc];
        }
#pragma unroll
        for (int u = 0; u < KQ_GEMV_UNROLL; ++u) {
            const int cc = c + u * KQ_WARP;
            if (cc >= c1) break;
            const kq_u32 words[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
            float part[M];
#pragma unroll
            for (int m = 0; m < M; ++m) part[m] = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int k = cc * 32 + 8 * j;
                if (k >= K) break;  // K % 8 == 0 (launcher checks); tail chunk
                float w[8];
                kq_dequant8(words[j], w);
#pragma unroll
                for (int m = 0; m < M; ++m)
                    part[m] += kq_dot8<BF16>(w, *(const kq_u32x4*)(x + (size_t)m * K + k));
            }
            const float s = GROUPED ? scales[(size_t)n * G + (cc * 32) / group] : 1.f;
#pragma unroll
            for (int m = 0; m < M; ++m) acc[m] += GROUPED ? part[m] * s : part[m];
        }
    }
    const float s = GROUPED ? 1.f : scales[n];
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const float v = kq_warp_sum(acc[m]) * s;
        if (lane == 0) out[((size_t)blockIdx.y * M + m) * N + n] = v;
    }
}

// W4A8: activations int8, per token, already in the kernel's permuted order (kq_quant_act_i8):
// within each 8 elements the bytes are [a0,a4,a1,a5 | a2,a6,a3,a7], matching the bytes that
// (w & 0x0F0F0F0F) and ((w >> 4) & 0x0F0F0F0F) give for the reorder nibble order.
template <int M>
KQ_DEVICE void kq_w4a8_gemv(const kq_u32x4* __restrict__ qw, const float* __restrict__ wscale,
                            const kq_u32x4* __restrict__ xq, const float* __restrict__ xscale,
                            const int* __restrict__ xsum, float* __restrict__ out, int N, int K,
                            int chunks_per_split) {
    const int lane = threadIdx.x;
    const int n = blockIdx.x * blockDim.y + threadIdx.y;
    if (n >= N) return;
    const int kchunks = (K + 31) / 32;  // xq rows are kchunks * 32 bytes, zero padded
    const int c0 = blockIdx.y * chunks_per_split;
    const int c1 = min(c0 + chunks_per_split, kchunks);
    const kq_u32x4* row = qw + (size_t)n * kchunks;
    int acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0;
    for (int c = c0 + lane; c < c1; c += KQ_WARP) {
        const kq_u32x4 q = row[c];
        const kq_u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const kq_u32x4 a0 = xq[((size_t)m * kchunks + c) * 2];
            const kq_u32x4 a1 = xq[((size_t)m * kchunks + c) * 2 + 1];
            const kq_u32 a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc[m] = kq_dp4a((int)(words[j] & 0x0f0f0f0fu), (int)a[2 * j], acc[m]);
                acc[m] = kq_dp4a((int)((words[j] >> 4) & 0x0f0f0f0fu), (int)a[2 * j + 1], acc[m]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
        int t = kq_warp_sum_i(acc[m]);
        if (blockIdx.y == 0) t -= 8 * xsum[m];  // offset-binary correction, once per (m, n)
        if (lane == 0) out[((size_t)blockIdx.y * M + m) * N + n] = (float)t * wscale[n] * xscale[m];
    }
}

// Per-token dynamic int8 quantization (one block per token, blockDim.x = 256):
// s = absmax / 127 (1 for an all-zero row), a = clamp(rint(x / s), -127, 127) (min(127, v) spelled
// -max(-127, -v): fmaxf only), written in the
// permuted order above, zero padded to Kp = ceil(K/32)*32; xsum = sum of a (for the epilogue).
template <bool BF16>
KQ_DEVICE void kq_quant_act_i8(const kq_u16* __restrict__ x, signed char* __restrict__ xq,
                               float* __restrict__ xscale, int* __restrict__ xsum, int K) {
    __shared__ float red_f[1024 / 32];
    __shared__ int red_i[1024 / 32];
    const int m = blockIdx.x, t = threadIdx.x, nw = blockDim.x / KQ_WARP;
    const int Kp = (K + 31) / 32 * 32;
    const kq_u16* xr = x + (size_t)m * K;
    float amax = 0.f;
    for (int k = t; k < K; k += blockDim.x) amax = kq_fmax(amax, kq_fabs(kq_act<BF16>(xr[k])));
    amax = kq_warp_max(amax);
    if (t % KQ_WARP == 0) red_f[t / KQ_WARP] = amax;
    __syncthreads();
    amax = 0.f;
    for (int i = 0; i < nw; ++i) amax = kq_fmax(amax, red_f[i]);
    const float s = amax > 0.f ? amax / 127.f : 1.f;
    int sum = 0;
    for (int k = t; k < Kp; k += blockDim.x) {
        int a = 0;
        if (k < K) a = (int)-kq_fmax(-127.f, -kq_fmax(-127.f, kq_rint(kq_act<BF16>(xr[k]) / s)));
        sum += a;
        const int slot = (k & 7) < 4 ? 2 * (k & 7) : 2 * (k & 7) - 7;  // [0,2,4,6,1,3,5,7]
        xq[(size_t)m * Kp + (k & ~7) + slot] = (signed char)a;
    }
    sum = kq_warp_sum_i(sum);
    if (t % KQ_WARP == 0) red_i[t / KQ_WARP] = sum;
    __syncthreads();
    if (t == 0) {
        int total = 0;
        for (int i = 0; i < nw; ++i) total += red_i[i];
        xsum[m] = total;
        xscale[m] = s;
    }
}

// ------------------------------------------------------------------------ extern "C" entry points
// Names: kq_w4a16_gemv_{bf16,f16}_{pc,g}_m{1..8}, kq_w4a8_gemv_m{1..8}, kq_quant_act_i8_{bf16,f16},
// kq_splitk_reduce. Launch: block (KQ_WARP, rows), grid (ceil(N/rows), splits); see src/gpu/tune.rs.
#define KQ_W4A16(M, T, BF, G, GR)                                                                 \
    extern "C" __global__ void kq_w4a16_gemv_##T##_##G##_m##M(                                      \
        const kq_u32x4* qw, const float* scales, const kq_u16* x, float* out, int N, int K,        \
        int group, int chunks_per_split) {                                                        \
        kq_w4a16_gemv<M, BF, GR>(qw, scales, x, out, N, K, group, chunks_per_split);              \
    }
#define KQ_W4A8(M)                                                                                \
    extern "C" __global__ void kq_w4a8_gemv_m##M(const kq_u32x4* qw, const float* wscale,          \
                                                 const kq_u32x4* xq, const float* xscale,         \
                                                 const int* xsum, float* out, int N, int K,       \
                                                 int chunks_per_split) {                          \
        kq_w4a8_gemv<M>(qw, wscale, xq, xscale, xsum, out, N, K, chunks_per_split);              \
    }
#define KQ_ALL_M(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)
#define KQ_BF16_PC(M) KQ_W4A16(M, bf16, true, pc, false)
#define KQ_BF16_G(M) KQ_W4A16(M, bf16, true, g, true)
#define KQ_F16_PC(M) KQ_W4A16(M, f16, false, pc, false)
#define KQ_F16_G(M) KQ_W4A16(M, f16, false, g, true)
KQ_ALL_M(KQ_BF16_PC)
KQ_ALL_M(KQ_BF16_G)
KQ_ALL_M(KQ_F16_PC)
KQ_ALL_M(KQ_F16_G)
KQ_ALL_M(KQ_W4A8)

extern "C" __global__ void kq_quant_act_i8_bf16(const kq_u16* x, signed char* xq, float* xscale,
                                                int* xsum, int K) {
    kq_quant_act_i8<true>(x, xq, xscale, xsum, K);
}
extern "C" __global__ void kq_quant_act_i8_f16(const kq_u16* x, signed char* xq, float* xscale,
                                               int* xsum, int K) {
    kq_quant_act_i8<false>(x, xq, xscale, xsum, K);
}

// out[i] = sum over splits of part[split][i], in split order (deterministic).
extern "C" __global__ void kq_splitk_reduce(const float* part, float* out, int mn, int splits) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= mn) return;
    float s = 0.f;
    for (int p = 0; p < splits; ++p) s += part[(size_t)p * mn + i];
    out[i] = s;
}
