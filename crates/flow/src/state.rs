//! Per-request flow state: values a flow keeps per page across decode steps (`state` fields).
//! It belongs to the request, indexed by the request's logical pages, so pages shared through a
//! prefix never carry one request's state into another.

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
}

impl RequestState {
    pub fn new(num_layers: usize, num_fields: usize) -> Self {
        let layer = LayerState {
            fields: vec![Vec::new(); num_fields],
        };
        Self {
            layers: vec![layer; num_layers],
            flow: 0,
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
