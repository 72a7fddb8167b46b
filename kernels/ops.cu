// ops.cu — the kernels of a draft step that stays on the device (docs/kernels.md, "The replay on
// the device"): besides the linears (regimes A/B/C, the vendor GEMM) and the row argmax, the
// embedding gather, RMSNorm, rotary embedding, attention over a replay's keys, SwiGLU, residual
// adds, rounding to the activation dtype and row gathers. All f32 in and out, but the embedding
// table (bf16 / f16 / f32) and kq_to_act's output (bf16 / f16 bits).
//
// Each has a CPU replay beside its op in src/gpu/ops/, run by the emulation launch for launch, with the
// reductions in the order written here (per-thread strided partial sums, then the shared-memory
// tree or the warp butterfly), and a plain reference it is tested against in
// src/runtime/eagle3/device.rs (the f32 runtime's own functions).
//
// Element-wise kernels: one thread per output, blockDim.x = KQ_OPS_THREADS. Row kernels
// (kq_rms_norm): one block of KQ_OPS_THREADS per row. kq_attend: one warp per (query row, head).
// Lengths are int; the host checks every buffer's size and every index against its bound first.
#include "kq_vendor.h"

#define KQ_OPS_THREADS 256
// Value dims one lane of kq_attend accumulates: v_dim <= KQ_ATT_VPL * KQ_WARP.
#define KQ_ATT_VPL 8

KQ_DEVICE float kq_f32_id(float f) { return f; }

// out[r, j] = table[ids[r], j] as f32, for r < n, j < h (ids checked < vocab by the host).
#define KQ_EMBED(T, TY, CONV)                                                                  \
    extern "C" __global__ void __launch_bounds__(KQ_OPS_THREADS) kq_embed_rows_##T(            \
        const TY* __restrict__ table, const int* __restrict__ ids, float* __restrict__ out,    \
        int n, int h) {                                                                        \
        const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;                  \
        if (i >= (long long)n * h) return;                                                     \
        const long long r = i / h, j = i % h;                                                  \
        out[i] = CONV(table[(long long)ids[r] * h + j]);                                       \
    }
KQ_EMBED(bf16, kq_u16, kq_bf16_to_f32)
KQ_EMBED(f16, kq_u16, kq_f16_to_f32)
KQ_EMBED(f32, float, kq_f32_id)

// out[r·out_ld + out_off + j] = x[r·in_ld + in_off + j] · inv_r · w[j], j < h, with
// inv_r = 1 / sqrt(Σ_j x² / h + eps) (eps as its f32 bits). In place when x == out (each thread
// rewrites only what it read). One block per row.
extern "C" __global__ void __launch_bounds__(KQ_OPS_THREADS)
    kq_rms_norm(const float* x, const float* __restrict__ w, float* out, int n, int h, int in_ld,
                int in_off, int out_ld, int out_off, int eps_bits) {
    __shared__ float s[KQ_OPS_THREADS];
    const int r = blockIdx.x, t = threadIdx.x;
    if (r >= n) return;  // uniform over the block
    const float* xr = x + (long long)r * in_ld + in_off;
    float acc = 0.f;
    for (int j = t; j < h; j += KQ_OPS_THREADS) acc += xr[j] * xr[j];
    s[t] = acc;
    __syncthreads();
    for (int half = KQ_OPS_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) s[t] += s[t + half];
        __syncthreads();
    }
    const float inv = 1.f / kq_sqrtf(s[0] / (float)h + kq_as_float((kq_u32)eps_bits));
    float* o = out + (long long)r * out_ld + out_off;
    for (int j = t; j < h; j += KQ_OPS_THREADS) o[j] = xr[j] * inv * w[j];
}

// Rotary embedding in place: row r's `heads` heads at x[r·ld + off + h·head_ld ...], each 2·half
// values rotated by position pos[r] from the host's table cs[p][i] = (cos, sin) (attention factor
// applied): pairs (i, i + half) in the rotate_half (NeoX) form, (2i, 2i + 1) in the interleaved
// (DeepSeek) form; a' = a·c − b·s, b' = b·c + a·s.
extern "C" __global__ void __launch_bounds__(KQ_OPS_THREADS)
    kq_rope(float* x, const int* __restrict__ pos, const float* __restrict__ cs, int n,
            int heads, int half, int ld, int off, int head_ld, int interleaved) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * heads * half) return;
    const int j = (int)(i % half);
    const long long hh = (i / half) % heads, r = i / ((long long)half * heads);
    float* hp = x + r * ld + off + hh * head_ld;
    const int ia = interleaved ? 2 * j : j, ib = interleaved ? 2 * j + 1 : j + half;
    const float* t = cs + ((long long)pos[r] * half + j) * 2;
    const float c = t[0], s = t[1], a = hp[ia], b = hp[ib];
    hp[ia] = a * c - b * s;
    hp[ib] = b * c + a * s;
}

// Strided copy of `heads` column blocks of w values per row: dst[r·dst_ld + dst_off + h·dst_hs + j]
// = src[r·src_ld + src_off + h·src_hs + j], r < n, h < heads, j < w (src_hs = 0 broadcasts one
// block to every head: MLA's shared k_rope).
extern "C" __global__ void __launch_bounds__(KQ_OPS_THREADS)
    kq_copy_cols(const float* __restrict__ src, float* __restrict__ dst, int n, int heads, int w,
                 int src_ld, int src_off, int src_hs, int dst_ld, int dst_off, int dst_hs) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * heads * w) return;
    const long long j = i % w, h = (i / w) % heads, r = i / ((long long)w * heads);
    dst[r * dst_ld + dst_off + h * dst_hs + j] = src[r * src_ld + src_off + h * src_hs + j];
}

// Attention of query row r (`rows[r]` = i, its pair t = start + i) and head `blockIdx.x` over the
// replay's keys in order: depth 0's keys 0..=t (k0, v0: [*, kv_heads·dq], [*, kv_heads·dv]),
// then one diagonal key per earlier depth e < diag (kd, vd: [diag, n, kv_heads·dq|dv], row
// slots[e·n + i]). Query head h reads key/value head h / (heads / kv_heads). One warp per
// (row, head), grid (m, heads) (rows on x: no 65535 limit): the lanes split q·k (lane l takes l, l + KQ_WARP, …; butterfly sum, the same in
// every lane), then an online softmax, each lane owning value dims l, l + KQ_WARP, ….
// out[r, h, :] = Σ_e softmax(scale · q·k_e) v_e. scale as its f32 bits.
extern "C" __global__ void __launch_bounds__(KQ_WARP)
    kq_attend(const float* __restrict__ q, const float* __restrict__ k0,
              const float* __restrict__ v0, const float* __restrict__ kd,
              const float* __restrict__ vd, const int* __restrict__ rows,
              const int* __restrict__ slots, float* __restrict__ out, int m, int n, int start,
              int diag, int heads, int kv_heads, int dq, int dv, int scale_bits) {
    const int r = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
    if (r >= m || head >= heads) return;
    const int i = rows[r], t = start + i, kvh = head / (heads / kv_heads);
    const long long kw = (long long)kv_heads * dq, vw = (long long)kv_heads * dv;
    const float* qh = q + ((long long)r * heads + head) * dq;
    const float scale = kq_as_float((kq_u32)scale_bits);
    float mx = -kq_as_float(0x7f800000u), l = 0.f, acc[KQ_ATT_VPL];
#pragma unroll
    for (int c = 0; c < KQ_ATT_VPL; ++c) acc[c] = 0.f;
    for (int e = 0; e <= t + diag; ++e) {
        const float *kr, *vr;
        if (e <= t) {
            kr = k0 + e * kw;
            vr = v0 + e * vw;
        } else {
            const long long d = e - t - 1, s = slots[d * n + i];
            kr = kd + (d * n + s) * kw;
            vr = vd + (d * n + s) * vw;
        }
        kr += (long long)kvh * dq;
        vr += (long long)kvh * dv;
        float p = 0.f;
        for (int j = lane; j < dq; j += KQ_WARP) p += qh[j] * kr[j];
        for (int o = KQ_WARP / 2; o > 0; o >>= 1) p += kq_shfl_xor(p, o);
        const float sc = p * scale, mn = kq_fmax(mx, sc);
        const float corr = kq_expf(mx - mn), pe = kq_expf(sc - mn);
        l = l * corr + pe;
#pragma unroll
        for (int c = 0; c < KQ_ATT_VPL; ++c) {
            const int j = lane + c * KQ_WARP;
            if (j < dv) acc[c] = acc[c] * corr + pe * vr[j];
        }
        mx = mn;
    }
    float* o = out + ((long long)r * heads + head) * dv;
#pragma unroll
    for (int c = 0; c < KQ_ATT_VPL; ++c) {
        const int j = lane + c * KQ_WARP;
        if (j < dv) o[j] = acc[c] / l;
    }
}

// out[i] = silu(g[i]) · u[i] = g / (1 + e^−g) · u.
extern "C" __global__ void __launch_bounds__(KQ_OPS_THREADS)
    kq_silu_mul(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out,
                int len) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    const float a = g[i];
    out[i] = a / (1.f + kq_expf(-a)) * u[i];
}

// out[i] = a[i] + b[i] (out may be a or b).
extern "C" __global__ void __launch_bounds__(KQ_OPS_THREADS)
    kq_add(const float* a, const float* b, float* out, int len) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    out[i] = a[i] + b[i];
}

// y[i] = x[i] rounded to bf16 / f16 (nearest even): a linear's input.
#define KQ_TO_ACT(T, CONV)                                                                     \
    extern "C" __global__ void __launch_bounds__(KQ_OPS_THREADS)                               \
        kq_to_act_##T(const float* __restrict__ x, kq_u16* __restrict__ y, int len) {          \
        const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;                  \
        if (i >= len) return;                                                                  \
        y[i] = CONV(x[i]);                                                                     \
    }
KQ_TO_ACT(bf16, kq_f32_to_bf16)
KQ_TO_ACT(f16, kq_f32_to_f16)

// dst[dst_off + r·w + j] = src[idx[r]·w + j], r < m, j < w (idx checked by the host).
extern "C" __global__ void __launch_bounds__(KQ_OPS_THREADS)
    kq_gather_rows(const float* __restrict__ src, const int* __restrict__ idx,
                   float* __restrict__ dst, int m, int w, int dst_off) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)m * w) return;
    const long long r = i / w, j = i % w;
    dst[dst_off + i] = src[(long long)idx[r] * w + j];
}
