//! `kquant verify-join LIVE OFFLINE`: a live verify report and an offline one joined per
//! request ("Reading a disagreement between live and offline", docs/verify.md): each prompt's
//! verify steps and committed drafts on both sides, the offline near-tie steps beside them,
//! and a verdict per request — `same`, `near-tie` (it differs, and the replay has a step a
//! near-tie decides: arithmetic can explain it), `unexplained` (it differs with no near-tie
//! step: a different model, prompt, text mode or stop) or `differs` (the offline report was
//! made without `--near-ties`). Requests are matched by id as a string: a live report's ids are
//! the prompt file's own (`test-0`, `HumanEval/0`, `81`), an offline report's the prompt
//! file's own id where its trace kept one (`prompt_id`: `trace capture` and `trace import
//! --prompts` keep an id that is not a whole number), else the trace's sample id (a number,
//! `81`, where the capture kept the prompt file's whole-number ids).

use serde_json::{json, Value};

/// The id of a request as the join matches it: a string as it is, a whole number in decimal.
fn id_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => n.as_u64().map(|n| n.to_string()),
        _ => None,
    }
}

/// One request's figures on one side.
#[derive(Debug, Clone, PartialEq)]
struct Figures {
    category: String,
    steps: u64,
    committed: u64,
    near_tie_steps: Option<u64>,
}

/// The requests of one report side, in order, each id once.
fn requests(list: &Value, what: &str) -> Result<Vec<(String, Figures)>, String> {
    let list = list
        .as_array()
        .ok_or_else(|| format!("{what} is not a list of requests"))?;
    let mut seen = std::collections::HashSet::new();
    list.iter()
        .enumerate()
        .map(|(i, r)| {
            let at = |m: &str| format!("{what}[{i}]: {m}");
            // An offline request whose trace kept the prompt file's own id (`prompt_id`: a
            // string such as `HumanEval/0`) is matched on it.
            let id = r
                .get("prompt_id")
                .and_then(Value::as_str)
                .map(String::from)
                .or_else(|| r.get("id").and_then(id_of))
                .ok_or_else(|| at("has no `id` (a string or a whole number)"))?;
            if !seen.insert(id.clone()) {
                return Err(at(&format!("id `{id}` appears twice")));
            }
            let count = |k: &str| {
                r.get(k)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| at(&format!("has no `{k}` count")))
            };
            Ok((
                id,
                Figures {
                    category: r
                        .get("category")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    steps: count("steps")?,
                    committed: count("committed")?,
                    near_tie_steps: r.get("near_tie_steps").and_then(Value::as_u64),
                },
            ))
        })
        .collect()
}

/// Join `live` (a `verify --endpoint --json` report) and `offline` (a `verify --trace --json`
/// report) on `side` (`draft` or `baseline`). `Err` says which report is not what it should be.
pub fn join(live: &Value, offline: &Value, side: &str) -> Result<Value, (usize, String)> {
    let l = live
        .pointer(&format!("/live/{side}/requests"))
        .ok_or((0, format!("is not a live verify report with a `live.{side}.requests` list (`verify --endpoint … --json FILE`{})", if side == "baseline" { " with --baseline-endpoint" } else { "" })))?;
    if offline.get("live").is_some_and(|v| !v.is_null()) {
        return Err((
            1,
            "is a live verify report; give the offline one (`verify --trace … --json FILE`)".into(),
        ));
    }
    let o = offline
        .pointer(&format!("/{side}/requests"))
        .ok_or((1, format!("is not an offline verify report with a `{side}.requests` list (`verify --trace … --json FILE`{})", if side == "baseline" { " with --baseline" } else { "" })))?;
    let l = requests(l, &format!("live.{side}.requests")).map_err(|e| (0, e))?;
    let o = requests(o, &format!("{side}.requests")).map_err(|e| (1, e))?;
    let by_id: std::collections::HashMap<&str, &Figures> =
        o.iter().map(|(id, f)| (id.as_str(), f)).collect();
    let ties_known = o.iter().any(|(_, f)| f.near_tie_steps.is_some());
    let (mut rows, mut only_live) = (Vec::new(), Vec::new());
    let (mut same, mut tie, mut unexplained, mut differs) = (0usize, 0usize, 0usize, 0usize);
    for (id, lf) in &l {
        let Some(of) = by_id.get(id.as_str()) else {
            only_live.push(id.clone());
            continue;
        };
        let verdict = if lf.steps == of.steps && lf.committed == of.committed {
            same += 1;
            "same"
        } else {
            match of.near_tie_steps {
                Some(0) => {
                    unexplained += 1;
                    "unexplained"
                }
                Some(_) => {
                    tie += 1;
                    "near-tie"
                }
                None => {
                    differs += 1;
                    "differs"
                }
            }
        };
        rows.push(json!({
            "id": id,
            "category": lf.category,
            "live": {"steps": lf.steps, "committed": lf.committed},
            "offline": {"steps": of.steps, "committed": of.committed, "near_tie_steps": of.near_tie_steps},
            "steps_delta": lf.steps as i128 - of.steps as i128,
            "committed_delta": lf.committed as i128 - of.committed as i128,
            "verdict": verdict,
        }));
    }
    let live_ids: std::collections::HashSet<&str> = l.iter().map(|(id, _)| id.as_str()).collect();
    let only_offline: Vec<&String> = o
        .iter()
        .map(|(id, _)| id)
        .filter(|id| !live_ids.contains(id.as_str()))
        .collect();
    Ok(json!({
        "schema": "kquant.verify-join/1",
        "side": side,
        "near_ties_known": ties_known,
        "joined": rows.len(),
        "same": same,
        "near_tie": tie,
        "unexplained": unexplained,
        "differs": differs,
        "requests": rows,
        "only_live": only_live,
        "only_offline": only_offline,
        "convention": "per request: steps = verify steps, committed = committed drafts (the gated count), live as the engine reported them, offline as the replay walked them; matched by id as a string; verdict: same, near-tie (differs, and the replay has a step a near-tie decides), unexplained (differs with no near-tie step: look for another model, prompt, text mode or stop), differs (the offline report has no near-tie figures: run it with --near-ties)",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_ids_match_and_verdicts_follow_the_near_ties() {
        let live = json!({"live": {"draft": {"requests": [
            {"id": "0", "category": "code", "steps": 10, "committed": 12},
            {"id": "1", "category": "code", "steps": 9, "committed": 13},
            {"id": "2", "category": "code", "steps": 8, "committed": 13},
            {"id": "HumanEval/0", "category": "humaneval", "steps": 5, "committed": 5}]}}});
        let offline = json!({"draft": {"requests": [
            {"id": 0, "steps": 10, "committed": 12, "near_tie_steps": 0},
            {"id": 1, "steps": 10, "committed": 12, "near_tie_steps": 2},
            {"id": 2, "steps": 9, "committed": 12, "near_tie_steps": 0},
            {"id": 3, "steps": 9, "committed": 12, "near_tie_steps": 0}]}});
        let j = join(&live, &offline, "draft").unwrap();
        assert_eq!(
            (
                j["joined"].clone(),
                j["same"].clone(),
                j["near_tie"].clone(),
                j["unexplained"].clone()
            ),
            (json!(3), json!(1), json!(1), json!(1))
        );
        assert_eq!(j["only_live"], json!(["HumanEval/0"]));
        assert_eq!(j["only_offline"], json!(["3"]));
        assert_eq!(j["requests"][1]["steps_delta"], json!(-1));
        // Either report swapped, or a duplicate id: refused, naming which.
        assert_eq!(join(&offline, &live, "draft").unwrap_err().0, 0);
        assert_eq!(join(&live, &live, "draft").unwrap_err().0, 1);
        let mut dup = live.clone();
        dup["live"]["draft"]["requests"][1]["id"] = json!("0");
        assert!(join(&dup, &offline, "draft")
            .unwrap_err()
            .1
            .contains("twice"));
        // A trace that kept the prompt file's string id (`prompt_id`) lines up on it.
        let mut kept = offline.clone();
        kept["draft"]["requests"][3]["prompt_id"] = json!("HumanEval/0");
        let j = join(&live, &kept, "draft").unwrap();
        assert_eq!(j["joined"], json!(4));
        assert_eq!(j["only_live"], json!([]));
    }
}
