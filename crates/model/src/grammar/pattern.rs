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

/// A regular expression and its automaton, anchored at both ends.
pub struct Pattern {
    pub text: String,
    dfa: DFA<Vec<u32>>,
    start: StateID,
}

impl Pattern {
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

    /// Whether no byte may follow `s`.
    pub(super) fn ends(&self, s: StateID) -> bool {
        (0..=255u8).all(|b| self.next(s, b).is_none())
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
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
        let bad = |message: String| SchemaError {
            at: "regex".into(),
            message,
        };
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(bad(format!("at most {MAX_PATTERN_BYTES} bytes")));
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
            .build(&format!("(?:{pattern})$"))
            .map_err(|e| bad(format!("cannot be enforced: {e}")))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| bad(format!("cannot be enforced: {e}")))?;
        Ok(Grammar {
            rules: vec![Rule {
                pattern: Some(Arc::new(Pattern {
                    text: pattern.to_string(),
                    dfa,
                    start,
                })),
                ..Rule::default()
            }],
            root: 0,
        })
    }
}
