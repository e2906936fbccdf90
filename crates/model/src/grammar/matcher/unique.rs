//! Items of arrays of unique strings and integers: each array begun gets a set of the items
//! taken, as written. A string equal to one taken may go on but not close; an integer equal to
//! one taken may go on but not end, and `0` (or `-0`), which cannot go on, may not begin.

use std::collections::HashSet;

use super::{Frame, Matcher, NumAt, Step, Undo, number_step};
use crate::grammar::rules::{RuleId, UniqueItems};
use crate::grammar::string::{Spelling, StrAt, StrStep};

impl Matcher {
    /// The `used` of a new array of `rule`: a new set of items taken where they are free
    /// strings and integers, else no literal taken.
    pub(super) fn open_unique_set(&mut self, rule: RuleId) -> u64 {
        let free = self
            .rule(rule)
            .array
            .as_ref()
            .is_some_and(|a| a.unique == Some(UniqueItems::Free));
        if !free {
            return 0;
        }
        self.taken.push(HashSet::new());
        self.log.push(Undo::Opened);
        (self.taken.len() - 1) as u64
    }

    /// The set of items taken where the value on top is an item of an array of unique strings
    /// and integers.
    pub(super) fn unique_set(&self) -> Option<usize> {
        let stack = self.stack();
        let Frame::Array { rule, used, .. } = stack.len().checked_sub(2).map(|i| stack[i])? else {
            return None;
        };
        let a = self.rule(rule).array.as_ref()?;
        (a.unique == Some(UniqueItems::Free)).then_some(used as usize)
    }

    fn zero_taken(&self) -> bool {
        self.unique_set()
            .is_some_and(|set| self.taken[set].contains(b"0".as_slice()))
    }

    pub(super) fn unique_str(&mut self, at: StrAt, start: u32, b: u8) -> Step {
        match at.step(b, Spelling::Compact) {
            StrStep::Stay(at) => {
                self.replace(Frame::UniqueStr { at, start });
                Step::Took
            }
            StrStep::Close => self.finish_unique(start, Step::Took),
            StrStep::Reject => Step::Reject,
        }
    }

    /// The first byte of an integer item.
    pub(super) fn unique_int_start(&mut self, b: u8) -> Step {
        let at = match b {
            b'-' => NumAt::Minus,
            b'0' => NumAt::Zero,
            _ => NumAt::Int,
        };
        if at == NumAt::Zero && self.zero_taken() {
            return Step::Reject;
        }
        let start = self.bytes.len() as u32 - 1;
        self.replace(Frame::UniqueInt { at, start });
        Step::Took
    }

    pub(super) fn unique_int(&mut self, at: NumAt, start: u32, b: u8) -> Step {
        match number_step(at, b, true) {
            Some(NumAt::Zero) if self.zero_taken() => Step::Reject,
            Some(at) => {
                self.replace(Frame::UniqueInt { at, start });
                Step::Took
            }
            // Ended by what follows.
            None if at.is_end() => self.finish_unique(start, Step::Again),
            None => Step::Reject,
        }
    }

    /// Ends the item on top, written from `start` up to the byte being taken, unless its set
    /// holds it already.
    fn finish_unique(&mut self, start: u32, then: Step) -> Step {
        let Some(set) = self.unique_set() else {
            return Step::Reject;
        };
        let mut item = self.bytes[start as usize..self.bytes.len() - 1].to_vec();
        if item == b"-0" {
            item.remove(0);
        }
        if !self.taken[set].insert(item.clone()) {
            return Step::Reject;
        }
        self.log.push(Undo::Took(set as u32, item));
        self.finish(then)
    }
}
