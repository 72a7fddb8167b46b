//! The table `verify` prints on stdout, rendered from the [`Report`]: the AL table like the
//! seed model cards (category, N, AL baseline, AL draft, Δ), the teacher-forced one beside it
//! offline, then the notes, the card figures, the agreement, the near-ties, each live
//! deployment and the verdict.

use super::schema::{NearTies, Report, TieSide};
use crate::escape::printable;
use crate::replay::AfterMiss;
use crate::verify::gate::GateOn;

/// A figure as the JSON document holds it: `None` where it is `null` (absent or not finite).
pub(super) fn known(x: Option<f64>) -> Option<f64> {
    x.filter(|v| v.is_finite())
}

/// A figure to 3 decimals, `-` where it is not known.
fn f(x: Option<f64>) -> String {
    known(x).map_or_else(|| "-".into(), |x| format!("{x:.3}"))
}

/// A figure that is always there, to 3 decimals.
fn f1(x: f64) -> String {
    f(Some(x))
}

/// A list of rates, as `a, b, c`.
fn list(v: &[Option<f64>]) -> String {
    v.iter().map(|x| f(*x)).collect::<Vec<_>>().join(", ")
}

/// One row of an AL table: category (or `overall`), N, baseline, draft, Δ.
fn row(s: &mut String, name: &str, n: usize, b: String, d: String, delta: String) {
    // N as the JSON number prints, unpadded.
    s.push_str(&format!(
        "{:<14} {} {:>12} {:>10} {:>9}\n",
        name, n, b, d, delta
    ));
}

fn header(s: &mut String) {
    s.push_str(&format!(
        "{:<14} {:>4} {:>12} {:>10} {:>9}\n",
        "category", "N", "AL baseline", "AL draft", "Δ"
    ))
}

/// The table printed on stdout.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    preamble(&mut s, r);
    walk_table(&mut s, r);
    all_positions_table(&mut s, r);
    for n in &r.interval_notes {
        s.push_str(&format!("note: {n}\n"));
    }
    degenerate(&mut s, r);
    published(&mut s, r);
    figures(&mut s, r);
    if let Some(n) = r.offline().and_then(|o| o.near_ties.as_ref()) {
        near_ties(&mut s, n);
    }
    if let Some(d) = known(r.draft.accept_length_all_positions) {
        s.push_str(&format!(
            "draft: all-positions AL {} (teacher-forced over every anchor: the offline figure DFlash cards quote), SGLang per-request AL {}, per-depth conditional acceptance [{}]\n",
            f1(d),
            f1(r.draft.accept_length_sglang_request),
            list(r.draft.conditional_acceptance.as_deref().unwrap_or_default())
        ));
    }
    live(&mut s, r);
    s.push_str(if r.passed { "PASSED\n" } else { "FAILED\n" });
    for reason in &r.reasons {
        s.push_str(&format!("  {}\n", printable(reason)));
    }
    s
}

/// A `note:` per degenerate set (`verify::degenerate`).
fn degenerate(s: &mut String, r: &Report) {
    for f in r.degenerate.iter().flat_map(|d| &d.findings) {
        s.push_str(&format!(
            "note: degenerate output ({}; {}, {}): {}\n",
            f.cause.name(),
            f.side,
            printable(&f.scope),
            f.detail
        ));
    }
}

/// `verify --synthetic-rates`: the draft's measured rates in each engine's synthetic-acceptance
/// form, overall and per category, ready to paste (docs/verify.md, "Synthetic acceptance
/// rates").
pub fn synthetic_lines(r: &Report) -> String {
    let mut s = String::new();
    let Some(syn) = &r.synthetic_acceptance else {
        return s;
    };
    let sets = std::iter::once(("overall".to_string(), syn.overall.as_ref())).chain(
        syn.per_category
            .iter()
            .map(|(c, x)| (printable(c).into_owned(), x.as_ref())),
    );
    for (name, rates) in sets {
        match rates {
            Some(x) => s.push_str(&format!(
                "synthetic acceptance, {name}: vLLM --speculative-config (merge with the draft's method and model): {}\n  SGLang: {}\n",
                x.vllm_line(),
                x.sglang_env
            )),
            None => s.push_str(&format!(
                "synthetic acceptance, {name}: not measured (no per-step histogram, or no verify round judged every draft position: samples that end within their rounds)\n"
            )),
        }
    }
    s
}

/// The work cap, a skipped pass, and what the AL column counts.
fn preamble(s: &mut String, r: &Report) {
    let (limit, replayed) = match (r.offline(), r.live()) {
        (Some(o), _) => (o.limit_per_category, o.samples_replayed),
        (_, Some(l)) => (l.limit_per_category, l.samples_replayed),
        _ => (None, 0),
    };
    if let Some(l) = limit {
        s.push_str(&format!(
            "work capped by --per-category: the first {l} samples of each category ({replayed} replayed)\n"
        ));
    }
    if let Some(o) = r.offline() {
        // Which stream the taps are, and what is not known about the drafts' (#41).
        s.push_str(&format!("{}\n", printable(&o.tap_stream.line())));
        for n in &o.tap_stream.notes {
            s.push_str(&format!("note: {}\n", printable(n)));
        }
    }
    if r.offline().is_some_and(|o| o.after_miss == AfterMiss::Skip) {
        s.push_str("pass A skipped the depths after a miss (--after-miss skip): no unconditional per-depth rates, no simulated AL\n");
    }
    s.push_str(if r.gated_on == GateOn::AllPositions {
        "AL: tokens committed per verify step, bonus token counted (Σ over the set); not gated (--gate-on all-positions)\n"
    } else {
        "AL: tokens committed per verify step, bonus token counted (Σ over the set)\n"
    });
}

/// The walked AL per category and overall, with the Δ's interval.
fn walk_table(s: &mut String, r: &Report) {
    header(s);
    for (c, v) in &r.per_category {
        // Categories come from the trace manifest: escaped for the terminal.
        let delta = if r.baseline.is_some() {
            f(v.delta)
        } else {
            "-".into()
        };
        row(s, &printable(c), v.n, f(v.baseline), f1(v.draft), delta);
    }
    let base = r.baseline.as_ref().map(|b| b.accept_length);
    let overall = [f(base), f1(r.draft.accept_length), f(r.delta)];
    close(s, r, overall, "", r.ci95);
}

/// A table's last row, `overall` ([baseline, draft, Δ]), and the interval of its Δ (`what`:
/// which accept length, `""` for the walked one).
fn close(s: &mut String, r: &Report, overall: [String; 3], what: &str, ci: Option<[f64; 2]>) {
    let [b, d, delta] = overall;
    row(s, "overall", r.samples, b, d, delta);
    if let Some(ci) = ci {
        s.push_str(&format!(
            "{what}ΔAL 95% CI (paired bootstrap over prompts): [{}, {}]\n",
            f1(ci[0]),
            f1(ci[1])
        ));
    }
}

/// The teacher-forced all-positions figures beside a baseline's (offline only).
fn all_positions_table(s: &mut String, r: &Report) {
    let Some(tf) = &r.all_positions else {
        return;
    };
    s.push_str(&format!(
        "all-positions AL: teacher-forced, 1 + leading matches over every anchor, not walked (the offline figure DFlash cards quote){}\n",
        if r.gated_on == GateOn::AllPositions { "; gated (--gate-on all-positions)" } else { "; not gated (--gate-on all-positions gates it)" }
    ));
    header(s);
    for (c, v) in &r.per_category {
        let a = v.all_positions.as_ref();
        row(
            s,
            &printable(c),
            v.n,
            f(a.and_then(|a| a.baseline_all_positions)),
            f(a.map(|a| a.draft_all_positions)),
            f(a.and_then(|a| a.delta_all_positions)),
        );
    }
    let base = r
        .baseline
        .as_ref()
        .and_then(|b| b.accept_length_all_positions);
    let overall = [
        f(base),
        f(r.draft.accept_length_all_positions),
        f(tf.delta_all_positions),
    ];
    close(s, r, overall, "all-positions ", tf.ci95_all_positions);
}

/// `--published`: each model-card figure the measurement is held against.
fn published(s: &mut String, r: &Report) {
    for c in r.published() {
        s.push_str(&format!(
            "published {} ({}): measured {} {} vs {} on the card ({}): {}\n",
            printable(&c.benchmark),
            printable(c.category.as_deref().unwrap_or("overall")),
            if c.count == "accept_length_all_positions" {
                "all-positions AL (teacher-forced)"
            } else {
                "AL (walk)"
            },
            f1(c.measured),
            f1(c.published),
            printable(&c.source),
            if c.passed {
                "at least the card less --max-regression"
            } else {
                "below the card by more than --max-regression"
            }
        ));
    }
}

/// The proposal agreement, and the engine's own count where it differs from the gated one.
fn figures(s: &mut String, r: &Report) {
    if let Some(a) = &r.agreement {
        s.push_str(&format!(
            "proposal agreement with the baseline (teacher-forced, every position): {} overall, per depth [{}]\n",
            f(a.overall),
            list(&a.per_depth)
        ));
    }
    let Some(d) = known(r.draft.accept_length_engine) else {
        return;
    };
    let b = r.baseline.as_ref();
    let be = known(b.and_then(|b| b.accept_length_engine));
    if Some(d) != known(Some(r.draft.accept_length))
        || (b.is_some() && be != known(b.map(|b| b.accept_length)))
    {
        s.push_str(&format!(
            "engine's own count (final step before the cut at max_tokens/EOS, as vLLM reports): draft {}{}; the gate uses committed tokens\n",
            f1(d),
            if b.is_some() { format!(", baseline {}", f(be)) } else { String::new() }
        ));
    }
}

/// `--near-ties`: the ranges the near-ties span.
fn near_ties(s: &mut String, n: &NearTies) {
    let range = |v: [f64; 2]| format!("[{}, {}]", f1(v[0]), f1(v[1]));
    let side = |name: &str, x: &TieSide| {
        format!(
            "{name} AL (walk) {} ({} requests, {} steps)",
            range(x.accept_length),
            x.requests_with_ties,
            x.steps
        )
    };
    s.push_str(&format!(
        "near-ties (logits within {} of the runner-up) can move: {}{}{}\n",
        json_number(n.margin),
        side("draft", &n.draft),
        n.baseline
            .as_ref()
            .map_or(String::new(), |b| format!("; {}", side("baseline", b))),
        n.delta
            .map_or(String::new(), |d| format!("; Δ {}", range(d)))
    ));
}

/// A number as the JSON document writes it (`0.03`, `1.0`; `null` where not finite).
pub(super) fn json_number(x: f64) -> String {
    serde_json::to_string(&x).expect("JSON")
}

/// Each live deployment: its engine, version, address and requests.
fn live(s: &mut String, r: &Report) {
    let Some(l) = r.live() else {
        return;
    };
    for (side, e) in [
        ("draft", Some(&l.live.draft)),
        ("baseline", l.live.baseline.as_ref()),
    ] {
        let Some(e) = e else {
            continue;
        };
        s.push_str(&format!(
            "live {side}: {} {} at {}: {} requests measured ({}), {} failed\n",
            e.engine.id(),
            // The server's own string: escaped for the terminal.
            printable(e.version.as_deref().unwrap_or("(version unknown)")),
            printable(&e.endpoint),
            e.measured,
            printable(&e.sources.join(", ")),
            e.failed.len(),
        ));
    }
}
