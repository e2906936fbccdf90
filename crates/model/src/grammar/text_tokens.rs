//! The tokens a string held to a pattern takes in one state of its automaton: one walk of the
//! vocabulary's trie with the automaton alone, kept for the states a reply comes back to (a
//! pattern's loop comes back at every token).

use std::collections::HashMap;
use std::sync::Arc;

use regex_automata::util::primitives::StateID;

use super::matcher::{Matcher, TextStep, text_step};
use super::pattern::Pattern;
use super::string::StrAt;
use super::vocabulary::{TokenSet, Vocabulary};

/// Bytes of tokens one reply keeps: a broad pattern's state holds about 1 MB on a vocabulary
/// of 150,000 tokens.
const MAX_KEPT_BYTES: usize = 8 << 20;

/// The tokens that may follow in one state of a held string.
#[derive(Debug)]
pub struct TextTokens {
    /// Those wholly inside the string, each with the room it needs for the characters it begins
    /// and a match within reach after them.
    inside: Vec<(u32, u32)>,
    /// All of `inside`, for room of at least `most`.
    all: TokenSet,
    most: u32,
    /// Those that reach the closing quote: the rest of the grammar says which may follow.
    leaving: Vec<u32>,
}

impl TextTokens {
    fn bytes(&self) -> usize {
        8 * self.inside.len() + 8 * self.all.words().len() + 4 * self.leaving.len()
    }

    /// The tokens allowed with room for `room` more characters, `m` in the state walked.
    pub fn allowed(&self, vocab: &Vocabulary, m: &mut Matcher, room: u32) -> TokenSet {
        let mut set = match room >= self.most {
            true => self.all.clone(),
            false => {
                let mut set = TokenSet::empty(vocab.size());
                let fit = self.inside.iter().filter(|&&(_, need)| need <= room);
                fit.for_each(|&(id, _)| set.insert(id));
                set
            }
        };
        for &id in &self.leaving {
            if m.accepts(vocab.bytes(id)) {
                set.insert(id);
            }
        }
        set
    }
}

/// A reply's [`TextTokens`], by pattern, state and the characters a match still needs.
#[derive(Debug, Default, Clone)]
pub struct TextCache {
    kept: HashMap<(usize, StateID, u32), Arc<TextTokens>>,
    bytes: usize,
}

impl TextCache {
    pub fn get(
        &mut self,
        vocab: &Vocabulary,
        p: &Arc<Pattern>,
        state: StateID,
        least: u32,
    ) -> Arc<TextTokens> {
        let key = (Arc::as_ptr(p) as usize, state, least);
        if let Some(t) = self.kept.get(&key) {
            return t.clone();
        }
        let t = Arc::new(vocab.text_tokens(p, state, least));
        let bytes = t.bytes();
        if self.bytes + bytes > MAX_KEPT_BYTES {
            self.kept.clear();
            self.bytes = 0;
        }
        self.bytes += bytes;
        self.kept.insert(key, t.clone());
        t
    }
}

/// Where a walk stands after the bytes of a trie path.
#[derive(Clone, Copy)]
struct Walk {
    at: StrAt,
    chars: u32,
    state: StateID,
    /// The most room any step on the path needs.
    need: u32,
    /// Past the closing quote.
    left: bool,
}

impl Vocabulary {
    /// The tokens allowed in `state`, where a match needs at least `least` more characters.
    pub(super) fn text_tokens(&self, p: &Pattern, state: StateID, least: u32) -> TextTokens {
        let mut t = TextTokens {
            inside: Vec::new(),
            all: TokenSet::empty(self.size()),
            most: 0,
            leaving: Vec::new(),
        };
        let start = Walk {
            at: StrAt::Plain,
            chars: 0,
            state,
            need: 0,
            left: false,
        };
        // The walk after each byte of the path to the current node, by depth - 1.
        let mut path = vec![start];
        let mut i = 0;
        while let Some(n) = self.nodes.get(i) {
            path.truncate(n.depth as usize);
            let w = path[path.len() - 1];
            let next = match w.left {
                true => Some(w),
                false => match text_step(Some(p), (w.at, w.chars, w.state), least, n.byte) {
                    TextStep::Reject => None,
                    TextStep::Close => Some(Walk { left: true, ..w }),
                    TextStep::Stay {
                        at,
                        chars,
                        state,
                        need,
                    } => Some(Walk {
                        at,
                        chars,
                        state,
                        need: need.max(w.need),
                        left: false,
                    }),
                },
            };
            let Some(w) = next else {
                i = n.end as usize;
                continue;
            };
            for &id in &self.ids[n.first as usize..(n.first + n.count) as usize] {
                if w.left {
                    t.leaving.push(id);
                } else {
                    t.inside.push((id, w.need));
                    t.all.insert(id);
                    t.most = t.most.max(w.need);
                }
            }
            path.push(w);
            i += 1;
        }
        t
    }
}
