//! The benchmarks' readers, one per format: MT-Bench and Spec-Bench (`question_id`,
//! `category`, `turns`: the first turn as a user message), SPEED-Bench (chat `messages` or the
//! first turn), GSM8K (the question), MATH-500 (the problem, per subject) and HumanEval (the
//! prompt as raw text to continue).

use super::fields::{Fit, Record};
use super::prompt::{user, Body, LivePrompt};

/// An MT-Bench or Spec-Bench record (`name` the format's).
pub(super) fn mt_bench(r: &Record, line: usize, name: String) -> Fit<LivePrompt> {
    if !r.has("question_id") {
        return Err("has no `question_id`".to_string().into());
    }
    Ok(LivePrompt {
        id: r.id(&["question_id"], line)?,
        category: r.req_text("category")?.into(),
        dataset: name,
        body: user(&r.first_turn()?),
    })
}

/// A SPEED-Bench record: chat `messages`, or `turns` of which the first is sent.
pub(super) fn speed_bench(r: &Record, line: usize, name: String) -> Fit<LivePrompt> {
    let body = match (r.has("messages"), r.has("turns")) {
        (true, true) => {
            return Err("has both `messages` and `turns`; give one"
                .to_string()
                .into())
        }
        (true, false) => Body::Messages(r.messages()?),
        (false, true) => user(&r.first_turn()?),
        (false, false) => return Err("has no `messages` (or `turns`)".to_string().into()),
    };
    Ok(LivePrompt {
        id: r.id(&["question_id", "id"], line)?,
        category: r.req_text("category")?.into(),
        dataset: name,
        body,
    })
}

/// A GSM8K record: the question, zero-shot.
pub(super) fn gsm8k(r: &Record, line: usize, name: String) -> Fit<LivePrompt> {
    let question = r.req_text("question")?;
    r.req_str("answer")?;
    Ok(LivePrompt {
        id: r.id(&["id"], line)?,
        category: name.clone(),
        dataset: name,
        body: user(question),
    })
}

/// A MATH-500 record: the problem; the category is the subject.
pub(super) fn math500(r: &Record, line: usize, name: String) -> Fit<LivePrompt> {
    let problem = r.req_text("problem")?;
    r.opt_str("solution")?;
    let category = match r.opt_str("subject")? {
        Some(s) if !s.trim().is_empty() => s.to_string(),
        _ => name.clone(),
    };
    Ok(LivePrompt {
        id: r.id(&["unique_id", "id"], line)?,
        category,
        dataset: name,
        body: user(problem),
    })
}

/// A HumanEval record: the prompt, code to continue, as raw text.
pub(super) fn humaneval(r: &Record, name: String) -> Fit<LivePrompt> {
    let task = r.req_text("task_id")?.to_string();
    let prompt = r.req_text("prompt")?;
    r.req_text("entry_point")?;
    Ok(LivePrompt {
        id: task,
        category: name.clone(),
        dataset: name,
        body: Body::Text(prompt.into()),
    })
}
