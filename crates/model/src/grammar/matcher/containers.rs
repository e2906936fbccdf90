//! Objects (their members' names matched against the declared properties, other names against
//! those written before) and arrays.

use super::{ADDITIONAL, ArrayAt, Frame, Matcher, ObjectAt, Step, is_ws};
use crate::grammar::rules::{Property, RuleId};
use crate::grammar::string::{StrAt, StrStep};

impl Matcher {
    pub(super) fn object_byte(
        &mut self,
        rule: RuleId,
        (seen, members, names): (u64, u32, u32),
        at: ObjectAt,
        ws: u8,
        b: u8,
    ) -> Step {
        let frame = |at, ws| Frame::Object {
            rule,
            seen,
            at,
            ws,
            members,
            names,
        };
        if is_ws(b) && at != ObjectAt::Member {
            return self.whitespace(frame(at, ws + 1), ws);
        }
        let o = self.object(rule);
        let missing = o.required & !seen != 0;
        let props = o.properties.len();
        let additional = o.additional;
        // Another member: one still required, or any other while those fit beside it.
        let optional = o.takes_optional(seen, members);
        let more = missing
            || optional && (additional.is_some() || (0..props).any(|p| seen & (1 << p) == 0));
        let ends = !missing && members >= o.min_members;
        let value_of = |prop: u16| o.properties.get(prop as usize).map(|p| p.value);
        let member = match at {
            ObjectAt::Colon { prop: ADDITIONAL } => additional.map(|v| (v, seen)),
            ObjectAt::Colon { prop } => value_of(prop).map(|v| (v, seen | 1 << prop)),
            _ => None,
        };
        match (at, b) {
            (ObjectAt::Open | ObjectAt::Comma, b'"') if more => {
                self.replace(frame(at, 0));
                self.push(Frame::Key {
                    rule,
                    lo: 0,
                    hi: props as u16,
                    len: 0,
                    at: StrAt::Plain,
                    start: self.bytes.len() as u32,
                });
                Step::Took
            }
            (ObjectAt::Open | ObjectAt::After, b'}') if ends => self.finish(Step::Took),
            (ObjectAt::After, b',') if more => {
                self.replace(frame(ObjectAt::Comma, 0));
                Step::Took
            }
            (ObjectAt::Colon { .. }, b':') => {
                let Some((value, seen)) = member else {
                    return Step::Reject;
                };
                self.replace(Frame::Object {
                    rule,
                    seen,
                    at: ObjectAt::Member,
                    ws: 0,
                    members,
                    names,
                });
                self.push(Frame::Value { rule: value, ws: 0 });
                Step::Took
            }
            _ => Step::Reject,
        }
    }

    pub(super) fn key(
        &mut self,
        rule: RuleId,
        (lo, hi, len, start): (u16, u16, u16, u32),
        at: StrAt,
        b: u8,
    ) -> Step {
        let stack = self.stack();
        let Some(&Frame::Object {
            seen,
            members,
            names,
            ..
        }) = stack.len().checked_sub(2).map(|i| &stack[i])
        else {
            return Step::Reject;
        };
        let o = self.object(rule);
        let props = &o.properties[lo as usize..hi as usize];
        let optional = o.takes_optional(seen, members);
        // A declared member not written yet, which the object requires or has room for.
        let open = |p: u16| seen & (1 << p) == 0 && (optional || o.required & (1 << p) != 0);
        let additional = o.additional.filter(|_| optional);
        match at.step(b, o.name_spelling()) {
            StrStep::Reject => Step::Reject,
            StrStep::Close => {
                let exact = props.first().is_some_and(|p| p.key.len() == len as usize);
                let prop = match (exact, additional) {
                    (true, _) if open(lo) => lo,
                    (false, Some(_)) => ADDITIONAL,
                    _ => return Step::Reject,
                };
                let names = match prop {
                    ADDITIONAL => match self.take_name(names, start) {
                        Some(names) => names,
                        None => return Step::Reject,
                    },
                    _ => names,
                };
                self.pop();
                self.replace(Frame::Object {
                    rule,
                    seen,
                    at: ObjectAt::Colon { prop },
                    ws: 0,
                    members,
                    names,
                });
                Step::Took
            }
            StrStep::Stay(next) => {
                let i = len as usize;
                let below = |p: &Property| p.key.len() <= i || p.key[i] < b;
                let upto = |p: &Property| p.key.len() <= i || p.key[i] <= b;
                let (nlo, nhi) = (
                    lo + props.partition_point(below) as u16,
                    lo + props.partition_point(upto) as u16,
                );
                if additional.is_none() && !(nlo..nhi).any(open) {
                    return Step::Reject;
                }
                self.replace(Frame::Key {
                    rule,
                    lo: nlo,
                    hi: nhi,
                    len: len.saturating_add(1),
                    at: next,
                    start,
                });
                Step::Took
            }
        }
    }

    pub(super) fn array(
        &mut self,
        rule: RuleId,
        (count, used): (u32, u64),
        at: ArrayAt,
        ws: u8,
        b: u8,
    ) -> Step {
        let frame = |count, at, ws| Frame::Array {
            rule,
            count,
            at,
            ws,
            used,
        };
        if is_ws(b) {
            return self.whitespace(frame(count, at, ws + 1), ws);
        }
        let Some(a) = self.rule(rule).array.as_ref() else {
            return Step::Reject;
        };
        let (min, max, item) = (a.min, a.max, a.item(count));
        match (at, b) {
            (ArrayAt::Open, b']') if min == 0 => self.finish(Step::Took),
            (ArrayAt::After, b']') if count >= min => self.finish(Step::Took),
            (ArrayAt::After, b',') if count < max => {
                self.replace(frame(count, ArrayAt::Comma, 0));
                Step::Took
            }
            (ArrayAt::Open, _) if max == 0 => Step::Reject,
            (ArrayAt::Open | ArrayAt::Comma, _) => {
                self.replace(frame(count, ArrayAt::Item, 0));
                self.push(Frame::Value { rule: item, ws: 0 });
                Step::Again
            }
            _ => Step::Reject,
        }
    }
}
