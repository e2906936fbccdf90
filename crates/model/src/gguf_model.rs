//! A model, its tokenizer and its chat template from one GGUF file.

use std::sync::Arc;

use crate::chat::{ChatTemplate, fallback_template};
use crate::config::{Arch, ConfigError, Gemma3, ModelConfig, RopeScaling, RopeStyle};
use crate::gguf::{GgufError, GgufFile};
use crate::loader::{LoadError, TensorSource, weight_from_bytes};
use crate::tokenizer::{BpeConfig, Tokenizer};
use crate::weights::{Bytes, Weight};

impl From<GgufError> for LoadError {
    fn from(e: GgufError) -> Self {
        LoadError(e.to_string())
    }
}

impl ModelConfig {
    /// From a GGUF file's `general.architecture` and `{arch}.*` metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, LoadError> {
        let arch_name = f.get_str("general.architecture")?;
        let arch = Arch::parse(arch_name).map_err(|ConfigError(m)| LoadError(m))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let usize_of = |k: &str| f.get_usize(&key(k));
        let heads_q = usize_of("attention.head_count")?;
        let hidden = usize_of("embedding_length")?;
        let vocab = match usize_of("vocab_size") {
            Ok(v) => v,
            Err(_) => f.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let head_dim = match usize_of("attention.key_length") {
            Ok(d) => d,
            Err(_) if heads_q > 0 => hidden / heads_q,
            Err(_) => {
                return Err(LoadError(format!(
                    "{} is 0: a model needs attention heads",
                    key("attention.head_count")
                )));
            }
        };
        let rope_scaling = match (
            f.get_str(&key("rope.scaling.type")),
            f.get_f32(&key("rope.scaling.factor")),
        ) {
            (Ok("linear"), Ok(factor)) => Some(RopeScaling::Linear { factor }),
            (Ok("llama3"), Ok(factor)) => Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor: f
                    .get_f32(&key("rope.scaling.low_freq_factor"))
                    .unwrap_or(1.0),
                high_freq_factor: f
                    .get_f32(&key("rope.scaling.high_freq_factor"))
                    .unwrap_or(4.0),
                original_max_positions: usize_of("rope.scaling.original_context_length")
                    .unwrap_or(8192),
            }),
            (Err(_) | Ok("none"), _) => None,
            (Ok(kind @ ("linear" | "llama3")), Err(_)) => {
                return Err(LoadError(format!(
                    "RoPE scaling '{kind}' without {}",
                    key("rope.scaling.factor")
                )));
            }
            (Ok(other), _) => {
                return Err(LoadError(format!(
                    "RoPE scaling '{other}' is not supported (none, linear and llama3 are)"
                )));
            }
        };
        let rope_freq_factors = match f.tensor("rope_freqs.weight") {
            Some(t) => Some(f.tensor_f32(t)?),
            None => None,
        };
        let cfg = ModelConfig {
            arch,
            vocab,
            hidden,
            layers: usize_of("block_count")?,
            heads_q,
            heads_kv: usize_of("attention.head_count_kv").unwrap_or(heads_q),
            head_dim,
            ffn: usize_of("feed_forward_length")?,
            max_positions: usize_of("context_length")?,
            rope_theta: f.get_f32(&key("rope.freq_base")).unwrap_or(10000.0),
            // llama.cpp stores llama-family Q/K weights permuted for adjacent-pair rotation.
            rope_style: if arch == Arch::Llama {
                RopeStyle::Interleaved
            } else {
                RopeStyle::Halves
            },
            rope_scaling,
            rope_freq_factors,
            rms_eps: f
                .get_f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            tied_embeddings: f.tensor("output.weight").is_none(),
            qkv_bias: f.tensor("blk.0.attn_q.bias").is_some(),
            qk_norm: f.tensor("blk.0.attn_q_norm.weight").is_some(),
            gemma: None,
        };
        let mut cfg = cfg;
        if arch == Arch::Gemma3 {
            cfg.gemma = Some(Gemma3 {
                window: usize_of("attention.sliding_window")?,
                // As llama.cpp: five local layers to a global one, local RoPE base 10000, and
                // queries scaled by the head size but in the 27B model (62 layers).
                global_every: usize_of("attention.sliding_window_pattern").unwrap_or(6),
                local_rope_theta: f.get_f32(&key("rope.freq_base_swa")).unwrap_or(10_000.0),
                query_scalar: if cfg.layers == 62 {
                    // Zero heads leave zero, which the check below refuses.
                    cfg.hidden.checked_div(cfg.heads_q).unwrap_or(0) as f32
                } else {
                    cfg.head_dim as f32
                },
            });
        }
        cfg.validate().map_err(|ConfigError(m)| LoadError(m))?;
        Ok(cfg)
    }
}

/// Tensors of a GGUF file, referenced in place.
pub struct GgufSource(pub Arc<GgufFile>);

impl TensorSource for GgufSource {
    fn weight(&self, name: &str) -> Result<Option<Weight>, LoadError> {
        let Some(t) = self.0.tensor(name) else {
            return Ok(None);
        };
        let ty = t.ggml_type()?;
        let (cols, rows) = match t.dims[..] {
            [c] => (c as usize, 1),
            [c, r] => (c as usize, r as usize),
            _ => return Err(LoadError(format!("tensor '{name}' has dims {:?}", t.dims))),
        };
        let start = (self.0.data_start() + t.offset) as usize;
        let bytes = Bytes::Gguf {
            file: Arc::clone(&self.0),
            start,
            end: start + t.size as usize,
        };
        weight_from_bytes(name, ty, rows, cols, bytes).map(Some)
    }
}

/// The tokenizer stored in a GGUF file.
pub fn gguf_tokenizer(f: &GgufFile) -> Result<Tokenizer, LoadError> {
    let model = f.get_str("tokenizer.ggml.model")?;
    let pre = f.get_str("tokenizer.ggml.pre").ok();
    let tokens: Vec<String> = f
        .get_str_array("tokenizer.ggml.tokens")?
        .into_iter()
        .map(str::to_string)
        .collect();
    let merges: Vec<String> = f
        .get_str_array("tokenizer.ggml.merges")
        .map(|m| m.into_iter().map(str::to_string).collect())
        .unwrap_or_default();
    let types = f
        .get_i32_array("tokenizer.ggml.token_type")
        .unwrap_or_default();
    let tok_err = |e: crate::tokenizer::TokenizerError| LoadError(format!("tokenizer: {e}"));
    let mut cfg = if model == "llama" {
        let scores = f.get_f32_array("tokenizer.ggml.scores")?;
        let space = f
            .get_bool("tokenizer.ggml.add_space_prefix")
            .unwrap_or(true);
        BpeConfig::spm_from_gguf(tokens, scores, &types, space)
    } else {
        BpeConfig::from_gguf(model, pre, tokens, merges, &types)
    }
    .map_err(tok_err)?;
    let id = |k: &str| -> Result<Option<u32>, LoadError> {
        f.get_u64(k).ok().map_or(Ok(None), |v| {
            u32::try_from(v)
                .map(Some)
                .map_err(|_| LoadError(format!("{k} {v} is not a token id")))
        })
    };
    cfg.bos_id = id("tokenizer.ggml.bos_token_id")?;
    cfg.eos_id = id("tokenizer.ggml.eos_token_id")?;
    cfg.eot_id = id("tokenizer.ggml.eot_token_id")?;
    cfg.pad_id = id("tokenizer.ggml.padding_token_id")?;
    cfg.unk_id = id("tokenizer.ggml.unknown_token_id")?;
    cfg.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").unwrap_or(false);
    cfg.add_eos = f.get_bool("tokenizer.ggml.add_eos_token").unwrap_or(false);
    Tokenizer::from_bpe(cfg).map_err(tok_err)
}

/// The chat template stored in a GGUF file, else [`fallback_template`]'s, else ChatML.
pub fn gguf_chat_template(f: &GgufFile, tok: &Tokenizer) -> Result<ChatTemplate, LoadError> {
    let name = |id: Option<u32>| {
        id.and_then(|i| tok.id_to_token(i))
            .unwrap_or("")
            .to_string()
    };
    let stored = f
        .get_str("tokenizer.chat_template")
        .ok()
        .filter(|s| !s.trim().is_empty());
    ChatTemplate::from_model(
        stored.or(fallback_template(tok)),
        &name(tok.bos_id()),
        &name(tok.eos_id()),
    )
    .map_err(|e| LoadError(format!("chat template: {e}")))
}
