//! Raw text a context-free grammar derives: each stack holds the alternatives begun, innermost
//! on top; a rule met is expanded into a stack for each of its alternatives (the stacks are
//! followed together, as a union's), and an alternative whose last item is a rule gives its
//! place to that rule, so that a repeat does not deepen the stack.

use super::{Frame, Matcher, Step, Undo};
use crate::grammar::cfg::{Alt, Cfg, Item};
use crate::grammar::rules::RuleId;

/// Stacks followed at once: more, from a grammar that leaves that many ways open, are dropped
/// (each left can still end, so the reply narrows but never breaks).
const MAX_CFG_STACKS: usize = 256;

impl Matcher {
    fn cfg(&self, rule: RuleId) -> &Cfg {
        self.rule(rule)
            .cfg
            .as_deref()
            .expect("grammar frames are made for rules with one")
    }

    /// The value of `rule` begins: its root rule's alternatives.
    pub(super) fn cfg_start(&mut self, rule: RuleId) -> Step {
        self.pop();
        let root = self.cfg(rule).root;
        self.cfg_expand(rule, root);
        Step::Again
    }

    /// A stack for each alternative of grammar rule `r`, on top of the current one.
    fn cfg_expand(&mut self, rule: RuleId, r: u32) {
        let n = self.cfg(rule).rules[r as usize].len();
        for i in 1..n {
            if self.stacks.len() >= MAX_CFG_STACKS {
                break;
            }
            let alt = self.cfg(rule).rules[r as usize][i];
            let mut copy = self.stacks[self.cur].clone();
            copy.push(Frame::Cfg { rule, alt, pos: 0 });
            self.stacks.push(copy);
            self.log.push(Undo::Forked);
        }
        let alt = self.cfg(rule).rules[r as usize][0];
        self.push(Frame::Cfg { rule, alt, pos: 0 });
    }

    pub(super) fn cfg_item(&mut self, rule: RuleId, alt: u32, pos: u32, b: u8) -> Step {
        let items = &self.cfg(rule).alts[alt as usize].items;
        let last = pos as usize + 1 == items.len();
        match items.get(pos as usize).copied() {
            // The alternative is written: the one below goes on (none: the text is whole).
            None => {
                self.pop();
                Step::Again
            }
            Some(Item::Rule(r)) => {
                if last {
                    self.pop();
                } else {
                    self.replace(Frame::Cfg {
                        rule,
                        alt,
                        pos: pos + 1,
                    });
                }
                self.cfg_expand(rule, r);
                Step::Again
            }
            Some(Item::Class(c)) => {
                // The code points a character beginning with `b` may be.
                let (lo, hi, need) = match b {
                    0x00..=0x7f => (u32::from(b), u32::from(b), 0),
                    0xc2..=0xdf => block(u32::from(b & 0x1f), 1),
                    0xe0 => (0x800, 0xfff, 2),
                    0xed => (0xd000, 0xd7ff, 2),
                    0xe1..=0xef => block(u32::from(b & 0x0f), 2),
                    0xf0 => (0x1_0000, 0x3_ffff, 3),
                    0xf1..=0xf3 => block(u32::from(b & 0x07), 3),
                    0xf4 => (0x10_0000, 0x10_ffff, 3),
                    _ => return Step::Reject,
                };
                self.cfg_char(rule, (alt, pos), c, (lo, hi, need))
            }
        }
    }

    pub(super) fn cfg_continue(
        &mut self,
        rule: RuleId,
        (alt, pos): (u32, u32),
        (lo, hi, need): (u32, u32, u8),
        b: u8,
    ) -> Step {
        if !(0x80..=0xbf).contains(&b) {
            return Step::Reject;
        }
        let Item::Class(c) = self.cfg(rule).alts[alt as usize].items[pos as usize] else {
            return Step::Reject;
        };
        // The bits above this byte's are the same for every code point in lo..=hi.
        let below = 6 * u32::from(need - 1);
        let base = (((lo >> (below + 6)) << 6) | u32::from(b & 0x3f)) << below;
        let (lo, hi) = (lo.max(base), hi.min(base | ((1 << below) - 1)));
        if lo > hi {
            return Step::Reject;
        }
        self.cfg_char(rule, (alt, pos), c, (lo, hi, need - 1))
    }

    /// Takes a byte of the character of item `pos`, whose code point now lies in `lo..=hi`.
    fn cfg_char(
        &mut self,
        rule: RuleId,
        (alt, pos): (u32, u32),
        class: u32,
        (lo, hi, need): (u32, u32, u8),
    ) -> Step {
        if !self.cfg(rule).class_meets(class, lo, hi) {
            return Step::Reject;
        }
        self.replace(if need == 0 {
            Frame::Cfg {
                rule,
                alt,
                pos: pos + 1,
            }
        } else {
            Frame::CfgChar {
                rule,
                alt,
                pos,
                lo,
                hi,
                need,
            }
        });
        Step::Took
    }

    /// Whether `stack` is inside a grammar's text that is whole and can take nothing more.
    pub(super) fn cfg_done(&self, stack: &[Frame]) -> bool {
        self.cfg_rest(stack, |alt, pos| alt.closed[pos])
            || self
                .cfg_root(stack)
                .is_some_and(|(cfg, alts)| alts.iter().all(|&a| cfg.alts[a as usize].closed[0]))
    }

    /// Whether `stack` is inside a grammar's text that may end here: what each of its
    /// alternatives has left can be empty.
    pub(super) fn cfg_ends(&self, stack: &[Frame]) -> bool {
        self.cfg_rest(stack, |alt, pos| alt.nullable[pos])
            || self
                .cfg_root(stack)
                .is_some_and(|(cfg, alts)| alts.iter().any(|&a| cfg.alts[a as usize].nullable[0]))
    }

    /// Where `stack` is a grammar's reply not begun: the grammar and its root's alternatives.
    fn cfg_root(&self, stack: &[Frame]) -> Option<(&Cfg, &[u32])> {
        let [Frame::Value { rule, .. }] = *stack else {
            return None;
        };
        let cfg = self.rule(rule).cfg.as_deref()?;
        Some((cfg, &cfg.rules[cfg.root as usize]))
    }

    /// Whether `stack` holds a grammar's alternatives only, and `rest` holds for what each has
    /// left.
    fn cfg_rest(&self, stack: &[Frame], rest: impl Fn(&Alt, usize) -> bool) -> bool {
        !stack.is_empty()
            && stack.iter().all(|f| match *f {
                Frame::Cfg { rule, alt, pos } => {
                    rest(&self.cfg(rule).alts[alt as usize], pos as usize)
                }
                _ => false,
            })
    }
}

/// The code points whose UTF-8 begins with `bits` and has `need` bytes after the first.
fn block(bits: u32, need: u8) -> (u32, u32, u8) {
    let shift = 6 * u32::from(need);
    (bits << shift, (bits << shift) | ((1 << shift) - 1), need)
}
