pub mod attention;
pub mod bandwidth;
#[cfg(target_arch = "x86_64")]
mod decode_pairs;
pub mod max_isa;
pub mod prefill;
#[cfg(target_arch = "x86_64")]
mod prefill_pairs;
#[cfg(target_arch = "x86_64")]
mod prefill_tiles;
pub mod quant;
pub mod simd;
pub mod topk;
