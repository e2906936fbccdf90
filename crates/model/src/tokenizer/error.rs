//! Why a tokenizer could not be built.

use std::fmt;

/// Why a tokenizer could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerError {
    /// The vocabulary has no tokens.
    EmptyVocab,
    /// The vocabulary is larger than ids can address.
    VocabTooLarge(usize),
    /// `token_types` is neither empty nor as long as `tokens`.
    TokenTypesLength { tokens: usize, types: usize },
    /// A GGUF token type code that is not 1..=6.
    BadTokenType { id: usize, code: i32 },
    /// A merge rule that cannot be used (`index` is its 0-based rank).
    BadMerge {
        index: usize,
        merge: String,
        reason: &'static str,
    },
    /// A special-token id (bos/eos/...) outside the vocabulary.
    IdOutOfRange {
        what: &'static str,
        id: u32,
        vocab_size: usize,
    },
    /// The tokenizer model is not byte-level BPE (e.g. GGUF `tokenizer.ggml.model = "llama"`).
    UnsupportedModel(String),
    /// `scores` is not as long as `tokens` (SentencePiece).
    ScoresLength { tokens: usize, scores: usize },
    /// An unknown pre-tokenizer name or configuration.
    UnsupportedPreTokenizer(String),
    /// Another unsupported `tokenizer.json` feature.
    Unsupported(String),
    /// A split regex that does not compile.
    BadRegex { pattern: String, message: String },
    /// A malformed `tokenizer.json` / `tokenizer_config.json`.
    Json(String),
    /// A file could not be read.
    Io { path: String, message: String },
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerError::EmptyVocab => write!(f, "tokenizer vocabulary is empty"),
            TokenizerError::VocabTooLarge(n) => write!(f, "tokenizer vocabulary too large ({n})"),
            TokenizerError::TokenTypesLength { tokens, types } => write!(
                f,
                "tokenizer has {tokens} tokens but {types} token types (must be equal)"
            ),
            TokenizerError::BadTokenType { id, code } => {
                write!(
                    f,
                    "token {id} has unknown token type {code} (expected 1..=6)"
                )
            }
            TokenizerError::BadMerge {
                index,
                merge,
                reason,
            } => write!(f, "bad BPE merge #{index} {merge:?}: {reason}"),
            TokenizerError::IdOutOfRange {
                what,
                id,
                vocab_size,
            } => write!(
                f,
                "{what} token id {id} is outside the vocabulary (size {vocab_size})"
            ),
            TokenizerError::UnsupportedModel(m) => write!(
                f,
                "unsupported tokenizer model {m:?} (byte-level BPE, GGUF \"gpt2\", and \
                 SentencePiece BPE, \"llama\", are supported)"
            ),
            TokenizerError::ScoresLength { tokens, scores } => write!(
                f,
                "tokenizer has {tokens} tokens but {scores} scores (must be equal)"
            ),
            TokenizerError::UnsupportedPreTokenizer(m) => {
                write!(f, "unsupported pre-tokenizer: {m}")
            }
            TokenizerError::Unsupported(m) => write!(f, "unsupported tokenizer feature: {m}"),
            TokenizerError::BadRegex { pattern, message } => {
                write!(f, "bad pre-tokenizer regex {pattern:?}: {message}")
            }
            TokenizerError::Json(m) => write!(f, "bad tokenizer JSON: {m}"),
            TokenizerError::Io { path, message } => write!(f, "cannot read {path}: {message}"),
        }
    }
}

impl std::error::Error for TokenizerError {}
