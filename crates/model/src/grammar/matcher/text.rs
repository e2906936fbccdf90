//! Strings held to a pattern or a length: written in the compact spelling (no `\u`, no `\/`),
//! each character counted as it begins and read by the pattern as JSON decodes it.

use regex_automata::util::primitives::StateID;

use super::{Frame, Matcher, Step};
use crate::grammar::rules::RuleId;
use crate::grammar::string::{Spelling, StrAt, StrStep};

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
        let begins = at == StrAt::Plain && b != b'"';
        if begins && chars >= s.max {
            return Step::Reject;
        }
        let next = match at.step(b, Spelling::Compact) {
            StrStep::Reject => return Step::Reject,
            StrStep::Close if chars >= s.min && pattern.is_none_or(|p| p.matches(state)) => {
                return self.finish(Step::Took);
            }
            StrStep::Close => return Step::Reject,
            StrStep::Stay(next) => next,
        };
        let chars = chars + u32::from(begins);
        // The pattern reads a raw byte as it is, an escape once its letter comes; each step
        // must leave a match within reach of `max` characters.
        let read = |c: u8| {
            let p = pattern?;
            let n = p.next(state, c)?;
            let more = p.chars_to_match(n)?;
            (u64::from(chars) + u64::from(more) <= u64::from(s.max)).then_some(n)
        };
        let state = match (pattern, at) {
            (None, _) => state,
            (Some(_), StrAt::Plain) if b == b'\\' => {
                if !ESCAPED.iter().any(|&e| read(unescape(e)).is_some()) {
                    return Step::Reject;
                }
                state
            }
            (Some(_), StrAt::Escape) => match read(unescape(b)) {
                Some(n) => n,
                None => return Step::Reject,
            },
            (Some(_), _) => match read(b) {
                Some(n) => n,
                None => return Step::Reject,
            },
        };
        self.replace(Frame::Text {
            rule,
            at: next,
            chars,
            state,
        });
        Step::Took
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
