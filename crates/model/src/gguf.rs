//! GGUF (versions 2 and 3) reader: the header, metadata and tensor directory are parsed up front;
//! tensor data stays in the memory-mapped file.
//!
//! Layout (all little-endian): magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata
//! count; the metadata key/value pairs; the tensor infos (name, `u32` dimension count, `u64`
//! dimensions innermost first, `u32` ggml type, `u64` offset); padding to `general.alignment`;
//! then the tensor data, each tensor at its offset from the start of that data section.
//!
//! Every malformed input is reported as a [`GgufError`]. Counts and lengths read from the file
//! are checked against the bytes that remain before anything is allocated for them.

mod error;
mod reader;
mod value;

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;
use vortex_kernels::quant::{GgmlType, QMatrix, dequantize_row, type_layout};

pub use error::GgufError;
use reader::Reader;
pub use value::{Value, ValueType};

/// Default alignment of the tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays accepted in metadata.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Longest metadata array accepted (vocabularies have a few hundred thousand entries).
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Most metadata values of a file, array elements included. A value takes 32 bytes or more in
/// memory against as little as one in the file, so this bounds the metadata at about 1 GiB
/// (a 256K-token vocabulary with scores, types and merges is about a million values).
pub const MAX_METADATA_VALUES: u64 = 1 << 25;
/// ggml tensors have at most this many dimensions.
pub const MAX_DIMS: usize = 4;

const MAGIC: [u8; 4] = *b"GGUF";

/// One tensor of the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in GGUF order: innermost (contiguous) first. A weight matrix of `rows` output
    /// rows of `cols` inputs has `dims == [cols, rows]`.
    pub dims: Vec<u64>,
    /// The ggml type id as stored; see [`TensorInfo::ggml_type`].
    pub type_id: u32,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Name of the ggml type (also for types this crate cannot compute with).
    pub fn type_name(&self) -> &'static str {
        type_layout(self.type_id).map_or("?", |l| l.name)
    }

    /// The tensor's type, if it is one the kernels support.
    pub fn ggml_type(&self) -> Result<GgmlType, GgufError> {
        GgmlType::from_id(self.type_id).map_err(|_| GgufError::UnsupportedType {
            tensor: self.name.clone(),
            id: self.type_id,
            name: self.type_name(),
        })
    }
}

/// The bytes of a GGUF file: mapped from disk or owned.
enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Drops the whole pages of `start..end` of `map` from this process's resident memory. The map
/// is a read-only shared map of a file no one rewrites while it is open (see
/// [`GgufFile::open`]), so a page read again holds the same bytes; the advice is only advice,
/// and its failure changes nothing.
pub(crate) fn release_pages(map: &Mmap, start: usize, end: usize) {
    const PAGE: usize = 4096;
    let (first, last) = (
        start.next_multiple_of(PAGE),
        end.min(map.len()) / PAGE * PAGE,
    );
    if last > first {
        // SAFETY: see above: the pages' contents do not change when they are read back.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, last - first)
        };
    }
}

/// A parsed GGUF file.
pub struct GgufFile {
    bytes: Bytes,
    version: u32,
    /// Metadata in file order.
    metadata: Vec<(String, Value)>,
    keys: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .finish()
    }
}

impl GgufFile {
    /// Maps the file at `path` and parses it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this value. As with any memory-mapped
        // model loader, the file must not be truncated or rewritten while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(Bytes::Mapped(map))
    }

    /// Parses a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<Self, GgufError> {
        let mut r = Reader {
            buf: bytes.as_slice(),
            pos: 0,
            values_left: MAX_METADATA_VALUES,
        };
        let magic = r.array::<4>("magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count_at = r.pos as u64;
        let tensor_count = r.u64("tensor count")?;
        let kv_count_at = r.pos as u64;
        let kv_count = r.u64("metadata count")?;
        // A key/value takes at least 12 bytes (key length, value type), a tensor info 24.
        r.check_count("metadata count", kv_count_at, kv_count, 12)?;
        let mut metadata = Vec::with_capacity(kv_count as usize);
        let mut keys = HashMap::with_capacity(kv_count as usize);
        for _ in 0..kv_count {
            let key = r.string("metadata key")?;
            let ty = r.value_type()?;
            let value = r.value(ty, 0)?;
            if keys.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, value));
        }
        let alignment = match keys.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => *a as u64,
            Some(Value::U32(a)) => {
                return Err(GgufError::BadAlignment(format!(
                    "{a} is not a power of two"
                )));
            }
            Some(v) => {
                return Err(GgufError::BadAlignment(format!(
                    "expected U32, found {}",
                    v.describe()
                )));
            }
        };

        r.check_count("tensor count", tensor_count_at, tensor_count, 24)?;
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        let mut by_name = HashMap::with_capacity(tensor_count as usize);
        for _ in 0..tensor_count {
            let info = r.tensor_info()?;
            if by_name.insert(info.name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            tensors.push(info);
        }

        let len = r.buf.len() as u64;
        let data_start = (r.pos as u64).next_multiple_of(alignment);
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(GgufError::Misaligned {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    alignment,
                });
            }
            let start = data_start.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.size));
            match (start, end) {
                (Some(_), Some(end)) if end <= len => {}
                _ => {
                    return Err(GgufError::DataOutOfBounds {
                        tensor: t.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        len,
                    });
                }
            }
        }

        Ok(Self {
            bytes,
            version,
            metadata,
            keys,
            tensors,
            by_name,
            alignment,
            data_start,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset in the file where the tensor data section starts.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Lets the pages of `start..end` (of [`GgufFile::bytes`]) leave this process's memory
    /// until read again, as for a tensor whose products read a copy.
    pub fn release(&self, start: usize, end: usize) {
        if let Bytes::Mapped(map) = &self.bytes {
            release_pages(map, start, end);
        }
    }

    /// Metadata key/value pairs in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<T, GgufError> {
        let v = self.require(key)?;
        convert(v).ok_or_else(|| GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: v.describe(),
        })
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.typed(key, "string", Value::as_str)
    }

    /// An integer of any type whose value is non-negative.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.typed(key, "non-negative integer", Value::as_u64)
    }

    /// An integer of any type whose value fits `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        self.typed(key, "non-negative integer", |v| {
            v.as_u64().and_then(|v| usize::try_from(v).ok())
        })
    }

    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.typed(key, "integer", Value::as_i64)
    }

    /// An `F32` (or an `F64` narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.typed(key, "float", Value::as_f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.typed(key, "bool", Value::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        self.typed(key, "array", Value::as_array)
    }

    fn get_array_of<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Vec<T>, GgufError> {
        self.typed(key, expected, |v| {
            v.as_array()?
                .iter()
                .map(&convert)
                .collect::<Option<Vec<T>>>()
        })
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.get_array_of(key, "array of strings", Value::as_str)
    }

    /// An array of integers that all fit `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.get_array_of(key, "array of i32", Value::as_i32)
    }

    /// An array of non-negative integers.
    pub fn get_u64_array(&self, key: &str) -> Result<Vec<u64>, GgufError> {
        self.get_array_of(key, "array of non-negative integers", Value::as_u64)
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.get_array_of(key, "array of floats", Value::as_f32)
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    /// The stored bytes of `t`. Infos from [`GgufFile::tensors`] were checked to lie within the
    /// file when it was opened; an info from elsewhere that does not panics.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_start + t.offset) as usize;
        &self.bytes()[start..start + t.size as usize]
    }

    /// A two-dimensional tensor (or a one-dimensional one, as one row) as a matrix of
    /// `dims[1]` rows of `dims[0]` elements.
    pub fn matrix(&self, t: &TensorInfo) -> Result<QMatrix<'_>, GgufError> {
        let ty = t.ggml_type()?;
        let (cols, rows) = match t.dims[..] {
            [c] => (c, 1),
            [c, r] => (c, r),
            _ => {
                return Err(GgufError::BadShape {
                    tensor: t.name.clone(),
                    reason: format!("expected a matrix, found dims {:?}", t.dims),
                });
            }
        };
        let quant = |source| GgufError::Quant {
            tensor: t.name.clone(),
            source,
        };
        QMatrix::new(ty, rows as usize, cols as usize, self.tensor_bytes(t)).map_err(quant)
    }

    /// All elements of `t`, dequantized to f32.
    pub fn tensor_f32(&self, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let ty = t.ggml_type()?;
        let mut out = vec![0.0; t.elements() as usize];
        dequantize_row(ty, self.tensor_bytes(t), &mut out).map_err(|source| GgufError::Quant {
            tensor: t.name.clone(),
            source,
        })?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An array of `count` u8 arrays of `inner` bytes each, as a metadata value's payload.
    fn nested(count: u64, inner: u64) -> Vec<u8> {
        let mut b = ValueType::Array.id().to_le_bytes().to_vec();
        b.extend(count.to_le_bytes());
        for _ in 0..count {
            b.extend(ValueType::U8.id().to_le_bytes());
            b.extend(inner.to_le_bytes());
            b.extend(std::iter::repeat_n(7u8, inner as usize));
        }
        b
    }

    #[test]
    fn metadata_values_are_counted_across_arrays() {
        let bytes = nested(3, 4);
        // 1 outer array, 3 inner arrays and their 12 bytes: 16 values.
        for (left, ok) in [(16, true), (15, false), (4, false)] {
            let mut r = Reader {
                buf: &bytes,
                pos: 0,
                values_left: left,
            };
            let got = r.value(ValueType::Array, 0);
            match got {
                Ok(v) => {
                    assert!(ok, "{left} values allowed, got {}", v.describe());
                    assert_eq!(r.values_left, 0);
                }
                Err(e) => {
                    assert!(!ok, "{left} values allowed: {e}");
                    assert!(e.to_string().contains("metadata values"), "{e}");
                }
            }
        }
    }
}
