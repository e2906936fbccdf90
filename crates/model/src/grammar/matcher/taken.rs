//! Sets of items taken: an array's unique strings and integers, an object's names it does not
//! declare. A walk over many continuations takes items and rolls them back by the thousand, so
//! the sets and items rolled back are kept for reuse instead of freed.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

type Set = HashSet<Vec<u8>, BuildHasherDefault<ItemHasher>>;

#[derive(Debug, Clone, Default)]
pub(super) struct Taken {
    sets: Vec<Set>,
    spare_sets: Vec<Set>,
    spare_items: Vec<Vec<u8>>,
}

/// A multiply-rotate hash, 8 bytes at a time: items are short, and SipHash's cost showed in
/// every mask.
#[derive(Default)]
pub(super) struct ItemHasher(u64);

impl Hasher for ItemHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.add(u64::from_le_bytes(tail) ^ (bytes.len() as u64) << 56);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl ItemHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// An item as the undo log keeps it: its bytes in the reply, or its text where it is not
/// written as it reads (a name with escapes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Item {
    Bytes(u32, u32),
    Text(Vec<u8>),
}

impl Item {
    /// Its bytes, where `reply` is the reply's bytes.
    pub fn of<'a>(&'a self, reply: &'a [u8]) -> &'a [u8] {
        match self {
            Item::Bytes(start, end) => &reply[*start as usize..*end as usize],
            Item::Text(text) => text,
        }
    }
}

impl Taken {
    /// A new empty set; its index.
    pub fn open(&mut self) -> usize {
        let set = self.spare_sets.pop().unwrap_or_default();
        self.sets.push(set);
        self.sets.len() - 1
    }

    /// Drops the set opened last.
    pub fn close_last(&mut self) {
        if let Some(mut set) = self.sets.pop() {
            if !set.is_empty() {
                self.spare_items.extend(set.drain());
            }
            self.spare_sets.push(set);
        }
    }

    pub fn contains(&self, set: usize, item: &[u8]) -> bool {
        self.sets[set].contains(item)
    }

    /// Adds `item` to `set` unless it holds it: whether it was added.
    pub fn insert(&mut self, set: usize, item: &[u8]) -> bool {
        let mut owned = self.spare_items.pop().unwrap_or_default();
        owned.clear();
        owned.extend_from_slice(item);
        if let Some(owned) = self.sets[set].replace(owned) {
            // It was there: put back as it was (equal bytes), and keep the copy.
            self.spare_items.push(owned);
            return false;
        }
        true
    }

    pub fn remove(&mut self, set: usize, item: &[u8]) {
        if let Some(owned) = self.sets[set].take(item) {
            self.spare_items.push(owned);
        }
    }
}

#[cfg(test)]
impl Taken {
    /// Sets open, and items in them.
    pub fn counts(&self) -> (usize, usize) {
        (self.sets.len(), self.sets.iter().map(HashSet::len).sum())
    }
}
