//! Strings held to `pattern`, `format`, `minLength` and `maxLength`.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::{SchemaError, count, err, invalid};
use crate::grammar::pattern::Pattern;
use crate::grammar::rules::StringRule;

macro_rules! date {
    () => {
        "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    };
}
macro_rules! time {
    () => {
        "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
    };
}

/// The `format`s enforced, each as the expression its strings match whole, written with the
/// pieces of [`PIECES`]. Each takes a subset of what its standard allows where the whole would
/// not fit an expression (an e-mail address is a dot-atom at a domain name; a URI's host is no
/// IP literal in brackets; an IPv6 address ends in no IPv4 address).
const FORMATS: [(&str, &str); 10] = [
    ("date", date!()),
    ("time", time!()),
    ("date-time", concat!(date!(), "[Tt]", time!())),
    // RFC 3339 Appendix A.
    (
        "duration",
        "P(([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)(<t>)?|<t>|[0-9]+W)",
    ),
    (
        "uuid",
        "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    ),
    (
        "email",
        "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+",
    ),
    // RFC 3986: a scheme, then an authority and a path, an absolute, rootless or empty path;
    // a query; a fragment.
    (
        "uri",
        "[A-Za-z][A-Za-z0-9+.-]*:(//(<u>*@)?<r>*(:[0-9]*)?(/<p>*)*|/(<p>+(/<p>*)*)?|<p>+(/<p>*)*)?\
         (\\?(<p>|[/?])*)?(#(<p>|[/?])*)?",
    ),
    (
        "ipv4",
        "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    ),
    // RFC 1123's host name: labels of 1 to 63 letters, digits and inner hyphens (and at most
    // `HOSTNAME_CHARS` characters, a length held as `maxLength` is).
    ("hostname", "<l>(\\.<l>)*"),
    // RFC 4291's text forms, one `::` at most.
    (
        "ipv6",
        "(<h>:){7}<h>|(<h>:){1,7}:|(<h>:){1,6}:<h>|(<h>:){1,5}(:<h>){1,2}|(<h>:){1,4}(:<h>){1,3}\
         |(<h>:){1,3}(:<h>){1,4}|(<h>:){1,2}(:<h>){1,5}|<h>:(:<h>){1,6}|:(:<h>){1,7}|::",
    ),
];

/// What the formats' `<x>` stand for: RFC 3986's characters of a path segment (pchar), of a
/// user name and of a host name; an IPv6 group; a host name's label; RFC 3339's hours, minutes
/// and seconds of a duration.
const PIECES: [(&str, &str); 6] = [
    ("<p>", "([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})"),
    ("<u>", "([A-Za-z0-9._~!$&'()*+,;=:-]|%[0-9A-Fa-f]{2})"),
    ("<r>", "([A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})"),
    ("<h>", "[0-9A-Fa-f]{1,4}"),
    ("<l>", "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"),
    (
        "<t>",
        "T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)",
    ),
];

/// The most characters a host name may have (RFC 1123, as DNS holds names).
const HOSTNAME_CHARS: u32 = 253;

/// A format's expression with its pieces written out.
fn format_regex(template: &str) -> String {
    PIECES
        .iter()
        .fold(template.to_string(), |r, (piece, text)| {
            r.replace(piece, text)
        })
}

/// Bytes the automata of one schema's distinct patterns and formats may take together: each
/// is built in time about proportional to its size (some 0.3 s for 1 MiB).
const MAX_AUTOMATA_BYTES: usize = 4 << 20;

/// The automata built for one schema, each once.
#[derive(Default)]
pub(super) struct Patterns {
    built: HashMap<String, Arc<Pattern>>,
    bytes: usize,
}

impl Patterns {
    /// The automaton of a string's characters, for strings of at least `least` of them.
    fn get(
        &mut self,
        text: &str,
        regex: &str,
        least: u32,
        at: &str,
    ) -> Result<Arc<Pattern>, SchemaError> {
        let key = format!("{least} {regex}");
        self.build(&key, at, || Pattern::for_strings(text, regex, least))
    }

    /// The automaton of raw text: a value's JSON spelling.
    pub(super) fn raw(&mut self, regex: &str, at: &str) -> Result<Arc<Pattern>, SchemaError> {
        self.build(&format!("raw {regex}"), at, || Pattern::new(regex, regex))
    }

    fn build(
        &mut self,
        key: &str,
        at: &str,
        make: impl FnOnce() -> Result<Pattern, String>,
    ) -> Result<Arc<Pattern>, SchemaError> {
        if let Some(p) = self.built.get(key) {
            return Ok(p.clone());
        }
        let p = Arc::new(make().or_else(|m| err(at, m))?);
        self.bytes += p.memory();
        if self.bytes > MAX_AUTOMATA_BYTES {
            return err(
                at,
                format!(
                    "the automata of the schema's patterns and formats come to more than {} MiB",
                    MAX_AUTOMATA_BYTES >> 20
                ),
            );
        }
        self.built.insert(key.to_string(), p.clone());
        Ok(p)
    }
}

pub(super) fn string(
    obj: &Map<String, Value>,
    at: &str,
    patterns: &mut Patterns,
) -> Result<StringRule, SchemaError> {
    let (min, mut max) = (
        count(obj, "minLength", 0, at)?,
        count(obj, "maxLength", u32::MAX, at)?,
    );
    if obj.get("format").and_then(Value::as_str) == Some("hostname") {
        max = max.min(HOSTNAME_CHARS);
    }
    if min > max {
        return err(
            at,
            format!("'minLength' ({min}) is more than 'maxLength' ({max})"),
        );
    }
    let pattern = match (obj.get("pattern"), obj.get("format")) {
        (None, None) => None,
        (Some(_), Some(_)) => return err(at, "'pattern' beside 'format' is not supported"),
        (Some(Value::String(p)), None) => {
            let regex = format!("(?s:.)*(?:{})(?s:.)*", ecma(p));
            Some(patterns.get(p, &regex, min, &format!("{at}/pattern"))?)
        }
        (Some(_), None) => return invalid(&format!("{at}/pattern"), "'pattern' must be a string"),
        (None, Some(f)) => {
            let here = format!("{at}/format");
            let Some((name, regex)) = f
                .as_str()
                .and_then(|f| FORMATS.iter().find(|(name, _)| *name == f))
            else {
                let known: Vec<&str> = FORMATS.iter().map(|(n, _)| *n).collect();
                return err(
                    &here,
                    format!(
                        "the format {f} is not supported (only {})",
                        known.join(", ")
                    ),
                );
            };
            Some(patterns.get(name, &format_regex(regex), min, &here)?)
        }
    };
    if let Some(p) = &pattern
        && p.chars_to_match(p.start(), min).is_none_or(|n| n > max)
    {
        let lengths = match (min, max) {
            (0, _) => format!("at most {max}"),
            (_, u32::MAX) => format!("at least {min}"),
            _ => format!("{min} to {max}"),
        };
        return err(
            at,
            format!(
                "no string of {lengths} characters that JSON can write here meets the {}",
                if obj.contains_key("pattern") {
                    "pattern"
                } else {
                    "format"
                }
            ),
        );
    }
    Ok(StringRule { pattern, min, max })
}

/// ECMA-262's white space and line terminators, as a class.
const ECMA_SPACE: &str = "[\\t\\n\\x0B\\x0C\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}]";

/// A JSON Schema expression (ECMA-262) in Rust's syntax, for the constructs the two read
/// differently: `\d`, `\w` and `\b` are ASCII, `.` stops at any line end, and `[`, `&`, `~` are
/// plain characters inside a class.
fn ecma(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut in_class = false;
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('d') => out.push_str("[0-9]"),
                Some('D') => out.push_str("[^0-9]"),
                Some('w') => out.push_str("[0-9A-Za-z_]"),
                Some('W') => out.push_str("[^0-9A-Za-z_]"),
                Some('s') => out.push_str(ECMA_SPACE),
                Some('S') => {
                    out.push_str("[^");
                    out.push_str(&ECMA_SPACE[1..]);
                }
                Some('b') if !in_class => out.push_str("(?-u:\\b)"),
                Some('B') if !in_class => out.push_str("(?-u:\\B)"),
                Some('b') => out.push_str("\\x08"),
                Some(next) => {
                    out.push('\\');
                    out.push(next);
                }
                None => out.push('\\'),
            },
            // In ECMA's syntax `[]` matches nothing and `[^]` any character; Rust's reads the
            // `]` as a character of the class.
            '[' if !in_class && chars.as_str().starts_with(']') => {
                chars.next();
                out.push_str("[a&&b]");
            }
            '[' if !in_class && chars.as_str().starts_with("^]") => {
                chars.nth(1);
                out.push_str("(?s:.)");
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
            }
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            '[' | '&' | '~' if in_class => {
                out.push('\\');
                out.push(c);
            }
            '.' if !in_class => out.push_str("[^\\n\\r\\x{2028}\\x{2029}]"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{FORMATS, ecma, format_regex};
    use crate::grammar::pattern::Pattern;

    #[test]
    fn every_format_is_written_out_and_builds() {
        for (name, template) in FORMATS {
            let regex = format_regex(template);
            assert!(!regex.contains('<'), "{name}: {regex}");
            Pattern::for_strings(name, &regex, 0).unwrap();
        }
    }

    #[test]
    fn ecma_constructs_read_as_ecma_reads_them() {
        assert_eq!(ecma(r"^\d+$"), "^[0-9]+$");
        assert_eq!(ecma(r"[\w-]"), "[[0-9A-Za-z_]-]");
        assert_eq!(ecma(r"\bx\.y"), r"(?-u:\b)x\.y");
        assert_eq!(ecma(r"a.b"), r"a[^\n\r\x{2028}\x{2029}]b");
        assert_eq!(ecma(r"[.[&~]"), r"[.\[\&\~]");
        assert_eq!(ecma(r"\\d"), r"\\d");
        assert_eq!(ecma(r"[]a[^]"), "[a&&b]a(?s:.)");
        assert_eq!(ecma(r"[\b]"), r"[\x08]");
    }
}
