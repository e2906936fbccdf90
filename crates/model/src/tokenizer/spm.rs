//! SentencePiece BPE (GGUF `tokenizer.ggml.model = "llama"`, as in Gemma): spaces become `▁`,
//! then adjacent pieces merge, highest score first, wherever their concatenation is a token;
//! a piece left that is not a token falls back to its bytes' `<0xXX>` tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::bpe::Merges;
use super::{TokenId, TokenType};

/// SentencePiece's visible space.
pub(crate) const SPACE: char = '\u{2581}';

/// The scores and byte tokens of a SentencePiece vocabulary.
#[derive(Debug)]
pub(crate) struct Spm {
    /// Whether each token is a piece the text may be cut into (a normal or user-defined one).
    pieces: Vec<bool>,
    /// The score of each piece that merges may produce; `None` for the others (tokens that
    /// are not pieces, and pieces whose score is not finite).
    scores: Vec<Option<f32>>,
    byte_ids: [Option<TokenId>; 256],
    add_space_prefix: bool,
    /// A `tokenizer.json`'s merges: characters merge pair by pair in their order (as Hugging
    /// Face's BPE does), not by the scores.
    pairs: Option<Merges>,
}

/// A piece of the text being merged: `len` bytes from `start` (0 once merged into its left).
#[derive(Clone, Copy)]
struct Piece {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

/// A pair of adjacent pieces whose concatenation (`len` bytes) is a token of `score`.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pair {}
impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pair {
    /// Higher scores first; among equal scores, the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

/// The byte a `<0xXX>` token stands for.
pub(crate) fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    let digits = hex.len() == 2 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    digits.then(|| u8::from_str_radix(hex, 16).ok())?
}

impl Spm {
    pub(crate) fn new(
        tokens: &[String],
        types: &[TokenType],
        scores: &[f32],
        add_space_prefix: bool,
        pairs: Option<Merges>,
    ) -> Spm {
        let mut byte_ids = [None; 256];
        for (i, (t, ty)) in tokens.iter().zip(types).enumerate() {
            if *ty == TokenType::Byte
                && let Some(b) = byte_token(t)
            {
                byte_ids[b as usize].get_or_insert(i as TokenId);
            }
        }
        let pieces: Vec<bool> = types
            .iter()
            .map(|ty| matches!(ty, TokenType::Normal | TokenType::UserDefined))
            .collect();
        let scores = pieces
            .iter()
            .zip(scores)
            .map(|(&piece, &s)| (piece && s.is_finite()).then_some(s))
            .collect();
        Spm {
            pieces,
            scores,
            byte_ids,
            add_space_prefix,
            pairs,
        }
    }

    /// The bytes token `text` of kind `ty` decodes to.
    pub(crate) fn token_bytes(text: &str, ty: TokenType, out: &mut Vec<u8>) {
        match byte_token(text).filter(|_| ty == TokenType::Byte) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                for c in text.chars() {
                    let c = if c == SPACE { ' ' } else { c };
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
    }

    /// Encodes plain text (no special tokens) into `out`; where the vocabulary puts a space
    /// before text, it goes before text that `starts` one.
    pub(crate) fn encode(
        &self,
        vocab: &HashMap<String, TokenId>,
        text: &str,
        starts: bool,
        unk: Option<TokenId>,
        out: &mut Vec<TokenId>,
    ) {
        let mut s = String::with_capacity(text.len() + 3);
        if self.add_space_prefix && starts {
            s.push(SPACE);
        }
        s.extend(text.chars().map(|c| if c == ' ' { SPACE } else { c }));
        if let Some(pairs) = &self.pairs {
            // Characters without a token of their own become their bytes' tokens first.
            let mut ids = Vec::with_capacity(s.len());
            let mut buf = [0u8; 4];
            for c in s.chars() {
                match vocab.get(c.encode_utf8(&mut buf) as &str) {
                    Some(&id) => ids.push(id),
                    None => ids.extend(
                        c.encode_utf8(&mut buf)
                            .bytes()
                            .filter_map(|b| self.byte_ids[b as usize].or(unk)),
                    ),
                }
            }
            pairs.merge(&ids, out);
            return;
        }
        let mut pieces: Vec<Piece> = s
            .char_indices()
            .enumerate()
            .map(|(i, (start, c))| Piece {
                start,
                len: c.len_utf8(),
                prev: i.wrapping_sub(1),
                next: i + 1,
            })
            .collect();
        let Some(last) = pieces.last_mut() else {
            return;
        };
        last.next = NONE;
        let mut heap = BinaryHeap::new();
        let pair = |pieces: &[Piece], left: usize, right: usize| -> Option<Pair> {
            if left == NONE || right == NONE {
                return None;
            }
            let (a, b) = (pieces[left], pieces[right]);
            let len = a.len + b.len;
            let id = *vocab.get(&s[a.start..a.start + len])?;
            let score = self.scores.get(id as usize).copied().flatten()?;
            Some(Pair {
                score,
                left,
                right,
                len,
            })
        };
        for i in 1..pieces.len() {
            heap.extend(pair(&pieces, i - 1, i));
        }
        while let Some(p) = heap.pop() {
            let (a, b) = (pieces[p.left], pieces[p.right]);
            // A pair one of whose pieces has changed since it was queued.
            if a.len == 0 || b.len == 0 || a.len + b.len != p.len {
                continue;
            }
            pieces[p.left].len = p.len;
            pieces[p.left].next = b.next;
            pieces[p.right].len = 0;
            if b.next != NONE {
                pieces[b.next].prev = p.left;
            }
            heap.extend(pair(&pieces, a.prev, p.left));
            heap.extend(pair(&pieces, p.left, b.next));
        }
        let mut i = 0;
        while i != NONE {
            let piece = pieces[i];
            let text = &s[piece.start..piece.start + piece.len];
            let id = vocab
                .get(text)
                .filter(|&&id| self.pieces.get(id as usize) == Some(&true));
            match id {
                Some(&id) => out.push(id),
                None => out.extend(
                    text.bytes()
                        .filter_map(|b| self.byte_ids[b as usize].or(unk)),
                ),
            }
            i = piece.next;
        }
    }
}
