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
mod build;
mod bytes;
mod config;
mod error;
mod hf;
mod pretok;
mod spm;
mod stream;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Mutex;

use aho_corasick::AhoCorasick;

pub use bytes::{byte_to_char, char_to_byte, to_byte_level};
pub use config::{BpeConfig, SpmConfig};
pub use error::TokenizerError;
pub use hf::HfTokenizerConfig;
pub use pretok::{GPT2_PATTERN, LLAMA3_PATTERN, PreTokStep, PreTokenizer, QWEN2_PATTERN};
pub use stream::StreamDecoder;

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

impl Tokenizer {
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
