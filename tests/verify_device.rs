//! `kquant verify --device`: the device is checked before anything is read, so a build without
//! the device's feature or an unknown device exits 2 with a hint (`--device cpu`, the default,
//! is the f32 runtime that tests/verify.rs covers).

mod common;

use common::kquant;

fn verify_on(device: &str) -> std::process::Output {
    kquant(&[
        "verify",
        "--draft",
        "fixtures/kimi-k2.5-tiny/eagle3",
        "--trace",
        "fixtures/kimi-k2.5-tiny/trace",
        "--device",
        device,
    ])
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_exits_2_with_a_hint() {
    let out = verify_on("cuda");
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("error: device `cuda`: this kquant was built without the `cuda` feature"),
        "{e}"
    );
    assert!(e.contains("hint: rebuild with --features cuda"), "{e}");
}

#[cfg(not(feature = "hip"))]
#[test]
fn hip_without_the_feature_exits_2_with_a_hint() {
    let out = verify_on("hip:0");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hint: rebuild with --features hip"));
}

#[test]
fn unknown_device_exits_2() {
    let out = verify_on("gpu");
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("unknown device `gpu`") && e.contains("hint: use --device cpu"),
        "{e}"
    );
}
