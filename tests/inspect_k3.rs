//! `kquant inspect` beside Kimi-K3 (#41 item 6): a K3 target is named, with each engine's draft
//! methods and the tap stream it hands them; a draft made for K3 gets its target row with that
//! stream per engine, and the engines that have no capture for its family say `no`.

use crate::common;

use std::path::Path;

use serde_json::Value;

fn copy_with_config(src: &Path, dst: &Path, edit: impl Fn(&mut Value)) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let p = dst.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&p, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
}

/// `(engine, stream)` of each row of `rows`.
fn streams(rows: &Value) -> Vec<(String, String)> {
    rows.as_array()
        .unwrap_or(&vec![])
        .iter()
        .map(|r| {
            (
                r["engine"].as_str().unwrap().to_string(),
                r["stream"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn a_k3_target_names_each_engines_draft_methods_and_stream() {
    let dir = common::root().join("fixtures/kimi-k3-tiny/target-random");
    let j = common::inspect_json(&dir);
    assert_eq!(j["family"], "target");
    assert_eq!(j["target_kind"], "kimi-k3");
    assert_eq!(
        streams(&j["drafting"]),
        pairs(&[
            ("vllm", "partial"),
            ("sglang", "mixture"),
            ("trtllm", "mixture")
        ])
    );
    let vllm = &j["drafting"][0];
    assert!(vllm["switch"]
        .as_str()
        .unwrap()
        .contains("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1"));
    let sglang_families = j["drafting"][1]["families"].as_array().unwrap();
    assert!(!sglang_families
        .iter()
        .any(|f| f == "eagle3" || f == "eagle3-mla"));
    let out = common::kquant(&["inspect", dir.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("family      target (kimi-k3)"), "{text}");
    assert!(
        text.contains("drafting    vllm   taps partial for ")
            && text.contains("            sglang taps mixture for dflash, dspark, dflash2: ")
            && text.contains("            trtllm taps mixture for dflash, dspark: "),
        "{text}"
    );
    // A target without attention residuals has no such rows.
    let kl = common::inspect_json(&common::root().join("fixtures/kimi-linear-tiny/target"));
    assert!(kl["drafting"].is_null(), "{kl}");
}

#[test]
fn a_k3_dspark_drafts_target_row_names_the_stream_each_engine_hands_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("k3-dspark");
    // The tiny K3DSparkModel, told it was made for the real Kimi-K3 (Inferact's taps, hs[3, 24,
    // 48, 72, 90]; `num_target_layers` counts taps in this layout, so the depth is
    // `target_num_hidden_layers`).
    copy_with_config(
        &common::root().join("fixtures/kimi-k2.5-tiny/k3-dspark"),
        &d,
        |c| {
            c["target_hidden_size"] = 7168.into();
            c["target_layer_ids"] = serde_json::json!([2, 23, 47, 71, 89]);
            c["num_target_layers"] = 5.into();
            c["target_num_hidden_layers"] = 93.into();
        },
    );
    let j = common::inspect_json(&d);
    let t = &j["draft_target"];
    assert_eq!(t["architecture"], "KimiK3ForConditionalGeneration", "{t}");
    let from = t["known_from"].as_str().unwrap();
    assert!(
        from.contains("93 target layers") && from.contains("taps hs[3, 24, 48, 72, 90]"),
        "{from}"
    );
    assert!(from.ends_with("kimi-k3"), "{from}");
    assert_eq!(t["serving"], serde_json::json!([]));
    // SGLang 0.5.23 runs DSpark beside K3 but has no K3DSparkModel (its `engines` row says
    // no): it hands this draft no stream.
    assert_eq!(
        streams(&t["streams"]),
        pairs(&[("vllm", "partial"), ("trtllm", "mixture")])
    );
    // Layout, family and taps are Inferact's published K3 DSpark's: trained on `partial`.
    assert_eq!(t["trained_on"]["stream"], "partial", "{t}");
    assert_eq!(t["trained_on"]["profile"], "kimi-k3");
    assert!(t["trained_on"]["draft"]
        .as_str()
        .unwrap()
        .starts_with("Inferact/Kimi-K3-DSpark"));
    let text = String::from_utf8_lossy(&common::kquant(&["inspect", d.to_str().unwrap()]).stdout)
        .to_string();
    assert!(
        text.contains("target      KimiK3ForConditionalGeneration (")
            && text.contains("            trained on the partial stream (published draft Inferact/Kimi-K3-DSpark")
            && text.contains("            vllm   hands it the partial stream, the one it was trained on; VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1")
            && text.contains("            trtllm hands it the mixture stream, not the partial it was trained on [")
            && !text.contains("sglang hands it"),
        "{text}"
    );
    // Without `target_num_hidden_layers` the depth is unknown, not the tap count: still K3.
    copy_with_config(&d.clone(), &tmp.path().join("no-depth"), |c| {
        c.as_object_mut()
            .unwrap()
            .remove("target_num_hidden_layers");
    });
    let j = common::inspect_json(&tmp.path().join("no-depth"));
    assert_eq!(
        j["draft_target"]["architecture"],
        "KimiK3ForConditionalGeneration"
    );
}

#[test]
fn an_eagle3_mla_draft_for_k3_is_served_by_vllm_only() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("eagle3-mla");
    // lightseekorg's K3 EAGLE-3-MLA taps: output of layers 1, 45, 89 = hs[2, 46, 90].
    copy_with_config(
        &common::root().join("fixtures/kimi-k2.5-tiny/eagle3-mla"),
        &d,
        |c| {
            c["target_hidden_size"] = 7168.into();
            c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = serde_json::json!([1, 45, 89]);
        },
    );
    let j = common::inspect_json(&d);
    let t = &j["draft_target"];
    assert_eq!(t["architecture"], "KimiK3ForConditionalGeneration", "{t}");
    let refused: Vec<(String, String)> = t["serving"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["engine"].as_str().unwrap().to_string(),
                v["serves"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(refused, pairs(&[("sglang", "no"), ("trtllm", "no")]));
    assert!(t["serving"][0]["why"]
        .as_str()
        .unwrap()
        .contains("set_eagle3_layers_to_capture"));
    assert_eq!(streams(&t["streams"]), pairs(&[("vllm", "partial")]));
    for e in j["engines"].as_array().unwrap() {
        if e["engine"] != "vllm" {
            assert_eq!(e["verdict"], "no", "{e}");
        }
    }
}

#[test]
fn the_trained_k3_dspark_says_which_engines_hand_it_its_own_stream() {
    let d = common::root().join("fixtures/kimi-k3-tiny/dspark");
    let j = common::inspect_json(&d);
    let t = &j["draft_target"];
    assert_eq!(t["architecture"], "KimiK3ForConditionalGeneration", "{t}");
    assert_eq!(t["trained_on"]["stream"], "partial", "{t}");
    assert_eq!(t["trained_on"]["profile"], "kimi-k3-tiny");
    // A draft no profile publishes: no training stream claimed (the tiny random K3 DSpark of the
    // Kimi-K2.5 fixture is for a DeepSeek-V3 target, where there are no streams at all).
    let j = common::inspect_json(&common::root().join("fixtures/kimi-k2.5-tiny/k3-dspark"));
    assert!(j["draft_target"]["trained_on"].is_null() && j["draft_target"]["streams"].is_null());
}
