//! Building a [`Tokenizer`] from a [`BpeConfig`]: the vocabulary and merges validated, the
//! special-token matchers and the end-of-generation set found.

use std::collections::HashMap;
use std::sync::Mutex;

use aho_corasick::{AhoCorasick, MatchKind};

use super::{
    BpeConfig, PreTokenizer, TokenId, TokenType, Tokenizer, TokenizerError, bpe, byte_to_char,
    bytes, pretok, spm,
};

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
}
