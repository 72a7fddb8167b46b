//! `kquant trace prompts` through the binary: the ids it writes equal the reference libraries'
//! for the same texts (fixtures/tokenize/expected, made by fixtures/gen/tokenize/make_fixtures.py
//! with transformers / tokenizers / tiktoken, so this test needs no Python):
//! - a tokenizer.json: transformers' `tokenizer(text)` (its BOS post-processor included), and
//!   with `--chat-template` `apply_chat_template(…, add_generation_prompt=True, tokenize=False)`
//!   then `tokenizer(rendered, add_special_tokens=False)`;
//! - a tiktoken ranks file (Kimi-K2.x's format): tiktoken with Kimi's pattern and special tokens,
//!   over the pieces tokenization_kimi.py cuts a text into, and the same template rendered by
//!   transformers' `render_jinja_template`;
//! - the tiny target's tokenizer.json gives the held-out prompts' committed ids.
//!
//! The output is read by `trace capture`'s and `trace import`'s prompt readers; bad inputs exit 2
//! with `error:` + `hint:` and leave nothing under the output name.

use crate::common;

use std::path::{Path, PathBuf};

use common::{kquant, root};
use serde_json::Value;

fn jsonl(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn fx(rel: &str) -> String {
    format!("fixtures/tokenize/{rel}")
}

fn ok(args: &[&str]) -> String {
    let o = kquant(args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{args:?}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `kquant trace prompts` over `input`, compared with `expected/NAME.jsonl` record by record.
fn check(tokenizer: &str, input: &str, chat: bool, expected: &str) -> Vec<Value> {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out.jsonl");
    let mut args = vec![
        "trace",
        "prompts",
        "--tokenizer",
        tokenizer,
        "--prompts",
        input,
        "-o",
        out.to_str().unwrap(),
    ];
    if chat {
        args.push("--chat-template");
    }
    ok(&args);
    let got = jsonl(&out);
    let want = jsonl(&root().join(fx(&format!("expected/{expected}.jsonl"))));
    let src = jsonl(&root().join(input));
    assert_eq!(got.len(), want.len());
    for ((g, w), s) in got.iter().zip(&want).zip(&src) {
        assert_eq!(g["id"], w["id"]);
        assert_eq!(
            g["tokens"], w["tokens"],
            "{expected}: record {} differs from the reference",
            w["id"]
        );
        assert_eq!(g["schema"], "kquant.prompts/1");
        assert_eq!(g["prompt_len"], w["tokens"].as_array().unwrap().len());
        assert_eq!(g["dataset"], s["dataset"]);
        assert_eq!(g["category"], s["category"]);
    }
    got
}

#[test]
fn tokenizer_json_ids_equal_transformers() {
    let got = check(&fx("hf"), &fx("texts.jsonl"), false, "hf");
    // The post-processor's BOS, as transformers' `tokenizer(text)` adds it.
    assert!(got.iter().all(|r| r["tokens"][0] == 0));
    // The file itself works as well as its directory.
    check(&fx("hf/tokenizer.json"), &fx("texts.jsonl"), false, "hf");
}

#[test]
fn chat_template_ids_equal_transformers_apply_chat_template() {
    check(&fx("hf"), &fx("chat.jsonl"), true, "hf-chat");
}

#[test]
fn tiktoken_ranks_ids_equal_tiktoken_with_kimis_pattern() {
    check(&fx("tiktoken"), &fx("texts.jsonl"), false, "tiktoken");
    check(
        &fx("tiktoken/tiktoken.model"),
        &fx("texts.jsonl"),
        false,
        "tiktoken",
    );
    // chat_template.jinja beside the ranks file, as Kimi-K2-Thinking ships it.
    check(&fx("tiktoken"), &fx("chat.jsonl"), true, "tiktoken-chat");
}

/// The rendered text itself equals transformers' (so a template difference shows as text, not
/// only as ids).
#[test]
fn rendered_chat_equals_transformers() {
    use kquant::tokenizer::{ChatTemplate, TargetTokenizer};
    for (dir, exp) in [("hf", "hf-chat"), ("tiktoken", "tiktoken-chat")] {
        let tk = TargetTokenizer::open(&root().join(fx(dir))).unwrap();
        let t = tk.chat_template().unwrap();
        let env = ChatTemplate::environment();
        let compiled = env.template_from_str(&t.text).unwrap();
        let want = jsonl(&root().join(fx(&format!("expected/{exp}.jsonl"))));
        for (r, w) in jsonl(&root().join(fx("chat.jsonl"))).iter().zip(&want) {
            let msgs = match r.get("messages") {
                Some(Value::Array(m)) => m.clone(),
                _ => vec![serde_json::json!({"role": "user", "content": r["text"]})],
            };
            assert_eq!(
                t.render(&compiled, &msgs).unwrap(),
                w["rendered"].as_str().unwrap(),
                "{exp}: {}",
                r["id"]
            );
        }
    }
}

/// The tiny target's own tokenizer.json gives the held-out prompts' committed ids (made with
/// `tokenizers` by fixtures/gen/verify/make_heldout.py), and the output is what `trace
/// capture` and `trace import --prompts` read.
#[test]
fn heldout_prompts_tokenize_to_their_committed_ids() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("heldout.jsonl");
    let held = "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl";
    let stdout = ok(&[
        "trace",
        "prompts",
        "--tokenizer",
        "fixtures/kimi-k2.5-tiny/target",
        "--prompts",
        held,
        "-o",
        out.to_str().unwrap(),
        "--json",
    ]);
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["schema"], "kquant.trace-prompts/1");
    assert_eq!(doc["records"], 60);
    assert_eq!(doc["tokenizer"]["kind"], "tokenizer.json");
    assert_eq!(doc["chat_template"], Value::Null);
    assert!(doc["next"].as_str().unwrap().contains("--prompts"));
    // #38.23: the tokenizer came from the target's checkpoint: `next` names it, not TARGET.
    assert!(
        doc["next"].as_str().unwrap().starts_with(
            "kquant trace capture --target-checkpoint fixtures/kimi-k2.5-tiny/target "
        ),
        "{}",
        doc["next"]
    );
    let got = jsonl(&out);
    let want = jsonl(&root().join(held));
    assert_eq!(got.len(), 60);
    let mut total = 0;
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g["tokens"], w["tokens"], "held-out prompt {}", w["id"]);
        assert_eq!((&g["id"], &g["category"]), (&w["id"], &w["category"]));
        total += w["tokens"].as_array().unwrap().len();
    }
    assert_eq!(doc["tokens"], total);
    let caps = kquant::trace::capture::read_prompts(&out).unwrap();
    assert_eq!(caps.len(), 60);
    assert_eq!(
        caps[3].tokens.len(),
        want[3]["tokens"].as_array().unwrap().len()
    );
    let recs = kquant::trace::import::read_prompts(&out).unwrap();
    assert_eq!(
        recs[5].tokens.as_ref().unwrap().len(),
        recs[5].prompt_len.unwrap()
    );
}

fn fails(args: &[&str], needle: &str) -> String {
    let o = kquant(args);
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
    assert!(e.contains("error:") && e.contains("hint:"), "{e}");
    assert!(e.contains(needle), "expected `{needle}` in: {e}");
    assert!(!e.contains("panicked"), "{e}");
    e
}

#[test]
fn bad_inputs_exit_2_and_write_nothing() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(n);
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    let out = s(&p("out.jsonl"));
    std::fs::write(p("bad.jsonl"), "{\"id\": 1, \"text\": \"hi\"}\n{bad\n").unwrap();
    std::fs::write(p("empty.jsonl"), "{\"id\": 1, \"text\": \"\"}\n").unwrap();
    std::fs::write(
        p("msgs.jsonl"),
        "{\"id\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n",
    )
    .unwrap();
    std::fs::write(
        p("tool.jsonl"),
        "{\"id\": 1, \"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}\n",
    )
    .unwrap();
    std::fs::write(
        p("dup.jsonl"),
        "{\"id\": 1, \"text\": \"a\"}\n{\"id\": 1, \"text\": \"b\"}\n",
    )
    .unwrap();
    std::fs::write(p("tokens.jsonl"), "{\"id\": 1, \"tokens\": [1, 2]}\n").unwrap();
    std::fs::create_dir(p("empty-dir")).unwrap();
    let hf = fx("hf");
    let run = |tok: &str, input: &PathBuf, extra: &[&str], needle: &str| {
        let input = s(input);
        let mut a = vec![
            "trace",
            "prompts",
            "--tokenizer",
            tok,
            "--prompts",
            &input,
            "-o",
            &out,
        ];
        a.extend_from_slice(extra);
        fails(&a, needle);
        assert!(!p("out.jsonl").exists(), "{needle}: an output was left");
    };
    run(
        &s(&p("empty-dir")),
        &p("bad.jsonl"),
        &[],
        "neither `tokenizer.json` nor `tiktoken.model`",
    );
    run(
        &s(&p("missing")),
        &p("bad.jsonl"),
        &[],
        "cannot read the tokenizer",
    );
    run(&hf, &p("bad.jsonl"), &[], "bad.jsonl:2`: not JSON");
    run(
        &hf,
        &p("empty.jsonl"),
        &[],
        "empty.jsonl:1`: `text` is empty",
    );
    run(&hf, &p("msgs.jsonl"), &[], "pass --chat-template");
    run(
        &hf,
        &p("tool.jsonl"),
        &["--chat-template"],
        "unknown role: tool",
    );
    run(
        &hf,
        &p("dup.jsonl"),
        &[],
        "dup.jsonl:2`: id `1` appears twice",
    );
    run(&hf, &p("tokens.jsonl"), &[], "tokenized already");
    run(
        "fixtures/kimi-k2.5-tiny/target",
        &p("msgs.jsonl"),
        &["--chat-template"],
        "has no chat template",
    );
    // A ranks file with a gap, and a tokenizer.json that is not one.
    std::fs::write(p("gap.model"), "IQ== 0\nIg== 2\n").unwrap();
    run(
        &s(&p("gap.model")),
        &p("empty.jsonl"),
        &[],
        "no token of rank 1",
    );
    std::fs::write(p("tokenizer.json"), "{\"not\": \"a tokenizer\"}").unwrap();
    run(
        &s(&p("tokenizer.json")),
        &p("empty.jsonl"),
        &[],
        "is not a tokenizer.json",
    );
    // The output may not be the input.
    let input = s(&p("msgs.jsonl"));
    fails(
        &[
            "trace",
            "prompts",
            "--tokenizer",
            &hf,
            "--prompts",
            &input,
            "-o",
            &input,
            "--chat-template",
            "--force",
        ],
        "which this command reads",
    );
}

#[test]
fn force_replaces_only_a_prompts_file_kquant_wrote() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out.jsonl");
    let o = out.to_str().unwrap();
    let args = [
        "trace",
        "prompts",
        "--tokenizer",
        "fixtures/tokenize/hf",
        "--prompts",
        "fixtures/tokenize/texts.jsonl",
        "-o",
        o,
    ];
    ok(&args);
    fails(&args, "already exists");
    let mut forced = args.to_vec();
    forced.push("--force");
    ok(&forced);
    std::fs::write(&out, "{\"id\": 1, \"text\": \"mine\"}\n").unwrap();
    fails(&forced, "not an output kquant wrote");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "{\"id\": 1, \"text\": \"mine\"}\n"
    );
}

/// The held-out split of #16: `calibration.jsonl` (120 prompts) and `eval.jsonl` (240, its first
/// 60 the held-out set) share no document and no text, and the tiny target's tokenizer gives
/// every prompt its committed ids (fixtures/gen/verify/make_splits.py).
#[test]
fn calibration_and_evaluation_prompts_never_share_a_document() {
    use std::collections::{BTreeMap, BTreeSet};
    let dir = "fixtures/kimi-k2.5-tiny/prompts";
    let cal = jsonl(&root().join(dir).join("calibration.jsonl"));
    let eval = jsonl(&root().join(dir).join("eval.jsonl"));
    let held = jsonl(&root().join(dir).join("heldout.jsonl"));
    let per_cat = |v: &[Value]| {
        let mut m: BTreeMap<String, usize> = BTreeMap::new();
        for p in v {
            *m.entry(p["category"].as_str().unwrap().into()).or_default() += 1;
        }
        m
    };
    let want = |n| -> BTreeMap<String, usize> {
        ["arith", "code", "prose"]
            .iter()
            .map(|c| (c.to_string(), n))
            .collect()
    };
    assert_eq!(per_cat(&cal), want(40));
    assert_eq!(per_cat(&eval), want(80));
    assert_eq!(
        &eval[..60],
        &held[..],
        "eval.jsonl starts with heldout.jsonl"
    );
    let docs = |v: &[Value]| -> BTreeSet<String> {
        v.iter()
            .map(|p| p["source"].as_str().unwrap().to_string())
            .collect()
    };
    let shared: Vec<_> = docs(&cal).intersection(&docs(&eval)).cloned().collect();
    assert!(shared.is_empty(), "documents in both: {shared:?}");
    let texts = |v: &[Value]| -> BTreeSet<String> {
        v.iter()
            .map(|p| p["text"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(texts(&cal).is_disjoint(&texts(&eval)));
    let ids: BTreeSet<u64> = cal
        .iter()
        .chain(&eval)
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 360, "ids unique across both files");
    for name in ["calibration.jsonl", "eval.jsonl"] {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join(name);
        let input = format!("{dir}/{name}");
        ok(&[
            "trace",
            "prompts",
            "--tokenizer",
            "fixtures/kimi-k2.5-tiny/target",
            "--prompts",
            &input,
            "-o",
            out.to_str().unwrap(),
        ]);
        let committed = jsonl(&root().join(&input));
        for (g, w) in jsonl(&out).iter().zip(&committed) {
            assert_eq!(g["tokens"], w["tokens"], "{name}: prompt {}", w["id"]);
            assert_eq!(
                w["prompt_len"].as_u64().unwrap() as usize,
                w["tokens"].as_array().unwrap().len()
            );
        }
        assert_eq!(
            kquant::trace::capture::read_prompts(&out).unwrap().len(),
            committed.len()
        );
    }
}

/// A chat template is code from the target's repository: one that loops 10^10 times, asks
/// `tojson` for an indent of 2^64 − 1, or doubles a string or list 40 times (by `~`, `+`,
/// `replace`, `join`, `*`, `tojson`, `indent`, `format`) is an error naming it with a hint, in
/// bounded time and memory, not hours of rendering, an abort or a panic; no partial output is
/// left.
#[test]
fn hostile_chat_templates_are_bounded() {
    let d = tempfile::tempdir().unwrap();
    let tgt = root().join("fixtures/kimi-k2.5-tiny/target");
    let input = d.path().join("p.jsonl");
    std::fs::write(&input, "{\"id\": 1, \"text\": \"hi\"}\n").unwrap();
    for (name, template, needle) in [
        (
            "loops",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
            "did not finish within",
        ),
        (
            "indent",
            "{{ messages | tojson(indent=18446744073709551615) }}",
            "tojson: indent",
        ),
        // Strings and lists doubled 40 times (10^12 bytes), each way a template can build them:
        // the widths minijinja charges run out of fuel, what grows step by step is over the memory
        // budget (`io::budget`).
        (
            "concat",
            "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
            "needs more than 256 MiB",
        ),
        (
            "replace",
            "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s|replace('a','aa') %}{% endfor %}{{ ns.s|length }}",
            "needs more than 256 MiB",
        ),
        (
            "string-repeat",
            "{{ 'a' * 1000000000000 }}",
            "did not finish within",
        ),
        (
            "indent-filter",
            "{{ 'a\nb'|indent(1000000000000000) }}",
            "did not finish within",
        ),
        (
            "format-width",
            "{{ '%1000000000000d'|format(1) }}",
            "did not finish within",
        ),
        (
            "join",
            "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = [ns.s, ns.s]|join('') %}{% endfor %}{{ ns.s|length }}",
            "needs more than 256 MiB",
        ),
        (
            "list-add",
            "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
            "needs more than 256 MiB",
        ),
        (
            "list-repeat",
            "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l * 2 %}{% endfor %}{{ ns.l|length }}",
            "repeated sequence is too large",
        ),
        (
            "tojson",
            "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = [ns.s, ns.s]|tojson %}{% endfor %}{{ ns.s|length }}",
            "needs more than 256 MiB",
        ),
    ] {
        let tok = d.path().join(name);
        std::fs::create_dir(&tok).unwrap();
        std::fs::copy(tgt.join("tokenizer.json"), tok.join("tokenizer.json")).unwrap();
        let mut cfg: Value =
            serde_json::from_slice(&std::fs::read(tgt.join("tokenizer_config.json")).unwrap())
                .unwrap();
        cfg["chat_template"] = template.into();
        std::fs::write(tok.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let out = d.path().join(format!("{name}.jsonl"));
        let t0 = std::time::Instant::now();
        let e = fails(
            &[
                "trace",
                "prompts",
                "--tokenizer",
                tok.to_str().unwrap(),
                "--prompts",
                input.to_str().unwrap(),
                "--chat-template",
                "-o",
                out.to_str().unwrap(),
            ],
            needle,
        );
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "{name}: {:?}",
            t0.elapsed()
        );
        assert!(!out.exists(), "{name}");
        let left: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("kquant-"))
            .collect();
        assert!(left.is_empty(), "{name} left {left:?}");
        let _ = e;
    }
}

/// A `tokenizer.json` whose normalizers multiply a text's length without bound (12 chained
/// `Replace` "a" → ten "a"s: one character becomes 10^12) is refused before it runs.
#[test]
fn a_tokenizer_whose_normalizers_explode_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let tgt = root().join("fixtures/kimi-k2.5-tiny/target");
    let mut tj: Value =
        serde_json::from_slice(&std::fs::read(tgt.join("tokenizer.json")).unwrap()).unwrap();
    let replace =
        serde_json::json!({"type": "Replace", "pattern": {"String": "a"}, "content": "aaaaaaaaaa"});
    tj["normalizer"] = serde_json::json!({"type": "Sequence", "normalizers": vec![replace; 12]});
    let tok = d.path().join("tok");
    std::fs::create_dir(&tok).unwrap();
    std::fs::write(tok.join("tokenizer.json"), tj.to_string()).unwrap();
    let input = d.path().join("p.jsonl");
    std::fs::write(&input, "{\"id\": 1, \"text\": \"a\"}\n").unwrap();
    let out = d.path().join("out.jsonl");
    fails(
        &[
            "trace",
            "prompts",
            "--tokenizer",
            tok.to_str().unwrap(),
            "--prompts",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
        "can multiply a text's length by up to 1.000e12",
    );
    assert!(!out.exists());
}

/// #27.8: a pre-tokenizer regex that exceeds fancy-regex's backtrack limit on a text makes the
/// `tokenizers` library stop splitting silently (other token ids); kquant runs the tokenizer's
/// split regexes first and fails on that record, naming the pattern; the same tokenizer on
/// ordinary text works.
#[test]
fn a_pre_tokenizer_regex_that_gives_up_is_an_error_not_other_ids() {
    let d = tempfile::tempdir().unwrap();
    let mut tok: Value = serde_json::from_slice(
        &std::fs::read(root().join("fixtures/kimi-k2.5-tiny/target/tokenizer.json")).unwrap(),
    )
    .unwrap();
    tok["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?:x+x+)+(?=y)|\\s+|[^\\sx]+|x"},
         "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
    ]});
    let dir = d.path().join("tok");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let ok = d.path().join("ok.jsonl");
    std::fs::write(&ok, "{\"id\": 1, \"text\": \"hello xx world\"}\n").unwrap();
    let bad = d.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        format!("{{\"id\": 1, \"text\": \"hello {}\"}}\n", "x".repeat(40)),
    )
    .unwrap();
    let out = d.path().join("out.jsonl");
    let args = |p: &Path| {
        vec![
            "trace".to_string(),
            "prompts".into(),
            "--tokenizer".into(),
            dir.to_str().unwrap().into(),
            "--prompts".into(),
            p.to_str().unwrap().into(),
            "-o".into(),
            out.to_str().unwrap().into(),
        ]
    };
    let a = args(&ok);
    let o = kquant(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::remove_file(&out).unwrap();
    let a = args(&bad);
    let e = fails(
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        "pre-tokenizer pattern `(?:x+x+)+(?=y)",
    );
    assert!(e.contains("backtrack"), "{e}");
    assert!(!out.exists());
}
