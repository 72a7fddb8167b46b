//! One memory-mapped safetensors file: validated header plus zero-copy borrowed tensor views.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions};

use super::dtype::{self, Dtype};
use super::header::{self, Header, TensorInfo};
use super::interrupt;
use crate::error::{Error, HeaderError, Result};

/// A mapped, validated safetensors file.
pub struct Shard {
    path: PathBuf,
    file: File,
    map: Mmap,
    /// The map's range, for the SIGBUS message (`io::interrupt`).
    _registration: interrupt::MapRegistration,
    header: Header,
    by_name: HashMap<String, usize>,
}

/// A borrowed tensor: metadata plus the raw little-endian bytes (any alignment).
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl TensorView<'_> {
    pub fn name(&self) -> &str {
        &self.info.name
    }
    pub fn dtype(&self) -> Dtype {
        self.info.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.info.shape
    }
    /// Convert every element to f32 (exact for all float types ≤ 32 bits).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = Vec::new();
        dtype::to_f32(self.info.dtype, self.data, &mut out);
        out
    }

    /// [`to_f32`](Self::to_f32) split over threads; identical output.
    pub fn to_f32_par(&self) -> Vec<f32> {
        let mut out = Vec::new();
        self.to_f32_par_into(&mut out);
        out
    }

    /// [`to_f32_par`](Self::to_f32_par) into `out` (replacing its contents), so that a caller
    /// converting tensor after tensor reuses one buffer instead of faulting in fresh pages for
    /// each.
    pub fn to_f32_par_into(&self, out: &mut Vec<f32>) {
        dtype::to_f32_par_into(self.info.dtype, self.data, out);
    }
}

impl Shard {
    /// Map and validate `path`. Only the header pages are touched.
    ///
    /// # Safety
    /// The file must not be modified or truncated while the `Shard` lives (the usual memmap
    /// contract). kquant never writes to its inputs and writes outputs to new files only.
    pub unsafe fn open(path: &Path) -> Result<Shard> {
        super::reads::note(path);
        let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
        let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
        if !meta.is_file() {
            return Err(Error::Source {
                path: path.into(),
                msg: "is not a regular file".into(),
                hint: None,
            });
        }
        let len = meta.len();
        let herr = |kind| Error::Header {
            path: path.into(),
            kind,
        };
        if len < 8 {
            return Err(herr(HeaderError::TooSmall(len)));
        }
        // SAFETY: forwarded to the caller (see the function's safety section).
        let map =
            unsafe { MmapOptions::new().map(&file) }.map_err(|e| Error::io("map", path, e))?;
        let header = header::parse(&map).map_err(herr)?;
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let _registration = interrupt::register_map(map.as_ptr(), map.len(), path);
        Ok(Shard {
            path: path.into(),
            file,
            map,
            _registration,
            header,
            by_name,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The open file (for reads that bypass the map, e.g. [`Writer::copy_part`]).
    ///
    /// [`Writer::copy_part`]: super::writer::Writer::copy_part
    pub fn file(&self) -> &File {
        &self.file
    }
    /// Byte offset of a tensor's first byte in the file.
    pub fn file_offset(&self, info: &TensorInfo) -> u64 {
        self.header.data_offset() + info.start
    }
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }
    /// Tensors in header order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }
    /// Position of `name` in header order.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.header.tensors[i])
    }
    /// A zero-copy view of a tensor's bytes.
    pub fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        let base = self.header.data_offset();
        let data = &self.map[(base + info.start) as usize..(base + info.end) as usize];
        TensorView { info, data }
    }
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.info(name).map(|i| self.view(i))
    }
    /// Hint the kernel that the data will be read front to back.
    pub fn advise_sequential(&self) {
        let _ = self.map.advise(memmap2::Advice::Sequential);
    }
    /// Drop the pages of a tensor already consumed, so that peak RSS stays low on big files.
    pub fn release(&self, info: &TensorInfo) {
        self.release_range(info, 0, info.nbytes());
    }

    /// Drop the pages of bytes `from..to` of a tensor (relative to its first byte).
    pub fn release_range(&self, info: &TensorInfo, from: u64, to: u64) {
        let base = self.header.data_offset() + info.start;
        let page = 4096u64;
        let start = (base + from).div_ceil(page) * page;
        let end = ((base + to.min(info.nbytes())) / page) * page;
        if end > start {
            // SAFETY: the map is a read-only shared file mapping; dropping its pages only makes
            // later reads fault them back in from the file, so no data can be lost.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start as usize,
                    (end - start) as usize,
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_conversion_equals_reference() {
        let dir = tempfile::tempdir().unwrap();
        let n = (1 << 16) * 3 + 5;
        let data: Vec<u8> = (0..n * 2).map(|i| (i * 7 + i / 3) as u8).collect();
        let json = format!(
            r#"{{"w":{{"dtype":"BF16","shape":[{n}],"data_offsets":[0,{}]}}}}"#,
            n * 2
        );
        let mut f = (json.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(json.as_bytes());
        f.extend_from_slice(&data);
        let p = dir.path().join("w.safetensors");
        std::fs::write(&p, f).unwrap();
        // SAFETY: the temp file is not modified while mapped.
        let s = unsafe { Shard::open(&p).unwrap() };
        let v = s.tensor("w").unwrap();
        let (a, b) = (v.to_f32(), v.to_f32_par());
        assert_eq!(a.len(), n);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
