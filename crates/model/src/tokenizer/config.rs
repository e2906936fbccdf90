//! What a tokenizer is built from: a GGUF file's `tokenizer.ggml.*` metadata or a Hugging
//! Face `tokenizer.json`, in one shape.

use super::{PreTokenizer, TokenId, TokenType, TokenizerError};

/// Everything needed to build a byte-level BPE tokenizer; mirrors GGUF's `tokenizer.ggml.*`.
#[derive(Clone, Debug, Default)]
pub struct BpeConfig {
    /// `tokenizer.ggml.tokens`: the token strings, indexed by id (byte-level spelling).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.merges`: `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.token_type`; empty means all [`TokenType::Normal`].
    pub token_types: Vec<TokenType>,
    /// Split rules.
    pub pre: Option<PreTokenizer>,
    /// NFC-normalize text before splitting (Qwen2's `tokenizer.json` does).
    pub nfc: bool,
    /// Use a piece that is itself in the vocabulary as one token without merging (Llama 3).
    pub ignore_merges: bool,
    pub bos_id: Option<TokenId>,
    pub eos_id: Option<TokenId>,
    /// End-of-turn token, when the model has one distinct from eos.
    pub eot_id: Option<TokenId>,
    pub pad_id: Option<TokenId>,
    pub unk_id: Option<TokenId>,
    /// What a byte without a token of its own becomes: Hugging Face's BPE `unk_token` when
    /// its `tokenizer.json` names one; without it (and in GGUF files, as in llama.cpp) the
    /// byte is dropped.
    pub byte_unk_id: Option<TokenId>,
    /// `tokenizer.ggml.add_bos_token`: prepend bos when encoding with `add_special`.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`: append eos when encoding with `add_special`.
    pub add_eos: bool,
    /// A SentencePiece vocabulary instead of byte-level BPE (then `merges` is empty).
    pub spm: Option<SpmConfig>,
}

/// What a SentencePiece BPE vocabulary adds: `tokenizer.ggml.scores` (merges producing a
/// higher score go first) and `tokenizer.ggml.add_space_prefix`; or, from a `tokenizer.json`,
/// its merges, which then decide instead of the scores, pair by pair in their order.
#[derive(Clone, Debug, Default)]
pub struct SpmConfig {
    pub scores: Vec<f32>,
    pub add_space_prefix: bool,
    pub merges: Vec<(String, String)>,
}

impl BpeConfig {
    /// A config with the given vocabulary, merges and pre-tokenizer; everything else default.
    pub fn new(tokens: Vec<String>, merges: Vec<String>, pre: PreTokenizer) -> BpeConfig {
        BpeConfig {
            tokens,
            merges,
            pre: Some(pre),
            ..BpeConfig::default()
        }
    }

    /// From GGUF metadata: `model` = `tokenizer.ggml.model` (must be `"gpt2"`), `pre` =
    /// `tokenizer.ggml.pre`, `token_types` = `tokenizer.ggml.token_type` (may be empty). The
    /// caller then sets `bos_id`, `eos_id`, `pad_id`, `unk_id`, `add_bos`, `add_eos` from the
    /// other `tokenizer.ggml.*` keys.
    ///
    /// For Qwen2's pre-tokenizer this also turns on NFC normalization (as in the model's
    /// `tokenizer.json`; llama.cpp skips it), and for Llama 3's, `ignore_merges`.
    pub fn from_gguf(
        model: &str,
        pre: Option<&str>,
        tokens: Vec<String>,
        merges: Vec<String>,
        token_types: &[i32],
    ) -> Result<BpeConfig, TokenizerError> {
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let pre = PreTokenizer::from_gguf_name(pre)?;
        let token_types = gguf_token_types(token_types)?;
        Ok(BpeConfig {
            nfc: pre == PreTokenizer::Qwen2,
            ignore_merges: pre == PreTokenizer::Llama3,
            pre: Some(pre),
            tokens,
            merges,
            token_types,
            ..BpeConfig::default()
        })
    }
}

impl BpeConfig {
    /// A SentencePiece BPE vocabulary from GGUF metadata (`tokenizer.ggml.model = "llama"`):
    /// tokens, their scores and types (may be empty), and whether a space goes before the text.
    pub fn spm_from_gguf(
        tokens: Vec<String>,
        scores: Vec<f32>,
        token_types: &[i32],
        add_space_prefix: bool,
    ) -> Result<BpeConfig, TokenizerError> {
        Ok(BpeConfig {
            tokens,
            token_types: gguf_token_types(token_types)?,
            spm: Some(SpmConfig {
                scores,
                add_space_prefix,
                merges: Vec::new(),
            }),
            ..BpeConfig::default()
        })
    }
}

fn gguf_token_types(codes: &[i32]) -> Result<Vec<TokenType>, TokenizerError> {
    codes
        .iter()
        .enumerate()
        .map(|(id, &code)| {
            TokenType::from_gguf(code).ok_or(TokenizerError::BadTokenType { id, code })
        })
        .collect()
}
