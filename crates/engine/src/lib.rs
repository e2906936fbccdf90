//! The serving engine: one scheduler loop over a continuously batched set of requests.
