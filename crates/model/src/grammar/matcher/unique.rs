//! Items of arrays of unique strings and integers: each array begun gets a set of the items
//! taken, as written. A string equal to one taken may go on but not close; an integer equal to
//! one taken may go on but not end, and `0` (or `-0`), which cannot go on, may not begin.
//! Likewise an object's names that it does not declare, in a set begun at the first of them.

use super::{Frame, Item, Matcher, NumAt, Step, Undo, number_step};
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
        let set = self.taken.open();
        self.log.push(Undo::Opened);
        set as u64
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
            .is_some_and(|set| self.taken.contains(set, b"0"))
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
        let end = self.bytes.len() as u32 - 1;
        // `-0` is taken as `0`.
        let start = if &self.bytes[start as usize..end as usize] == b"-0" {
            start + 1
        } else {
            start
        };
        if !self.take(set, Item::Bytes(start, end)) {
            return Step::Reject;
        }
        self.finish(then)
    }

    /// Takes the name of a member the object does not declare, written from `start` up to
    /// the closing quote being taken, into the object's set `names` (0: none yet, else 1 + its
    /// index). The object's set, unless the name was written before.
    pub(super) fn take_name(&mut self, names: u32, start: u32) -> Option<u32> {
        let end = self.bytes.len() as u32 - 1;
        let raw = &self.bytes[start as usize..end as usize];
        // A name in any spelling is compared as JSON reads it.
        let item = if raw.contains(&b'\\') {
            let quoted = &self.bytes[start as usize - 1..];
            Item::Text(serde_json::from_slice::<String>(quoted).ok()?.into_bytes())
        } else {
            Item::Bytes(start, end)
        };
        let names = if names == 0 {
            self.log.push(Undo::Opened);
            self.taken.open() as u32 + 1
        } else {
            names
        };
        self.take(names as usize - 1, item).then_some(names)
    }

    /// Adds `item` to `set` unless it holds it: whether it was added.
    fn take(&mut self, set: usize, item: Item) -> bool {
        if !self.taken.insert(set, item.of(&self.bytes)) {
            return false;
        }
        self.log.push(Undo::Took(set as u32, item));
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Matcher;
    use crate::grammar::Grammar;

    /// Bytes taken and rolled back (a refused advance, each token a mask tries) leave the
    /// sets of names and items as they were.
    #[test]
    fn a_rollback_gives_back_the_sets_and_items_it_took() {
        let schema = serde_json::json!({"type": "object", "properties": {
            "s": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}});
        let mut m = Matcher::new(Arc::new(Grammar::from_schema(&schema).unwrap()));
        assert!(m.advance(br#"{"a":1,"s":["x"],"b":[{"c":1,"#));
        let before = m.taken.counts();
        assert_eq!(before, (3, 4));
        for text in [
            &br#""d":1,"e":{"f":1,"g":2}}"#[..],
            br#""a":1}"#,
            br#""d":{"s":["y","z"]},"e":1"#,
        ] {
            assert!(m.accepts(text), "{}", String::from_utf8_lossy(text));
            assert_eq!(m.taken.counts(), before);
        }
        // Refused at the second "c", after "d" and an object were taken.
        assert!(!m.advance(br#""d":{"x":1},"c":1,"c""#));
        assert_eq!(m.taken.counts(), before);
    }
}
