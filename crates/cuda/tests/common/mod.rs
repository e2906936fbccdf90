//! Shared by the GPU tests: open the device or say plainly why the test is skipped.

use std::io::Write;

use vortex_cuda::Device;
use vortex_model::config::{Arch, ModelConfig, RopeStyle};

/// Device 0, or `None` after a message on the terminal (not captured by the test harness).
pub fn device_or_skip(test: &str) -> Option<Device> {
    match Device::open(0) {
        Ok(d) => Some(d),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {e}");
            None
        }
    }
}

/// A fresh random seed, or `VORTEX_TEST_SEED` to repeat a run; printed either way.
#[allow(dead_code)]
pub fn test_seed() -> u64 {
    use rand::Rng;
    let seed = match std::env::var("VORTEX_TEST_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("VORTEX_TEST_SEED={s}: expected a u64 seed")),
        Err(_) => rand::rng().random(),
    };
    eprintln!("seed {seed}");
    seed
}

/// A decoder of Qwen3's architecture small enough for a test: 2 layers, 8 query heads over 2 KV
/// heads of 64, a vocabulary of 512.
#[allow(dead_code)]
pub fn small_qwen3() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen3,
        vocab: 512,
        hidden: 256,
        layers: 2,
        heads_q: 8,
        heads_kv: 2,
        head_dim: 64,
        ffn: 512,
        max_positions: 4096,
        rope_theta: 10000.0,
        rope_style: RopeStyle::Halves,
        rope_scaling: None,
        rope_freq_factors: None,
        rms_eps: 1e-6,
        tied_embeddings: false,
        qkv_bias: false,
        qk_norm: false,
        gemma: None,
    }
}
