//! Drive a quantize [`Plan`]: claim the output ([`Job::start`], with the warnings the user
//! should see before the long part), encode the modules in the order the writer needs them on a
//! producer thread while this thread copies the unchanged tensors ([`Job::write`]), then the
//! config files, a retargeted TensorRT-LLM YAML and the next steps ([`Job::finish`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::plan::{non_finite, Action, Plan};
use crate::checkpoint::Family;
use crate::engines::target::{on_target, Serves};
use crate::error::Result;
use crate::io::manifest::FileEntry;
use crate::io::writer::{WriteOptions, Writer};
use crate::quant::codec::{Encoded, StoredWeight};
use crate::quant::format::Format;
use crate::quant::registry::Scheme;
use crate::quantize::schedule;
use crate::target::profile::builtin_or_empty;
use crate::target::shape::{candidates, one_architecture, DraftShape};

/// The memory `quantize` aims to stay within (the target for the 6 GB draft).
const MEMORY_TARGET: u64 = 896 << 20;

/// A quantize run with its output claimed.
pub struct Job<'p> {
    plan: &'p Plan<'p>,
    family: Family,
    writer: Writer,
    output: PathBuf,
}

/// What a finished run wrote.
#[derive(Debug)]
pub struct Done {
    pub dir: PathBuf,
    pub files: Vec<FileEntry>,
    /// Warnings raised while finishing (a TensorRT-LLM YAML not carried over).
    pub warnings: Vec<String>,
    /// What a user does with the result next.
    pub next: Vec<String>,
}

impl<'p> Job<'p> {
    /// Claim `output` for `plan` (refused if it exists, unless `--force` over a kquant
    /// output); the warnings to print now (no engine loads the result; the source is not a
    /// draft). `src` is the source as the user named it.
    pub fn start(
        plan: &'p Plan<'p>,
        output: &Path,
        wopts: WriteOptions,
        family: &Family,
        src: &str,
    ) -> Result<(Job<'p>, Vec<String>)> {
        let writer = Writer::create(output, plan.specs(), wopts)?;
        let mut warnings = Vec::new();
        let advice = plan.codec.advice();
        if let Some(w) = crate::engines::quantized::unloadable_warning(
            plan.recipe.format(),
            plan.recipe.scheme(),
            family,
            advice.as_deref(),
        ) {
            warnings.push(w);
        }
        warnings.extend(super::plan::markov_w2_warning(plan));
        if *family == Family::Target {
            warnings.push(format!(
                "`{src}` is not a draft (family {}): kquant's engine claims, presets, convert and verify are for EAGLE-3 and DFlash drafts",
                family.id()
            ));
        }
        let job = Job {
            plan,
            family: family.clone(),
            writer,
            output: output.to_path_buf(),
        };
        Ok((job, warnings))
    }

    /// The inputs a manifest records for `plan`'s source: its weight files and config.
    pub fn inputs(plan: &Plan) -> Vec<PathBuf> {
        let w = &plan.ck.weights;
        let mut inputs: Vec<PathBuf> = w.files().iter().map(|p| p.to_path_buf()).collect();
        inputs.extend(w.config_path.clone());
        inputs
    }

    /// [`Job::inputs`], and the files of the calibration trace when there is one: an input of
    /// the output, which the manifest records (and hashes).
    pub fn inputs_calibrated(plan: &Plan, trace: Option<&Path>) -> Result<Vec<PathBuf>> {
        let mut inputs = Job::inputs(plan);
        if let Some(t) = trace {
            inputs.extend(crate::trace::file::files(t)?);
        }
        Ok(inputs)
    }

    /// Write every tensor; `progress` gets the source bytes done as they are.
    pub fn write(&mut self, progress: &(dyn Fn(u64) + Sync)) -> Result<()> {
        let plan = self.plan;
        let ck = plan.ck;
        let w = &mut self.writer;
        let mut producer: HashMap<String, usize> = HashMap::new();
        let mut sizes: HashMap<String, u64> = HashMap::new();
        for (i, r) in plan.rows.iter().enumerate() {
            for s in &r.outputs {
                producer.insert(s.name.clone(), i);
                sizes.insert(s.name.clone(), s.nbytes());
            }
        }
        let order: Vec<String> = w.order().into_iter().map(String::from).collect();
        // The encodings, in the order the writer needs them (a module again where keeping its
        // later tensors would pass the memory budget): a producer thread runs them one ahead
        // while this thread copies the unchanged tensors, so encoding overlaps the I/O and
        // hashing.
        let jobs = schedule::plan(
            &order,
            |n| {
                let i = producer[n];
                plan.rows[i].quantized().then_some(i)
            },
            |n| sizes[n],
            pending_budget(plan),
        );
        let modules: Vec<usize> = jobs.iter().map(|j| j.module).collect();
        let encode = |i: usize, scratch: &mut Vec<f32>| -> Result<Encoded> {
            let r = &plan.rows[i];
            let t = r.tensor;
            let Action::Quantize { module, rows, cols } = &r.action else {
                unreachable!("only quantized modules are encoded")
            };
            if let (Some(q), Some(g)) = (plan.chosen.get(module), plan.codec.int_grid()) {
                return Ok(g.write(module, q, t.dtype));
            }
            let shard = ck.weights.shard_of(&t.name).expect("routed");
            let raw = shard.view(t).data;
            // Peak memory per tensor: the codec's f32 copy (one buffer reused for every
            // tensor) plus the encoded output; the mapped pages are dropped as soon as they
            // are read.
            let stored = StoredWeight {
                raw,
                dtype: t.dtype,
                rows: *rows,
                cols: *cols,
                release: &|| shard.release(t),
            };
            let encoded = plan.codec.encode_stored(module, &stored, scratch);
            shard.release(t);
            encoded.map_err(|i| {
                let esz = t.dtype.size();
                let mut v = Vec::new();
                crate::io::dtype::to_f32(t.dtype, &raw[i * esz..(i + 1) * esz], &mut v);
                non_finite(shard.path(), &t.name, i, *cols, v[0])
            })
        };
        std::thread::scope(|sc| -> Result<()> {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let encode = &encode;
            sc.spawn(move || {
                let mut scratch = Vec::new();
                for i in modules {
                    if tx.send((i, encode(i, &mut scratch))).is_err() {
                        break;
                    }
                }
            });
            let mut pending: HashMap<String, Vec<u8>> = HashMap::new();
            let mut jobs = jobs.into_iter();
            for name in order {
                if let Some(bytes) = pending.remove(&name) {
                    w.write(&name, &bytes)?;
                    continue;
                }
                let i = producer[&name];
                let t = plan.rows[i].tensor;
                match &plan.rows[i].action {
                    Action::Copy { .. } => {
                        // Read into the writer's blocks, never mapped: a multi-GB embedding
                        // never sits in this process's RSS.
                        let shard = ck.weights.shard_of(&t.name).expect("routed");
                        w.copy_tensor(&name, shard, t, progress)?;
                    }
                    Action::Quantize { .. } => {
                        let job = jobs.next().expect("a job for every encoded tensor");
                        let (j, encoded) = rx.recv().expect("the encoder sends every job");
                        debug_assert!(j == i && job.module == i && job.now == name);
                        for (n, bytes) in encoded? {
                            if n == name {
                                w.write(&n, &bytes)?;
                            } else if job.keep.contains(&n) {
                                pending.insert(n, bytes);
                            }
                        }
                        if job.first {
                            progress(t.nbytes());
                        }
                    }
                }
            }
            Ok(())
        })
    }

    /// The config files (the source's `config.json` with `quantization_config`, the format's
    /// side files, a TensorRT-LLM YAML retargeted at the output), then the output renamed into
    /// place.
    pub fn finish(mut self, src: &str) -> Result<Done> {
        let plan = self.plan;
        let ck = plan.ck;
        let files = plan.codec.config(&plan.unquantized);
        let mut config = match &ck.config {
            Some(c) => Value::Object(c.root.clone()),
            None => json!({}),
        };
        config["quantization_config"] = files.quantization_config;
        if let Some(r) = &plan.record {
            // Beside quantization_config (left as the format writes it): the method and the
            // calibration trace that chose the codes. No engine loader has been run on a
            // calibrated output yet (docs/quantize.md).
            config["kquant_quantization"] = r.clone();
        }
        self.writer.add_file(
            "config.json",
            &serde_json::to_vec_pretty(&config).expect("config JSON"),
        )?;
        for (name, bytes) in files.side_files {
            self.writer.add_file(&name, &bytes)?;
        }
        let mut warnings = Vec::new();
        if let Some(note) = self.trtllm_config()? {
            warnings.push(note);
        }
        let s = self.writer.finish()?;
        // What the draft says about its target (hidden size, layer count, taps), to name the
        // right target profile: two targets of one hidden size (the tiny Kimi-K2 and
        // Kimi-Linear ones) are told apart by the taps their profiles give the draft's family.
        let target = crate::checkpoint::detect::detect(plan.ck)
            .ok()
            .map(|d| DraftShape::of(plan.ck, &d));
        let next = next_steps(
            &self.family,
            plan.recipe.format(),
            plan.recipe.scheme(),
            &s.dir,
            src,
            target.as_ref(),
        );
        Ok(Done {
            dir: s.dir,
            files: s.files,
            warnings,
            next,
        })
    }

    /// A source laid out for TensorRT-LLM by `convert --to trtllm` carries an
    /// `extra-llm-api-config.yml` whose `speculative_model_dir` is the source. The output gets
    /// its own, pointing at itself (the same `max_draft_len`, decoding type and taps), when
    /// TensorRT-LLM loads the result; otherwise none, and a warning (returned) says why. A YAML
    /// kquant did not write is not copied either (it would point at the source), with a
    /// warning.
    fn trtllm_config(&mut self) -> Result<Option<String>> {
        use crate::convert::layout::TRTLLM_YAML;
        use crate::engines::{quantized, Engine, Loads};
        let (format, scheme) = (self.plan.recipe.format(), self.plan.recipe.scheme());
        let path = self.plan.ck.weights.dir.join(TRTLLM_YAML);
        if !path.is_file() {
            return Ok(None);
        }
        let yaml = crate::io::text::read_regular_text(
            &path,
            crate::io::text::MAX_CONFIG,
            "TensorRT-LLM config",
        )?;
        let loads = quantized::claim_for(format, scheme, Engine::Trtllm, &self.family)
            .is_some_and(|c| c.loads == Loads::Yes);
        if !loads {
            return Ok(Some(format!(
                "{TRTLLM_YAML} of the source is not carried over: TensorRT-LLM does not load \
                 --format {} --scheme {scheme} (`kquant schemes`)",
                format.name()
            )));
        }
        let dir = crate::convert::final_dir(&self.output);
        match crate::convert::retarget_trtllm_yaml(&yaml, &dir.to_string_lossy()) {
            Some(y) => {
                self.writer.add_file(TRTLLM_YAML, y.as_bytes())?;
                Ok(None)
            }
            None => Ok(Some(format!(
                "{} was not written by kquant convert: not copied (its speculative_model_dir is \
                 the source); `kquant convert {} {} --to trtllm` writes one for the output",
                path.display(),
                if self.family == Family::Dflash {
                    "dflash"
                } else {
                    "eagle3"
                },
                self.output.display()
            ))),
        }
    }
}

/// What a user does with a quantized draft next: the layout (and launch line) of each engine
/// that loads it (`convert --to`), and the accept-length gate (`verify`). None for a target.
fn next_steps(
    family: &Family,
    format: Format,
    scheme: Scheme,
    out: &Path,
    src: &str,
    target: Option<&DraftShape>,
) -> Vec<String> {
    use crate::engines::{quantized, Engine, Loads};
    let kind = match family {
        Family::Eagle3 | Family::Eagle3Mla => "eagle3",
        Family::Dflash => "dflash",
        // `kquant convert` does not take them yet: the gate only.
        Family::Dspark | Family::Dflash2 => {
            return vec![verify_step(&out.display().to_string(), src, target)]
        }
        _ => return Vec::new(),
    };
    let out = out.display();
    // The draft's target, where its shape names one architecture: an engine that cannot serve
    // the draft beside it is not suggested (`kquant inspect` gives it `no`).
    let arch = target.and_then(|t| one_architecture(&candidates(&builtin_or_empty(), t)));
    let mut v = Vec::new();
    for e in Engine::ALL {
        let beside = arch.as_deref().and_then(|a| on_target(family, a, e));
        if beside.as_ref().is_some_and(|b| b.serves == Serves::No) {
            continue;
        }
        if quantized::claim_for(format, scheme, e, family).is_some_and(|c| c.loads == Loads::Yes) {
            let extra = match (&beside, e) {
                (Some(b), _) => format!(
                    " (prints the launch line; {} serves it beside {} only from a recent build: `kquant inspect`)",
                    e.name(),
                    b.architecture
                ),
                (None, Engine::Trtllm) => {
                    " (writes extra-llm-api-config.yml and the trtllm-serve line)".to_string()
                }
                (None, _) => " (prints the launch line)".to_string(),
            };
            v.push(format!(
                "kquant convert {kind} {out} --to {} -o {out}-{}{extra}",
                e.id(),
                e.id()
            ));
        }
    }
    v.push(verify_step(&out.to_string(), src, target));
    v
}

/// The accept-length gate for a draft: the built-in profile of its target
/// ([`candidates`]: hidden size, layer count, then the family's taps;
/// without `--trace` where kquant runs that target itself), else a target checkpoint to name.
fn verify_step(out: &str, src: &str, t: Option<&DraftShape>) -> String {
    let profiles = builtin_or_empty();
    let matching = t.map(|t| candidates(&profiles, t)).unwrap_or_default();
    let gate = "(the accept-length gate; docs/verify.md)";
    match matching.as_slice() {
        [p] if p.live.is_some() => format!(
            "kquant verify --target {} --draft {out} --baseline {src} {gate}",
            p.name
        ),
        // A block drafter (DFlash, DSpark, DFlash2) runs with its target's embedding and
        // lm_head: a profile kquant
        // does not run names no checkpoint to take them from.
        [p, ..] if t.is_some_and(|t| t.family == Family::Dflash || t.family.is_block_2026()) => format!(
            "kquant verify --target {} --target-checkpoint TARGET --draft {out} --baseline {src} --trace TRACE {gate}",
            p.name
        ),
        [p, ..] => format!(
            "kquant verify --target {} --draft {out} --baseline {src} --trace TRACE {gate}",
            p.name
        ),
        [] => format!(
            "kquant verify --target-checkpoint TARGET --draft {out} --baseline {src} --trace TRACE {gate}"
        ),
    }
}

/// Most bytes of encoded tensors held for the writer at once (see [`schedule`]): what is left
/// of [`MEMORY_TARGET`] after the encoder's f32 buffer (the largest weight) and three encoded
/// modules (the one being written, the one in the channel, the one being encoded).
fn pending_budget(plan: &Plan) -> u64 {
    let mut f32_max = 0u64;
    let mut enc_max = 0u64;
    for r in &plan.rows {
        if let Action::Quantize { rows, cols, .. } = r.action {
            f32_max = f32_max.max((rows * cols * 4) as u64);
            enc_max = enc_max.max(r.bytes_after());
        }
    }
    MEMORY_TARGET.saturating_sub(f32_max + 3 * enc_max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::shape::DraftShape;

    /// The gate `quantize` suggests: a live profile runs without a trace; a profile kquant does
    /// not run needs one, and a DFlash drafter there also its target's checkpoint (for the
    /// embedding and lm_head); a draft matching no profile names a target checkpoint.
    #[test]
    fn the_suggested_gate_names_what_the_draft_needs() {
        let dflash = |hidden, layers, taps: &[usize]| DraftShape {
            family: Family::Dflash,
            hidden: Some(hidden),
            num_target_layers: Some(layers),
            taps: Some(taps.to_vec()),
        };
        let real = verify_step("OUT", "SRC", Some(&dflash(2304, 27, &[4, 8, 16, 20, 24])));
        assert!(
            real.starts_with("kquant verify --target kimi-linear-48b-a3b --target-checkpoint TARGET --draft OUT --baseline SRC --trace TRACE"),
            "{real}"
        );
        let tiny = verify_step("OUT", "SRC", Some(&dflash(256, 4, &[2, 3])));
        assert!(
            tiny.starts_with(
                "kquant verify --target kimi-linear-tiny --draft OUT --baseline SRC ("
            ),
            "{tiny}"
        );
        let eagle = DraftShape {
            family: Family::Eagle3,
            hidden: Some(7168),
            num_target_layers: None,
            taps: Some(vec![2, 30, 58]),
        };
        let k2 = verify_step("OUT", "SRC", Some(&eagle));
        assert!(
            k2.starts_with(
                "kquant verify --target kimi-k2.5 --draft OUT --baseline SRC --trace TRACE"
            ),
            "{k2}"
        );
        for none in [None, Some(&dflash(999, 3, &[1]))] {
            assert!(verify_step("OUT", "SRC", none)
                .starts_with("kquant verify --target-checkpoint TARGET --draft OUT"));
        }
    }
}
