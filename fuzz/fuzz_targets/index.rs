//! Arbitrary bytes into `kquant::io::index::parse`: it must never panic, and an index it accepts
//! names only plain shard file names and lists no tensor twice.
#![no_main]

use std::collections::HashSet;

use kquant::io::index::{is_plain_file_name, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(index) = parse(data) else {
        return;
    };
    assert!(!index.weight_map.is_empty(), "accepted an empty weight_map");
    let mut seen = HashSet::new();
    for (tensor, shard) in &index.weight_map {
        assert!(is_plain_file_name(shard), "unsafe shard name {shard:?}");
        assert!(seen.insert(tensor), "tensor {tensor:?} listed twice");
    }
    for shard in index.shards() {
        assert!(is_plain_file_name(shard), "unsafe shard name {shard:?}");
    }
});
