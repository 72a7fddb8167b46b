//! A prompt file read: JSON Lines, the format detected (or named), each record read by its
//! format's reader, ids unique; and the first N prompts of each category.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::fields::{kind, Fit, Record};
use super::format::{detect, is_spec_bench, SetFormat, FORMATS};
use super::prompt::LivePrompt;
use super::{benchmarks, plain, tokens};
use crate::error::{Error, Result};

/// The hint of a line that is not a JSON object.
const JSONL_HINT: &str = "a prompt file is JSON Lines: one JSON object per line, UTF-8; a JSON array or a parquet/arrow file must be converted to jsonl first";

/// Read `path` as `format` (Auto: detected). Returns the format used and the prompts in file order.
pub fn read(path: &Path, format: SetFormat) -> Result<(SetFormat, Vec<LivePrompt>)> {
    let file = crate::io::text::open_regular(path, crate::io::text::MAX_PROMPTS, "prompt file")?;
    let mut reader = std::io::BufReader::new(file);
    let mut used = format;
    let mut detected_at = 0usize;
    let mut out: Vec<LivePrompt> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut buf = Vec::new();
    let mut line = 0usize;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| Error::io("read", path, e))?;
        if n == 0 {
            break;
        }
        line += 1;
        let at = at(path, line);
        let bytes = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        let bytes = match line {
            1 => bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes),
            _ => bytes,
        };
        let text = std::str::from_utf8(bytes)
            .map_err(|e| Error::source(&at, format!("is not UTF-8 ({e})")).with_hint(JSONL_HINT))?;
        if text.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::source(&at, format!("is not JSON: {e}")).with_hint(JSONL_HINT))?;
        let Value::Object(rec) = v else {
            return Err(
                Error::source(&at, format!("is not a JSON object (it is {})", kind(&v)))
                    .with_hint(JSONL_HINT),
            );
        };
        if used == SetFormat::Auto {
            used = detect(&rec).ok_or_else(|| {
                let mut keys: Vec<String> = rec.keys().take(8).map(|k| format!("`{k}`")).collect();
                if rec.len() > keys.len() {
                    keys.push("…".into());
                }
                let keys = if keys.is_empty() {
                    "it has no keys".to_string()
                } else {
                    format!("its keys: {}", keys.join(", "))
                };
                Error::source(&at, format!("fits none of the prompt formats ({keys})"))
                    .with_hint(FORMATS)
            })?;
            detected_at = line;
        }
        let p = parse(used, &Record(&rec), line).map_err(|bad| {
            let how = match format {
                SetFormat::Auto => format!(
                    "line {detected_at} looks like {}, so every record is read as one; name the format with --prompt-format if it is another",
                    used.name()
                ),
                _ => format!("--prompt-format {} was given", used.name()),
            };
            let hint = match bad.hint {
                Some(h) => h,
                None => format!("{}; {how}", used.shape()),
            };
            Error::source(&at, bad.msg).with_hint(hint)
        })?;
        if let Some(first) = seen.insert(p.id.clone(), line) {
            return Err(Error::source(
                &at,
                format!("id `{}` appears twice (first on line {first})", p.id),
            )
            .with_hint("each prompt needs its own id (a record without one is numbered by its line); renumber or remove the duplicate"));
        }
        out.push(p);
    }
    if out.is_empty() {
        return Err(
            Error::source(path, "has no prompts: nothing to measure").with_hint(match format {
                SetFormat::Auto => FORMATS.to_string(),
                f => format!("{}, one per line", f.shape()),
            }),
        );
    }
    if format == SetFormat::Auto && used == SetFormat::MtBench && is_spec_bench(&out) {
        used = SetFormat::SpecBench;
        for p in &mut out {
            p.dataset = used.name().into();
        }
    }
    Ok((used, out))
}

/// Indices of the first `limit` prompts of each category, in file order (all when None).
pub fn per_category(prompts: &[LivePrompt], limit: Option<usize>) -> Vec<usize> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    prompts
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            let n = counts.entry(p.category.as_str()).or_default();
            *n += 1;
            limit.is_none_or(|l| *n <= l)
        })
        .map(|(i, _)| i)
        .collect()
}

/// `FILE:LINE`, the path of an error about one record.
fn at(path: &Path, line: usize) -> PathBuf {
    PathBuf::from(format!("{}:{}", path.display(), line))
}

/// One record read as `format` (not `Auto`), by the format's reader.
fn parse(format: SetFormat, r: &Record, line: usize) -> Fit<LivePrompt> {
    let name = format.name().to_string();
    match format {
        SetFormat::Auto => unreachable!("read resolves Auto before parsing"),
        SetFormat::MtBench | SetFormat::SpecBench => benchmarks::mt_bench(r, line, name),
        SetFormat::SpeedBench => benchmarks::speed_bench(r, line, name),
        SetFormat::Gsm8k => benchmarks::gsm8k(r, line, name),
        SetFormat::Math500 => benchmarks::math500(r, line, name),
        SetFormat::Humaneval => benchmarks::humaneval(r, name),
        SetFormat::Plain => plain::plain(r, line, name),
        SetFormat::Tokens => tokens::tokens(r, line, name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::prompt_sets::prompt::Body;
    use serde_json::json;
    use std::io::Write;

    /// A prompt file in a temp dir with these lines.
    fn file(lines: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prompts.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
        (dir, path)
    }

    fn read_lines(lines: &[&str], format: SetFormat) -> Result<(SetFormat, Vec<LivePrompt>)> {
        let (_dir, path) = file(lines);
        read(&path, format)
    }

    fn user_msg(s: &str) -> Body {
        Body::Messages(vec![json!({"role": "user", "content": s})])
    }

    /// The error for `lines` read as `format`: it names `FILE:LINE` (or the file when `line` is
    /// 0), says `msg` and carries a hint containing `hint`.
    #[track_caller]
    fn fails(lines: &[&str], format: SetFormat, line: usize, msg: &str, hint: &str) {
        let (_dir, path) = file(lines);
        let e = read(&path, format).expect_err("the file should be refused");
        let Error::Source {
            path: p,
            msg: m,
            hint: h,
        } = &e
        else {
            panic!("not a Source error: {e:?}")
        };
        let want = match line {
            0 => path.clone(),
            l => at(&path, l),
        };
        assert_eq!(p, &want, "{e}");
        assert!(
            e.to_string().contains(&format!("`{}`", want.display())),
            "{e}"
        );
        assert!(m.contains(msg), "message {m:?} lacks {msg:?}");
        let h = h.as_deref().expect("a hint");
        assert!(h.contains(hint), "hint {h:?} lacks {hint:?}");
    }

    const MT1: &str = r#"{"question_id": 81, "category": "writing", "turns": ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions.", "Rewrite your previous response. Start every sentence with the letter A."]}"#;
    const MT2: &str = r#"{"question_id": 101, "category": "reasoning", "turns": ["Imagine you are participating in a race with a group of people. If you have just overtaken the second person, what's your current position? Where is the person you just overtook?", "If the \"second person\" is changed to \"last person\" in the above question, what would the answer be?"], "reference": ["You are in second place.", "Uncertain."]}"#;
    const MT3: &str = r#"{"question_id": 121, "category": "coding", "turns": ["Develop a Python program that reads all the text files under a directory and returns top-5 words with the most number of occurrences.", "Can you parallelize it?"], "reference": ["Can be simple solutions like using Counter", ""]}"#;
    const SPEC_TR: &str = r#"{"question_id": 161, "category": "translation", "turns": ["Translate German to English: Die Katze sitzt auf der Matte."]}"#;
    const SPEC_RAG: &str = r#"{"question_id": 401, "category": "rag", "turns": ["Based on the following passages, answer: who wrote Hamlet?\nPassage 1: ..."]}"#;
    const GSM1: &str = r#"{"question": "Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?", "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18"}"#;
    const GSM2: &str = r#"{"question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?", "answer": "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is 2+1=<<2+1=3>>3 bolts of fabric\n#### 3"}"#;
    const MATH1: &str = r#"{"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$", "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$ ...", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2, "unique_id": "test/precalculus/807.json"}"#;
    const MATH2: &str = r#"{"problem": "What is the smallest positive perfect cube that can be written as the sum of three consecutive integers?", "solution": "The sum of three consecutive integers ... $\\boxed{27}$.", "answer": "27", "subject": "Number Theory", "level": 3, "unique_id": "test/number_theory/515.json"}"#;
    const HE0: &str = r#"{"task_id": "HumanEval/0", "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n    \"\"\" Check if in given list of numbers, are any two numbers closer to each other than\n    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    \"\"\"\n", "canonical_solution": "    for idx, elem in enumerate(numbers):\n        ...\n    return False\n", "test": "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n", "entry_point": "has_close_elements"}"#;
    const HE1: &str = r#"{"task_id": "HumanEval/1", "prompt": "from typing import List\n\n\ndef separate_paren_groups(paren_string: str) -> List[str]:\n    \"\"\" Input to this function is a string containing multiple groups of nested parentheses.\n    \"\"\"\n", "canonical_solution": "    result = []\n    ...\n", "test": "\n\ndef check(candidate):\n    pass\n", "entry_point": "separate_paren_groups"}"#;

    /// A record that fits `format`.
    fn good(format: SetFormat) -> &'static str {
        match format {
            SetFormat::MtBench | SetFormat::SpecBench => MT1,
            SetFormat::SpeedBench => r#"{"category": "qa", "turns": ["Why?"]}"#,
            SetFormat::Gsm8k => GSM1,
            SetFormat::Math500 => MATH1,
            SetFormat::Humaneval => HE0,
            SetFormat::Plain => r#"{"prompt": "ok"}"#,
            SetFormat::Tokens => r#"{"tokens": [1]}"#,
            SetFormat::Auto => unreachable!(),
        }
    }

    #[test]
    fn mt_bench_first_turn_as_a_user_message() {
        let (f, p) = read_lines(&[MT1, MT2, MT3], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::MtBench);
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].id, "81");
        assert_eq!(p[0].category, "writing");
        assert_eq!(p[0].dataset, "mt-bench");
        assert_eq!(p[0].body, user_msg("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions."));
        assert_eq!(
            p.iter().map(|p| p.category.as_str()).collect::<Vec<_>>(),
            ["writing", "reasoning", "coding"]
        );
    }

    #[test]
    fn spec_bench_detected_by_its_own_categories() {
        let (f, p) = read_lines(&[MT1, SPEC_TR, SPEC_RAG], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::SpecBench);
        assert!(p.iter().all(|p| p.dataset == "spec-bench"));
        assert_eq!(p[1].category, "translation");
        assert_eq!(
            p[1].body,
            user_msg("Translate German to English: Die Katze sitzt auf der Matte.")
        );
        // A category outside Spec-Bench's set: MT-Bench-shaped, read as mt-bench.
        let other = r#"{"question_id": 7, "category": "poetry", "turns": ["Write a haiku."]}"#;
        let (f, _) = read_lines(&[SPEC_TR, other], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::MtBench);
        // Only MT-Bench's categories: named spec-bench, labelled so.
        let (f, p) = read_lines(&[MT1, MT2], SetFormat::SpecBench).unwrap();
        assert_eq!(f, SetFormat::SpecBench);
        assert_eq!(p[0].dataset, "spec-bench");
    }

    #[test]
    fn speed_bench_turns_and_messages() {
        // SPEED-Bench's own layout (question_id a string, with sub_category, multiturn, …).
        let q1 = r#"{"question_id": "coding_0001", "category": "coding", "sub_category": "python", "turns": ["Write a function that merges two sorted lists."], "source": "x", "src_id": "12", "difficulty": "medium", "multiturn": false}"#;
        let q2 = r#"{"question_id": "math_0003", "category": "math", "sub_category": "algebra", "turns": ["Solve x^2 = 4.", "Now x^3 = 8."], "source": "y", "src_id": "4", "difficulty": "easy", "multiturn": true}"#;
        let (f, p) = read_lines(&[q1, q2], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::SpeedBench);
        assert_eq!(p[0].id, "coding_0001");
        assert_eq!(p[1].category, "math");
        assert_eq!(p[1].body, user_msg("Solve x^2 = 4."));
        assert_eq!(p[1].dataset, "speed-bench");
        // Messages with a category, no question_id.
        let m1 = r#"{"category": "rag", "messages": [{"role": "system", "content": "Answer from the passages."}, {"role": "user", "content": "Passage: …\nQuestion: who?", "name": "u"}]}"#;
        let m2 = r#"{"category": "multilingual", "messages": [{"role": "user", "content": "Traduis: bonjour"}]}"#;
        let (f, p) = read_lines(&[m1, m2], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::SpeedBench);
        assert_eq!((p[0].id.as_str(), p[1].id.as_str()), ("1", "2"));
        assert_eq!(
            p[0].body,
            Body::Messages(vec![
                json!({"role": "system", "content": "Answer from the passages."}),
                json!({"role": "user", "content": "Passage: …\nQuestion: who?"}),
            ])
        );
        // turns + category without question_id.
        let t = r#"{"category": "qa", "turns": ["Why is the sky blue?"]}"#;
        let (f, p) = read_lines(&[t], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::SpeedBench);
        assert_eq!(p[0].body, user_msg("Why is the sky blue?"));
    }

    #[test]
    fn gsm8k_question_zero_shot() {
        let (f, p) = read_lines(&[GSM1, "", GSM2], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::Gsm8k);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].id.as_str(), p[1].id.as_str()), ("1", "3"));
        assert!(p
            .iter()
            .all(|p| p.category == "gsm8k" && p.dataset == "gsm8k"));
        assert_eq!(p[1].body, user_msg("A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?"));
    }

    #[test]
    fn math500_problem_and_subject() {
        let no_subject = r#"{"problem": "Compute $1+1$.", "answer": "2"}"#;
        let (f, p) = read_lines(&[MATH1, MATH2, no_subject], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::Math500);
        assert_eq!(p[0].id, "test/precalculus/807.json");
        assert_eq!(p[0].category, "Precalculus");
        assert_eq!(p[1].category, "Number Theory");
        assert_eq!((p[2].id.as_str(), p[2].category.as_str()), ("3", "math500"));
        assert_eq!(p[1].body, user_msg("What is the smallest positive perfect cube that can be written as the sum of three consecutive integers?"));
    }

    #[test]
    fn humaneval_prompt_as_raw_text() {
        let (f, p) = read_lines(&[HE0, HE1], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::Humaneval);
        assert_eq!(p[0].id, "HumanEval/0");
        assert_eq!(p[1].id, "HumanEval/1");
        assert_eq!(p[0].category, "humaneval");
        let Body::Text(t) = &p[0].body else {
            panic!("{:?}", p[0].body)
        };
        assert!(t.starts_with("from typing import List\n\n\ndef has_close_elements("));
        assert!(t.ends_with("    \"\"\"\n"));
    }

    #[test]
    fn plain_text_and_messages() {
        let (f, p) = read_lines(
            &[
                r#"{"id": "a", "prompt": "Once upon a time", "category": "story", "dataset": "mine"}"#,
                r#"{"text": "def main():"}"#,
                r#"{"messages": [{"role": "user", "content": "Hi"}], "id": 7}"#,
            ],
            SetFormat::Auto,
        )
        .unwrap();
        assert_eq!(f, SetFormat::Plain);
        assert_eq!(p[0].id, "a");
        assert_eq!(p[0].body, Body::Text("Once upon a time".into()));
        assert_eq!(
            (p[0].category.as_str(), p[0].dataset.as_str()),
            ("story", "mine")
        );
        assert_eq!(
            (
                p[1].id.as_str(),
                p[1].category.as_str(),
                p[1].dataset.as_str()
            ),
            ("2", "", "plain")
        );
        assert_eq!(p[1].body, Body::Text("def main():".into()));
        assert_eq!(p[2].id, "7");
        assert_eq!(p[2].body, user_msg("Hi"));
    }

    #[test]
    fn tokens_records() {
        let (f, p) = read_lines(
            &[
                r#"{"id": 0, "category": "code", "dataset": "heldout", "turn": 0, "text": "x = 1", "tokens": [87, 284, 220, 16]}"#,
                r#"{"id": 1, "prompt_ids": [1, 4294967295]}"#,
                r#"{"input_ids": [5]}"#,
            ],
            SetFormat::Auto,
        )
        .unwrap();
        assert_eq!(f, SetFormat::Tokens);
        assert_eq!(p[0].body, Body::Tokens(vec![87, 284, 220, 16]));
        assert_eq!(
            (
                p[0].id.as_str(),
                p[0].category.as_str(),
                p[0].dataset.as_str()
            ),
            ("0", "code", "heldout")
        );
        assert_eq!(p[1].body, Body::Tokens(vec![1, u32::MAX]));
        assert_eq!(
            (p[1].category.as_str(), p[1].dataset.as_str()),
            ("", "tokens")
        );
        assert_eq!(
            (p[2].id.as_str(), p[2].body.clone()),
            ("3", Body::Tokens(vec![5]))
        );
    }

    #[test]
    fn the_repo_heldout_prompts_read_as_tokens() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl");
        let (f, p) = read(&path, SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::Tokens);
        assert_eq!(p.len(), 60);
        assert!(p.iter().all(|p| !p.category.is_empty()));
        assert!(p
            .iter()
            .all(|p| matches!(&p.body, Body::Tokens(t) if !t.is_empty())));
        // The same rules as the capture reader: the same token ids, in the same order.
        let captured = crate::trace::capture::read_prompts(&path).unwrap();
        assert_eq!(captured.len(), p.len());
        for (c, l) in captured.iter().zip(&p) {
            assert_eq!(Body::Tokens(c.tokens.clone()), l.body);
            assert_eq!(c.category, l.category);
            assert_eq!(c.id.to_string(), l.id);
        }
        // Named explicitly, the same; as plain, its `text`.
        let (f, q) = read(&path, SetFormat::Tokens).unwrap();
        assert_eq!((f, q), (SetFormat::Tokens, p));
        let (f, q) = read(&path, SetFormat::Plain).unwrap();
        assert_eq!(f, SetFormat::Plain);
        assert!(matches!(&q[0].body, Body::Text(t) if !t.is_empty()));
    }

    #[test]
    fn an_explicit_format_overrides_detection() {
        // MT-Bench records read as speed-bench.
        let (f, p) = read_lines(&[MT1, MT2], SetFormat::SpeedBench).unwrap();
        assert_eq!(f, SetFormat::SpeedBench);
        assert_eq!(
            (p[0].id.as_str(), p[0].dataset.as_str()),
            ("81", "speed-bench")
        );
        // A Spec-Bench file named mt-bench stays mt-bench.
        let (f, p) = read_lines(&[SPEC_TR, SPEC_RAG], SetFormat::MtBench).unwrap();
        assert_eq!(f, SetFormat::MtBench);
        assert_eq!(p[0].dataset, "mt-bench");
        // A HumanEval file read as plain: its prompt as text, numbered by line.
        let (f, p) = read_lines(&[HE0], SetFormat::Plain).unwrap();
        assert_eq!(f, SetFormat::Plain);
        assert_eq!(p[0].id, "1");
        assert!(matches!(&p[0].body, Body::Text(t) if t.starts_with("from typing")));
        // A bare `problem` (no solution/answer) is math500 only when named.
        let bare = r#"{"problem": "Compute 2+2."}"#;
        fails(
            &[bare],
            SetFormat::Auto,
            1,
            "fits none of the prompt formats",
            "--prompt-format",
        );
        let (f, p) = read_lines(&[bare], SetFormat::Math500).unwrap();
        assert_eq!((f, p[0].category.as_str()), (SetFormat::Math500, "math500"));
        // A record that does not fit the named format is refused.
        fails(
            &[GSM1],
            SetFormat::MtBench,
            1,
            "has no `question_id`",
            "--prompt-format mt-bench was given",
        );
    }

    #[test]
    fn every_record_must_fit_the_detected_format() {
        fails(
            &[MT1, GSM1],
            SetFormat::Auto,
            2,
            "has no `question_id`",
            "line 1 looks like mt-bench",
        );
        fails(
            &[GSM1, "", MATH1],
            SetFormat::Auto,
            3,
            "has no `question`",
            "a gsm8k record is",
        );
        fails(
            &[HE0, r#"{"task_id": "HumanEval/1", "prompt": "def f():"}"#],
            SetFormat::Auto,
            2,
            "has no `entry_point`",
            "humaneval",
        );
    }

    #[test]
    fn lines_that_are_not_json_objects() {
        let (dir, _) = file(&[]);
        let path = dir.path().join("bin.jsonl");
        std::fs::write(&path, [MT1.as_bytes(), b"\n\xff\xfe{}\n"].concat()).unwrap();
        let e = read(&path, SetFormat::Auto).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("`{}:2`: is not UTF-8", path.display())),
            "{e}"
        );
        assert!(e.hint().unwrap().contains("JSON Lines"));
        fails(
            &[MT1, "{\"question_id\": 82,"],
            SetFormat::Auto,
            2,
            "is not JSON",
            "JSON Lines",
        );
        fails(
            &["[1, 2]"],
            SetFormat::Auto,
            1,
            "is not a JSON object (it is a list)",
            "JSON Lines",
        );
        fails(
            &[GSM1, "\"text\""],
            SetFormat::Auto,
            2,
            "is not a JSON object (it is a string)",
            "JSON Lines",
        );
        // A UTF-8 byte-order mark and CRLF line ends are read.
        std::fs::write(&path, format!("\u{feff}{GSM1}\r\n{GSM2}\r\n")).unwrap();
        assert_eq!(read(&path, SetFormat::Auto).unwrap().1.len(), 2);
    }

    #[test]
    fn empty_files_have_nothing_to_measure() {
        fails(
            &[],
            SetFormat::Auto,
            0,
            "nothing to measure",
            "--prompt-format",
        );
        fails(
            &["", "  ", "\t"],
            SetFormat::Tokens,
            0,
            "nothing to measure",
            "a tokens record is",
        );
    }

    #[test]
    fn a_file_that_fits_no_format() {
        fails(
            &[r#"{"instruction": "Summarize.", "input": "…", "output": "…"}"#],
            SetFormat::Auto,
            1,
            "fits none of the prompt formats (its keys: `instruction`, `input`, `output`)",
            "name one with --prompt-format",
        );
        fails(
            &["{}"],
            SetFormat::Auto,
            1,
            "it has no keys",
            "mt-bench and spec-bench",
        );
        // null counts as absent.
        fails(
            &[r#"{"prompt": null}"#],
            SetFormat::Auto,
            1,
            "fits none",
            "plain",
        );
    }

    #[test]
    fn missing_empty_and_wrong_typed_fields() {
        let cases: &[(SetFormat, &[(&str, &str)])] = &[
            (
                SetFormat::MtBench,
                &[
                    (
                        r#"{"question_id": 81, "turns": ["a"]}"#,
                        "has no `category`",
                    ),
                    (
                        r#"{"question_id": 81, "category": "", "turns": ["a"]}"#,
                        "`category` is empty",
                    ),
                    (
                        r#"{"question_id": 81, "category": 3, "turns": ["a"]}"#,
                        "`category` is not a string (it is a number)",
                    ),
                    (
                        r#"{"question_id": 81, "category": "math", "turns": "a"}"#,
                        "`turns` is not a list of strings (it is a string)",
                    ),
                    (
                        r#"{"question_id": 81, "category": "math", "turns": []}"#,
                        "`turns` is empty",
                    ),
                    (
                        r#"{"question_id": 81, "category": "math", "turns": ["", "b"]}"#,
                        "the first turn is empty",
                    ),
                    (
                        r#"{"question_id": 81, "category": "math", "turns": ["a", 2]}"#,
                        "turn 1 is not a string (it is a number)",
                    ),
                    (
                        r#"{"question_id": 81, "category": "math"}"#,
                        "has no `turns`",
                    ),
                    (
                        r#"{"question_id": 1.5, "category": "math", "turns": ["a"]}"#,
                        "`question_id` is not an integer or a string (it is a number)",
                    ),
                    (
                        r#"{"question_id": "", "category": "math", "turns": ["a"]}"#,
                        "`question_id` is empty",
                    ),
                    (
                        r#"{"question_id": [1], "category": "math", "turns": ["a"]}"#,
                        "(it is a list)",
                    ),
                ],
            ),
            (
                SetFormat::Gsm8k,
                &[
                    (
                        r#"{"question": "", "answer": "It is 1. #### 1"}"#,
                        "`question` is empty",
                    ),
                    (
                        r#"{"question": "q?", "answer": 1}"#,
                        "`answer` is not a string",
                    ),
                    (r#"{"question": "q?"}"#, "has no `answer`"),
                ],
            ),
            (
                SetFormat::Math500,
                &[
                    (
                        r#"{"problem": "p", "subject": 4}"#,
                        "`subject` is not a string",
                    ),
                    (
                        r#"{"problem": "p", "solution": ["s"]}"#,
                        "`solution` is not a string",
                    ),
                    (
                        r#"{"problem": "p", "unique_id": {}}"#,
                        "`unique_id` is not an integer or a string (it is an object)",
                    ),
                ],
            ),
            (
                SetFormat::Humaneval,
                &[
                    (
                        r#"{"task_id": "HumanEval/0", "prompt": " \n", "entry_point": "f"}"#,
                        "`prompt` is empty",
                    ),
                    (
                        r#"{"prompt": "def f():", "entry_point": "f"}"#,
                        "has no `task_id`",
                    ),
                ],
            ),
            (
                SetFormat::Plain,
                &[
                    (r#"{"prompt": ""}"#, "`prompt` is empty"),
                    (r#"{"text": 5}"#, "`text` is not a string (it is a number)"),
                    (
                        r#"{"prompt": "a", "text": "b"}"#,
                        "has `prompt` and `text`; give one",
                    ),
                    (
                        r#"{"prompt": "a", "category": 1}"#,
                        "`category` is not a string",
                    ),
                    (
                        r#"{"prompt": "a", "dataset": false}"#,
                        "`dataset` is not a string (it is a boolean)",
                    ),
                ],
            ),
            (
                SetFormat::SpeedBench,
                &[
                    (r#"{"category": "qa"}"#, "has no `messages` (or `turns`)"),
                    (
                        r#"{"category": "qa", "turns": ["a"], "messages": []}"#,
                        "has both `messages` and `turns`",
                    ),
                    (
                        r#"{"messages": [{"role": "user", "content": "a"}]}"#,
                        "has no `category`",
                    ),
                ],
            ),
        ];
        for (format, records) in cases {
            for (rec, msg) in *records {
                fails(&[good(*format), rec], *format, 2, msg, format.name());
            }
        }
    }

    #[test]
    fn bad_messages() {
        let cases = [
            (r#"{"messages": []}"#, "`messages` is empty"),
            (
                r#"{"messages": {"role": "user"}}"#,
                "`messages` is not a list of messages (it is an object)",
            ),
            (
                r#"{"messages": ["hi"]}"#,
                "message 0 is not a JSON object (it is a string)",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}"#,
                "message 1 has no `role`",
            ),
            (
                r#"{"messages": [{"role": "", "content": "b"}]}"#,
                "message 0: `role` is empty",
            ),
            (
                r#"{"messages": [{"role": 1, "content": "b"}]}"#,
                "message 0: `role` is not a string (it is a number)",
            ),
            (
                r#"{"messages": [{"role": "user"}]}"#,
                "message 0 has no `content`",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}"#,
                "message 0: `content` is not a string (it is a list)",
            ),
        ];
        for (rec, msg) in cases {
            fails(
                &[r#"{"prompt": "ok"}"#, rec],
                SetFormat::Auto,
                2,
                msg,
                "chat messages are",
            );
            let with_category = rec.replacen('{', r#"{"category": "qa", "#, 1);
            fails(
                &[&with_category],
                SetFormat::SpeedBench,
                1,
                msg,
                "chat messages are",
            );
        }
    }

    #[test]
    fn bad_token_ids() {
        let cases = [
            (
                r#"{"tokens": [1, -2]}"#,
                "`tokens`[1] = -2 is not a token id",
            ),
            (
                r#"{"tokens": [4294967296]}"#,
                "`tokens`[0] = 4294967296 is not a token id",
            ),
            (
                r#"{"prompt_ids": [1.0]}"#,
                "`prompt_ids`[0] = 1.0 is not a token id",
            ),
            (
                r#"{"input_ids": ["7"]}"#,
                "`input_ids`[0] = \"7\" is not a token id",
            ),
            (r#"{"tokens": []}"#, "`tokens` is empty"),
            (
                r#"{"tokens": "1 2 3"}"#,
                "`tokens` is not a list of token ids (it is a string)",
            ),
            (
                r#"{"tokens": [1], "id": true}"#,
                "`id` is not an integer or a string",
            ),
            (
                r#"{"tokens": [1], "category": 2}"#,
                "`category` is not a string",
            ),
        ];
        for (rec, msg) in cases {
            fails(
                &[r#"{"tokens": [1]}"#, rec],
                SetFormat::Auto,
                2,
                msg,
                "a tokens record is",
            );
        }
        // Text where ids are expected: tokenize first (or send it as plain).
        fails(
            &[r#"{"tokens": [1]}"#, r#"{"text": "hello"}"#],
            SetFormat::Auto,
            2,
            "has text but no token ids",
            "kquant trace prompts",
        );
        fails(
            &[r#"{"id": 3}"#],
            SetFormat::Tokens,
            1,
            "has no `tokens` / `prompt_ids` / `input_ids` array",
            "a tokens record is",
        );
        // Ids where text is expected: name tokens.
        fails(
            &[r#"{"tokens": [1]}"#],
            SetFormat::Plain,
            1,
            "has token ids but no",
            "--prompt-format tokens",
        );
    }

    #[test]
    fn duplicate_ids() {
        fails(
            &[MT1, MT2, MT1],
            SetFormat::Auto,
            3,
            "id `81` appears twice (first on line 1)",
            "its own id",
        );
        fails(
            &[HE0, HE0],
            SetFormat::Auto,
            2,
            "id `HumanEval/0` appears twice",
            "its own id",
        );
        // An explicit id equal to another record's line number.
        fails(
            &[r#"{"prompt": "a"}"#, r#"{"prompt": "b", "id": "1"}"#],
            SetFormat::Auto,
            2,
            "id `1` appears twice (first on line 1)",
            "numbered by its line",
        );
        // 81 and "81" are the same id.
        fails(
            &[
                MT1,
                r#"{"question_id": "81", "category": "math", "turns": ["a"]}"#,
            ],
            SetFormat::Auto,
            2,
            "appears twice",
            "its own id",
        );
    }

    #[test]
    fn the_first_n_of_each_category() {
        let p = |category: &str| LivePrompt {
            id: String::new(),
            category: category.into(),
            dataset: "plain".into(),
            body: Body::Text("x".into()),
        };
        let prompts = ["a", "b", "a", "c", "a", "b", ""].map(p);
        assert_eq!(per_category(&prompts, None), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(per_category(&prompts, Some(1)), [0, 1, 3, 6]);
        assert_eq!(per_category(&prompts, Some(2)), [0, 1, 2, 3, 5, 6]);
        assert_eq!(per_category(&prompts, Some(0)), Vec::<usize>::new());
        assert_eq!(per_category(&[], Some(3)), Vec::<usize>::new());
    }
}
