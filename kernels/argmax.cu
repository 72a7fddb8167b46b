// argmax.cu — each row's index of its largest value in an [M, N] f32 matrix (an lm_head's logits
// straight out of the vendor GEMM), so that a replay copies back M indices instead of M·N logits.
//
// The order is total, so the result is exact and independent of the reduction order: a NaN is
// above every number (the first NaN of the row wins, as torch.argmax), then the larger value, then
// the smaller index on ties (-0.0 == +0.0 ties; -inf is an ordinary value). Comparisons are
// plain IEEE (no flush-to-zero in the default NVRTC / hipRTC options), so subnormals order as on
// the CPU. src/gpu/reference.rs `argmax_ref` is this order in Rust; the CPU replay
// (src/gpu/emu.rs) runs the same per-thread scan and tree reduction.
//
// One block of KQ_ARGMAX_THREADS threads per row (gridDim.x = M): thread t scans columns
// t, t + blockDim.x, ... (coalesced), then a tree reduction in shared memory. blockDim.x must be
// KQ_ARGMAX_THREADS (a power of two); N >= 1 (an index of -1 would mean an empty row).
#include "kq_vendor.h"

#define KQ_ARGMAX_THREADS 256

// Whether (vb, ib) comes before (va, ia) in the order above; ia < 0 is "nothing yet".
KQ_DEVICE bool kq_argmax_before(float va, int ia, float vb, int ib) {
    if (ib < 0) return false;
    if (ia < 0) return true;
    const bool na = va != va, nb = vb != vb;
    if (na || nb) return nb && (!na || ib < ia);
    return vb > va || (vb == va && ib < ia);
}

extern "C" __global__ void __launch_bounds__(KQ_ARGMAX_THREADS)
    kq_argmax_rows(const float* __restrict__ y, int* __restrict__ idx, int M, int N) {
    __shared__ float sv[KQ_ARGMAX_THREADS];
    __shared__ int si[KQ_ARGMAX_THREADS];
    const int row = blockIdx.x, t = threadIdx.x;
    if (row >= M) return;  // uniform over the block: before any barrier
    const float* r = y + (size_t)row * N;
    float bv = 0.f;
    int bi = -1;
    for (int j = t; j < N; j += blockDim.x) {
        const float v = r[j];
        if (kq_argmax_before(bv, bi, v, j)) {
            bv = v;
            bi = j;
        }
    }
    sv[t] = bv;
    si[t] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s && kq_argmax_before(sv[t], si[t], sv[t + s], si[t + s])) {
            sv[t] = sv[t + s];
            si[t] = si[t + s];
        }
        __syncthreads();
    }
    if (t == 0) idx[row] = si[0];
}
