//! Splits a flow's text into tokens. Newlines end statements; `#` starts a comment.

use crate::diag::{Diagnostic, Span};

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    Number(f64),
    Str(String),
    Punct(&'static str),
    Newline,
    Eof,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub tok: Tok,
    pub span: Span,
}

const PUNCTS: [&str; 17] = [
    ">=", "<=", "==", "!=", "=", ",", "(", ")", "[", "]", ":", "+", "-", "*", "/", ">", "<",
];

/// Bounds how deeply one statement can nest, so checking never exhausts the stack.
const MAX_LINE_TOKENS: usize = 400;
/// The longest flow source: real flows take a few KiB.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;
/// The longest name (suggestions for a misspelt one compare names pairwise).
const MAX_NAME_CHARS: usize = 64;

pub fn lex(src: &str) -> Result<Vec<Token>, Diagnostic> {
    if src.len() > MAX_SOURCE_BYTES {
        return Err(Diagnostic::new(Span::new(1, 1, 1), "this flow is too long")
            .expected(format!("at most {MAX_SOURCE_BYTES} bytes")));
    }
    let mut out = Vec::new();
    for (li, line) in src.lines().enumerate() {
        let line_start = out.len();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let start = i;
            let span = |len: usize| Span::new(li + 1, start + 1, len);
            if c == '#' {
                break;
            } else if c.is_whitespace() {
                i += 1;
            } else if c.is_ascii_alphabetic() || c == '_' {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                if i - start > MAX_NAME_CHARS {
                    return Err(Diagnostic::new(span(i - start), "this name is too long")
                        .expected(format!("at most {MAX_NAME_CHARS} characters")));
                }
                out.push(Token {
                    tok: Tok::Ident(chars[start..i].iter().collect()),
                    span: span(i - start),
                });
            } else if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
            {
                i = scan_number(&chars, i);
                let text: String = chars[start..i].iter().collect();
                let value = text.parse::<f64>().map_err(|_| {
                    Diagnostic::new(span(i - start), format!("'{text}' is not a number"))
                })?;
                out.push(Token {
                    tok: Tok::Number(value),
                    span: span(i - start),
                });
            } else if c == '"' {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += 1;
                }
                if i == chars.len() {
                    return Err(Diagnostic::new(span(i - start), "unterminated string")
                        .expected("a closing '\"'"));
                }
                i += 1;
                let s: String = chars[start + 1..i - 1].iter().collect();
                out.push(Token {
                    tok: Tok::Str(s),
                    span: span(i - start),
                });
            } else if let Some(p) = PUNCTS.iter().find(|p| {
                let p: Vec<char> = p.chars().collect();
                chars[i..].starts_with(&p)
            }) {
                i += p.len();
                out.push(Token {
                    tok: Tok::Punct(p),
                    span: span(p.len()),
                });
            } else {
                return Err(
                    Diagnostic::new(span(1), format!("unexpected character '{c}'"))
                        .expected("a name, a number, an operator or '#'"),
                );
            }
        }
        if out.len() - line_start > MAX_LINE_TOKENS {
            return Err(
                Diagnostic::new(Span::new(li + 1, 1, 1), "this line is too long")
                    .expected(format!("at most {MAX_LINE_TOKENS} tokens on a line")),
            );
        }
        out.push(Token {
            tok: Tok::Newline,
            span: Span::new(li + 1, chars.len() + 1, 1),
        });
    }
    let last = src.lines().count().max(1);
    out.push(Token {
        tok: Tok::Eof,
        span: Span::new(last, 1, 1),
    });
    Ok(out)
}

fn scan_number(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
        i += 1;
    }
    if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
        let mut j = i + 1;
        if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
            j += 1;
        }
        if j < chars.len() && chars[j].is_ascii_digit() {
            i = j;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
        }
    }
    i
}
