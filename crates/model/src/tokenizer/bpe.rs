//! Byte-pair merging of one pre-tokenized piece.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Merge table: `(left id, right id)` to `(rank, merged id)`.
#[derive(Debug, Default)]
pub(crate) struct Merges {
    map: HashMap<u64, (u32, u32)>,
}

#[inline]
fn key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

impl Merges {
    pub(crate) fn with_capacity(n: usize) -> Merges {
        Merges {
            map: HashMap::with_capacity(n),
        }
    }

    /// Adds a merge; an earlier (lower-rank) merge of the same pair wins.
    pub(crate) fn insert(&mut self, a: u32, b: u32, rank: u32, merged: u32) {
        self.map.entry(key(a, b)).or_insert((rank, merged));
    }

    #[inline]
    fn get(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        self.map.get(&key(a, b)).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Merges the symbols `ids` (one per byte, in order) by rank, lowest first, leftmost first
    /// among equal ranks, and appends the result to `out`. O(n log n) in the piece length.
    pub(crate) fn merge(&self, ids: &[u32], out: &mut Vec<u32>) {
        match ids.len() {
            0 => return,
            1 => {
                out.push(ids[0]);
                return;
            }
            _ => {}
        }
        let n = ids.len();
        let mut syms: Vec<Sym> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| Sym {
                id,
                prev: if i == 0 { NONE } else { i as u32 - 1 },
                next: if i + 1 == n { NONE } else { i as u32 + 1 },
            })
            .collect();
        let mut alive = vec![true; n];
        // (rank, left position): min-heap via Reverse.
        let mut heap: BinaryHeap<Reverse<(u32, u32)>> = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            if let Some((rank, _)) = self.get(ids[i], ids[i + 1]) {
                heap.push(Reverse((rank, i as u32)));
            }
        }
        while let Some(Reverse((rank, pos))) = heap.pop() {
            let i = pos as usize;
            if !alive[i] {
                continue;
            }
            let j = syms[i].next;
            if j == NONE {
                continue;
            }
            let j = j as usize;
            let Some((r, merged)) = self.get(syms[i].id, syms[j].id) else {
                continue;
            };
            if r != rank {
                continue; // stale entry: one side changed since it was queued
            }
            syms[i].id = merged;
            alive[j] = false;
            let after = syms[j].next;
            syms[i].next = after;
            if after != NONE {
                syms[after as usize].prev = i as u32;
                if let Some((r2, _)) = self.get(merged, syms[after as usize].id) {
                    heap.push(Reverse((r2, i as u32)));
                }
            }
            let before = syms[i].prev;
            if before != NONE
                && let Some((r0, _)) = self.get(syms[before as usize].id, merged)
            {
                heap.push(Reverse((r0, before)));
            }
        }
        let mut i = 0u32;
        while i != NONE {
            out.push(syms[i as usize].id);
            i = syms[i as usize].next;
        }
    }
}
