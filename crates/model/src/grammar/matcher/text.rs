//! Strings held to a pattern or a length: written in the compact spelling (no `\u`, no `\/`),
//! each character counted as it begins and read by the pattern as JSON decodes it.

use regex_automata::util::primitives::StateID;

use super::{Frame, Matcher, Step};
use crate::grammar::pattern::Pattern;
use crate::grammar::rules::RuleId;
use crate::grammar::string::{Spelling, StrAt, StrStep};

/// What one byte does to a held string.
pub(in crate::grammar) enum TextStep {
    Reject,
    /// The closing quote: whether the string may end here is for the caller to say.
    Close,
    /// Taken, leaving the string `at`, `chars` characters begun, its pattern in `state`: a
    /// match is within reach of `need` characters in all.
    Stay {
        at: StrAt,
        chars: u32,
        state: StateID,
        need: u32,
    },
}

/// Byte `b` of a string at `at`, after `chars` characters, its pattern (if any) in `state`,
/// where a match must be at least `least` characters counted as `chars` counts.
pub(in crate::grammar) fn text_step(
    pattern: Option<&Pattern>,
    (at, chars, state): (StrAt, u32, StateID),
    least: u32,
    b: u8,
) -> TextStep {
    let next = match at.step(b, Spelling::Compact) {
        StrStep::Reject => return TextStep::Reject,
        StrStep::Close => return TextStep::Close,
        StrStep::Stay(next) => next,
    };
    let chars = chars + u32::from(at == StrAt::Plain);
    // The pattern reads a raw byte as it is, an escape once its letter comes.
    let reach = |c: u8| {
        let p = pattern?;
        let n = p.next(state, c)?;
        Some((n, chars + p.chars_to_match(n, least.saturating_sub(chars))?))
    };
    let (state, need) = match (pattern, at) {
        (None, _) => (state, chars),
        (Some(_), StrAt::Plain) if b == b'\\' => {
            let need = ESCAPED.iter().filter_map(|&e| reach(unescape(e)));
            match need.map(|(_, need)| need).min() {
                Some(need) => (state, need),
                None => return TextStep::Reject,
            }
        }
        (Some(_), StrAt::Escape) => match reach(unescape(b)) {
            Some(r) => r,
            None => return TextStep::Reject,
        },
        (Some(_), _) => match reach(b) {
            Some(r) => r,
            None => return TextStep::Reject,
        },
    };
    TextStep::Stay {
        at: next,
        chars,
        state,
        need,
    }
}

impl Matcher {
    pub(super) fn text(
        &mut self,
        rule: RuleId,
        (at, chars, state): (StrAt, u32, StateID),
        b: u8,
    ) -> Step {
        let Some(s) = self.rule(rule).string.as_ref() else {
            return Step::Reject;
        };
        let pattern = s.pattern.as_deref();
        match text_step(pattern, (at, chars, state), s.min, b) {
            TextStep::Close if chars >= s.min && pattern.is_none_or(|p| p.matches(state)) => {
                self.finish(Step::Took)
            }
            TextStep::Stay {
                at,
                chars,
                state,
                need,
            } if need <= s.max => {
                self.replace(Frame::Text {
                    rule,
                    at,
                    chars,
                    state,
                });
                Step::Took
            }
            _ => Step::Reject,
        }
    }
}

/// The letters of the compact escapes.
const ESCAPED: [u8; 7] = [b'"', b'\\', b'b', b'f', b'n', b'r', b't'];

/// The character a compact escape's letter stands for.
fn unescape(letter: u8) -> u8 {
    match letter {
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        other => other,
    }
}
