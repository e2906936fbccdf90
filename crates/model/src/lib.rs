//! Model runtime: loading GGUF files and Hugging Face folders, tokenizing, and running the forward
//! pass on CPU with paged KV and sparse decode attention.

pub mod chat;
pub mod fetch;
pub mod gguf;
pub mod tokenizer;
