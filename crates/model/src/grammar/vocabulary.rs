//! From a matcher's state to the tokens that may come next: a trie of the vocabulary's byte
//! strings, walked depth-first with the matcher (which undoes each byte on the way back).

use std::sync::Arc;

use super::matcher::{Matcher, StateKey};
use super::rules::Grammar;
use super::states::{DEAD, States};
use super::string::{Scan, Spelling, scan};
use super::text_tokens::TextCache;
use crate::tokenizer::Tokenizer;

/// A set of token ids below a vocabulary's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSet {
    words: Vec<u64>,
}

impl TokenSet {
    pub fn empty(size: usize) -> TokenSet {
        TokenSet {
            words: vec![0; size.div_ceil(64)],
        }
    }

    pub fn insert(&mut self, id: u32) {
        if let Some(w) = self.words.get_mut(id as usize / 64) {
            *w |= 1 << (id % 64);
        }
    }

    pub fn contains(&self, id: u32) -> bool {
        self.words
            .get(id as usize / 64)
            .is_some_and(|w| w >> (id % 64) & 1 == 1)
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The set as bits, token `id` at bit `id % 64` of word `id / 64`.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            (0..64)
                .filter(move |b| w >> b & 1 == 1)
                .map(move |b| (i * 64 + b) as u32)
        })
    }

    /// Sets the logits of the tokens outside the set to -inf.
    pub fn mask(&self, logits: &mut [f32]) {
        for (i, chunk) in logits.chunks_mut(64).enumerate() {
            let w = self.words.get(i).copied().unwrap_or(0);
            if w == u64::MAX {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if w >> b & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// A trie node, in depth-first order: its subtree ends before node `end`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    pub byte: u8,
    pub depth: u16,
    pub end: u32,
    /// The tokens spelled by the path to this node: `ids[first..first + count]`.
    pub first: u32,
    pub count: u32,
}

/// A model's vocabulary as constrained decoding walks it: the tokens that may be written
/// (control tokens may not), by their bytes.
pub struct Vocabulary {
    size: usize,
    pub(super) nodes: Vec<Node>,
    pub(super) ids: Vec<u32>,
    /// Each writable token's bytes: `bytes[offsets[id]..offsets[id + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    /// For strings that take any characters in each spelling (values, then names): the tokens
    /// wholly inside one, wherever it stands, and those that close it and go on, which the
    /// grammar decides about.
    strings: [FreeString; 2],
}

#[derive(Debug)]
struct FreeString {
    inside: TokenSet,
    leaving: Vec<u32>,
    /// `within[n]`: the tokens of `inside` that begin at most `n` characters, for each `n`
    /// below the most any of them begins.
    within: Vec<TokenSet>,
}

impl FreeString {
    fn empty(size: usize) -> Self {
        FreeString {
            inside: TokenSet::empty(size),
            leaving: Vec::new(),
            within: Vec::new(),
        }
    }

    /// The tokens wholly inside with room for `room` more characters.
    fn inside(&self, room: u32) -> &TokenSet {
        self.within.get(room as usize).unwrap_or(&self.inside)
    }
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Vocabulary({} tokens, {} nodes)",
            self.size,
            self.nodes.len()
        )
    }
}

impl Vocabulary {
    /// The tokenizer's tokens but its control tokens.
    pub fn of(tok: &Tokenizer) -> Vocabulary {
        let size = tok.vocab_size();
        Vocabulary::new(size, |id| {
            if tok.is_special(id) {
                None
            } else {
                tok.token_bytes(id)
            }
        })
    }

    /// Tokens `0..size`, each with the bytes it writes, or `None` for one never allowed.
    pub fn new<'a>(size: usize, bytes_of: impl Fn(u32) -> Option<&'a [u8]>) -> Vocabulary {
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(size + 1);
        offsets.push(0);
        for id in 0..size as u32 {
            bytes.extend_from_slice(bytes_of(id).unwrap_or_default());
            offsets.push(bytes.len() as u32);
        }
        let mut v = Vocabulary {
            size,
            nodes: Vec::new(),
            ids: Vec::new(),
            bytes,
            offsets,
            strings: [(); 2].map(|_| FreeString::empty(size)),
        };
        let mut order: Vec<u32> = (0..size as u32)
            .filter(|&id| !v.bytes(id).is_empty())
            .collect();
        order.sort_by(|&a, &b| v.bytes(a).cmp(v.bytes(b)));
        v.build_trie(&order);
        let strings = [Spelling::Any, Spelling::Compact].map(|spelling| {
            let mut free = FreeString::empty(size);
            let mut begins = Vec::new();
            for &id in &order {
                match scan(v.bytes(id), spelling) {
                    Scan::Inside(n) => {
                        free.inside.insert(id);
                        begins.push((id, n));
                    }
                    Scan::Leaves => free.leaving.push(id),
                    Scan::Invalid => {}
                }
            }
            // Only strings held to a length, written compactly, have less room than any.
            let most = match spelling {
                Spelling::Compact => begins.iter().map(|&(_, n)| n).max().unwrap_or(0),
                Spelling::Any => 0,
            };
            free.within = (0..most)
                .map(|room| {
                    let mut set = TokenSet::empty(size);
                    begins
                        .iter()
                        .filter(|&&(_, n)| n <= room)
                        .for_each(|&(id, _)| set.insert(id));
                    set
                })
                .collect();
            free
        });
        v.strings = strings;
        v
    }

    /// Builds the trie from tokens sorted by their bytes.
    fn build_trie(&mut self, order: &[u32]) {
        // The nodes on the path to the last token, by depth - 1.
        let mut path: Vec<usize> = Vec::new();
        let mut last: &[u8] = &[];
        let mut nodes = Vec::new();
        let mut ids = Vec::with_capacity(order.len());
        for &id in order {
            let s = self.bytes(id);
            let common = s.iter().zip(last).take_while(|(a, b)| a == b).count();
            for &n in &path[common..] {
                let end = nodes.len() as u32;
                let node: &mut Node = &mut nodes[n];
                node.end = end;
            }
            path.truncate(common);
            for (d, &byte) in s.iter().enumerate().skip(common) {
                path.push(nodes.len());
                nodes.push(Node {
                    byte,
                    depth: (d + 1) as u16,
                    end: 0,
                    first: 0,
                    count: 0,
                });
            }
            let node = &mut nodes[path[s.len() - 1]];
            if node.count == 0 {
                node.first = ids.len() as u32;
            }
            node.count += 1;
            ids.push(id);
            last = s;
        }
        for &n in &path {
            nodes[n].end = nodes.len() as u32;
        }
        self.nodes = nodes;
        self.ids = ids;
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// The bytes `id` writes (empty for a token never allowed).
    pub fn bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&s), Some(&e)) => &self.bytes[s as usize..e as usize],
            _ => &[],
        }
    }

    /// The tokens whose bytes the matcher takes next (the matcher ends as it began).
    pub fn allowed(&self, m: &mut Matcher) -> TokenSet {
        if let Some((pattern, state, room, least)) = m.held_text() {
            return self
                .text_tokens(&pattern, state, least)
                .allowed(self, m, room);
        }
        if let Some((spelling, room)) = m.free_string() {
            let free = &self.strings[spelling as usize];
            let mut set = free.inside(room).clone();
            for &id in &free.leaving {
                if m.accepts(self.bytes(id)) {
                    set.insert(id);
                }
            }
            return set;
        }
        let mut set = TokenSet::empty(self.size);
        let base = m.checkpoint();
        // The matcher's checkpoint after each byte of the path to the current node.
        let mut marks = vec![base];
        let mut i = 0;
        while let Some(n) = self.nodes.get(i) {
            let depth = n.depth as usize;
            marks.truncate(depth);
            m.rollback(marks[depth - 1]);
            if m.step(n.byte) {
                for &id in &self.ids[n.first as usize..(n.first + n.count) as usize] {
                    set.insert(id);
                }
                marks.push(m.checkpoint());
                i += 1;
            } else {
                i = n.end as usize;
            }
        }
        m.rollback(base);
        set
    }
}

impl Vocabulary {
    /// The tokens a context-free grammar's matcher `m`, in state `key`, takes next: the trie
    /// walked through the states' transitions, the matcher stepped only for those not met
    /// before (on a copy).
    fn allowed_by_states(&self, states: &mut States, key: StateKey, m: &mut Matcher) -> TokenSet {
        let mut set = TokenSet::empty(self.size);
        let mut scratch = m.clone();
        // The state after each byte of the path to the current node.
        let mut at = vec![states.start(key)];
        let mut i = 0;
        while let Some(n) = self.nodes.get(i) {
            at.truncate(n.depth as usize);
            let Some(s) = states.step(&mut scratch, at[at.len() - 1], n.byte) else {
                return self.allowed(m);
            };
            if s == DEAD {
                i = n.end as usize;
            } else {
                for &id in &self.ids[n.first as usize..(n.first + n.count) as usize] {
                    set.insert(id);
                }
                at.push(s);
                i += 1;
            }
        }
        set
    }
}

/// One reply's grammar as sampling applies it: the matcher, the vocabulary and the tokens that
/// end the reply (allowed exactly when the grammar is complete).
#[derive(Debug, Clone)]
pub struct Constraint {
    matcher: Matcher,
    vocabulary: Arc<Vocabulary>,
    end: Vec<u32>,
    /// The last [`allowed`](Self::allowed) allowed only end tokens.
    ending: bool,
    /// What [`allowed`](Self::allowed) gave since the last token.
    allowed: Option<TokenSet>,
    /// The tokens of held strings' pattern states met so far.
    texts: TextCache,
    /// A context-free grammar's states met so far, and where each byte leads.
    states: States,
}

impl Constraint {
    pub fn new(grammar: Arc<Grammar>, vocabulary: Arc<Vocabulary>, end: Vec<u32>) -> Self {
        Constraint {
            matcher: Matcher::new(grammar),
            vocabulary,
            end,
            ending: false,
            allowed: None,
            texts: TextCache::default(),
            states: States::default(),
        }
    }

    /// The tokens that may come next. Never none: where the vocabulary cannot go on, the end
    /// tokens, so that the reply ends rather than breaks the grammar.
    pub fn allowed(&mut self) -> &TokenSet {
        if self.allowed.is_none() {
            let (vocab, m) = (&self.vocabulary, &mut self.matcher);
            let mut set = match m.held_text() {
                Some((p, state, room, least)) => self
                    .texts
                    .get(vocab, &p, state, least)
                    .allowed(vocab, m, room),
                None => match m.state_key() {
                    Some(key) => vocab.allowed_by_states(&mut self.states, key, m),
                    None => vocab.allowed(m),
                },
            };
            let complete = self.matcher.is_complete();
            self.ending = set.is_empty();
            if complete || self.ending {
                for &id in &self.end {
                    set.insert(id);
                }
            }
            self.allowed = Some(set);
        }
        self.allowed.as_ref().expect("set above")
    }

    /// Takes a chosen token. An end token changes nothing; a token the grammar does not allow
    /// here is refused (`false`) and changes nothing either.
    pub fn accept(&mut self, token: u32) -> bool {
        self.allowed = None;
        if self.end.contains(&token) {
            return true;
        }
        let bytes = self.vocabulary.bytes(token);
        let ok = !bytes.is_empty() && self.matcher.advance(bytes);
        self.matcher.commit();
        ok
    }

    pub fn is_complete(&self) -> bool {
        self.matcher.is_complete()
    }

    /// Whether the reply is complete and nothing may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_done()
    }

    /// Whether the reply may end here: complete, or at a point no token can go on from.
    pub fn may_end(&self) -> bool {
        self.ending || self.matcher.is_complete()
    }
}
