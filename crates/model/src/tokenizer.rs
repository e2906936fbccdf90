//! Byte-level BPE tokenizer (GPT-2 style), as used by SmolLM2, Qwen2/2.5/3, Llama 3 and others,
//! and SentencePiece BPE, as used by Gemma (`spm.rs`).
//!
//! Build one from the data a GGUF file's `tokenizer.ggml.*` metadata holds ([`BpeConfig`],
//! [`BpeConfig::from_gguf`]) or from a Hugging Face `tokenizer.json`
//! ([`Tokenizer::from_hf_json`]). Encoding:
//!
//! 1. special / added tokens are matched verbatim (leftmost-longest) and emitted as their ids;
//! 2. the text between them is NFC-normalized when the model asks for it (Qwen2), split by the
//!    pre-tokenizer regex ([`PreTokenizer`]), and
//! 3. every piece is mapped to byte-level characters and merged by rank (with a cache).
//!
//! Decoding maps byte-level characters back to bytes; [`StreamDecoder`] does it token by token
//! for streaming and never emits a partial UTF-8 sequence.
//!
//! Nothing here panics on bad input: malformed vocabularies and merges are [`TokenizerError`]s,
//! unknown ids are skipped when decoding.

mod bpe;
mod bytes;
mod hf;
mod pretok;
mod spm;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Mutex;

use aho_corasick::{AhoCorasick, MatchKind};

pub use bytes::{byte_to_char, char_to_byte, to_byte_level};
pub use hf::HfTokenizerConfig;
pub use pretok::{GPT2_PATTERN, LLAMA3_PATTERN, PreTokStep, PreTokenizer, QWEN2_PATTERN};

/// A token id.
pub type TokenId = u32;

/// Kind of a vocabulary entry (the values of GGUF's `tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// An ordinary BPE token (1).
    Normal,
    /// The unknown token (2).
    Unknown,
    /// A control / special token such as `<|im_end|>` (3): matched verbatim when encoding with
    /// `parse_special`, skipped by `decode_with(.., skip_special = true)`.
    Control,
    /// A user-defined added token such as `<tool_call>` (4): always matched verbatim.
    UserDefined,
    /// A placeholder never produced (5).
    Unused,
    /// A byte token (6); treated like a normal token by byte-level BPE.
    Byte,
}

impl TokenType {
    /// From GGUF's integer code.
    pub fn from_gguf(code: i32) -> Option<TokenType> {
        Some(match code {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }

    /// Whether this kind is matched verbatim in input text (before BPE).
    fn is_added(self) -> bool {
        matches!(
            self,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
    }

    /// Whether `skip_special` decoding drops this kind.
    fn is_special(self) -> bool {
        matches!(self, TokenType::Control | TokenType::Unknown)
    }
}

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

/// Largest piece (in bytes) whose merge result is cached.
const CACHE_MAX_PIECE: usize = 128;
/// The cache is cleared when it reaches this many entries.
const CACHE_MAX_ENTRIES: usize = 1 << 16;

/// Byte-level BPE tokenizer. Cheap to share: `Send + Sync`, all methods take `&self`.
pub struct Tokenizer {
    tokens: Vec<String>,
    types: Vec<TokenType>,
    vocab: HashMap<String, TokenId>,
    merges: bpe::Merges,
    byte_ids: [Option<TokenId>; 256],
    /// Decoded bytes of every token: `decoded[offsets[i]..offsets[i + 1]]`.
    decoded: Vec<u8>,
    offsets: Vec<u32>,
    /// Control + user-defined tokens, matched when `parse_special`.
    specials_all: Option<(AhoCorasick, Vec<TokenId>)>,
    /// User-defined tokens only, matched when not `parse_special`.
    specials_user: Option<(AhoCorasick, Vec<TokenId>)>,
    splitter: pretok::Splitter,
    pre: PreTokenizer,
    nfc: bool,
    ignore_merges: bool,
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    eot: Option<TokenId>,
    pad: Option<TokenId>,
    unk: Option<TokenId>,
    byte_unk: Option<TokenId>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<TokenId>,
    cache: Mutex<HashMap<Box<str>, Box<[TokenId]>>>,
    /// Set for a SentencePiece vocabulary, which encodes text through it instead of the merges.
    spm: Option<spm::Spm>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("merges", &self.merges.len())
            .field("pre", &self.pre)
            .field("nfc", &self.nfc)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

/// Texts of control tokens that end a generation (besides eos / eot themselves).
const END_OF_GENERATION: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|return|>",
    "</s>",
];

fn build_matcher(
    tokens: &[String],
    ids: Vec<TokenId>,
) -> Result<Option<(AhoCorasick, Vec<TokenId>)>, TokenizerError> {
    if ids.is_empty() {
        return Ok(None);
    }
    let ac = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(ids.iter().map(|&i| tokens[i as usize].as_str()))
        .map_err(|e| TokenizerError::Unsupported(format!("special-token matcher: {e}")))?;
    Ok(Some((ac, ids)))
}

impl Tokenizer {
    /// Builds a tokenizer, validating the vocabulary and merges.
    pub fn from_bpe(config: BpeConfig) -> Result<Tokenizer, TokenizerError> {
        let BpeConfig {
            tokens,
            merges,
            mut token_types,
            pre,
            nfc,
            ignore_merges,
            bos_id,
            eos_id,
            eot_id,
            pad_id,
            unk_id,
            byte_unk_id,
            add_bos,
            add_eos,
            spm,
        } = config;
        let n = tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n >= u32::MAX as usize {
            return Err(TokenizerError::VocabTooLarge(n));
        }
        if token_types.is_empty() {
            token_types = vec![TokenType::Normal; n];
        } else if token_types.len() != n {
            return Err(TokenizerError::TokenTypesLength {
                tokens: n,
                types: token_types.len(),
            });
        }
        for (what, id) in [
            ("bos", bos_id),
            ("eos", eos_id),
            ("eot", eot_id),
            ("pad", pad_id),
            ("unk", unk_id),
            ("byte unk", byte_unk_id),
        ] {
            if let Some(id) = id
                && id as usize >= n
            {
                return Err(TokenizerError::IdOutOfRange {
                    what,
                    id,
                    vocab_size: n,
                });
            }
        }

        // Text -> id. Duplicate spellings keep the first id.
        let mut vocab: HashMap<String, TokenId> = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            vocab.entry(t.clone()).or_insert(i as TokenId);
        }

        // Single-byte tokens among the normal ones.
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let mut s = [0u8; 4];
            let key: &str = byte_to_char(b as u8).encode_utf8(&mut s);
            *slot = vocab.get(key).copied();
        }

        let spm = match spm {
            Some(c) if c.scores.len() != n => {
                return Err(TokenizerError::ScoresLength {
                    tokens: n,
                    scores: c.scores.len(),
                });
            }
            Some(c) => {
                let mut pairs = bpe::Merges::with_capacity(c.merges.len());
                for (rank, (a, b)) in c.merges.iter().enumerate() {
                    let id = |t: &str, reason| {
                        vocab.get(t).copied().ok_or(TokenizerError::BadMerge {
                            index: rank,
                            merge: format!("{a} {b}"),
                            reason,
                        })
                    };
                    let (ia, ib) = (
                        id(a, "left token not in vocabulary")?,
                        id(b, "right token not in vocabulary")?,
                    );
                    let im = id(&format!("{a}{b}"), "merged token not in vocabulary")?;
                    pairs.insert(ia, ib, rank as u32, im);
                }
                let pairs = (!c.merges.is_empty()).then_some(pairs);
                Some(spm::Spm::new(
                    &tokens,
                    &token_types,
                    &c.scores,
                    c.add_space_prefix,
                    pairs,
                ))
            }
            None => None,
        };
        if spm.is_some() && !merges.is_empty() {
            return Err(TokenizerError::Unsupported(
                "merges beside a SentencePiece vocabulary".into(),
            ));
        }
        let mut table = bpe::Merges::with_capacity(merges.len());
        for (rank, line) in merges.iter().enumerate() {
            let bad = |reason| TokenizerError::BadMerge {
                index: rank,
                merge: line.clone(),
                reason,
            };
            let (a, b) = line
                .split_once(' ')
                .ok_or_else(|| bad("expected two tokens separated by one space"))?;
            if a.is_empty() || b.is_empty() || b.contains(' ') {
                return Err(bad("expected two tokens separated by one space"));
            }
            let ia = *vocab
                .get(a)
                .ok_or_else(|| bad("left token not in vocabulary"))?;
            let ib = *vocab
                .get(b)
                .ok_or_else(|| bad("right token not in vocabulary"))?;
            let merged = format!("{a}{b}");
            let im = *vocab
                .get(merged.as_str())
                .ok_or_else(|| bad("merged token not in vocabulary"))?;
            table.insert(ia, ib, rank as u32, im);
        }

        // Decoded bytes per token.
        let mut decoded = Vec::with_capacity(n * 6);
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for (t, ty) in tokens.iter().zip(&token_types) {
            if spm.is_some() {
                spm::Spm::token_bytes(t, *ty, &mut decoded);
            } else if ty.is_added() {
                decoded.extend_from_slice(t.as_bytes());
            } else {
                bytes::token_bytes(t, &mut decoded);
            }
            let end = u32::try_from(decoded.len())
                .map_err(|_| TokenizerError::VocabTooLarge(decoded.len()))?;
            offsets.push(end);
        }

        let added: Vec<TokenId> = (0..n)
            .filter(|&i| token_types[i].is_added() && !tokens[i].is_empty())
            .map(|i| i as TokenId)
            .collect();
        let user: Vec<TokenId> = added
            .iter()
            .copied()
            .filter(|&i| token_types[i as usize] == TokenType::UserDefined)
            .collect();
        let specials_all = build_matcher(&tokens, added)?;
        let specials_user = build_matcher(&tokens, user)?;

        let pre = pre.unwrap_or(PreTokenizer::Gpt2);
        let splitter = pretok::Splitter::new(&pre)?;

        let mut eog: Vec<TokenId> = eos_id.into_iter().chain(eot_id).collect();
        for name in END_OF_GENERATION {
            if let Some(&id) = vocab.get(*name)
                && token_types[id as usize] == TokenType::Control
                && !eog.contains(&id)
            {
                eog.push(id);
            }
        }

        Ok(Tokenizer {
            tokens,
            types: token_types,
            vocab,
            merges: table,
            byte_ids,
            decoded,
            offsets,
            specials_all,
            specials_user,
            splitter,
            pre,
            nfc,
            ignore_merges,
            bos: bos_id,
            eos: eos_id,
            eot: eot_id,
            pad: pad_id,
            unk: unk_id,
            byte_unk: byte_unk_id,
            add_bos,
            add_eos,
            eog,
            cache: Mutex::new(HashMap::new()),
            spm,
        })
    }

    /// From the text of a Hugging Face `tokenizer.json` (BPE model, byte-level
    /// pre-tokenizer/decoder). bos/eos come from its post-processor when it adds them; use
    /// [`Tokenizer::from_hf_json_with_config`] to take them from `tokenizer_config.json`.
    pub fn from_hf_json(json: &str) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_bpe(hf::config_from_tokenizer_json(json, None)?)
    }

    /// From `tokenizer.json` plus `tokenizer_config.json` (bos/eos/pad/unk tokens, add_bos_token).
    pub fn from_hf_json_with_config(
        tokenizer_json: &str,
        config: &HfTokenizerConfig,
    ) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_bpe(hf::config_from_tokenizer_json(
            tokenizer_json,
            Some(config),
        )?)
    }

    /// From a `tokenizer.json` file; reads `tokenizer_config.json` beside it when present.
    pub fn from_hf_file(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let path = path.as_ref();
        let json = read_text(path)?;
        let cfg_path = path.with_file_name("tokenizer_config.json");
        if cfg_path.is_file() {
            let cfg = HfTokenizerConfig::parse(&read_text(&cfg_path)?)?;
            Tokenizer::from_hf_json_with_config(&json, &cfg)
        } else {
            Tokenizer::from_hf_json(&json)
        }
    }

    /// Number of tokens (ids are `0..vocab_size()`).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The vocabulary spelling of `id` (byte-level characters for normal tokens).
    pub fn id_to_token(&self, id: TokenId) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary spelling (`"Ġthe"`, `"<|im_end|>"`).
    pub fn token_to_id(&self, token: &str) -> Option<TokenId> {
        self.vocab.get(token).copied()
    }

    /// The kind of token `id`.
    pub fn token_type(&self, id: TokenId) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Whether `id` is a control/unknown token (dropped by `skip_special` decoding).
    pub fn is_special(&self, id: TokenId) -> bool {
        self.token_type(id).is_some_and(TokenType::is_special)
    }

    /// The bytes token `id` decodes to (not necessarily valid UTF-8 on its own).
    pub fn token_bytes(&self, id: TokenId) -> Option<&[u8]> {
        let i = id as usize;
        let (s, e) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        Some(&self.decoded[s as usize..e as usize])
    }

    pub fn bos_id(&self) -> Option<TokenId> {
        self.bos
    }
    pub fn eos_id(&self) -> Option<TokenId> {
        self.eos
    }
    pub fn eot_id(&self) -> Option<TokenId> {
        self.eot
    }
    pub fn pad_id(&self) -> Option<TokenId> {
        self.pad
    }
    pub fn unk_id(&self) -> Option<TokenId> {
        self.unk
    }
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Where `text` spells control tokens, which `encode(text, ..)` would turn into them.
    pub fn control_token_spans(&self, text: &str) -> Vec<std::ops::Range<usize>> {
        let Some((ac, ids)) = &self.specials_all else {
            return Vec::new();
        };
        ac.find_iter(text)
            .filter(|m| self.token_type(ids[m.pattern().as_usize()]) == Some(TokenType::Control))
            .map(|m| m.start()..m.end())
            .collect()
    }
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    pub fn pre_tokenizer(&self) -> &PreTokenizer {
        &self.pre
    }

    /// Tokens that end a generation: eos, eot, and control tokens such as `<|im_end|>` and
    /// `<|endoftext|>`.
    pub fn eog_ids(&self) -> &[TokenId] {
        &self.eog
    }

    /// Whether `id` ends a generation (see [`Tokenizer::eog_ids`]).
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.contains(&id)
    }

    /// Encodes `text`. Special and added tokens written in the text (`<|im_start|>`) become their
    /// ids; `add_special` adds bos/eos as the model's config asks (`add_bos` / `add_eos`).
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<TokenId> {
        self.encode_with(text, add_special, true)
    }

    /// Like [`Tokenizer::encode`]; with `parse_special = false`, control tokens written in the
    /// text are tokenized as plain text (user-defined added tokens are still matched), which is
    /// what untrusted user content should get.
    pub fn encode_with(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<TokenId> {
        self.encode_fragments(text, add_special, parse_special, true)
    }

    /// Text that continues text encoded before it (the rest of a prompt encoded in parts), as
    /// [`Tokenizer::encode_with`] without special tokens added: a SentencePiece vocabulary that
    /// puts a space before text puts none before this.
    pub fn encode_continuing(&self, text: &str, parse_special: bool) -> Vec<TokenId> {
        self.encode_fragments(text, false, parse_special, false)
    }

    /// With `starts`, the text's first fragment begins a text (a SentencePiece space prefix goes
    /// before it); fragments after a special token always do, as in llama.cpp.
    fn encode_fragments(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        starts: bool,
    ) -> Vec<TokenId> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let matcher = if parse_special {
            self.specials_all.as_ref()
        } else {
            self.specials_user.as_ref()
        };
        match matcher {
            Some((ac, ids)) => {
                let (mut last, mut starts) = (0, starts);
                for m in ac.find_iter(text) {
                    self.encode_text(&text[last..m.start()], starts, &mut out);
                    out.push(ids[m.pattern().as_usize()]);
                    (last, starts) = (m.end(), true);
                }
                self.encode_text(&text[last..], starts, &mut out);
            }
            None => self.encode_text(text, starts, &mut out),
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Plain text (no special tokens) to ids; `starts` as in `encode_fragments`.
    fn encode_text(&self, text: &str, starts: bool, out: &mut Vec<TokenId>) {
        if text.is_empty() {
            return;
        }
        if let Some(spm) = &self.spm {
            spm.encode(&self.vocab, text, starts, self.unk, out);
            return;
        }
        let text: Cow<str> = if self.nfc && !unicode_normalization::is_nfc(text) {
            use unicode_normalization::UnicodeNormalization;
            Cow::Owned(text.nfc().collect())
        } else {
            Cow::Borrowed(text)
        };
        let mut syms = Vec::new();
        for piece in self.splitter.split(&text) {
            let cacheable = piece.len() <= CACHE_MAX_PIECE;
            if cacheable {
                let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(ids) = cache.get(piece) {
                    out.extend_from_slice(ids);
                    continue;
                }
            }
            let start = out.len();
            self.encode_piece(piece, &mut syms, out);
            if cacheable {
                let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                if cache.len() >= CACHE_MAX_ENTRIES {
                    cache.clear();
                }
                cache.insert(piece.into(), out[start..].into());
            }
        }
    }

    fn encode_piece(&self, piece: &str, syms: &mut Vec<TokenId>, out: &mut Vec<TokenId>) {
        if self.ignore_merges
            && let Some(&id) = self.vocab.get(to_byte_level(piece).as_str())
        {
            out.push(id);
            return;
        }
        syms.clear();
        // A byte with no token of its own becomes the BPE model's unknown token, or is dropped
        // without one.
        syms.extend(
            piece
                .bytes()
                .filter_map(|b| self.byte_ids[b as usize].or(self.byte_unk)),
        );
        self.merges.merge(syms, out);
    }

    /// Decodes ids to text, special tokens included (like Hugging Face's `decode`). Invalid
    /// UTF-8 becomes U+FFFD; ids outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[TokenId]) -> String {
        self.decode_with(ids, false)
    }

    /// Like [`Tokenizer::decode`]; `skip_special` drops control tokens (`<|im_end|>`, ...).
    pub fn decode_with(&self, ids: &[TokenId], skip_special: bool) -> String {
        let mut buf = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            if let Some(b) = self.token_bytes(id) {
                buf.extend_from_slice(b);
            }
        }
        match String::from_utf8(buf) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// A streaming decoder for one sequence (see [`StreamDecoder`]).
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder {
        StreamDecoder::new(skip_special)
    }
}

fn read_text(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|e| TokenizerError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Incremental detokenizer for streaming output.
///
/// Feed ids one at a time with [`StreamDecoder::push`]; each call returns the text that became
/// complete. Bytes of a multi-byte character split across tokens are held back until the
/// character is complete, so the output never contains broken UTF-8; byte sequences that can
/// never become valid come out as U+FFFD, exactly as [`Tokenizer::decode`] would render them.
/// The concatenation of all returned pieces plus [`StreamDecoder::finish`] equals
/// `decode_with(all_ids, skip_special)`.
///
/// The decoder holds no reference to the tokenizer, so it can live in a request's state.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    skip_special: bool,
}

impl StreamDecoder {
    pub fn new(skip_special: bool) -> StreamDecoder {
        StreamDecoder {
            pending: Vec::new(),
            skip_special,
        }
    }

    /// Adds one token; returns the newly complete text (often empty mid-character).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: TokenId) -> String {
        if self.skip_special && tokenizer.is_special(id) {
            return String::new();
        }
        if let Some(b) = tokenizer.token_bytes(id) {
            self.pending.extend_from_slice(b);
        }
        self.drain(false)
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the sequence: returns what is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    fn drain(&mut self, flush: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: from_utf8 just validated this prefix.
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &rest[valid + bad..];
                        }
                        None if flush => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = &rest[valid..];
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
        check::<StreamDecoder>();
    }
}
