//! Value parsers for every numeric flag: each number is checked at parse time for its range
//! (and, for decimals, for being finite), so `nan`, `inf`, negative, zero-where-meaningless
//! and absurdly large values are refused before any work starts. clap shows the message as
//! `error: invalid value 'V' for '--flag <…>': …`; [`render_clap_error`](super::render_clap_error)
//! adds the [`FlagError`]'s hint and exits 2.
//!
//! The bounds are documented in `docs/verify.md` (verify, trace, calibrate, bench) and in each
//! flag's `--help`. Sizes that drive allocations have hard caps here ([`MAX_GEN_LEN`],
//! [`MAX_SEQ_LEN`], …); the commands check what depends on the inputs (a target's
//! `max_position_embeddings`, a shape's element count) when they know it.
//!
//! The old spellings of renamed flags are here too ([`deprecated`], [`PerCategory`]): hidden
//! arguments kept for one release, each with its warning.

use std::fmt;

/// Most draft depths per round the replay holds (one bit each in a `u32` mask).
pub const MAX_STEPS: u64 = crate::verify::walk::MAX_DEPTHS as u64;
/// Most samples or prompts `--limit` can name (per category for `verify`).
pub const MAX_LIMIT: u64 = 10_000_000;
/// Most greedy tokens `trace capture --gen-len` generates per prompt (also bounded by the
/// target's `max_position_embeddings`).
pub const MAX_GEN_LEN: u64 = 1 << 20;
/// Longest synthetic sequence `bench replay --synthetic-trace` builds.
pub const MAX_SEQ_LEN: u64 = 1 << 20;
/// Most synthetic samples `bench replay --samples` builds or replays.
pub const MAX_SAMPLES: u64 = 1_000_000;
/// Largest dimension (hidden size, K, N, rows, group) a flag may give.
pub const MAX_DIM: u64 = 1 << 20;
/// Largest layer index or layer count a flag may give.
pub const MAX_LAYERS: u64 = 4096;
/// Largest token count M of `bench gemm --m`.
pub const MAX_M: u64 = 16384;
/// Most timed calls or rounds of a benchmark.
pub const MAX_ITERS: u64 = 100_000;
/// Most rounds of `bench quantize|convert --repeat`.
pub const MAX_REPEAT: u64 = 1000;
/// Largest accept length: 32 depths + the bonus token.
pub const MAX_AL: f64 = MAX_STEPS as f64 + 1.0;
/// Bound of `--max-regression` (any finite value from 33 up already never fails on ΔAL).
pub const MAX_REGRESSION: f64 = 1000.0;

/// A refused flag value: the message (what is wrong and what is accepted) and a hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagError {
    pub msg: String,
    pub hint: String,
}

impl fmt::Display for FlagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for FlagError {}

fn refuse(msg: String, hint: &str) -> FlagError {
    FlagError {
        msg,
        hint: hint.into(),
    }
}

/// A whole number in `lo..=hi`.
pub fn int(s: &str, lo: u64, hi: u64, hint: &str) -> Result<u64, FlagError> {
    whole(s, lo, hi, hint, |t| {
        t.parse::<i128>().is_ok() || t.bytes().all(|b| b.is_ascii_digit()) && !t.is_empty()
    })
}

/// A whole number (possibly negative) in `lo..=hi`.
pub fn signed(s: &str, lo: i64, hi: i64, hint: &str) -> Result<i64, FlagError> {
    whole(s, lo, hi, hint, |t| t.parse::<i128>().is_ok())
}

/// A whole number of type `T` in `lo..=hi`; text that is no `T` but `beyond` says is a whole
/// number is out of range, not malformed.
fn whole<T>(s: &str, lo: T, hi: T, hint: &str, beyond: fn(&str) -> bool) -> Result<T, FlagError>
where
    T: std::str::FromStr + PartialOrd + fmt::Display,
{
    let t = s.trim();
    let range = format!("a whole number in {lo}..={hi}");
    match t.parse::<T>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        Ok(v) => Err(refuse(format!("{v} is out of range: {range}"), hint)),
        Err(_) if beyond(t) => Err(refuse(format!("`{t}` is out of range: {range}"), hint)),
        Err(_) => Err(refuse(format!("`{t}` is not {range}"), hint)),
    }
}

/// A finite decimal number in `lo..=hi` (`nan` and `inf` are refused).
pub fn float(s: &str, lo: f64, hi: f64, hint: &str) -> Result<f64, FlagError> {
    let t = s.trim();
    let range = format!("a finite number in {lo}..={hi}");
    match t.parse::<f64>() {
        Ok(v) if !v.is_finite() => Err(refuse(format!("`{t}` is not {range}"), hint)),
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        Ok(_) => Err(refuse(format!("`{t}` is out of range: {range}"), hint)),
        Err(_) => Err(refuse(format!("`{t}` is not {range}"), hint)),
    }
}

/// `--near-ties`: a logit margin, positive and finite.
pub fn near_ties(s: &str) -> Result<f64, FlagError> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(refuse(
            format!("`{}` is not a positive logit margin", s.trim()),
            "--near-ties takes a gap between two logits, e.g. 0.0625 (one bf16 step of a logit between 8 and 16)",
        )),
    }
}

/// The numeric flags' parsers, one row each: name, type, the parser of its kind ([`int`],
/// [`signed`], [`float`]) with the range, and the hint shown when a value is refused.
macro_rules! parsers {
    ($($(#[$doc:meta])* $name:ident -> $t:ty = $parse:ident($lo:expr, $hi:expr, $hint:expr);)*) => {$(
        $(#[$doc])*
        #[allow(clippy::unnecessary_cast)]
        pub fn $name(s: &str) -> Result<$t, FlagError> {
            $parse(s, $lo, $hi, $hint).map(|v| v as $t)
        }
    )*};
}

parsers! {
    /// `--steps`: draft depths per round.
    steps -> usize = int(1, MAX_STEPS, "--steps is the number of draft depths per round (chain length); the replay handles 1 to 32");
    /// `--limit`: the first N samples or prompts.
    limit -> usize = int(1, MAX_LIMIT, "--limit N keeps the first N samples (at least 1: a run over nothing measures nothing); leave it out to use all");
    /// `trace capture --gen-len`.
    gen_len -> usize = int(1, MAX_GEN_LEN, "--gen-len is the number of greedy tokens per prompt: at least 1, at most 1048576 (and prompt + continuation must fit the target's max_position_embeddings)");
    /// `trace capture --lookahead`: tokens past the stop, at most a draft's depth limit.
    lookahead -> usize = int(0, crate::runtime::matches::MAX_DEPTHS as u64, "--lookahead is the engine's draft tokens per step (num_speculative_tokens): 0 to 32");
    /// `bench replay --synthetic-trace`.
    seq_len -> usize = int(2, MAX_SEQ_LEN, "a synthetic sample needs a prompt and a generated token: 2 to 1048576 tokens");
    /// `bench replay --prompt-len`.
    prompt_len -> usize = int(1, MAX_SEQ_LEN - 1, "--prompt-len must be at least 1 and below the --synthetic-trace length");
    /// `bench replay --samples`.
    samples -> usize = int(1, MAX_SAMPLES, "--samples N replays N samples: 1 to 1000000");
    /// A hidden size, row count, K, N or group size.
    dim -> usize = int(1, MAX_DIM, "a dimension is a positive whole number, at most 1048576");
    /// A layer count.
    layers -> usize = int(1, MAX_LAYERS, "a layer count is a positive whole number, at most 4096");
    /// A layer index (`hidden_states` index or vLLM layer id).
    layer_id -> usize = int(0, MAX_LAYERS, "a layer index is a whole number from 0 (the embeddings) to 4096");
    /// `convert --aux-layers`: an aux-layer id in either convention (`-1` is the embeddings as
    /// output-of-layer).
    aux_layer -> i64 = signed(-1, MAX_LAYERS as i64, "an aux-layer id is a whole number from -1 to 4096 (see --aux-convention)");
    /// `bench gemm --m`: a token count.
    tokens_m -> usize = int(1, MAX_M, "--m lists token counts, each 1 to 16384");
    /// `bench gemm --iters`.
    iters -> usize = int(1, MAX_ITERS, "--iters is the number of timed calls: 1 to 100000");
    /// `bench quantize|convert --repeat`.
    repeat -> u32 = int(1, MAX_REPEAT, "--repeat is the number of rounds (each figure is the median): 1 to 1000");
    /// `verify --max-regression`: the largest ΔAL drop allowed (negative: an improvement required;
    /// 33 or more never fails on ΔAL, since an accept length is at most 33).
    max_regression -> f64 = float(-MAX_REGRESSION, MAX_REGRESSION, "--max-regression is an accept-length difference, e.g. 0.03; `nan` or `inf` would switch the gate off");
    /// `verify --min-accept`: the smallest accept length allowed.
    min_accept -> f64 = float(0.0, MAX_AL, "--min-accept is an accept length (1 to 33 tokens per round), e.g. 2.5; `nan` would switch the gate off");
    /// `diff --min-sqnr`: dB.
    min_sqnr -> f64 = float(-1000.0, 1000.0, "--min-sqnr is a signal-to-quantization-noise ratio in dB, e.g. 15");
    /// `verify --concurrency`: requests in flight at once.
    concurrency -> usize = int(1, 1024, "--concurrency N sends up to N requests at once (1 to 1024); 1 gives the reproducible draft-quality figure");
    /// `verify --max-tokens`: tokens generated per request.
    max_tokens -> usize = int(1, 1 << 20, "--max-tokens N caps each request's generated tokens (1 to 1048576)");
    /// `verify --request-timeout`: seconds one request may take.
    timeout_secs -> u64 = int(1, 86_400, "--request-timeout SECS is how long one request may take (1 to 86400 seconds)");
    /// `verify --retries`: tries after the first.
    retries -> usize = int(0, 20, "--retries N retries a request up to N more times after a connection failure, a 5xx or a 429 (0 to 20)");
}

/// The value of a renamed flag (docs/flags.md lists them, "Deprecated spellings"; tests/help.rs
/// checks that table against the binary): `new` when it was given, else `old` with the warning
/// ``warning: `--OLD` is deprecated for CMD: say --NEW (accepted until the next release)`` on
/// stderr. clap refuses both together (`conflicts_with`), so at most one is set.
pub fn deprecated<T>(
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
        eprintln!("{}", deprecated_warning(cmd, old, new));
    }
    deprecated
}

/// The warning line a deprecated spelling prints.
pub fn deprecated_warning(cmd: &str, old: &str, new: &str) -> String {
    format!("warning: `{old}` is deprecated for {cmd}: say {new} (accepted until the next release)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_new_spelling_wins_and_the_old_one_is_kept() {
        assert_eq!(
            deprecated("convert", "--target", "--target-checkpoint", Some(1), None),
            Some(1)
        );
        assert_eq!(
            deprecated("convert", "--target", "--target-checkpoint", None, Some(2)),
            Some(2)
        );
        assert_eq!(
            deprecated::<u8>("convert", "--target", "--target-checkpoint", None, None),
            None
        );
        assert_eq!(
            deprecated_warning("trace capture", "--target", "--target-checkpoint"),
            "warning: `--target` is deprecated for trace capture: say --target-checkpoint (accepted until the next release)"
        );
    }

    #[test]
    fn parsers_refuse_what_they_should() {
        assert_eq!(steps("3"), Ok(3));
        assert_eq!(steps(" 32 "), Ok(32));
        for bad in [
            "0",
            "33",
            "-1",
            "1.5",
            "nan",
            "",
            "x",
            "99999999999999999999999",
        ] {
            let e = steps(bad).unwrap_err();
            assert!(e.msg.contains("1..=32"), "{bad}: {e}");
            assert!(!e.hint.is_empty());
        }
        assert_eq!(max_regression("-0.1"), Ok(-0.1));
        for bad in [
            "nan", "NaN", "inf", "-inf", "infinity", "1e309", "1001", "x", "",
        ] {
            assert!(max_regression(bad).is_err(), "{bad}");
        }
        assert_eq!(min_accept("2.5"), Ok(2.5));
        assert!(min_accept("-1").is_err());
        assert_eq!(aux_layer("-1"), Ok(-1));
        assert!(aux_layer("-2").is_err() && aux_layer("9223372036854775807").is_err());
        assert_eq!(limit("10000000"), Ok(10_000_000));
        assert!(limit("10000001").is_err());
        assert!(gen_len("18446744073709551615").is_err());
    }
}

pub fn max_failed(s: &str) -> Result<crate::verify::live::run::MaxFailed, FlagError> {
    let hint = "--max-failed takes a count (`3`) or a share of the prompts (`5%`); a failed request is never measured, more than this many is an error";
    match s.trim().strip_suffix('%') {
        Some(p) => float(p, 0.0, 100.0, hint).map(crate::verify::live::run::MaxFailed::Percent),
        None => int(s, 0, MAX_LIMIT, hint)
            .map(|v| crate::verify::live::run::MaxFailed::Count(v as usize)),
    }
}

/// `--max-regression`, defined once for `verify` and `sensitivity` (flattened into both) so that
/// it parses the same everywhere: a negative value (an improvement asked for) is a value, not a
/// flag.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Gate {
    /// Fail when ΔAL (draft − baseline) < −this (a finite number in -1000..=1000; negative
    /// asks for an improvement).
    #[arg(long, default_value_t = 0.03, value_parser = max_regression, allow_hyphen_values = true)]
    pub max_regression: f64,
}

impl Gate {
    /// The gate's thresholds with `min_accept` (`verify --min-accept`), built once for every
    /// command that gates.
    pub fn thresholds(
        &self,
        min_accept: Option<f64>,
    ) -> crate::error::Result<crate::verify::gate::Thresholds> {
        crate::verify::gate::Thresholds::new(self.max_regression, min_accept)
    }
}

/// The calibration inputs of `quantize` and `sensitivity`, defined once (flattened into both).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Calibrate {
    /// A `kquant-trace/1` directory to calibrate on (`kquant trace capture` / `trace import`):
    /// the draft replays it, every depth, and each module's inputs are measured. Required by
    /// `--method search|gptq|search-gptq`; not the evaluation `--trace` (a method measured on
    /// its own calibration prompts flatters itself).
    #[arg(long, value_name = "TRACE")]
    pub calibrate: Option<std::path::PathBuf>,
    /// Memory the accumulated Σ x xᵀ of one calibration replay may take (`--method gptq`; more
    /// modules than fit are collected in further replays), e.g. `4GiB`. The default keeps the
    /// Kimi-shape draft's calibration within 8 GB.
    #[arg(long, value_parser = crate::io::writer::parse_size, default_value = "2.5GiB", requires = "calibrate")]
    pub calibration_memory: u64,
}

/// `--steps`, defined once for the replays (`verify`, `sensitivity`, `calibrate`, `bench
/// replay`; flattened into each).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct Steps {
    /// Draft tokens per step [default: 3 for an EAGLE-3 chain; a DFlash draft's block_size − 1].
    /// A DFlash draft then runs a block of this + 1 rows, as vLLM (`num_speculative_tokens`) and
    /// SGLang (`--speculative-num-draft-tokens` − 1) do; at most block_size − 1.
    #[arg(long, value_name = "N", value_parser = steps)]
    pub steps: Option<usize>,
}

/// How many prompts of each category to evaluate, defined once for `verify` and `sensitivity`
/// (flattened into both). `--limit` elsewhere (`trace capture`, `calibrate`,
/// `scripts/vllm_capture.py`) is the first N of the whole set; here it is accepted for
/// compatibility, means the same as `--per-category`, and says so.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct PerCategory {
    /// Evaluate at most N prompts of each category, the first ones (a live capture then runs
    /// only those). At least 1.
    #[arg(long = "per-category", value_name = "N", value_parser = limit)]
    pub per_category: Option<usize>,
    /// The old spelling of --per-category (N of each category, not the first N).
    #[arg(long, value_name = "N", value_parser = limit, conflicts_with = "per_category", hide = true)]
    pub limit: Option<usize>,
}

impl PerCategory {
    /// The limit per category, however it was spelled.
    pub fn value(&self) -> Option<usize> {
        self.per_category.or(self.limit)
    }

    /// A `warning:` when it was given as `--limit` (once, at the start of `command`).
    pub fn warn_spelling(&self, command: &str) {
        if let Some(n) = self.limit {
            eprintln!(
                "warning: `--limit` is deprecated for {command}: say --per-category (accepted until the next release); `--limit {n}` here means {n} prompts of each category, where `trace capture` and `calibrate` take the first {n} of the whole set: `--per-category {n}`"
            );
        }
    }
}
