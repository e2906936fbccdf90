//! Values allowed one by one (`enum`, `const`), matched among a rule's sorted literals; as
//! items of an array of unique items, among those not yet taken.

use super::{Frame, Matcher, Step};
use crate::grammar::rules::RuleId;

impl Matcher {
    pub(super) fn literal(&mut self, rule: RuleId, lo: u16, hi: u16, len: u16, b: u8) -> Step {
        let lits = &self.rule(rule).literals[lo as usize..hi as usize];
        let i = len as usize;
        let nlo = lo + lits.partition_point(|l| l.len() <= i || l[i] < b) as u16;
        let nhi = lo + lits.partition_point(|l| l.len() <= i || l[i] <= b) as u16;
        if nlo < nhi {
            self.literal_at(rule, nlo, nhi, len + 1)
        } else if self.literal_ends(rule, lo, len) && self.free(lo..lo + 1) {
            // A number, ended by what follows it.
            self.finish_literal(Step::Again, lo)
        } else {
            Step::Reject
        }
    }

    /// The first byte of one of the rule's literals.
    pub(super) fn literal_start(&mut self, rule: RuleId, b: u8) -> Step {
        let lits = &self.rule(rule).literals;
        let lo = lits.partition_point(|l| l[0] < b);
        let hi = lits.partition_point(|l| l[0] <= b);
        if lo == hi {
            return Step::Reject;
        }
        self.literal_at(rule, lo as u16, hi as u16, 1)
    }

    /// Among literals `lo..hi` after `len` bytes: done when only one is left, written whole.
    pub(super) fn literal_at(&mut self, rule: RuleId, lo: u16, hi: u16, len: u16) -> Step {
        if !self.free(lo..hi) {
            return Step::Reject;
        }
        if hi - lo == 1 && self.literal_ends(rule, lo, len) {
            return self.finish_literal(Step::Took, lo);
        }
        self.replace(Frame::Literal { rule, lo, hi, len });
        Step::Took
    }

    /// Whether one of literals `range` may still be written: for an item of an array of unique
    /// items, one not taken yet.
    fn free(&self, range: std::ops::Range<u16>) -> bool {
        match self.unique_items() {
            // At most 64 literals there (`MAX_UNIQUE_LITERALS`).
            Some(used) => range.into_iter().any(|i| used & (1u64 << i) == 0),
            None => true,
        }
    }

    pub(super) fn literal_ends(&self, rule: RuleId, lo: u16, len: u16) -> bool {
        self.rule(rule)
            .literals
            .get(lo as usize)
            .is_some_and(|l| l.len() == len as usize)
    }
}
