//! Loading a draft for the replay with the runtime of its detected family (EAGLE-3 Llama or MLA,
//! DFlash), with what it needs from the target checkpoint and its quantized linears placed on
//! the `--device` ([`Exec`]).

use crate::checkpoint::{Checkpoint, Family};
use crate::error::{Error, Result};
use crate::runtime::dflash::{DFlash, TargetHead};
use crate::runtime::eagle3::Eagle3;
use crate::runtime::linears::{Exec, LinearSet};
use crate::runtime::Drafter;

/// The block drafter family in words.
fn block_name(f: &Family) -> &'static str {
    match f {
        Family::Dspark => "DSpark",
        Family::Dflash2 => "DFlash2",
        _ => "DFlash",
    }
}

fn target_embed(ck: &Checkpoint) -> Result<Vec<f32>> {
    for n in [
        "model.embed_tokens.weight",
        "language_model.model.embed_tokens.weight",
        "embed_tokens.weight",
    ] {
        if let Some(v) = ck.weights.tensor(n) {
            return Ok(v.to_f32());
        }
    }
    Err(Error::Source {
        path: ck.weights.dir.clone(),
        msg: "has no embed_tokens".into(),
        hint: None,
    })
}

/// Load the draft at `spec` with the runtime of its detected family, taking from the target
/// checkpoint what that family needs (EAGLE-3: the embedding when the draft has none; DFlash:
/// the embedding and lm_head). `exec` places the linears ([`Exec::F32`]: the f32 runtime); with
/// a device, a line on stderr ([`placement_line`]) says which went there — quantized and
/// unquantized — and which stayed on the CPU.
pub fn load_drafter(
    spec: &str,
    target: Option<&Checkpoint>,
    exec: &Exec,
) -> Result<Box<dyn Drafter>> {
    let ck = Checkpoint::open(spec)?;
    let det = ck.detect()?;
    let d: Box<dyn Drafter> = match det.family {
        Family::Eagle3 | Family::Eagle3Mla => {
            let embed = target.map(target_embed).transpose()?;
            let d = Eagle3::load_on(&ck, &det, embed, exec.clone())?;
            if d.taps.len() != 3 {
                return Err(Error::Source {
                    path: ck.weights.dir.clone(),
                    msg: format!("needs three aux-layer taps with a known convention, found {:?}", det.aux_layers),
                    hint: Some("`kquant inspect` shows the draft's aux layers; `kquant convert --aux-convention` can record them".into()),
                });
            }
            Box::new(d)
        }
        Family::Dflash | Family::Dspark | Family::Dflash2 => {
            let t = target.ok_or_else(|| Error::Source {
                path: ck.weights.dir.clone(),
                msg: format!("is a {} drafter, which runs with the target's embedding and lm_head (it has neither)", block_name(&det.family)),
                hint: Some("pass --target-checkpoint DIR (the target model the draft was trained for)".into()),
            })?;
            Box::new(DFlash::load_on(
                &ck,
                &det,
                TargetHead::read(t)?,
                exec.clone(),
            )?)
        }
        other => {
            return Err(Error::Source {
                path: ck.weights.dir.clone(),
                msg: format!(
                    "is `{}`; verify runs EAGLE-3, DFlash, DSpark and DFlash2 drafts",
                    other.id()
                ),
                hint: Some("`kquant inspect` shows what the checkpoint was detected as".into()),
            })
        }
    };
    if let Some(dev) = exec.name() {
        let mut line = placement_line(spec, &dev, d.linears());
        line += &match d.device_step() {
            Some(Ok(())) => {
                "; the whole step on the device (taps up once a sample, token ids back)".to_string()
            }
            Some(Err(why)) => format!(
                "; the rest of the step on the CPU ({})",
                crate::escape::printable(&why)
            ),
            None => String::new(),
        };
        if let Some(o) = exec.module_origin() {
            line += &format!("; {}", crate::escape::printable(&o));
        }
        eprintln!("{line}");
    }
    Ok(d)
}

/// What went where on a device, for stderr: the quantized linears on the INT4 kernels (and those
/// left on the CPU), the unquantized ones through the vendor BLAS (and F32 ones left on the CPU).
pub fn placement_line(spec: &str, dev: &str, set: &LinearSet) -> String {
    let list = |v: &[String]| crate::escape::printable(&v.join(", ")).into_owned();
    let (on, off) = set.placement();
    let (don, doff) = set.dense_placement();
    let mut line = format!(
        "device: `{}`: {} quantized linear(s) on {dev} (INT4 kernels)",
        crate::escape::printable(spec),
        on.len()
    );
    if !off.is_empty() {
        line += &format!(
            ", {} on the CPU (a layout the INT4 kernels do not take): {}",
            off.len(),
            list(&off)
        );
    }
    line += &format!(
        "; {} unquantized linear(s) on {dev} (vendor BLAS in the stored bf16/f16)",
        don.len()
    );
    if !don.is_empty() {
        line += &format!(": {}", list(&don));
    }
    if !doff.is_empty() {
        line += &format!(
            ", {} on the CPU in f32 (F32 weights that bf16 would round): {}",
            doff.len(),
            list(&doff)
        );
    }
    line
}
