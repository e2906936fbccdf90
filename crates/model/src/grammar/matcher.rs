//! A pushdown automaton over bytes that accepts the JSON a [`Grammar`] allows (or one of its raw
//! texts, for a choice). Where a value may follow several alternatives of a union, it holds one
//! stack for each that the bytes so far fit. Every change to a stack, or to the set of them, is
//! logged, so that a walk over many continuations can go back cheaply.

mod cfg;
mod containers;
mod literals;
mod stacks;
mod taken;
mod text;
mod unique;

use taken::{Item, Taken};
pub(super) use text::{TextStep, text_step};

use std::sync::Arc;

use regex_automata::util::primitives::StateID;

use super::MAX_WHITESPACE;
use super::pattern::Pattern;
use super::rules::{Grammar, MAX_UNIQUE_LITERALS, Numeric, ObjectRule, Rule, RuleId, UniqueItems};
use super::string::{Spelling, StrAt, StrStep};

/// The property index of a member that is not a declared property.
const ADDITIONAL: u16 = u16::MAX;
const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Frame {
    /// A value of `rule` comes next, after `ws` bytes of whitespace so far.
    Value {
        rule: RuleId,
        ws: u8,
    },
    /// `seen`: the declared members written; `members`: all of them; `names`: 0 until a name
    /// the object does not declare is written, then 1 + the index of the set of those names.
    Object {
        rule: RuleId,
        seen: u64,
        at: ObjectAt,
        ws: u8,
        members: u32,
        names: u32,
    },
    /// The name of a member, among the declared properties `lo..hi` that begin with its `len`
    /// bytes so far; its bytes begin at `start` in the reply, where it is recorded.
    Key {
        rule: RuleId,
        lo: u16,
        hi: u16,
        len: u16,
        at: StrAt,
        start: u32,
    },
    /// `used`: for unique literals, the bits of those taken; for unique strings and
    /// integers, the index of the set of those taken.
    Array {
        rule: RuleId,
        count: u32,
        at: ArrayAt,
        ws: u8,
        used: u64,
    },
    Str(StrAt),
    /// An item of an array of unique strings and integers, whose bytes so far begin at
    /// `start` in the reply (with its opening quote).
    UniqueStr {
        at: StrAt,
        start: u32,
    },
    UniqueInt {
        at: NumAt,
        start: u32,
    },
    /// A string held to a [`StringRule`](super::rules::StringRule): `chars` characters begun
    /// so far, its pattern's automaton in `state` after them.
    Text {
        rule: RuleId,
        at: StrAt,
        chars: u32,
        state: StateID,
    },
    /// One of the rule's literals `lo..hi`, which begin with the `len` bytes so far.
    Literal {
        rule: RuleId,
        lo: u16,
        hi: u16,
        len: u16,
    },
    Word {
        word: u8,
        len: u8,
    },
    Number {
        integer: bool,
        at: NumAt,
    },
    /// Raw text of the rule's context-free grammar: inside its alternative `alt`, before item
    /// `pos`.
    Cfg {
        rule: RuleId,
        alt: u32,
        pos: u32,
    },
    /// Within the character of item `pos`, whose code point lies in `lo..=hi`, with `need`
    /// bytes of it to come.
    CfgChar {
        rule: RuleId,
        alt: u32,
        pos: u32,
        lo: u32,
        hi: u32,
        need: u8,
    },
    /// Raw text the rule's expression is matching, in this state of its automaton.
    Pattern {
        rule: RuleId,
        state: StateID,
    },
    /// The whole value is written.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ObjectAt {
    /// After `{`.
    Open,
    /// After `,`.
    Comma,
    /// After a member's name: `:` comes next.
    Colon { prop: u16 },
    /// The member's value is being written.
    Member,
    /// After a member.
    After,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ArrayAt {
    Open,
    Comma,
    Item,
    After,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum NumAt {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl NumAt {
    fn is_end(self) -> bool {
        matches!(self, NumAt::Zero | NumAt::Int | NumAt::Frac | NumAt::Exp)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Undo {
    /// On stack `.0`.
    Pushed(u16),
    Popped(u16, Frame),
    /// A stack was added at the end.
    Forked,
    /// Stack `.0` was dropped.
    Dropped(u16, Vec<Frame>),
    /// A set of unique items taken was begun.
    Opened,
    /// Item `.1` was taken in set `.0`.
    Took(u32, Item),
}

/// Where a matcher stood, to go back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    log: usize,
    bytes: usize,
}

/// A matcher's stacks, compared and hashed whole (see [`Matcher::state_key`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateKey(Vec<Vec<Frame>>);

/// What one byte did to the top of the stack.
enum Step {
    Took,
    Reject,
    /// The stack changed without taking the byte: the new top takes it.
    Again,
}

/// Where a reply stands in its grammar.
#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<Grammar>,
    /// Never two equal, nor none between bytes taken.
    stacks: Vec<Vec<Frame>>,
    /// The stack taking the byte.
    cur: usize,
    log: Vec<Undo>,
    /// The reply's bytes, recorded where the grammar has arrays of unique strings or integers,
    /// or objects that take names they do not declare.
    bytes: Vec<u8>,
    records: bool,
    /// For each such array begun, the items taken, as written; for each such object, the
    /// undeclared names written.
    taken: Taken,
}

impl Matcher {
    pub fn new(grammar: Arc<Grammar>) -> Matcher {
        let root = grammar.root;
        let records = grammar.rules.iter().any(|r| {
            let unique = r.array.as_ref().and_then(|a| a.unique);
            unique == Some(UniqueItems::Free)
                || r.object.as_ref().is_some_and(|o| o.additional.is_some())
        });
        Matcher {
            grammar,
            // The reply is its value alone: no whitespace before it (as none after it).
            stacks: vec![vec![Frame::Value {
                rule: root,
                ws: MAX_WHITESPACE,
            }]],
            cur: 0,
            log: Vec::new(),
            bytes: Vec::new(),
            records,
            taken: Taken::default(),
        }
    }

    /// Takes `bytes` if the grammar allows them here; else stays as it was.
    pub fn advance(&mut self, bytes: &[u8]) -> bool {
        let mark = self.checkpoint();
        let ok = bytes.iter().all(|&b| self.step(b));
        if !ok {
            self.rollback(mark);
        }
        ok
    }

    /// Whether the grammar allows `bytes` here (the matcher stays as it was).
    pub fn accepts(&mut self, bytes: &[u8]) -> bool {
        let mark = self.checkpoint();
        let ok = bytes.iter().all(|&b| self.step(b));
        self.rollback(mark);
        ok
    }

    /// Whether the reply may end here.
    pub fn is_complete(&self) -> bool {
        self.stacks.iter().any(|s| match s.as_slice() {
            [Frame::Done] => true,
            [Frame::Number { at, .. }] => at.is_end(),
            [Frame::Literal { rule, lo, len, .. }] => self.literal_ends(*rule, *lo, *len),
            [Frame::Pattern { rule, state }] => {
                self.pattern(*rule).is_some_and(|p| p.matches(*state))
            }
            s => self.cfg_ends(s),
        })
    }

    /// Whether the reply is complete and nothing may follow.
    pub fn is_done(&self) -> bool {
        self.stacks.iter().all(|s| match s.as_slice() {
            [Frame::Done] => true,
            [Frame::Pattern { rule, state }] => self
                .pattern(*rule)
                .is_some_and(|p| p.matches(*state) && p.ends(*state)),
            s => self.cfg_done(s),
        })
    }

    fn pattern(&self, rule: RuleId) -> Option<&Pattern> {
        self.rule(rule).pattern.as_deref()
    }

    /// A mark to [`rollback`](Self::rollback) to, until the next [`commit`](Self::commit).
    pub fn checkpoint(&self) -> Mark {
        Mark {
            log: self.log.len(),
            bytes: self.bytes.len(),
        }
    }

    /// Undoes every byte taken since `mark`.
    pub fn rollback(&mut self, mark: Mark) {
        debug_assert!(
            mark.log <= self.log.len() && mark.bytes <= self.bytes.len(),
            "a mark taken before a commit"
        );
        while self.log.len() > mark.log {
            match self.log.pop() {
                Some(Undo::Pushed(s)) => {
                    self.stacks[s as usize].pop();
                }
                Some(Undo::Popped(s, f)) => self.stacks[s as usize].push(f),
                Some(Undo::Forked) => {
                    self.stacks.pop();
                }
                Some(Undo::Dropped(s, stack)) => self.stacks.insert(s as usize, stack),
                Some(Undo::Opened) => self.taken.close_last(),
                Some(Undo::Took(set, item)) => {
                    self.taken.remove(set as usize, item.of(&self.bytes))
                }
                None => break,
            }
        }
        self.bytes.truncate(mark.bytes);
    }

    /// Where a reply held to a context-free grammar stands, as a key the tokens allowed next
    /// depend on alone: its stacks. `None` for other grammars.
    pub fn state_key(&self) -> Option<StateKey> {
        let root = self.rule(self.grammar.root);
        root.cfg.as_ref()?;
        Some(StateKey(self.stacks.clone()))
    }

    /// Takes the stacks of `key` (from a matcher of the same grammar), with an empty log.
    pub fn load(&mut self, key: &StateKey) {
        self.stacks.clone_from(&key.0);
        self.log.clear();
    }

    /// Forgets the undo log: the bytes taken so far stay.
    pub fn commit(&mut self) {
        self.log.clear();
    }

    /// Every live stack inside a string that takes any characters in one spelling, between
    /// two of them, with room for as many more: the tokens allowed up to the closing quote do
    /// not depend on the rest of the stacks. A member's name is such a string where the object
    /// takes other names than its own, and so is a string held to a length alone.
    pub fn free_string(&self) -> Option<(Spelling, u32)> {
        let mut each = self.stacks.iter().map(|s| match *s.last()? {
            Frame::Str(StrAt::Plain) => Some((Spelling::Any, u32::MAX)),
            // Its closing quote is among the tokens leaving the string, each checked.
            Frame::UniqueStr {
                at: StrAt::Plain, ..
            } => Some((Spelling::Compact, u32::MAX)),
            Frame::Key {
                rule,
                at: StrAt::Plain,
                ..
            } if self.takes_any_name(s, rule) => {
                Some((self.object(rule).name_spelling(), u32::MAX))
            }
            Frame::Text {
                rule,
                at: StrAt::Plain,
                chars,
                ..
            } => match self.rule(rule).string.as_ref()? {
                s if s.pattern.is_none() => Some((Spelling::Compact, s.max - chars)),
                _ => None,
            },
            _ => None,
        });
        let first = each.next()??;
        each.all(|s| s == Some(first)).then_some(first)
    }

    /// Whether the name on top of `stack`, of an object of `rule`, may be any name: the object
    /// takes other names than its own, and has room for one more it does not require.
    fn takes_any_name(&self, stack: &[Frame], rule: RuleId) -> bool {
        let o = self.object(rule);
        let parent = stack.len().checked_sub(2).map(|i| stack[i]);
        let Some(Frame::Object { seen, members, .. }) = parent else {
            return false;
        };
        o.additional.is_some() && o.takes_optional(seen, members)
    }

    /// Where every live stack is inside one string held to a pattern, between characters, in
    /// one state: the pattern, its state, room for how many more characters and how many more
    /// a match needs at least. The tokens allowed up to the closing quote depend on these alone.
    pub fn held_text(&self) -> Option<(Arc<Pattern>, StateID, u32, u32)> {
        let top = *self.stacks.first()?.last()?;
        let Frame::Text {
            rule,
            at: StrAt::Plain,
            chars,
            state,
        } = top
        else {
            return None;
        };
        if self.stacks.iter().any(|s| s.last() != Some(&top)) {
            return None;
        }
        let s = self.rule(rule).string.as_ref()?;
        let least = s.min.saturating_sub(chars);
        Some((s.pattern.clone()?, state, s.max - chars, least))
    }

    fn stack(&self) -> &[Frame] {
        &self.stacks[self.cur]
    }

    fn push(&mut self, f: Frame) {
        self.stacks[self.cur].push(f);
        self.log.push(Undo::Pushed(self.cur as u16));
    }

    fn pop(&mut self) {
        if let Some(f) = self.stacks[self.cur].pop() {
            self.log.push(Undo::Popped(self.cur as u16, f));
        }
    }

    fn replace(&mut self, f: Frame) {
        self.pop();
        self.push(f);
    }

    fn rule(&self, id: RuleId) -> &Rule {
        self.grammar.rule(id)
    }

    fn object(&self, id: RuleId) -> &ObjectRule {
        self.rule(id)
            .object
            .as_ref()
            .expect("object frames are made for rules with objects")
    }

    fn step_top(&mut self, b: u8) -> Step {
        let Some(&top) = self.stack().last() else {
            return Step::Reject;
        };
        match top {
            Frame::Value { rule, ws } => self.value(rule, ws, b),
            Frame::Object {
                rule,
                seen,
                at,
                ws,
                members,
                names,
            } => self.object_byte(rule, (seen, members, names), at, ws, b),
            Frame::Key {
                rule,
                lo,
                hi,
                len,
                at,
                start,
            } => self.key(rule, (lo, hi, len, start), at, b),
            Frame::Array {
                rule,
                count,
                at,
                ws,
                used,
            } => self.array(rule, (count, used), at, ws, b),
            Frame::Str(at) => match at.step(b, Spelling::Any) {
                StrStep::Stay(next) => {
                    self.replace(Frame::Str(next));
                    Step::Took
                }
                StrStep::Close => self.finish(Step::Took),
                StrStep::Reject => Step::Reject,
            },
            Frame::Text {
                rule,
                at,
                chars,
                state,
            } => self.text(rule, (at, chars, state), b),
            Frame::UniqueStr { at, start } => self.unique_str(at, start, b),
            Frame::UniqueInt { at, start } => self.unique_int(at, start, b),
            Frame::Literal { rule, lo, hi, len } => self.literal(rule, lo, hi, len, b),
            Frame::Word { word, len } => {
                let w = WORDS[word as usize];
                if w.get(len as usize) != Some(&b) {
                    Step::Reject
                } else if len as usize + 1 == w.len() {
                    self.finish(Step::Took)
                } else {
                    self.replace(Frame::Word { word, len: len + 1 });
                    Step::Took
                }
            }
            Frame::Number { integer, at } => match number_step(at, b, integer) {
                Some(next) => {
                    self.replace(Frame::Number { integer, at: next });
                    Step::Took
                }
                None if at.is_end() => self.finish(Step::Again),
                None => Step::Reject,
            },
            Frame::Cfg { rule, alt, pos } => self.cfg_item(rule, alt, pos, b),
            Frame::CfgChar {
                rule,
                alt,
                pos,
                lo,
                hi,
                need,
            } => self.cfg_continue(rule, (alt, pos), (lo, hi, need), b),
            Frame::Pattern { rule, state } => {
                let pattern = self.rule(rule).pattern.as_ref();
                match pattern.map(|p| (p.next(state, b), p.matches(state))) {
                    Some((Some(state), _)) => {
                        self.replace(Frame::Pattern { rule, state });
                        Step::Took
                    }
                    // A value's text, ended by what follows it.
                    Some((None, true)) => self.finish(Step::Again),
                    _ => Step::Reject,
                }
            }
            Frame::Done => Step::Reject,
        }
    }

    fn value(&mut self, rule: RuleId, ws: u8, b: u8) -> Step {
        if self.rule(rule).cfg.is_some() {
            return self.cfg_start(rule);
        }
        let pattern = self.rule(rule).pattern.as_ref().map(|p| p.start());
        // Raw text alone (the whole reply) may begin with whitespace of its own.
        if is_ws(b) && (pattern.is_none() || ws < MAX_WHITESPACE) {
            return self.whitespace(Frame::Value { rule, ws: ws + 1 }, ws);
        }
        if let Some(state) = pattern {
            self.replace(Frame::Pattern { rule, state });
            return Step::Again;
        }
        let r = self.rule(rule);
        if !r.either.is_empty() {
            let grammar = self.grammar.clone();
            self.fork(&grammar.rule(rule).either, ws);
            return Step::Again;
        }
        let frame = match b {
            b'{' if r.object.is_some() => Frame::Object {
                rule,
                seen: 0,
                at: ObjectAt::Open,
                ws: 0,
                members: 0,
                names: 0,
            },
            b'[' if r.array.is_some() => Frame::Array {
                rule,
                count: 0,
                at: ArrayAt::Open,
                ws: 0,
                used: self.open_unique_set(rule),
            },
            b'"' => match &r.string {
                Some(s) if s.is_any() && self.unique_set().is_some() => Frame::UniqueStr {
                    at: StrAt::Plain,
                    start: self.bytes.len() as u32 - 1,
                },
                Some(s) if s.is_any() => Frame::Str(StrAt::Plain),
                Some(s) => Frame::Text {
                    rule,
                    at: StrAt::Plain,
                    chars: 0,
                    state: s.pattern.as_ref().map_or(StateID::ZERO, |p| p.start()),
                },
                None => return self.literal_start(rule, b),
            },
            b'-' | b'0'..=b'9' if r.number.is_some() && self.unique_set().is_some() => {
                return self.unique_int_start(b);
            }
            b'-' | b'0'..=b'9' if r.number.is_some() => Frame::Number {
                integer: r.number == Some(Numeric::Integer),
                at: match b {
                    b'-' => NumAt::Minus,
                    b'0' => NumAt::Zero,
                    _ => NumAt::Int,
                },
            },
            b't' | b'f' if r.boolean => Frame::Word {
                word: u8::from(b == b'f'),
                len: 1,
            },
            b'n' if r.null => Frame::Word { word: 2, len: 1 },
            _ => return self.literal_start(rule, b),
        };
        self.replace(frame);
        Step::Took
    }

    fn whitespace(&mut self, next: Frame, ws: u8) -> Step {
        if ws < MAX_WHITESPACE {
            self.replace(next);
            Step::Took
        } else {
            Step::Reject
        }
    }

    /// Ends the value on top: the frame below takes the next part.
    fn finish(&mut self, then: Step) -> Step {
        self.finish_item(then, 0)
    }

    /// [`finish`](Self::finish), where the value was literal `lo` of its rule: an array of
    /// unique items marks it taken.
    fn finish_literal(&mut self, then: Step, lo: u16) -> Step {
        let bit = if self.unique_items().is_some() {
            1u64 << lo
        } else {
            0
        };
        self.finish_item(then, bit)
    }

    /// The literals taken so far where the value on top is an item of an array of unique
    /// items (of at most [`MAX_UNIQUE_LITERALS`] literals, as the schema compiler makes them).
    fn unique_items(&self) -> Option<u64> {
        let stack = self.stack();
        let Frame::Array { rule, used, .. } = stack.len().checked_sub(2).map(|i| stack[i])? else {
            return None;
        };
        let a = self.rule(rule).array.as_ref()?;
        let fits = self.rule(a.items).literals.len() <= MAX_UNIQUE_LITERALS;
        (a.unique == Some(UniqueItems::Literals) && fits).then_some(used)
    }

    fn finish_item(&mut self, then: Step, bit: u64) -> Step {
        self.pop();
        let Some(&top) = self.stack().last() else {
            self.push(Frame::Done);
            return then;
        };
        let next = match top {
            Frame::Object {
                rule,
                seen,
                at: ObjectAt::Member,
                members,
                names,
                ..
            } => Frame::Object {
                rule,
                seen,
                at: ObjectAt::After,
                ws: 0,
                members: members + 1,
                names,
            },
            Frame::Array {
                rule, count, used, ..
            } => Frame::Array {
                rule,
                count: count + 1,
                at: ArrayAt::After,
                ws: 0,
                used: used | bit,
            },
            _ => return Step::Reject,
        };
        self.replace(next);
        then
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn number_step(at: NumAt, b: u8, integer: bool) -> Option<NumAt> {
    let digit = b.is_ascii_digit();
    Some(match (at, b) {
        (NumAt::Minus, b'0') => NumAt::Zero,
        (NumAt::Minus | NumAt::Int, _) if digit => NumAt::Int,
        (NumAt::Zero | NumAt::Int, b'.') if !integer => NumAt::Dot,
        (NumAt::Zero | NumAt::Int | NumAt::Frac, b'e' | b'E') if !integer => NumAt::E,
        (NumAt::Dot | NumAt::Frac, _) if digit => NumAt::Frac,
        (NumAt::E, b'+' | b'-') => NumAt::ESign,
        (NumAt::E | NumAt::ESign | NumAt::Exp, _) if digit => NumAt::Exp,
        _ => return None,
    })
}
