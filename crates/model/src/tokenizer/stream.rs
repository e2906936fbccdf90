//! Detokenizing one token at a time, for streamed output.

use super::{TokenId, Tokenizer};

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
