//! Arbitrary bytes into `kquant::trace::file::parse_manifest` (a `kquant-trace/1`
//! `manifest.json`): it must never panic, and a manifest it accepts has plain shard names,
//! each listed once, sample ids listed once, every sample's shard listed, a positive hidden
//! size, and lengths whose sums and products with the hidden size do not overflow.
#![no_main]

use std::collections::HashSet;

use kquant::io::index::is_plain_file_name;
use kquant::trace::file::{parse_manifest, FORMAT, TAP_CONVENTION};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = parse_manifest(data) else {
        return;
    };
    assert_eq!(m.format, FORMAT);
    assert_eq!(m.tap_convention, TAP_CONVENTION);
    assert!(m.hidden_size > 0);
    let mut shards = HashSet::new();
    for s in &m.shards {
        assert!(is_plain_file_name(&s.file), "unsafe shard name {:?}", s.file);
        assert!(shards.insert(s.file.as_str()), "shard {:?} listed twice", s.file);
    }
    let mut ids = HashSet::new();
    for s in &m.samples {
        assert!(ids.insert(s.id), "sample {} listed twice", s.id);
        assert!(shards.contains(s.shard.as_str()), "unknown shard {:?}", s.shard);
        let len = s.total_len().expect("accepted lengths add up");
        assert!(len.checked_mul(m.hidden_size).is_some(), "tap size overflows");
    }
});
