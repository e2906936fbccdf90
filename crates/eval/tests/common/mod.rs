//! A tiny random byte-level Llama for tests: fast enough to prefill and decode in debug-free
//! test builds, with the real forward pass, KV cache and flows.

use std::sync::Arc;

use vortex_eval::rng::Rng;
use vortex_kernels::quant::GgmlType;
use vortex_model::config::{Arch, ModelConfig, RopeStyle};
use vortex_model::model::{LayerWeights, Model};
use vortex_model::tokenizer::{Tokenizer, byte_to_char};
use vortex_model::weights::{Bytes, Weight};

pub fn tiny_model(seed: u64) -> Model {
    let config = ModelConfig {
        arch: Arch::Llama,
        vocab: 256,
        hidden: 64,
        layers: 2,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 16,
        ffn: 96,
        max_positions: 4096,
        rope_theta: 10000.0,
        rope_style: RopeStyle::Halves,
        rope_scaling: None,
        rms_eps: 1e-5,
        tied_embeddings: true,
        qkv_bias: false,
        qk_norm: false,
    };
    let mut rng = Rng::new(seed);
    let mut mat = |rows: usize, cols: usize| {
        let scale = 2.0 / (cols as f32).sqrt();
        let data: Vec<u8> = (0..rows * cols)
            .flat_map(|_| (scale * (rng.unit() as f32 * 2.0 - 1.0)).to_le_bytes())
            .collect();
        Weight {
            ty: GgmlType::F32,
            rows,
            cols,
            bytes: Bytes::Owned(Arc::new(data)),
        }
    };
    let h = config.hidden;
    let embed = mat(config.vocab, h);
    let layers = (0..config.layers)
        .map(|_| LayerWeights {
            attn_norm: vec![1.0; h],
            wq: mat(64, h),
            wk: mat(32, h),
            wv: mat(32, h),
            wo: mat(h, 64),
            bias: None,
            qk_norm: None,
            ffn_norm: vec![1.0; h],
            gate: mat(config.ffn, h),
            up: mat(config.ffn, h),
            down: mat(h, config.ffn),
        })
        .collect();
    Model::new(config, embed, layers, vec![1.0; h], None)
}

/// One token per byte.
#[allow(dead_code)] // not every test file uses it
pub fn byte_tokenizer() -> Tokenizer {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..256u32)
        .map(|b| (byte_to_char(b as u8).to_string(), serde_json::json!(b)))
        .collect();
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    });
    Tokenizer::from_hf_json(&json.to_string()).unwrap()
}
