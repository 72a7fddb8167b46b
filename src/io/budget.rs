//! A memory budget for code kquant runs on a user's behalf but does not write: a target's chat
//! template (Jinja, rendered by minijinja).
//!
//! minijinja charges most of what a template builds against its fuel, but not all of it: a
//! list doubled with `+` past 32 levels is materialized item by item, `join('')` of doubling
//! strings is never charged, and our own `tojson` serializes whatever it is given. A 200-byte
//! template can ask for terabytes. Instructions are bounded by fuel
//! (`tokenizer::ChatTemplate::TEMPLATE_FUEL`); bytes are bounded here.
//!
//! [`within`] runs a closure with a byte budget on the calling thread. kquant's global
//! allocator ([`Counting`], the system allocator plus one thread-local counter) charges every
//! allocation made on that thread while the budget is open. Going over it cannot be reported as
//! an ordinary error (an allocator must not unwind), so it ends the process the way a fatal
//! signal does in `io::interrupt`: the `error:` and `hint:` lines prepared before the closure
//! ran are written to the user's stderr (`io::stdio::write_error`), the registered partial outputs and lock files are removed,
//! and the exit status is 2. Nothing is allocated on that path.
//!
//! Outside a budget the allocator adds one thread-local read to each allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The global allocator: [`System`], with the calling thread's open budget charged.
pub struct Counting;

#[derive(Clone, Copy)]
struct Open {
    /// Bytes allocated on this thread since the budget opened, less those freed.
    used: usize,
    limit: usize,
    /// The prepared message (`error: …\n\nhint: …\n`), alive for the whole budget.
    msg: *const u8,
    msg_len: usize,
}

thread_local! {
    static OPEN: Cell<Option<Open>> = const { Cell::new(None) };
}

#[inline]
fn charge(add: usize, sub: usize) {
    // `try_with`: during thread teardown the slot may be gone; nothing is open then.
    let _ = OPEN.try_with(|slot| {
        if let Some(mut o) = slot.get() {
            o.used = o.used.saturating_add(add).saturating_sub(sub);
            if o.used > o.limit {
                slot.set(None);
                over(o);
            }
            slot.set(Some(o));
        }
    });
}

#[cold]
fn over(o: Open) -> ! {
    // SAFETY: `msg` points into the String that `within` keeps alive for the whole budget;
    // `stdio::write_error` and `interrupt::exit_removing_outputs` allocate nothing.
    unsafe {
        super::stdio::write_error(std::slice::from_raw_parts(o.msg, o.msg_len));
        super::interrupt::exit_removing_outputs(2)
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counter never touches the memory.
unsafe impl GlobalAlloc for Counting {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size(), 0);
        System.alloc(layout)
    }
    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size(), 0);
        System.alloc_zeroed(layout)
    }
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        charge(0, layout.size());
        System.dealloc(ptr, layout)
    }
    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        charge(new_size, layout.size());
        System.realloc(ptr, layout, new_size)
    }
}

/// Run `f` with at most `limit` bytes allocated on this thread at any time. Over it, the process
/// writes `error: {error}` and `hint: {hint}` to stderr, removes its partial outputs and exits 2.
///
/// Budgets nest: an inner one is charged alone and the outer one resumes when it closes.
pub fn within<R>(limit: usize, error: &str, hint: &str, f: impl FnOnce() -> R) -> R {
    let msg = format!(
        "error: {error}\n\nhint: {hint}\n",
        error = crate::escape::printable(error),
        hint = crate::escape::printable(hint)
    );
    let outer = OPEN.with(|s| s.get());
    OPEN.with(|s| {
        s.set(Some(Open {
            used: 0,
            limit,
            msg: msg.as_ptr(),
            msg_len: msg.len(),
        }))
    });
    struct Restore(Option<Open>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = OPEN.try_with(|s| s.set(self.0));
        }
    }
    let restore = Restore(outer);
    let r = f();
    drop(restore);
    drop(msg);
    r
}

/// Bytes charged to this thread's open budget (0 when none is open).
pub fn used() -> usize {
    OPEN.with(|s| s.get().map_or(0, |o| o.used))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_counts_what_its_thread_holds_and_closes_cleanly() {
        let kept = within(1 << 20, "x", "y", || {
            let a = vec![0u8; 1000];
            let before = used();
            assert!(before >= 1000, "{before}");
            drop(a);
            assert!(used() < before);
            let b = vec![1u8; 4096];
            assert!(used() >= 4096);
            b
        });
        // Outside the budget nothing is charged, and memory from inside may be freed freely.
        assert_eq!(used(), 0);
        drop(kept);
        assert_eq!(used(), 0);
    }

    #[test]
    fn budgets_nest() {
        within(1 << 20, "outer", "h", || {
            let _a = vec![0u8; 10_000];
            let outer = used();
            within(1 << 20, "inner", "h", || {
                assert!(used() < 1000);
                let _b = vec![0u8; 5000];
                assert!(used() >= 5000);
            });
            assert_eq!(used(), outer);
        });
    }

    /// Set in the child process of `going_over_a_budget_exits_2_with_the_prepared_message`.
    const CHILD: &str = "KQUANT_BUDGET_CHILD";

    #[test]
    #[ignore = "the child process of going_over_a_budget_exits_2_with_the_prepared_message"]
    fn budget_child() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        within(1 << 20, "the thing grew", "make it smaller", || {
            let mut v: Vec<u8> = Vec::new();
            for _ in 0..100 {
                v.extend_from_slice(&[7u8; 1 << 16]);
            }
            std::hint::black_box(&v);
        });
        unreachable!("the budget should have ended the process");
    }

    #[test]
    fn going_over_a_budget_exits_2_with_the_prepared_message() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "io::budget::tests::budget_child",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("error: the thing grew\n\nhint: make it smaller\n"),
            "{err}"
        );
    }
}
