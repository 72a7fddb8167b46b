//! The committed tiny fixtures are exactly what `kquant synth` generates (so the generator is
//! the source of truth), and `synth` refuses unknown presets with exit 2.

use crate::common;

use common::{kquant_cmd, root};

#[test]
fn committed_fixtures_match_the_generator() {
    let t = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for e in std::fs::read_dir(root().join("fixtures/tiny")).unwrap() {
        let dir = e.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let out = t.path().join(&name);
        let mut args = vec![
            "synth".to_string(),
            "--preset".into(),
            format!("tiny-{name}"),
            "-o".into(),
            out.display().to_string(),
        ];
        if name == "target-kimi-k2" {
            args.extend(["--max-shard-size".into(), "300KB".into()]);
        }
        let st = kquant_cmd().args(&args).output().unwrap();
        assert!(
            st.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            let fname = f.file_name().unwrap().to_string_lossy().into_owned();
            if fname == "kquant-manifest.json" {
                continue;
            }
            assert_eq!(
                std::fs::read(&f).unwrap(),
                std::fs::read(out.join(&fname)).unwrap(),
                "{name}/{fname} differs from the generator"
            );
            checked += 1;
        }
        // verify-files accepts a fresh output.
        let v = kquant_cmd()
            .args(["verify-files", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    }
    assert!(checked >= 26);
}

#[test]
fn unknown_preset_is_a_usage_error() {
    let t = tempfile::tempdir().unwrap();
    let out = kquant_cmd()
        .args([
            "synth",
            "--preset",
            "nope",
            "-o",
            t.path().join("x").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error: unknown preset `nope`"), "{err}");
    // The hint names every preset (the list `synth --list` prints), not `kquant --help`.
    let hint = err
        .lines()
        .find_map(|l| l.strip_prefix("hint: "))
        .unwrap_or_else(|| panic!("{err}"));
    for name in kquant::synth::PRESETS {
        assert!(hint.contains(name), "{name} missing from: {hint}");
    }
    assert!(!hint.contains("--help"), "{hint}");
}

#[test]
fn real_shape_presets_have_the_documented_shapes() {
    let p = kquant::synth::preset("kimi-k2.5-eagle3").unwrap();
    let shape = |n: &str| {
        p.tensors
            .iter()
            .find(|t| t.name == n)
            .unwrap()
            .shape
            .clone()
    };
    assert_eq!(shape("fc.weight"), vec![7168, 3 * 7168]);
    assert_eq!(
        shape("midlayer.self_attn.q_proj.weight"),
        vec![64 * 128, 2 * 7168]
    );
    assert_eq!(shape("midlayer.mlp.gate_proj.weight"), vec![12288, 7168]);
    assert_eq!(shape("embed_tokens.weight"), vec![163840, 7168]);
    assert_eq!(shape("lm_head.weight"), vec![163840, 7168]);
    let gb = p.total_bytes() as f64 / 1e9;
    assert!((6.0..6.5).contains(&gb), "{gb} GB");
    let m = kquant::synth::preset("kimi-k2.5-eagle3-mla").unwrap();
    let shape = |n: &str| {
        m.tensors
            .iter()
            .find(|t| t.name == n)
            .unwrap()
            .shape
            .clone()
    };
    assert_eq!(
        shape("midlayer.self_attn.q_a_proj.weight"),
        vec![1536, 14336]
    );
    assert_eq!(
        shape("midlayer.self_attn.kv_a_proj_with_mqa.weight"),
        vec![576, 14336]
    );
    assert_eq!(
        shape("midlayer.self_attn.kv_b_proj.weight"),
        vec![16384, 512]
    );
    assert_eq!(shape("midlayer.self_attn.o_proj.weight"), vec![7168, 8192]);
    assert_eq!(shape("midlayer.mlp.down_proj.weight"), vec![7168, 18432]);
    let d = kquant::synth::preset("kimi-k2.5-dflash").unwrap();
    assert_eq!(
        d.tensors
            .iter()
            .filter(|t| t.name.ends_with("q_proj.weight"))
            .count(),
        6
    );
    assert!(!d
        .tensors
        .iter()
        .any(|t| t.name.contains("embed") || t.name.contains("lm_head")));
    let k = kquant::synth::preset("kimi-linear-dflash").unwrap();
    let kshape = |n: &str| {
        k.tensors
            .iter()
            .find(|t| t.name == n)
            .unwrap()
            .shape
            .clone()
    };
    assert_eq!(kshape("fc.weight"), vec![2304, 5 * 2304]);
    assert_eq!(
        kshape("layers.4.self_attn.q_proj.weight"),
        vec![32 * 128, 2304]
    );
    assert!(!k.tensors.iter().any(|t| t.name.starts_with("layers.5.")));
    assert_eq!(k.config["block_size"], 16);
    assert_eq!(k.config["num_target_layers"], 27);
    assert_eq!(
        k.config["dflash_config"]["target_layer_ids"],
        serde_json::json!([3, 7, 15, 19, 23])
    );
    assert_eq!(k.config["dflash_config"]["mask_token_id"], 163839);
}

/// docs/fixtures.md's sizes of the real-shape presets are what `synth --list` computes, and the
/// list states each size once (in its size column, not again in a description).
#[test]
fn documented_preset_sizes_match_synth() {
    let o = kquant_cmd().args(["synth", "--list"]).output().unwrap();
    let list = String::from_utf8_lossy(&o.stdout).to_string();
    let doc = std::fs::read_to_string(root().join("docs/fixtures.md")).unwrap();
    let mut checked = 0;
    for line in list.lines().filter(|l| l.starts_with("kimi-")) {
        let mut w = line.split_whitespace();
        let (name, size, unit) = (w.next().unwrap(), w.next().unwrap(), w.next().unwrap());
        assert!(
            !line.contains('≈'),
            "a second size in the description: {line}"
        );
        let documented = doc
            .lines()
            .find(|l| l.contains(&format!("--preset {name} ")))
            .unwrap_or_else(|| panic!("docs/fixtures.md has no `--preset {name}` line"));
        assert!(
            documented.ends_with(&format!("# ≈{size} {unit}")),
            "docs/fixtures.md says `{documented}`, synth --list {size} {unit}"
        );
        checked += 1;
    }
    assert_eq!(checked, 5, "{list}");
}

/// #40 item 7: the two published Kimi-K3 DSpark drafts at their pinned rosters — Inferact's
/// K3DSparkModel 68 BF16 tensors of 3,562,312,961 parameters (7,124,625,922 bytes of tensors),
/// RadixArk's SpecForge layout 62 tensors of 2,249,289,601 — and the target head they read.
#[test]
fn kimi_k3_presets_reproduce_the_published_rosters() {
    let count = |name: &str| {
        let p = kquant::synth::preset(name).unwrap();
        let params: usize = p.tensors.iter().map(|t| t.shape.iter().product::<usize>()).sum();
        (p.tensors.len(), params, p)
    };
    let (n, params, p) = count("kimi-k3-dspark");
    assert_eq!((n, params), (68, 3_562_312_961));
    assert_eq!(p.total_bytes(), 2 * 3_562_312_961);
    assert_eq!(p.config["target_layer_ids"], serde_json::json!([2, 23, 47, 71, 89]));
    assert_eq!(p.config["num_target_layers"], 5);
    let (n, params, p) = count("kimi-k3-dspark-radixark");
    assert_eq!((n, params), (62, 2_249_289_601));
    assert_eq!(
        p.config["dflash_config"]["target_layer_ids"],
        serde_json::json!([7, 23, 51, 67, 83])
    );
    assert_eq!(p.config["num_target_layers"], 93);
    assert!(p.config.get("markov_rank").is_none(), "nested only, as SpecForge exports it");
    let (n, params, _) = count("kimi-k3-target-head");
    assert_eq!((n, params), (2, 2 * 163840 * 7168));
}
