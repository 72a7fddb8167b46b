//! `kquant bench quantize` and `bench convert`: the command, run as a child process of this
//! binary, against `cp -r SRC` and `cp -r SRC && sync` of the same bytes (and optionally a
//! further baseline such as Quark's own script), in interleaved rounds; wall time and peak RSS
//! of each, every figure the median of the rounds.

use std::path::Path;
use std::process::Command as Proc;
use std::time::Instant;

use serde_json::{json, Value};

use crate::error::{Error, Result};

/// What to time.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// `quantize` (`kquant quantize SRC -o OUT ARGS`) or `convert`
    /// (`kquant convert ARGS[0] SRC -o OUT ARGS[1..]`).
    pub verb: &'a str,
    /// The checkpoint directory.
    pub src: &'a Path,
    /// Where the outputs go (in a directory of this run's own, removed after each step).
    pub scratch: &'a Path,
    /// A further command to time in every round (`sh -c`; `{src}` and `{out}` replaced).
    pub baseline: Option<&'a str>,
    /// Rounds.
    pub repeat: u32,
    /// The command's arguments.
    pub args: &'a [String],
}

/// The figures of a timed run.
#[derive(Debug, Clone)]
pub struct Timings {
    pub verb: String,
    pub src: std::path::PathBuf,
    /// Bytes of the files directly in SRC.
    pub bytes: u64,
    pub args: Vec<String>,
    pub repeat: u32,
    /// Each round's seconds: `cp -r`, `cp -r && sync`, kquant.
    pub cp: Vec<f64>,
    pub cp_sync: Vec<f64>,
    pub kquant: Vec<f64>,
    /// The baseline's rounds, when one was given.
    pub baseline: Option<Vec<f64>>,
    /// Peak RSS of the children, bytes (the largest over the rounds).
    pub cp_rss: u64,
    pub kquant_rss: u64,
    pub baseline_rss: u64,
}

impl Timings {
    pub fn cp_s(&self) -> f64 {
        median(&self.cp)
    }
    pub fn cp_sync_s(&self) -> f64 {
        median(&self.cp_sync)
    }
    pub fn kquant_s(&self) -> f64 {
        median(&self.kquant)
    }
    /// The baseline's median seconds and peak RSS, when it ran.
    pub fn baseline(&self) -> Option<(f64, u64)> {
        self.baseline
            .as_ref()
            .filter(|b| !b.is_empty())
            .map(|b| (median(b), self.baseline_rss))
    }

    /// The `--json` document (`kquant.bench.quantize/1`, `kquant.bench.convert/1`).
    pub fn to_json(&self) -> Value {
        let (cp_s, cps_s, kq_s) = (self.cp_s(), self.cp_sync_s(), self.kquant_s());
        let base = self.baseline();
        json!({
            "schema": format!("kquant.bench.{}/1", self.verb),
            "src": self.src, "bytes": self.bytes, "args": self.args,
            "repeat": self.repeat, "cp_runs_s": self.cp, "cp_sync_runs_s": self.cp_sync, "kquant_runs_s": self.kquant,
            "baseline_runs_s": self.baseline,
            "cp_s": cp_s, "cp_rss_bytes": self.cp_rss, "cp_sync_s": cps_s,
            "kquant_s": kq_s, "kquant_rss_bytes": self.kquant_rss,
            "kquant_vs_cp": kq_s / cp_s, "kquant_vs_cp_sync": kq_s / cps_s,
            "baseline_s": base.map(|b| b.0), "baseline_rss_bytes": base.map(|b| b.1),
            "baseline_vs_kquant": base.map(|b| b.0 / kq_s),
            "threads": rayon::current_num_threads(),
        })
    }
}

/// The median of some timings (the mean of the middle two for an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Run `sh -c cmd`, returning (wall seconds, peak RSS bytes of that child).
fn timed(cmd: &str) -> Result<(f64, u64)> {
    let t = Instant::now();
    let mut child = Proc::new("sh")
        .arg("-c")
        .arg(cmd)
        .spawn()
        .map_err(|e| Error::io("run", Path::new("sh"), e))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: plain FFI with valid out-pointers; the rusage is zero-initialised.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = t.elapsed().as_secs_f64();
    if r != pid {
        let _ = child.wait();
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(Error::Usage(format!("`{cmd}` failed")));
    }
    Ok((wall, ru.ru_maxrss as u64 * 1024))
}

/// `p` as one single-quoted shell word.
fn quote(p: &str) -> String {
    format!("'{}'", p.replace('\'', "'\\''"))
}

/// The kquant command line of `req` writing to `out` (its stderr dropped).
fn command(req: &Request, me: &Path, out: &Path) -> Result<String> {
    let q = |p: &Path| quote(&p.display().to_string());
    let extra: Vec<String> = req.args.iter().map(|a| quote(a)).collect();
    Ok(match (req.verb, extra.split_first()) {
        ("convert", Some((kind, rest))) => format!(
            "{} convert {kind} {} -o {} {} 2>/dev/null",
            q(me),
            q(req.src),
            q(out),
            rest.join(" ")
        ),
        ("convert", None) => {
            let names = |v: Vec<Option<clap::builder::PossibleValue>>| {
                v.into_iter()
                    .flatten()
                    .map(|p| p.get_name().to_string())
                    .collect::<Vec<_>>()
                    .join(" | ")
            };
            use clap::ValueEnum;
            return Err(Error::Flags {
                msg: "bench convert needs the kind and --to after `--`".into(),
                hint: format!(
                    "give the kind ({}) and --to ENGINE ({}) after `--`, e.g. `-- eagle3 --to vllm`",
                    names(crate::convert::Kind::value_variants().iter().map(|k| k.to_possible_value()).collect()),
                    names(crate::convert::DraftLayout::value_variants().iter().map(|e| e.to_possible_value()).collect()),
                ),
            });
        }
        (verb, _) => format!(
            "{} {verb} {} -o {} {} 2>/dev/null",
            q(me),
            q(req.src),
            q(out),
            extra.join(" ")
        ),
    })
}

/// Time `req`: interleaved rounds, so that a slow moment of the machine (writeback of an
/// earlier step, another VM) hits every command alike.
pub fn run(req: &Request) -> Result<Timings> {
    let src = req.src;
    let bytes: u64 = std::fs::read_dir(src)
        .map_err(|e| Error::io("list", src, e))?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    std::fs::create_dir_all(req.scratch).map_err(|e| Error::io("create", req.scratch, e))?;
    // Every step writes and deletes `out` in a directory of this run's own, so nothing that was
    // in SCRATCH before is ever deleted (removed at the end, also on error).
    let work = tempfile::Builder::new()
        .prefix(".kquant-bench-")
        .tempdir_in(req.scratch)
        .map_err(|e| Error::io("create a directory in", req.scratch, e))?;
    let out = work.path().join("out");
    let clean = || {
        let _ = std::fs::remove_dir_all(&out);
        let _ = Proc::new("sync").status();
    };
    let q = |p: &Path| quote(&p.display().to_string());
    let me = std::env::current_exe().map_err(|e| Error::io("locate", Path::new("kquant"), e))?;
    let cmd = command(req, &me, &out)?;
    let base_cmd = req
        .baseline
        .map(|c| c.replace("{src}", &q(src)).replace("{out}", &q(&out)));
    let mut t = Timings {
        verb: req.verb.to_string(),
        src: src.to_path_buf(),
        bytes,
        args: req.args.to_vec(),
        repeat: req.repeat,
        cp: Vec::new(),
        cp_sync: Vec::new(),
        kquant: Vec::new(),
        baseline: base_cmd.as_ref().map(|_| Vec::new()),
        cp_rss: 0,
        kquant_rss: 0,
        baseline_rss: 0,
    };
    clean();
    for _ in 0..req.repeat {
        let (s, r) = timed(&format!("cp -r {} {}", q(src), q(&out)))?;
        t.cp.push(s);
        t.cp_rss = t.cp_rss.max(r);
        clean();
        t.cp_sync
            .push(timed(&format!("cp -r {} {} && sync", q(src), q(&out)))?.0);
        clean();
        let (s, r) = timed(&cmd)?;
        t.kquant.push(s);
        t.kquant_rss = t.kquant_rss.max(r);
        clean();
        if let (Some(b), Some(runs)) = (&base_cmd, t.baseline.as_mut()) {
            let (s, r) = timed(b)?;
            runs.push(s);
            t.baseline_rss = t.baseline_rss.max(r);
            clean();
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn a_shell_word_keeps_its_quotes() {
        assert_eq!(quote("a'b"), "'a'\\''b'");
    }
}
