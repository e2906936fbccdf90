//! Values allowed one by one (`enum`, `const`), matched among a rule's sorted literals.

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
        } else if self.literal_ends(rule, lo, len) {
            // A number, ended by what follows it.
            self.finish(Step::Again)
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
        if hi - lo == 1 && self.literal_ends(rule, lo, len) {
            return self.finish(Step::Took);
        }
        self.replace(Frame::Literal { rule, lo, hi, len });
        Step::Took
    }

    pub(super) fn literal_ends(&self, rule: RuleId, lo: u16, len: u16) -> bool {
        self.rule(rule)
            .literals
            .get(lo as usize)
            .is_some_and(|l| l.len() == len as usize)
    }
}
