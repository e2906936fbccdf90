//! Models with seeded random weights: a tiny byte-level chat model for tests of everything above
//! the forward pass, and any geometry for measuring speed without downloading weights.

use std::sync::Arc;

use vortex_kernels::quant::GgmlType;

use crate::chat::ChatTemplate;
use crate::config::{Arch, ModelConfig, RopeStyle};
use crate::loader::LoadedModel;
use crate::model::{LayerWeights, Model};
use crate::tokenizer::{Tokenizer, byte_to_char};
use crate::weights::{Bytes, Weight};

/// The tiny model's end-of-turn token (ChatML `<|im_end|>`).
pub const TINY_EOS: u32 = 257;

/// The shape of [`tiny`]: 2 layers, 4 query and 2 KV heads of width 16, bytes as tokens.
pub fn tiny_config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        vocab: 258,
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
    }
}

/// A tiny random chat model: byte tokens plus `<|im_start|>` and `<|im_end|>`, ChatML.
pub fn tiny(seed: u64) -> LoadedModel {
    let model = random_weights(tiny_config(), seed);
    let vocab: serde_json::Map<String, serde_json::Value> = (0..256u32)
        .map(|b| (byte_to_char(b as u8).to_string(), serde_json::json!(b)))
        .collect();
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [special(256, "<|im_start|>"), special(TINY_EOS, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    });
    let tokenizer = Tokenizer::from_hf_json(&json.to_string())
        .expect("the tiny tokenizer is well-formed by construction");
    LoadedModel {
        name: "tiny-random".into(),
        file_bytes: model.weight_bytes() as u64,
        weight_types: "F32".into(),
        model,
        tokenizer,
        chat: ChatTemplate::chatml(),
        stop_tokens: vec![TINY_EOS],
    }
}

/// A model of `config`'s shape with f32 weights drawn from a seeded generator, scaled so
/// activations stay in a realistic range.
pub fn random_weights(config: ModelConfig, seed: u64) -> Model {
    let mut rng = SplitMix(seed);
    let (h, d) = (config.hidden, config.head_dim);
    let (qw, kvw) = (config.heads_q * d, config.heads_kv * d);
    let mut mat = |rows: usize, cols: usize| {
        let scale = 1.0 / (cols as f32).sqrt();
        let data: Vec<u8> = (0..rows * cols)
            .flat_map(|_| (scale * rng.uniform()).to_le_bytes())
            .collect();
        Weight {
            ty: GgmlType::F32,
            rows,
            cols,
            bytes: Bytes::Owned(Arc::new(data)),
        }
    };
    let embed = mat(config.vocab, h);
    let layers = (0..config.layers)
        .map(|_| LayerWeights {
            attn_norm: vec![1.0; h],
            wq: mat(qw, h),
            wk: mat(kvw, h),
            wv: mat(kvw, h),
            wo: mat(h, qw),
            bias: None,
            qk_norm: None,
            ffn_norm: vec![1.0; h],
            gate: mat(config.ffn, h),
            up: mat(config.ffn, h),
            down: mat(h, config.ffn),
        })
        .collect();
    let lm_head = (!config.tied_embeddings).then(|| mat(config.vocab, h));
    let mut config = config;
    config.qkv_bias = false;
    config.qk_norm = false;
    Model::new(config, embed, layers, vec![1.0; h], lm_head)
}

/// A small, fast, seeded generator (SplitMix64).
struct SplitMix(u64);

impl SplitMix {
    /// Uniform in [-1, 1) scaled to unit variance.
    fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let u = (z >> 40) as f32 / (1u64 << 24) as f32;
        (u * 2.0 - 1.0) * 3f32.sqrt()
    }
}
