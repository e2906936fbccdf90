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

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use vortex_kernels::quant::{GgmlType, QMatrix, QuantError, dequantize_row, type_layout};

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

/// Type tag of a metadata value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The id stored in the file.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Fewest bytes a value of this type takes in the file.
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// Elements all of type `elem` (arrays of arrays may differ in their inner types).
    Array {
        elem: ValueType,
        items: Vec<Value>,
    },
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array { .. } => ValueType::Array,
        }
    }

    /// Any integer, as `i128` (every integer type fits).
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer of any type whose value fits `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer of any type whose value fits `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// An integer of any type whose value fits `i32`.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_i128().and_then(|v| i32::try_from(v).ok())
    }

    /// An `F32`, or an `F64` narrowed to f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array { items, .. } => Some(items),
            _ => None,
        }
    }

    /// A short description for messages: the type, and the length of arrays.
    fn describe(&self) -> String {
        match self {
            Value::Array { elem, items } => format!("array of {} {elem:?}", items.len()),
            v => format!("{:?}", v.value_type()),
        }
    }
}

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

/// Why a GGUF file could not be read or a lookup failed.
#[derive(Debug)]
pub enum GgufError {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    BadMagic([u8; 4]),
    UnsupportedVersion(u32),
    /// `needed` bytes for `what` at `offset`, past the end of the file (`len` bytes).
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    /// A count or length that cannot fit in the rest of the file.
    TooLarge {
        what: String,
        count: u64,
        offset: u64,
    },
    InvalidValueType {
        id: u32,
        offset: u64,
    },
    InvalidUtf8 {
        offset: u64,
    },
    NestingTooDeep {
        offset: u64,
    },
    DuplicateKey(String),
    BadAlignment(String),
    DuplicateTensor(String),
    /// A tensor whose type id is no ggml type.
    UnknownType {
        tensor: String,
        id: u32,
    },
    /// A tensor of a ggml type the kernels cannot compute with.
    UnsupportedType {
        tensor: String,
        id: u32,
        name: &'static str,
    },
    BadShape {
        tensor: String,
        reason: String,
    },
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    /// Tensor data (absolute byte range) past the end of the file.
    DataOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },
    MissingKey(String),
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    MissingTensor(String),
    Quant {
        tensor: String,
        source: QuantError,
    },
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufError::*;
        match self {
            Io { path, source } => write!(f, "{}: {source}", path.display()),
            BadMagic(m) => write!(f, "not a GGUF file: magic {m:02x?}, expected \"GGUF\""),
            UnsupportedVersion(v) => write!(f, "unsupported GGUF version {v} (supported: 2, 3)"),
            Truncated {
                what,
                offset,
                needed,
                len,
            } => write!(
                f,
                "truncated file: {what} at offset {offset} needs {needed} bytes, \
                 the file ends at {len}"
            ),
            TooLarge {
                what,
                count,
                offset,
            } => write!(
                f,
                "{what} at offset {offset}: {count} does not fit in the rest of the file"
            ),
            InvalidValueType { id, offset } => {
                write!(f, "invalid metadata value type {id} at offset {offset}")
            }
            InvalidUtf8 { offset } => write!(f, "string at offset {offset} is not valid UTF-8"),
            NestingTooDeep { offset } => write!(
                f,
                "arrays nested deeper than {MAX_ARRAY_DEPTH} levels at offset {offset}"
            ),
            DuplicateKey(k) => write!(f, "duplicate metadata key {k:?}"),
            BadAlignment(why) => write!(f, "invalid general.alignment: {why}"),
            DuplicateTensor(t) => write!(f, "duplicate tensor name {t:?}"),
            UnknownType { tensor, id } => {
                write!(f, "tensor {tensor:?} has unknown ggml type id {id}")
            }
            UnsupportedType { tensor, id, name } => write!(
                f,
                "tensor {tensor:?} has ggml type {name} (id {id}), which is not supported \
                 (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)"
            ),
            BadShape { tensor, reason } => write!(f, "tensor {tensor:?}: {reason}"),
            Misaligned {
                tensor,
                offset,
                alignment,
            } => write!(
                f,
                "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment \
                 {alignment}"
            ),
            DataOutOfBounds {
                tensor,
                start,
                end,
                len,
            } => write!(
                f,
                "tensor {tensor:?}: data bytes {start}..{end} lie past the end of the file \
                 ({len} bytes)"
            ),
            MissingKey(k) => write!(f, "missing metadata key {k:?}"),
            WrongType {
                key,
                expected,
                found,
            } => write!(
                f,
                "metadata key {key:?}: expected {expected}, found {found}"
            ),
            MissingTensor(t) => write!(f, "missing tensor {t:?}"),
            Quant { tensor, source } => write!(f, "tensor {tensor:?}: {source}"),
        }
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GgufError::Io { source, .. } => Some(source),
            GgufError::Quant { source, .. } => Some(source),
            _ => None,
        }
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

/// A cursor over the file's bytes; every read checks the remaining length.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Metadata values still allowed (see [`MAX_METADATA_VALUES`]).
    values_left: u64,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        Ok(s.try_into().expect("take returns N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Fails unless `count` items of at least `min_size` bytes each fit in the rest of the file;
    /// `at` is where the count is written.
    fn check_count(&self, what: &str, at: u64, count: u64, min_size: u64) -> Result<(), GgufError> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(GgufError::TooLarge {
                what: what.to_string(),
                count,
                offset: at,
            });
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(GgufError::TooLarge {
                what: format!("{what} length"),
                count: len,
                offset: at,
            });
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { offset: at })
    }

    fn value_type(&mut self) -> Result<ValueType, GgufError> {
        let offset = self.pos as u64;
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(GgufError::InvalidValueType { id, offset })
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        if self.values_left == 0 {
            return Err(GgufError::TooLarge {
                what: format!("metadata values (limit {MAX_METADATA_VALUES} in all)"),
                count: MAX_METADATA_VALUES + 1,
                offset: self.pos as u64,
            });
        }
        self.values_left -= 1;
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>("u8")?[0]),
            ValueType::I8 => Value::I8(self.array::<1>("i8")?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array("u16")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array("i16")?)),
            ValueType::U32 => Value::U32(self.u32("u32")?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array("i32")?)),
            ValueType::U64 => Value::U64(self.u64("u64")?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array("i64")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array("f32")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array("f64")?)),
            ValueType::Bool => Value::Bool(self.array::<1>("bool")?[0] != 0),
            ValueType::String => Value::String(self.string("string")?),
            ValueType::Array => {
                let at = self.pos as u64;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep { offset: at });
                }
                let elem = self.value_type()?;
                let count = self.u64("array length")?;
                if count > MAX_ARRAY_LEN {
                    return Err(GgufError::TooLarge {
                        what: format!("array length (limit {MAX_ARRAY_LEN})"),
                        count,
                        offset: at,
                    });
                }
                self.check_count("array length", at, count, elem.min_size())?;
                if count > self.values_left {
                    return Err(GgufError::TooLarge {
                        what: format!("metadata values (limit {MAX_METADATA_VALUES} in all)"),
                        count,
                        offset: at,
                    });
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, depth + 1)?);
                }
                Value::Array { elem, items }
            }
        })
    }

    fn tensor_info(&mut self) -> Result<TensorInfo, GgufError> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32("dimension count")?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadShape {
                tensor: name,
                reason: format!("{n_dims} dimensions, at most {MAX_DIMS} supported"),
            });
        }
        let dims = (0..n_dims)
            .map(|_| self.u64("dimension"))
            .collect::<Result<Vec<_>, _>>()?;
        let type_id = self.u32("tensor type")?;
        let offset = self.u64("tensor offset")?;
        let layout = type_layout(type_id).ok_or_else(|| GgufError::UnknownType {
            tensor: name.clone(),
            id: type_id,
        })?;
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| GgufError::BadShape {
                tensor: name.clone(),
                reason: format!("dims {dims:?} overflow"),
            })?;
        let row = dims.first().copied().unwrap_or(1);
        if row % layout.block_size as u64 != 0 {
            return Err(GgufError::BadShape {
                tensor: name,
                reason: format!(
                    "row length {row} is not a multiple of the {} block size {}",
                    layout.name, layout.block_size
                ),
            });
        }
        let size = layout
            .bytes_for(elements)
            .ok_or_else(|| GgufError::BadShape {
                tensor: name.clone(),
                reason: format!("{elements} elements of {} overflow", layout.name),
            })?;
        Ok(TensorInfo {
            name,
            dims,
            type_id,
            offset,
            size,
        })
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
