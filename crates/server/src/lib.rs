//! The OpenAI-compatible HTTP API over the engine.
