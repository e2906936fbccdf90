//! Building a [`Model`] from a GGUF file or a Hugging Face folder: one set of weight roles, two
//! naming schemes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use vortex_kernels::quant::GgmlType;

use crate::config::{ModelConfig, RopeStyle};
use crate::model::{LayerWeights, Model};
use crate::safetensors::{StDtype, StTensor};
use crate::weights::{Bytes, Weight};

/// A loading failure, with enough context to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError(pub String);

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

/// Where a model's tensors come from.
pub trait TensorSource {
    /// The tensor called `name` as a `rows x cols` weight, if present.
    fn weight(&self, name: &str) -> Result<Option<Weight>, LoadError>;
}

/// The names of one layer's tensors in a naming scheme.
struct Names {
    embed: String,
    norm: String,
    head: String,
    layer: fn(usize, &str) -> String,
    /// Added to every RMSNorm weight: Hugging Face's Gemma stores `w` of `x * (1 + w)`.
    norm_shift: f32,
}

fn gguf_names() -> Names {
    Names {
        embed: "token_embd.weight".into(),
        norm: "output_norm.weight".into(),
        head: "output.weight".into(),
        layer: |l, role| {
            let t = match role {
                "attn_norm" => "attn_norm.weight",
                "q" => "attn_q.weight",
                "k" => "attn_k.weight",
                "v" => "attn_v.weight",
                "o" => "attn_output.weight",
                "bq" => "attn_q.bias",
                "bk" => "attn_k.bias",
                "bv" => "attn_v.bias",
                "q_norm" => "attn_q_norm.weight",
                "k_norm" => "attn_k_norm.weight",
                "ffn_norm" => "ffn_norm.weight",
                "post_attn_norm" => "post_attention_norm.weight",
                "post_ffn_norm" => "post_ffw_norm.weight",
                "gate" => "ffn_gate.weight",
                "up" => "ffn_up.weight",
                _ => "ffn_down.weight",
            };
            format!("blk.{l}.{t}")
        },
        norm_shift: 0.0,
    }
}

fn hf_names() -> Names {
    Names {
        embed: "model.embed_tokens.weight".into(),
        norm: "model.norm.weight".into(),
        head: "lm_head.weight".into(),
        layer: |l, role| {
            let t = match role {
                "attn_norm" => "input_layernorm.weight",
                "q" => "self_attn.q_proj.weight",
                "k" => "self_attn.k_proj.weight",
                "v" => "self_attn.v_proj.weight",
                "o" => "self_attn.o_proj.weight",
                "bq" => "self_attn.q_proj.bias",
                "bk" => "self_attn.k_proj.bias",
                "bv" => "self_attn.v_proj.bias",
                "q_norm" => "self_attn.q_norm.weight",
                "k_norm" => "self_attn.k_norm.weight",
                "ffn_norm" => "post_attention_layernorm.weight",
                "gate" => "mlp.gate_proj.weight",
                "up" => "mlp.up_proj.weight",
                _ => "mlp.down_proj.weight",
            };
            format!("model.layers.{l}.{t}")
        },
        norm_shift: 0.0,
    }
}

/// Hugging Face's names for Gemma 3, whose `post_attention_layernorm` norms the attention's
/// output rather than the FFN's input.
fn hf_gemma_names() -> Names {
    Names {
        layer: |l, role| match role {
            "ffn_norm" => format!("model.layers.{l}.pre_feedforward_layernorm.weight"),
            "post_attn_norm" => format!("model.layers.{l}.post_attention_layernorm.weight"),
            "post_ffn_norm" => format!("model.layers.{l}.post_feedforward_layernorm.weight"),
            _ => (hf_names().layer)(l, role),
        },
        norm_shift: 1.0,
        ..hf_names()
    }
}

/// Assembles a model from `src`, checking every shape against `cfg`.
fn assemble(cfg: ModelConfig, src: &dyn TensorSource, names: &Names) -> Result<Model, LoadError> {
    let req = |name: &str| -> Result<Weight, LoadError> {
        src.weight(name)?
            .ok_or_else(|| LoadError(format!("tensor '{name}' is missing")))
    };
    let shaped = |name: &str, rows: usize, cols: usize| -> Result<Weight, LoadError> {
        let w = req(name)?;
        if (w.rows, w.cols) != (rows, cols) {
            return Err(LoadError(format!(
                "tensor '{name}' is {}x{}, expected {rows}x{cols}",
                w.rows, w.cols
            )));
        }
        Ok(w)
    };
    let vector = |name: &str, len: usize| -> Result<Vec<f32>, LoadError> {
        let w = req(name)?;
        if w.rows * w.cols != len {
            return Err(LoadError(format!(
                "tensor '{name}' has {} values, expected {len}",
                w.rows * w.cols
            )));
        }
        Ok(w.to_f32())
    };
    let norm = |name: &str, len: usize| -> Result<Vec<f32>, LoadError> {
        let mut w = vector(name, len)?;
        w.iter_mut().for_each(|x| *x += names.norm_shift);
        Ok(w)
    };
    let (h, d) = (cfg.hidden, cfg.head_dim);
    let (qw, kvw) = (cfg.heads_q * d, cfg.heads_kv * d);
    let embed = shaped(&names.embed, cfg.vocab, h)?;
    // Grown as the tensors are found: the layer count comes from the file.
    let mut layers = Vec::new();
    for l in 0..cfg.layers {
        let n = |role: &str| (names.layer)(l, role);
        layers.push(LayerWeights {
            attn_norm: norm(&n("attn_norm"), h)?,
            wq: shaped(&n("q"), qw, h)?,
            wk: shaped(&n("k"), kvw, h)?,
            wv: shaped(&n("v"), kvw, h)?,
            wo: shaped(&n("o"), h, qw)?,
            bias: if cfg.qkv_bias {
                Some([
                    vector(&n("bq"), qw)?,
                    vector(&n("bk"), kvw)?,
                    vector(&n("bv"), kvw)?,
                ])
            } else {
                None
            },
            qk_norm: if cfg.qk_norm {
                Some([norm(&n("q_norm"), d)?, norm(&n("k_norm"), d)?])
            } else {
                None
            },
            ffn_norm: norm(&n("ffn_norm"), h)?,
            post_norms: if cfg.gemma.is_some() {
                Some([
                    norm(&n("post_attn_norm"), h)?,
                    norm(&n("post_ffn_norm"), h)?,
                ])
            } else {
                None
            },
            gate: shaped(&n("gate"), cfg.ffn, h)?,
            up: shaped(&n("up"), cfg.ffn, h)?,
            down: shaped(&n("down"), h, cfg.ffn)?,
        });
    }
    let final_norm = norm(&names.norm, h)?;
    let lm_head = match src.weight(&names.head)? {
        Some(w) if (w.rows, w.cols) == (cfg.vocab, h) => Some(w),
        Some(w) => {
            return Err(LoadError(format!(
                "tensor '{}' is {}x{}, expected {}x{h}",
                names.head, w.rows, w.cols, cfg.vocab
            )));
        }
        None => None,
    };
    let mut cfg = cfg;
    cfg.tied_embeddings = lm_head.is_none();
    Ok(Model::new(cfg, embed, layers, final_norm, lm_head))
}

/// A weight over raw bytes, checked against its type's block layout.
pub fn weight_from_bytes(
    name: &str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Bytes,
) -> Result<Weight, LoadError> {
    let row_bytes = ty.row_bytes(cols).ok_or_else(|| {
        LoadError(format!(
            "tensor '{name}': {cols} columns are not a multiple of the {ty} block size {}",
            ty.block_size()
        ))
    })?;
    let expected = rows * row_bytes;
    if bytes.as_slice().len() != expected {
        return Err(LoadError(format!(
            "tensor '{name}': {} bytes, expected {expected} for {rows}x{cols} {ty}",
            bytes.as_slice().len()
        )));
    }
    Ok(Weight::new(ty, rows, cols, bytes))
}

/// Tensors of a Hugging Face folder.
struct HfSource(BTreeMap<String, StTensor>);

impl TensorSource for HfSource {
    fn weight(&self, name: &str) -> Result<Option<Weight>, LoadError> {
        let Some(t) = self.0.get(name) else {
            return Ok(None);
        };
        let ty = match t.dtype {
            StDtype::F32 => GgmlType::F32,
            StDtype::F16 => GgmlType::F16,
            StDtype::Bf16 => GgmlType::BF16,
        };
        let (rows, cols) = match t.shape[..] {
            [n] => (1, n),
            [r, c] => (r, c),
            _ => {
                return Err(LoadError(format!(
                    "tensor '{name}' has shape {:?}",
                    t.shape
                )));
            }
        };
        let bytes = Bytes::Mapped {
            map: Arc::clone(&t.map),
            start: t.start,
            end: t.end,
        };
        weight_from_bytes(name, ty, rows, cols, bytes).map(Some)
    }
}

/// Loads a Hugging Face model folder (config.json and safetensors weights).
pub fn load_hf_folder(dir: &Path) -> Result<Model, LoadError> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| LoadError(format!("cannot read {}: {e}", cfg_path.display())))?;
    let cfg = ModelConfig::from_hf_json(&text).map_err(|e| LoadError(e.to_string()))?;
    debug_assert_eq!(cfg.rope_style, RopeStyle::Halves);
    let tensors = crate::safetensors::load_folder(dir).map_err(LoadError)?;
    let names = if cfg.gemma.is_some() {
        hf_gemma_names()
    } else {
        hf_names()
    };
    assemble(cfg, &HfSource(tensors), &names)
}

pub(crate) fn assemble_gguf(cfg: ModelConfig, src: &dyn TensorSource) -> Result<Model, LoadError> {
    assemble(cfg, src, &gguf_names())
}

/// A model ready to run: weights, tokenizer, chat template, and what it was loaded from.
pub struct LoadedModel {
    pub name: String,
    pub model: Model,
    pub tokenizer: crate::tokenizer::Tokenizer,
    pub chat: crate::chat::ChatTemplate,
    /// Size of the weight files on disk.
    pub file_bytes: u64,
    /// Storage types of the weights, e.g. "Q4_1 (210), Q8_0 (1), F32 (61)".
    pub weight_types: String,
    /// End-of-generation tokens beyond the tokenizer's own (from `generation_config.json`).
    pub stop_tokens: Vec<u32>,
}

/// Loads a GGUF file or a Hugging Face folder.
pub fn load(path: &Path) -> Result<LoadedModel, LoadError> {
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    if path.is_dir() {
        let model = load_hf_folder(path)?;
        let tok_path = path.join("tokenizer.json");
        let tokenizer = crate::tokenizer::Tokenizer::from_hf_file(&tok_path)
            .map_err(|e| LoadError(format!("{}: {e}", tok_path.display())))?;
        let cfg_text = std::fs::read_to_string(path.join("tokenizer_config.json")).ok();
        let cfg = cfg_text
            .as_deref()
            .map(crate::tokenizer::HfTokenizerConfig::parse)
            .transpose()
            .map_err(|e| LoadError(format!("tokenizer_config.json: {e}")))?
            .unwrap_or_default();
        // Newer transformers write the template to a file of its own, which comes first.
        let own_file = std::fs::read_to_string(path.join("chat_template.jinja")).ok();
        let stored = own_file
            .as_deref()
            .or(cfg.chat_template.as_deref())
            .filter(|s| !s.trim().is_empty());
        let chat = crate::chat::ChatTemplate::from_model(
            stored.or(crate::chat::fallback_template(&tokenizer)),
            cfg.bos_token.as_deref().unwrap_or(""),
            cfg.eos_token.as_deref().unwrap_or(""),
        )
        .map_err(|e| LoadError(format!("chat template: {e}")))?;
        let file_bytes = std::fs::read_dir(path)
            .map_err(|e| LoadError(e.to_string()))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
            .filter_map(|e| e.metadata().ok().map(|m| m.len()))
            .sum();
        let weight_types = describe_types(&model);
        let stop_tokens = generation_stop_tokens(path)?;
        return Ok(LoadedModel {
            name,
            model,
            tokenizer,
            chat,
            file_bytes,
            weight_types,
            stop_tokens,
        });
    }
    if !path.exists() {
        return Err(LoadError(format!("{} does not exist", path.display())));
    }
    let file = Arc::new(crate::gguf::GgufFile::open(path)?);
    warm(file.bytes(), &name);
    let cfg = ModelConfig::from_gguf(&file)?;
    let tokenizer = crate::gguf_model::gguf_tokenizer(&file)?;
    if tokenizer.vocab_size() < cfg.vocab {
        return Err(LoadError(format!(
            "the tokenizer has {} tokens but the model's vocabulary is {}",
            tokenizer.vocab_size(),
            cfg.vocab
        )));
    }
    let chat = crate::gguf_model::gguf_chat_template(&file, &tokenizer)?;
    let model = assemble_gguf(cfg, &crate::gguf_model::GgufSource(Arc::clone(&file)))?;
    let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let weight_types = describe_types(&model);
    Ok(LoadedModel {
        name,
        model,
        tokenizer,
        chat,
        file_bytes,
        weight_types,
        stop_tokens: Vec::new(),
    })
}

/// `eos_token_id` (a number or a list) of a folder's `generation_config.json`, if it has one.
fn generation_stop_tokens(dir: &Path) -> Result<Vec<u32>, LoadError> {
    let path = dir.join("generation_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Vec::new());
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| LoadError(format!("{}: {e}", path.display())))?;
    let ids: Vec<&serde_json::Value> = match v.get("eos_token_id") {
        Some(serde_json::Value::Array(a)) => a.iter().collect(),
        Some(one) => vec![one],
        None => Vec::new(),
    };
    ids.into_iter()
        .filter(|x| !x.is_null())
        .map(|x| {
            x.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    LoadError(format!(
                        "{}: eos_token_id {x} is not a token id",
                        path.display()
                    ))
                })
        })
        .collect()
}

/// Reads the mapped weights in, with a progress bar when stderr is a terminal, so the first
/// request does not pay for page faults.
fn warm(bytes: &[u8], name: &str) {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stderr().is_terminal();
    let chunk = 8 << 20;
    let total = bytes.len().div_ceil(chunk).max(1);
    let mut sum = 0u8;
    for (i, c) in bytes.chunks(chunk).enumerate() {
        sum = c.iter().step_by(4096).fold(sum, |a, &b| a.wrapping_add(b));
        if tty {
            let done = (i + 1) * 30 / total;
            eprint!(
                "\rloading {name} [{}{}] {:>3}%",
                "#".repeat(done),
                " ".repeat(30 - done),
                (i + 1) * 100 / total
            );
            let _ = std::io::stderr().flush();
        }
    }
    std::hint::black_box(sum);
    if tty {
        eprintln!();
    }
}

fn describe_types(model: &Model) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut add = |w: &Weight| *counts.entry(w.ty.to_string()).or_default() += 1;
    add(&model.embed);
    if let Some(h) = &model.lm_head {
        add(h);
    }
    for l in &model.layers {
        for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down] {
            add(w);
        }
    }
    counts
        .iter()
        .map(|(t, n)| format!("{t} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
