//! This process's memory as the kernel counts it (`/proc/self/status`): the resident set now
//! (`VmRSS`) and its peak so far (`VmHWM`), which the benchmarks and `trace import --json`
//! report. `None` where the file or the field is missing (not Linux).

/// A `/proc/self/status` field given in kB (`VmRSS:`, `VmHWM:`), in bytes.
pub fn status_bytes(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

/// The resident set now, bytes.
pub fn rss() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// The peak resident set so far, bytes.
pub fn peak_rss() -> Option<u64> {
    status_bytes("VmHWM:")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peak_is_at_least_the_resident_set() {
        if let (Some(now), Some(peak)) = (super::rss(), super::peak_rss()) {
            assert!(now > 0 && peak >= now, "{now} {peak}");
        }
        assert_eq!(super::status_bytes("NoSuchField:"), None);
    }
}
