//! The stacks of a matcher that follows several alternatives of a union at once: each takes
//! the byte, those it does not fit are dropped, and of equal ones one is kept.

use super::{Frame, Matcher, Step, Undo};
use crate::grammar::rules::RuleId;

impl Matcher {
    /// Takes one byte; on `false` the stacks may be half changed (roll back).
    pub fn step(&mut self, b: u8) -> bool {
        if self.records {
            self.bytes.push(b);
        }
        // Stacks forked on the way are added at the end, and take the byte in their turn.
        let mut i = 0;
        while i < self.stacks.len() {
            self.cur = i;
            if self.step_stack(b) {
                i += 1;
            } else if self.stacks.len() == 1 {
                return false;
            } else {
                self.drop_stack(i);
            }
        }
        if self.stacks.len() > 1 {
            self.merge_equal_stacks();
        }
        true
    }

    fn step_stack(&mut self, b: u8) -> bool {
        loop {
            match self.step_top(b) {
                Step::Took => return true,
                Step::Reject => return false,
                Step::Again => {}
            }
        }
    }

    /// Alternatives of a value that end alike leave equal stacks: one is kept.
    fn merge_equal_stacks(&mut self) {
        let mut i = 1;
        while i < self.stacks.len() {
            if self.stacks[..i].contains(&self.stacks[i]) {
                self.drop_stack(i);
            } else {
                i += 1;
            }
        }
    }

    fn drop_stack(&mut self, i: usize) {
        let stack = self.stacks.remove(i);
        self.log.push(Undo::Dropped(i as u16, stack));
    }

    /// The value on top of the current stack is one of `alternatives`: the current stack
    /// follows the first, a copy of it each other.
    pub(super) fn fork(&mut self, alternatives: &[RuleId], ws: u8) {
        for &rule in &alternatives[1..] {
            let mut copy = self.stacks[self.cur].clone();
            if let Some(top) = copy.last_mut() {
                *top = Frame::Value { rule, ws };
            }
            self.stacks.push(copy);
            self.log.push(Undo::Forked);
        }
        self.replace(Frame::Value {
            rule: alternatives[0],
            ws,
        });
    }
}
