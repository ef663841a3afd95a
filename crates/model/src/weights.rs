//! Reading Hugging Face safetensors checkpoints: `model.safetensors`, or the shards listed in
//! `model.safetensors.index.json` (transformers' `save_pretrained(max_shard_size=..)` layout), with
//! weights stored as f32, bf16 or f16. Every tensor reaches burn as f32; the cast is written out here.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

/// What can go wrong while reading a checkpoint; every message names the file or tensor.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("`{dir}` has no `model.safetensors` and no `model.safetensors.index.json`{hint}")]
    NoWeights { dir: PathBuf, hint: String },
    /// A shard the index names is not there.
    #[error("`{path}` is missing, though `model.safetensors.index.json` names it{hint}")]
    MissingShard { path: PathBuf, hint: String },
    #[error("cannot read `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing failed (a full disk, a file-size limit): a failure of the run, not of its input.
    #[error("cannot write `{path}`")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` is not a valid safetensors index: {message}")]
    BadIndex { path: PathBuf, message: String },
    #[error("`{path}` is not a valid safetensors file")]
    BadFile {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
    #[error(transparent)]
    Checksum(#[from] dpo_base::checksums::ChecksumError),
    #[error("tensor `{name}` is missing from the checkpoint in `{dir}`")]
    Missing { name: String, dir: PathBuf },
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape { name: String, found: Vec<usize>, expected: Vec<usize> },
    #[error("tensor `{name}` is stored as {dtype:?}; supported: F32, BF16, F16")]
    Dtype { name: String, dtype: Dtype },
    /// A tensor the loaded model has no place for (an adapter variant's own, such as KaSA's
    /// `lora_diag`): loading on without it would compute another model.
    #[error(
        "tensor `{name}` in `{dir}` is not one of the adapter's LoRA weights: this adapter variant is not supported"
    )]
    Unused { name: String, dir: PathBuf },
}

/// The memory-mapped safetensors files of one model directory.
pub struct Weights {
    dir: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
}

impl Weights {
    /// Maps `model.safetensors`, or every shard named by `model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self, WeightsError> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if single.is_file() {
            vec!["model.safetensors".to_owned()]
        } else if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|source| WeightsError::Io { path: index_path.clone(), source })?;
            let index: ShardIndex = serde_json::from_str(&text)
                .map_err(|e| WeightsError::BadIndex { path: index_path.clone(), message: e.to_string() })?;
            let mut names: Vec<String> = index.weight_map.into_values().collect();
            names.sort();
            names.dedup();
            names
        } else {
            let hint = dpo_base::hub::incomplete_download_hint(dir);
            return Err(WeightsError::NoWeights { dir: dir.to_owned(), hint });
        };

        let shards: Vec<PathBuf> = shard_names.iter().map(|name| dir.join(name)).collect();
        // A cache snapshot's file is a link to its blob: a missing blob is a missing shard too.
        if let Some(path) = shards.iter().find(|p| !p.exists()) {
            return Err(WeightsError::MissingShard {
                path: path.clone(),
                hint: dpo_base::hub::incomplete_download_hint(dir),
            });
        }
        Self::map_files(dir, shards.into_iter())
    }

    /// Maps one safetensors file (an optimizer state, for example).
    pub fn open_file(path: &Path) -> Result<Self, WeightsError> {
        Self::map_files(path.parent().unwrap_or(Path::new(".")), std::iter::once(path.to_owned()))
    }

    fn map_files(dir: &Path, paths: impl Iterator<Item = PathBuf>) -> Result<Self, WeightsError> {
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for path in paths {
            let file = File::open(&path).map_err(|source| WeightsError::Io { path: path.clone(), source })?;
            // SAFETY: the map is read-only and lives as long as `Weights`; a checkpoint modified
            // by another process while we read it is outside what any loader can guard against.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|source| WeightsError::Io { path: path.clone(), source })?;
            // A checkpoint's files are checked against the checksums written with them.
            dpo_base::checksums::check(&path, &mmap)?;
            let tensors = SafeTensors::deserialize(&mmap)
                .map_err(|source| WeightsError::BadFile { path: path.clone(), source })?;
            for tensor_name in tensors.names() {
                index.insert(tensor_name.to_owned(), files.len());
            }
            files.push((path, mmap));
        }
        Ok(Self { dir: dir.to_owned(), files, index })
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.index.keys().cloned().collect();
        names.sort();
        names
    }

    /// The number of elements of tensor `name`.
    pub fn len_of(&self, name: &str) -> Option<usize> {
        let &file = self.index.get(name)?;
        let tensors = SafeTensors::deserialize(&self.files[file].1).ok()?;
        tensors.tensor(name).ok().map(|v| v.shape().iter().product())
    }

    /// The value of `key` in the first file's header metadata.
    pub fn metadata(&self, key: &str) -> Option<String> {
        let (_, mmap) = self.files.first()?;
        let (_, header) = SafeTensors::read_metadata(mmap).ok()?;
        header.metadata().as_ref()?.get(key).cloned()
    }

    /// Every tensor as f32 host values, in name order: what a comparison of two saved models reads.
    pub fn all_values(&self) -> Result<Vec<(String, Vec<f32>)>, WeightsError> {
        let mut out = Vec::with_capacity(self.index.len());
        for (path, mmap) in &self.files {
            let tensors = SafeTensors::deserialize(mmap)
                .map_err(|source| WeightsError::BadFile { path: path.clone(), source })?;
            for (name, view) in tensors.tensors() {
                let values = to_f32(&name, view.dtype(), view.data())?;
                out.push((name, values));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Whether the checkpoint holds a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Reads tensor `name` as f32 host values, checking its shape.
    pub fn values(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, WeightsError> {
        let missing = || WeightsError::Missing { name: name.to_owned(), dir: self.dir.clone() };
        let &file = self.index.get(name).ok_or_else(missing)?;
        let (path, mmap) = &self.files[file];
        let tensors =
            SafeTensors::deserialize(mmap).map_err(|source| WeightsError::BadFile { path: path.clone(), source })?;
        let view = tensors.tensor(name).map_err(|_| missing())?;
        if view.shape() != expected {
            return Err(WeightsError::Shape {
                name: name.to_owned(),
                found: view.shape().to_vec(),
                expected: expected.to_vec(),
            });
        }
        to_f32(name, view.dtype(), view.data())
    }
}

/// Where a model's parameters come from, by Hugging Face name: a checkpoint, or a seeded
/// random initialisation. Model construction is one code path over either.
pub trait TensorSource {
    /// The tensor `name` of shape `shape` as f32 host values.
    fn values(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError>;
}

impl TensorSource for Weights {
    fn values(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError> {
        Weights::values(self, name, shape)
    }
}

impl dyn TensorSource + '_ {
    /// Tensor `name` on `device`.
    pub fn tensor<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
        device: &Device,
    ) -> Result<Tensor<D>, WeightsError> {
        Ok(Tensor::from_data(TensorData::new(self.values(name, &shape)?, shape), device))
    }
}

/// transformers' `_init_weights` for these models: normal(0, `std`) matrices, zero biases, unit
/// norm weights; each tensor seeded from (`seed`, its name) so the result does not depend on order.
#[derive(Debug, Clone, Copy)]
pub struct RandomInit {
    pub seed: u64,
    pub std: f64,
}

impl TensorSource for RandomInit {
    fn values(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError> {
        let n: usize = shape.iter().product();
        if name.ends_with("norm.weight") {
            return Ok(vec![1.0; n]);
        }
        if name.ends_with(".bias") {
            return Ok(vec![0.0; n]);
        }
        Ok(self.draws(name, n, parts_for(n, 1 << 20)))
    }
}

impl RandomInit {
    /// `n` values of the tensor `name`: one stream per tensor, drawn in `parts` on as many
    /// threads, each part's generator moved to the part's first draw, so the values are those of
    /// one thread drawing in order (an 8B shape is 7.5G draws, minutes on one core).
    fn draws(&self, name: &str, n: usize, parts: usize) -> Vec<f32> {
        filled_in_parts(n, parts, |start, out| {
            let mut rng = seeded_rng(self.seed, name);
            rng.set_word_pos(WORDS_A_DRAW * start as u128);
            out.iter_mut().for_each(|x| *x = (normal(&mut rng) * self.std) as f32);
        })
    }
}

/// As many parts of `n` values as there are cores, each of at least `min` values.
fn parts_for(n: usize, min: usize) -> usize {
    std::thread::available_parallelism().map_or(1, usize::from).min(n.div_ceil(min))
}

/// `n` values, each of `parts` filled by `fill(first index, values)` on a thread of its own (on
/// the caller's where there is one part): each part's pages are first touched by its thread.
fn filled_in_parts(n: usize, parts: usize, fill: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    let mut values = vec![0.0f32; n];
    let part = n.div_ceil(parts.max(1)).max(1);
    if part >= n {
        fill(0, &mut values);
        return values;
    }
    let fill = &fill;
    std::thread::scope(|s| {
        for (k, out) in values.chunks_mut(part).enumerate() {
            s.spawn(move || fill(k * part, out));
        }
    });
    values
}

/// The generator's 32-bit words one normal draw takes: two uniform f64s of a `u64` each.
const WORDS_A_DRAW: u128 = 4;

/// A standard normal by Box–Muller: two uniforms give one.
fn normal(rng: &mut rand_chacha::ChaCha8Rng) -> f64 {
    use rand::RngExt;
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// A generator seeded from (`seed`, a tensor's name), so an initialisation does not depend on
/// the order tensors are created in.
pub fn seeded_rng(seed: u64, name: &str) -> rand_chacha::ChaCha8Rng {
    use rand::SeedableRng;
    let name_hash =
        name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ name_hash)
}

/// Decodes little-endian f32/bf16/f16 bytes into f32 (exact for all three), a large tensor in
/// parts on every core (an 8B model in bf16 is 15 GB to widen).
fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, WeightsError> {
    if !matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
        return Err(WeightsError::Dtype { name: name.to_owned(), dtype });
    }
    Ok(decode(dtype, bytes, parts_for(bytes.len() / (dtype.bitsize() / 8), 1 << 22)))
}

/// [`to_f32`] of a supported dtype in `parts` on as many threads.
fn decode(dtype: Dtype, bytes: &[u8], parts: usize) -> Vec<f32> {
    let width = dtype.bitsize() / 8;
    filled_in_parts(bytes.len() / width, parts, |start, out| {
        let pairs = out.iter_mut().zip(bytes[start * width..].chunks_exact(width));
        match dtype {
            Dtype::F32 => pairs.for_each(|(x, b)| *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::BF16 => pairs.for_each(|(x, b)| *x = half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            _ => pairs.for_each(|(x, b)| *x = half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        }
    })
}

#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

/// A tensor on its way to disk: HF name, shape and f32 values.
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Values,
}

/// Writes `tensors` as one safetensors file (f32, `{"format": "pt"}` metadata as transformers
/// writes), atomically: a temporary file in the same directory renamed over `path`.
pub fn save_safetensors(path: &Path, tensors: &[NamedTensor]) -> Result<(), WeightsError> {
    save_safetensors_with(path, tensors, &[])
}

/// [`save_safetensors`] with more `(key, value)` pairs in the header's metadata (a checksum, say).
pub fn save_safetensors_with(path: &Path, tensors: &[NamedTensor], extra: &[(&str, &str)]) -> Result<(), WeightsError> {
    let mut metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    metadata.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let metadata = Some(metadata);
    let views = tensors.iter().map(|t| (t.name.clone(), t));
    dpo_base::fsutil::write_atomic_with(path, |tmp| {
        safetensors::serialize_to_file(views, metadata, tmp).map_err(|e| match e {
            // The I/O error itself, so the cause is reported once.
            safetensors::SafeTensorError::IoError(io) => io,
            other => std::io::Error::other(other),
        })
    })
    .map_err(|source| WeightsError::Write { path: path.to_owned(), source })
}

/// The values of a [`NamedTensor`]: on the host, or on the device until the moment they are
/// written (a checkpoint then holds one tensor's host copy at a time, not the whole model's).
pub enum Values {
    Host(Vec<f32>),
    /// A matrix (a vector as one row), saved transposed when `transpose`.
    Device {
        tensor: Tensor<2>,
        transpose: bool,
    },
}

impl Values {
    /// The values as f32 on the host, in the saved layout.
    pub fn to_vec(&self) -> Vec<f32> {
        match self {
            Values::Host(v) => v.clone(),
            Values::Device { tensor, transpose } => {
                let t = if *transpose { tensor.clone().transpose() } else { tensor.clone() };
                let n = t.shape().num_elements();
                crate::host(&t.reshape([n]))
            }
        }
    }

    /// The values as the file stores them, little-endian f32, copied once from the tensor's
    /// host copy where it is f32 (the checkpoint's bytes went through a `Vec<f32>` and a
    /// byte-at-a-time copy: twice as long as writing them, for 6 GB of a 0.5B model's checkpoint).
    fn le_bytes(&self) -> Vec<u8> {
        let f32s = |v: &[f32]| {
            let mut bytes = Vec::with_capacity(4 * v.len());
            v.iter().for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()));
            bytes
        };
        match self {
            Values::Host(v) => f32s(v),
            Values::Device { tensor, transpose } => {
                let t = if *transpose { tensor.clone().transpose() } else { tensor.clone() };
                let n = t.shape().num_elements();
                dpo_torch::transfers::count_read();
                let data = t.reshape([n]).to_data();
                match data.dtype() {
                    burn::tensor::DType::F32 if cfg!(target_endian = "little") => data.as_bytes().to_vec(),
                    _ => f32s(&data.iter::<f32>().collect::<Vec<f32>>()),
                }
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Values::Host(v) => v.len(),
            Values::Device { tensor, .. } => tensor.shape().num_elements(),
        }
    }
}

impl safetensors::View for &NamedTensor {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Owned(self.values.le_bytes())
    }

    fn data_len(&self) -> usize {
        self.values.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drawn in parts on several threads, a tensor's values are one generator's draws in order,
    /// bit for bit (the fixtures' models and every committed figure of them depend on it).
    #[test]
    fn random_init_draws_in_parts_as_one_stream() {
        let (init, name) = (RandomInit { seed: 7, std: 0.02 }, "model.layers.0.mlp.up_proj.weight");
        let mut rng = seeded_rng(7, name);
        let one_stream: Vec<u32> = (0..1001).map(|_| ((normal(&mut rng) * 0.02) as f32).to_bits()).collect();
        for parts in [1, 2, 7] {
            let got: Vec<u32> = init.draws(name, 1001, parts).iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, one_stream, "{parts} parts");
        }
        assert_eq!(init.values("model.norm.weight", &[3]).expect("ones"), vec![1.0; 3]);
    }

    /// Each stored dtype widens exactly, in parts as in one: f32 bits kept, bf16 and f16 values
    /// (a subnormal f16 included) as `half` reads them.
    #[test]
    fn stored_values_widen_exactly_in_parts() {
        let want = [1.5f32, -0.0, 3.0e-5, 65504.0, -2.0, 0.25, 1.0e-7];
        let f32s: Vec<u8> = want.iter().flat_map(|x| x.to_le_bytes()).collect();
        let bf16s: Vec<u8> = want.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
        let f16s: Vec<u8> = want.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        for parts in [1, 3, 7] {
            assert_eq!(bits(decode(Dtype::F32, &f32s, parts)), bits(want.to_vec()), "{parts} parts");
            let bf16: Vec<f32> = want.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect();
            assert_eq!(bits(decode(Dtype::BF16, &bf16s, parts)), bits(bf16), "{parts} parts");
            let f16: Vec<f32> = want.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
            assert_eq!(bits(decode(Dtype::F16, &f16s, parts)), bits(f16), "{parts} parts");
        }
        assert!(matches!(to_f32("x", Dtype::I64, &[0; 8]), Err(WeightsError::Dtype { .. })));
    }

    /// Each kind of value reaches the file as its f32 values in the saved layout: host values,
    /// a device matrix transposed, and one in bf16 (widened exactly).
    #[test]
    #[allow(deprecated)] // burn's libtorch device: this project's backend
    fn saved_values_read_back_in_their_layout() {
        let d = Device::libtorch();
        let m = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, -6.5], [2, 3]), &d);
        let device = |tensor: Tensor<2>, transpose| Values::Device { tensor, transpose };
        let tensors = [
            ("host", vec![2], Values::Host(vec![0.25, -1.0])),
            ("transposed", vec![3, 2], device(m.clone(), true)),
            ("bf16", vec![2, 3], device(m.cast(burn::tensor::FloatDType::BF16), false)),
        ]
        .map(|(name, shape, values)| NamedTensor { name: name.to_owned(), shape, values });
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("t.safetensors");
        save_safetensors(&path, &tensors).expect("written");
        let bytes = std::fs::read(&path).expect("read");
        let file = SafeTensors::deserialize(&bytes).expect("a safetensors file");
        let read = |name: &str| to_f32(name, Dtype::F32, file.tensor(name).expect("present").data()).expect("f32");
        assert_eq!(read("host"), [0.25, -1.0]);
        assert_eq!(read("transposed"), [1.0, 4.0, 2.0, 5.0, 3.0, -6.5]);
        assert_eq!(read("bf16"), [1.0, 2.0, 3.0, 4.0, 5.0, -6.5]);
    }
}
