//! The target models kquant runs on CPU, as one type: [`Target::load`] reads config.json and
//! picks the runtime (`KimiK3ForConditionalGeneration` → [`KimiK3`], `KimiLinearForCausalLM` →
//! [`KimiLinear`], else the DeepSeek-V3 / Kimi-K2 one, which names what it cannot run). Trace capture, the live profiles' offline verify and the
//! engine-loop simulation run either through it.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::runtime::deepseek::{self, DeepseekV3, Forward, OpImpl};
use crate::runtime::kimi_k3::{self, KimiK3};
use crate::runtime::kimi_linear::{self, KimiLinear};
use crate::runtime::lm::ChunkedLm;
use crate::target::stream::TapStream;

/// A loaded target.
pub enum Target {
    DeepseekV3(DeepseekV3),
    KimiLinear(KimiLinear),
    KimiK3(KimiK3),
}

/// An incremental-decode session of any target.
pub enum Session<'m> {
    DeepseekV3(deepseek::Session<'m>),
    KimiLinear(kimi_linear::Session<'m>),
    KimiK3(kimi_k3::Session<'m>),
}

impl Target {
    /// Load the checkpoint with the runtime its config.json names.
    pub fn load(ck: &Checkpoint) -> Result<Target> {
        match &ck.config {
            // Before Kimi-Linear: K3's text_config says `model_type: kimi_linear` too.
            Some(c) if kimi_k3::is_kimi_k3(c) => Ok(Target::KimiK3(KimiK3::load(ck)?)),
            Some(c) if kimi_linear::is_kimi_linear(c) => {
                Ok(Target::KimiLinear(KimiLinear::load(ck)?))
            }
            _ => Ok(Target::DeepseekV3(DeepseekV3::load(ck)?)),
        }
    }

    /// The architecture, as config.json's `architectures` names it.
    pub fn architecture(&self) -> &'static str {
        match self {
            Target::DeepseekV3(_) => "DeepseekV3ForCausalLM",
            Target::KimiLinear(_) => "KimiLinearForCausalLM",
            Target::KimiK3(_) => "KimiK3ForConditionalGeneration",
        }
    }

    pub fn hidden(&self) -> usize {
        match self {
            Target::DeepseekV3(m) => m.hidden,
            Target::KimiLinear(m) => m.hidden,
            Target::KimiK3(m) => m.hidden,
        }
    }

    pub fn vocab(&self) -> usize {
        match self {
            Target::DeepseekV3(m) => m.vocab,
            Target::KimiLinear(m) => m.vocab,
            Target::KimiK3(m) => m.vocab,
        }
    }

    pub fn num_layers(&self) -> usize {
        match self {
            Target::DeepseekV3(m) => m.num_layers,
            Target::KimiLinear(m) => m.num_layers,
            Target::KimiK3(m) => m.num_layers,
        }
    }

    /// `eos_token_id` (one or several).
    pub fn eos(&self) -> &[u32] {
        match self {
            Target::DeepseekV3(m) => &m.cfg.eos,
            Target::KimiLinear(m) => &m.cfg.ds.eos,
            Target::KimiK3(m) => &m.cfg.ds().eos,
        }
    }

    /// The longest sequence the target is run on.
    pub fn max_pos(&self) -> usize {
        match self {
            Target::DeepseekV3(m) => m.cfg.max_pos,
            Target::KimiLinear(m) => m.cfg.ds.max_pos,
            Target::KimiK3(m) => m.cfg.ds().max_pos,
        }
    }

    /// Causal forward over `tokens` (fast path): logits, HF hidden states, router choices.
    pub fn forward(&self, tokens: &[u32]) -> Result<Forward> {
        match self {
            Target::DeepseekV3(m) => m.forward(tokens),
            Target::KimiLinear(m) => m.forward(tokens),
            Target::KimiK3(m) => m.forward(tokens),
        }
    }

    /// Whether the target has Block Attention Residuals (two tap streams, `partial` and
    /// `mixture`; `target::stream`).
    pub fn attention_residuals(&self) -> bool {
        matches!(self, Target::KimiK3(_))
    }

    /// [`Target::forward`] with the taps of `stream` in `hidden_states[1..L]` (`hs[0]`, the
    /// embedding, and `hs[L]`, after the final norm, as there): on an attention-residual
    /// target the stream [`KimiK3::forward_taps`] gives, else the one residual stream. A
    /// stream the target does not have is an error (`trace::stream::for_target` refuses it
    /// before any work).
    pub fn forward_stream(&self, tokens: &[u32], stream: TapStream) -> Result<Forward> {
        match (self, stream) {
            (Target::KimiK3(m), TapStream::Partial | TapStream::Mixture) => {
                let f = m.forward_taps(OpImpl::Fast, tokens)?;
                let mut out = f.forward;
                let rows = f.taps.stream(stream).expect("partial or mixture");
                // rows[l] is after layer l, HF's hs[l + 1]; the last layer's is hs[L]'s
                // pre-norm form, which a trace never stores.
                let last = out.hidden_states.len() - 1;
                for (hs, row) in out.hidden_states[1..last].iter_mut().zip(rows) {
                    hs.clone_from(row);
                }
                Ok(out)
            }
            (Target::KimiK3(_), TapStream::Residual) | (_, TapStream::Partial | TapStream::Mixture) => {
                Err(crate::error::Error::Flags {
                    msg: format!(
                        "the {} target has no `{}` stream",
                        self.architecture(),
                        stream.id()
                    ),
                    hint: "an attention-residual target (Kimi-K3) taps `partial` or `mixture`; every other target the one `residual` stream".into(),
                })
            }
            (_, TapStream::Residual) => self.forward(tokens),
        }
    }

    /// Greedy continuation with the cache / carried state.
    pub fn greedy(&self, prompt: &[u32], n: usize, stop: &[u32]) -> Result<Vec<u32>> {
        match self {
            Target::DeepseekV3(m) => m.greedy(prompt, n, stop),
            Target::KimiLinear(m) => m.greedy(prompt, n, stop),
            Target::KimiK3(m) => m.greedy(prompt, n, stop),
        }
    }

    /// An incremental-decode session from empty state.
    pub fn session(&self) -> Session<'_> {
        match self {
            Target::DeepseekV3(m) => Session::DeepseekV3(m.session()),
            Target::KimiLinear(m) => Session::KimiLinear(m.session()),
            Target::KimiK3(m) => Session::KimiK3(m.session()),
        }
    }
}

impl Session<'_> {
    /// Feed `tokens`; the logits at the last of them.
    pub fn extend(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        match self {
            Session::DeepseekV3(s) => s.extend(tokens),
            Session::KimiLinear(s) => s.extend(tokens),
            Session::KimiK3(s) => s.extend(tokens),
        }
    }

    /// Positions seen so far.
    pub fn len(&self) -> usize {
        match self {
            Session::DeepseekV3(s) => s.len(),
            Session::KimiLinear(s) => s.len(),
            Session::KimiK3(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_runtime_from_config_json() {
        let root = env!("CARGO_MANIFEST_DIR");
        let open = |d: &str| Checkpoint::open(&format!("{root}/{d}")).unwrap();
        let k2 = Target::load(&open("fixtures/tiny/target-kimi-k2")).unwrap();
        assert_eq!(k2.architecture(), "DeepseekV3ForCausalLM");
        let kl = Target::load(&open("fixtures/kimi-linear-tiny/target")).unwrap();
        assert_eq!(kl.architecture(), "KimiLinearForCausalLM");
        assert_eq!((kl.num_layers(), kl.hidden(), kl.vocab()), (4, 256, 2048));
        let p = [5u32, 9, 300, 41];
        let mut s = kl.session();
        let last = s.extend(&p).unwrap();
        assert_eq!(s.len(), 4);
        let f = kl.forward(&p).unwrap();
        assert_eq!(&f.logits[3 * 2048..], &last[..]);
        let k3 = Target::load(&open("fixtures/kimi-k3-tiny/target-random")).unwrap();
        assert_eq!(k3.architecture(), "KimiK3ForConditionalGeneration");
        assert_eq!((k3.num_layers(), k3.hidden(), k3.vocab()), (6, 64, 2048));
        let mut s = k3.session();
        let last = s.extend(&p).unwrap();
        assert_eq!(&k3.forward(&p).unwrap().logits[3 * 2048..], &last[..]);
        // Not a causal LM any runtime knows: the DeepSeek-V3 runtime's refusal.
        let e = Target::load(&open("fixtures/tiny/eagle3-specforge"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("DeepseekV3ForCausalLM"), "{e}");
    }
}
