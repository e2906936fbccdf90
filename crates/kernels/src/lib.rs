pub mod attention;
pub mod bandwidth;
pub mod simd;
pub mod topk;
pub mod quant;
