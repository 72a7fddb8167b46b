//! The integration tests, one binary (`cargo test --test kquant`; a file's tests with
//! `cargo test --test kquant FILE::`): each file below runs the real `kquant` binary or the
//! library on the fixtures; `common` holds the helpers they share.

mod common;

mod adversarial_inputs;
mod bench_copy;
mod bench_gemm;
mod bench_replay;
mod calibrate;
mod convert;
mod convert_blocks2026;
mod convert_golden;
mod ct_golden;
mod dequantize;
mod fixtures;
mod formats_doc;
mod fp8_w4a8_golden;
mod fuzz_regressions;
mod gptq_golden;
mod gpu_dense;
mod gpu_gemm;
mod gpu_linear;
mod guides;
mod hardening;
mod help;
mod inspect;
mod interop;
mod live_endpoint;
mod malformed;
mod modelopt_drafter;
mod modelopt_golden;
mod nvfp4_golden;
mod parity_blocks2026;
mod parity_dflash;
mod parity_eagle3;
mod parity_kimi_k3;
mod parity_kimi_linear;
mod parity_target;
mod presets;
mod quantize_blocks2026;
mod quantize_methods;
mod quark_golden;
mod readme;
mod report_schema;
mod schemes_doc;
mod sensitivity;
mod targets;
mod trace_capture;
mod trace_import;
mod trace_prompts;
mod verify;
mod verify_device;
mod verify_live;
mod verify_methods;
mod verify_schemes;
mod writer;
