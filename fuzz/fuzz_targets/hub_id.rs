//! Arbitrary text into `kquant::io::hub::HubId::parse_checked`: it must never panic, and an id
//! it accepts has a revision that stays inside the cache when joined under the repo's `refs/`
//! and `snapshots/` folders (read lexically: no absolute part, no `.`/`..`, no empty part).
#![no_main]

use std::path::Path;

use kquant::io::hub::{lexically_inside, HubId, MAX_REVISION_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let Ok(Some(id)) = HubId::parse_checked(&s) else {
        return;
    };
    assert_eq!(HubId::parse(&s), Some(id.clone()), "parse and parse_checked agree");
    let rev = &id.revision;
    assert!(!rev.is_empty() && rev.len() <= MAX_REVISION_LEN, "{rev:?}");
    assert!(!rev.contains(['\\', '\0']), "{rev:?}");
    let root = Path::new("/cache/hub");
    let folder = id.folder(root);
    assert!(lexically_inside(root, &folder), "{s:?}");
    for sub in ["refs", "snapshots"] {
        let base = folder.join(sub);
        let p = base.join(rev);
        assert!(lexically_inside(&base, &p) && p != base, "{s:?} -> {p:?}");
    }
});
