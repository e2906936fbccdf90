use half::{bf16, f16};

use crate::{F8E4M3, KvError, fp8};

/// Element type of stored keys, values and page summaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    F16,
    Bf16,
    /// fp8 e4m3 with no scale ([`crate::fp8`]).
    Fp8,
}

impl KvDtype {
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8 => "fp8",
        }
    }

    /// Rounds `x` to this dtype and back, as storing and reloading it would.
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvDtype::F32 => x,
            KvDtype::F16 => f16_saturating(x).to_f32(),
            KvDtype::Bf16 => bf16::from_f32(x).to_f32(),
            KvDtype::Fp8 => fp8::to_f32(fp8::from_f32(x)),
        }
    }
}

impl std::str::FromStr for KvDtype {
    type Err = KvError;
    fn from_str(s: &str) -> Result<Self, KvError> {
        match s {
            "f32" | "float32" => Ok(KvDtype::F32),
            "f16" | "float16" | "half" => Ok(KvDtype::F16),
            "bf16" | "bfloat16" => Ok(KvDtype::Bf16),
            "fp8" | "fp8_e4m3" => Ok(KvDtype::Fp8),
            _ => Err(KvError::UnknownDtype(s.to_string())),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A storable element: converts to and from f32.
///
/// # Safety
///
/// `Self` must be laid out as `DTYPE` is stored (`size_of::<Self>() == DTYPE.size()`, the same
/// bits): the SIMD kernels read a slice of `Self` through raw pointers by `DTYPE`.
pub unsafe trait KvElem: Copy + Send + Sync + Default + 'static {
    const DTYPE: KvDtype;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
    /// `x` as fp8 values when `Self` is the fp8 type, for loops that read its bytes.
    fn as_fp8(x: &[Self]) -> Option<&[crate::F8E4M3]> {
        let _ = x;
        None
    }
}

// SAFETY: f32 is stored as itself.
unsafe impl KvElem for f32 {
    const DTYPE: KvDtype = KvDtype::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

/// `x` as f16, a finite value past f16's range as its largest (as fp8 saturates): a page sum
/// that grows past 65504 stays a large number rather than becoming an infinity that turns
/// scores into NaN. Infinities and NaN stay as they are.
#[inline(always)]
fn f16_saturating(x: f32) -> f16 {
    if x.is_finite() {
        f16::from_f32(x.clamp(-f16::MAX.to_f32(), f16::MAX.to_f32()))
    } else {
        f16::from_f32(x)
    }
}

// SAFETY: f16 is stored as itself.
unsafe impl KvElem for f16 {
    const DTYPE: KvDtype = KvDtype::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16_saturating(x)
    }
}

// SAFETY: bf16 is stored as itself.
unsafe impl KvElem for bf16 {
    const DTYPE: KvDtype = KvDtype::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// A flat buffer of one dtype.
#[derive(Debug, Clone)]
pub enum Storage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Fp8(Vec<F8E4M3>),
}

impl Storage {
    pub fn zeros(dtype: KvDtype, len: usize) -> Self {
        let s = match dtype {
            KvDtype::F32 => Storage::F32(vec![0.0; len]),
            KvDtype::F16 => Storage::F16(zeroed_halves(len)),
            KvDtype::Bf16 => Storage::Bf16(zeroed_halves(len)),
            KvDtype::Fp8 => Storage::Fp8(zeroed_bytes(len)),
        };
        let (ptr, bytes) = match &s {
            Storage::F32(v) => (v.as_ptr() as usize, v.len() * 4),
            Storage::F16(v) => (v.as_ptr() as usize, v.len() * 2),
            Storage::Bf16(v) => (v.as_ptr() as usize, v.len() * 2),
            Storage::Fp8(v) => (v.as_ptr() as usize, v.len()),
        };
        advise_huge_pages(ptr, bytes);
        s
    }

    pub fn dtype(&self) -> KvDtype {
        match self {
            Storage::F32(_) => KvDtype::F32,
            Storage::F16(_) => KvDtype::F16,
            Storage::Bf16(_) => KvDtype::Bf16,
            Storage::Fp8(_) => KvDtype::Fp8,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::F16(v) => v.len(),
            Storage::Bf16(v) => v.len(),
            Storage::Fp8(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer as a typed slice, if `T` is its dtype.
    pub fn as_slice<T: KvElem>(&self) -> Option<&[T]> {
        let (ptr, len) = match self {
            Storage::F32(v) => (v.as_ptr() as *const u8, v.len()),
            Storage::F16(v) => (v.as_ptr() as *const u8, v.len()),
            Storage::Bf16(v) => (v.as_ptr() as *const u8, v.len()),
            Storage::Fp8(v) => (v.as_ptr() as *const u8, v.len()),
        };
        // SAFETY: the dtype tag equals T::DTYPE, so the buffer holds `len` values of T.
        (self.dtype() == T::DTYPE)
            .then(|| unsafe { std::slice::from_raw_parts(ptr as *const T, len) })
    }

    /// Writes `src` (f32) into `self[offset..offset + src.len()]`, rounding to the dtype.
    pub fn write_f32(&mut self, offset: usize, src: &[f32]) {
        match self {
            Storage::F32(v) => v[offset..offset + src.len()].copy_from_slice(src),
            Storage::F16(v) => write_conv(&mut v[offset..offset + src.len()], src),
            Storage::Bf16(v) => write_conv(&mut v[offset..offset + src.len()], src),
            Storage::Fp8(v) => write_conv(&mut v[offset..offset + src.len()], src),
        }
    }

    /// Reads `self[offset..offset + dst.len()]` as f32.
    pub fn read_f32(&self, offset: usize, dst: &mut [f32]) {
        match self {
            Storage::F32(v) => dst.copy_from_slice(&v[offset..offset + dst.len()]),
            Storage::F16(v) => read_conv(&v[offset..offset + dst.len()], dst),
            Storage::Bf16(v) => {
                // A bf16 is the high half of an f32: widening is a shift, which vectorises.
                let n = dst.len();
                for (d, s) in dst.iter_mut().zip(&v[offset..offset + n]) {
                    *d = f32::from_bits((s.to_bits() as u32) << 16);
                }
            }
            Storage::Fp8(v) => read_conv(&v[offset..offset + dst.len()], dst),
        }
    }

    /// Overwrites this buffer with `other`'s contents (same dtype and length), in place.
    pub fn copy_from(&mut self, other: &Storage) -> Result<(), KvError> {
        match (self, other) {
            (Storage::F32(a), Storage::F32(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (Storage::F16(a), Storage::F16(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (Storage::Bf16(a), Storage::Bf16(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (Storage::Fp8(a), Storage::Fp8(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (a, b) => {
                return Err(KvError::ShapeMismatch {
                    what: "storage",
                    expected: a.len(),
                    got: b.len(),
                });
            }
        }
        Ok(())
    }

    /// Copies `len` elements from `src` to `dst` within the buffer.
    pub fn copy_within(&mut self, src: usize, dst: usize, len: usize) {
        match self {
            Storage::F32(v) => v.copy_within(src..src + len, dst),
            Storage::F16(v) => v.copy_within(src..src + len, dst),
            Storage::Bf16(v) => v.copy_within(src..src + len, dst),
            Storage::Fp8(v) => v.copy_within(src..src + len, dst),
        }
    }
}

/// A vector of 16-bit floats whose zero bits come from the allocator untouched: `vec![ZERO; n]`
/// of a non-primitive type writes every element, faulting in gigabytes of pool at start-up.
fn zeroed_halves<T: KvElem>(len: usize) -> Vec<T> {
    assert_eq!(std::mem::size_of::<T>(), 2, "16-bit element types only");
    let mut bits = std::mem::ManuallyDrop::new(vec![0u16; len]);
    // SAFETY: f16 and bf16 are transparent wrappers of u16 (same size and alignment) for
    // which all-zero bits mean +0.0; the allocation is handed over whole, never freed twice.
    unsafe { Vec::from_raw_parts(bits.as_mut_ptr().cast::<T>(), bits.len(), bits.capacity()) }
}

/// A vector of fp8 values whose zero bits come from the allocator untouched (see
/// `zeroed_halves`).
fn zeroed_bytes(len: usize) -> Vec<F8E4M3> {
    let mut bits = std::mem::ManuallyDrop::new(vec![0u8; len]);
    // SAFETY: F8E4M3 is a transparent wrapper of u8 for which zero bits mean +0.0; the
    // allocation is handed over whole, never freed twice.
    unsafe {
        Vec::from_raw_parts(
            bits.as_mut_ptr().cast::<F8E4M3>(),
            bits.len(),
            bits.capacity(),
        )
    }
}

/// Asks the kernel to back a large buffer with huge pages: KV and summary reads are scattered
/// over gigabytes, and 4 KiB pages would make every few pages of them a TLB miss. The buffer is
/// still untouched (zeroed lazily), so the advice applies from the first write.
fn advise_huge_pages(ptr: usize, bytes: usize) {
    const HUGE: usize = 2 << 20;
    #[cfg(target_os = "linux")]
    if bytes >= 2 * HUGE {
        let start = ptr.next_multiple_of(HUGE);
        let end = (ptr + bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: advice only; the range lies inside this live allocation.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes, HUGE);
}

fn write_conv<T: KvElem>(dst: &mut [T], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = T::from_f32(*s);
    }
}

fn read_conv<T: KvElem>(src: &[T], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}
