//! The inside of a JSON string, a byte at a time: UTF-8 checked across token boundaries,
//! escapes `\" \\ \/ \b \f \n \r \t \uXXXX`.

/// Where a string is after the bytes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StrAt {
    /// Between characters.
    Plain,
    /// After a backslash.
    Escape,
    /// After `\u` and `digits` hex digits (0 to 3).
    Hex { digits: u8 },
    /// After `\ud` or `\uD`: a surrogate half is not a character, so `8`-`f` may not follow.
    HexD,
    /// Inside a multi-byte character: `need` continuation bytes to come, the next one in
    /// `lo..=hi`.
    Utf8 { need: u8, lo: u8, hi: u8 },
}

/// What a byte does to a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrStep {
    Stay(StrAt),
    /// The closing quote.
    Close,
    Reject,
}

/// How keys of declared properties are written: one spelling per name, so that raw bytes
/// compare as names do (no `\u` escapes, no `\/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    Any = 0,
    Compact = 1,
}

impl StrAt {
    pub fn step(self, b: u8, spelling: Spelling) -> StrStep {
        use StrStep::{Close, Reject, Stay};
        match self {
            StrAt::Plain => match b {
                b'"' => Close,
                b'\\' => Stay(StrAt::Escape),
                0x00..=0x1f => Reject,
                0x20..=0x7f => Stay(StrAt::Plain),
                0xc2..=0xdf => Stay(utf8(1, 0x80, 0xbf)),
                0xe0 => Stay(utf8(2, 0xa0, 0xbf)),
                0xed => Stay(utf8(2, 0x80, 0x9f)),
                0xe1..=0xef => Stay(utf8(2, 0x80, 0xbf)),
                0xf0 => Stay(utf8(3, 0x90, 0xbf)),
                0xf1..=0xf3 => Stay(utf8(3, 0x80, 0xbf)),
                0xf4 => Stay(utf8(3, 0x80, 0x8f)),
                _ => Reject,
            },
            StrAt::Escape => match b {
                b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => Stay(StrAt::Plain),
                b'/' | b'u' if spelling == Spelling::Compact => Reject,
                b'/' => Stay(StrAt::Plain),
                b'u' => Stay(StrAt::Hex { digits: 0 }),
                _ => Reject,
            },
            StrAt::Hex { digits: 0 } if matches!(b, b'd' | b'D') => Stay(StrAt::HexD),
            StrAt::HexD => match b {
                b'0'..=b'7' => Stay(StrAt::Hex { digits: 2 }),
                _ => Reject,
            },
            StrAt::Hex { digits } if b.is_ascii_hexdigit() => Stay(if digits == 3 {
                StrAt::Plain
            } else {
                StrAt::Hex { digits: digits + 1 }
            }),
            StrAt::Hex { .. } => Reject,
            StrAt::Utf8 { need, lo, hi } if (lo..=hi).contains(&b) => Stay(if need == 1 {
                StrAt::Plain
            } else {
                utf8(need - 1, 0x80, 0xbf)
            }),
            StrAt::Utf8 { .. } => Reject,
        }
    }
}

fn utf8(need: u8, lo: u8, hi: u8) -> StrAt {
    StrAt::Utf8 { need, lo, hi }
}

/// What a token's bytes do to a string between characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// All of them stay inside the string, beginning this many characters.
    Inside(u32),
    /// They reach the closing quote: what follows depends on the rest of the grammar.
    Leaves,
    Invalid,
}

pub fn scan(bytes: &[u8], spelling: Spelling) -> Scan {
    let mut at = StrAt::Plain;
    let mut begun = 0;
    for &b in bytes {
        match at.step(b, spelling) {
            StrStep::Stay(next) => {
                begun += u32::from(at == StrAt::Plain);
                at = next;
            }
            StrStep::Close => return Scan::Leaves,
            StrStep::Reject => return Scan::Invalid,
        }
    }
    Scan::Inside(begun)
}
