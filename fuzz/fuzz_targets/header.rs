//! Arbitrary bytes into `kquant::io::header::parse`: it must never panic, and whatever it
//! accepts the `safetensors` crate must accept too, with the same tensors (name, dtype, shape,
//! data byte range) and the same `__metadata__`. kquant may refuse more than safetensors does.
//!
//! Each input is checked as given and once more with its 8-byte length prefix rewritten to
//! end the header at the last `}`: a mutation that grows or shrinks the JSON otherwise
//! almost always breaks the prefix, and the parser never gets past it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use safetensors::SafeTensors;

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some(fixed) = reprefixed(data) {
        check(&fixed);
    }
});

fn reprefixed(data: &[u8]) -> Option<Vec<u8>> {
    let body = data.get(8..)?;
    let json_len = body.iter().rposition(|&b| b == b'}')? + 1;
    let mut out = (json_len as u64).to_le_bytes().to_vec();
    out.extend_from_slice(body);
    (out != data).then_some(out)
}

fn check(data: &[u8]) {
    let Ok(header) = kquant::io::header::parse(data) else {
        return;
    };
    if let Err(e) = SafeTensors::deserialize(data) {
        panic!("kquant accepted a file that safetensors refuses: {e}");
    }
    let (n, meta) = SafeTensors::read_metadata(data).expect("deserialize accepted it");
    assert_eq!(header.json_len, n as u64, "header length");
    assert_eq!(
        header.tensors.len(),
        meta.tensors().len(),
        "tensor count (kquant: {:?})",
        header.tensors.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    for t in &header.tensors {
        let info = meta
            .info(&t.name)
            .unwrap_or_else(|| panic!("safetensors has no tensor `{}`", t.name));
        assert_eq!(
            t.dtype.name(),
            info.dtype.to_string(),
            "dtype of `{}`",
            t.name
        );
        assert_eq!(t.shape, info.shape, "shape of `{}`", t.name);
        assert_eq!(
            (t.start, t.end),
            (info.data_offsets.0 as u64, info.data_offsets.1 as u64),
            "data offsets of `{}`",
            t.name
        );
    }
    let theirs = meta
        .metadata()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    assert_eq!(header.metadata, theirs, "__metadata__");
}
