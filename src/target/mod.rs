//! What kquant knows about target models, low in the house so that every module that checks a
//! draft or a trace against a target reads the same facts: the profiles
//! (`quant-configs/targets/`, built in; [`profile`]), the default taps of each draft family
//! ([`taps`], keyed by `checkpoint::Family`), which hidden-state stream a tap holds on a
//! target with attention residuals ([`stream`]), facts that may be unknown ([`fact`]), and a
//! draft matched to its target by shape ([`shape`]). It reads checkpoints and files; which
//! engines serve a draft beside a target is `crate::engines::target`.

pub mod fact;
pub mod profile;
pub mod shape;
pub mod stream;
pub mod taps;

pub use profile::Profile;
