//! The report schema, pinned byte for byte (#39): the JSON documents `verify` (offline and
//! live), `sensitivity` and `verify-join` print, and the table and JUnit rendered from the
//! same report, each compared with its golden under `fixtures/goldens/report/`. What varies
//! from run to run is replaced before the comparison: a temporary directory by `$TMP`, a
//! loopback server's address by `$URL` (`$BASELINE_URL`). `KQUANT_BLESS_REPORTS=1` rewrites
//! the goldens (only when a change to the schema is meant).

use crate::common;
use crate::live_endpoint::{paired_vllms, prompts, scripted, vllm_answer, Seen, Vllm};

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::engines_http::{serve, Request, Response};
use common::{kquant, root};

/// Compare `text`, its run-dependent parts replaced (`subs`: from, to), with the golden `name`.
fn pin(name: &str, text: &[u8], subs: &[(&str, &str)]) {
    let mut s = String::from_utf8(text.to_vec()).expect("UTF-8");
    for (from, to) in subs {
        s = s.replace(from, to);
    }
    let path = root().join("fixtures/goldens/report").join(name);
    if std::env::var_os("KQUANT_BLESS_REPORTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &s).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (KQUANT_BLESS_REPORTS=1 writes it)", path.display()));
    if s != want {
        let line = s
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(s.lines().count().min(want.lines().count()));
        panic!(
            "{name} differs from its golden at line {}:\n got: {:?}\nwant: {:?}",
            line + 1,
            s.lines().nth(line),
            want.lines().nth(line)
        );
    }
}

/// `kquant ARGS…` with its exit code required: stdout.
fn run(args: &[&str], code: i32) -> Vec<u8> {
    let o = kquant(args);
    assert_eq!(o.status.code(), Some(code), "{}", common::stderr(&o));
    o.stdout
}

/// `verify ARGS…` three ways: the JSON on stdout, the table on stdout, and the JUnit file;
/// each pinned as `NAME.json`, `NAME.txt`, `NAME.xml`.
fn pin_verify(name: &str, args: &[&str], code: i32, tmp: &Path, subs: &[(&str, &str)]) {
    let junit = tmp.join(format!("{name}.xml"));
    let mut a = args.to_vec();
    a.extend(["--json", "-"]);
    pin(&format!("{name}.json"), &run(&a, code), subs);
    let mut a = args.to_vec();
    a.extend(["--junit", junit.to_str().unwrap()]);
    pin(&format!("{name}.txt"), &run(&a, code), subs);
    pin(
        &format!("{name}.xml"),
        &std::fs::read(&junit).unwrap(),
        subs,
    );
}

/// The `&str`s of `v`.
fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

const KL: &str = "fixtures/kimi-linear-tiny";
const K25: &str = "fixtures/kimi-k2.5-tiny";

#[test]
fn offline_reports_are_todays_byte_for_byte() {
    let t = tempfile::tempdir().unwrap();
    let tmp = t.path().to_str().unwrap().to_string();
    let subs = [(tmp.as_str(), "$TMP")];
    let kl = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "verify",
            "--draft",
            "fixtures/kimi-linear-tiny/dflash",
            "--target-checkpoint",
            "fixtures/kimi-linear-tiny/target",
            "--per-category",
            "2",
        ]
        .map(String::from)
        .to_vec();
        if !extra.contains(&"--trace") {
            a.extend(["--trace".into(), format!("{KL}/trace")]);
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    // A DFlash drafter against prompt lookup: the teacher-forced all-positions figures.
    let a = kl(&["--baseline", "prompt-lookup"]);
    pin_verify(
        "offline-dflash-prompt-lookup",
        &refs(&a),
        0,
        t.path(),
        &subs,
    );
    // Gated on the all-positions AL, no baseline, a failing --min-accept.
    let a = kl(&["--gate-on", "all-positions", "--min-accept", "9"]);
    pin_verify(
        "offline-dflash-gate-on-all-positions",
        &refs(&a),
        1,
        t.path(),
        &subs,
    );
    // An EAGLE-3 draft against itself with near-ties, after-miss skip and a work cap.
    let e = format!("{K25}/eagle3");
    let a = [
        "verify",
        "--draft",
        &e,
        "--baseline",
        &e,
        "--trace",
        "fixtures/kimi-k2.5-tiny/trace",
        "--target-checkpoint",
        "fixtures/kimi-k2.5-tiny/target",
        "--per-category",
        "2",
        "--near-ties",
        "0.03",
    ];
    pin_verify("offline-eagle3-near-ties", &a, 0, t.path(), &subs);
    let mut b = a[..a.len() - 2].to_vec();
    b.extend(["--after-miss", "skip", "--min-accept", "1.5"]);
    pin_verify("offline-eagle3-after-miss-skip", &b, 0, t.path(), &subs);
    // `--published` offline: the fixture's trace as a Math500 capture and a profile quoting a
    // teacher-forced figure.
    let tr = t.path().join("trace");
    std::fs::create_dir(&tr).unwrap();
    for e in std::fs::read_dir(root().join(KL).join("trace")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tr.join(e.file_name())).unwrap();
    }
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tr.join("manifest.json")).unwrap()).unwrap();
    for s in m["samples"].as_array_mut().unwrap() {
        s["dataset"] = "math500".into();
    }
    std::fs::write(tr.join("manifest.json"), m.to_string()).unwrap();
    let mut p: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("quant-configs/targets/kimi-linear-tiny.json")).unwrap(),
    )
    .unwrap();
    p["published_accept_lengths"] = serde_json::json!([{"draft": "tiny/dflash",
        "family": "dflash", "benchmark": "MATH-500", "n": 60, "accept_length": "9.5",
        "engine": "none: offline teacher-forced; greedy", "draft_length": "block_size=8",
        "source": "a test"}]);
    let pf = t.path().join("profile.json");
    std::fs::write(&pf, p.to_string()).unwrap();
    let a = kl(&[
        "--trace",
        tr.to_str().unwrap(),
        "--target",
        pf.to_str().unwrap(),
        "--published",
        "tiny/dflash",
    ]);
    pin_verify("offline-dflash-published", &refs(&a), 1, t.path(), &subs);
}

/// `verify --endpoint URL --prompts P --max-tokens 40 EXTRA…`, pinned as [`pin_verify`].
fn pin_live(name: &str, url: &str, p: &Path, extra: &[&str], code: i32, subs: &[(&str, &str)]) {
    let t = tempfile::tempdir().unwrap();
    let mut a = vec![
        "verify",
        "--endpoint",
        url,
        "--prompts",
        p.to_str().unwrap(),
        "--max-tokens",
        "40",
    ];
    a.extend_from_slice(extra);
    pin_verify(name, &a, code, t.path(), subs);
}

#[test]
fn live_reports_are_todays_byte_for_byte() {
    let t = tempfile::tempdir().unwrap();
    let tmp = t.path().to_str().unwrap().to_string();
    let p = prompts(t.path(), 2);
    let (quant, bf16) = paired_vllms();
    let subs = [
        (tmp.as_str(), "$TMP"),
        (quant.url.as_str(), "$URL"),
        (bf16.url.as_str(), "$BASELINE_URL"),
    ];
    // The paired gate between two deployments (fails: the quantized one accepts less).
    pin_live(
        "live-vllm-paired",
        &quant.url,
        &p,
        &["--baseline-endpoint", &bf16.url],
        1,
        &subs,
    );
    // One deployment with a profile and a min-accept.
    pin_live(
        "live-vllm-target",
        &quant.url,
        &p,
        &["--target", "kimi-k2.5-tiny", "--min-accept", "1.2"],
        0,
        &subs,
    );
    // Failed requests: every third completion dies unanswered.
    let cfg = Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(0),
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let calls = Arc::new(Mutex::new(0usize));
    let reset = calls.clone();
    let flaky = serve(move |r: &Request| {
        if r.path == "/v1/completions" {
            let mut c = calls.lock().unwrap();
            *c += 1;
            if (*c).is_multiple_of(3) {
                return None;
            }
        }
        vllm_answer(&cfg, &seen, r)
    });
    let subs = [(tmp.as_str(), "$TMP"), (flaky.url.as_str(), "$URL")];
    let args = [
        "--retries",
        "0",
        "--max-failed",
        "100%",
        "--concurrency",
        "1",
    ];
    let mut a = vec![
        "verify",
        "--endpoint",
        &flaky.url,
        "--prompts",
        p.to_str().unwrap(),
        "--max-tokens",
        "40",
        "--json",
        "-",
    ];
    a.extend(args);
    pin("live-vllm-failed.json", &run(&a, 0), &subs);
    *reset.lock().unwrap() = 0;
    a.truncate(a.len() - args.len() - 2);
    a.extend(args);
    pin("live-vllm-failed.txt", &run(&a, 0), &subs);
    // `--published`: MT-Bench questions through the chat route, held against a card.
    let q = t.path().join("question.jsonl");
    let mut lines = String::new();
    for (i, c) in ["coding", "writing", "coding", "writing", "stem"]
        .iter()
        .enumerate()
    {
        lines.push_str(&serde_json::json!({"question_id": 81 + i, "category": c, "turns": [format!("Question {i} about {c}, answered at length."), "And then?"]}).to_string());
        lines.push('\n');
    }
    std::fs::write(&q, lines).unwrap();
    let gen = scripted(1);
    let chat = serve(move |r: &Request| match r.path.as_str() {
        "/v1/models" => crate::live_endpoint::models("vllm"),
        "/v1/chat/completions" => {
            let b = r.json();
            let ids: Vec<u32> = b["messages"][0]["content"]
                .as_str()
                .unwrap()
                .bytes()
                .map(u32::from)
                .collect();
            let g = gen(&ids, crate::live_endpoint::max_tokens(&b));
            let mut c = crate::live_endpoint::vllm_completion(&g, 9, true);
            c["choices"][0] = serde_json::json!({"index": 0, "message": {"role": "assistant", "content": crate::live_endpoint::text_of(&g)}, "finish_reason": "length"});
            Response::json(&c)
        }
        _ => Response::status(404, "{}"),
    });
    let subs = [(tmp.as_str(), "$TMP"), (chat.url.as_str(), "$URL")];
    pin_live(
        "live-vllm-published",
        &chat.url,
        &q,
        &[
            "--target",
            "kimi-k2.6",
            "--published",
            "nvidia/Kimi-K2.6-Eagle3",
        ],
        0,
        &subs,
    );
}

#[test]
fn sensitivity_report_is_todays_byte_for_byte() {
    let args = [
        "sensitivity",
        "fixtures/kimi-k2.5-tiny/eagle3",
        "--trace",
        "fixtures/kimi-k2.5-tiny/trace",
        "--target-checkpoint",
        "fixtures/kimi-k2.5-tiny/target",
        "--limit",
        "1",
        "--pick",
        "--max-regression",
        "0.05",
    ];
    let mut a = args.to_vec();
    a.push("--json");
    let o = kquant(&a);
    pin("sensitivity-pick.json", &o.stdout, &[]);
    let code = o.status.code();
    let o = kquant(&args);
    assert_eq!(o.status.code(), code, "{}", common::stderr(&o));
    pin("sensitivity-pick.txt", &o.stdout, &[]);
}

#[test]
fn verify_join_report_is_todays_byte_for_byte() {
    // The join of two goldens above: a live report and an offline one.
    let t = tempfile::tempdir().unwrap();
    let live = t.path().join("live.json");
    let offline = t.path().join("offline.json");
    std::fs::write(
        &live,
        serde_json::json!({"schema": "kquant.verify/1", "live": {"draft": {"requests": [
            {"id": "0", "category": "code", "steps": 30, "committed": 40},
            {"id": "1", "category": "code", "steps": 31, "committed": 38},
            {"id": "2", "category": "prose", "steps": 33, "committed": 30},
            {"id": "test-0", "category": "math", "steps": 20, "committed": 20}]}}})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        &offline,
        serde_json::json!({"schema": "kquant.verify/1", "draft": {"requests": [
            {"id": 0, "category": "code", "steps": 30, "committed": 40, "near_tie_steps": 0},
            {"id": 1, "category": "code", "steps": 30, "committed": 39, "near_tie_steps": 2},
            {"id": 2, "category": "prose", "steps": 32, "committed": 31, "near_tie_steps": 0},
            {"id": 5, "prompt_id": "HumanEval/0", "category": "code", "steps": 3, "committed": 3}]}})
        .to_string(),
    )
    .unwrap();
    let (l, o) = (live.to_str().unwrap(), offline.to_str().unwrap());
    pin(
        "verify-join.json",
        &run(&["verify-join", l, o, "--json"], 0),
        &[],
    );
    pin("verify-join.txt", &run(&["verify-join", l, o], 0), &[]);
    // The real reports: the live golden's requests against an offline golden's.
    let g = root().join("fixtures/goldens/report");
    let (l, o) = (
        g.join("live-vllm-target.json"),
        g.join("offline-eagle3-near-ties.json"),
    );
    let (l, o) = (l.to_str().unwrap(), o.to_str().unwrap());
    pin(
        "verify-join-goldens.json",
        &run(&["verify-join", l, o, "--json"], 0),
        &[],
    );
    pin(
        "verify-join-goldens-baseline.txt",
        &kquant(&["verify-join", o, o, "--side", "baseline"]).stderr,
        &[(o, "$OFFLINE")],
    );
}
