pub mod attention;
pub mod bandwidth;
pub mod max_isa;
pub mod prefill;
#[cfg(target_arch = "x86_64")]
mod prefill_pairs;
#[cfg(target_arch = "x86_64")]
mod prefill_tiles;
pub mod quant;
pub mod simd;
pub mod topk;
