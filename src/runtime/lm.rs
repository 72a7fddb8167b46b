//! What every CPU target runtime shares around its own chunk forward: the token check, the
//! lm_head, the full forward (one chunk from empty state, hidden states and router choices
//! recorded), incremental decoding ([`Session`]: a prompt chunk, then one token at a time, the
//! state carried between) and greedy continuation. A runtime ([`super::deepseek`],
//! [`super::kimi_linear`]) implements [`ChunkedLm`]: what its state is and how one chunk of new
//! positions runs against it.

use crate::checkpoint::{Checkpoint, Config};
use crate::error::{Error, Result};
use crate::ops::{argmax, linear, linear_ref};

/// The config.json a target runtime reads its shapes from: an error naming the weights' folder
/// when the checkpoint has none.
pub(crate) fn target_config(ck: &Checkpoint) -> Result<&Config> {
    ck.config.as_ref().ok_or_else(|| {
        Error::source(&ck.weights.dir, "has no config.json")
            .with_hint("the target runtime needs the model's config.json beside the weights")
    })
}

/// Which implementation of the ops a forward runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpImpl {
    /// Plain serial loops (`ops::linear_ref`): the spec.
    Reference,
    /// `ops::linear` and rayon over heads and experts.
    Fast,
}

impl OpImpl {
    pub(crate) fn linear(self, x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
        match self {
            OpImpl::Reference => linear_ref(x, m, k, w, n),
            OpImpl::Fast => linear(x, m, k, w, n),
        }
    }
}

/// The router's choice at one MoE layer, `[T, top_k]` each.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterOut {
    pub layer: usize,
    pub topk_idx: Vec<u32>,
    pub topk_weight: Vec<f32>,
}

/// Output of a full forward over T tokens.
#[derive(Debug, Clone)]
pub struct Forward {
    /// `[T, vocab]`.
    pub logits: Vec<f32>,
    /// HF `hidden_states`, indices `0..=L`, `[T, H]` each: `hs[i < L]` is the residual-stream
    /// input of block i (`hs[0]` the embeddings), `hs[L]` the output after the final norm.
    pub hidden_states: Vec<Vec<f32>>,
    /// One entry per MoE layer, in layer order.
    pub router: Vec<RouterOut>,
}

/// What one chunk produced: the final-normed rows, and (when asked) the hidden states and the
/// router choices.
pub struct Chunk {
    /// `[n, hidden]`.
    pub normed: Vec<f32>,
    /// HF `hidden_states` of the chunk's rows (empty unless recorded).
    pub hidden_states: Vec<Vec<f32>>,
    /// One entry per MoE layer (empty unless recorded).
    pub router: Vec<RouterOut>,
}

/// A causal LM that runs a chunk of new positions at a time against state it carries.
pub trait ChunkedLm {
    /// What a session carries from one chunk to the next (KV caches, recurrent states).
    type State;

    fn vocab(&self) -> usize;
    fn hidden(&self) -> usize;
    /// `[vocab, hidden]`, f32.
    fn lm_head(&self) -> &[f32];
    /// The state before the first position.
    fn empty_state(&self) -> Self::State;
    /// Run `tokens` (the positions after those `state` has seen) through every layer; `record`
    /// keeps the hidden states and router choices.
    fn chunk(&self, e: OpImpl, tokens: &[u32], state: &mut Self::State, record: bool) -> Chunk;

    /// Every token id inside the vocabulary.
    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.vocab()) {
            Some(t) => Err(Error::Usage(format!(
                "token id {t} is outside the target's vocabulary of {}",
                self.vocab()
            ))),
            None => Ok(()),
        }
    }

    /// The lm_head over `n` final-normed rows, `[n, vocab]`.
    fn logits(&self, e: OpImpl, normed: &[f32], n: usize) -> Vec<f32> {
        e.linear(normed, n, self.hidden(), self.lm_head(), self.vocab())
    }

    /// Causal forward over `tokens` at positions `0..T` (fast path); `hidden_states` in HF's
    /// convention (`hs[L]` after the final norm).
    fn forward(&self, tokens: &[u32]) -> Result<Forward> {
        self.forward_with(OpImpl::Fast, tokens)
    }

    /// [`ChunkedLm::forward`] on the plain reference ops.
    fn forward_ref(&self, tokens: &[u32]) -> Result<Forward> {
        self.forward_with(OpImpl::Reference, tokens)
    }

    /// An incremental-decode session (empty state).
    fn session(&self) -> Session<'_, Self>
    where
        Self: Sized,
    {
        Session::new(self)
    }

    /// Greedy continuation of `prompt` by `n` tokens ([`greedy`]).
    fn greedy(&self, prompt: &[u32], n: usize, stop: &[u32]) -> Result<Vec<u32>>
    where
        Self: Sized,
    {
        greedy(self, prompt, n, stop)
    }

    /// Causal forward over `tokens` at positions `0..T`: one chunk from empty state.
    fn forward_with(&self, e: OpImpl, tokens: &[u32]) -> Result<Forward> {
        self.check_tokens(tokens)?;
        let mut st = self.empty_state();
        let c = self.chunk(e, tokens, &mut st, true);
        Ok(Forward {
            logits: self.logits(e, &c.normed, tokens.len()),
            hidden_states: c.hidden_states,
            router: c.router,
        })
    }
}

/// The embedding rows of `tokens` (checked against the vocabulary by the caller), `[n, h]`.
pub(crate) fn embed_rows(embed: &[f32], h: usize, tokens: &[u32]) -> Vec<f32> {
    let mut x = Vec::with_capacity(tokens.len() * h);
    for &t in tokens {
        x.extend_from_slice(&embed[t as usize * h..(t as usize + 1) * h]);
    }
    x
}

/// Incremental decoding: positions continue from what the session has seen.
pub struct Session<'m, M: ChunkedLm> {
    model: &'m M,
    state: M::State,
    len: usize,
}

impl<'m, M: ChunkedLm> Session<'m, M> {
    /// A session with empty state.
    pub fn new(model: &'m M) -> Self {
        Session {
            model,
            state: model.empty_state(),
            len: 0,
        }
    }

    /// Positions seen so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The state carried so far.
    pub fn state(&self) -> &M::State {
        &self.state
    }

    /// Feed `tokens`; returns the logits `[vocab]` at the last of them.
    pub fn extend(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let m = self.model;
        m.check_tokens(tokens)?;
        if tokens.is_empty() {
            return Err(Error::Usage("cannot decode from an empty prompt".into()));
        }
        let c = m.chunk(OpImpl::Fast, tokens, &mut self.state, false);
        self.len += tokens.len();
        let last = &c.normed[(tokens.len() - 1) * m.hidden()..];
        Ok(m.logits(OpImpl::Fast, last, 1))
    }

    /// Feed one token; returns the logits of the next position.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        self.extend(&[token])
    }
}

/// Greedy continuation of `prompt` by `n` tokens with the carried state (transformers'
/// `generate` at temperature 0, or make_trace.py's `greedy_cached`); stops after a token in
/// `stop` (kept).
pub fn greedy<M: ChunkedLm>(m: &M, prompt: &[u32], n: usize, stop: &[u32]) -> Result<Vec<u32>> {
    let mut s = Session::new(m);
    let mut logits = s.extend(prompt)?;
    // `n` is the caller's bound, not a size to reserve up front.
    let mut out = Vec::with_capacity(n.min(4096));
    while out.len() < n {
        let t = argmax(&logits) as u32;
        out.push(t);
        if stop.contains(&t) || out.len() == n {
            break;
        }
        logits = s.step(t)?;
    }
    Ok(out)
}

/// The checks every target runtime's tests run on its tiny fixture: the fast forward against
/// the reference, incremental decoding against the full forward, a stop token, and a load
/// that must fail on an edited config.
#[cfg(test)]
pub(crate) mod checks {
    use super::ChunkedLm;
    use crate::checkpoint::Checkpoint;
    use crate::ops::argmax;
    use crate::runtime::FAST_REL_TOL;

    /// `n` token ids spread over the vocabulary.
    pub fn tokens(n: usize, vocab: usize) -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i * 37 + 11) % vocab as u32)
            .collect()
    }

    /// max |a − b| / max(1, max |a|).
    pub fn rel(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let scale = a.iter().fold(1f32, |m, v| m.max(v.abs()));
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    }

    /// The fast forward of 12 tokens against the reference: the logits and the `layers + 1`
    /// hidden states within [`FAST_REL_TOL`], `moe` router records (`which` names them) with
    /// the same experts chosen.
    pub fn fast_path_matches_the_reference<M: ChunkedLm>(
        m: &M,
        layers: usize,
        moe: usize,
        which: &str,
    ) {
        let x = tokens(12, m.vocab());
        let (f, r) = (m.forward(&x).unwrap(), m.forward_ref(&x).unwrap());
        let d = rel(&r.logits, &f.logits);
        eprintln!("fast vs reference: logits {d:.2e}");
        assert!(d <= FAST_REL_TOL, "logits {d}");
        assert_eq!(f.hidden_states.len(), layers + 1);
        for (i, (a, b)) in r.hidden_states.iter().zip(&f.hidden_states).enumerate() {
            let d = rel(a, b);
            eprintln!("fast vs reference: hidden_states[{i}] {d:.2e}");
            assert!(d <= FAST_REL_TOL, "hidden_states[{i}] {d}");
        }
        assert_eq!(f.router.len(), moe, "{which}");
        for (a, b) in r.router.iter().zip(&f.router) {
            assert_eq!(a.topk_idx, b.topk_idx);
        }
    }

    /// 8 greedy tokens after a 5-token prompt, decoded one at a time, against the full
    /// forward of the whole within `tol`. Returns the prompt, the continuation and the whole.
    pub fn incremental_decode_matches<M: ChunkedLm>(
        m: &M,
        tol: f32,
    ) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let prompt = tokens(5, m.vocab());
        let gen = m.greedy(&prompt, 8, &[]).unwrap();
        assert_eq!(gen.len(), 8);
        let all: Vec<u32> = prompt.iter().chain(&gen).copied().collect();
        let f = m.forward(&all).unwrap();
        let v = m.vocab();
        let mut s = m.session();
        let mut step = s.extend(&prompt).unwrap();
        let mut worst = 0f32;
        for (i, &t) in gen.iter().enumerate() {
            let row = &f.logits[(prompt.len() - 1 + i) * v..(prompt.len() + i) * v];
            worst = worst.max(rel(row, &step));
            assert!(rel(row, &step) <= tol, "position {i}");
            assert_eq!(argmax(row) as u32, t, "greedy token {i}");
            step = s.step(t).unwrap();
        }
        eprintln!("incremental decode vs full forward: logits {worst:.2e}");
        assert_eq!(s.len(), all.len());
        (prompt, gen, all)
    }

    /// A stop token ends the continuation after it.
    pub fn a_stop_token_ends_greedy<M: ChunkedLm>(m: &M, prompt: &[u32], gen: &[u32]) {
        let first = gen[0];
        assert_eq!(m.greedy(prompt, 8, &[first]).unwrap(), vec![first]);
    }

    /// A copy of the fixture `dir` (under the crate root) whose config.json has `from`
    /// replaced by `to`, opened (the directory lives as long as the first value).
    pub fn edited_fixture(dir: &str, from: &str, to: &str) -> (tempfile::TempDir, Checkpoint) {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let d = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, d.path().join(p.file_name().unwrap())).unwrap();
        }
        let cfg = d.path().join("config.json");
        let text = std::fs::read_to_string(&cfg).unwrap();
        std::fs::write(&cfg, text.replace(from, to)).unwrap();
        let ck = Checkpoint::open(d.path().to_str().unwrap()).unwrap();
        (d, ck)
    }
}
