//! Deprecated flag spellings: a renamed flag keeps its old spelling as a hidden argument for one
//! release, and [`resolve`] picks whichever was given, printing the one warning every such
//! spelling prints. docs/flags.md lists them ("Deprecated spellings"); tests/help.rs checks
//! that table against the binary.

/// The value of a renamed flag: `new` when it was given, else `old` with the warning
/// ``warning: `--OLD` is deprecated for CMD: say --NEW (accepted until the next release)`` on
/// stderr. clap refuses both together (`conflicts_with`), so at most one is set.
pub fn resolve<T>(
    cmd: &str,
    old: &str,
    new: &str,
    given: Option<T>,
    deprecated: Option<T>,
) -> Option<T> {
    if given.is_some() {
        return given;
    }
    if deprecated.is_some() {
        eprintln!("{}", warning(cmd, old, new));
    }
    deprecated
}

/// The warning line a deprecated spelling prints.
pub fn warning(cmd: &str, old: &str, new: &str) -> String {
    format!("warning: `{old}` is deprecated for {cmd}: say {new} (accepted until the next release)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_new_spelling_wins_and_the_old_one_is_kept() {
        assert_eq!(
            resolve("convert", "--target", "--target-checkpoint", Some(1), None),
            Some(1)
        );
        assert_eq!(
            resolve("convert", "--target", "--target-checkpoint", None, Some(2)),
            Some(2)
        );
        assert_eq!(
            resolve::<u8>("convert", "--target", "--target-checkpoint", None, None),
            None
        );
        assert_eq!(
            warning("trace capture", "--target", "--target-checkpoint"),
            "warning: `--target` is deprecated for trace capture: say --target-checkpoint (accepted until the next release)"
        );
    }
}
