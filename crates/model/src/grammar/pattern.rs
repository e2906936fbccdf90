//! A reply that a regular expression matches whole (vLLM's `guided_regex`): the expression as
//! a deterministic automaton over bytes, built once, bounded in size.

use std::sync::Arc;

use regex_automata::dfa::dense::{Builder, Config, DFA};
use regex_automata::dfa::{Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, util::syntax};

use super::rules::{Grammar, Rule};
use super::schema::SchemaError;

/// Bytes the automata may take, while built and once built: they bound the time a build takes
/// too (a few hundred milliseconds at most).
const MAX_AUTOMATON_BYTES: usize = 2 << 20;
/// Bytes of the expression itself.
const MAX_PATTERN_BYTES: usize = 4096;
/// Entries of a string pattern's table of the characters to a match, one per state and least
/// count (`minLength`) from 0 up.
const MAX_TABLE_ENTRIES: usize = 1 << 20;

/// A regular expression and its automaton, anchored at both ends.
pub struct Pattern {
    /// The expression as asked for (or the name of a format).
    pub text: String,
    /// The expression built.
    regex: String,
    dfa: DFA<Vec<u32>>,
    start: StateID,
    /// For a string's pattern, by least count `r` from 0 to `least` and state index (`r`
    /// times the states, plus the index): the fewest characters, at least `r`, that a JSON
    /// string can write to complete a match (`u32::MAX` where none can). Empty for raw text.
    to_match: Vec<u32>,
    /// The largest least count the table holds: the string's `minLength`.
    least: u32,
}

/// An error and the errors under it: the automaton builder's own message ("error building
/// NFA") leaves out whether the syntax, a size limit or an unsupported feature failed.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text = format!("{text}: {c}");
        cause = c.source();
    }
    text
}

impl Pattern {
    /// The automaton of `regex` matched whole, named `text` in errors and logs.
    pub fn new(text: &str, regex: &str) -> Result<Pattern, String> {
        if text.len() > MAX_PATTERN_BYTES {
            return Err(format!("at most {MAX_PATTERN_BYTES} bytes"));
        }
        let dfa = Builder::new()
            .configure(
                Config::new()
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(MAX_AUTOMATON_BYTES))
                    .determinize_size_limit(Some(MAX_AUTOMATON_BYTES)),
            )
            .syntax(syntax::Config::new().nest_limit(64))
            .thompson(thompson::Config::new().nfa_size_limit(Some(MAX_AUTOMATON_BYTES)))
            .build(&format!("(?:{regex})$"))
            .map_err(|e| format!("cannot be enforced: {}", with_causes(&e)))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| format!("cannot be enforced: {}", with_causes(&e)))?;
        Ok(Pattern {
            text: text.to_string(),
            regex: regex.to_string(),
            dfa,
            start,
            to_match: Vec::new(),
            least: 0,
        })
    }

    /// The automaton of `regex` matched whole by a JSON string's characters, for strings of at
    /// least `least` characters.
    pub fn for_strings(text: &str, regex: &str, least: u32) -> Result<Pattern, String> {
        let mut p = Pattern::new(text, regex)?;
        p.least = least;
        p.to_match = p.chars_to_matches()?;
        Ok(p)
    }

    /// [`chars_to_match`](Self::chars_to_match) for every state and least count: for none, a
    /// breadth-first walk back from the matching states, where a UTF-8 continuation byte costs
    /// no character; for `r` more, one step further than for `r - 1`.
    fn chars_to_matches(&self) -> Result<Vec<u32>, String> {
        let dfa = &self.dfa;
        let reps = self.class_bytes(string_can_write);
        let index = |s: StateID| s.as_usize() >> dfa.stride2();
        // The states reachable from the start, and the edges into and out of each.
        let mut into: Vec<Vec<(u32, u32)>> = Vec::new();
        let mut out: Vec<Vec<(u32, u32)>> = Vec::new();
        let mut found = vec![false; 1];
        let mut order = vec![self.start];
        grow(&mut found, index(self.start), false);
        found[index(self.start)] = true;
        let mut at = 0;
        while let Some(&s) = order.get(at) {
            at += 1;
            for &b in &reps {
                let Some(t) = self.next(s, b) else { continue };
                let cost = u32::from(!(0x80..=0xbf).contains(&b));
                grow(&mut into, index(t), Vec::new());
                into[index(t)].push((index(s) as u32, cost));
                grow(&mut out, index(s), Vec::new());
                out[index(s)].push((index(t) as u32, cost));
                grow(&mut found, index(t), false);
                if !found[index(t)] {
                    found[index(t)] = true;
                    order.push(t);
                }
            }
        }
        let mut to_match = vec![u32::MAX; found.len()];
        let mut queue = std::collections::VecDeque::new();
        for &s in order.iter().filter(|&&s| self.matches(s)) {
            to_match[index(s)] = 0;
            queue.push_back(index(s));
        }
        while let Some(t) = queue.pop_front() {
            for &(s, cost) in into.get(t).into_iter().flatten() {
                let d = to_match[t] + cost;
                if d < to_match[s as usize] {
                    to_match[s as usize] = d;
                    match cost {
                        0 => queue.push_front(s as usize),
                        _ => queue.push_back(s as usize),
                    }
                }
            }
        }
        let n = to_match.len();
        let layers = self.least as usize + 1;
        if layers.saturating_mul(n) > MAX_TABLE_ENTRIES {
            return Err(format!(
                "its automaton's table of the characters to a match for strings of at least {} \
                 characters would take more than {MAX_TABLE_ENTRIES} entries",
                self.least
            ));
        }
        to_match.reserve((layers - 1) * n);
        for r in 1..layers {
            let (prev, cur) = ((r - 1) * n, r * n);
            // A character taken leaves r - 1 to write; a continuation byte, still r.
            for s in 0..n {
                let best = out.get(s).into_iter().flatten().filter(|e| e.1 == 1);
                let best = best.map(|&(t, _)| to_match[prev + t as usize].saturating_add(1));
                to_match.push(best.min().unwrap_or(u32::MAX));
            }
            // Until nothing changes: continuation bytes chain at most three deep.
            let mut changed = true;
            while changed {
                changed = false;
                for s in 0..n {
                    for &(t, cost) in out.get(s).into_iter().flatten() {
                        let d = to_match[cur + t as usize];
                        if cost == 0 && d < to_match[cur + s] {
                            to_match[cur + s] = d;
                            changed = true;
                        }
                    }
                }
            }
        }
        Ok(to_match)
    }

    /// Bytes the automaton and its table take.
    pub fn memory(&self) -> usize {
        self.dfa.memory_usage() + 4 * self.to_match.len()
    }

    /// The state after `b` from `s`, if the expression can still match.
    pub(super) fn next(&self, s: StateID, b: u8) -> Option<StateID> {
        let n = self.dfa.next_state(s, b);
        (!self.dfa.is_dead_state(n) && !self.dfa.is_quit_state(n)).then_some(n)
    }

    pub(super) fn start(&self) -> StateID {
        self.start
    }

    /// Whether the bytes that led to `s` are matched whole.
    pub(super) fn matches(&self, s: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }

    /// The fewest characters, at least `least` (no more than the string's `minLength`), that
    /// complete a match from `s`, if a string can write them.
    pub(super) fn chars_to_match(&self, s: StateID, least: u32) -> Option<u32> {
        if least > self.least {
            return None;
        }
        let states = self.to_match.len() / (self.least as usize + 1);
        let at = s.as_usize() >> self.dfa.stride2();
        if at >= states {
            return None;
        }
        let n = self.to_match[least as usize * states + at];
        (n != u32::MAX).then_some(n)
    }

    /// One byte of each of the automaton's byte classes that holds a byte `keep` takes: bytes of
    /// a class lead to the same states.
    fn class_bytes(&self, keep: impl Fn(u8) -> bool) -> Vec<u8> {
        let classes = self.dfa.byte_classes();
        let mut rep = vec![None; classes.alphabet_len()];
        for b in (0..=255u8).filter(|&b| keep(b)) {
            rep[classes.get(b) as usize].get_or_insert(b);
        }
        rep.into_iter().flatten().collect()
    }

    /// Whether some text is matched whole: a walk over the states the start reaches.
    pub(super) fn matches_some(&self) -> bool {
        let index = |s: StateID| s.as_usize() >> self.dfa.stride2();
        let reps = self.class_bytes(|_| true);
        let mut seen = Vec::new();
        let mut todo = vec![self.start];
        grow(&mut seen, index(self.start), false);
        seen[index(self.start)] = true;
        while let Some(s) = todo.pop() {
            if self.matches(s) {
                return true;
            }
            for t in reps.iter().filter_map(|&b| self.next(s, b)) {
                grow(&mut seen, index(t), false);
                if !std::mem::replace(&mut seen[index(t)], true) {
                    todo.push(t);
                }
            }
        }
        false
    }

    /// Whether no byte may follow `s`.
    pub(super) fn ends(&self, s: StateID) -> bool {
        (0..=255u8).all(|b| self.next(s, b).is_none())
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text && self.regex == other.regex
    }
}

impl Eq for Pattern {}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pattern({:?})", self.text)
    }
}

impl Grammar {
    /// The grammar of a reply that `pattern` matches whole (Rust's regex syntax, on UTF-8).
    pub fn regex(pattern: &str) -> Result<Grammar, SchemaError> {
        let error = |message: String| SchemaError::new("regex", message);
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(error(format!("at most {MAX_PATTERN_BYTES} bytes")));
        }
        // The expression alone first, so that a syntax error quotes it as it was sent (the
        // automaton's is anchored).
        syntax::parse_with(pattern, &syntax::Config::new().nest_limit(64))
            .map_err(|e| error(format!("cannot be enforced: {e}")))?;
        let pattern = Pattern::new(pattern, pattern).map_err(error)?;
        if !pattern.matches_some() {
            return Err(error("matches no text".into()));
        }
        Ok(Grammar {
            rules: vec![Rule {
                pattern: Some(Arc::new(pattern)),
                ..Rule::default()
            }],
            root: 0,
        })
    }
}

fn grow<T: Clone>(v: &mut Vec<T>, i: usize, fill: T) {
    if v.len() <= i {
        v.resize(i + 1, fill);
    }
}

/// Whether a JSON string in the compact spelling can write the character or UTF-8 byte `b`:
/// of the control characters, only those with a short escape.
fn string_can_write(b: u8) -> bool {
    b >= 0x20 || matches!(b, 0x08 | b'\t' | b'\n' | 0x0c | b'\r')
}

#[cfg(test)]
mod tests {
    use super::Pattern;

    /// The fewest characters, at least `least`, to a whole match from the start.
    fn shortest(regex: &str, least: u32) -> Option<u32> {
        let p = Pattern::for_strings(regex, regex, least).unwrap();
        p.chars_to_match(p.start(), least)
    }

    #[test]
    fn a_least_count_is_reached_by_the_lengths_the_pattern_can_take() {
        // (aaa|bb)+ takes every length from 2 but 1.
        assert_eq!(shortest("(aaa|bb)+", 0), Some(2));
        assert_eq!(shortest("(aaa|bb)+", 3), Some(3));
        assert_eq!(shortest("(aaa|bb)+", 7), Some(7));
        // (ab)+ takes even lengths only.
        assert_eq!(shortest("(ab)+", 3), Some(4));
        assert_eq!(shortest("(ab)+", 6), Some(6));
        // A multi-byte character counts once.
        assert_eq!(shortest("(é|€)+", 3), Some(3));
        // Nothing longer than the pattern allows.
        assert_eq!(shortest("a{1,2}", 3), None);
        assert_eq!(shortest("a{1,2}", 2), Some(2));
        // Past the table, no answer.
        let p = Pattern::for_strings("a+", "a+", 2).unwrap();
        assert_eq!(p.chars_to_match(p.start(), 3), None);
    }
}
