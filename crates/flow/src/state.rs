//! Per-request flow state: values a flow keeps per page across decode steps (`state` fields).
//! It belongs to the request, indexed by the request's logical pages, so pages shared through a
//! prefix never carry one request's state into another.

use std::sync::{Arc, Mutex, PoisonError};

/// One layer's state of one request: per state field, `[page][kv_head][rows * cols]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerState {
    pub fields: Vec<Vec<f32>>,
}

/// A request's state for every layer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestState {
    pub layers: Vec<LayerState>,
    /// Which of the engine's loaded flows this request runs (0: the default one).
    pub flow: usize,
    /// Where a backend that keeps the state in its own memory (a GPU) keeps this request's.
    pub slot: Option<StateSlot>,
}

impl RequestState {
    pub fn new(num_layers: usize, num_fields: usize) -> Self {
        let layer = LayerState {
            fields: vec![Vec::new(); num_fields],
        };
        Self {
            layers: vec![layer; num_layers],
            flow: 0,
            slot: None,
        }
    }
}

impl LayerState {
    /// Grows every field to cover `pages` pages (new pages start at zero).
    pub fn ensure(&mut self, pages: usize, kv_heads: usize, elems: &[usize]) {
        for (f, &e) in self.fields.iter_mut().zip(elems) {
            let want = pages * kv_heads * e;
            if f.len() < want {
                f.resize(want, 0.0);
            }
        }
    }
}

/// Numbered slots for requests' state in a backend's memory. A slot is free again when the
/// last handle to it drops, and the lowest free number is handed out first, so the numbers
/// stay below the most requests ever alive at once.
#[derive(Clone, Default)]
pub struct StateSlots(Arc<Mutex<SlotList>>);

#[derive(Default)]
struct SlotList {
    free: Vec<u32>,
    issued: u32,
}

/// A request's slot among [`StateSlots`]. Clones name the same slot (so two requests must not
/// share one; the GPU refuses a step where they do).
#[derive(Clone)]
pub struct StateSlot(Arc<Lease>);

struct Lease {
    id: u32,
    pool: Arc<Mutex<SlotList>>,
}

impl StateSlots {
    pub fn take(&self) -> StateSlot {
        let mut list = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let id = match list.free.iter().enumerate().min_by_key(|&(_, &id)| id) {
            Some((at, _)) => list.free.swap_remove(at),
            None => {
                list.issued += 1;
                list.issued - 1
            }
        };
        StateSlot(Arc::new(Lease {
            id,
            pool: self.0.clone(),
        }))
    }

    /// One more than the largest number handed out so far.
    pub fn issued(&self) -> u32 {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).issued
    }
}

impl StateSlot {
    pub fn id(&self) -> u32 {
        self.0.id
    }

    /// Whether the slot was taken from `slots` (not from a pool since replaced).
    pub fn of(&self, slots: &StateSlots) -> bool {
        Arc::ptr_eq(&self.0.pool, &slots.0)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut list = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        list.free.push(self.id);
    }
}

impl PartialEq for StateSlot {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for StateSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateSlot({})", self.0.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_lowest_first_once_every_handle_drops() {
        let slots = StateSlots::default();
        let (a, b, c) = (slots.take(), slots.take(), slots.take());
        assert_eq!((a.id(), b.id(), c.id()), (0, 1, 2));
        let b2 = b.clone();
        drop(b);
        assert_eq!(slots.take().id(), 3, "a clone still holds slot 1");
        drop((b2, c));
        let (d, e) = (slots.take(), slots.take());
        assert_eq!((d.id(), e.id()), (1, 2));
        assert_eq!(slots.issued(), 4);
        assert!(a.of(&slots) && !a.of(&StateSlots::default()));
    }
}
