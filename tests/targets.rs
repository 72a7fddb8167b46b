//! `kquant targets`: every profile in `quant-configs/targets/` is built in and parses; the
//! facts agree with each other (taps within hs[0..=L], three per EAGLE-3 family, accept lengths
//! within what the draft length allows), the published numbers are quoted verbatim from their
//! seed cards, and the tiny profile agrees with the fixture it describes.

use crate::common;

use common::{kquant, read_json, root};
use serde_json::Value;

fn targets_json(args: &[&str]) -> Value {
    let mut all = vec!["targets", "--json"];
    all.extend_from_slice(args);
    let o = kquant(&all);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn hs(v: &Value) -> Option<Vec<u64>> {
    v.get("hs").map(|h| {
        h.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    })
}

#[test]
fn every_profile_file_is_built_in_and_consistent() {
    let builtin =
        common::assert_files_are_builtin("quant-configs/targets", kquant::target::profile::BUILTIN);

    let doc = targets_json(&[]);
    assert_eq!(doc["schema"], "kquant.targets/1");
    assert_eq!(doc["tap_convention"], "hf_output_hidden_states");
    let ts = doc["targets"].as_array().unwrap();
    let mut names: Vec<String> = ts
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, builtin);
    for t in ts {
        let name = t["name"].as_str().unwrap();
        // The JSON printed is the file's content, field for field.
        let file = read_json(&root().join(format!("quant-configs/targets/{name}.json")));
        assert_eq!(t, &file, "{name}");
        let l = t["num_layers"].as_u64();
        assert!(l.is_some() || t["num_layers"] == "unknown", "{name}");
        for fam in ["eagle3", "eagle3-mla", "dflash", "dspark", "dflash2"] {
            let v = &t["taps"][fam];
            let Some(h) = hs(v) else {
                assert_eq!(v, "unknown", "{name} {fam}");
                continue;
            };
            assert!(h.windows(2).all(|w| w[0] < w[1]), "{name} {fam} {h:?}");
            if fam.starts_with("eagle3") {
                assert_eq!(h.len(), 3, "{name} {fam}");
            }
            if let Some(l) = l {
                // hs[0..=L]: L + 1 hidden states.
                assert!(
                    h.iter().all(|&i| i < l + 1),
                    "{name} {fam} {h:?} vs {l} layers"
                );
            }
            assert!(!v["source"].as_str().unwrap().is_empty());
        }
        for a in t["published_accept_lengths"].as_array().unwrap() {
            let q = a["accept_length"].as_str().unwrap();
            let v: f64 = q.trim_start_matches('~').parse().unwrap();
            let cap = if a["family"].as_str().unwrap().starts_with("eagle3") {
                4.0
            } else {
                16.0
            };
            assert!((1.0..=cap).contains(&v), "{name}: {a}");
            let src = a["source"].as_str().unwrap();
            // First-hand: quoted from a card excerpt in the repository; second-hand: says so.
            match a.get("provenance").and_then(Value::as_str) {
                None => assert!(
                    src.starts_with("huggingface.co/")
                        && src.contains("quant-configs/targets/cards/"),
                    "{a}"
                ),
                Some(p) => assert!(p.starts_with("second-hand: "), "{a}"),
            }
        }
    }
    // The Kimi-K2.5 defaults, in every convention the numbering trap involves.
    let k = &ts.iter().find(|t| t["name"] == "kimi-k2.5").unwrap();
    assert_eq!(hs(&k["taps"]["eagle3"]), Some(vec![2, 30, 58]));
    assert_eq!(hs(&k["taps"]["dflash"]), Some(vec![2, 13, 25, 36, 48, 59]));
    let o = kquant(&["targets", "kimi-k2.5"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("eagle3     taps hs[2,30,58]  vLLM ids 2,30,58  output-of-layer ids 1,29,57"),
        "{text}"
    );
}

/// The card excerpt a published figure's `source` names: `huggingface.co/OWNER/NAME model card
/// (quoted in quant-configs/targets/cards/OWNER--NAME.md)`, the verbatim lines between the fences.
fn card_excerpt(src: &str) -> String {
    let file = src
        .split("quoted in ")
        .nth(1)
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no card excerpt named in {src}"));
    let text = std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let card = src.split_whitespace().next().unwrap();
    assert!(
        text.contains(&format!("https://{card}")),
        "{file} does not name {card}"
    );
    text.split("```")
        .nth(1)
        .unwrap_or_else(|| panic!("{file}: no fenced excerpt"))
        .to_string()
}

#[test]
fn published_accept_lengths_are_quoted_verbatim_from_their_card() {
    let doc = targets_json(&[]);
    let mut checked = 0;
    for t in doc["targets"].as_array().unwrap() {
        for a in t["published_accept_lengths"].as_array().unwrap() {
            if a.get("provenance").is_some() {
                continue; // second-hand (checked to say so above): no excerpt to hold it to
            }
            let src = a["source"].as_str().unwrap();
            let text = card_excerpt(src);
            let q = a["accept_length"].as_str().unwrap();
            assert!(text.contains(q), "{q} is not in {src}");
            if let Some(n) = a["n"].as_u64() {
                assert!(text.contains(&n.to_string()), "N {n} is not in {src}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 17, "{checked}");
}

/// Nothing a user reads points at files users do not have: `kquant targets` (text and JSON) and
/// the profiles cite public sources only.
#[test]
fn targets_cite_public_sources_only() {
    for args in [&["targets"][..], &["targets", "--json"][..]] {
        let o = kquant(args);
        assert!(o.status.success());
        let out = String::from_utf8_lossy(&o.stdout);
        for bad in ["shared/", "seeds/", "§"] {
            assert!(
                !out.contains(bad),
                "`kquant {}` prints {bad}",
                args.join(" ")
            );
        }
    }
}

#[test]
fn the_tiny_profiles_describe_their_fixtures() {
    for (name, fams) in [
        (
            "kimi-k2.5-tiny",
            &["eagle3", "eagle3-mla", "dflash", "dspark", "dflash2"][..],
        ),
        ("kimi-linear-tiny", &["dflash"][..]),
        ("kimi-k3-tiny", &["dspark"][..]),
    ] {
        tiny_profile_describes(name, fams);
    }
}

fn tiny_profile_describes(name: &str, fams: &[&str]) {
    let doc = targets_json(&[name]);
    let ts = doc["targets"].as_array().unwrap();
    assert_eq!(ts.len(), 1);
    let t = &ts[0];
    let fx = format!("fixtures/{name}");
    let top = read_json(&root().join(format!("{fx}/target/config.json")));
    assert_eq!(t["architecture"], top["architectures"][0]);
    // Kimi-K3 nests the language model's config under `text_config`.
    let cfg = top.get("text_config").cloned().unwrap_or(top);
    assert_eq!(t["num_layers"], cfg["num_hidden_layers"]);
    assert_eq!(t["hidden_size"], cfg["hidden_size"]);
    assert_eq!(t["vocab_size"], cfg["vocab_size"]);
    // Draft configs give output-of-layer ids: hs = id + 1.
    let plus1 = |v: &Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() + 1)
            .collect()
    };
    for &fam in fams {
        let c = read_json(&root().join(format!("{fx}/{fam}/config.json")));
        let ids = if c.get("dflash_config").is_none() && !fam.starts_with("eagle3") {
            &c["target_layer_ids"] // the K3DSparkModel layout: at the root
        } else if !fam.starts_with("eagle3") {
            &c["dflash_config"]["target_layer_ids"]
        } else {
            &c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        };
        assert_eq!(hs(&t["taps"][fam]).unwrap(), plus1(ids), "{name} {fam}");
    }
    // A hybrid's layer pattern is its config's 1-based lists, from 0.
    if let Some(la) = cfg.get("linear_attn_config") {
        let minus1 = |v: &Value| -> Vec<u64> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() - 1)
                .collect()
        };
        assert_eq!(
            t["layers"]["kda"],
            serde_json::json!(minus1(&la["kda_layers"]))
        );
        assert_eq!(
            t["layers"]["mla"],
            serde_json::json!(minus1(&la["full_attn_layers"]))
        );
    }
    // Live: the paths exist and the trace carries every family's taps.
    let live = &t["live"];
    for k in ["target", "prompts", "trace"] {
        let p = root().join(live[k].as_str().unwrap());
        assert!(p.exists(), "{}", p.display());
    }
    let m = read_json(
        &root()
            .join(live["trace"].as_str().unwrap())
            .join("manifest.json"),
    );
    let taps: Vec<u64> = m["taps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    for &fam in fams {
        assert!(
            hs(&t["taps"][fam])
                .unwrap()
                .iter()
                .all(|h| taps.contains(h)),
            "{name} {fam}"
        );
    }
    assert_eq!(m["num_layers"], t["num_layers"]);
    // An attention-residual target's traces name the stream they tap: the live one its
    // fixture draft's (`partial`), a second one the other.
    if t.get("attention_residuals").is_some() {
        assert_eq!(m["tap_stream"], "partial", "{name}");
        let other = read_json(&root().join(format!("{fx}/trace-mixture/manifest.json")));
        assert_eq!(other["tap_stream"], "mixture", "{name}");
        assert_eq!(other["samples"], m["samples"], "{name}: the same prompts");
    }
}

/// The real Kimi-Linear profile's shape and layer pattern are the config.json lines its card
/// excerpt quotes (1-based lists in the file, 0-based in the profile).
#[test]
fn the_kimi_linear_profile_is_its_configs_shape() {
    let card = std::fs::read_to_string(
        root().join("quant-configs/targets/cards/moonshotai--Kimi-Linear-48B-A3B-Instruct.md"),
    )
    .unwrap();
    let line = |key: &str| -> String {
        card.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("\"{key}\": ")))
            .unwrap_or_else(|| panic!("card has no `{key}` line"))
            .trim_end_matches(',')
            .to_string()
    };
    let list = |key: &str| -> Vec<u64> {
        serde_json::from_str::<Vec<u64>>(&line(key))
            .unwrap()
            .into_iter()
            .map(|x| x - 1)
            .collect()
    };
    let doc = targets_json(&["kimi-linear-48b-a3b"]);
    let t = &doc["targets"][0];
    assert_eq!(t["num_layers"].to_string(), line("num_hidden_layers"));
    assert_eq!(t["hidden_size"].to_string(), line("hidden_size"));
    assert_eq!(t["vocab_size"].to_string(), line("vocab_size"));
    assert_eq!(t["layers"]["kda"], serde_json::json!(list("kda_layers")));
    assert_eq!(
        t["layers"]["mla"],
        serde_json::json!(list("full_attn_layers"))
    );
    // The DFlash taps are outputs of layers 3, 7 (MLA) and 15, 19, 23 (KDA): the card's ids + 1.
    assert_eq!(hs(&t["taps"]["dflash"]).unwrap(), vec![4, 8, 16, 20, 24]);
    assert!(t["taps"]["dflash"]["source"]
        .as_str()
        .unwrap()
        .contains("INFERRED"));
}

#[test]
fn unknown_or_inconsistent_profiles_are_refused() {
    let o = kquant(&["targets", "kimi-k9"]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("no target profile `kimi-k9`")
            && e.contains("hint: the built-in profiles are kimi-k2.5, ")
            && e.contains("kimi-k2.5-tiny")
            && !e.contains("see `kquant --help`"),
        "{e}"
    );
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("bad.json");
    let mut t = read_json(&root().join("quant-configs/targets/kimi-k2.5-tiny.json"));
    t["taps"]["dflash"]["hs"] = serde_json::json!([1, 5]);
    std::fs::write(&p, serde_json::to_vec(&t).unwrap()).unwrap();
    let o = kquant(&["targets", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("bad.json") && e.contains("hs[5] is past the last hidden state hs[4]"),
        "{e}"
    );
    t["taps"]["dflash"]["hs"] = serde_json::json!([1, 3]);
    t["num_layers"] = serde_json::json!("several");
    std::fs::write(&p, serde_json::to_vec(&t).unwrap()).unwrap();
    let o = kquant(&["targets", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a kquant target profile"));
    // A hybrid's layer pattern must name each layer once.
    let mut t = read_json(&root().join("quant-configs/targets/kimi-linear-tiny.json"));
    t["layers"]["mla"] = serde_json::json!([1, 2]);
    std::fs::write(&p, serde_json::to_vec(&t).unwrap()).unwrap();
    let o = kquant(&["targets", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("each of the 4 layers 0..4 once"), "{e}");
}

/// Kimi-K3 (#41): the config's 1-based layer lists from 0 (69 KDA, 24 MLA, the tail's two MLA
/// layers), each published draft's ids in its own convention as `hs`, and the two tap streams
/// with the engine that taps each by default.
#[test]
fn kimi_k3_profile_holds_its_conventions() {
    let doc = targets_json(&["kimi-k3"]);
    let t = &doc["targets"][0];
    assert_eq!(t["num_layers"], 93);
    assert_eq!(t["hidden_size"], 7168);
    let kda = t["layers"]["kda"].as_array().unwrap();
    let mla: Vec<u64> = t["layers"]["mla"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!((kda.len(), mla.len()), (69, 24));
    // 1-based full_attn_layers [4, 8, …, 88, 92, 93]: 0-based 3, 7, …, 87, 91, 92.
    let mut want: Vec<u64> = (3..88).step_by(4).collect();
    want.extend([91, 92]);
    assert_eq!(mla, want);
    let src = t["layers"]["source"].as_str().unwrap();
    assert!(src.contains("numbered from 1"), "{src}");
    // Output-of-layer ids + 1 (vLLM's shift) = hs; the speculators ids are read raw.
    let drafts = t["published_drafts"].as_array().unwrap();
    let hs_of = |name: &str| {
        let d = drafts
            .iter()
            .find(|d| d["draft"].as_str().unwrap().starts_with(name))
            .unwrap();
        (hs(d).unwrap(), d["stream"].as_str().unwrap().to_string())
    };
    assert_eq!(
        hs_of("Inferact/Kimi-K3-DSpark"),
        (vec![3, 24, 48, 72, 90], "partial".into())
    );
    assert_eq!(
        hs_of("RadixArk/Kimi-K3-DSpark"),
        (vec![8, 24, 52, 68, 84], "mixture".into())
    );
    assert_eq!(hs_of("RedHatAI/").0, vec![24, 48, 72, 88, 92]);
    assert_eq!(hs(&t["taps"]["dspark"]), Some(vec![3, 24, 48, 72, 90]));
    assert_eq!(t["taps"]["dflash2"], "unknown");
    let ar = &t["attention_residuals"];
    assert_eq!(ar["block_size"], 12);
    let by: Vec<(&str, &str)> = ar["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["engine"].as_str().unwrap(),
                e["default"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        by,
        vec![
            ("vLLM 0.33.0", "partial"),
            ("SGLang 0.5.23", "mixture"),
            (
                "TensorRT-LLM (main, NVIDIA/TensorRT-LLM@cf328e85)",
                "mixture"
            )
        ]
    );
    let o = kquant(&["targets", "kimi-k3"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("dspark     taps hs[3,24,48,72,90]  vLLM ids 3,24,48,72,90  output-of-layer ids 2,23,47,71,89"),
        "{text}"
    );
    assert!(text.contains("SGLang 0.5.23 taps `mixture`"), "{text}");
    // Every figure of this profile is second-hand and says so.
    for a in t["published_accept_lengths"].as_array().unwrap() {
        assert!(a["provenance"].as_str().unwrap().starts_with("second-hand"));
    }
}
