//! The states of a context-free grammar's matcher, numbered as they are met, with the state
//! each byte leads to: an automaton built lazily, so that walking the vocabulary for a mask
//! mostly looks up transitions instead of stepping the matcher's stacks.

use std::collections::HashMap;

use super::matcher::{Matcher, StateKey};

/// A transition not looked at yet.
const UNKNOWN: u32 = u32::MAX;
/// The byte is refused.
pub const DEAD: u32 = u32::MAX - 1;
/// States kept between walks: past these, all are forgotten before the next (a table of 1 KiB
/// each).
const MAX_STATES: usize = 2048;
/// States one walk may add: past these it gives up (see [`States::step`]).
const MAX_NEW_STATES: usize = 4 * MAX_STATES;

#[derive(Debug, Default, Clone)]
pub struct States {
    ids: HashMap<StateKey, u32>,
    keys: Vec<StateKey>,
    next: Vec<[u32; 256]>,
}

impl States {
    /// The number of the state `key`, where a walk begins: the states met in earlier walks are
    /// forgotten if there are too many.
    pub fn start(&mut self, key: StateKey) -> u32 {
        if self.keys.len() > MAX_STATES {
            *self = States::default();
        }
        self.id(key)
    }

    fn id(&mut self, key: StateKey) -> u32 {
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.ids.insert(key.clone(), id);
        self.keys.push(key);
        self.next.push([UNKNOWN; 256]);
        id
    }

    /// The state byte `b` leads to from state `s`, or [`DEAD`]; `scratch` is a matcher of the
    /// same grammar, whose state this changes. `None` once the states pass what one walk may
    /// add: a grammar whose states do not recur (each byte a new one) is walked without them.
    pub fn step(&mut self, scratch: &mut Matcher, s: u32, b: u8) -> Option<u32> {
        let known = self.next[s as usize][b as usize];
        if known != UNKNOWN {
            return Some(known);
        }
        if self.keys.len() > MAX_STATES + MAX_NEW_STATES {
            return None;
        }
        scratch.load(&self.keys[s as usize]);
        let to = if scratch.step(b) {
            self.id(scratch.state_key().expect("a grammar's matcher"))
        } else {
            DEAD
        };
        self.next[s as usize][b as usize] = to;
        Some(to)
    }
}
