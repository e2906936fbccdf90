use crate::KvError;

/// Shape of one layer's KV cache: how many KV heads, their width, and tokens per page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
}

impl KvGeometry {
    pub const DEFAULT_PAGE_SIZE: usize = 16;

    pub fn new(kv_heads: usize, head_dim: usize, page_size: usize) -> Result<Self, KvError> {
        if kv_heads == 0 {
            return Err(KvError::ZeroDimension("kv_heads"));
        }
        if head_dim == 0 {
            return Err(KvError::ZeroDimension("head_dim"));
        }
        check_page_size(page_size)?;
        Ok(Self {
            kv_heads,
            head_dim,
            page_size,
        })
    }

    /// Elements of K (or V) for one KV head of one page.
    pub fn head_elems(&self) -> usize {
        self.page_size * self.head_dim
    }

    /// Elements of K (or V) for all KV heads of one page.
    pub fn page_elems(&self) -> usize {
        self.kv_heads * self.head_elems()
    }

    /// Pages needed to hold `tokens` tokens.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size)
    }
}

pub fn check_page_size(page_size: usize) -> Result<(), KvError> {
    if page_size == 0 || page_size > 256 || !page_size.is_power_of_two() {
        return Err(KvError::BadPageSize(page_size));
    }
    Ok(())
}
