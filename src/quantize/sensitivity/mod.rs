//! Per-module-group sensitivity (`kquant sensitivity`, #16): which groups of a draft's linears
//! a quantization recipe may touch, the exclude patterns that leave one group alone, and the
//! order in which the exclusion sets are tried when looking for the cheapest one that meets
//! the gate (cheapest first among those predicted to pass, the prediction corrected by the
//! misses so far). Measuring (quantize a variant, replay it, compare with the original) is
//! `run`'s part; this is the arithmetic around it.
//!
//! Groups follow the projections engines fuse or treat alike, across every layer: `q/k/v`
//! (`q_proj`, `k_proj`, `v_proj`), the MLA projections (`q_a_proj`, `q_b_proj`,
//! `kv_a_proj_with_mqa`, `kv_b_proj`), `o` (`o_proj`), `gate/up`, `down`, and every other leaf
//! name on its own (`fc`, `lm_head`, …). A fused family (q/k/v, gate/up) is never split, so a
//! scheme whose per-tensor scale fused siblings share can run every variant.

pub mod report;
pub mod run;

use serde::Serialize;

/// The group of a module with fused or alike siblings, by its leaf name (`""`: its own).
pub fn group_of(module: &str) -> &'static str {
    let leaf = module.rsplit('.').next().unwrap_or(module);
    match leaf {
        "q_proj" | "k_proj" | "v_proj" | "qkv_proj" => "q/k/v",
        "q_a_proj" | "q_b_proj" | "kv_a_proj_with_mqa" | "kv_b_proj" => "mla",
        "o_proj" => "o",
        "gate_proj" | "up_proj" | "gate_up_proj" => "gate/up",
        "down_proj" => "down",
        _ => "",
    }
}

/// One group of modules, with what quantizing it saves (in the document, `name` is the key
/// `group`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    /// `q/k/v`, `mla`, `o`, `gate/up`, `down`, or the leaf name (`fc`, `lm_head`, …).
    #[serde(rename = "group")]
    pub name: String,
    /// Its modules, in the source's order.
    pub modules: Vec<String>,
    /// Exclude patterns (Quark fnmatch) that match exactly its modules among the candidates.
    pub patterns: Vec<String>,
    /// Source bytes of its weights, and their bytes once quantized.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

impl Group {
    /// Bytes the output keeps when this group stays unquantized.
    pub fn cost(&self) -> u64 {
        self.bytes_before.saturating_sub(self.bytes_after)
    }
}

/// Groups of the quantized modules `(module, bytes before, bytes after)`, in order of first
/// appearance. Patterns: `*.LEAF` for each leaf (or `LEAF` itself for a top-level module such
/// as `lm_head`); where those would also match a module of another group, the module names
/// (each pattern character in a class).
pub fn groups(modules: &[(String, u64, u64)]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for (m, before, after) in modules {
        let leaf = m.rsplit('.').next().unwrap_or(m);
        let name = match group_of(m) {
            "" => leaf.to_string(),
            g => g.to_string(),
        };
        let pattern = if m.contains('.') {
            format!("*.{leaf}")
        } else {
            leaf.to_string()
        };
        let g = match out.iter().position(|g| g.name == name) {
            Some(i) => &mut out[i],
            None => {
                out.push(Group {
                    name,
                    modules: Vec::new(),
                    patterns: Vec::new(),
                    bytes_before: 0,
                    bytes_after: 0,
                });
                out.last_mut().expect("pushed")
            }
        };
        g.modules.push(m.clone());
        if !g.patterns.contains(&pattern) {
            g.patterns.push(pattern);
        }
        g.bytes_before += before;
        g.bytes_after += after;
    }
    // A pattern that reaches into another group (a name with a pattern character, a leaf
    // shared at two depths) is replaced by the group's module names.
    let all: Vec<String> = modules.iter().map(|m| m.0.clone()).collect();
    for g in &mut out {
        let exact = all.iter().all(|m| {
            crate::quant::exclude::excluded_by(&g.patterns, m).is_some() == g.modules.contains(m)
        });
        if !exact {
            g.patterns = g.modules.iter().map(|m| literal(m)).collect();
        }
    }
    out
}

/// A pattern matching exactly `name`: fnmatch's special characters each in a class.
fn literal(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '*' | '?' | '[' => format!("[{c}]"),
            c => c.to_string(),
        })
        .collect()
}

/// An exclusion set to try: the groups kept unquantized (indices into the groups), what the
/// measured single-group losses predict for it, and its cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub exclude: Vec<usize>,
    /// ΔAL predicted: the measured ΔAL with every group quantized, minus the excluded groups'
    /// own (each measured alone).
    pub predicted: f64,
    /// Bytes the output keeps for them (`Group::cost`, summed).
    pub cost: u64,
}

/// Most groups [`candidates`] enumerates every subset of (2^16 subsets).
pub const MAX_GROUPS: usize = 16;

/// Every exclusion set, cheapest first: each non-empty proper subset of the groups, by cost,
/// then fewer groups, then predicted ΔAL (higher first). `all` is ΔAL with every group
/// quantized, `single[i]` with group i alone. The empty set is the all-quantized variant itself,
/// measured already; the full set quantizes nothing. At most [`MAX_GROUPS`] groups.
pub fn candidates(groups: &[Group], all: f64, single: &[f64]) -> Vec<Candidate> {
    assert_eq!(groups.len(), single.len(), "one measurement per group");
    let n = groups.len().min(MAX_GROUPS);
    let mut out: Vec<Candidate> = (1u32..(1 << n) - 1)
        .map(|mask| {
            let exclude: Vec<usize> = (0..n).filter(|i| mask >> i & 1 == 1).collect();
            Candidate {
                predicted: all - exclude.iter().map(|&i| single[i]).sum::<f64>(),
                cost: exclude.iter().map(|&i| groups[i].cost()).sum(),
                exclude,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        (a.cost, a.exclude.len())
            .cmp(&(b.cost, b.exclude.len()))
            .then(b.predicted.total_cmp(&a.predicted))
    });
    out
}

/// The next exclusion set to measure: the cheapest untried candidate whose prediction, corrected
/// by how far the measured trials fell from theirs (`bias`: the mean of measured − predicted,
/// 0 before any), meets `−max_regression`. Accept-length losses are not additive (excluding a
/// group often saves less than its own loss), so the correction moves the search towards larger
/// exclusions after each miss.
pub fn next_trial(
    cands: &[Candidate],
    tried: &[bool],
    bias: f64,
    max_regression: f64,
) -> Option<usize> {
    (0..cands.len()).find(|&i| !tried[i] && cands[i].predicted + bias >= -max_regression)
}

/// The mean of measured − predicted ΔAL over the trials so far (0 with none).
pub fn bias(trials: &[(f64, f64)]) -> f64 {
    if trials.is_empty() {
        return 0.0;
    }
    trials.iter().map(|(p, m)| m - p).sum::<f64>() / trials.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eagle3() -> Vec<(String, u64, u64)> {
        [
            "midlayer.self_attn.q_proj",
            "midlayer.self_attn.k_proj",
            "midlayer.self_attn.v_proj",
            "midlayer.self_attn.o_proj",
            "midlayer.mlp.gate_proj",
            "midlayer.mlp.up_proj",
            "midlayer.mlp.down_proj",
            "fc",
            "lm_head",
        ]
        .iter()
        .map(|m| (m.to_string(), 100, 25))
        .collect()
    }

    #[test]
    fn groups_fuse_siblings_and_match_exactly() {
        let g = groups(&eagle3());
        let names: Vec<&str> = g.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["q/k/v", "o", "gate/up", "down", "fc", "lm_head"]);
        assert_eq!(g[0].patterns, ["*.q_proj", "*.k_proj", "*.v_proj"]);
        assert_eq!(g[0].cost(), 225);
        assert_eq!(g[5].patterns, ["lm_head"]);
        // A leaf that is also a pattern character or occurs at the top level and below:
        // the module names themselves.
        let odd = vec![
            ("a.fc".to_string(), 1, 1),
            ("b.x.fc".to_string(), 1, 1),
            ("fc".to_string(), 1, 1),
        ];
        let g = groups(&odd);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].patterns, ["*.fc", "fc"]);
        let star = vec![("l.w*".to_string(), 1, 1), ("l.wx".to_string(), 1, 1)];
        let g = groups(&star);
        assert_eq!(g[0].patterns, ["l.w[*]"], "`*.w*` would match l.wx too");
        assert!(crate::quant::exclude::excluded_by(&g[0].patterns, "l.wx").is_none());
        assert!(crate::quant::exclude::excluded_by(&g[0].patterns, "l.w*").is_some());
    }

    #[test]
    fn trials_go_cheapest_first_and_the_misses_move_the_search() {
        let g = groups(&eagle3());
        // costs: q/k/v 225, o 75, gate/up 150, down 75, fc 75, lm_head 75
        let single = [-0.01, -0.002, -0.02, -0.03, -0.001, -0.004];
        let c = candidates(&g, -0.07, &single);
        assert_eq!(c.len(), 62);
        assert!(c.windows(2).all(|w| w[0].cost <= w[1].cost));
        let mut tried = vec![false; c.len()];
        // Excluding down alone predicts −0.04 (fails); down + gate/up (cost 225, −0.02) ties
        // on cost with q/k/v + down (−0.03) and wins on the prediction.
        let i = next_trial(&c, &tried, 0.0, 0.03).unwrap();
        assert_eq!(c[i].exclude, vec![2, 3]);
        assert!((c[i].predicted + 0.02).abs() < 1e-12);
        // It measured −0.035 where −0.02 was predicted: the next one must predict ≥ −0.015.
        tried[i] = true;
        let b = bias(&[(c[i].predicted, -0.035)]);
        assert!((b + 0.015).abs() < 1e-12);
        let j = next_trial(&c, &tried, b, 0.03).unwrap();
        assert!(
            c[j].predicted >= -0.015 && c[j].cost >= c[i].cost,
            "{:?}",
            c[j]
        );
        assert!(c[..j]
            .iter()
            .zip(&tried)
            .all(|(x, &t)| t || x.predicted + b < -0.03));
        // Nothing short of quantizing nothing is predicted to pass.
        assert_eq!(next_trial(&c, &vec![false; c.len()], -1.0, 0.03), None);
        assert_eq!(bias(&[]), 0.0);
    }
}
