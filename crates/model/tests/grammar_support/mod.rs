//! What the grammar tests share: whether a schema takes a text, a small random generator, and
//! replies walked byte by byte through a matcher.
#![allow(dead_code)]

use std::sync::Arc;

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};
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

/// Walks every text of up to `depth` pieces, each one of `pieces`, that `g` takes: none is a
/// dead end (no byte taken next, and not done), and `complete` sees each whole reply. Returns
/// how many texts were walked and how many were whole.
pub fn walk_prefixes(
    g: &Arc<Grammar>,
    pieces: &[&[u8]],
    depth: usize,
    mut complete: impl FnMut(&[u8]),
) -> (usize, usize) {
    let mut level = vec![Vec::<u8>::new()];
    let (mut walked, mut whole) = (0, 0);
    for _ in 0..depth {
        let mut next = Vec::new();
        for text in &level {
            let mut m = Matcher::new(g.clone());
            assert!(m.advance(text));
            let any = (0..=255u8).any(|b| m.accepts(&[b]));
            assert!(
                any || m.is_done(),
                "a dead end after {}",
                String::from_utf8_lossy(text)
            );
            if m.is_complete() {
                whole += 1;
                complete(text);
            }
            for &p in pieces {
                if m.accepts(p) {
                    next.push([text.as_slice(), p].concat());
                }
            }
        }
        walked += level.len();
        level = next;
    }
    (walked, whole)
}

/// Whether `text` is JSON none of whose objects writes a name twice (as JSON reads names).
pub fn no_name_twice(text: &[u8]) -> bool {
    serde_json::from_slice::<NoNameTwice>(text).is_ok()
}

/// A JSON value none of whose objects writes a name twice (as JSON reads names).
struct NoNameTwice;

impl<'de> Deserialize<'de> for NoNameTwice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoNameTwice)
    }
}

impl<'de> Visitor<'de> for NoNameTwice {
    type Value = NoNameTwice;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self, A::Error> {
        while a.next_element::<NoNameTwice>()?.is_some() {}
        Ok(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self, A::Error> {
        let mut names = std::collections::HashSet::new();
        while let Some(name) = a.next_key::<String>()? {
            if !names.insert(name) {
                return Err(A::Error::custom("a name twice"));
            }
            a.next_value::<NoNameTwice>()?;
        }
        Ok(self)
    }
}
