//! Defects round 5 (a): DSpark and DFlash2 drafts whose config contradicts itself, the
//! vocabulary or the tensors. `inspect` names each as a problem, `convert dspark|dflash2`
//! refuses the draft (exit 2, nothing written) and the replay (`verify`) refuses to load it
//! instead of running another block, mask or Markov head than the engines would; the replay
//! refuses RoPE bases, YaRN factors and RMSNorm epsilons that make every proposal NaN.

use crate::common;

use std::path::{Path, PathBuf};

use common::{inspect_json, kquant, read_json, root};
use serde_json::{json, Value};

const FIX: &str = "fixtures/kimi-k2.5-tiny";

fn fix(rel: &str) -> PathBuf {
    root().join(FIX).join(rel)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A copy of fixture `name` in `t` with `patch` merged into its config (objects merged key by
/// key).
fn patched(t: &Path, name: &str, patch: &Value) -> PathBuf {
    fn merge(a: &mut Value, b: &Value) {
        for (k, v) in b.as_object().unwrap() {
            match (a.get_mut(k), v) {
                (Some(x @ Value::Object(_)), Value::Object(_)) => merge(x, v),
                _ => a[k] = v.clone(),
            }
        }
    }
    let d = t.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(
        fix(name).join("model.safetensors"),
        d.join("model.safetensors"),
    )
    .unwrap();
    let mut c = read_json(&fix(name).join("config.json"));
    merge(&mut c, patch);
    std::fs::write(
        d.join("config.json"),
        serde_json::to_vec_pretty(&c).unwrap(),
    )
    .unwrap();
    d
}

/// `convert KIND SRC -o OUT --to vllm`, as arguments.
fn to_vllm<'a>(kind: &'a str, src: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec!["convert", kind, s(src), "-o", s(out), "--to", "vllm"]
}

/// The command must be refused as bad input: exit 2, `error:` naming `what`, a `hint:`, no panic.
fn assert_refused(args: &[&str], what: &str, label: &str) -> String {
    let o = kquant(args);
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{label}: {err}");
    assert!(err.starts_with("error: "), "{label}: {err}");
    assert!(err.contains("hint: "), "{label}: {err}");
    assert!(!err.contains("panicked"), "{label}: {err}");
    assert!(err.contains(what), "{label}: wanted {what:?} in {err}");
    err
}

/// `block_draft.problems[].what` of `inspect DIR --json`, joined.
fn problems(dir: &Path) -> String {
    common::block_problems(&inspect_json(dir))
}

/// (fixture, config patch, what inspect and convert say): each a config that contradicts itself,
/// the vocabulary or the tensors.
fn contradictions() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        // vLLM reads `block_size` (7), SGLang `dspark_block_size` (3).
        (
            "dspark",
            json!({"dspark_block_size": 3}),
            "the block-size keys disagree (`dspark_block_size` 3, `block_size` 7)",
        ),
        (
            "dflash2",
            json!({"dflash_config": {"block_size": 3}}),
            "the block-size keys disagree (`block_size` 8, `dflash_config.block_size` 3)",
        ),
        (
            "dflash2",
            json!({"block_size": 1_000_000_000_000_000u64}),
            "`block_size` is 1000000000000000: a block size is a whole number of tokens",
        ),
        (
            "dspark",
            json!({"mask_token_id": 99999, "dflash_config": {"mask_token_id": 99999}}),
            "`dflash_config.mask_token_id` 99999 is outside the vocabulary of 2048",
        ),
        (
            "dspark",
            json!({"mask_token_id": -5, "dflash_config": {"mask_token_id": -5}}),
            "`dflash_config.mask_token_id` is -5",
        ),
        (
            "k3-dspark",
            json!({"dflash_config": {"mask_token_id": 7}}),
            "the mask-token keys disagree (`dflash_config.mask_token_id` 7, `mask_token_id` 2047)",
        ),
        (
            "dflash2",
            json!({"dflash_config": {"target_layer_ids": [-2, 2]}}),
            "taps [-2, 2]: -2 reads hidden_states[-1], before the embeddings",
        ),
        (
            "dspark",
            json!({"dflash_config": {"target_layer_ids": [2, 2]}}),
            "taps [2, 2]: must name distinct layers in increasing order",
        ),
        (
            "dflash2",
            json!({"dflash_config": {"target_layer_ids": []}}),
            "taps []: name no layer",
        ),
        // `num_target_layers` is the target's depth in this layout: tap 2 reads past layer 1.
        (
            "dspark",
            json!({"num_target_layers": 1}),
            "the last reads hidden_states[3], past the target's 1 layers (`num_target_layers`)",
        ),
        // DFlash2's widths against the tensors they size (before: converted, and the engines'
        // loaders would fail on the shapes).
        (
            "dflash2",
            json!({"dflash_config": {"conv_kernel_size": 3}}),
            "which does not fit `dflash_config` conv_kernel_size 3",
        ),
        (
            "dflash2",
            json!({"dflash_config": {"selector_rank": 16}}),
            "which does not fit `dflash_config` selector_rank 16",
        ),
        // A width written as a string was read as unset (before: converted and replayed).
        (
            "dflash2",
            json!({"dflash_config": {"conv_kernel_size": "2"}}),
            "`conv_kernel_size` is \"2\": a DFlash2 width is a whole number",
        ),
        (
            "dflash2",
            json!({"dflash_config": {"selector_top_k": 5000}}),
            "`dflash_config.selector_top_k` 5000 is more candidates than the vocabulary of 2048",
        ),
        // Objects and flags of the wrong type, a target depth below one, and the taps SGLang
        // reads first (`dspark_target_layer_ids`) beside other ones.
        (
            "dspark",
            json!({"dflash_config": 5}),
            "`dflash_config` is 5: it is an object of keys",
        ),
        (
            "dspark",
            json!({"enable_confidence_head": "true"}),
            "`enable_confidence_head` is \"true\", not true or false",
        ),
        (
            "dspark",
            json!({"num_target_layers": -4}),
            "`num_target_layers` is -4: a target has a whole number of layers",
        ),
        (
            "dspark",
            json!({"dspark_target_layer_ids": [0, 1]}),
            "`dspark_target_layer_ids` [0,1] and the taps [0, 2] read elsewhere disagree",
        ),
        (
            "dspark",
            json!({"dspark_bonus_anchor": true}),
            "`sample_from_anchor` true and `dspark_bonus_anchor` true say opposite anchor layouts",
        ),
        (
            "dspark",
            json!({"markov_rank": -1}),
            "`markov_rank` is -1: the Markov rank is a whole number",
        ),
        (
            "dspark",
            json!({"dflash_config": {"markov_rank": 16}}),
            "the Markov-rank keys disagree (`markov_rank` 32, `dflash_config.markov_rank` 16)",
        ),
        (
            "k3-dspark",
            json!({"markov_rank": 16}),
            "`markov_head.markov_w1.weight` is [2048, 32]: its rank disagrees with markov_rank 16",
        ),
    ]
}

/// Each contradiction is a problem `inspect` names, and `convert` and `quantize` refuse the
/// draft with it: exit 2, nothing written (before, every one converted, the block or mask the
/// engines read left to their reading order, a negative Markov rank dropped from the output).
#[test]
fn convert_refuses_and_inspect_names_a_contradictory_block_draft() {
    let t = tempfile::tempdir().unwrap();
    for (i, (name, patch, what)) in contradictions().into_iter().enumerate() {
        let label = format!("{name} {patch}");
        let d = patched(&t.path().join(i.to_string()), name, &patch);
        let found = problems(&d);
        assert!(found.contains(what), "{label}: inspect says {found}");
        let kind = if name == "dflash2" {
            "dflash2"
        } else {
            "dspark"
        };
        let out = t.path().join(format!("out{i}"));
        let err = assert_refused(&to_vllm(kind, &d, &out), what, &label);
        assert!(err.contains("cannot be converted as written"), "{err}");
        assert!(!out.exists(), "{label}: wrote {}", out.display());
        // Nor quantized: its quantized copy would be refused the same way (before: written).
        let args = ["quantize", s(&d), "-o", s(&out), "--dry-run"];
        let err = assert_refused(&args, what, &label);
        assert!(err.contains("cannot be quantized as written"), "{err}");
    }
}

/// A Markov rank that is there but not a whole number is named as such, not as missing.
#[test]
fn a_negative_markov_rank_is_not_reported_missing() {
    let t = tempfile::tempdir().unwrap();
    let d = patched(t.path(), "dspark", &json!({"markov_rank": -1}));
    let found = problems(&d);
    assert!(!found.contains("no `markov_rank` in the config"), "{found}");
    let j = inspect_json(&d);
    let p = j["block_draft"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["what"].as_str().unwrap().contains("`markov_rank` is -1"))
        .cloned()
        .unwrap();
    assert_eq!(
        (&p["vllm_refuses"], &p["sglang_refuses"]),
        (&json!(true), &json!(true))
    );
}

/// `verify` of `draft` against its fixture: must be refused (exit 2) naming `what`.
fn replay_refused(draft: &Path, name: &str, what: &str, label: &str) {
    let (trace, target, base) = (fix("trace"), fix("target"), fix(name));
    assert_refused(
        &[
            "verify",
            "--draft",
            s(draft),
            "--baseline",
            s(&base),
            "--trace",
            s(&trace),
            "--target-checkpoint",
            s(&target),
        ],
        what,
        label,
    );
}

/// The replay refuses what convert refuses: before, a `dflash_config.block_size` beside another
/// root `block_size` replayed the nested block (the gate failed on a block vLLM does not run),
/// and a root mask token or a negative Markov rank beside the real ones PASSED.
#[test]
fn the_replay_refuses_a_contradictory_block_draft() {
    let t = tempfile::tempdir().unwrap();
    for (i, (name, patch)) in [
        ("dspark", json!({"dflash_config": {"block_size": 3}})),
        ("dspark", json!({"mask_token_id": 5})),
        ("dspark", json!({"markov_rank": -1})),
        ("dflash2", json!({"dspark_block_size": 4})),
        // Before: refused with the loader's shape error and no hint.
        ("dflash2", json!({"dflash_config": {"conv_kernel_size": 3}})),
        ("dflash2", json!({"dflash_config": {"selector_rank": "16"}})),
    ]
    .into_iter()
    .enumerate()
    {
        let d = patched(&t.path().join(i.to_string()), name, &patch);
        replay_refused(
            &d,
            name,
            "cannot be replayed as written",
            &patch.to_string(),
        );
    }
}

/// A RoPE base or YaRN factor that is not positive, or a negative RMSNorm epsilon, makes every
/// proposal NaN: refused by name (before: the gate ran on NaN rows, exit 1, or PASSED against a
/// baseline as degenerate); tensors that disagree with the config, and an out-of-range
/// DFlash2 width, name their fix.
#[test]
fn the_replay_refuses_nan_making_constants_and_mismatched_tensors_with_a_hint() {
    let t = tempfile::tempdir().unwrap();
    for (i, (name, patch, what)) in [
        ("dspark", json!({"rope_theta": 0}), "`rope_theta` is 0"),
        (
            "dspark",
            json!({"rms_norm_eps": -1}),
            "`rms_norm_eps` is -1",
        ),
        (
            "k3-dspark",
            json!({"rope_parameters": {"rope_theta": -1.0}}),
            "`rope_theta` is -1",
        ),
        (
            "k3-dspark",
            json!({"rope_parameters": {"factor": 0.0}}),
            "with factor 0",
        ),
        (
            "k3-dspark",
            json!({"rms_norm_eps": "small"}),
            "`rms_norm_eps` is \"small\"",
        ),
        // Tensors that disagree with the config: named with a hint (before: no `hint:`).
        (
            "dspark",
            json!({"confidence_head_with_markov": false}),
            "tensor `confidence_head.proj.weight`: shape [1, 288], expected [1, 256]",
        ),
        (
            "dflash2",
            json!({"num_hidden_layers": 3}),
            "holds fewer decoder layers than num_hidden_layers = 3",
        ),
        (
            "dspark",
            json!({"draft_vocab_size": 1024}),
            "draft_vocab_size 1024 < the target's 2048 but no `lm_head.weight`",
        ),
        (
            "dflash2",
            json!({"dflash_config": {"selector_top_k": 0}}),
            "`dflash_config.selector_top_k` is 0: it must be 1..=2048",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let d = patched(&t.path().join(i.to_string()), name, &patch);
        replay_refused(&d, name, what, &patch.to_string());
    }
}

/// `--aux-layers` replaces the config's taps, so they are checked instead: a source whose
/// config taps are repeated converts with valid ones given, and repeated ones, or ones before
/// the embeddings, given are refused as flags (before: written as given).
#[test]
fn aux_layers_given_to_convert_are_checked_like_the_configs() {
    let t = tempfile::tempdir().unwrap();
    let d = patched(
        t.path(),
        "dspark",
        &json!({"dflash_config": {"target_layer_ids": [2, 2]}}),
    );
    let given = ["--aux-layers", "0,2", "--aux-convention", "output-of-layer"];
    let out = t.path().join("out");
    let mut args = to_vllm("dspark", &d, &out);
    args.extend_from_slice(&given);
    let o = kquant(&args);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let c = read_json(&out.join("config.json"));
    assert_eq!(c["dflash_config"]["target_layer_ids"], json!([0, 2]));
    for (ids, conv, what) in [
        (
            "2,2",
            "output-of-layer",
            "--aux-layers: taps [2, 2]: must name distinct",
        ),
        (
            "-1,2",
            "input-of-layer",
            "--aux-layers: taps [-1, 2]: -1 reads hidden_states[-1]",
        ),
    ] {
        let out = t.path().join(format!("bad{ids}"));
        let (src, given) = (fix("dspark"), format!("--aux-layers={ids}"));
        let mut args = to_vllm("dspark", &src, &out);
        args.extend([given.as_str(), "--aux-convention", conv]);
        assert_refused(&args, what, ids);
        assert!(!out.exists());
    }
}

/// A NaN in a head's weights: the engines' `torch.argmax` picks a NaN logit, the replay's
/// argmax never does, so the gate would measure another draft. Refused by name (before: one
/// NaN in `markov_w2` PASSED against the clean draft).
#[test]
fn the_replay_refuses_a_head_holding_nan() {
    let t = tempfile::tempdir().unwrap();
    for (name, tensor) in [
        ("dspark", "markov_head.markov_w2.weight"),
        ("dflash2", "candidate_selector.successor_codebook"),
    ] {
        let d = patched(&t.path().join(name), name, &json!({}));
        let file = d.join("model.safetensors");
        let mut b = std::fs::read(&file).unwrap();
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let h: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
        assert_eq!(h[tensor]["dtype"], "BF16", "{name}");
        let at = 8 + n + h[tensor]["data_offsets"][0].as_u64().unwrap() as usize + 2 * 5;
        b[at..at + 2].copy_from_slice(&0x7fc0u16.to_le_bytes()); // a bf16 NaN
        std::fs::write(&file, b).unwrap();
        replay_refused(
            &d,
            name,
            &format!("tensor `{tensor}` holds NaN at flat index 5"),
            tensor,
        );
    }
}

/// A Markov head type that is not a name was reported as missing; SGLang refuses it by its
/// `str()` (vLLM's Qwen3 DSpark never reads it).
#[test]
fn a_markov_head_type_that_is_no_name_is_named_for_sglang() {
    let t = tempfile::tempdir().unwrap();
    let d = patched(t.path(), "dspark", &json!({"markov_head_type": 5}));
    let j = inspect_json(&d);
    let ps = j["block_draft"]["problems"].as_array().unwrap();
    let all: Vec<&str> = ps.iter().map(|p| p["what"].as_str().unwrap()).collect();
    assert!(
        !all.iter().any(|w| w.contains("no `markov_head_type`")),
        "{all:?}"
    );
    let p = ps
        .iter()
        .find(|p| {
            p["what"]
                .as_str()
                .unwrap()
                .contains("`markov_head_type` is 5")
        })
        .unwrap_or_else(|| panic!("{all:?}"));
    assert_eq!(
        (&p["vllm_refuses"], &p["sglang_refuses"]),
        (&json!(false), &json!(true))
    );
}

/// A compressed-tensors draft whose Markov projection is quantized holds
/// `markov_w2.weight_packed`: that is the tensor, not its absence.
#[test]
fn a_packed_markov_projection_is_not_reported_missing() {
    let ct = ["--format", "compressed-tensors", "--scheme", "int4-pc"];
    let (_t, out, _) =
        common::quantize(s(&fix("dspark")), &[&ct[..], &["--exclude", "fc"]].concat());
    let packed = "markov_head.markov_w2.weight_packed";
    let found = problems(&out);
    assert!(
        !found.contains("no `markov_head.markov_w2.weight` tensor"),
        "{found}"
    );
    let listed =
        String::from_utf8_lossy(&kquant(&["inspect", s(&out), "--tensors"]).stdout).to_string();
    assert!(
        listed.contains(packed),
        "the projection was quantized: {listed}"
    );
}
