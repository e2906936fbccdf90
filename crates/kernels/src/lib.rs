pub mod attention;
pub mod bandwidth;
pub mod max_isa;
pub mod prefill;
pub mod quant;
pub mod simd;
pub mod topk;
