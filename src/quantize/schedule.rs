//! The order in which `quantize`'s encoder thread encodes the quantized modules, and which of
//! each module's tensors wait in memory until the writer reaches them.
//!
//! The writer takes tensors in the file's order (dtype alignment, then name), so one module's
//! tensors can be far apart: Quark file-to-file stores F32 scales, which sort before every I32
//! weight; FP8 weights (1-byte alignment) sort after every BF16 scale. Encoding a module gives
//! all its tensors at once, so the ones the writer needs later must wait in memory. [`plan`]
//! walks the file order once, before anything is encoded, and keeps a waiting tensor only while
//! the bytes waiting stay within a budget; a tensor that does not fit is dropped and its module
//! encoded again when the writer reaches it (encoding is deterministic, so the bytes are the
//! same). Memory is then bounded by the budget whatever the model, at the cost of re-encoding
//! only where it would have been exceeded.

use std::collections::{HashMap, HashSet};

/// One encoding of a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The module (the caller's index).
    pub module: usize,
    /// The tensor the writer needs now.
    pub now: String,
    /// Tensors of this encoding to hold until the writer reaches them.
    pub keep: HashSet<String>,
    /// The module's first encoding (for progress).
    pub first: bool,
}

/// The jobs for tensors written in `order`: `module_of(name)` is the quantized module a tensor
/// belongs to (`None`: not produced by an encoder), `size(name)` its bytes; at most `budget`
/// bytes wait at any time.
pub fn plan(
    order: &[String],
    module_of: impl Fn(&str) -> Option<usize>,
    size: impl Fn(&str) -> u64,
    budget: u64,
) -> Vec<Job> {
    // Each module's tensors with their positions in the file.
    let mut tensors: HashMap<usize, Vec<(usize, &str)>> = HashMap::new();
    for (pos, n) in order.iter().enumerate() {
        if let Some(m) = module_of(n) {
            tensors.entry(m).or_default().push((pos, n));
        }
    }
    let mut waiting: HashSet<&str> = HashSet::new();
    let mut held = 0u64;
    let mut seen: HashSet<usize> = HashSet::new();
    let mut jobs = Vec::new();
    for (pos, n) in order.iter().enumerate() {
        if waiting.remove(n.as_str()) {
            held -= size(n);
            continue;
        }
        let Some(m) = module_of(n) else { continue };
        let mut keep = HashSet::new();
        for &(p, t) in &tensors[&m] {
            if p > pos && !waiting.contains(t) {
                let s = size(t);
                if held + s <= budget {
                    held += s;
                    waiting.insert(t);
                    keep.insert(t.to_string());
                }
            }
        }
        jobs.push(Job {
            module: m,
            now: n.clone(),
            keep,
            first: seen.insert(m),
        });
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Module of `a.x` is `a` (as an index), `copy.*` tensors are not encoded.
    fn module_of(n: &str) -> Option<usize> {
        (!n.starts_with("copy")).then(|| (n.as_bytes()[0] - b'a') as usize)
    }

    /// Replay the jobs as the driver does: every tensor is written exactly once, either from
    /// the job made for it or from what an earlier job kept; what waits never exceeds the
    /// budget.
    fn replay(order: &[String], jobs: &[Job], size: impl Fn(&str) -> u64, budget: u64) {
        let mut it = jobs.iter();
        let mut waiting: HashSet<String> = HashSet::new();
        for n in order {
            if waiting.remove(n) {
                continue;
            }
            let Some(m) = module_of(n) else { continue };
            let j = it.next().expect("a job for every tensor not waiting");
            assert_eq!((j.module, j.now.as_str()), (m, n.as_str()));
            waiting.extend(j.keep.iter().cloned());
            assert!(waiting.iter().map(|t| size(t)).sum::<u64>() <= budget);
        }
        assert!(it.next().is_none() && waiting.is_empty());
    }

    #[test]
    fn everything_waits_within_the_budget() {
        // Scales first (file2file), weights later.
        let order = names(&["a.s", "b.s", "copy.e", "a.w", "b.w"]);
        let size = |n: &str| if n.ends_with(".w") { 100 } else { 1 };
        let jobs = plan(&order, module_of, size, 1000);
        assert_eq!(jobs.len(), 2, "one encoding per module");
        assert!(jobs.iter().all(|j| j.first));
        replay(&order, &jobs, size, 1000);
    }

    #[test]
    fn over_the_budget_a_module_is_encoded_again() {
        let order = names(&["a.s", "b.s", "c.s", "copy.e", "a.w", "b.w", "c.w"]);
        let size = |n: &str| if n.ends_with(".w") { 100 } else { 1 };
        let jobs = plan(&order, module_of, size, 250);
        // a.w and b.w fit (200), c.w does not: c is encoded twice.
        assert_eq!(jobs.len(), 4);
        assert_eq!(jobs[3].module, 2);
        assert!(!jobs[3].first);
        replay(&order, &jobs, size, 250);
        // No budget: every later tensor is re-encoded, one module at a time.
        let jobs = plan(&order, module_of, size, 0);
        assert_eq!(jobs.len(), 6);
        replay(&order, &jobs, size, 0);
    }

    #[test]
    fn interleaved_modules_and_tensors_in_place() {
        let order = names(&["a.w", "a.s", "b.w", "copy.x", "b.s", "b.z", "a.z"]);
        let size = |n: &str| n.len() as u64;
        for budget in [0, 3, 6, 100] {
            let jobs = plan(&order, module_of, size, budget);
            replay(&order, &jobs, size, budget);
        }
    }
}
