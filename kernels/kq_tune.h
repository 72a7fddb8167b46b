// kq_tune.h — per-architecture tuning constants for the GEMV (regime A, M <= 8), tensor-core
// (regime B) and dequant-to-dense (regime C) kernels.
// The launcher in src/gpu/tune.rs mirrors these numbers (it picks grid and block sizes on the
// host); change both together (`gpu::tune::tests::kq_tune_h_agrees_with_the_table` holds them
// equal). Every value here is a first guess pending tuning on the GPU (docs/kernels.md).
//
//   KQ_GEMV_ROWS      output channels per block (one warp / wavefront per channel)
//   KQ_GEMV_UNROLL    128-bit weight loads in flight per lane before any math
//   KQ_UNITS          SMs / CUs, for the split-K heuristic (blocks >= KQ_BLOCKS_PER_UNIT x units)
//   KQ_MMA_WARPS      warps / wavefronts per regime-B block (each owns 16 output channels)
//   KQ_MMA_UNROLL     128-weight k-tiles whose weight loads are issued before any MMA
//   KQ_DENSE_THREADS  threads per block of the dequant-to-dense kernel (one 32-weight chunk each)
// The regime thresholds (first guesses GEMV up to M = 8, MMA up to M = 128, dense above; on
// sm_90 no GEMV, MMA up to 64, as measured on an H200) live in tune.rs only: the host picks the
// kernel.
#pragma once
#define KQ_DENSE_THREADS 256

#if defined(__gfx942__) || defined(__gfx940__) || defined(__gfx941__)
// MI300X / MI325X (CDNA3, wave64, 304 CUs, 64 KiB LDS per CU). gfx940 is the compile-check proxy.
#define KQ_ARCH_NAME "gfx942"
#define KQ_GEMV_ROWS 4
#define KQ_GEMV_UNROLL 2
#define KQ_UNITS 304
#define KQ_BLOCKS_PER_UNIT 4
#define KQ_MMA_WARPS 4
#define KQ_MMA_UNROLL 2
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
// Blackwell B200 (sm_100a, 148 SMs).
#define KQ_ARCH_NAME "sm_100"
#define KQ_GEMV_ROWS 8
#define KQ_GEMV_UNROLL 4
#define KQ_UNITS 148
#define KQ_BLOCKS_PER_UNIT 4
#define KQ_MMA_WARPS 4
#define KQ_MMA_UNROLL 2
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Hopper H100/H200 (sm_90a, 132 SMs).
#define KQ_ARCH_NAME "sm_90"
#define KQ_GEMV_ROWS 8
#define KQ_GEMV_UNROLL 4
#define KQ_UNITS 132
#define KQ_BLOCKS_PER_UNIT 4
#define KQ_MMA_WARPS 4
#define KQ_MMA_UNROLL 2
#else
// Anything else (host pass, older GPUs): conservative defaults.
#define KQ_ARCH_NAME "generic"
#define KQ_GEMV_ROWS 4
#define KQ_GEMV_UNROLL 2
#define KQ_UNITS 64
#define KQ_BLOCKS_PER_UNIT 4
#define KQ_MMA_WARPS 4
#define KQ_MMA_UNROLL 1
#endif
