//! The GPT-2 byte-to-unicode mapping used by byte-level BPE vocabularies.
//!
//! Every byte maps to a printable character: the 188 bytes that are already printable Latin-1
//! characters map to themselves, the other 68 (controls, space, DEL, NBSP, soft hyphen, ...) map
//! in byte order to U+0100..U+0143. So the space is `Ġ` (U+0120) and `\n` is `Ċ` (U+010A).

const fn printable(b: usize) -> bool {
    (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)
}

const fn build_tables() -> ([char; 256], [u8; 68]) {
    let mut to_char = ['\0'; 256];
    let mut shifted = [0u8; 68];
    let mut n = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if printable(b) {
            to_char[b] = match char::from_u32(b as u32) {
                Some(c) => c,
                None => '\0',
            };
        } else {
            to_char[b] = match char::from_u32(256 + n as u32) {
                Some(c) => c,
                None => '\0',
            };
            shifted[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    (to_char, shifted)
}

const TABLES: ([char; 256], [u8; 68]) = build_tables();

/// The character that stands for `byte` in a byte-level vocabulary.
#[inline]
pub fn byte_to_char(byte: u8) -> char {
    TABLES.0[byte as usize]
}

/// The byte a byte-level character stands for, or `None` for characters outside the mapping.
#[inline]
pub fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    if u < 256 && printable(u as usize) {
        Some(u as u8)
    } else if (256..256 + 68).contains(&u) {
        Some(TABLES.1[(u - 256) as usize])
    } else {
        None
    }
}

/// `text`'s UTF-8 bytes written as byte-level characters (how the vocabulary spells them).
pub fn to_byte_level(text: &str) -> String {
    text.bytes().map(byte_to_char).collect()
}

/// Decodes a vocabulary token to bytes the way Hugging Face's ByteLevel decoder does: each
/// character maps back to its byte; a token with any character outside the mapping is taken
/// verbatim (its UTF-8 bytes).
pub fn token_bytes(token: &str, out: &mut Vec<u8>) {
    let start = out.len();
    for c in token.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(token.as_bytes());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(char_to_byte('€'), None);
    }
}
