//! What the grammar tests share: whether a schema takes a text, a small random generator, and
//! replies walked byte by byte through a matcher.
#![allow(dead_code)]

use std::sync::Arc;

use serde_json::Value;
use vortex_model::grammar::{Grammar, Matcher};

pub fn accepts(schema: &Value, text: &str) -> bool {
    let g = Arc::new(Grammar::from_schema(schema).expect("a supported schema"));
    let mut m = Matcher::new(g);
    m.advance(text.as_bytes()) && m.is_complete()
}

pub fn check(schema: Value, good: &[&str], bad: &[&str]) {
    for t in good {
        assert!(accepts(&schema, t), "{schema} should take {t}");
    }
    for t in bad {
        assert!(!accepts(&schema, t), "{schema} should refuse {t}");
    }
}

pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// A reply drawn byte by byte among those the grammar takes, until nothing may follow or, once
/// complete, by chance (one in `stop`; never where `stop` is 0). Spaces are drawn rarely, and a
/// run of digits stops at `digits` where something else may follow. Panics at a dead end.
pub fn random_reply(g: &Arc<Grammar>, rng: &mut Rng, stop: usize, digits: usize) -> Vec<u8> {
    let mut m = Matcher::new(g.clone());
    let mut text: Vec<u8> = Vec::new();
    while !m.is_done() {
        if stop > 0 && m.is_complete() && rng.below(stop) == 0 {
            break;
        }
        let run = text.iter().rev().take_while(|b| b.is_ascii_digit()).count();
        let all: Vec<u8> = (0..=255u8).filter(|&b| m.accepts(&[b])).collect();
        let mut next = all.clone();
        next.retain(|&b| b != b' ' || rng.below(8) == 0);
        if next.is_empty() {
            next = all;
        }
        if run >= digits && next.iter().any(|b| !b.is_ascii_digit()) {
            next.retain(|b| !b.is_ascii_digit());
        }
        assert!(
            !next.is_empty(),
            "a dead end after {}",
            String::from_utf8_lossy(&text)
        );
        let b = next[rng.below(next.len())];
        assert!(m.advance(&[b]));
        text.push(b);
    }
    text
}
