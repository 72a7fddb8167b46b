//! The GPU path's errors ([`GpuError`]: layout checks, missing runtime, driver and compiler
//! failures), each with its `hint:`, and their conversion into the CLI's `Error`.

/// Errors of the GPU path (layout checks, missing runtime, driver/compiler failures).
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("kernel layout: {0}")]
    Layout(String),
    #[error("{0} is not supported by this kernel: {1}")]
    Unsupported(&'static str, String),
    #[error("{backend}: {msg}")]
    Backend { backend: &'static str, msg: String },
    #[error("device `{0}`: this kquant was built without the `{1}` feature")]
    NotBuilt(String, &'static str),
    #[error("unknown device `{0}` (cpu, cuda[:N], hip[:N])")]
    UnknownDevice(String),
}

impl GpuError {
    /// A `hint:` line for the user.
    pub fn hint(&self) -> Option<String> {
        match self {
            GpuError::NotBuilt(_, feature) => Some(format!("rebuild with --features {feature}")),
            GpuError::UnknownDevice(_) => Some("use --device cpu, cuda, cuda:1, hip, …".into()),
            GpuError::Backend { backend, .. } => Some(format!(
                "check that the {backend} driver and runtime libraries are installed and visible \
                 (LD_LIBRARY_PATH), or use --device cpu"
            )),
            _ => None,
        }
    }
}

/// A GPU error as the CLI reports it (`error:` and its `hint:`). Here, not in `crate::error`, so
/// that the error module depends on nothing above it.
impl From<GpuError> for crate::error::Error {
    fn from(e: GpuError) -> Self {
        crate::error::Error::Device {
            hint: e.hint(),
            msg: e.to_string(),
        }
    }
}

pub type Result<T> = std::result::Result<T, GpuError>;
