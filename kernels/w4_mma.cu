// w4_mma.cu — regime B (M ≈ 9..128) INT4 GEMM on tensor cores (NVIDIA mma.sync) / matrix cores
// (AMD MFMA): W4A16 per channel and per group, W4A8 (int8 activations, exact int32) per channel.
// Same weights as regime A (layout kq-w4-gemv/1, see w4_gemv.cu): one device copy serves A, B, C.
//
// "Swap AB": each warp / wavefront computes D[16 output channels x T tokens] += W[16 x k] . X^T,
// so the weights fill the atom's 16-row A operand and M is padded only to T = KQ_MMA_TOK (8 on
// NVIDIA m16n8k*, 16 on AMD 16x16x*). The k order inside one 128-weight k-tile is permuted: the
// sum over k does not care as long as A and B use the same order. Lane quad q = kq_mma_quad(lane)
// owns the tile's 32-weight chunk q (one 128-bit load per weight row it holds), and atom step s
// (k16 for f16/bf16, 0..7; k32 for int8, 0..3) takes from every lane the 4 (8) consecutive weights
// at chunk offset 4s (8s). Under the documented fragment ownership (kq_vendor.h) this makes
//   NVIDIA m16n8k16: a0a1 = row g pair (4s, 4s+1), a4a5 = row g pair (4s+2, 4s+3), a2a3/a6a7 the
//                    same for row g+8, b0b1/b2b3 = token g, same k: exactly the f16x2 / bf16x2
//                    pairs the magic-number dequant produces, and 16-byte activation loads;
//   AMD 16x16x16:    items 0..3 = row lane%16 (token lane%16 for B) at chunk offset 4s..4s+3;
//   int8 (both):     the lane's k items are (w & 0x0f0f0f0f, (w >> 4) & 0x0f0f0f0f) of word s,
//                    with the activations in kq_quant_act_i8's permuted byte order (regime A's).
// src/gpu/emu_mma.rs replays this lane by lane on the CPU over the documented fragment maps.
//
// Groups (W4A16, group % 32 == 0): one 128-k tile may span several groups (group 32/64/96), but a
// chunk never does. For each group g in the tile, the lanes whose chunk is outside g feed zeros,
// the atoms accumulate into a temporary, and the temporary is scaled by s[row, g] (group >= 128
// and a multiple of 128: one pass per tile, no extra MMAs).
//
// Grid (ceil(N / (16 * warps)), splits, ceil(M / (8 * MT))), block (KQ_WARP, warps). Split-K over
// k-tiles; every split writes partials part[split][m][n] (f32 for W4A16, summed by
// kq_splitk_reduce; int32 for W4A8, summed exactly by kq_w4a8_reduce with the -8*sum(a)
// correction and both scales). Tails: tokens >= M, rows >= N and k >= K contribute zeros and are
// not stored. Preconditions (launcher): K % 8 == 0 (16-byte activation loads).
#include "kq_vendor.h"
#include "kq_tune.h"

KQ_DEVICE kq_u32 kq_word(const kq_u32x4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// One pass over one k-tile for W4A16: four weight words per slot, each feeding two atom steps.
// `use` false feeds zero weights (a chunk outside the current group); x rows are read straight
// from global memory (L1/L2-resident: every warp of the block reads the same tokens).
template <int NT, bool BF16>
KQ_DEVICE void kq_mma_tile_a16(float (*acc)[4], const kq_u32x4* w, bool use,
                               const kq_u16* __restrict__ x, int m_tile0, unsigned tok_ok,
                               int k0, int K) {
    const int lane = threadIdx.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        kq_u32 p[KQ_MMA_SLOTS][4];
#pragma unroll
        for (int s = 0; s < KQ_MMA_SLOTS; ++s) {
            if (use) {
                if (BF16) kq_dequant_bf16x4(kq_word(w[s], j), p[s]);
                else kq_dequant_f16x4(kq_word(w[s], j), p[s]);
            } else {
                p[s][0] = p[s][1] = p[s][2] = p[s][3] = 0u;
            }
        }
        kq_u32 lo0[KQ_MMA_SLOTS], hi0[KQ_MMA_SLOTS], lo1[KQ_MMA_SLOTS], hi1[KQ_MMA_SLOTS];
#pragma unroll
        for (int s = 0; s < KQ_MMA_SLOTS; ++s) {
            lo0[s] = p[s][0];  // step 2j:   chunk k 8j+0, 8j+1
            hi0[s] = p[s][1];  //            chunk k 8j+2, 8j+3
            lo1[s] = p[s][2];  // step 2j+1: chunk k 8j+4, 8j+5
            hi1[s] = p[s][3];  //            chunk k 8j+6, 8j+7
        }
        const int k = k0 + 8 * j;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            kq_u32x4 xv = {0u, 0u, 0u, 0u};
            const int tok = m_tile0 + nt * KQ_MMA_TOK + kq_mma_btok(lane);
            if (((tok_ok >> nt) & 1u) && k < K) xv = *(const kq_u32x4*)(x + (size_t)tok * K + k);
            if (BF16) {
                kq_mma_bf16(acc[nt], lo0, hi0, xv.x, xv.y);
                kq_mma_bf16(acc[nt], lo1, hi1, xv.z, xv.w);
            } else {
                kq_mma_f16(acc[nt], lo0, hi0, xv.x, xv.y);
                kq_mma_f16(acc[nt], lo1, hi1, xv.z, xv.w);
            }
        }
    }
}

// MT: 8-token groups per block along M (block covers 8*MT tokens; NT = atoms along tokens).
template <int MT, bool BF16, bool GROUPED>
KQ_DEVICE void kq_w4a16_mma(const kq_u32x4* __restrict__ qw, const float* __restrict__ scales,
                            const kq_u16* __restrict__ x, float* __restrict__ out, int M, int N,
                            int K, int group, int tiles_per_split) {
    constexpr int NT = MT * 8 / KQ_MMA_TOK;
    const int lane = threadIdx.x;
    const int n0 = (blockIdx.x * blockDim.y + threadIdx.y) * 16;
    if (n0 >= N) return;  // uniform per warp; no block-level synchronisation below
    const int m_tile0 = blockIdx.z * MT * 8;
    const int kchunks = (K + 31) / 32, ktiles = (kchunks + 3) / 4;
    const int t0 = blockIdx.y * tiles_per_split;
    const int t1 = min(t0 + tiles_per_split, ktiles);
    const int quad = kq_mma_quad(lane);
    const int G = GROUPED ? (K + group - 1) / group : 1;
    unsigned tok_ok = 0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        if (m_tile0 + nt * KQ_MMA_TOK + kq_mma_btok(lane) < M) tok_ok |= 1u << nt;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;

    for (int kt = t0; kt < t1; kt += KQ_MMA_UNROLL) {
        kq_u32x4 w[KQ_MMA_UNROLL][KQ_MMA_SLOTS];
#pragma unroll
        for (int u = 0; u < KQ_MMA_UNROLL; ++u) {  // all weight loads first
            const int c = (kt + u) * 4 + quad;
#pragma unroll
            for (int s = 0; s < KQ_MMA_SLOTS; ++s) {
                const int row = n0 + kq_mma_row(lane, s);
                const kq_u32 pad = 0x88888888u;  // code 0
                w[u][s] = kq_u32x4{pad, pad, pad, pad};
                if (kt + u < t1 && c < kchunks && row < N) w[u][s] = qw[(size_t)row * kchunks + c];
            }
        }
#pragma unroll
        for (int u = 0; u < KQ_MMA_UNROLL; ++u) {
            const int tile = kt + u;
            if (tile >= t1) break;
            const int k0 = tile * 128 + quad * 32;
            if (!GROUPED) {
                kq_mma_tile_a16<NT, BF16>(acc, w[u], true, x, m_tile0, tok_ok, k0, K);
            } else {
                const int g0 = tile * 128 / group;
                const int g1 = (min(tile * 128 + 128, K) - 1) / group;
                const int gme = k0 / group;  // a chunk lies in one group (group % 32 == 0)
                for (int g = g0; g <= g1; ++g) {
                    float tmp[NT][4];
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) tmp[nt][0] = tmp[nt][1] = tmp[nt][2] = tmp[nt][3] = 0.f;
                    kq_mma_tile_a16<NT, BF16>(tmp, w[u], gme == g, x, m_tile0, tok_ok, k0, K);
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int row = n0 + kq_mma_drow(lane, i);
                        const float s = row < N ? scales[(size_t)row * G + g] : 0.f;
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) acc[nt][i] += tmp[nt][i] * s;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = n0 + kq_mma_drow(lane, i);
        if (row >= N) continue;
        const float s = GROUPED ? 1.f : scales[row];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int tok = m_tile0 + nt * KQ_MMA_TOK + kq_mma_dtok(lane, i);
            if (tok < M) out[((size_t)blockIdx.y * M + tok) * N + row] = acc[nt][i] * s;
        }
    }
}

// W4A8: xq rows of Kp = ceil(K/32)*32 int8 in kq_quant_act_i8's order (zero padded). Partials are
// the raw offset-binary sums sum(u*a) per split, int32 (|u*a| <= 15*127, K <= 2^20 fits).
template <int MT>
KQ_DEVICE void kq_w4a8_mma(const kq_u32x4* __restrict__ qw, const signed char* __restrict__ xq,
                           int* __restrict__ part, int M, int N, int K, int tiles_per_split) {
    constexpr int NT = MT * 8 / KQ_MMA_TOK;
    const int lane = threadIdx.x;
    const int n0 = (blockIdx.x * blockDim.y + threadIdx.y) * 16;
    if (n0 >= N) return;
    const int m_tile0 = blockIdx.z * MT * 8;
    const int kchunks = (K + 31) / 32, ktiles = (kchunks + 3) / 4, Kp = kchunks * 32;
    const int t0 = blockIdx.y * tiles_per_split;
    const int t1 = min(t0 + tiles_per_split, ktiles);
    const int quad = kq_mma_quad(lane);
    unsigned tok_ok = 0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        if (m_tile0 + nt * KQ_MMA_TOK + kq_mma_btok(lane) < M) tok_ok |= 1u << nt;
    int acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;

    for (int kt = t0; kt < t1; kt += KQ_MMA_UNROLL) {
        kq_u32x4 w[KQ_MMA_UNROLL][KQ_MMA_SLOTS];
#pragma unroll
        for (int u = 0; u < KQ_MMA_UNROLL; ++u) {
            const int c = (kt + u) * 4 + quad;
#pragma unroll
            for (int s = 0; s < KQ_MMA_SLOTS; ++s) {
                const int row = n0 + kq_mma_row(lane, s);
                w[u][s] = kq_u32x4{0u, 0u, 0u, 0u};
                if (kt + u < t1 && c < kchunks && row < N) w[u][s] = qw[(size_t)row * kchunks + c];
            }
        }
#pragma unroll
        for (int u = 0; u < KQ_MMA_UNROLL; ++u) {
            const int tile = kt + u;
            if (tile >= t1) break;
            const int c = tile * 4 + quad;
            const int kb = tile * 128 + quad * 32;  // byte offset in the permuted row
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
                kq_u32 lo[2][KQ_MMA_SLOTS], hi[2][KQ_MMA_SLOTS];
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int s = 0; s < KQ_MMA_SLOTS; ++s) {
                        const kq_u32 q = kq_word(w[u][s], 2 * jj + h);
                        lo[h][s] = q & 0x0f0f0f0fu;          // u of elements 0, 4, 1, 5
                        hi[h][s] = (q >> 4) & 0x0f0f0f0fu;   // u of elements 2, 6, 3, 7
                    }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    kq_u32x4 xv = {0u, 0u, 0u, 0u};
                    const int tok = m_tile0 + nt * KQ_MMA_TOK + kq_mma_btok(lane);
                    if (((tok_ok >> nt) & 1u) && c < kchunks)
                        xv = *(const kq_u32x4*)(xq + (size_t)tok * Kp + kb + 16 * jj);
                    kq_mma_i8(acc[nt], lo[0], hi[0], xv.x, xv.y);  // word 2jj:   bytes 0..7
                    kq_mma_i8(acc[nt], lo[1], hi[1], xv.z, xv.w);  // word 2jj+1: bytes 8..15
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = n0 + kq_mma_drow(lane, i);
        if (row >= N) continue;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int tok = m_tile0 + nt * KQ_MMA_TOK + kq_mma_dtok(lane, i);
            if (tok < M) part[((size_t)blockIdx.y * M + tok) * N + row] = acc[nt][i];
        }
    }
}

// ------------------------------------------------------------------------ extern "C" entry points
// Names: kq_w4a16_mma_{bf16,f16}_pc_m{16,32,64,128} and _g_m{16,32,64} (tokens per block; the
// grouped kernels hold a second accumulator set, so they stop at 64 tokens and larger M takes
// several blocks along grid.z), kq_w4a8_mma_m{16,32,64,128}, kq_w4a8_reduce. Launch geometry:
// src/gpu/tune.rs (`mma`).
#define KQ_MMA16(TOKS, T, BF, G, GR)                                                               \
    extern "C" __global__ void kq_w4a16_mma_##T##_##G##_m##TOKS(                                   \
        const kq_u32x4* qw, const float* scales, const kq_u16* x, float* out, int M, int N, int K, \
        int group, int tiles_per_split) {                                                         \
        kq_w4a16_mma<TOKS / 8, BF, GR>(qw, scales, x, out, M, N, K, group, tiles_per_split);      \
    }
#define KQ_MMA8(TOKS)                                                                             \
    extern "C" __global__ void kq_w4a8_mma_m##TOKS(const kq_u32x4* qw, const signed char* xq,     \
                                                   int* part, int M, int N, int K,               \
                                                   int tiles_per_split) {                        \
        kq_w4a8_mma<TOKS / 8>(qw, xq, part, M, N, K, tiles_per_split);                           \
    }
#define KQ_MMA_ALL_M(X) X(16) X(32) X(64) X(128)
#define KQ_MMA_G_M(X) X(16) X(32) X(64)
#define KQ_MMA_BF16_PC(T) KQ_MMA16(T, bf16, true, pc, false)
#define KQ_MMA_BF16_G(T) KQ_MMA16(T, bf16, true, g, true)
#define KQ_MMA_F16_PC(T) KQ_MMA16(T, f16, false, pc, false)
#define KQ_MMA_F16_G(T) KQ_MMA16(T, f16, false, g, true)
KQ_MMA_ALL_M(KQ_MMA_BF16_PC)
KQ_MMA_G_M(KQ_MMA_BF16_G)
KQ_MMA_ALL_M(KQ_MMA_F16_PC)
KQ_MMA_G_M(KQ_MMA_F16_G)
KQ_MMA_ALL_M(KQ_MMA8)

// out[m][n] = (float)(sum over splits of part[split][m][n] - 8 * xsum[m]) * ws[n] * xs[m]: the int
// sum is exact, so this equals gpu::reference::w4a8_ref bit for bit.
extern "C" __global__ void kq_w4a8_reduce(const int* part, const float* ws, const float* xs,
                                          const int* xsum, float* out, int M, int N, int splits) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    const int m = i / N, n = i % N;
    int t = 0;
    for (int p = 0; p < splits; ++p) t += part[(size_t)p * M * N + i];
    t -= 8 * xsum[m];
    out[i] = (float)t * ws[n] * xs[m];
}
