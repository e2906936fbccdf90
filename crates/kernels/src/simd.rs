//! Vector primitives over f32 queries/accumulators and f32/f16/bf16 stored keys and values,
//! with runtime selection of the instruction set.
//!
//! A [`Simd`] names an instruction set this CPU supports; it can only be obtained through
//! detection, which is what makes calling its target-specific code sound.

use vortex_kv::{KvDtype, KvElem};

use crate::max_isa::{MaxIsa, max_isa};

/// Instruction set used by a [`Simd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// AVX-512 F + BW + VL, 16 f32 lanes.
    Avx512,
    /// AVX2 + FMA + F16C, 8 f32 lanes.
    Avx2,
    /// Portable Rust.
    Scalar,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Avx512 => "avx512",
            Level::Avx2 => "avx2",
            Level::Scalar => "scalar",
        }
    }
}

/// A supported instruction set: the handle through which all primitives are called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Simd {
    level: Level,
}

impl Simd {
    /// The widest instruction set this CPU supports, within `VORTEX_MAX_ISA`.
    pub fn detect() -> Self {
        let cap = max_isa();
        [(Level::Avx512, MaxIsa::Avx512), (Level::Avx2, MaxIsa::Avx2)]
            .into_iter()
            .filter(|&(_, needs)| needs <= cap)
            .map(|(level, _)| level)
            .find_map(Self::with_level)
            .unwrap_or_else(Self::scalar)
    }

    pub fn scalar() -> Self {
        Self {
            level: Level::Scalar,
        }
    }

    /// `level`, if this CPU supports it.
    pub fn with_level(level: Level) -> Option<Self> {
        let supported = match level {
            Level::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        };
        supported.then_some(Self { level })
    }

    pub fn level(self) -> Level {
        self.level
    }

    /// `a · b`. Panics if the lengths differ.
    pub fn dot<T: KvElem>(self, a: &[f32], b: &[T]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot: length mismatch");
        match self.level {
            // SAFETY: a Simd of this level exists only if detection found its features.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512::dot(a, b) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2::dot(a, b) },
            _ => scalar::dot(a, b),
        }
    }

    /// `acc += w * x`. Panics if the lengths differ.
    pub fn axpy<T: KvElem>(self, acc: &mut [f32], w: f32, x: &[T]) {
        assert_eq!(acc.len(), x.len(), "axpy: length mismatch");
        match self.level {
            // SAFETY: a Simd of this level exists only if detection found its features.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512::axpy(acc, w, x) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2::axpy(acc, w, x) },
            _ => scalar::axpy(acc, w, x),
        }
    }

    /// Sum of `x`.
    pub fn sum(self, x: &[f32]) -> f32 {
        match self.level {
            // SAFETY: a Simd of this level exists only if detection found its features.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512::sum(x) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2::sum(x) },
            _ => scalar::sum(x),
        }
    }

    /// Largest element of `x` (`-inf` when empty).
    pub fn max(self, x: &[f32]) -> f32 {
        match self.level {
            // SAFETY: a Simd of this level exists only if detection found its features.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512::max(x) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2::max(x) },
            _ => scalar::max(x),
        }
    }

    /// `x *= c`.
    pub fn scale(self, x: &mut [f32], c: f32) {
        match self.level {
            // SAFETY: a Simd of this level exists only if detection found its features.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512::scale(x, c) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2::scale(x, c) },
            _ => scalar::scale(x, c),
        }
    }

    /// `x[i] = exp(x[i] - shift)`; returns the sum of the new values. Meant for `shift` at
    /// least the largest `x[i]`, as a softmax takes it: the vector levels clamp exponents
    /// above 88.37 (the scalar level gives up to inf there).
    pub fn exp_shifted(self, x: &mut [f32], shift: f32) -> f32 {
        match self.level {
            // SAFETY: a Simd of this level exists only if detection found its features.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512::exp_shifted(x, shift) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2::exp_shifted(x, shift) },
            _ => scalar::exp_shifted(x, shift),
        }
    }

    /// Attention scores of a group of query heads against a block of keys:
    /// `scores[h][t] = scale * (q[h] · keys[t])`, with `q` as `[heads][dim]`, `keys` as
    /// `[tokens][dim]` and `scores` as `[heads][tokens]`. `ahead` (any length, may be empty)
    /// is the next block of keys, fetched into cache along the way. Panics on inconsistent
    /// lengths.
    pub fn group_scores<T: KvElem>(
        self,
        q: &[f32],
        keys: &[T],
        dim: usize,
        scale: f32,
        scores: &mut [f32],
        ahead: &[T],
    ) {
        assert!(dim > 0 && q.len().is_multiple_of(dim) && keys.len().is_multiple_of(dim));
        assert_eq!(scores.len(), q.len() / dim * (keys.len() / dim));
        match self.level {
            // SAFETY: a Simd of this level exists only if detection found its features.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512::group_scores(q, keys, dim, scale, scores, ahead) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2::group_scores(q, keys, dim, scale, scores, ahead) },
            _ => scalar::group_scores(q, keys, dim, scale, scores),
        }
        if self.level == Level::Scalar {
            prefetch(ahead);
        }
    }

    /// Weighted sum of a block of values into a group of accumulators:
    /// `acc[h] += sum_t probs[h][t] * values[t]`, with `probs` as `[heads][tokens]`, `values`
    /// as `[tokens][dim]` and `acc` as `[heads][dim]`. `ahead` (any length, may be empty) is
    /// the next block of values, fetched into cache along the way. Panics on inconsistent
    /// lengths.
    pub fn group_accumulate<T: KvElem>(
        self,
        probs: &[f32],
        values: &[T],
        dim: usize,
        acc: &mut [f32],
        ahead: &[T],
    ) {
        assert!(dim > 0 && acc.len().is_multiple_of(dim) && values.len().is_multiple_of(dim));
        assert_eq!(probs.len(), acc.len() / dim * (values.len() / dim));
        match self.level {
            // SAFETY: a Simd of this level exists only if detection found its features.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512::group_accumulate(probs, values, dim, acc, ahead) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2::group_accumulate(probs, values, dim, acc, ahead) },
            _ => scalar::group_accumulate(probs, values, dim, acc),
        }
        if self.level == Level::Scalar {
            prefetch(ahead);
        }
    }
}

/// `a · b` with the widest detected instruction set. Panics if the lengths differ.
pub fn dot<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    Simd::detect().dot(a, b)
}

/// `acc += w * x` with the widest detected instruction set. Panics if the lengths differ.
pub fn axpy<T: KvElem>(acc: &mut [f32], w: f32, x: &[T]) {
    Simd::detect().axpy(acc, w, x)
}

/// Whether attention over a bf16 (or, in prefill, fp8) pool runs its products on bf16 pairs
/// (`vdpbf16ps`: `prefill_pairs.rs`, `decode_pairs.rs`): AVX-512 with BF16 on an AMD core, within
/// `VORTEX_MAX_ISA`. Zen 4 runs a 512-bit `vdpbf16ps` at the rate of a 512-bit multiply-add, with
/// twice its products; a Sapphire Rapids Xeon's two 512-bit multiply-add ports match it, and
/// there the pairs measured 1.2-1.7x slower in prefill and 0-5% slower in decode.
pub fn bf16_pairs() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMD_BF16: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let cpu = *AMD_BF16.get_or_init(|| {
            let id = std::arch::x86_64::__cpuid(0);
            let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
            vendor == b"AuthenticAMD"
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512bf16")
        });
        cpu && max_isa() >= MaxIsa::Avx512Bf16
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Starts loading `data` into the cache ahead of use: a hint that never changes results.
#[inline]
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        const CACHE_LINE: usize = 64;
        let start = data.as_ptr() as usize & !(CACHE_LINE - 1);
        let end = data.as_ptr() as usize + std::mem::size_of_val(data);
        for line in (start..end).step_by(CACHE_LINE) {
            // Into L2 only: an L1 prefetch would hold one of the few L1 miss buffers.
            // SAFETY: a prefetch never faults; the line overlaps `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Prefetches `data[start..start + len]`, clipped to `data`.
#[inline]
pub(crate) fn prefetch_part<T>(data: &[T], start: usize, len: usize) {
    let end = (start + len).min(data.len());
    if start < end {
        prefetch(&data[start..end]);
    }
}

/// What the attention loops' raw fp8 widening leaves out: it gives the bytes' values divided
/// by this, and the loops fold the factor into their scale and probabilities (a power of two,
/// so every result comes out bit for bit the same while no product or sum leaves f32's normal
/// range, as none does at the magnitudes of keys, values and queries).
pub const FP8_RAW_FACTOR: f32 = 256.0;

/// The factor a loop that widens `T` raw (`RAW`) folds in: [`FP8_RAW_FACTOR`] for fp8, else 1.
const fn raw_factor<T: KvElem, const RAW: bool>() -> f32 {
    if RAW && matches!(T::DTYPE, KvDtype::Fp8) {
        FP8_RAW_FACTOR
    } else {
        1.0
    }
}

/// Whether the attention loops may widen `x` raw: fp8 without a NaN byte, which the raw
/// widening would read as 480.
pub fn raw_fp8<T: KvElem>(x: &[T]) -> bool {
    let Some(values) = T::as_fp8(x) else {
        return false;
    };
    // With the sign bit set, the NaN byte is 0xff, the largest there is; the fold vectorises.
    !values
        .chunks(256)
        .any(|c| c.iter().fold(0x80u8, |m, b| m.max(b.0 | 0x80)) == 0xff)
}

/// Eight fp8 e4m3 values at `p` widened to f32, the NaN byte as NaN.
///
/// # Safety
/// `p` must be valid for reading eight bytes, and the CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
pub unsafe fn fp8x8_to_f32(p: *const vortex_kv::F8E4M3) -> core::arch::x86_64::__m256 {
    // SAFETY: the caller guarantees the eight bytes and the CPU features.
    unsafe { avx2::fp8_to_f32(core::arch::x86_64::_mm_loadl_epi64(p.cast())) }
}

/// Eight fp8 e4m3 values at `p` widened to f32 divided by [`FP8_RAW_FACTOR`], in fewer
/// instructions; the NaN byte reads as 480 / [`FP8_RAW_FACTOR`] (see [`raw_fp8`]).
///
/// # Safety
/// `p` must be valid for reading eight bytes, and the CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
pub unsafe fn fp8x8_to_f32_raw(p: *const vortex_kv::F8E4M3) -> core::arch::x86_64::__m256 {
    // SAFETY: the caller guarantees the eight bytes and the CPU features.
    unsafe { avx2::fp8_to_f32_raw(core::arch::x86_64::_mm_loadl_epi64(p.cast())) }
}

mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

#[cfg(test)]
mod tests;
