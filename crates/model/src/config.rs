//! A model's architecture and shape, read from GGUF metadata or a Hugging Face `config.json`.

use serde_json::Value;

/// The decoder families this runtime implements (one implementation, switched by these flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

impl Arch {
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        match name {
            "llama" | "mistral" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            other => Err(ConfigError(format!(
                "unsupported architecture '{other}' (supported: llama, qwen2, qwen3)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// How query/key pairs are rotated: adjacent channels `(2i, 2i+1)` (llama.cpp's layout for
/// llama-family GGUF files, whose Q/K weights are stored permuted) or halves `(i, i + d/2)`
/// (Hugging Face's `rotate_half`, and GGUF's qwen families).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    Interleaved,
    Halves,
}

/// Llama-3-style frequency scaling of RoPE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_positions: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub max_positions: usize,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rope_scaling: Option<RopeScaling>,
    pub rms_eps: f32,
    pub tied_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm of each head of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl ModelConfig {
    /// Checks that the shape is usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        for (name, v) in [
            ("vocab size", self.vocab),
            ("hidden size", self.hidden),
            ("layers", self.layers),
            ("query heads", self.heads_q),
            ("KV heads", self.heads_kv),
            ("head_dim", self.head_dim),
            ("FFN size", self.ffn),
        ] {
            if v == 0 || v > 1 << 24 {
                return err(format!("{name} {v} is out of range"));
            }
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return err(format!(
                "{} query heads are not a multiple of {} KV heads",
                self.heads_q, self.heads_kv
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return err(format!(
                "head_dim {} is odd; RoPE needs pairs",
                self.head_dim
            ));
        }
        Ok(())
    }

    /// From a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self, ConfigError> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| ConfigError(format!("config.json is not valid JSON: {e}")))?;
        let arch = Arch::parse(
            v.get("model_type")
                .and_then(Value::as_str)
                .ok_or_else(|| ConfigError("config.json has no \"model_type\"".into()))?,
        )?;
        let num = |k: &str| -> Result<usize, ConfigError> {
            v.get(k)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| {
                    ConfigError(format!(
                        "config.json: \"{k}\" is missing or not a whole number"
                    ))
                })
        };
        let float = |k: &str, default: f64| v.get(k).and_then(Value::as_f64).unwrap_or(default);
        let heads_q = num("num_attention_heads")?;
        let hidden = num("hidden_size")?;
        let head_dim = match v.get("head_dim").and_then(Value::as_u64) {
            Some(d) => d as usize,
            None if heads_q > 0 => hidden / heads_q,
            None => 0,
        };
        let rope_scaling = v.get("rope_scaling").and_then(|s| {
            let kind = s.get("rope_type").or_else(|| s.get("type"))?.as_str()?;
            (kind == "llama3").then(|| RopeScaling {
                factor: s.get("factor").and_then(Value::as_f64).unwrap_or(1.0) as f32,
                low_freq_factor: s
                    .get("low_freq_factor")
                    .and_then(Value::as_f64)
                    .unwrap_or(1.0) as f32,
                high_freq_factor: s
                    .get("high_freq_factor")
                    .and_then(Value::as_f64)
                    .unwrap_or(4.0) as f32,
                original_max_positions: s
                    .get("original_max_position_embeddings")
                    .and_then(Value::as_u64)
                    .unwrap_or(8192) as usize,
            })
        });
        let cfg = ModelConfig {
            arch,
            vocab: num("vocab_size")?,
            hidden,
            layers: num("num_hidden_layers")?,
            heads_q,
            heads_kv: num("num_key_value_heads").unwrap_or(heads_q),
            head_dim,
            ffn: num("intermediate_size")?,
            max_positions: num("max_position_embeddings").unwrap_or(4096),
            rope_theta: float("rope_theta", 10000.0) as f32,
            rope_style: RopeStyle::Halves,
            rope_scaling,
            rms_eps: float("rms_norm_eps", 1e-6) as f32,
            tied_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2
                || v.get("attention_bias")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            qk_norm: arch == Arch::Qwen3,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}
