//! The accept-length cost of each quantize scheme on the trained tiny fixtures, held as a
//! regression test, and the gate on the real fixture.
//!
//! `fixtures/kimi-k2.5-tiny/reference/scheme-delta.json` is written by
//! `fixtures/gen/verify/measure_schemes.sh` with kquant itself (`quantize`, then `verify
//! --baseline <unquantized draft>`). Each measured row is re-run here through the binary. The
//! unquantized baseline is the same for every row of a draft, so it is replayed once per draft
//! (`kquant verify --draft <unquantized>`, [`baseline`]) and each row replays only its quantized
//! draft, gated with `--min-accept` at the baseline's accept length − 0.03: with both drafts on
//! the same positions ΔAL is draft AL − baseline AL (the recorded rows hold this to 1e-12), so
//! that gate gives the default ΔAL gate's verdict (no recorded ΔAL lies within rounding of
//! −0.03). The test asserts the draft's and the baseline's accept length and ΔAL within
//! [`AL_TOL`] of the recorded values, and the gate's verdict and exit code exactly. Each recorded
//! refusal must still be refused with the same `error:` line. `kquant schemes --json` lists
//! every scheme × format pair, and each one must have a row for every draft.
//!
//! On 2 cores with the dev build (opt-level 1) one quantize + verify takes about 20 s. So by
//! default this file runs one format per scheme on EAGLE-3, and int4-pc (Quark) + nvfp4-a16
//! (compressed-tensors) + fp8-pc (Quark) on the MLA and DFlash drafts. `KQUANT_ALL_SCHEMES=1`
//! runs every measured row.
//!
//! On the real fixture, the EAGLE-3 draft against itself (`--baseline`, the default ΔAL gate)
//! gives Δ = 0 and CI [0, 0] exactly, and passes. A copy whose decoder linears are rounded to 2
//! bits per row fails with exit 1, and the JSON gives the reason.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::OnceLock;

use common::{kquant, read_json, root};
use serde_json::Value;

/// How far a re-measured accept length (or ΔAL) may move from the recorded one. AL is a ratio
/// of token counts over about 2,000 rounds, so one flipped argmax moves it by about 5e-4. The
/// runtimes are deterministic, so any drift beyond that is a change in quantization or replay.
const AL_TOL: f64 = 0.005;

/// The default gate's `--max-regression` the rows were recorded with.
const MAX_REGRESSION: f64 = 0.03;

const FIX: &str = "fixtures/kimi-k2.5-tiny";
const TABLE: &str = "fixtures/kimi-k2.5-tiny/reference/scheme-delta.json";

/// The drafts the table measures.
const DRAFTS: [&str; 3] = ["eagle3", "eagle3-mla", "dflash"];

fn rows() -> Vec<Value> {
    let t = read_json(&root().join(TABLE));
    assert_eq!(t["schema"], "kquant.scheme-delta/1");
    assert_eq!(t["max_regression"], MAX_REGRESSION);
    t["results"].as_array().unwrap().clone()
}

fn s<'a>(r: &'a Value, k: &str) -> &'a str {
    r[k].as_str()
        .unwrap_or_else(|| panic!("row without {k}: {r}"))
}

fn all_schemes() -> bool {
    std::env::var("KQUANT_ALL_SCHEMES").is_ok_and(|v| v == "1")
}

/// The rows run by default: the first measured format of each scheme on EAGLE-3, and three
/// representative schemes on the other drafts.
fn default_subset(rows: &[Value]) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut pick = BTreeSet::new();
    for (i, r) in rows.iter().enumerate() {
        if r["status"] != "measured" || s(r, "exclude") != "fc,lm_head" {
            continue;
        }
        let (d, sc, f) = (s(r, "draft"), s(r, "scheme"), s(r, "format"));
        let take = if d == "eagle3" {
            seen.insert(sc.to_string())
        } else {
            matches!(
                (sc, f),
                ("int4-pc", "quark") | ("nvfp4-a16", "compressed-tensors") | ("fp8-pc", "quark")
            )
        };
        if take {
            pick.insert(i);
        }
    }
    pick
}

fn target_args(draft: &str) -> Vec<String> {
    if draft == "eagle3-mla" {
        vec![]
    } else {
        vec!["--target-checkpoint".into(), format!("{FIX}/target")]
    }
}

/// Quantize `draft` with the row's recorded flags into `out`: the exit code and stderr.
fn quantize(draft: &str, args: &Value, out: &Path) -> (Option<i32>, String) {
    let mut a: Vec<String> = vec![
        "quantize".into(),
        format!("{FIX}/{draft}"),
        "-o".into(),
        out.to_str().unwrap().into(),
        "--force".into(),
    ];
    a.extend(
        args.as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string()),
    );
    let o = kquant(&a.iter().map(String::as_str).collect::<Vec<_>>());
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into())
}

/// `kquant verify --draft D --trace trace [--target-checkpoint] --json - EXTRA…`: the exit code
/// and the report.
fn verify_with(draft: &Path, family: &str, extra: &[String]) -> (Option<i32>, Value) {
    let mut a: Vec<String> = vec![
        "verify".into(),
        "--draft".into(),
        draft.to_str().unwrap().into(),
        "--trace".into(),
        format!("{FIX}/trace"),
        "--json".into(),
        "-".into(),
    ];
    a.extend(target_args(family));
    a.extend_from_slice(extra);
    let o = kquant(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let j = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "verify {}: exit {:?}, no JSON ({e}): {}",
            draft.display(),
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (o.status.code(), j)
}

/// `kquant verify --draft D --baseline B …` with the default gate: the exit code and the report.
fn verify(draft: &Path, baseline: &str, family: &str) -> (Option<i32>, Value) {
    verify_with(
        draft,
        family,
        &["--baseline".into(), format!("{FIX}/{baseline}")],
    )
}

/// The report of the unquantized `draft` replayed alone (its accept length is every row's
/// baseline), replayed once per test process whichever test asks first.
fn baseline(draft: &str) -> &'static Value {
    static REPORTS: [OnceLock<Value>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = DRAFTS.iter().position(|d| *d == draft).unwrap();
    REPORTS[i].get_or_init(|| {
        let (rc, j) = verify_with(&root().join(FIX).join(draft), draft, &[]);
        assert_eq!(rc, Some(0), "{draft} alone: {j}");
        j
    })
}

fn close(what: &str, g: f64, want: &Value, bad: &mut Vec<String>) {
    let w = want.as_f64().unwrap();
    if (g - w).abs() > AL_TOL {
        bad.push(format!(
            "{what}: {g:.4}, recorded {w:.4} (tolerance {AL_TOL})"
        ));
    }
}

/// Re-measure the selected measured rows of one draft whose scheme `pick` accepts; every mismatch
/// is collected so one run shows them all.
fn check_draft(draft: &str, pick: fn(&str) -> bool) {
    let rows = rows();
    let subset = default_subset(&rows);
    let t = tempfile::tempdir().unwrap();
    let mut bad = Vec::new();
    let mut ran = 0;
    for (i, r) in rows.iter().enumerate() {
        if s(r, "draft") != draft || r["status"] != "measured" || !pick(s(r, "scheme")) {
            continue;
        }
        if !all_schemes() && !subset.contains(&i) {
            continue;
        }
        let name = format!(
            "{draft} {} {} (exclude {})",
            s(r, "scheme"),
            s(r, "format"),
            s(r, "exclude")
        );
        let q = t.path().join(format!("q{i}"));
        let (rc, err) = quantize(draft, &r["quantize_args"], &q);
        assert_eq!(rc, Some(0), "{name}: quantize failed: {err}");
        let base_al = baseline(draft)["draft"]["accept_length"].as_f64().unwrap();
        // ΔAL < −MAX_REGRESSION exactly when draft AL < baseline AL − MAX_REGRESSION.
        let gate = format!("{}", base_al - MAX_REGRESSION);
        let (rc, j) = verify_with(&q, draft, &["--min-accept".into(), gate]);
        ran += 1;
        let draft_al = j["draft"]["accept_length"].as_f64().unwrap();
        let mut b = Vec::new();
        close("draft AL", draft_al, &r["draft_al"], &mut b);
        close("baseline AL", base_al, &r["baseline_al"], &mut b);
        close("ΔAL", draft_al - base_al, &r["delta"], &mut b);
        for (c, v) in r["per_category"].as_object().unwrap() {
            close(
                &format!("{c} draft AL"),
                j["per_category"][c]["draft"].as_f64().unwrap(),
                &v["draft"],
                &mut b,
            );
        }
        if j["passed"] != r["passed"] {
            b.push(format!(
                "gate at {MAX_REGRESSION}: passed {}, recorded {}",
                j["passed"], r["passed"]
            ));
        }
        if rc.map(i64::from) != r["exit_code"].as_i64() {
            b.push(format!("exit {rc:?}, recorded {}", r["exit_code"]));
        }
        bad.extend(b.into_iter().map(|m| format!("{name}: {m}")));
        std::fs::remove_dir_all(&q).unwrap();
    }
    assert!(ran >= 3, "{draft}: only {ran} rows ran");
    eprintln!("{draft}: {ran} schemes re-measured");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

// EAGLE-3's rows are split in two so that both test threads have work.
#[test]
fn eagle3_int4_schemes_keep_their_recorded_accept_length() {
    check_draft("eagle3", |s| s.starts_with("int4"));
}

#[test]
fn eagle3_other_schemes_keep_their_recorded_accept_length() {
    check_draft("eagle3", |s| !s.starts_with("int4"));
}

#[test]
fn eagle3_mla_schemes_keep_their_recorded_accept_length() {
    check_draft("eagle3-mla", |_| true);
}

#[test]
fn dflash_schemes_keep_their_recorded_accept_length() {
    check_draft("dflash", |_| true);
}

#[test]
fn recorded_refusals_are_still_refused_with_the_same_reason() {
    let t = tempfile::tempdir().unwrap();
    let mut n = 0;
    for (i, r) in rows().iter().enumerate() {
        if r["status"] != "refused" {
            continue;
        }
        let q = t.path().join(format!("q{i}"));
        let (rc, err) = quantize(s(r, "draft"), &r["quantize_args"], &q);
        assert_eq!(rc, Some(2), "{r}: {err}");
        let line = err
            .lines()
            .find_map(|l| l.strip_prefix("error: "))
            .unwrap_or_default();
        assert_eq!(line, s(r, "reason"), "{r}");
        assert!(!q.exists(), "a refused quantize wrote {}", q.display());
        n += 1;
    }
    assert!(n > 0);
}

/// Every scheme × format pair `kquant schemes` lists has a row for every draft (measured or
/// refused), and every measured row's gate verdict agrees with its numbers.
#[test]
fn every_listed_scheme_and_format_is_recorded_for_every_draft() {
    let o = kquant(&["schemes", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let reg: Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut pairs = BTreeSet::new();
    for sc in reg["schemes"].as_array().unwrap() {
        for c in sc["carriers"].as_array().unwrap() {
            pairs.insert((s(sc, "id").to_string(), s(c, "format").to_string()));
        }
    }
    assert!(pairs.len() >= 20, "{pairs:?}");
    let rows = rows();
    let mut have: BTreeMap<&str, BTreeSet<(String, String)>> = BTreeMap::new();
    for r in &rows {
        have.entry(s(r, "draft"))
            .or_default()
            .insert((s(r, "scheme").into(), s(r, "format").into()));
        if r["status"] == "measured" {
            let d = r["delta"].as_f64().unwrap();
            let diff = r["draft_al"].as_f64().unwrap() - r["baseline_al"].as_f64().unwrap();
            assert!((d - diff).abs() < 1e-12, "{r}");
            assert_eq!(r["passed"], d >= -0.03, "{r}");
            assert_eq!(r["exit_code"], if d >= -0.03 { 0 } else { 1 }, "{r}");
            let ci = r["ci95"].as_array().unwrap();
            assert!(
                ci[0].as_f64().unwrap() <= d && d <= ci[1].as_f64().unwrap(),
                "{r}"
            );
        } else {
            assert_eq!(r["status"], "refused", "{r}");
        }
    }
    for d in DRAFTS {
        let missing: Vec<_> = pairs.difference(&have[d]).collect();
        assert!(
            missing.is_empty(),
            "{d}: no recorded result for {missing:?}"
        );
    }
}

#[test]
fn the_fixture_draft_against_itself_is_exactly_zero_and_passes() {
    let (rc, j) = verify(&root().join(FIX).join("eagle3"), "eagle3", "eagle3");
    assert_eq!(rc, Some(0), "{j}");
    assert_eq!(j["delta"], 0.0);
    assert_eq!(j["ci95"], serde_json::json!([0.0, 0.0]));
    assert_eq!(j["passed"], true);
    assert_eq!(j["reasons"], serde_json::json!([]));
    for c in ["code", "prose", "arith"] {
        assert_eq!(j["per_category"][c]["delta"], 0.0, "{c}");
        assert_eq!(j["per_category"][c]["n"], 20, "{c}");
    }
    // The PyTorch walk over the same trace (reference/summary.json).
    let want = read_json(&root().join(FIX).join("reference/summary.json"))["al"]["eagle3"]
        ["al_walk"]
        .as_f64()
        .unwrap();
    let got = j["draft"]["accept_length"].as_f64().unwrap();
    assert!((got - want).abs() < 1e-9, "AL {got}, PyTorch {want}");
}

/// Round each row of `w` (`[rows, cols]`) to 4 evenly spaced levels spanning [−amax, amax]: a
/// 2-bit min-max rounding per output channel.
fn round_2bit(w: &mut [f32], cols: usize) {
    for row in w.chunks_mut(cols) {
        let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        if amax == 0.0 {
            continue;
        }
        let step = 2.0 * amax / 3.0;
        for x in row {
            *x = ((*x + amax) / step).round().clamp(0.0, 3.0) * step - amax;
        }
    }
}

/// A copy of the EAGLE-3 fixture whose decoder-layer linears (`midlayer.*_proj.weight`) are
/// replaced by their 2-bit rounding per row (read and written with the safetensors crate, not
/// kquant). Returns how many tensors were rounded.
fn write_2bit_copy(out: &Path) -> usize {
    use safetensors::tensor::TensorView;
    use safetensors::{Dtype, SafeTensors};
    let src = root().join(FIX).join("eagle3");
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut rounded = 0;
    for (name, v) in st.tensors() {
        let mut b = v.data().to_vec();
        if name.starts_with("midlayer.") && name.ends_with("_proj.weight") {
            assert_eq!(v.dtype(), Dtype::BF16, "{name}");
            let mut f: Vec<f32> = b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect();
            round_2bit(&mut f, v.shape()[1]);
            b = f
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect();
            rounded += 1;
        }
        data.push((name, v.dtype(), v.shape().to_vec(), b));
    }
    let views: Vec<(String, TensorView)> = data
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::create_dir_all(out).unwrap();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).unwrap();
    std::fs::copy(src.join("config.json"), out.join("config.json")).unwrap();
    rounded
}

#[test]
fn round_2bit_keeps_four_levels_per_row() {
    let mut w = vec![0.9, -0.3, 0.1, -0.9, 0.0, 0.0, 0.0, 0.0];
    round_2bit(&mut w, 4);
    let l = [-0.9f32, -0.3, 0.3, 0.9];
    for (x, want) in w[..4].iter().zip([l[3], l[1], l[2], l[0]]) {
        assert!((x - want).abs() < 1e-6, "{w:?}");
    }
    assert_eq!(&w[4..], &[0.0; 4]);
}

#[test]
fn the_fixture_draft_rounded_to_2_bits_fails_the_gate_with_exit_1() {
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join("eagle3-2bit");
    assert_eq!(write_2bit_copy(&bad), 7, "q/k/v/o + gate/up/down");
    let (rc, j) = verify(&bad, "eagle3", "eagle3");
    assert_eq!(rc, Some(1), "{j}");
    assert_eq!(j["passed"], false);
    let d = j["delta"].as_f64().unwrap();
    let ci = j["ci95"].as_array().unwrap();
    eprintln!(
        "2-bit eagle3: AL {} (baseline {}), Δ {d}, CI {ci:?}",
        j["draft"]["accept_length"], j["baseline"]["accept_length"]
    );
    assert!(d < -0.03, "Δ {d}");
    assert!(
        ci[1].as_f64().unwrap() < -0.03,
        "the whole CI is below the gate: {ci:?}"
    );
    let why: Vec<&str> = j["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(
        why.len() == 1
            && why[0].starts_with("accept length regressed by ")
            && why[0].ends_with("(> 0.0300 allowed)"),
        "{why:?}"
    );
    // Worse than every recorded 4-bit-or-more scheme on this draft.
    for r in rows() {
        if r["draft"] == "eagle3" && r["status"] == "measured" {
            assert!(d < r["delta"].as_f64().unwrap(), "{r}");
        }
    }
}

/// The CPU replay keeps quantized modules packed (`runtime::packed`): for every scheme × format
/// `quantize` writes, on the tiny EAGLE-3 draft, each module the replay packs expands to its
/// format's dequantized values bit for bit (so the replay multiplies exactly what the f32 path
/// did), with codes and scales in at most 1 byte + its scales a weight; the layouts it leaves on
/// the f32 path are exactly NVFP4 and Quark's `int4_fp8`.
#[test]
fn packed_modules_expand_to_the_formats_dequantization() {
    use kquant::checkpoint::Checkpoint;
    use kquant::ops::gemm::Decode;
    use kquant::quant::decode::{Logical, Stored};
    use kquant::runtime::packed::Packed;

    let doc: Value = serde_json::from_slice(&kquant(&["schemes", "--json"]).stdout).unwrap();
    let t = tempfile::tempdir().unwrap();
    let src = root().join(FIX).join("eagle3");
    let (mut packed, mut kept) = (0, 0);
    for sc in doc["schemes"].as_array().unwrap() {
        let scheme = sc["id"].as_str().unwrap();
        if scheme == "nvfp4" {
            continue; // W4A4 needs calibrated input scales; its weights are nvfp4-a16's.
        }
        for c in sc["carriers"].as_array().unwrap() {
            if c["implemented"] != true {
                continue;
            }
            let format = c["format"].as_str().unwrap();
            let dst = t.path().join(format!("{scheme}-{format}"));
            let mut args = vec![
                "quantize",
                src.to_str().unwrap(),
                "-o",
                dst.to_str().unwrap(),
                "--scheme",
                scheme,
                "--format",
                format,
            ];
            if scheme == "fp8-pt" {
                args.push("--fixed-input-amax"); // its static input scale
            }
            let o = kquant(&args);
            assert!(
                o.status.success(),
                "{scheme} {format}: {}",
                common::stderr(&o)
            );
            let ck = Checkpoint::open(dst.to_str().unwrap()).unwrap();
            let lg = Logical::new(&ck).unwrap();
            assert!(
                !lg.modules.is_empty(),
                "{scheme} {format}: nothing quantized"
            );
            for m in lg.modules.values() {
                let want = lg.dequantize(m);
                match Packed::load(&lg, m) {
                    Some(p) => {
                        let mut got = vec![0f32; p.elements()];
                        p.decode(0, &mut got);
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits())
                                && got.len() == want.len(),
                            "{scheme} {format} {}: packed values differ",
                            m.module
                        );
                        assert!(p.bytes() <= want.len() + 8 * want.len().div_ceil(16) + 4 * m.cols);
                        packed += 1;
                    }
                    None => {
                        assert!(
                            matches!(
                                m.stored,
                                Stored::CtNvfp4
                                    | Stored::ModeloptNvfp4
                                    | Stored::QuarkInt4Fp8 { .. }
                            ),
                            "{scheme} {format} {}: {:?} left unpacked",
                            m.module,
                            m.stored
                        );
                        kept += 1;
                    }
                }
            }
        }
    }
    assert!(packed > 0 && kept > 0, "packed {packed}, kept {kept}");
}

/// A group size the shapes cannot take is refused for every offending tensor at once, with a
/// hint that can be followed as given: the whole `--exclude` list to pass, and only schemes the
/// chosen format writes (`--format modelopt` does not write `int4-pc`).
#[test]
fn group_refusals_name_every_tensor_and_a_hint_that_works() {
    let t = tempfile::tempdir().unwrap();
    let q = t.path().join("q");
    for format in ["modelopt", "compressed-tensors", "quark"] {
        let (rc, err) = {
            // The tiny EAGLE-3 fixture of 64-wide modules (fixtures/tiny): three of them.
            let a = [
                "quantize",
                "fixtures/tiny/eagle3-specforge",
                "-o",
                q.to_str().unwrap(),
                "--scheme",
                "int4-g128",
                "--format",
                format,
                "--exclude",
                "fc,lm_head",
            ];
            let o = kquant(&a);
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        };
        assert_eq!(rc, Some(2), "{format}: {err}");
        assert!(
            err.contains("3 tensor(s) cannot be written"),
            "{format}: {err}"
        );
        for m in ["gate_proj", "up_proj", "o_proj"] {
            assert!(
                err.contains(&format!("midlayer.mlp.{m}"))
                    || err.contains(&format!("midlayer.self_attn.{m}")),
                "{format}: {err}"
            );
        }
        let hint = err.lines().find_map(|l| l.strip_prefix("hint: ")).unwrap();
        let list = hint
            .split("--exclude ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        assert!(list.starts_with("fc,lm_head,"), "{hint}");
        if format == "modelopt" {
            assert!(
                !hint.contains("int4-pc"),
                "modelopt writes no int4-pc: {hint}"
            );
        } else {
            assert!(hint.contains("int4-pc"), "{hint}");
        }
        // The hint, followed as given, quantizes.
        let o = kquant(&[
            "quantize",
            "fixtures/tiny/eagle3-specforge",
            "-o",
            q.to_str().unwrap(),
            "--force",
            "--scheme",
            "int4-g128",
            "--format",
            format,
            "--exclude",
            &list,
        ]);
        assert!(
            o.status.success(),
            "{format} --exclude {list}: {}",
            common::stderr(&o)
        );
    }
}
