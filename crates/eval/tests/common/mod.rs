//! The tiny random byte-level chat model the model crate provides for tests.

use vortex_model::model::Model;
use vortex_model::tokenizer::Tokenizer;

pub fn tiny_model(seed: u64) -> Model {
    vortex_model::random::tiny(seed).model
}

/// One token per byte.
#[allow(dead_code)] // not every test file uses it
pub fn byte_tokenizer() -> Tokenizer {
    vortex_model::random::tiny(0).tokenizer
}
