//! Device-resident tensors and the step kernels over them (`kernels/ops.cu`): what lets a draft's
//! whole step stay on a device (`runtime::eagle3::device`), with only token ids going up and the
//! proposals' indices coming back. A [`DevTensor`] is a typed device buffer ([`tensor`]); each
//! step kernel is one type — its checks, its launch and its CPU replay side by side, one file per
//! small family: [`gather`] (embedding rows, rows by index, blocks of columns), [`norm`]
//! (RMSNorm), [`rope`], [`attend`], [`elementwise`] (SwiGLU, the residual add, the rounding to a
//! linear's input). [`DeviceOp::check`] states every size and bound a kernel relies on, so that
//! [`crate::gpu::Tensors::op`] is safe: the kernels themselves check nothing. An [`Op`] is any
//! one of them, what a backend queues. The linears and the row argmax run on tensors through the
//! same regimes as the host-slice calls ([`crate::gpu::Tensors`]).
//!
//! Written once for every driver (the launch geometry and the
//! [`Kernel`](crate::gpu::source::Kernel) each op becomes); the CPU emulation replays each
//! kernel with the `replay` beside its op ([`crate::gpu::emu`]). Adding one: docs/guides.md,
//! "Adding a device op".

pub mod attend;
pub mod elementwise;
pub mod gather;
pub mod norm;
pub mod rope;
pub mod step;
pub mod tensor;

pub use attend::{Attend, AttendDims};
pub use elementwise::{Add, SiluMul, ToAct};
pub use gather::{CopyCols, Embed, Gather};
pub use norm::RmsNorm;
pub use rope::Rope;
pub use step::{Bufs, DeviceOp, Launch};
pub use tensor::{DevTensor, Host, Strided};

use crate::gpu::Result;

/// Declares [`Op`], one variant per op type (named as it), and its dispatch: one line per op.
macro_rules! ops {
    ($($(#[doc = $doc:literal])* $v:ident,)*) => {
        /// One launch of a step kernel (`kernels/ops.cu`) over device tensors.
        pub enum Op<'a> {
            $($(#[doc = $doc])* $v($v<'a>),)*
        }

        $(impl<'a> From<$v<'a>> for Op<'a> {
            fn from(op: $v<'a>) -> Op<'a> {
                Op::$v(op)
            }
        })*

        impl<'a> Op<'a> {
            /// Every size, element type and index bound the kernel relies on
            /// ([`DeviceOp::check`] of the op).
            pub fn check(&self) -> Result<()> {
                match self {
                    $(Op::$v(op) => op.check(),)*
                }
            }

            /// The launch the op becomes (checked first): its kernel over the buffers `buf`
            /// maps each tensor to, its grid and block for a `warp`-lane device.
            pub fn launch<B: 'a>(&self, buf: &Bufs<'a, '_, B>, warp: u32) -> Result<Launch<'a, B>> {
                self.check()?;
                match self {
                    $(Op::$v(op) => op.launch(buf, warp),)*
                }
            }
        }
    };
}

ops! {
    /// `kq_embed_rows_*`.
    Embed,
    /// `kq_rms_norm`.
    RmsNorm,
    /// `kq_rope`.
    Rope,
    /// `kq_copy_cols`.
    CopyCols,
    /// `kq_attend`.
    Attend,
    /// `kq_silu_mul`.
    SiluMul,
    /// `kq_add`.
    Add,
    /// `kq_to_act_*`.
    ToAct,
    /// `kq_gather_rows`.
    Gather,
}
