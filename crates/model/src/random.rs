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
        rope_freq_factors: None,
        rms_eps: 1e-5,
        tied_embeddings: true,
        qkv_bias: false,
        qk_norm: false,
        gemma: None,
    }
}

/// Geometries of real models, for `--random-weights NAME`.
pub const NAMED_GEOMETRIES: &[&str] = &[
    "qwen3-0.6b",
    "qwen3-1.7b",
    "qwen3-4b",
    "qwen3-8b",
    "gemma3-270m",
    "gemma3-1b",
    "gemma3-4b",
];

/// The shape of a real model by name (see [`NAMED_GEOMETRIES`]), or of a Hugging Face
/// `config.json` file.
pub fn geometry(name_or_path: &str) -> Result<ModelConfig, String> {
    // (hidden, layers, heads_q, ffn, tied embeddings); all share 8 KV heads of width 128.
    let qwen3 = |hidden, layers, heads_q, ffn, tied| ModelConfig {
        arch: Arch::Qwen3,
        vocab: 151_936,
        hidden,
        layers,
        heads_q,
        heads_kv: 8,
        head_dim: 128,
        ffn,
        max_positions: 40_960,
        rope_theta: 1_000_000.0,
        rope_style: RopeStyle::Halves,
        rope_scaling: None,
        rope_freq_factors: None,
        rms_eps: 1e-6,
        tied_embeddings: tied,
        qkv_bias: false,
        qk_norm: true,
        gemma: None,
    };
    // (vocabulary, hidden, layers, query heads, KV heads, ffn, window, context, linear RoPE
    // scaling); heads of 256, five local layers to a global one, tied embeddings.
    let gemma3 =
        |vocab, hidden, layers, heads_q, heads_kv, ffn, window, context, scaling| ModelConfig {
            arch: Arch::Gemma3,
            vocab,
            hidden,
            layers,
            heads_q,
            heads_kv,
            head_dim: 256,
            ffn,
            max_positions: context,
            rope_theta: 1_000_000.0,
            rope_style: RopeStyle::Halves,
            rope_scaling: scaling,
            rope_freq_factors: None,
            rms_eps: 1e-6,
            tied_embeddings: true,
            qkv_bias: false,
            qk_norm: true,
            gemma: Some(crate::config::Gemma3 {
                window,
                global_every: 6,
                local_rope_theta: 10_000.0,
                query_scalar: 256.0,
            }),
        };
    let linear8 = Some(crate::config::RopeScaling::Linear { factor: 8.0 });
    match name_or_path.to_ascii_lowercase().as_str() {
        "gemma3-270m" => Ok(gemma3(262_144, 640, 18, 4, 1, 2048, 512, 32_768, None)),
        "gemma3-1b" => Ok(gemma3(262_144, 1152, 26, 4, 1, 6912, 512, 32_768, None)),
        "gemma3-4b" => Ok(gemma3(
            262_208, 2560, 34, 8, 4, 10_240, 1024, 131_072, linear8,
        )),
        "qwen3-0.6b" => Ok(qwen3(1024, 28, 16, 3072, true)),
        "qwen3-1.7b" => Ok(qwen3(2048, 28, 16, 6144, true)),
        "qwen3-4b" => Ok(qwen3(2560, 36, 32, 9728, true)),
        "qwen3-8b" => Ok(qwen3(4096, 36, 32, 12288, false)),
        _ if name_or_path.ends_with(".json") => {
            let text = std::fs::read_to_string(name_or_path)
                .map_err(|e| format!("cannot read {name_or_path}: {e}"))?;
            let cfg =
                ModelConfig::from_hf_json(&text).map_err(|e| format!("{name_or_path}: {e}"))?;
            cfg.validate().map_err(|e| format!("{name_or_path}: {e}"))?;
            Ok(cfg)
        }
        other => Err(format!(
            "unknown geometry '{other}': use one of {} or a config.json file",
            NAMED_GEOMETRIES.join(", ")
        )),
    }
}

/// A tiny random chat model: byte tokens plus `<|im_start|>` and `<|im_end|>`, ChatML.
pub fn tiny(seed: u64) -> LoadedModel {
    let config = tiny_config();
    let tokenizer = byte_tokenizer(config.vocab);
    let model = random_weights(config, seed);
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

/// [`tiny`] in Gemma 3's layout: every other layer attends to the last 6 positions only.
pub fn tiny_gemma(seed: u64) -> LoadedModel {
    let config = ModelConfig {
        arch: Arch::Gemma3,
        layers: 4,
        gemma: Some(crate::config::Gemma3 {
            window: 6,
            global_every: 2,
            local_rope_theta: 100.0,
            query_scalar: 24.0,
        }),
        ..tiny_config()
    };
    let model = random_weights(config, seed);
    LoadedModel {
        name: "tiny-gemma-random".into(),
        model,
        ..tiny(seed)
    }
}

/// The random models' tokenizer over `vocab` ids: the 256 bytes, `<|im_start|>` and
/// `<|im_end|>` ([`TINY_EOS`]), then a word ` w{id}` for every other id, so that a random
/// model's every token shows as text. Text encodes to bytes only (there are no merges).
pub fn byte_tokenizer(vocab: usize) -> Tokenizer {
    let piece = |text: String| -> String { text.bytes().map(byte_to_char).collect() };
    let vocab: serde_json::Map<String, serde_json::Value> = (0..256u32)
        .map(|b| (byte_to_char(b as u8).to_string(), serde_json::json!(b)))
        .chain((TINY_EOS + 1..vocab as u32).map(|id| (piece(format!(" w{id}")), id.into())))
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
    Tokenizer::from_hf_json(&json.to_string())
        .expect("the byte tokenizer is well-formed by construction")
}

/// A model of `config`'s shape with f32 weights drawn from a seeded generator, scaled so
/// activations stay in a realistic range.
/// Bytes of the f32 matrices [`random_weights`] makes for `config` (`None`: past usize).
pub fn random_weight_bytes(config: &ModelConfig) -> Option<usize> {
    let (h, d) = (config.hidden, config.head_dim);
    let (qw, kvw) = (
        config.heads_q.checked_mul(d)?,
        config.heads_kv.checked_mul(d)?,
    );
    let per_layer = [qw, kvw, kvw, qw, config.ffn, config.ffn, config.ffn]
        .iter()
        .try_fold(0usize, |a, &rows| a.checked_add(rows.checked_mul(h)?))?;
    let tables = if config.tied_embeddings { 1 } else { 2 };
    let total = per_layer
        .checked_mul(config.layers)?
        .checked_add(config.vocab.checked_mul(h)?.checked_mul(tables)?)?;
    total.checked_mul(4)
}

pub fn random_weights(config: ModelConfig, seed: u64) -> Model {
    let mut rng = SplitMix(seed);
    let (h, d) = (config.hidden, config.head_dim);
    let (qw, kvw) = (config.heads_q * d, config.heads_kv * d);
    let mut mat = |rows: usize, cols: usize| {
        let scale = 1.0 / (cols as f32).sqrt();
        let data: Vec<u8> = (0..rows * cols)
            .flat_map(|_| (scale * rng.uniform()).to_le_bytes())
            .collect();
        Weight::new(GgmlType::F32, rows, cols, Bytes::Owned(Arc::new(data)))
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
            post_norms: config.gemma.map(|_| [vec![1.0; h], vec![1.0; h]]),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_geometries_are_the_real_shapes() {
        let g = geometry("qwen3-8b").unwrap();
        assert_eq!(
            (g.hidden, g.layers, g.heads_q, g.heads_kv, g.head_dim, g.ffn),
            (4096, 36, 32, 8, 128, 12288)
        );
        assert!(!g.tied_embeddings && g.qk_norm);
        let g = geometry("Qwen3-1.7B").unwrap();
        assert_eq!((g.hidden, g.layers, g.heads_q, g.ffn), (2048, 28, 16, 6144));
        let g = geometry("gemma3-4b").unwrap();
        assert_eq!(
            (g.hidden, g.layers, g.heads_q, g.heads_kv, g.head_dim, g.ffn),
            (2560, 34, 8, 4, 256, 10240)
        );
        assert_eq!(g.window(0), Some(1024));
        assert_eq!(g.window(5), None);
        for name in NAMED_GEOMETRIES {
            geometry(name).unwrap().validate().unwrap();
        }
        assert!(geometry("qwen9").unwrap_err().contains("unknown geometry"));
        assert!(
            geometry("/nonexistent.json")
                .unwrap_err()
                .contains("cannot read")
        );
    }

    #[test]
    fn every_id_of_a_random_vocabulary_decodes_to_text() {
        let t = byte_tokenizer(1000);
        assert_eq!(t.vocab_size(), 1000);
        assert_eq!(t.decode(&[104, 105]), "hi");
        assert_eq!(t.decode(&[999, 258]), " w999 w258");
        assert!(t.is_special(TINY_EOS));
        // Text still encodes to bytes: the words are never produced from text.
        assert_eq!(t.encode(" w999", false), b" w999".map(u32::from));
    }
}
