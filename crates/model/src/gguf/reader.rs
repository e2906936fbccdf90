//! The cursor that parses a GGUF file's header, metadata and tensor directory.

use vortex_kernels::quant::type_layout;

use super::{
    GgufError, MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_DIMS, MAX_METADATA_VALUES, TensorInfo, Value,
    ValueType,
};

/// A cursor over the file's bytes; every read checks the remaining length.
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    /// Metadata values still allowed (see [`MAX_METADATA_VALUES`]).
    pub(super) values_left: u64,
}

impl<'a> Reader<'a> {
    pub(super) fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    pub(super) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
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

    pub(super) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        Ok(s.try_into().expect("take returns N bytes"))
    }

    pub(super) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(super) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Fails unless `count` items of at least `min_size` bytes each fit in the rest of the file;
    /// `at` is where the count is written.
    pub(super) fn check_count(
        &self,
        what: &str,
        at: u64,
        count: u64,
        min_size: u64,
    ) -> Result<(), GgufError> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(GgufError::TooLarge {
                what: what.to_string(),
                count,
                offset: at,
            });
        }
        Ok(())
    }

    pub(super) fn string(&mut self, what: &str) -> Result<String, GgufError> {
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

    pub(super) fn value_type(&mut self) -> Result<ValueType, GgufError> {
        let offset = self.pos as u64;
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(GgufError::InvalidValueType { id, offset })
    }

    pub(super) fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
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

    pub(super) fn tensor_info(&mut self) -> Result<TensorInfo, GgufError> {
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
