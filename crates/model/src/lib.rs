//! Model runtime: loading GGUF files and Hugging Face folders, tokenizing, and running the forward
//! pass on CPU with paged KV and sparse decode attention.

pub mod chat;
mod chat_limits;
pub mod chat_prompt;
pub mod config;
pub mod fetch;
mod forward_pass;
pub mod generate;
pub mod gguf;
pub mod gguf_model;
pub mod gpu_values;
pub mod grammar;
mod kv_state;
pub mod layers;
pub mod loader;
pub mod logprob;
pub mod model;
pub mod quantize;
pub mod random;
pub mod safetensors;
pub mod sampling;
pub mod tokenizer;
pub mod weights;
