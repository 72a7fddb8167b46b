//! The element types a device holds: activations ([`Act`], 16-bit bit patterns) and the
//! elements of a device tensor or an embedding table ([`Elem`]).

/// Activation dtype (bit patterns passed as `u16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Bf16,
    F16,
}

impl Act {
    pub fn name(self) -> &'static str {
        match self {
            Act::Bf16 => "bf16",
            Act::F16 => "f16",
        }
    }
    pub fn to_f32(self, h: u16) -> f32 {
        match self {
            Act::Bf16 => half::bf16::from_bits(h).to_f32(),
            Act::F16 => half::f16::from_bits(h).to_f32(),
        }
    }
    pub fn from_f32(self, v: f32) -> u16 {
        match self {
            Act::Bf16 => half::bf16::from_f32(v).to_bits(),
            Act::F16 => half::f16::from_f32(v).to_bits(),
        }
    }
}

/// Element type of a device tensor ([`DevTensor`](super::ops::DevTensor)) or of an embedding table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    I32,
    /// 16-bit floats (bit patterns as `u16`).
    Half(Act),
}

impl Elem {
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::I32 => "i32",
            Elem::Half(a) => a.name(),
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::Half(_) => 2,
        }
    }
}
