//! `VORTEX_MAX_ISA`: the widest instruction set the CPU kernels may use, so the narrower paths
//! can be measured and tested on a wider CPU (as oneDNN's `ONEDNN_MAX_CPU_ISA` does).

use std::sync::OnceLock;

/// The widest instruction set allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MaxIsa {
    Scalar,
    Avx2,
    /// AVX2 with AVX-VNNI's 8-bit dot products (the VEX form of `vpdpbusd`), as the cores
    /// without AVX-512 of recent Intel CPUs have them.
    AvxVnni,
    /// AVX-512 without its bf16 dot products.
    Avx512,
    /// No cap: AVX-512 with its bf16 dot products where the CPU has them.
    Avx512Bf16,
}

impl MaxIsa {
    /// `avx512bf16`, `avx512`, `avxvnni`, `avx2` or `scalar`, in any case.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "avx512bf16" => Some(Self::Avx512Bf16),
            "avx512" => Some(Self::Avx512),
            "avxvnni" => Some(Self::AvxVnni),
            "avx2" => Some(Self::Avx2),
            "scalar" => Some(Self::Scalar),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512Bf16 => "avx512bf16",
            Self::Avx512 => "avx512",
            Self::AvxVnni => "avxvnni",
            Self::Avx2 => "avx2",
            Self::Scalar => "scalar",
        }
    }
}

/// The cap from `VORTEX_MAX_ISA`, read once. An unknown value is reported on stderr, once, and
/// ignored: the kernels are chosen where no error can be returned.
pub fn max_isa() -> MaxIsa {
    static CAP: OnceLock<MaxIsa> = OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("VORTEX_MAX_ISA") {
        Err(_) => MaxIsa::Avx512Bf16,
        Ok(v) => MaxIsa::parse(&v).unwrap_or_else(|| {
            eprintln!(
                "vortex: VORTEX_MAX_ISA={v:?} is none of avx512bf16, avx512, avxvnni, avx2, scalar; using \
                 the CPU's best"
            );
            MaxIsa::Avx512Bf16
        }),
    })
}
