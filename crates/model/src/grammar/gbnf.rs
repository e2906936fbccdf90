//! The text of a context-free grammar in GBNF (llama.cpp's grammars, vLLM's `grammar`): rules
//! `name ::= alternatives`, whose sequences hold quoted literals, character classes (`[a-z]`,
//! `[^"]`), `.` (any character), rule names, groups in parentheses and the repeats `*`, `+`, `?`,
//! `{m}`, `{m,}` and `{m,n}`; `#` begins a comment. Whitespace, newlines included, only
//! separates: a rule ends where the next `name ::=` begins.

use super::schema::SchemaError;

/// Bytes of a grammar's text.
pub const MAX_GBNF_BYTES: usize = 64 << 10;
/// The largest count of a repeat.
pub const MAX_REPEAT: u32 = 10_000;
const MAX_NESTING: usize = 64;
/// Repeats one after another on one term (`"a"?*`).
const MAX_REPEATS_IN_A_ROW: usize = 8;

/// One part of a rule's right-hand side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// One character in these ranges of code points.
    Chars(Vec<(u32, u32)>),
    /// These characters one after another.
    Literal(Vec<u32>),
    Ref(String),
    Seq(Vec<Expr>),
    Alt(Vec<Expr>),
    Repeat(Box<Expr>, u32, Option<u32>),
}

/// The rules in the order written, with the line each begins on.
pub fn parse(text: &str) -> Result<Vec<(String, Expr, usize)>, SchemaError> {
    if text.len() > MAX_GBNF_BYTES {
        return Err(SchemaError::new(
            "grammar",
            format!("at most {MAX_GBNF_BYTES} bytes"),
        ));
    }
    let mut p = Parser {
        src: text,
        text: text.as_bytes(),
        pos: 0,
        depth: 0,
    };
    let mut rules = Vec::new();
    p.space();
    while p.pos < p.text.len() {
        let line = p.line();
        let name = p
            .name()
            .ok_or_else(|| p.error("a rule's name (as in `root ::= ...`)"))?;
        p.space();
        if !p.eat(b"::=") {
            return Err(p.error("`::=` after the rule's name"));
        }
        p.space();
        let body = p.alternatives()?;
        rules.push((name, body, line));
        p.space();
    }
    Ok(rules)
}

struct Parser<'a> {
    src: &'a str,
    text: &'a [u8],
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn line(&self) -> usize {
        1 + self.text[..self.pos]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
    }

    fn error(&self, wanted: &str) -> SchemaError {
        let line_start = self.text[..self.pos]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let found = match self.text.get(self.pos..) {
            Some([]) | None => "the end".to_string(),
            Some(rest) => {
                let s = String::from_utf8_lossy(&rest[..rest.len().min(12)]).into_owned();
                format!("'{s}'")
            }
        };
        SchemaError {
            at: format!(
                "grammar line {} column {}",
                self.line(),
                self.pos - line_start + 1
            ),
            message: format!("expected {wanted}, found {found}"),
            invalid: true,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn eat(&mut self, s: &[u8]) -> bool {
        let ok = self.text[self.pos..].starts_with(s);
        if ok {
            self.pos += s.len();
        }
        ok
    }

    /// Whitespace and comments.
    fn space(&mut self) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' | b'\r' | b'\n' => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| String::from_utf8_lossy(&self.text[start..self.pos]).into())
    }

    /// Whether a new rule (`name ::=`) begins here.
    fn at_rule(&mut self) -> bool {
        let start = self.pos;
        let found = self.name().is_some() && {
            self.space();
            self.eat(b"::=")
        };
        self.pos = start;
        found
    }

    fn alternatives(&mut self) -> Result<Expr, SchemaError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(self.error(&format!("at most {MAX_NESTING} groups one in another")));
        }
        let mut alts = vec![self.sequence()?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space();
            alts.push(self.sequence()?);
        }
        self.depth -= 1;
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            Expr::Alt(alts)
        })
    }

    /// Terms up to `|`, `)`, the next rule or the end.
    fn sequence(&mut self) -> Result<Expr, SchemaError> {
        let mut terms = Vec::new();
        loop {
            match self.peek() {
                None | Some(b'|' | b')') => break,
                _ if self.at_rule() => break,
                _ => {}
            }
            let mut term = self.primary()?;
            // As llama.cpp reads them: space before a repeat, and repeats one after another.
            self.space();
            for n in 0.. {
                if !matches!(self.peek(), Some(b'*' | b'+' | b'?' | b'{')) {
                    break;
                }
                if n == MAX_REPEATS_IN_A_ROW {
                    return Err(
                        self.error(&format!("at most {MAX_REPEATS_IN_A_ROW} repeats in a row"))
                    );
                }
                term = self.repeat(term)?;
                self.space();
            }
            terms.push(term);
        }
        Ok(Expr::Seq(terms))
    }

    fn primary(&mut self) -> Result<Expr, SchemaError> {
        match self.peek() {
            Some(b'"') => {
                self.pos += 1;
                let mut chars = Vec::new();
                loop {
                    match self.peek() {
                        None | Some(b'\n') => return Err(self.error("a closing `\"`")),
                        Some(b'"') => break,
                        _ => chars.push(self.char()?),
                    }
                }
                self.pos += 1;
                Ok(Expr::Literal(chars))
            }
            Some(b'[') => {
                self.pos += 1;
                let negated = self.eat(b"^");
                let mut ranges = Vec::new();
                while self.peek() != Some(b']') {
                    if self.peek().is_none() {
                        return Err(self.error("a closing `]`"));
                    }
                    let lo = self.char()?;
                    let hi = if self.peek() == Some(b'-')
                        && self.text.get(self.pos + 1) != Some(&b']')
                    {
                        self.pos += 1;
                        self.char()?
                    } else {
                        lo
                    };
                    if hi < lo {
                        return Err(
                            self.error("a range whose first character is not after its last")
                        );
                    }
                    ranges.push((lo, hi));
                }
                self.pos += 1;
                Ok(Expr::Chars(if negated {
                    complement(ranges)
                } else {
                    ranges
                }))
            }
            Some(b'.') => {
                self.pos += 1;
                Ok(Expr::Chars(vec![(0, 0x10_ffff)]))
            }
            Some(b'(') => {
                self.pos += 1;
                self.space();
                let inner = self.alternatives()?;
                if !self.eat(b")") {
                    return Err(self.error("`)`"));
                }
                Ok(inner)
            }
            _ => match self.name() {
                Some(name) => Ok(Expr::Ref(name)),
                None => Err(self.error("a literal, a class, a rule's name or `(`")),
            },
        }
    }

    fn repeat(&mut self, term: Expr) -> Result<Expr, SchemaError> {
        let (min, max) = match self.peek() {
            Some(b'*') => (0, None),
            Some(b'+') => (1, None),
            Some(b'?') => (0, Some(1)),
            Some(b'{') => {
                self.pos += 1;
                self.space();
                let min = self.count()?;
                self.space();
                let max = if self.eat(b",") {
                    self.space();
                    let max = match self.peek() {
                        Some(b'}') => None,
                        _ => Some(self.count()?),
                    };
                    self.space();
                    max
                } else {
                    Some(min)
                };
                if self.peek() != Some(b'}') {
                    return Err(self.error("`}`"));
                }
                if max.is_some_and(|m| m < min) {
                    return Err(self.error("a repeat whose most is not below its least"));
                }
                (min, max)
            }
            _ => return Ok(term),
        };
        self.pos += 1;
        Ok(Expr::Repeat(Box::new(term), min, max))
    }

    fn count(&mut self) -> Result<u32, SchemaError> {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        std::str::from_utf8(&self.text[start..self.pos])
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|&n| n <= MAX_REPEAT)
            .ok_or_else(|| self.error(&format!("a count from 0 to {MAX_REPEAT}")))
    }

    /// One character of a literal or a class, escapes read.
    fn char(&mut self) -> Result<u32, SchemaError> {
        // The parser moves by whole characters, so `pos` is on a boundary.
        let Some(c) = self.src.get(self.pos..).and_then(|r| r.chars().next()) else {
            return Err(self.error("a character"));
        };
        self.pos += c.len_utf8();
        if c != '\\' {
            return Ok(c as u32);
        }
        let Some(e) = self.peek() else {
            return Err(self.error("an escape"));
        };
        self.pos += 1;
        let hex = |p: &mut Self, digits: usize| -> Result<u32, SchemaError> {
            let s = p.text.get(p.pos..p.pos + digits).unwrap_or(&[]);
            let v = std::str::from_utf8(s)
                .ok()
                .filter(|s| s.len() == digits && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|s| u32::from_str_radix(s, 16).ok())
                .ok_or_else(|| p.error(&format!("{digits} hex digits")))?;
            p.pos += digits;
            Ok(v)
        };
        let c = match e {
            b'n' => '\n' as u32,
            b'r' => '\r' as u32,
            b't' => '\t' as u32,
            b'\\' | b'"' | b'\'' | b'[' | b']' | b'-' | b'^' | b'/' => u32::from(e),
            b'x' => hex(self, 2)?,
            b'u' => hex(self, 4)?,
            b'U' => hex(self, 8)?,
            _ => {
                self.pos -= 1;
                return Err(self.error("an escape (one of n r t \\ \" ' [ ] - ^ / x u U)"));
            }
        };
        if char::from_u32(c).is_none() {
            return Err(self.error("an escape of a character (no surrogate, at most U+10FFFF)"));
        }
        Ok(c)
    }
}

/// The code points not in `ranges`.
fn complement(mut ranges: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    ranges.sort_unstable();
    let mut out = Vec::new();
    let mut next = 0u32;
    for (lo, hi) in ranges {
        if lo > next {
            out.push((next, lo - 1));
        }
        next = next.max(hi.saturating_add(1));
    }
    if next <= 0x10_ffff {
        out.push((next, 0x10_ffff));
    }
    out
}
