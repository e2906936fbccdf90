//! A model's architecture and shape, read from GGUF metadata or a Hugging Face `config.json`.

use serde_json::Value;

/// The decoder families this runtime implements (one implementation, switched by these flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
}

impl Arch {
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        match name {
            "llama" | "mistral" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "gemma3" | "gemma3_text" => Ok(Arch::Gemma3),
            other => Err(ConfigError(format!(
                "unsupported architecture '{other}' (supported: llama, qwen2, qwen3, gemma3)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
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

/// Frequency scaling of RoPE, for contexts past the trained one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Llama 3's: low frequencies divided by `factor`, high ones kept, a smooth band between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_positions: usize,
    },
    /// Every frequency divided by `factor` (Gemma 3's global layers from 4B up).
    Linear { factor: f32 },
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
    /// Divisors of each channel pair's rotation frequency, as a GGUF's `rope_freqs` tensor
    /// gives them (llama.cpp stores Llama 3.1's scaling this way).
    pub rope_freq_factors: Option<Vec<f32>>,
    pub rms_eps: f32,
    pub tied_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm of each head of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Gemma 3's layout, where the model has it.
    pub gemma: Option<Gemma3>,
}

/// What Gemma 3 does unlike the Llama layout: embeddings scaled by `sqrt(hidden)`, a norm also
/// after attention and after the FFN, a GELU (tanh) gate, queries scaled by
/// `1 / sqrt(query_scalar)`, and local layers that attend only to the last `window` positions
/// with their own RoPE base; every `global_every`-th layer attends to the whole context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma3 {
    pub window: usize,
    pub global_every: usize,
    pub local_rope_theta: f32,
    pub query_scalar: f32,
}

impl Gemma3 {
    /// Whether layer `l` attends only to its window.
    pub fn is_local(&self, l: usize) -> bool {
        !(l + 1).is_multiple_of(self.global_every)
    }
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
    /// The keys a query of layer `l` sees, its own included, where the layer slides a window
    /// over the context (Gemma 3's local layers); `None` where it sees all.
    pub fn window(&self, l: usize) -> Option<usize> {
        self.gemma.filter(|g| g.is_local(l)).map(|g| g.window)
    }

    /// The layers whose decode attention runs the flow: all but sliding-window layers.
    pub fn flow_layers(&self) -> Vec<usize> {
        (0..self.layers)
            .filter(|&l| self.window(l).is_none())
            .collect()
    }

    /// Per layer, whether its decode attention runs the flow ([`flow_layers`](Self::flow_layers)
    /// as a mask): only those layers select pages and keep their summaries.
    pub fn selecting_layers(&self) -> Vec<bool> {
        (0..self.layers).map(|l| self.window(l).is_none()).collect()
    }

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
        if self.max_positions == 0 || self.max_positions > 1 << 30 {
            return err(format!(
                "a context of {} positions is out of range",
                self.max_positions
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return err(format!(
                "rope_theta {} is not a positive number",
                self.rope_theta
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return err(format!(
                "rms_norm_eps {} is not a number at least 0",
                self.rms_eps
            ));
        }
        let positive = |x: f32| x.is_finite() && x > 0.0;
        match self.rope_scaling {
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_positions: old,
            }) if !(positive(factor)
                && positive(low)
                && positive(high)
                && low < high
                && old > 0) =>
            {
                return err(format!(
                    "RoPE scaling factor {factor}, low {low} and high {high} frequency factors, \
                     original context {old}: needs positive values, low below high"
                ));
            }
            Some(RopeScaling::Linear { factor }) if !positive(factor) => {
                return err(format!(
                    "linear RoPE scaling factor {factor} is not positive"
                ));
            }
            _ => {}
        }
        if (self.arch == Arch::Gemma3) != self.gemma.is_some() {
            return err(format!(
                "a {} model {} Gemma 3's layout",
                self.arch.name(),
                if self.gemma.is_some() {
                    "with"
                } else {
                    "without"
                }
            ));
        }
        if let Some(g) = &self.gemma
            && !(g.window > 0
                && g.global_every > 0
                && g.local_rope_theta.is_finite()
                && g.local_rope_theta > 0.0
                && g.query_scalar.is_finite()
                && g.query_scalar > 0.0)
        {
            return err(format!(
                "sliding window {}, a global layer every {}, local RoPE base {} and query \
                 scalar {}: each must be positive",
                g.window, g.global_every, g.local_rope_theta, g.query_scalar
            ));
        }
        if let Some(f) = &self.rope_freq_factors
            && (f.len() != self.head_dim / 2 || !f.iter().all(|x| x.is_finite() && *x > 0.0))
        {
            return err(format!(
                "the RoPE frequency factors are {} values, not {} positive ones",
                f.len(),
                self.head_dim / 2
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
        if v.get("text_config").is_some_and(|c| !c.is_null()) {
            return Err(ConfigError(
                "a vision-language checkpoint (config.json has a text_config): load its text \
                 model alone"
                    .into(),
            ));
        }
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
        let given = |k: &str| v.get(k).filter(|s| !s.is_null());
        let params = given("rope_scaling").or_else(|| given("rope_parameters"));
        // Newer Gemma 3 configs give the global and the local layers' RoPE apart.
        let (scaling, local_rope) = match params.and_then(|p| p.get("full_attention")) {
            Some(full) => (Some(full), params.and_then(|p| p.get("sliding_attention"))),
            None => (params, None),
        };
        let kind = scaling.map(|s| {
            s.get("rope_type")
                .or_else(|| s.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default")
        });
        if let Some(other) = kind.filter(|k| !matches!(*k, "default" | "llama3" | "linear")) {
            return Err(ConfigError(format!(
                "RoPE scaling '{other}' is not supported (default, linear and llama3 are)"
            )));
        }
        let factor = |s: &Value| s.get("factor").and_then(Value::as_f64).unwrap_or(1.0) as f32;
        let rope_scaling = scaling.and_then(|s| match kind {
            Some("linear") => Some(RopeScaling::Linear { factor: factor(s) }),
            Some("llama3") => Some(RopeScaling::Llama3 {
                factor: factor(s),
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
            }),
            _ => None,
        });
        let rope_theta = v
            .get("rope_theta")
            .or_else(|| scaling.and_then(|s| s.get("rope_theta")))
            .and_then(Value::as_f64)
            .unwrap_or(10000.0) as f32;
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
            rope_theta,
            rope_style: RopeStyle::Halves,
            rope_scaling,
            rope_freq_factors: None,
            rms_eps: float("rms_norm_eps", 1e-6) as f32,
            tied_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(arch == Arch::Gemma3),
            qkv_bias: arch == Arch::Qwen2
                || v.get("attention_bias")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
            gemma: None,
        };
        let cfg = ModelConfig {
            gemma: match arch {
                Arch::Gemma3 => Some(gemma3_from_hf(&v, local_rope, head_dim, cfg.layers)?),
                _ => None,
            },
            ..cfg
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Gemma 3's layout from its `config.json` (the text model's, `gemma3_text`).
fn gemma3_from_hf(
    v: &Value,
    local_rope: Option<&Value>,
    head_dim: usize,
    layers: usize,
) -> Result<Gemma3, ConfigError> {
    for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if v.get(key).is_some_and(|x| !x.is_null()) {
            return Err(ConfigError(format!("Gemma's {key} is not supported")));
        }
    }
    if v.get("use_bidirectional_attention")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return Err(ConfigError(
            "a Gemma 3 model with bidirectional attention (an embedding model) is not a decoder"
                .into(),
        ));
    }
    if let Some(kind) = local_rope
        .and_then(|p| p.get("rope_type"))
        .and_then(Value::as_str)
        .filter(|k| *k != "default")
    {
        return Err(ConfigError(format!(
            "RoPE scaling '{kind}' of the sliding-window layers is not supported"
        )));
    }
    if let Some(act) = v
        .get("hidden_activation")
        .and_then(Value::as_str)
        .filter(|a| *a != "gelu_pytorch_tanh")
    {
        return Err(ConfigError(format!(
            "Gemma's hidden_activation {act:?} is not supported (gelu_pytorch_tanh is)"
        )));
    }
    let global_every = match v.get("layer_types").filter(|t| !t.is_null()) {
        Some(types) => {
            let kinds = |t: &&Vec<Value>| {
                t.iter()
                    .all(|x| matches!(x.as_str(), Some("full_attention" | "sliding_attention")))
            };
            let Some(types) = types.as_array().filter(kinds) else {
                return Err(ConfigError(
                    "config.json: layer_types must list \"full_attention\" and \
                     \"sliding_attention\""
                        .into(),
                ));
            };
            let global = |l: usize| types[l].as_str() == Some("full_attention");
            let every = (0..types.len())
                .find(|&l| global(l))
                .map_or(layers + 1, |l| l + 1);
            if types.len() != layers || (0..layers).any(|l| global(l) != ((l + 1) % every == 0)) {
                return Err(ConfigError(
                    "config.json: layer_types must place a full_attention layer every n-th \
                     layer and sliding_attention between"
                        .into(),
                ));
            }
            every
        }
        None => match v.get("sliding_window_pattern").filter(|p| !p.is_null()) {
            None => 6,
            Some(p) => p.as_u64().ok_or_else(|| {
                ConfigError(format!(
                    "config.json: sliding_window_pattern {p} is not a whole number"
                ))
            })? as usize,
        },
    };
    let local_rope_theta = match local_rope
        .and_then(|p| p.get("rope_theta"))
        .or_else(|| v.get("rope_local_base_freq"))
        .filter(|t| !t.is_null())
    {
        None => 10_000.0,
        Some(t) => t.as_f64().ok_or_else(|| {
            ConfigError(format!(
                "config.json: the local RoPE base {t} is not a number"
            ))
        })? as f32,
    };
    Ok(Gemma3 {
        window: v
            .get("sliding_window")
            .and_then(Value::as_u64)
            .ok_or_else(|| {
                ConfigError(
                    "config.json: \"sliding_window\" is missing or not a whole number".into(),
                )
            })? as usize,
        global_every,
        local_rope_theta,
        query_scalar: v
            .get("query_pre_attn_scalar")
            .and_then(Value::as_f64)
            .unwrap_or(head_dim as f64) as f32,
    })
}

#[cfg(test)]
mod tests {
    use super::{ModelConfig, RopeScaling};
    use crate::layers::Rope;

    const BASE: &str = r#"{"model_type": "llama", "vocab_size": 64,
        "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 64, "rope_theta": 500000.0ROPE}"#;

    fn config(rope: &str) -> Result<ModelConfig, String> {
        ModelConfig::from_hf_json(&BASE.replace("ROPE", rope)).map_err(|e| e.0)
    }

    /// A RoPE scaling the runtime does not apply is refused rather than ignored; llama3 scales
    /// the low frequencies; a newer config's `rope_parameters` gives the theta.
    #[test]
    fn rope_scaling_is_applied_or_refused() {
        let plain = config("").unwrap();
        let llama3 = config(
            r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        let (a, b) = (Rope::new(&plain), Rope::new(&llama3));
        assert_eq!(a.inv_freq()[0], b.inv_freq()[0]);
        let last = a.inv_freq().len() - 1;
        assert!((a.inv_freq()[last] / b.inv_freq()[last] - 8.0).abs() < 1e-3);
        let linear = config(r#", "rope_scaling": {"rope_type": "linear", "factor": 8.0}"#).unwrap();
        for (x, y) in Rope::new(&plain)
            .inv_freq()
            .iter()
            .zip(Rope::new(&linear).inv_freq())
        {
            assert!((x / y - 8.0).abs() < 1e-4);
        }
        for kind in ["yarn", "dynamic"] {
            let e = config(&format!(
                r#", "rope_scaling": {{"type": "{kind}", "factor": 4.0}}"#
            ))
            .unwrap_err();
            assert!(e.contains(kind), "{e}");
        }
        let v5 = ModelConfig::from_hf_json(&BASE.replace(
            r#", "rope_theta": 500000.0ROPE"#,
            r#", "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}"#,
        ))
        .unwrap();
        assert_eq!(v5.rope_theta, 1e6);
    }

    const GEMMA: &str = r#"{"model_type": "gemma3_text", "vocab_size": 64, "hidden_size": 32,
        "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "intermediate_size": 64, "sliding_window": 8,
        "query_pre_attn_scalar": 20, "hidden_activation": "gelu_pytorch_tanh"EXTRA}"#;

    fn gemma(extra: &str) -> Result<ModelConfig, String> {
        ModelConfig::from_hf_json(&GEMMA.replace("EXTRA", extra)).map_err(|e| e.0)
    }

    /// Gemma 3's `config.json` in transformers 4's form and in 5's (`layer_types`, RoPE per
    /// kind of layer) give the same layout; what the runtime does not do is refused.
    #[test]
    fn gemma3_configs_of_both_forms() {
        let v4 = gemma(
            r#", "sliding_window_pattern": 3, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}"#,
        )
        .unwrap();
        let v5 = gemma(
            r#", "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
            "rope_theta": 1000000.0}, "sliding_attention": {"rope_type": "default",
            "rope_theta": 10000.0}}"#,
        )
        .unwrap();
        assert_eq!(v4, v5);
        // A null `rope_scaling` beside the newer form leaves it alone.
        let with_null = gemma(&format!(
            r#", "rope_scaling": null{}"#,
            r#", "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
            "rope_theta": 1000000.0}, "sliding_attention": {"rope_theta": 10000.0}}"#
        ))
        .unwrap();
        assert_eq!(with_null, v5);
        let g = v4.gemma.unwrap();
        assert_eq!((g.window, g.global_every, g.query_scalar), (8, 3, 20.0));
        assert_eq!((v4.rope_theta, g.local_rope_theta), (1e6, 1e4));
        assert_eq!(v4.rope_scaling, Some(RopeScaling::Linear { factor: 8.0 }));
        assert!(v4.tied_embeddings && v4.qk_norm);
        assert!(
            (0..6)
                .map(|l| g.is_local(l))
                .eq([true, true, false, true, true, false])
        );
        assert_eq!(v4.flow_layers(), [2, 5]);
        for (extra, why) in [
            (r#", "final_logit_softcapping": 30.0"#, "softcapping"),
            (r#", "hidden_activation": "relu""#, "hidden_activation"),
            (
                r#", "layer_types": ["sliding_attention", "full_attention", "full_attention",
                "sliding_attention", "sliding_attention", "full_attention"]"#,
                "layer_types",
            ),
            (r#", "text_config": {}"#, "vision-language"),
            (r#", "use_bidirectional_attention": true"#, "bidirectional"),
            (
                r#", "layer_types": ["sliding_attention", "chunked_attention",
                "full_attention", "sliding_attention", "sliding_attention", "full_attention"]"#,
                "layer_types",
            ),
            (
                r#", "sliding_window_pattern": -1"#,
                "sliding_window_pattern",
            ),
            (r#", "rope_local_base_freq": "x""#, "local RoPE base"),
            (
                r#", "rope_parameters": {"full_attention": {"rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "linear", "factor": 2.0}}"#,
                "sliding-window layers",
            ),
        ] {
            let e = gemma(extra).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let e = gemma(r#", "sliding_window": 0"#).unwrap_err();
        assert!(e.contains("sliding window 0"), "{e}");
    }

    /// Numbers that would turn RoPE or the norms into NaN are refused.
    #[test]
    fn rope_and_norm_numbers_are_checked() {
        let good = config("").unwrap();
        let bad: [fn(&mut ModelConfig); 7] = [
            |c| c.rope_theta = 0.0,
            |c| c.rope_theta = f32::NAN,
            |c| c.rms_eps = f32::NAN,
            |c| c.max_positions = 0,
            |c| {
                c.rope_scaling = Some(RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 4.0,
                    high_freq_factor: 4.0,
                    original_max_positions: 8192,
                })
            },
            |c| c.rope_scaling = Some(RopeScaling::Linear { factor: 0.0 }),
            |c| {
                c.rope_scaling = Some(RopeScaling::Llama3 {
                    factor: -1.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_positions: 8192,
                })
            },
        ];
        for (i, spoil) in bad.iter().enumerate() {
            let mut c = good.clone();
            spoil(&mut c);
            assert!(c.validate().is_err(), "case {i}");
        }
    }

    /// A GGUF's per-pair frequency factors divide the frequencies.
    #[test]
    fn rope_freq_factors_divide_the_frequencies() {
        let plain = config("").unwrap();
        let mut scaled = plain.clone();
        scaled.rope_freq_factors = Some((0..plain.head_dim / 2).map(|i| 1.0 + i as f32).collect());
        scaled.validate().unwrap();
        let (a, b) = (Rope::new(&plain), Rope::new(&scaled));
        for (i, (x, y)) in a.inv_freq().iter().zip(b.inv_freq()).enumerate() {
            assert!((x / y - (1.0 + i as f32)).abs() < 1e-4);
        }
        scaled.rope_freq_factors = Some(vec![1.0; 3]);
        assert!(scaled.validate().is_err());
    }
}
