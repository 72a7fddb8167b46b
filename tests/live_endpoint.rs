//! `verify --endpoint`: kquant against loopback servers that answer as vLLM 0.33.0, SGLang
//! 0.5.23 and TensorRT-LLM's `trtllm-serve` do (their response and metrics schemas, field for
//! field from the sources docs/verify.md names), the figures checked against what each server
//! was scripted to report; the paired gate between two endpoints; the error paths (a server that
//! dies mid-run, malformed JSON, missing fields, counters that reset or that another client
//! moved) and the preflight. Last, the end-to-end check: a server whose answers come from
//! kquant's own tiny-fixture target and draft running the engine's greedy speculative loop
//! (`verify::sim`) gives exactly the offline replay's figures on the same prompts.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::engines_http::{serve, Request, Response, Server};
use common::{kquant, root};
use serde_json::{json, Value};

/// Drafts proposed per step by every scripted server.
const K: usize = 3;

/// What one request generated: the tokens, and the drafts accepted at each verify step.
#[derive(Clone, Debug)]
pub(crate) struct Gen {
    tokens: Vec<u32>,
    accepted: Vec<usize>,
    /// Drafts the final step accepted beyond its cut at `max_tokens` or EOS: vLLM counts them
    /// (its scheduler counts a step before `check_stop` trims it); SGLang and TensorRT-LLM
    /// report the committed tokens.
    extra: usize,
}

impl Gen {
    fn steps(&self) -> u64 {
        self.accepted.len() as u64
    }
    fn acc(&self) -> u64 {
        self.accepted.iter().sum::<usize>() as u64
    }
    fn hist(&self) -> Vec<u64> {
        let mut h = vec![0u64; K + 1];
        for &a in &self.accepted {
            h[a] += 1;
        }
        h
    }
    /// vLLM's count: the final step before its cut.
    fn acc_vllm(&self) -> u64 {
        self.acc() + self.extra as u64
    }
    fn hist_vllm(&self) -> Vec<u64> {
        let mut h = vec![0u64; K + 1];
        let last = self.accepted.len().saturating_sub(1);
        for (i, &a) in self.accepted.iter().enumerate() {
            h[a + if i == last { self.extra } else { 0 }] += 1;
        }
        h
    }
}

pub(crate) type Generator = Arc<dyn Fn(&[u32], usize) -> Gen + Send + Sync>;

/// A deterministic acceptance pattern from the prompt (`bias` more per step, capped at K), the
/// engine's schedule: a prefill token, then steps of n + 1 tokens, the last trimmed to
/// `max_tokens`.
pub(crate) fn scripted(bias: usize) -> Generator {
    Arc::new(move |prompt: &[u32], max_tokens: usize| {
        let mut h = prompt
            .iter()
            .fold(7u64, |a, &t| a.wrapping_mul(31).wrapping_add(t as u64));
        let (mut n_gen, mut accepted, mut extra) = (1usize, Vec::new(), 0);
        while n_gen < max_tokens {
            h = h
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let full = (((h >> 33) % (K as u64 + 1)) as usize + bias).min(K);
            let n = full.min(max_tokens - n_gen - 1);
            extra = full - n;
            accepted.push(n);
            n_gen += n + 1;
        }
        Gen {
            tokens: (0..n_gen as u32)
                .map(|i| (i * 7 + prompt.len() as u32) % 300)
                .collect(),
            accepted,
            extra,
        }
    })
}

/// [`scripted`]'s acceptance with a continuation that loops on two tokens after its first
/// four: a raw-completion run of a chat model (tests/degenerate.rs).
pub(crate) fn looping(bias: usize) -> Generator {
    let s = scripted(bias);
    Arc::new(move |prompt: &[u32], max_tokens: usize| {
        let mut g = s(prompt, max_tokens);
        for (i, t) in g.tokens.iter_mut().enumerate().skip(4) {
            *t = [17, 29][i % 2];
        }
        g
    })
}

/// The prompt's token ids of a request, as each engine takes them.
fn prompt_ids(v: &Value) -> Vec<u32> {
    let ids = v
        .get("prompt")
        .or_else(|| v.get("input_ids"))
        .expect("token prompt");
    ids.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub(crate) fn max_tokens(v: &Value) -> usize {
    v.get("max_tokens")
        .or_else(|| v.pointer("/sampling_params/max_new_tokens"))
        .and_then(Value::as_u64)
        .unwrap() as usize
}

pub(crate) fn text_of(g: &Gen) -> String {
    g.tokens
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `/v1/models` as each engine's `ModelCard` serialises it.
pub(crate) fn models(owned_by: &str) -> Option<Response> {
    Response::json(
        &json!({"object": "list", "data": [{"id": "kimi-k2.5-tiny", "object": "model",
        "created": 1764000000, "owned_by": owned_by, "root": "kimi-k2.5-tiny", "parent": null,
        "max_model_len": 4096, "permission": []}]}),
    )
}

/// vLLM 0.33.0 `/v1/completions` with `--per-request-spec-decode-metrics summary`
/// (`CompletionResponse` + `metrics.speculative_decoding` from `RequestSpecDecodeMetrics.to_dict`).
pub(crate) fn vllm_completion(g: &Gen, prompt_len: usize, per_request: bool) -> Value {
    // vLLM counts the final step before its cut at max_tokens / EOS.
    let (r, a) = (g.steps(), g.acc_vllm());
    let mut v = json!({"id": "cmpl-7f3e", "object": "text_completion", "created": 1764000000,
        "model": "kimi-k2.5-tiny",
        "choices": [{"index": 0, "text": text_of(g), "logprobs": null, "finish_reason": "length",
                     "stop_reason": null, "prompt_logprobs": null}],
        "service_tier": null, "system_fingerprint": null,
        "usage": {"prompt_tokens": prompt_len, "total_tokens": prompt_len + g.tokens.len(),
                  "completion_tokens": g.tokens.len(), "prompt_tokens_details": null},
        "kv_transfer_params": null});
    if per_request {
        v["metrics"] = json!({"speculative_decoding": {
            "mean_acceptance_length": if r == 0 { 1.0 } else { 1.0 + a as f64 / r as f64 },
            "draft_acceptance_rate": if r == 0 { 0.0 } else { a as f64 / (r as f64 * K as f64) },
            "acceptance_histogram": g.hist_vllm(), "num_spec_steps": r,
            "num_accepted_draft_tokens": a, "num_draft_tokens": r * K as u64,
            "num_spec_tokens": K}});
    }
    v
}

/// vLLM's `/metrics` page (prometheus_client text: `_total` counters, `_created` gauges).
fn vllm_metrics(drafts: u64, accepted: u64, finished: u64) -> String {
    format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{{engine=\"0\",model_name=\"kimi-k2.5-tiny\"}} 0.0\n\
# HELP vllm:request_success_total Count of successfully processed requests.\n\
# TYPE vllm:request_success_total counter\n\
vllm:request_success_total{{engine=\"0\",finished_reason=\"length\",model_name=\"kimi-k2.5-tiny\"}} {finished}.0\n\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n\
# TYPE vllm:spec_decode_num_drafts_total counter\n\
vllm:spec_decode_num_drafts_total{{engine=\"0\",model_name=\"kimi-k2.5-tiny\"}} {drafts}.0\n\
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.\n\
# TYPE vllm:spec_decode_num_drafts_created gauge\n\
vllm:spec_decode_num_drafts_created{{engine=\"0\",model_name=\"kimi-k2.5-tiny\"}} 1.764e+09\n\
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.\n\
# TYPE vllm:spec_decode_num_draft_tokens_total counter\n\
vllm:spec_decode_num_draft_tokens_total{{engine=\"0\",model_name=\"kimi-k2.5-tiny\"}} {}.0\n\
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.\n\
# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n\
vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\",model_name=\"kimi-k2.5-tiny\"}} {accepted}.0\n",
        drafts * K as u64
    )
}

/// What a scripted server does besides answering.
#[derive(Clone)]
pub(crate) struct Vllm {
    pub(crate) version: &'static str,
    pub(crate) per_request: bool,
    pub(crate) gen: Generator,
}

/// Counters and requests seen, shared with the test.
#[derive(Default)]
pub(crate) struct Seen {
    bodies: Vec<Value>,
    drafts: u64,
    accepted: u64,
    finished: u64,
}

pub(crate) fn vllm(cfg: Vllm) -> (Server, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    let server = serve(move |r: &Request| vllm_answer(&cfg, &s, r));
    (server, seen)
}

pub(crate) fn vllm_answer(cfg: &Vllm, s: &Mutex<Seen>, r: &Request) -> Option<Response> {
    match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/v1/models") => models("vllm"),
        ("GET", "/version") => Response::json(&json!({"version": cfg.version})),
        ("GET", "/metrics") => {
            let s = s.lock().unwrap();
            Response::text(&vllm_metrics(s.drafts, s.accepted, s.finished))
        }
        ("POST", "/v1/completions") => {
            let v = r.json();
            let ids = prompt_ids(&v);
            let g = (cfg.gen)(&ids, max_tokens(&v));
            let mut s = s.lock().unwrap();
            s.bodies.push(v);
            s.drafts += g.steps();
            s.accepted += g.acc_vllm();
            s.finished += 1;
            Response::json(&vllm_completion(&g, ids.len(), cfg.per_request))
        }
        _ => Response::status(404, r#"{"detail":"Not Found"}"#),
    }
}

/// SGLang 0.5.23 native `/generate` (`meta_info` from `_calculate_spec_decoding_metrics`).
fn sglang_generate(g: &Gen, prompt_len: usize) -> Value {
    let (r, a, n) = (g.steps(), g.acc(), g.tokens.len() as u64);
    json!({"text": text_of(g), "output_ids": g.tokens,
        "meta_info": {"id": "9c1f", "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": prompt_len, "completion_tokens": n, "cached_tokens": 0,
            "reasoning_tokens": 0, "e2e_latency": 0.25,
            "spec_accept_rate": if r == 0 { 0.0 } else { a as f64 / (r as f64 * K as f64) },
            "spec_accept_length": if r == 0 { 1.0 } else { n as f64 / r as f64 },
            "spec_num_correct_drafts": a, "spec_num_proposed_drafts": r * K as u64,
            "spec_verify_ct": r, "spec_correct_drafts_histogram": g.hist()}})
}

fn sglang_info(version: &str, algorithm: Value) -> Value {
    json!({"version": version, "model_path": "kimi-k2.5-tiny", "tp_size": 1, "dp_size": 1,
        "speculative_algorithm": algorithm, "speculative_draft_model_path": "eagle3",
        "speculative_num_steps": K, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": K + 1,
        "speculative_adaptive": false, "enable_deterministic_inference": true,
        "decode_log_interval": 40, "internal_states": [{"avg_spec_accept_length": 2.1}]})
}

fn sglang(version: &'static str, algorithm: Value, gen: Generator) -> Server {
    serve(
        move |r: &Request| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/v1/models") => models("sglang"),
            ("GET", "/server_info") => Response::json(&sglang_info(version, algorithm.clone())),
            ("POST", "/generate") => {
                let v = r.json();
                assert_eq!(v["sampling_params"]["temperature"], json!(0.0));
                assert_eq!(v["sampling_params"]["ignore_eos"], json!(false));
                let ids = prompt_ids(&v);
                Response::json(&sglang_generate(&gen(&ids, max_tokens(&v)), ids.len()))
            }
            _ => Response::status(404, r#"{"detail":"Not Found"}"#),
        },
    )
}

/// `trtllm-serve` `/v1/completions` (`CompletionResponseChoice.avg_decoded_tokens_per_iter`:
/// generated tokens over decoding iterations, the context iteration among them).
fn trtllm_completion(g: &Gen, prompt_len: usize) -> Value {
    let n = g.tokens.len();
    json!({"id": "cmpl-3", "object": "text_completion", "created": 1764000000, "model": "kimi-k2.5-tiny",
        "choices": [{"index": 0, "text": text_of(g), "token_ids": null, "logprobs": null,
            "context_logits": null, "finish_reason": "length", "stop_reason": null,
            "disaggregated_params": null,
            "avg_decoded_tokens_per_iter": n as f64 / (g.steps() + 1) as f64}],
        "usage": {"prompt_tokens": prompt_len, "total_tokens": prompt_len + n, "completion_tokens": n}})
}

fn trtllm(gen: Generator) -> Server {
    serve(
        move |r: &Request| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/v1/models") => models("tensorrt_llm"),
            ("POST", "/v1/completions") => {
                let v = r.json();
                let ids = prompt_ids(&v);
                Response::json(&trtllm_completion(&gen(&ids, max_tokens(&v)), ids.len()))
            }
            _ => Response::status(404, r#"{"detail":"Not Found"}"#),
        },
    )
}

/// Two vLLM 0.33.0 deployments with per-request counts for the paired gate: the quantized one
/// (`scripted(0)`) and its BF16 baseline (`scripted(1)`, which accepts more).
pub(crate) fn paired_vllms() -> (Server, Server) {
    let (quant, _) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(0),
    });
    let (bf16, _) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(1),
    });
    (quant, bf16)
}

/// The first `n` held-out prompts of each category (token ids).
pub(crate) fn prompts(dir: &Path, n: usize) -> PathBuf {
    let src = root().join("fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl");
    let mut seen = std::collections::HashMap::new();
    let lines: Vec<String> = std::fs::read_to_string(src)
        .unwrap()
        .lines()
        .filter(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let c = seen
                .entry(v["category"].as_str().unwrap().to_string())
                .or_insert(0);
            *c += 1;
            *c <= n
        })
        .map(String::from)
        .collect();
    let p = dir.join("prompts.jsonl");
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

fn token_prompts(p: &Path) -> Vec<(String, Vec<u32>)> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let ids = v["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            (v["category"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

/// `verify --endpoint URL --prompts P --json - EXTRA…`: (exit code, report or Null, stderr).
pub(crate) fn live(url: &str, p: &Path, extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec![
        "verify",
        "--endpoint",
        url,
        "--prompts",
        p.to_str().unwrap(),
        "--json",
        "-",
        "--max-tokens",
        "40",
    ];
    args.extend_from_slice(extra);
    let o = kquant(&args);
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code().unwrap_or(-1), v, common::stderr(&o))
}

/// The micro-averaged accept length of the scripted generations for the prompts.
fn expected_al(gen: &Generator, p: &Path, max: usize) -> (f64, u64) {
    let (mut steps, mut committed) = (0u64, 0u64);
    for (_, ids) in token_prompts(p) {
        let g = gen(&ids, max);
        steps += g.steps();
        committed += g.steps() + g.acc();
    }
    (committed as f64 / steps as f64, steps)
}

#[test]
fn each_engine_reports_its_per_request_figures() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 3);
    let gen = scripted(0);
    let (al, steps) = expected_al(&gen, &p, 40);
    let (v, seen) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: gen.clone(),
    });
    let s = sglang("0.5.23", json!("EAGLE3"), gen.clone());
    let tr = trtllm(gen.clone());
    for (server, engine, field) in [
        (&v, "vllm", "metrics.speculative_decoding"),
        (&s, "sglang", "meta_info.spec_num_correct_drafts"),
        (&tr, "trtllm", "choices[0].avg_decoded_tokens_per_iter"),
    ] {
        let (code, r, err) = live(&server.url, &p, &[]);
        assert_eq!(code, 0, "{engine}: {err}");
        assert_eq!(
            r["draft"]["accept_length"].as_f64().unwrap(),
            al,
            "{engine}"
        );
        assert_eq!(r["draft"]["rounds"], json!(steps), "{engine}");
        assert_eq!(r["samples"], json!(9), "{engine}");
        assert_eq!(
            r["live"]["draft"]["engine"],
            json!(engine),
            "told by owned_by"
        );
        assert_eq!(r["live"]["draft"]["sources"], json!([field]), "{engine}");
        assert!(
            r["draft"]["accept_length_all_positions"].is_null(),
            "no teacher-forced figure live"
        );
        assert_eq!(r["per_category"].as_object().unwrap().len(), 3);
        assert!(r["passed"].as_bool().unwrap());
    }
    // Every request greedy, EOS honoured, one sequence, the cap as asked.
    assert_eq!(seen.lock().unwrap().bodies.len(), 9);
    for b in &seen.lock().unwrap().bodies {
        assert_eq!(
            (
                b["temperature"].as_f64(),
                b["ignore_eos"].as_bool(),
                b["n"].as_u64()
            ),
            (Some(0.0), Some(false), Some(1))
        );
        assert_eq!(
            (b["max_tokens"].as_u64(), b["model"].as_str()),
            (Some(40), Some("kimi-k2.5-tiny"))
        );
    }
    // Four requests in flight: the same per-request figures, in prompt order.
    let (code, r4, err) = live(&v.url, &p, &["--concurrency", "4"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r4["draft"], live(&v.url, &p, &[]).1["draft"]);
    assert_eq!(r4["live"]["draft"]["requests"].as_array().unwrap().len(), 9);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.bodies.len(), 27);
}

#[test]
fn the_paired_gate_compares_two_deployments_on_the_same_prompts() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 3);
    let (quant, bf16) = paired_vllms();
    let junit = t.path().join("junit.xml");
    let (code, r, err) = live(
        &quant.url,
        &p,
        &[
            "--baseline-endpoint",
            &bf16.url,
            "--junit",
            junit.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1, "the quantized deployment accepts less: {err}");
    let (al_q, _) = expected_al(&scripted(0), &p, 40);
    let (al_b, _) = expected_al(&scripted(1), &p, 40);
    assert!((r["delta"].as_f64().unwrap() - (al_q - al_b)).abs() < 1e-12);
    let ci = r["ci95"].as_array().unwrap();
    assert!(ci[0].as_f64().unwrap() <= ci[1].as_f64().unwrap());
    assert_eq!(r["live"]["same_output"]["compared"], json!(9));
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(x.contains("<failure"), "{x}");
    // The same deployment on both sides would give ΔAL 0 whatever the draft: refused
    // (a_baseline_that_is_the_same_server_is_refused).
    let (code, _, err) = live(&quant.url, &p, &["--baseline-endpoint", &quant.url]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn failed_requests_are_reported_never_measured_and_too_many_are_an_error() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 2);
    let gen = scripted(0);
    let cfg = Vllm {
        version: "0.33.0",
        per_request: true,
        gen: gen.clone(),
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let calls = Arc::new(Mutex::new(0usize));
    let (s2, c2, cfg2) = (seen.clone(), calls.clone(), cfg.clone());
    // Every third completion dies unanswered (the server gone mid-request); the first one
    // answers 503 once and then succeeds on the retry.
    let server = serve(move |r: &Request| {
        if r.path == "/v1/completions" {
            let mut c = c2.lock().unwrap();
            *c += 1;
            if *c == 1 {
                return Response::status(503, r#"{"error":"busy"}"#);
            }
            if *c % 3 == 0 {
                return None;
            }
        }
        vllm_answer(&cfg2, &s2, r)
    });
    let (code, r, err) = live(&server.url, &p, &["--retries", "0", "--max-failed", "100%"]);
    assert_eq!(code, 0, "{err}");
    let failed = r["live"]["draft"]["failed"].as_array().unwrap();
    let measured = r["live"]["draft"]["measured"].as_u64().unwrap() as usize;
    assert_eq!(measured + failed.len(), 6);
    assert!(!failed.is_empty() && failed.iter().all(|f| f["attempts"] == json!(1)));
    // The measured requests alone make the figure.
    assert_eq!(r["samples"], json!(measured));
    // Too many failures: exit 2, naming the first.
    *calls.lock().unwrap() = 0;
    let (code, _, err) = live(&server.url, &p, &["--retries", "0", "--max-failed", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("requests failed") && err.contains("hint:"),
        "{err}"
    );
    // With retries the 503 and the dropped connections are tried again and every prompt counts.
    *calls.lock().unwrap() = 0;
    let (code, r, err) = live(&server.url, &p, &["--retries", "2", "--max-failed", "0"]);
    assert_eq!(
        (code, r["live"]["draft"]["measured"].as_u64()),
        (0, Some(6)),
        "{err}"
    );
    assert!(r["live"]["draft"]["retried"].as_u64().unwrap() >= 1);
}

#[test]
fn malformed_or_incomplete_responses_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 1);
    // Not JSON: every request fails, no retry helps (exit 2, nothing measured).
    let server = serve(|r: &Request| match r.path.as_str() {
        "/v1/models" => models("vllm"),
        "/v1/completions" => Some(Response {
            status: 200,
            content_type: "application/json",
            body: "{\"choices\": [".into(),
            location: None,
        }),
        _ => Response::status(404, "{}"),
    });
    let (code, _, err) = live(&server.url, &p, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not JSON"), "{err}");
    // A histogram that contradicts the counts breaks vLLM's schema.
    let gen = scripted(0);
    let server = serve(move |r: &Request| match r.path.as_str() {
        "/v1/models" => models("vllm"),
        "/v1/completions" => {
            let v = r.json();
            let ids = prompt_ids(&v);
            let mut resp = vllm_completion(&gen(&ids, max_tokens(&v)), ids.len(), true);
            resp["metrics"]["speculative_decoding"]["num_spec_steps"] = json!(1_000_000);
            Response::json(&resp)
        }
        _ => Response::status(404, "{}"),
    });
    let (code, _, err) = live(&server.url, &p, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("histogram"), "{err}");
    // Per-request metrics off (the server's default): an error that says how to turn them on.
    let (v, _) = vllm(Vllm {
        version: "0.33.0",
        per_request: false,
        gen: scripted(0),
    });
    let (code, _, err) = live(&v.url, &p, &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--per-request-spec-decode-metrics summary"),
        "{err}"
    );
    // Speculation off: every request reports zero steps.
    let server = serve(|r: &Request| match r.path.as_str() {
        "/v1/models" => models("vllm"),
        "/v1/completions" => {
            let v = r.json();
            let g = Gen {
                tokens: vec![1; max_tokens(&v)],
                accepted: vec![],
                extra: 0,
            };
            Response::json(&vllm_completion(&g, 3, true))
        }
        _ => Response::status(404, "{}"),
    });
    let (code, _, err) = live(&server.url, &p, &[]);
    assert_eq!(code, 2);
    assert!(err.contains("ran a verify step"), "{err}");
}

/// #38.23: `--server-counters` on an engine whose responses carry their own per-request figure
/// was silently unused; now a `warning:` says the per-request figure was measured instead.
#[test]
fn server_counters_unused_are_said() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 2);
    let (v, _) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(0),
    });
    let (code, r, err) = live(&v.url, &p, &["--server-counters"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: draft: --server-counters was not used for")
            && err.contains("own per-request figure"),
        "{err}"
    );
    assert!(
        r.to_string().contains("--server-counters was not used"),
        "{r}"
    );
}

#[test]
fn server_counters_measure_each_request_alone_and_refuse_other_traffic() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 2);
    let gen = scripted(0);
    let (al, steps) = expected_al(&gen, &p, 40);
    // vLLM 0.28: no per-request block; the Prometheus counters around each request.
    let (v, _) = vllm(Vllm {
        version: "0.28.0",
        per_request: false,
        gen: gen.clone(),
    });
    let (code, r, err) = live(&v.url, &p, &["--server-counters"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("0.29.0"), "the version warning: {err}");
    assert_eq!(
        (
            r["draft"]["accept_length"].as_f64().unwrap(),
            r["draft"]["rounds"].as_u64().unwrap()
        ),
        (al, steps)
    );
    assert_eq!(r["live"]["draft"]["sources"], json!(["server counters"]));
    assert!(
        err.contains("server-wide counters, one at a time"),
        "saying so: {err}"
    );
    // Another client's request finishes during each of kquant's: refused.
    let cfg = Vllm {
        version: "0.28.0",
        per_request: false,
        gen: gen.clone(),
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s2 = seen.clone();
    let busy = serve(move |r: &Request| {
        if r.path == "/v1/completions" {
            let mut s = s2.lock().unwrap();
            s.finished += 1;
            s.drafts += 5;
        }
        vllm_answer(&cfg, &s2, r)
    });
    let (code, _, err) = live(&busy.url, &p, &["--server-counters"]);
    assert_eq!(code, 2);
    assert!(err.contains("another client"), "{err}");
    // Counters that go backwards (the server restarted during the first request): that request
    // fails, is never measured, and the others count.
    let cfg = Vllm {
        version: "0.28.0",
        per_request: false,
        gen,
    };
    let seen = Arc::new(Mutex::new(Seen {
        drafts: 1000,
        accepted: 1000,
        ..Seen::default()
    }));
    let s3 = seen.clone();
    let restarted = Arc::new(Mutex::new(false));
    let reset = serve(move |r: &Request| {
        if r.path == "/v1/completions" {
            let mut done = restarted.lock().unwrap();
            if !*done {
                let mut s = s3.lock().unwrap();
                (s.drafts, s.accepted) = (0, 0);
                *done = true;
            }
        }
        vllm_answer(&cfg, &s3, r)
    });
    let (code, r, err) = live(&reset.url, &p, &["--server-counters", "--max-failed", "1"]);
    assert_eq!(code, 0, "{err}");
    one_failed(&r, "went backwards");
}

/// The report failed exactly one of its 6 requests, for `why`, and measured the other 5.
fn one_failed(r: &Value, why: &str) {
    let failed = r["live"]["draft"]["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0]["error"].as_str().unwrap().contains(why),
        "{failed:?}"
    );
    assert_eq!(r["samples"], json!(5));
}

#[test]
fn the_preflight_refuses_meaningless_runs_and_warns_about_known_pitfalls() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 1);
    // No speculative algorithm: nothing to measure.
    let s = sglang("0.5.23", Value::Null, scripted(0));
    let (code, _, err) = live(&s.url, &p, &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no speculative decoding") && err.contains("--speculative-algorithm"),
        "{err}"
    );
    // SGLang 0.5.12: the aux-layer off-by-one (sgl-project/sglang#25454), a warning.
    let s = sglang("0.5.12", json!("EAGLE3"), scripted(0));
    let (code, _, err) = live(&s.url, &p, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning:") && err.contains("25454") && err.contains("0.5.13"),
        "{err}"
    );
    // An engine kquant cannot tell, and a named engine that the server contradicts.
    let other = serve(|r: &Request| match r.path.as_str() {
        "/v1/models" => models("llama.cpp"),
        _ => Response::status(404, "{}"),
    });
    let (code, _, err) = live(&other.url, &p, &[]);
    assert_eq!(code, 2);
    assert!(err.contains("--engine vllm|sglang|trtllm"), "{err}");
    let (v, _) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(0),
    });
    let (code, _, err) = live(&v.url, &p, &["--engine", "sglang"]);
    assert_eq!(code, 2);
    assert!(err.contains("--engine vllm"), "{err}");
    // A server that does not answer in --request-timeout: the request fails, never measured.
    let slow = serve(|r: &Request| match r.path.as_str() {
        "/v1/models" => models("vllm"),
        "/v1/completions" => {
            std::thread::sleep(std::time::Duration::from_secs(3));
            Response::status(500, "{}")
        }
        _ => Response::status(404, "{}"),
    });
    let (code, _, err) = live(
        &slow.url,
        &p,
        &[
            "--request-timeout",
            "1",
            "--retries",
            "0",
            "--max-failed",
            "0",
        ],
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("requests failed")
            && err.contains("timed out: no answer within --request-timeout"),
        "{err}"
    );
    // Nothing listening: an error naming the URL, not a panic.
    let gone = v.url.clone();
    drop(v);
    let (code, _, err) = live(&gone, &p, &[]);
    assert_eq!(code, 2);
    assert!(err.contains(&gone) && err.contains("hint:"), "{err}");
}

/// The engine's greedy speculative loop with kquant's tiny-fixture target and `draft`
/// (`verify::sim::simulate`), memoised per (prompt, max_tokens).
fn tiny_engine(draft: &Path) -> Generator {
    use kquant::checkpoint::Checkpoint;
    use kquant::runtime::target::Target;
    let tck = Checkpoint::open(
        &root()
            .join("fixtures/kimi-k2.5-tiny/target")
            .to_string_lossy(),
    )
    .unwrap();
    let target = Target::load(&tck).unwrap();
    let d = kquant::replay::load_drafter(
        &draft.to_string_lossy(),
        Some(&tck),
        &kquant::runtime::linears::Exec::F32,
    )
    .unwrap();
    let eos = target.eos().to_vec();
    let cache: Mutex<std::collections::HashMap<(Vec<u32>, usize), Gen>> = Mutex::default();
    Arc::new(move |ids: &[u32], max: usize| {
        let key = (ids.to_vec(), max);
        if let Some(g) = cache.lock().unwrap().get(&key) {
            return g.clone();
        }
        let s = kquant::verify::sim::simulate(&target, d.as_ref(), ids, max, K).unwrap();
        let mut tokens = s.tokens[ids.len()..].to_vec();
        let mut accepted = s.accepted;
        let mut extra = s.overshoot;
        // The engine stops at EOS (kquant asks `ignore_eos: false`): the continuation ends with
        // it, and the step that committed it commits the drafts up to it (vLLM still counts
        // all it accepted). The loop's proposals at a root never depend on what comes after,
        // so this is the loop run with a stop.
        if let Some(e) = tokens.iter().position(|t| eos.contains(t)) {
            tokens.truncate(e + 1);
            let (mut n_gen, mut kept) = (1usize, Vec::new());
            let last = accepted.len().saturating_sub(1);
            for (i, full) in accepted.into_iter().enumerate() {
                if n_gen >= tokens.len() {
                    break;
                }
                let full = full + if i == last { s.overshoot } else { 0 };
                let a = full.min(tokens.len() - n_gen - 1);
                extra = full - a;
                kept.push(a);
                n_gen += a + 1;
            }
            accepted = kept;
        }
        let g = Gen {
            tokens,
            accepted,
            extra,
        };
        cache.lock().unwrap().insert(key, g.clone());
        g
    })
}

/// Live against the tiny engine behind each protocol equals the offline replay of a trace
/// captured from the same target on the same prompts: the same continuations, the same
/// steps and accepted drafts, so the same accept lengths, ΔAL and interval, to the bit.
#[test]
fn live_and_offline_agree_exactly_on_the_tiny_fixture() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 2);
    let fix = root().join("fixtures/kimi-k2.5-tiny");
    let bf16 = fix.join("eagle3");
    let q = t.path().join("eagle3-int4");
    let o = kquant(&[
        "quantize",
        bf16.to_str().unwrap(),
        "-o",
        q.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--exclude",
        "fc,lm_head",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let trace = t.path().join("trace");
    let o = kquant(&[
        "trace",
        "capture",
        "--target-checkpoint",
        fix.join("target").to_str().unwrap(),
        "--prompts",
        p.to_str().unwrap(),
        "-o",
        trace.to_str().unwrap(),
        "--taps",
        "1,2,3",
        "--gen-len",
        "40",
        "--stop-at-eos",
        "--lookahead",
        "3",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let offline = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5-tiny",
        "--trace",
        trace.to_str().unwrap(),
        "--draft",
        q.to_str().unwrap(),
        "--baseline",
        bf16.to_str().unwrap(),
        "--max-regression",
        "1",
        "--json",
        "-",
    ]);
    assert!(offline.status.success(), "{}", common::stderr(&offline));
    let off: Value = serde_json::from_slice(&offline.stdout).unwrap();
    let (gq, gb) = (tiny_engine(&q), tiny_engine(&bf16));
    // The same greedy continuations as the capture.
    let tr = kquant::trace::file::Trace::open(&trace).unwrap();
    for (s, (_, ids)) in tr.manifest.samples.iter().zip(token_prompts(&p)) {
        let x = tr.tokens(s).unwrap();
        assert_eq!(&x[..s.prompt_len], &ids[..]);
        // Up to the stop; the lookahead past it is the target's greedy continuation.
        let stop = s.stop();
        assert_eq!(x.len(), stop + 3, "sample {}: 3 tokens of lookahead", s.id);
        assert_eq!(
            gq(&ids, 40).tokens,
            x[s.prompt_len..stop],
            "sample {}",
            s.id
        );
        assert_eq!(
            gb(&ids, 40).tokens,
            x[s.prompt_len..stop],
            "sample {}",
            s.id
        );
    }
    let (vq, _) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: gq.clone(),
    });
    let (vb, _) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: gb.clone(),
    });
    let sq = sglang("0.5.23", json!("EAGLE3"), gq.clone());
    let sb = sglang("0.5.23", json!("EAGLE3"), gb.clone());
    let (tq, tb) = (trtllm(gq), trtllm(gb));
    for (engine, a, b) in [
        ("vllm", &vq, &vb),
        ("sglang", &sq, &sb),
        ("trtllm", &tq, &tb),
    ] {
        let (code, live, err) = live(
            &a.url,
            &p,
            &["--baseline-endpoint", &b.url, "--max-regression", "1"],
        );
        assert_eq!(code, 0, "{engine}: {err}");
        for k in ["delta", "ci95", "samples"] {
            assert_eq!(live[k], off[k], "{engine}: {k}");
        }
        for side in ["draft", "baseline"] {
            for k in ["accept_length", "rounds", "accept_length_sglang_request"] {
                assert_eq!(live[side][k], off[side][k], "{engine}: {side}.{k}");
            }
            // The engine's own count: vLLM's holds the final step before its cut, as the
            // replay over the lookahead predicts; SGLang's and TensorRT-LLM's are the
            // committed tokens.
            let want = if engine == "vllm" {
                &off[side]["accept_length_engine"]
            } else {
                &off[side]["accept_length"]
            };
            assert_eq!(
                &live[side]["accept_length_engine"], want,
                "{engine}: {side}"
            );
            // Request by request.
            let (lr, or) = (&live["live"][side]["requests"], &off[side]["requests"]);
            assert_eq!(lr.as_array().unwrap().len(), 6);
            for (l, o) in lr.as_array().unwrap().iter().zip(or.as_array().unwrap()) {
                assert_eq!(l["id"].as_str().unwrap(), o["id"].to_string());
                for k in ["steps", "committed"] {
                    assert_eq!(l[k], o[k], "{engine}: {side} request {}: {k}", o["id"]);
                }
                let acc = if engine == "vllm" {
                    &o["accepted"]
                } else {
                    &o["committed"]
                };
                assert_eq!(&l["accepted"], acc, "{engine}: {side} request {}", o["id"]);
            }
        }
        if engine == "vllm" {
            // The drafts per step the server reports, not 0.
            assert_eq!(live["steps"], json!(K), "{engine}");
            // The overshoot is there to be modelled: some request's final step was cut.
            assert_ne!(
                off["draft"]["accept_length_engine"], off["draft"]["accept_length"],
                "no final step was cut: the test cannot tell the two counts apart"
            );
        }
        for (c, v) in off["per_category"].as_object().unwrap() {
            for k in ["n", "draft", "baseline", "delta", "ci95"] {
                assert_eq!(live["per_category"][c][k], v[k], "{engine}: {c}.{k}");
            }
        }
        assert_eq!(
            live["live"]["same_output"],
            json!({"compared": 6, "equal": 6}),
            "{engine}"
        );
    }
}

/// An MT-Bench `question.jsonl` goes out as chat messages (`turns[0]`) to the chat routes:
/// vLLM `/v1/chat/completions`, SGLang `/v1/chat/completions` with
/// `return_spec_tokens_details` (its figures under `sglext.spec_tokens_details`).
#[test]
fn chat_prompt_sets_go_to_the_chat_routes() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("question.jsonl");
    std::fs::write(
        &p,
        concat!(
            r#"{"question_id": 81, "category": "writing", "turns": ["Compose an engaging travel blog post about a recent trip to Hawaii.", "Rewrite your previous response."]}"#, "\n",
            r#"{"question_id": 101, "category": "reasoning", "turns": ["Imagine you are participating in a race with a group of people.", "What if?"]}"#, "\n",
        ),
    )
    .unwrap();
    let gen = scripted(0);
    let ids = |v: &Value| -> Vec<u32> {
        v["messages"][0]["content"]
            .as_str()
            .unwrap()
            .bytes()
            .map(u32::from)
            .collect()
    };
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let (g1, s1) = (gen.clone(), seen.clone());
    let v = serve(move |r: &Request| match r.path.as_str() {
        "/v1/models" => models("vllm"),
        "/v1/chat/completions" => {
            let b = r.json();
            s1.lock().unwrap().push(b.clone());
            let g = g1(&ids(&b), max_tokens(&b));
            let mut c = vllm_completion(&g, 9, true);
            c["object"] = json!("chat.completion");
            c["choices"][0] = json!({"index": 0, "message": {"role": "assistant", "content": text_of(&g)}, "logprobs": null, "finish_reason": "length"});
            Response::json(&c)
        }
        _ => Response::status(404, "{}"),
    });
    let (code, r, err) = live(&v.url, &p, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["live"]["prompt_format"], json!("mt-bench"));
    let bodies = seen.lock().unwrap().clone();
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        bodies[0]["messages"],
        json!([{"role": "user", "content": "Compose an engaging travel blog post about a recent trip to Hawaii."}])
    );
    assert_eq!(
        r["per_category"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["reasoning", "writing"]
    );
    let (mut steps, mut committed) = (0, 0);
    for b in &bodies {
        let g = gen(&ids(b), 40);
        steps += g.steps();
        committed += g.steps() + g.acc();
    }
    assert_eq!(
        r["draft"]["accept_length"].as_f64().unwrap(),
        committed as f64 / steps as f64
    );
    // SGLang's OpenAI route with the details asked for.
    let g2 = gen.clone();
    let s = serve(move |r: &Request| match r.path.as_str() {
        "/v1/models" => models("sglang"),
        "/server_info" => Response::json(&sglang_info("0.5.23", json!("EAGLE3"))),
        "/v1/chat/completions" => {
            let b = r.json();
            assert_eq!(b["return_spec_tokens_details"], json!(true));
            let g = g2(&ids(&b), max_tokens(&b));
            let meta = sglang_generate(&g, 9)["meta_info"].clone();
            Response::json(
                &json!({"id": "x", "object": "chat.completion", "created": 1, "model": "kimi-k2.5-tiny",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text_of(&g)}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": g.tokens.len(), "total_tokens": 9 + g.tokens.len()},
                "sglext": {"spec_tokens_details": meta}}),
            )
        }
        _ => Response::status(404, "{}"),
    });
    let (code, r2, err) = live(&s.url, &p, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r2["draft"]["accept_length"], r["draft"]["accept_length"]);
    assert_eq!(
        r2["live"]["draft"]["sources"],
        json!(["sglext.spec_tokens_details"])
    );
}

/// TensorRT-LLM without the per-request field: its iteration stats (`/metrics`, JSON, drained
/// on read) around each request.
#[test]
fn trtllm_iteration_stats_are_drained_around_each_request() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 2);
    let gen = scripted(1);
    let (al, steps) = expected_al(&gen, &p, 40);
    let pending: Arc<Mutex<Vec<Value>>> = Arc::default();
    let (g, q) = (gen.clone(), pending.clone());
    let server = serve(move |r: &Request| match r.path.as_str() {
        "/v1/models" => models("tensorrt_llm"),
        "/metrics" => {
            // Drained on read (`get_stats_async`): each GET returns and removes the queue.
            let its: Vec<Value> = std::mem::take(&mut *q.lock().unwrap());
            Response::json(&json!(its))
        }
        "/v1/completions" => {
            let v = r.json();
            let ids = prompt_ids(&v);
            let gn = g(&ids, max_tokens(&v));
            let mut its = q.lock().unwrap();
            // The context iteration (no drafts), then one iteration per verify step.
            let n = its.len();
            its.push(json!({"iter": n, "iterLatencyMS": 20.0, "numActiveRequests": 1,
                "specDecodingStats": {"numDraftTokens": 0, "numAcceptedTokens": 0, "numRequestsWithDraftTokens": 0,
                    "acceptanceLength": 1.0, "iterLatencyMS": 0.0, "draftOverhead": 0.0}}));
            for &a in &gn.accepted {
                let n = its.len();
                its.push(json!({"iter": n, "iterLatencyMS": 21.3, "numActiveRequests": 1,
                    "specDecodingStats": {"numDraftTokens": K, "numAcceptedTokens": a, "numRequestsWithDraftTokens": 1,
                        "acceptanceLength": 1.0 + a as f64, "iterLatencyMS": 0.0, "draftOverhead": 0.0}}));
            }
            let mut c = trtllm_completion(&gn, ids.len());
            c["choices"][0]
                .as_object_mut()
                .unwrap()
                .remove("avg_decoded_tokens_per_iter");
            Response::json(&c)
        }
        _ => Response::status(404, "{}"),
    });
    let (code, _, err) = live(&server.url, &p, &[]);
    assert_eq!(code, 2, "no per-request figure and no --server-counters");
    assert!(err.contains("--server-counters"), "{err}");
    let (code, r, err) = live(&server.url, &p, &["--server-counters"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (
            r["draft"]["accept_length"].as_f64().unwrap(),
            r["draft"]["rounds"].as_u64().unwrap()
        ),
        (al, steps)
    );
}

/// `--published DRAFT`: the figures `--target`'s profile quotes for the draft on the prompt
/// set's benchmark (kimi-k2.6: nvidia/Kimi-K2.6-Eagle3 on MT-Bench, overall and per category)
/// are floors, each a JUnit testcase.
#[test]
fn published_figures_are_floors() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("question.jsonl");
    let mut lines = String::new();
    for (i, c) in ["coding", "writing", "coding", "writing", "stem"]
        .iter()
        .enumerate()
    {
        lines.push_str(&json!({"question_id": 81 + i, "category": c, "turns": [format!("Question {i} about {c}, answered at length."), "And then?"]}).to_string());
        lines.push('\n');
    }
    std::fs::write(&p, lines).unwrap();
    let gen = scripted(1);
    let server = serve(move |r: &Request| match r.path.as_str() {
        "/v1/models" => models("vllm"),
        "/v1/chat/completions" => {
            let b = r.json();
            let ids: Vec<u32> = b["messages"][0]["content"]
                .as_str()
                .unwrap()
                .bytes()
                .map(u32::from)
                .collect();
            let g = gen(&ids, max_tokens(&b));
            let mut c = vllm_completion(&g, 9, true);
            c["choices"][0] = json!({"index": 0, "message": {"role": "assistant", "content": text_of(&g)}, "finish_reason": "length"});
            Response::json(&c)
        }
        _ => Response::status(404, "{}"),
    });
    let junit = t.path().join("j.xml");
    let (code, r, err) = live(
        &server.url,
        &p,
        &[
            "--target",
            "kimi-k2.6",
            "--published",
            "nvidia/Kimi-K2.6-Eagle3",
            "--junit",
            junit.to_str().unwrap(),
        ],
    );
    let checks = r["published"].as_array().unwrap_or_else(|| panic!("{err}"));
    let mut names: Vec<&str> = checks
        .iter()
        .map(|c| c["benchmark"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["MT-Bench", "MT-Bench coding", "MT-Bench writing"],
        "no card figure for stem"
    );
    let mut any_failed = false;
    for c in checks {
        let (m, pb) = (
            c["measured"].as_f64().unwrap(),
            c["published"].as_f64().unwrap(),
        );
        assert_eq!(c["passed"].as_bool().unwrap(), m >= pb - 0.03);
        any_failed |= !c["passed"].as_bool().unwrap();
        let cat = c["category"].as_str().unwrap_or("overall");
        let measured = if cat == "overall" {
            &r["draft"]["accept_length"]
        } else {
            &r["per_category"][cat]["draft"]
        };
        assert_eq!(c["measured"], *measured);
    }
    assert_eq!(code, if any_failed { 1 } else { 0 }, "{err}");
    let x = std::fs::read_to_string(&junit).unwrap();
    // #38.23: the card's benchmark names its category once ("writing writing" no more).
    assert!(
        x.contains("name=\"published MT-Bench coding: at least")
            && x.contains("name=\"published MT-Bench (overall): at least")
            && !x.contains("coding coding"),
        "{x}"
    );
    // And in the table.
    let o = kquant(&[
        "verify",
        "--endpoint",
        &server.url,
        "--prompts",
        p.to_str().unwrap(),
        "--max-tokens",
        "40",
        "--target",
        "kimi-k2.6",
        "--published",
        "nvidia/Kimi-K2.6-Eagle3",
    ]);
    let table = String::from_utf8_lossy(&o.stdout);
    for b in [
        "MT-Bench (overall)",
        "MT-Bench coding (coding)",
        "MT-Bench writing (writing)",
    ] {
        assert!(
            table.contains(&format!("published {b}: measured ")),
            "{table}"
        );
    }
    // Token-id prompts are no benchmark: nothing to compare with.
    let tp = prompts(t.path(), 1);
    let (code, _, err) = live(
        &server.url,
        &tp,
        &[
            "--target",
            "kimi-k2.6",
            "--published",
            "nvidia/Kimi-K2.6-Eagle3",
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("no benchmark"), "{err}");
}

/// #27.19: `--published` takes every benchmark file a user has. SPEED-Bench prompts are held
/// against the card's "SPEED-Bench qualitative subset" figure; the bundled
/// `quant-configs/prompts/mt_bench.jsonl` (plain records naming `"dataset": "mt_bench"`)
/// against MT-Bench's. A profile that quotes no figure for the draft on the prompts' benchmark
/// is refused before one request is sent. A server whose model does not name the target gets a
/// `warning:`; one that does, none.
#[test]
fn published_takes_speed_bench_and_the_bundled_mt_bench_and_checks_before_sending() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let t = tempfile::tempdir().unwrap();
    let gen = scripted(1);
    let sent = Arc::new(AtomicUsize::new(0));
    let seen = sent.clone();
    let server = serve(move |r: &Request| match r.path.as_str() {
        "/v1/models" => models("vllm"),
        "/v1/chat/completions" | "/v1/completions" => {
            seen.fetch_add(1, Ordering::SeqCst);
            let b = r.json();
            let text = b["messages"][0]["content"]
                .as_str()
                .or(b["prompt"].as_str())
                .unwrap_or("")
                .to_string();
            let ids: Vec<u32> = text.bytes().map(u32::from).collect();
            let g = gen(&ids, max_tokens(&b));
            let mut c = vllm_completion(&g, 9, true);
            // As vLLM does: the response names the model the request named.
            c["model"] = b["model"].clone();
            if r.path == "/v1/chat/completions" {
                c["choices"][0] = json!({"index": 0, "message": {"role": "assistant", "content": text_of(&g)}, "finish_reason": "length"});
            }
            Response::json(&c)
        }
        _ => Response::status(404, "{}"),
    });
    let speed = t.path().join("speed.jsonl");
    let mut lines = String::new();
    for (i, c) in ["coding", "writing", "math"].iter().enumerate() {
        lines.push_str(&json!({"category": c, "messages": [{"role": "user", "content": format!("Task {i} in {c}, at length please.")}]}).to_string());
        lines.push('\n');
    }
    std::fs::write(&speed, lines).unwrap();
    let pub_args = [
        "--target",
        "kimi-k2.6",
        "--published",
        "nvidia/Kimi-K2.6-Eagle3",
    ];
    let (code, r, err) = live(&server.url, &speed, &pub_args);
    assert!(code == 0 || code == 1, "{err}");
    let checks = r["published"].as_array().unwrap_or_else(|| panic!("{err}"));
    assert_eq!(checks.len(), 1, "{checks:?}");
    assert_eq!(checks[0]["benchmark"], "SPEED-Bench qualitative subset");
    assert_eq!(checks[0]["measured"], r["draft"]["accept_length"]);
    // The stand-in serves `kimi-k2.5-tiny`, which is not Kimi-K2.6.
    assert!(
        err.contains(
            "warning: the endpoint serves `kimi-k2.5-tiny`, which does not name target `kimi-k2.6`"
        ),
        "{err}"
    );
    // Named by --model as the target's own: no warning.
    let mut named = pub_args.to_vec();
    named.extend(["--model", "moonshotai/Kimi-K2.6"]);
    let (code, _, err) = live(&server.url, &speed, &named);
    assert!(code == 0 || code == 1, "{err}");
    assert!(!err.contains("does not name target"), "{err}");

    let bundled = common::root().join("quant-configs/prompts/mt_bench.jsonl");
    let mut args = pub_args.to_vec();
    args.extend(["--per-category", "1"]);
    let (code, r, err) = live(&server.url, &bundled, &args);
    assert!(code == 0 || code == 1, "{err}");
    let names: Vec<&str> = r["published"]
        .as_array()
        .unwrap_or_else(|| panic!("{err}"))
        .iter()
        .map(|c| c["benchmark"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"MT-Bench"), "{names:?}");

    // kimi-k2.5 quotes nothing for this draft: refused before any request.
    let before = sent.load(Ordering::SeqCst);
    let (code, _, err) = live(
        &server.url,
        &speed,
        &[
            "--target",
            "kimi-k2.5",
            "--published",
            "nvidia/Kimi-K2.6-Eagle3",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("quotes no accept length"), "{err}");
    assert_eq!(
        sent.load(Ordering::SeqCst),
        before,
        "requests were sent: {err}"
    );
}

/// SGLang's OpenAI route before 0.5.19 has no acceptance fields; with `--enable-metrics` its
/// Prometheus counters (counted when a request finishes) measure each request alone.
#[test]
fn sglang_prometheus_counters_measure_chat_requests() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("gsm8k.jsonl");
    std::fs::write(
        &p,
        concat!(
            r#"{"question": "Janet's ducks lay 16 eggs per day. How much does she make?", "answer": "She makes 9 * 2 = $18.\n#### 18"}"#, "\n",
            r#"{"question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts?", "answer": "2 + 1 = 3\n#### 3"}"#, "\n",
        ),
    )
    .unwrap();
    let gen = scripted(0);
    let ids = |v: &Value| -> Vec<u32> {
        v["messages"][0]["content"]
            .as_str()
            .unwrap()
            .bytes()
            .map(u32::from)
            .collect()
    };
    let counters: Arc<Mutex<(u64, u64, u64)>> = Arc::default();
    let (g, c) = (gen.clone(), counters.clone());
    let s = serve(move |r: &Request| match r.path.as_str() {
        "/v1/models" => models("sglang"),
        "/server_info" => Response::json(&sglang_info("0.5.18", json!("EAGLE3"))),
        "/metrics" => {
            let (verify, tokens, reqs) = *c.lock().unwrap();
            Response::text(&format!(
                "# HELP sglang:spec_verify_calls_total The number of verification forward calls in the speculative decoding.\n\
# TYPE sglang:spec_verify_calls_total counter\n\
sglang:spec_verify_calls_total{{model_name=\"kimi-k2.5-tiny\",engine_type=\"unified\"}} {verify}.0\n\
# HELP sglang:generation_tokens_total Number of generation tokens processed.\n\
# TYPE sglang:generation_tokens_total counter\n\
sglang:generation_tokens_total{{model_name=\"kimi-k2.5-tiny\",engine_type=\"unified\",is_streaming=\"false\"}} {tokens}.0\n\
sglang:generation_tokens_total{{model_name=\"kimi-k2.5-tiny\",engine_type=\"unified\",is_streaming=\"true\"}} 0.0\n\
# HELP sglang:num_requests_total Number of requests processed.\n\
# TYPE sglang:num_requests_total counter\n\
sglang:num_requests_total{{model_name=\"kimi-k2.5-tiny\",engine_type=\"unified\"}} {reqs}.0\n"
            ))
        }
        "/v1/chat/completions" => {
            let b = r.json();
            let gn = g(&ids(&b), max_tokens(&b));
            let mut k = c.lock().unwrap();
            *k = (k.0 + gn.steps(), k.1 + gn.tokens.len() as u64, k.2 + 1);
            Response::json(
                &json!({"id": "x", "object": "chat.completion", "created": 1, "model": "kimi-k2.5-tiny",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text_of(&gn)}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": gn.tokens.len(), "total_tokens": 9 + gn.tokens.len()}}),
            )
        }
        _ => Response::status(404, "{}"),
    });
    let (code, _, err) = live(&s.url, &p, &[]);
    assert_eq!(code, 2);
    assert!(err.contains("0.5.19"), "{err}");
    let (code, r, err) = live(&s.url, &p, &["--server-counters"]);
    assert_eq!(code, 0, "{err}");
    let (mut steps, mut committed) = (0, 0);
    for q in [
        "Janet's ducks lay 16 eggs per day. How much does she make?",
        "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts?",
    ] {
        let g = gen(&q.bytes().map(u32::from).collect::<Vec<_>>(), 40);
        steps += g.steps();
        committed += g.steps() + g.acc();
    }
    assert_eq!(
        r["draft"]["accept_length"].as_f64().unwrap(),
        committed as f64 / steps as f64
    );
    assert_eq!(r["per_category"]["gsm8k"]["n"], json!(2));
    assert_eq!(r["live"]["draft"]["sources"], json!(["server counters"]));
}

/// A live `--target` without `--prompts` sends the profile's bundled held-out set; `--limit`
/// keeps the first N of each category.
#[test]
fn the_tiny_profile_bundles_its_prompts_and_limit_caps_each_category() {
    let (v, seen) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(0),
    });
    let o = kquant(&[
        "verify",
        "--endpoint",
        &v.url,
        "--target",
        "kimi-k2.5-tiny",
        "--limit",
        "2",
        "--max-tokens",
        "16",
        "--json",
        "-",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["samples"], json!(6), "3 categories x 2");
    assert_eq!(r["limit_per_category"], json!(2));
    assert!(
        r["live"]["prompts"]
            .as_str()
            .unwrap()
            .ends_with("heldout.jsonl"),
        "{}",
        r["live"]["prompts"]
    );
    assert_eq!(r["live"]["prompt_format"], json!("tokens"));
    assert_eq!(seen.lock().unwrap().bodies.len(), 6);
}

/// A response whose figures its own token counts contradict (10^12 steps for 40 tokens; no step
/// but 10^6 accepted drafts; more tokens than `max_tokens`; more accepted than one final step
/// can add to the committed ones) is failed and never measured: one such response in ten no
/// longer lifts an AL-1.2 draft over `--min-accept` (issue: "one impossible response passes a
/// failing gate"). Each engine's figures go through the same check.
#[test]
fn figures_the_response_contradicts_are_failed_not_measured() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 4);
    // A weak draft: mostly nothing accepted.
    let weak: Generator = Arc::new(|prompt: &[u32], max: usize| {
        let (mut n_gen, mut accepted) = (1usize, Vec::new());
        while n_gen < max {
            let n = usize::from(n_gen % 5 == 0).min(max - n_gen - 1);
            accepted.push(n);
            n_gen += n + 1;
        }
        Gen {
            tokens: (0..n_gen as u32).map(|i| i + prompt.len() as u32).collect(),
            accepted,
            extra: 0,
        }
    });
    let lies: [fn(&mut Value); 4] = [
        |v: &mut Value| {
            v["metrics"]["speculative_decoding"]["num_spec_steps"] = json!(1_000_000_000_000u64)
        },
        |v: &mut Value| {
            let m = &mut v["metrics"]["speculative_decoding"];
            m["num_spec_steps"] = json!(0);
            m["num_accepted_draft_tokens"] = json!(1_000_000);
        },
        |v: &mut Value| v["usage"]["completion_tokens"] = json!(41),
        |v: &mut Value| {
            let m = &mut v["metrics"]["speculative_decoding"];
            let steps = m["num_spec_steps"].as_u64().unwrap();
            m["num_accepted_draft_tokens"] = json!(steps * 3);
        },
    ];
    for (which, &lie) in lies.iter().enumerate() {
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (g, n2) = (weak.clone(), n.clone());
        let server = serve(
            move |r: &Request| match (r.method.as_str(), r.path.as_str()) {
                ("GET", "/v1/models") => models("vllm"),
                ("GET", "/version") => Response::json(&json!({"version": "0.33.0"})),
                ("POST", "/v1/completions") => {
                    let v = r.json();
                    let ids = prompt_ids(&v);
                    let mut out = vllm_completion(&g(&ids, max_tokens(&v)), ids.len(), true);
                    // The histogram goes where the lie does, so only the counts can tell.
                    out["metrics"]["speculative_decoding"]
                        .as_object_mut()
                        .unwrap()
                        .remove("acceptance_histogram");
                    if n2.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 6 == 0 {
                        lie(&mut out);
                    }
                    Response::json(&out)
                }
                _ => Response::status(404, "{}"),
            },
        );
        let (code, r, err) = live(
            &server.url,
            &p,
            &["--min-accept", "1.5", "--max-failed", "50%"],
        );
        assert_eq!(code, 1, "lie {which}: the weak draft still fails: {err}");
        let failed = r["live"]["draft"]["failed"].as_array().unwrap();
        assert_eq!(failed.len(), 2, "lie {which}: {failed:?}");
        assert!(
            failed.iter().all(|f| {
                let e = f["error"].as_str().unwrap();
                e.contains("contradicts the response") || e.contains("breaks vllm's schema")
            }),
            "lie {which}: {failed:?}"
        );
        assert!(r["draft"]["accept_length"].as_f64().unwrap() < 1.5);
        // Beyond --max-failed: exit 2, never a verdict.
        let (code, _, err) = live(&server.url, &p, &["--min-accept", "1.5"]);
        assert_eq!(code, 2, "lie {which}: {err}");
    }
}

/// A redirect is never followed (a 301/302/303 turns the POST into a GET without the prompt,
/// and another server would be measured under this one's name): the request fails naming
/// where it pointed; a 307 as well.
#[test]
fn redirects_are_refused_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 1);
    let (other, other_seen) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(3),
    });
    for code in [301u16, 302, 303, 307] {
        let to = format!("{}/v1/completions", other.url);
        let server = serve(
            move |r: &Request| match (r.method.as_str(), r.path.as_str()) {
                ("GET", "/v1/models") => models("vllm"),
                ("GET", "/version") => Response::json(&json!({"version": "0.33.0"})),
                ("POST", "/v1/completions") => Some(Response {
                    status: code,
                    content_type: "application/json",
                    body: "{}".into(),
                    location: Some(to.clone()),
                }),
                _ => Response::status(404, "{}"),
            },
        );
        let (c, _, err) = live(&server.url, &p, &[]);
        assert_eq!(c, 2, "{code}: {err}");
        assert!(
            err.contains(&format!("HTTP {code} redirects to")) && err.contains(&other.url),
            "{code}: {err}"
        );
    }
    assert!(
        other_seen.lock().unwrap().bodies.is_empty(),
        "the redirect target was reached"
    );
}

/// `--baseline-endpoint` naming the same server as `--endpoint` (`localhost` for `127.0.0.1`,
/// a trailing `/v1/`) is refused before any request: the paired ΔAL would be 0 whatever the
/// draft.
#[test]
fn a_baseline_that_is_the_same_server_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 1);
    let (v, seen) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(0),
    });
    let same = format!("{}/v1/", v.url.replace("127.0.0.1", "localhost"));
    for b in [v.url.as_str(), same.as_str()] {
        let (c, _, err) = live(&v.url, &p, &["--baseline-endpoint", b]);
        assert_eq!(c, 2, "{b}: {err}");
        assert!(
            err.contains("is the same server") && err.contains("hint:"),
            "{err}"
        );
    }
    assert!(seen.lock().unwrap().bodies.is_empty());
}

/// The same server under another spelling of its address (the IPv4 shorthands a URL parser
/// reads as 127.0.0.1, an IPv4-mapped IPv6 address, a leading-zero port, userinfo, a `/./`
/// path, `0.0.0.0`, this machine's loopback by name) is still the same server: addresses are
/// parsed and resolved before they are compared (issue 38, item 6; docs/verify.md, "Which
/// servers are the same"). Another port is another server.
#[test]
fn a_baseline_under_another_spelling_of_the_address_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 1);
    let (v, seen) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(0),
    });
    let port = v.url.rsplit(':').next().unwrap().to_string();
    let spellings = [
        format!("http://127.1:{port}"),
        format!("http://2130706433:{port}"),
        format!("http://0x7f000001:{port}"),
        format!("http://0177.0.0.1:{port}"),
        format!("http://127.0.0.1:0{port}"),
        format!("http://[::ffff:127.0.0.1]:{port}"),
        format!("http://[::1]:{port}"),
        format!("http://user:secret@127.0.0.1:{port}"),
        format!("http://127.0.0.1:{port}/./"),
        format!("http://127.0.0.1:{port}/x/../v1"),
        format!("http://0.0.0.0:{port}"),
        format!("http://LOCALHOST.:{port}"),
        format!("https://127.0.0.1:{port}"),
    ];
    for b in &spellings {
        let (c, _, err) = live(&v.url, &p, &["--baseline-endpoint", b]);
        assert_eq!(c, 2, "{b}: {err}");
        assert!(
            err.contains("is the same server") && err.contains("hint:"),
            "{b}: {err}"
        );
    }
    assert!(seen.lock().unwrap().bodies.is_empty());
    // Another port, or another path prefix (a proxy's routes), is another server: measured.
    let (w, _) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(1),
    });
    let other = w.url.replace("127.0.0.1", "127.1");
    let (c, r, err) = live(&v.url, &p, &["--baseline-endpoint", &other]);
    assert!(c == 0 || c == 1, "{err}");
    assert!(r["delta"].is_number(), "{r}");
}

/// A response that names another model than the one requested (a server that ignores
/// `model`, another deployment behind the URL) refuses the run, naming both; with
/// `--allow-other-model` it is measured, with a warning, and the report names the answering
/// model per request and per side (issue 38, item 7).
#[test]
fn an_answer_from_another_model_is_refused_unless_allowed() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 1);
    let gen = scripted(1);
    let server = serve(
        move |r: &Request| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/v1/models") => models("vllm"),
            ("GET", "/version") => Response::json(&json!({"version": "0.33.0"})),
            ("POST", "/v1/completions") => {
                let v = r.json();
                let ids = prompt_ids(&v);
                let mut out = vllm_completion(&gen(&ids, max_tokens(&v)), ids.len(), true);
                out["model"] = json!("other-org/Other-Model");
                Response::json(&out)
            }
            _ => Response::status(404, "{}"),
        },
    );
    let (c, _, err) = live(&server.url, &p, &[]);
    assert_eq!(c, 2, "{err}");
    assert!(
        err.contains("error:")
            && err.contains("`other-org/Other-Model`, not `kimi-k2.5-tiny`")
            && err.contains("hint:")
            && err.contains("--allow-other-model"),
        "{err}"
    );
    let (c, r, err) = live(&server.url, &p, &["--allow-other-model"]);
    assert_eq!(c, 0, "{err}");
    assert!(
        err.contains("warning: draft: responses name model `other-org/Other-Model`"),
        "{err}"
    );
    assert_eq!(r["live"]["draft"]["model"], json!("kimi-k2.5-tiny"));
    assert_eq!(
        r["live"]["draft"]["answered_by"],
        json!(["other-org/Other-Model"])
    );
    assert_eq!(
        r["live"]["draft"]["requests"][0]["model"],
        json!("other-org/Other-Model")
    );
}

/// The offline replay's flags (`--near-ties`, `--steps`, `--after-miss`,
/// `--target-checkpoint`) mean nothing to a live run, which measures the server's own loop:
/// refused when the command line is parsed (`error:`, `hint:`, exit 2), before any request
/// (issue 38, item 8).
#[test]
fn offline_replay_flags_on_a_live_run_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 1);
    let (v, seen) = vllm(Vllm {
        version: "0.33.0",
        per_request: true,
        gen: scripted(0),
    });
    for extra in [
        &["--near-ties", "0.5"][..],
        &["--steps", "3"],
        &["--after-miss", "skip"],
        &["--after-miss", "run"],
        &["--target-checkpoint", "fixtures/kimi-k2.5-tiny/target"],
    ] {
        let (c, _, err) = live(&v.url, &p, extra);
        assert_eq!(c, 2, "{extra:?}: {err}");
        assert!(
            err.starts_with("error:") && err.contains(extra[0]) && err.contains("--endpoint"),
            "{extra:?}: {err}"
        );
        let hint = err.lines().find(|l| l.starts_with("hint:")).unwrap_or("");
        assert!(hint.contains("offline replay"), "{extra:?}: {err}");
    }
    assert!(seen.lock().unwrap().bodies.is_empty());
}

/// The preflight (`/v1/models`, `/version`, `/metrics`) takes at most one `--request-timeout`
/// in all: once a call has used it up, the preflight's other calls are not sent (it waited a
/// timeout per call, twice and more for a server that does not answer; issue 38, adversary's
/// extras). The prompts still get their own timeout each.
#[test]
fn the_preflight_takes_one_request_timeout_in_all() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 1);
    for hangs in ["/v1/models", "/version"] {
        let gets: Arc<Mutex<Vec<String>>> = Arc::default();
        let g = gets.clone();
        let gen = scripted(1);
        let server = serve(move |r: &Request| {
            if r.method == "GET" {
                g.lock().unwrap().push(r.path.clone());
            }
            if r.path == hangs {
                // Far past --request-timeout: kquant gives up first.
                std::thread::sleep(std::time::Duration::from_secs(20));
                return None;
            }
            match (r.method.as_str(), r.path.as_str()) {
                ("GET", "/v1/models") => models("vllm"),
                ("GET", "/version") => Response::json(&json!({"version": "0.33.0"})),
                ("GET", "/metrics") => Response::text(&vllm_metrics(0, 0, 0)),
                ("POST", "/v1/completions") => {
                    let v = r.json();
                    let ids = prompt_ids(&v);
                    Response::json(&vllm_completion(
                        &gen(&ids, max_tokens(&v)),
                        ids.len(),
                        true,
                    ))
                }
                _ => Response::status(404, "{}"),
            }
        });
        let (c, r, err) = live(
            &server.url,
            &p,
            &[
                "--engine",
                "vllm",
                "--request-timeout",
                "1",
                "--model",
                "kimi-k2.5-tiny",
            ],
        );
        assert_eq!(c, 0, "{hangs}: {err}");
        assert!(r["draft"]["accept_length"].is_number(), "{r}");
        let gets = gets.lock().unwrap().clone();
        let after: Vec<&String> = gets
            .iter()
            .skip_while(|g| g.as_str() != hangs)
            .skip(1)
            .collect();
        assert!(
            after.is_empty(),
            "{hangs}: the preflight went on past its timeout: {gets:?}"
        );
        assert!(
            err.contains("not sent: the preflight had already taken --request-timeout"),
            "{hangs}: {err}"
        );
    }
}

/// One text mode for live and the capture script: the bundled MT-Bench set's `text` records
/// (`"dataset": "mt_bench"`) go to the chat route as one user message, as
/// `scripts/vllm_capture.py` chat-templates them (they went as raw completions); a user's own
/// text goes as it is; `--text-mode chat|raw` sends every text one way; the report says which
/// (issue 38, item 15).
#[test]
fn text_goes_through_chat_as_the_capture_script_renders_it() {
    let t = tempfile::tempdir().unwrap();
    let routes: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let seen = routes.clone();
    let gen = scripted(1);
    let server = serve(move |r: &Request| match r.path.as_str() {
        "/v1/models" => models("vllm"),
        "/version" => Response::json(&json!({"version": "0.33.0"})),
        "/v1/chat/completions" | "/v1/completions" => {
            let b = r.json();
            seen.lock().unwrap().push((r.path.clone(), b.clone()));
            let g = gen(&[1, 2, 3], max_tokens(&b));
            let mut c = vllm_completion(&g, 3, true);
            if r.path == "/v1/chat/completions" {
                c["choices"][0] = json!({"index": 0, "message": {"role": "assistant", "content": text_of(&g)}, "finish_reason": "length"});
            }
            Response::json(&c)
        }
        _ => Response::status(404, "{}"),
    });
    let bundled = common::root().join("quant-configs/prompts/mt_bench.jsonl");
    let own = t.path().join("own.jsonl");
    std::fs::write(
        &own,
        "{\"id\": \"a\", \"text\": \"Once upon a time\"}\n{\"id\": \"b\", \"text\": \"def main():\"}\n",
    )
    .unwrap();
    for (file, mode, chat) in [
        (&bundled, None, true),
        (&bundled, Some("raw"), false),
        (&own, None, false),
        (&own, Some("chat"), true),
    ] {
        routes.lock().unwrap().clear();
        let mut extra = vec!["--per-category", "1"];
        if let Some(m) = mode {
            extra.extend(["--text-mode", m]);
        }
        let (c, r, err) = live(&server.url, file, &extra);
        assert_eq!(c, 0, "{file:?} {mode:?}: {err}");
        let sent = routes.lock().unwrap().clone();
        assert!(!sent.is_empty());
        for (route, body) in &sent {
            if chat {
                assert_eq!(route, "/v1/chat/completions", "{file:?} {mode:?}");
                assert_eq!(body["messages"][0]["role"], "user", "{body}");
                assert!(body["messages"][0]["content"].is_string(), "{body}");
            } else {
                assert_eq!(route, "/v1/completions", "{file:?} {mode:?}");
                assert!(body["prompt"].is_string(), "{body}");
            }
        }
        assert_eq!(r["live"]["text_mode"], json!(mode.unwrap_or("auto")));
    }
}

/// `kquant verify-join LIVE OFFLINE`: the per-request join of a live report and an offline one
/// ("Reading a disagreement"): ids matched as strings (`0` with the trace's 0; `test-0` kept,
/// listed as only live), each difference told explained by a near-tie or not; the reports in
/// the wrong order, or not reports, are exit 2 naming the file (issue 38, item 18).
#[test]
fn verify_join_lines_up_live_and_offline_per_request() {
    let t = tempfile::tempdir().unwrap();
    let live = t.path().join("live.json");
    let offline = t.path().join("offline.json");
    std::fs::write(
        &live,
        json!({"schema": "kquant.verify/1", "live": {"draft": {"requests": [
            {"id": "0", "category": "code", "steps": 30, "committed": 40},
            {"id": "1", "category": "code", "steps": 31, "committed": 38},
            {"id": "2", "category": "prose", "steps": 33, "committed": 30},
            {"id": "test-0", "category": "math", "steps": 20, "committed": 20}]}}})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        &offline,
        json!({"schema": "kquant.verify/1", "draft": {"requests": [
            {"id": 0, "category": "code", "steps": 30, "committed": 40, "near_tie_steps": 0},
            {"id": 1, "category": "code", "steps": 30, "committed": 39, "near_tie_steps": 2},
            {"id": 2, "category": "prose", "steps": 32, "committed": 31, "near_tie_steps": 0}]}})
        .to_string(),
    )
    .unwrap();
    let (l, o) = (live.to_str().unwrap(), offline.to_str().unwrap());
    let out = kquant(&["verify-join", l, o, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["schema"], "kquant.verify-join/1");
    assert_eq!(
        [&j["joined"], &j["same"], &j["near_tie"], &j["unexplained"]],
        [&json!(3), &json!(1), &json!(1), &json!(1)]
    );
    assert_eq!(j["only_live"], json!(["test-0"]));
    let r1 = &j["requests"][1];
    assert_eq!(
        (
            &r1["id"],
            &r1["verdict"],
            &r1["steps_delta"],
            &r1["offline"]["near_tie_steps"]
        ),
        (&json!("1"), &json!("near-tie"), &json!(1), &json!(2))
    );
    let out = kquant(&["verify-join", l, o]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("3 requests joined: 1 the same, 1 differ where a near-tie can explain it, 1 differ with no near-tie step")
            && text.contains("unexplained")
            && text.contains("1 requests only in the live report: test-0"),
        "{text}"
    );
    for (args, names) in [([o, l], o), ([l, l], l)] {
        let out = kquant(&["verify-join", args[0], args[1]]);
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.starts_with("error:") && err.contains(names) && err.contains("hint:"),
            "{err}"
        );
    }
}

/// A histogram whose counts overflow u64 is a broken response, not AL 0.
#[test]
fn a_histogram_that_overflows_is_a_failed_request() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 2);
    let gen = scripted(0);
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let server = serve(
        move |r: &Request| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/v1/models") => models("vllm"),
            ("GET", "/version") => Response::json(&json!({"version": "0.33.0"})),
            ("POST", "/v1/completions") => {
                let v = r.json();
                let ids = prompt_ids(&v);
                let mut out = vllm_completion(&gen(&ids, max_tokens(&v)), ids.len(), true);
                if n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                    // 2^63 steps that accepted 2 drafts: 2^64 accepted, 0 once wrapped.
                    let m = &mut out["metrics"]["speculative_decoding"];
                    m["acceptance_histogram"] = json!([0, 0, 1u64 << 63, 0]);
                    m["num_spec_steps"] = json!(1u64 << 63);
                    m["num_accepted_draft_tokens"] = json!(0);
                }
                Response::json(&out)
            }
            _ => Response::status(404, "{}"),
        },
    );
    let (c, r, err) = live(&server.url, &p, &["--max-failed", "1"]);
    assert_eq!(c, 0, "{err}");
    one_failed(&r, "more than 2^64");
}

/// Once more requests have failed than `--max-failed` allows, the exit 2 is certain: no
/// further prompt is sent (a server that answers nothing useful no longer holds the run for
/// every prompt's timeout).
#[test]
fn the_run_stops_sending_once_max_failed_is_exceeded() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 10);
    let posts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n = posts.clone();
    let server = serve(
        move |r: &Request| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/v1/models") => models("vllm"),
            ("GET", "/version") => Response::json(&json!({"version": "0.33.0"})),
            ("POST", "/v1/completions") => {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Response::text("not json")
            }
            _ => Response::status(404, "{}"),
        },
    );
    let (c, _, err) = live(&server.url, &p, &["--max-failed", "2"]);
    assert_eq!(c, 2, "{err}");
    assert_eq!(
        posts.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "30 prompts, 2 failures allowed: the third ends it"
    );
    assert!(
        err.contains("3 of 30 requests failed") && err.contains("the other 27 were not sent"),
        "{err}"
    );
}

/// Control characters in a prompt's category, or in the server's `/version`, never reach the
/// terminal raw (no fake "PASSED" line) and never make the JUnit file invalid XML.
#[test]
fn hostile_strings_are_escaped_in_the_table_and_the_junit() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("p.jsonl");
    std::fs::write(
        &p,
        "{\"id\": \"a\", \"category\": \"co\\u0001de\\u001b[2J\", \"tokens\": [1, 2, 3]}\n{\"id\": \"b\", \"category\": \"x\", \"tokens\": [4, 5, 6]}\n",
    )
    .unwrap();
    let gen = scripted(1);
    let server = serve(
        move |r: &Request| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/v1/models") => models("vllm"),
            ("GET", "/version") => Response::json(&json!({"version": "0.20.0\nPASSED\u{1b}[0m"})),
            ("POST", "/v1/completions") => {
                let v = r.json();
                let ids = prompt_ids(&v);
                Response::json(&vllm_completion(
                    &gen(&ids, max_tokens(&v)),
                    ids.len(),
                    true,
                ))
            }
            _ => Response::status(404, "{}"),
        },
    );
    let junit = t.path().join("v.xml");
    let o = kquant(&[
        "verify",
        "--endpoint",
        &server.url,
        "--prompts",
        p.to_str().unwrap(),
        "--max-tokens",
        "20",
        "--min-accept",
        "30",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        common::stderr(&o),
    );
    for text in [&out, &err] {
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{1}'),
            "{text:?}"
        );
        assert!(
            !text.lines().any(|l| l.trim() == "PASSED"),
            "a forged verdict line: {text}"
        );
    }
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(
        !x.chars()
            .any(|c| (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r')),
        "{x:?}"
    );
    assert!(x.contains("co\\x01de\\x1b[2J"), "{x}");
}

/// A short, weak generation (AL 1.25, EOS after 6 tokens) and a vLLM server whose response
/// `n` (counted from 0) goes through `poison`: the poisoned responses (two of twelve), each claiming one
/// verify step for 40 tokens, must not lift the weak draft over `--min-accept`.
fn poisoned_vllm(poison: fn(usize, &mut Value)) -> Server {
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    serve(
        move |r: &Request| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/v1/models") => models("vllm"),
            ("GET", "/version") => Response::json(&json!({"version": "0.33.0"})),
            ("POST", "/v1/completions") => {
                let v = r.json();
                let ids = prompt_ids(&v);
                let g = Gen {
                    tokens: (0..6u32).map(|i| i + ids.len() as u32).collect(),
                    accepted: vec![0, 1, 0, 0],
                    extra: 0,
                };
                let mut out = vllm_completion(&g, ids.len(), true);
                out["choices"][0]["finish_reason"] = json!("stop");
                let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                poison(i, &mut out);
                Response::json(&out)
            }
            _ => Response::status(404, "{}"),
        },
    )
}

/// The poisoned response: 40 tokens (`--max-tokens 40`) over one verify step.
fn one_step_for_everything(out: &mut Value) {
    out["usage"]["completion_tokens"] = json!(40);
    let m = &mut out["metrics"]["speculative_decoding"];
    m.as_object_mut().unwrap().remove("acceptance_histogram");
    m["num_spec_steps"] = json!(1);
    m["num_accepted_draft_tokens"] = json!(38);
    m["mean_acceptance_length"] = json!(39.0);
}

/// K (drafts per verify step) is one value per run: the preflight's, else the first answer's.
/// One response in six that omits `num_spec_tokens`, or claims another K than the rest, to
/// pass 39 tokens off as one verify step is a failed request, never measured; where no
/// response states K, no step is held to accept more than 32 drafts (issue 38, item 5).
#[test]
fn one_poisoned_k_in_ten_cannot_lift_a_failing_draft() {
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 4);
    type Poison = fn(usize, &mut Value);
    let cases: [(&str, Poison); 3] = [
        ("omits K", |i, out| {
            if i % 6 == 3 {
                one_step_for_everything(out);
                out["metrics"]["speculative_decoding"]
                    .as_object_mut()
                    .unwrap()
                    .remove("num_spec_tokens");
            }
        }),
        ("claims another K", |i, out| {
            if i % 6 == 3 {
                one_step_for_everything(out);
                out["metrics"]["speculative_decoding"]["num_spec_tokens"] = json!(1000);
            }
        }),
        ("no response states K", |i, out| {
            out["metrics"]["speculative_decoding"]
                .as_object_mut()
                .unwrap()
                .remove("num_spec_tokens");
            if i % 6 == 3 {
                one_step_for_everything(out);
            }
        }),
    ];
    for (what, poison) in cases {
        let server = poisoned_vllm(poison);
        let (code, r, err) = live(
            &server.url,
            &p,
            &["--min-accept", "1.5", "--max-failed", "2"],
        );
        assert_eq!(code, 1, "{what}: the weak draft still fails: {err}");
        let al = r["draft"]["accept_length"].as_f64().unwrap();
        assert!((al - 1.25).abs() < 1e-9, "{what}: AL {al}");
        let failed = r["live"]["draft"]["failed"].as_array().unwrap();
        assert_eq!(failed.len(), 2, "{what}: {failed:?}");
        for f in failed {
            let e = f["error"].as_str().unwrap();
            assert!(e.contains("drafts"), "{what}: {e}");
        }
        if what == "claims another K" {
            let e = failed[0]["error"].as_str().unwrap();
            assert!(e.contains("1000") && e.contains("K = 3"), "{e}");
        }
        if what != "no response states K" {
            assert_eq!(r["live"]["draft"]["num_spec_tokens"], json!(3), "{what}");
        }
    }
}
