//! Pre-tokenization: splitting text into the pieces BPE runs on.

use super::TokenizerError;

/// GPT-2's split regex (also used, after splitting off single digits, by SmolLM/StarCoder).
pub const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Qwen2's split regex (Qwen2, Qwen2.5, Qwen3): single digits, CJK-friendly letter runs.
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's split regex (cl100k-like: digits in groups of up to three).
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is split before BPE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2: [`GPT2_PATTERN`].
    Gpt2,
    /// SmolLM / StarCoder: every digit on its own, then [`GPT2_PATTERN`].
    SmolLm,
    /// Qwen2 family: [`QWEN2_PATTERN`].
    Qwen2,
    /// Llama 3: [`LLAMA3_PATTERN`].
    Llama3,
    /// Any sequence of steps (e.g. read from a `tokenizer.json`).
    Steps(Vec<PreTokStep>),
}

/// One splitting step; each step splits every piece the previous one produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreTokStep {
    /// Every numeric character (`\p{N}`) becomes its own piece.
    IndividualDigits,
    /// Runs of numeric characters become their own pieces.
    DigitRuns,
    /// Split on a regex, keeping matches and the text between them as pieces ("Isolated").
    Regex(String),
}

/// `tokenizer.ggml.pre` names understood, with what they mean. Same grouping as llama.cpp.
const GGUF_PRE_NAMES: &[(&str, &str)] = &[
    ("default", "gpt2"),
    ("gpt2", "gpt2"),
    ("gpt-2", "gpt2"),
    ("mpt", "gpt2"),
    ("olmo", "gpt2"),
    ("jais", "gpt2"),
    ("smollm", "smollm"),
    ("starcoder", "smollm"),
    ("refact", "smollm"),
    ("command-r", "smollm"),
    ("codeshell", "smollm"),
    ("exaone", "smollm"),
    ("minerva-7b", "smollm"),
    ("qwen2", "qwen2"),
    ("deepseek-r1-qwen", "qwen2"),
    ("megrez", "qwen2"),
    ("llama3", "llama3"),
    ("llama-bpe", "llama3"),
    ("llama-v3", "llama3"),
    ("falcon3", "llama3"),
    ("falcon-h1", "llama3"),
    ("pixtral", "llama3"),
    ("dbrx", "llama3"),
    ("smaug-bpe", "llama3"),
];

impl PreTokenizer {
    /// Maps a GGUF `tokenizer.ggml.pre` value (absent: GPT-2, as llama.cpp's default).
    pub fn from_gguf_name(name: Option<&str>) -> Result<PreTokenizer, TokenizerError> {
        let Some(name) = name else {
            return Ok(PreTokenizer::Gpt2);
        };
        let kind = GGUF_PRE_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, k)| *k);
        match kind {
            Some("gpt2") => Ok(PreTokenizer::Gpt2),
            Some("smollm") => Ok(PreTokenizer::SmolLm),
            Some("qwen2") => Ok(PreTokenizer::Qwen2),
            Some("llama3") => Ok(PreTokenizer::Llama3),
            _ => Err(TokenizerError::UnsupportedPreTokenizer(format!(
                "tokenizer.ggml.pre = {name:?} (supported: {})",
                GGUF_PRE_NAMES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// The steps this pre-tokenizer runs.
    pub fn steps(&self) -> Vec<PreTokStep> {
        match self {
            PreTokenizer::Gpt2 => vec![PreTokStep::Regex(GPT2_PATTERN.into())],
            PreTokenizer::SmolLm => vec![
                PreTokStep::IndividualDigits,
                PreTokStep::Regex(GPT2_PATTERN.into()),
            ],
            PreTokenizer::Qwen2 => vec![PreTokStep::Regex(QWEN2_PATTERN.into())],
            PreTokenizer::Llama3 => vec![PreTokStep::Regex(LLAMA3_PATTERN.into())],
            PreTokenizer::Steps(s) => s.clone(),
        }
    }

    /// Recognizes the named families among step lists (so a `tokenizer.json` gets the fast path).
    pub(crate) fn canonical(steps: Vec<PreTokStep>) -> PreTokenizer {
        for named in [
            PreTokenizer::Gpt2,
            PreTokenizer::SmolLm,
            PreTokenizer::Qwen2,
            PreTokenizer::Llama3,
        ] {
            if named.steps() == steps {
                return named;
            }
        }
        PreTokenizer::Steps(steps)
    }
}

/// The suffix `\s+(?!\S)|\s+` that makes these regexes need backtracking; see [`RegexSplit`].
const WS_TAIL: &str = r"|\s+(?!\S)|\s+";

/// A compiled regex step.
///
/// The well-known patterns end with `\s+(?!\S)|\s+` (a whitespace run gives up its last
/// character to the following word). That lookahead is the only construct a plain regex engine
/// lacks, so those patterns are compiled with the tail replaced by `\s+` and the lookahead is
/// applied afterwards: a match made by that last branch (all whitespace, and not containing a
/// newline when the pattern has a `\s*[\r\n]+` branch before it, which would have taken it)
/// that has at least two characters and is followed by more text loses its last character.
/// Matching then restarts there, exactly as the backtracking engine would. Other patterns run on
/// fancy-regex's backtracking engine as written.
#[derive(Debug)]
pub(crate) struct RegexSplit {
    re: fancy_regex::Regex,
    ws_tail: bool,
    nl_branch: bool,
}

impl RegexSplit {
    pub(crate) fn new(pattern: &str) -> Result<RegexSplit, TokenizerError> {
        let known = [GPT2_PATTERN, QWEN2_PATTERN, LLAMA3_PATTERN].contains(&pattern);
        let (compiled, ws_tail) = match pattern.strip_suffix(WS_TAIL) {
            Some(head) if known => (format!(r"{head}|\s+"), true),
            _ => (pattern.to_string(), false),
        };
        let re = fancy_regex::Regex::new(&compiled).map_err(|e| TokenizerError::BadRegex {
            pattern: pattern.to_string(),
            message: e.to_string(),
        })?;
        Ok(RegexSplit {
            re,
            ws_tail,
            nl_branch: ws_tail && compiled.contains(r"\s*[\r\n]+"),
        })
    }

    fn split<'a>(&self, text: &'a str, out: &mut Vec<&'a str>) {
        let mut pos = 0;
        let mut last = 0;
        while pos < text.len() {
            let m = match self.re.find_from_pos(text, pos) {
                Ok(Some(m)) => m,
                // No match, or the backtracking engine gave up: the rest is one piece.
                Ok(None) | Err(_) => break,
            };
            let (start, mut end) = (m.start(), m.end());
            if start == end {
                // Empty match (custom patterns only): step over one character.
                pos = end + text[end..].chars().next().map_or(1, char::len_utf8);
                continue;
            }
            if self.ws_tail && end < text.len() {
                let s = &text[start..end];
                if s.chars().all(char::is_whitespace)
                    && !(self.nl_branch && s.contains(['\r', '\n']))
                {
                    let mut chars = s.char_indices();
                    let last_char = chars.next_back();
                    if let (Some(_), Some((i, _))) = (chars.next(), last_char) {
                        end = start + i;
                    }
                }
            }
            if start > last {
                out.push(&text[last..start]);
            }
            out.push(&text[start..end]);
            last = end;
            pos = end;
        }
        if last < text.len() {
            out.push(&text[last..]);
        }
    }
}

#[derive(Debug)]
pub(crate) enum CompiledStep {
    IndividualDigits,
    DigitRuns,
    Regex(RegexSplit),
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub(crate) struct Splitter {
    steps: Vec<CompiledStep>,
}

impl Splitter {
    pub(crate) fn new(pre: &PreTokenizer) -> Result<Splitter, TokenizerError> {
        let steps = pre
            .steps()
            .into_iter()
            .map(|s| {
                Ok(match s {
                    PreTokStep::IndividualDigits => CompiledStep::IndividualDigits,
                    PreTokStep::DigitRuns => CompiledStep::DigitRuns,
                    PreTokStep::Regex(p) => CompiledStep::Regex(RegexSplit::new(&p)?),
                })
            })
            .collect::<Result<Vec<_>, TokenizerError>>()?;
        Ok(Splitter { steps })
    }

    /// Splits `text` into non-empty pieces that concatenate back to `text`.
    pub(crate) fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut cur = Vec::with_capacity(text.len() / 3 + 1);
        if text.is_empty() {
            return cur;
        }
        cur.push(text);
        let mut next = Vec::with_capacity(cur.capacity());
        for step in &self.steps {
            next.clear();
            for piece in cur.iter().copied() {
                match step {
                    CompiledStep::IndividualDigits => split_digits(piece, true, &mut next),
                    CompiledStep::DigitRuns => split_digits(piece, false, &mut next),
                    CompiledStep::Regex(r) => r.split(piece, &mut next),
                }
            }
            std::mem::swap(&mut cur, &mut next);
        }
        cur
    }
}

fn split_digits<'a>(text: &'a str, individual: bool, out: &mut Vec<&'a str>) {
    let mut start = 0;
    let mut in_digits = false;
    for (i, c) in text.char_indices() {
        let digit = c.is_numeric();
        if i > start && (digit != in_digits || (digit && individual)) {
            out.push(&text[start..i]);
            start = i;
        }
        in_digits = digit;
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fancy_split(pattern: &str, text: &str) -> Vec<String> {
        let re = fancy_regex::Regex::new(pattern).unwrap();
        re.find_iter(text)
            .map(|m| m.unwrap().as_str().to_string())
            .collect()
    }

    fn fast_split(pattern: &str, text: &str) -> Vec<String> {
        let r = RegexSplit::new(pattern).unwrap();
        assert!(r.ws_tail);
        let mut out = Vec::new();
        r.split(text, &mut out);
        out.into_iter().map(String::from).collect()
    }

    const SAMPLES: &[&str] = &[
        "Hello  world",
        "a   \n  b\t\t!x",
        "  \n  \n\n  x",
        "x \u{a0}\u{3000} y",
        "\t\t!",
        "end   ",
        " \r\n\r\n  y !  ? z",
        "I'M you'll 123 4567",
        "\n\n\nfoo\n  bar  \t baz\n",
    ];

    #[test]
    fn lookahead_emulation_matches_backtracking() {
        for pattern in [GPT2_PATTERN, QWEN2_PATTERN, LLAMA3_PATTERN] {
            for text in SAMPLES {
                assert_eq!(
                    fast_split(pattern, text),
                    fancy_split(pattern, text),
                    "{pattern} on {text:?}"
                );
            }
        }
    }

    #[test]
    fn digits() {
        let mut out = Vec::new();
        split_digits("ab12c3", true, &mut out);
        assert_eq!(out, ["ab", "1", "2", "c", "3"]);
        out.clear();
        split_digits("ab12c3", false, &mut out);
        assert_eq!(out, ["ab", "12", "c", "3"]);
    }

    #[test]
    fn gguf_names() {
        assert_eq!(
            PreTokenizer::from_gguf_name(Some("smollm")).unwrap(),
            PreTokenizer::SmolLm
        );
        assert_eq!(
            PreTokenizer::from_gguf_name(Some("qwen2")).unwrap(),
            PreTokenizer::Qwen2
        );
        assert!(PreTokenizer::from_gguf_name(Some("nope")).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        #[test]
        fn lookahead_emulation_random(s in "[ a\t\n\r!1é中\u{a0}']{0,24}") {
            for pattern in [GPT2_PATTERN, QWEN2_PATTERN, LLAMA3_PATTERN] {
                proptest::prop_assert_eq!(fast_split(pattern, &s), fancy_split(pattern, &s));
            }
        }
    }
}
