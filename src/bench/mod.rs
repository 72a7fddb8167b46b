//! The benchmarks' measurements (never assertions), each run in one process against its own
//! baseline so that the ratios hold on any machine (docs/performance.md): [`timed`] runs
//! `kquant quantize` / `convert` as a child against `cp -r` of the same bytes, [`read`] times
//! the header-only open and a full f32 read against `cat`, [`replay`] times the verify replay
//! of a draft by part. `cli::bench` (and `bench_replay`) parse the arguments and render; the INT4
//! kernels' benchmark is `gpu::bench`, driven by `cli::bench_gemm`.

pub mod read;
pub mod replay;
pub mod timed;
