//! Instruction-set selection for the quantized kernels.

use crate::max_isa::{MaxIsa, max_isa};

/// Instruction set of an [`Isa`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IsaLevel {
    /// AVX2 kernels, with the 8-bit dot products of the 32-element formats done by AVX-512 VNNI
    /// (`vpdpbusd` on 256-bit vectors). Needs AVX-512 F, BW, VL and VNNI.
    Avx512Vnni,
    /// AVX2 kernels, with the row groups' 8-bit dot products done by AVX-VNNI (`vpdpbusd` in its
    /// VEX form, which Intel's cores without AVX-512 have). Needs AVX2, FMA, F16C and AVX-VNNI.
    AvxVnni,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// Portable Rust.
    Scalar,
}

impl IsaLevel {
    /// As `VORTEX_MAX_ISA` and the benches spell it.
    pub fn name(self) -> &'static str {
        match self {
            IsaLevel::Avx512Vnni => "avx512vnni",
            IsaLevel::AvxVnni => "avxvnni",
            IsaLevel::Avx2 => "avx2",
            IsaLevel::Scalar => "scalar",
        }
    }
}

/// A supported instruction set: it can only be obtained through detection, which is what makes
/// running its target-specific kernels sound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa {
    level: IsaLevel,
    /// Whether bf16 weights are multiplied on bf16 pairs (`dot_bf16_pairs`), their activations
    /// rounded to bf16.
    bf16_pairs: bool,
}

impl Isa {
    /// The best instruction set this CPU supports, within `VORTEX_MAX_ISA`; bf16 weights on
    /// bf16 pairs wherever the CPU has AVX-512 BF16 and the cap allows it. Unlike attention's
    /// pairs ([`simd::bf16_pairs`](crate::simd::bf16_pairs), AMD's cores alone), the weight
    /// products gain on Intel's too: a Xeon with AMX measured 1.05-1.45x at 16 and 512
    /// tokens on 2 threads, 0.95-1.1x on 16 (`BENCHMARKS.md`).
    pub fn detect() -> Self {
        let cap = max_isa();
        let isa = [
            (IsaLevel::Avx512Vnni, MaxIsa::Avx512),
            (IsaLevel::AvxVnni, MaxIsa::AvxVnni),
            (IsaLevel::Avx2, MaxIsa::Avx2),
        ]
        .into_iter()
        .filter(|&(_, needs)| needs <= cap)
        .map(|(level, _)| level)
        .find_map(Self::with_level)
        .unwrap_or_else(Self::scalar);
        match isa.with_bf16_pairs() {
            Some(pairs) if cap >= MaxIsa::Avx512Bf16 => pairs,
            _ => isa,
        }
    }

    pub fn scalar() -> Self {
        Self {
            level: IsaLevel::Scalar,
            bf16_pairs: false,
        }
    }

    /// This instruction set with bf16 weights multiplied on bf16 pairs, if the CPU has AVX-512
    /// BF16 (whatever `VORTEX_MAX_ISA` says: tests take them so).
    pub fn with_bf16_pairs(self) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        let supported = self.level != IsaLevel::Scalar
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16");
        #[cfg(not(target_arch = "x86_64"))]
        let supported = false;
        supported.then_some(Self {
            bf16_pairs: true,
            ..self
        })
    }

    /// `level`, if this CPU supports it.
    pub fn with_level(level: IsaLevel) -> Option<Self> {
        let supported = match level {
            IsaLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            IsaLevel::AvxVnni => {
                Self::with_level(IsaLevel::Avx2).is_some() && is_x86_feature_detected!("avxvnni")
            }
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx512Vnni => {
                Self::with_level(IsaLevel::Avx2).is_some()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        };
        supported.then_some(Self {
            level,
            bf16_pairs: false,
        })
    }

    /// Every level this CPU supports, best first, the best with bf16 pairs too where the CPU
    /// has them.
    pub fn all_supported() -> Vec<Self> {
        let levels: Vec<Self> = [
            IsaLevel::Avx512Vnni,
            IsaLevel::AvxVnni,
            IsaLevel::Avx2,
            IsaLevel::Scalar,
        ]
        .into_iter()
        .filter_map(Self::with_level)
        .collect();
        levels
            .first()
            .and_then(|best| best.with_bf16_pairs())
            .into_iter()
            .chain(levels)
            .collect()
    }

    pub fn level(self) -> IsaLevel {
        self.level
    }

    /// Whether bf16 weights are multiplied on bf16 pairs, their activations rounded to bf16.
    pub fn bf16_pairs(self) -> bool {
        self.bf16_pairs
    }
}
