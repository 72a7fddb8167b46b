//! The streaming checkpoint writer every command uses.
//!
//! The caller declares every output tensor (name, dtype, shape) up front; the writer lays them
//! out in the `safetensors` library's order (dtype alignment descending, then name), splits them
//! into shards of at most `max_shard_size` bytes, and then takes the bytes tensor by tensor (or
//! in parts) in that order, hashing as it writes. Nothing is held in memory beyond a write
//! buffer. Output is built in a temporary sibling directory, fsynced, and renamed into place
//! only by [`Writer::finish`] (through its [`Claim`]); dropping an unfinished writer removes the
//! staging directory.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::dtype::Dtype;
use super::hash::hex;
use super::header::{self, TensorInfo};
use super::index::INDEX_FILE;
use super::manifest::{
    hash_file, FileEntry, InputEntry, Manifest, HASH_INPUTS_UP_TO, MANIFEST_FILE,
};
use super::output::{Claim, Kind};
use super::shard::Shard;
use super::sink::Sink;
use super::source::SINGLE_FILE;
use crate::error::{Error, Result};

/// One tensor the caller will write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: Vec<usize>) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            shape,
        }
    }
    pub fn nbytes(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product::<u64>() * self.dtype.size() as u64
    }
}

/// Writer settings.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// Largest shard (tensor bytes); `None` writes a single `model.safetensors`.
    pub max_shard_size: Option<u64>,
    /// Replace an existing output.
    pub force: bool,
    /// `__metadata__` of every shard.
    pub metadata: Option<BTreeMap<String, String>>,
    /// The command line recorded in the manifest.
    pub command: Vec<String>,
    /// Input files recorded in the manifest.
    pub inputs: Vec<PathBuf>,
    /// Hash every input, however large (otherwise only those up to
    /// [`HASH_INPUTS_UP_TO`](super::manifest::HASH_INPUTS_UP_TO)).
    pub hash_inputs: bool,
}

struct ShardPlan {
    file: String,
    tensors: Vec<TensorInfo>,
}

/// What [`Writer::finish`] produced.
#[derive(Debug, Clone)]
pub struct WriteSummary {
    pub dir: PathBuf,
    pub files: Vec<FileEntry>,
    pub tensor_bytes: u64,
}

/// A checkpoint being written. See the module docs.
pub struct Writer {
    out: PathBuf,
    tmp: PathBuf,
    opts: WriteOptions,
    shards: Vec<ShardPlan>,
    /// Position of the next tensor: (shard, index in shard).
    next: (usize, usize),
    /// Bytes of the current tensor written so far.
    part: u64,
    open: Option<Sink>,
    done: Vec<FileEntry>,
    inputs: Option<std::thread::JoinHandle<Result<Vec<InputEntry>>>>,
    /// The output's claim (none for [`Writer::in_dir`]); dropping it unfinished removes the
    /// staging directory.
    claim: Option<Claim>,
}

/// The safetensors-library order: dtype alignment descending, then name.
pub fn canonical_order(specs: &mut [TensorSpec]) {
    specs.sort_by(|a, b| b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name)));
}

impl Writer {
    /// Claim `out` (see [`Claim`]: exclusive, never over a source, `--force` only over what
    /// kquant wrote) and plan the output in its staging directory.
    pub fn create(out: &Path, specs: Vec<TensorSpec>, opts: WriteOptions) -> Result<Writer> {
        Self::check_specs(out, &specs)?;
        let claim = Claim::new(out, Kind::Checkpoint, opts.force, &opts.inputs)?;
        let dir = claim.staging().to_path_buf();
        Self::start(out, dir, Some(claim), specs, opts)
    }

    /// Plan the output into `dir`, an empty directory the caller made (the staging directory
    /// of its own [`Claim`]); [`finish`](Self::finish) leaves it there.
    pub fn in_dir(dir: &Path, specs: Vec<TensorSpec>, opts: WriteOptions) -> Result<Writer> {
        Self::check_specs(dir, &specs)?;
        Self::start(dir, dir.to_path_buf(), None, specs, opts)
    }

    fn check_specs(out: &Path, specs: &[TensorSpec]) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for s in specs {
            if !seen.insert(s.name.as_str()) {
                return Err(Error::Output {
                    path: out.into(),
                    msg: format!("tensor `{}` would be written twice", s.name),
                    hint: None,
                });
            }
        }
        Ok(())
    }

    fn start(
        out: &Path,
        tmp: PathBuf,
        claim: Option<Claim>,
        mut specs: Vec<TensorSpec>,
        opts: WriteOptions,
    ) -> Result<Writer> {
        canonical_order(&mut specs);
        let shards = plan_shards(&specs, opts.max_shard_size);
        let inputs = opts.inputs.clone();
        let all = opts.hash_inputs;
        let hasher =
            std::thread::spawn(move || inputs.iter().map(|p| input_entry(p, all)).collect());
        let mut w = Writer {
            out: out.into(),
            tmp,
            claim,
            opts,
            shards,
            next: (0, 0),
            part: 0,
            open: None,
            done: Vec::new(),
            inputs: Some(hasher),
        };
        w.skip_empty_shards()?;
        Ok(w)
    }

    /// Tensor names in the order they must be written.
    pub fn order(&self) -> Vec<&str> {
        self.shards
            .iter()
            .flat_map(|s| s.tensors.iter().map(|t| t.name.as_str()))
            .collect()
    }

    /// Number of shard files the output will have.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Name of the tensor expected next, if any.
    pub fn expected(&self) -> Option<&TensorInfo> {
        self.shards
            .get(self.next.0)
            .and_then(|s| s.tensors.get(self.next.1))
    }

    /// Write the whole of tensor `name`.
    pub fn write(&mut self, name: &str, data: &[u8]) -> Result<()> {
        self.write_part(name, data)?;
        self.end_tensor(name)
    }

    /// Write the next bytes of tensor `name` (which must be the expected tensor).
    pub fn write_part(&mut self, name: &str, data: &[u8]) -> Result<()> {
        self.check_part(name, data.len() as u64)?;
        let o = self.open.as_mut().expect("shard open");
        o.write(data)?;
        self.part += data.len() as u64;
        Ok(())
    }

    /// Write the next `len` bytes of tensor `name` straight from `src` at byte `offset` (a
    /// tensor copied unchanged: read into the output's staging blocks, never mapped).
    pub fn copy_part(
        &mut self,
        name: &str,
        src: &File,
        src_path: &Path,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        self.check_part(name, len)?;
        let o = self.open.as_mut().expect("shard open");
        o.copy_from(src, src_path, offset, len)?;
        self.part += len;
        Ok(())
    }

    /// Write the whole of tensor `name` as the bytes of `info` in `shard`, unchanged, calling
    /// `progress` with each 64 MiB piece's length (for progress bars).
    pub fn copy_tensor(
        &mut self,
        name: &str,
        shard: &Shard,
        info: &TensorInfo,
        mut progress: impl FnMut(u64),
    ) -> Result<()> {
        const PIECE: u64 = 64 << 20;
        let start = shard.file_offset(info);
        let mut done = 0;
        while done < info.nbytes() {
            let n = PIECE.min(info.nbytes() - done);
            self.copy_part(name, shard.file(), shard.path(), start + done, n)?;
            progress(n);
            done += n;
        }
        self.end_tensor(name)
    }

    /// `name` is the tensor expected next and `len` more bytes fit in it.
    fn check_part(&self, name: &str, len: u64) -> Result<()> {
        let Some(t) = self.expected() else {
            return Err(self.err(format!(
                "tensor `{name}` was not declared (all declared tensors are written)"
            )));
        };
        if t.name != name {
            return Err(self.err(format!(
                "tensor `{name}` written out of order: `{}` is next",
                t.name
            )));
        }
        if self.part + len > t.nbytes() {
            return Err(self.err(format!(
                "tensor `{name}`: more than the declared {} bytes",
                t.nbytes()
            )));
        }
        Ok(())
    }

    /// Close tensor `name`; its byte count must match its declared dtype × shape.
    pub fn end_tensor(&mut self, name: &str) -> Result<()> {
        let t = self.expected().expect("checked by write_part");
        if t.nbytes() != self.part {
            return Err(self.err(format!(
                "tensor `{name}`: wrote {} bytes, declared {}",
                self.part,
                t.nbytes()
            )));
        }
        self.part = 0;
        self.next.1 += 1;
        if self.next.1 == self.shards[self.next.0].tensors.len() {
            self.close_shard()?;
            self.next = (self.next.0 + 1, 0);
            self.skip_empty_shards()?;
        }
        Ok(())
    }

    /// Add a small side file (config.json, …) to the output.
    pub fn add_file(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        if !super::index::is_plain_file_name(name) || name == MANIFEST_FILE {
            return Err(self.err(format!("`{name}` is not a valid side-file name")));
        }
        let path = self.tmp.join(name);
        let mut f = File::create(&path).map_err(|e| Error::io("create", &path, e))?;
        f.write_all(bytes)
            .map_err(|e| Error::io("write", &path, e))?;
        f.sync_all().map_err(|e| Error::io("fsync", &path, e))?;
        self.done.push(FileEntry {
            file: name.into(),
            bytes: bytes.len() as u64,
            sha256: hex(&Sha256::digest(bytes)),
        });
        Ok(())
    }

    /// Check that everything was written, write the index and manifest, fsync, and rename the
    /// output into place.
    pub fn finish(mut self) -> Result<WriteSummary> {
        if let Some(t) = self.expected() {
            return Err(self.err(format!(
                "tensor `{}` was declared but never written",
                t.name
            )));
        }
        let tensor_bytes: u64 = self
            .shards
            .iter()
            .flat_map(|s| &s.tensors)
            .map(TensorInfo::nbytes)
            .sum();
        if self.shards.len() > 1 {
            let mut wm: Vec<(&str, &str)> = self
                .shards
                .iter()
                .flat_map(|s| {
                    s.tensors
                        .iter()
                        .map(move |t| (t.name.as_str(), s.file.as_str()))
                })
                .collect();
            wm.sort();
            let index = serde_json::json!({
                "metadata": {"total_size": tensor_bytes},
                "weight_map": wm.into_iter().map(|(a, b)| (a.to_string(), serde_json::Value::String(b.into()))).collect::<serde_json::Map<_, _>>(),
            });
            let bytes = serde_json::to_vec_pretty(&index).expect("index JSON");
            self.add_file(INDEX_FILE, &bytes)?;
        }
        let inputs = self
            .inputs
            .take()
            .expect("input hasher")
            .join()
            .expect("input hasher thread")?;
        let mut outputs = self.done.clone();
        outputs.sort_by(|a, b| a.file.cmp(&b.file));
        let manifest = Manifest::new(self.opts.command.clone(), inputs, outputs.clone());
        let mpath = self.tmp.join(MANIFEST_FILE);
        let mut f = File::create(&mpath).map_err(|e| Error::io("create", &mpath, e))?;
        f.write_all(&manifest.to_json())
            .map_err(|e| Error::io("write", &mpath, e))?;
        f.sync_all().map_err(|e| Error::io("fsync", &mpath, e))?;
        sync_dir(&self.tmp)?;
        if let Some(claim) = self.claim.take() {
            claim.commit()?;
        }
        Ok(WriteSummary {
            dir: self.out.clone(),
            files: outputs,
            tensor_bytes,
        })
    }

    fn err(&self, msg: String) -> Error {
        Error::Output {
            path: self.out.clone(),
            msg,
            hint: None,
        }
    }

    fn skip_empty_shards(&mut self) -> Result<()> {
        if self.next.0 < self.shards.len() {
            self.open_shard()?;
            if self.shards[self.next.0].tensors.is_empty() {
                self.close_shard()?;
                self.next = (self.next.0 + 1, 0);
            }
        }
        Ok(())
    }

    fn open_shard(&mut self) -> Result<()> {
        let plan = &self.shards[self.next.0];
        let path = self.tmp.join(&plan.file);
        let mut sink = Sink::create(&path)?;
        sink.write(&header::serialize(
            &plan.tensors,
            self.opts.metadata.as_ref(),
        ))?;
        self.open = Some(sink);
        Ok(())
    }

    fn close_shard(&mut self) -> Result<()> {
        let sink = self.open.take().expect("shard open");
        let (bytes, sha256) = sink.finish()?;
        self.done.push(FileEntry {
            file: self.shards[self.next.0].file.clone(),
            bytes,
            sha256,
        });
        Ok(())
    }
}

fn plan_shards(specs: &[TensorSpec], max: Option<u64>) -> Vec<ShardPlan> {
    let mut groups: Vec<Vec<&TensorSpec>> = vec![Vec::new()];
    let mut size = 0u64;
    for s in specs {
        let n = s.nbytes();
        if let Some(max) = max {
            if !groups.last().unwrap().is_empty() && size + n > max {
                groups.push(Vec::new());
                size = 0;
            }
        }
        groups.last_mut().unwrap().push(s);
        size += n;
    }
    let count = groups.len();
    groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            let mut pos = 0u64;
            let tensors = g
                .into_iter()
                .map(|s| {
                    let start = pos;
                    pos += s.nbytes();
                    TensorInfo {
                        name: s.name.clone(),
                        dtype: s.dtype,
                        shape: s.shape.clone(),
                        start,
                        end: pos,
                    }
                })
                .collect();
            let file = if count == 1 {
                SINGLE_FILE.to_string()
            } else {
                shard_name(i + 1, count)
            };
            ShardPlan { file, tensors }
        })
        .collect()
}

/// HF shard naming: `model-00001-of-00003.safetensors`.
pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{i:05}-of-{n:05}.safetensors")
}

/// An input's manifest entry: hashed when `all` or when it is small.
fn input_entry(path: &Path, all: bool) -> Result<InputEntry> {
    let bytes = std::fs::metadata(path)
        .map_err(|e| Error::io("stat", path, e))?
        .len();
    let sha256 = if all || bytes <= HASH_INPUTS_UP_TO {
        Some(hash_file(path)?.sha256)
    } else {
        None
    };
    Ok(InputEntry {
        file: path.display().to_string(),
        bytes,
        sha256,
    })
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync", dir, e))
}

/// Parse a size such as `5GB`, `500MiB`, `1000000`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 5GB or 500MiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        _ => {
            return Err(format!(
                "`{s}`: unknown size unit (use B, KB, MB, GB, KiB, MiB, GiB)"
            ))
        }
    };
    let v = num * mult;
    if v < 1.0 || !v.is_finite() {
        return Err(format!("`{s}` must be at least 1 byte"));
    }
    Ok(v as u64)
}
