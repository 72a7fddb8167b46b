//! The target profile's published accept lengths as a floor (`verify --endpoint … --published
//! DRAFT`): the figures the profile quotes for DRAFT on the benchmark the prompt set is (MT-Bench,
//! GSM8K, HumanEval, MATH-500, Spec-Bench, SPEED-Bench), overall and per category where the card
//! splits it (`MT-Bench coding`), each compared with what was measured. A measured accept length
//! below a published one by more than `--max-regression` fails the gate.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::target::profile::Profile;
use crate::verify::prompt_sets::SetFormat;

/// One published figure and the measurement it is held against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// The benchmark as the card names it.
    pub benchmark: String,
    /// The category it covers (`None`: the whole set).
    pub category: Option<String>,
    pub published: f64,
    pub measured: f64,
    /// Prompts behind the measurement.
    pub n: usize,
    pub source: String,
    pub passed: bool,
    /// Which accept length was measured and quoted (the report's field for it).
    pub count: &'static str,
}

/// Which count a card figure is, and so which measurement it is held against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// An engine's (or a walk's) accept length, tokens per verify step: live.
    Walk,
    /// An offline teacher-forced figure over every anchor: an offline replay's all-positions AL.
    TeacherForced,
}

impl Count {
    /// The count of a card figure: teacher-forced where its engine says so.
    pub fn of(p: &crate::target::profile::PublishedAl) -> Count {
        if p.engine.contains("teacher-forced") {
            Count::TeacherForced
        } else {
            Count::Walk
        }
    }
    /// The report's field for the measurement held against it.
    pub fn field(self) -> &'static str {
        match self {
            Count::Walk => "accept_length",
            Count::TeacherForced => "accept_length_all_positions",
        }
    }
    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            Count::Walk => "AL (walk)",
            Count::TeacherForced => "all-positions AL (teacher-forced)",
        }
    }
}

/// Lower-case letters and digits only: `MT-Bench` and `MTBench` are one benchmark.
fn key(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The benchmark a prompt format stands for; `None` for a user's own prompts.
pub fn benchmark_of(f: SetFormat) -> Option<&'static str> {
    match f {
        SetFormat::MtBench => Some("mtbench"),
        SetFormat::SpecBench => Some("specbench"),
        SetFormat::SpeedBench => Some("speedbench"),
        SetFormat::Gsm8k => Some("gsm8k"),
        SetFormat::Math500 => Some("math500"),
        SetFormat::Humaneval => Some("humaneval"),
        SetFormat::Auto | SetFormat::Plain | SetFormat::Tokens => None,
    }
}

/// The benchmark a prompt file stands for: its format's ([`benchmark_of`]), else, for a plain
/// or tokens file, the one every record names in `dataset` (the bundled
/// `quant-configs/prompts/mt_bench.jsonl` says `"dataset": "mt_bench"`); `None` for a user's
/// own prompts.
pub fn benchmark_of_file<'a>(
    f: SetFormat,
    datasets: impl IntoIterator<Item = &'a str>,
) -> Option<&'static str> {
    if let Some(b) = benchmark_of(f) {
        return Some(b);
    }
    const KNOWN: [&str; 6] = [
        "mtbench",
        "specbench",
        "speedbench",
        "gsm8k",
        "math500",
        "humaneval",
    ];
    let mut named = None;
    for d in datasets {
        let k = key(d);
        let b = KNOWN.iter().find(|b| **b == k)?;
        match named {
            None => named = Some(*b),
            Some(n) if n == *b => {}
            Some(_) => return None,
        }
    }
    named
}

/// Whether a served model name (`/v1/models` id, or `--model`) names `profile`'s target: its
/// profile name or its Hugging Face repository's name, compared without case or punctuation
/// (`moonshotai/Kimi-K2.6`, `kimi-k2.6`, `Kimi_K2.6-FP8` all name `kimi-k2.6`).
pub fn names_target(served: &str, profile: &crate::target::profile::Profile) -> bool {
    let s = key(served);
    let mut names = vec![key(&profile.name)];
    if let Some(h) = &profile.hf_id {
        names.push(key(h.rsplit('/').next().unwrap_or(h)));
    }
    names
        .iter()
        .any(|n| !n.is_empty() && s.contains(n.as_str()))
}

/// Whether a card's benchmark name is `bench` as a whole: the benchmark itself, or a named
/// subset of it that its prompt files are (SPEED-Bench's "qualitative subset" is the 880-prompt
/// split its `qualitative` files hold).
fn is_whole(card: &str, bench: &str) -> bool {
    card == bench
        || card
            .strip_prefix(bench)
            .is_some_and(|rest| rest.ends_with("subset") || rest.ends_with("split"))
}

/// The checks of `draft`'s figures in `profile` for benchmark `bench` (a [`benchmark_of`] key)
/// of one count: `overall` (accept length, prompts) and each category's, measurements of that
/// count (live, [`Count::Walk`]: the engine-walk figures; offline, [`Count::TeacherForced`]:
/// the all-positions AL; a card figure of the other count is held by the other). An error when
/// the profile quotes no such figure (the hint lists what it quotes).
pub fn checks_of(
    count: Count,
    profile: &Profile,
    draft: &str,
    bench: &str,
    overall: (f64, usize),
    per_category: &[(String, f64, usize)],
    max_regression: f64,
) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    for p in profile
        .published_accept_lengths
        .iter()
        .filter(|p| p.draft == draft && Count::of(p) == count)
    {
        let Some(v) = p.value() else { continue };
        let b = key(&p.benchmark);
        let (category, (measured, n)) = if is_whole(&b, bench) {
            (None, overall)
        } else if let Some((c, m, n)) = per_category
            .iter()
            .find(|(c, _, _)| b == format!("{bench}{}", key(c)))
        {
            (Some(c.clone()), (*m, *n))
        } else {
            continue;
        };
        out.push(Check {
            benchmark: p.benchmark.clone(),
            category,
            published: v,
            measured,
            n,
            source: p.source.clone(),
            passed: measured >= v - max_regression,
            count: count.field(),
        });
    }
    if out.is_empty() {
        let quoted: Vec<String> = profile
            .published_accept_lengths
            .iter()
            .map(|p| {
                format!(
                    "{} on {}{}",
                    p.draft,
                    p.benchmark,
                    match Count::of(p) {
                        Count::TeacherForced =>
                            " (offline teacher-forced: held offline, `verify --trace` on that benchmark's prompts)",
                        Count::Walk => " (an engine's: held live, `verify --endpoint`)",
                    }
                )
            })
            .collect();
        let what = match count {
            Count::Walk => "",
            Count::TeacherForced => "offline teacher-forced ",
        };
        return Err(Error::Flags {
            msg: format!(
                "target `{}` quotes no {what}accept length for `{draft}` on this prompt set ({bench})",
                profile.name
            ),
            hint: if quoted.is_empty() {
                "this profile quotes no published accept length (`kquant targets`)".into()
            } else {
                format!("it quotes: {}; send that benchmark's prompts (--prompt-format) or leave --published out", quoted.join(", "))
            },
        });
    }
    Ok(out)
}

/// The gate's reason for a failed check.
pub fn reason(c: &Check, draft: &str, max_regression: f64) -> String {
    format!(
        "{}: {} {:.4} is below {draft}'s published {} on {} by more than {max_regression} ({})",
        c.category.as_deref().unwrap_or("overall"),
        if c.count == Count::TeacherForced.field() {
            "all-positions accept length (teacher-forced)"
        } else {
            "accept length"
        },
        c.measured,
        c.published,
        c.benchmark,
        c.source
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_match_by_benchmark_and_category_whatever_their_spelling() {
        let p = crate::target::profile::load("kimi-k2.6").unwrap();
        let cats = vec![
            ("coding".to_string(), 2.80, 10),
            ("writing".to_string(), 2.50, 10),
        ];
        let c = checks_of(
            Count::Walk,
            &p,
            "nvidia/Kimi-K2.6-Eagle3",
            "mtbench",
            (2.60, 80),
            &cats,
            0.03,
        )
        .unwrap();
        let by = |cat: Option<&str>| c.iter().find(|x| x.category.as_deref() == cat).unwrap();
        assert_eq!(
            (by(None).published, by(None).passed),
            (2.62, true),
            "2.60 ≥ 2.62 − 0.03"
        );
        assert_eq!(
            (by(Some("coding")).published, by(Some("coding")).passed),
            (2.84, false)
        );
        assert!(by(Some("writing")).passed);
        assert_eq!(c.len(), 3, "no card figure for the other categories");
        let e = checks_of(
            Count::Walk,
            &p,
            "nvidia/Kimi-K2.6-Eagle3",
            "gsm8k",
            (3.0, 5),
            &[],
            0.03,
        )
        .unwrap_err();
        assert!(e.hint().unwrap().contains("MT-Bench"), "{e}");
        let k25 = crate::target::profile::load("kimi-k2.5").unwrap();
        let c = checks_of(
            Count::Walk,
            &k25,
            "lightseekorg/kimi-k2.5-eagle3-mla",
            "math500",
            (3.0, 5),
            &[],
            0.03,
        )
        .unwrap();
        assert_eq!((c[0].published, c[0].passed), (3.051, false));
    }
}
