use std::fmt;

/// Everything that can go wrong in the KV cache, as values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// `page_size` must be a power of two in 1..=256.
    BadPageSize(usize),
    /// A geometry dimension was zero.
    ZeroDimension(&'static str),
    /// The pool has no free page left.
    OutOfPages { total: usize },
    /// A tensor passed in has the wrong number of elements.
    ShapeMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// An unknown dtype name.
    UnknownDtype(String),
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::BadPageSize(n) => {
                write!(f, "page_size {n} is not a power of two between 1 and 256")
            }
            KvError::ZeroDimension(what) => write!(f, "{what} must be at least 1"),
            KvError::OutOfPages { total } => {
                write!(f, "KV cache is full: all {total} pages are in use")
            }
            KvError::ShapeMismatch {
                what,
                expected,
                got,
            } => {
                write!(f, "{what}: expected {expected} elements, got {got}")
            }
            KvError::UnknownDtype(s) => {
                write!(f, "unknown KV dtype '{s}' (expected f32, f16, bf16 or fp8)")
            }
        }
    }
}

impl std::error::Error for KvError {}
