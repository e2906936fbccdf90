//! The OpenAI-compatible HTTP API over the engine: completions and chat (whole or streamed as
//! server-sent events), the model list, health and Prometheus metrics.

pub mod admission;
mod body;
pub mod convert;
pub mod error;
pub mod protocol;
pub mod reasoning;
pub mod respond;
pub mod response_format;
mod routes;
mod run;
mod tokenize;
pub mod tool_choice;
pub mod tools;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use vortex_engine::EngineHandle;
use vortex_flow::{Geometry, Settings};
use vortex_model::loader::LoadedModel;

/// Largest request body accepted.
pub(crate) const MAX_BODY: usize = 32 << 20;

/// What every handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    pub model: Arc<LoadedModel>,
    /// The name clients use for the model.
    pub model_id: String,
    pub api_key: Option<String>,
    /// The attention shape flows are checked for.
    pub geometry: Geometry,
    /// The server's flow and its settings, used unless a request names another.
    pub default_flow: String,
    pub default_settings: Settings,
    /// Seconds since the epoch when the server started.
    pub started: u64,
    /// Don't log one line per request.
    pub quiet: bool,
    /// Tokens the KV pool holds: no request may need more (default: unlimited).
    pub kv_pool_tokens: usize,
    /// Chat replies that open with `<think>` give their reasoning as `reasoning_content`
    /// (`--reasoning-parser qwen3`).
    pub reasoning: bool,
    /// The requests in flight and their limit (default: none).
    pub admission: admission::Admission,
    /// How long a request's body may go without a piece arriving (default: 60 s, as nginx
    /// waits).
    pub body_timeout: Duration,
    /// How long a client has to send a request's headers, from when it connects or from the
    /// response before (so an idle connection kept alive closes too); past it the connection
    /// closes, so that clients that stall cannot hold connections open (default: 30 s).
    pub header_timeout: Duration,
    pub(crate) next_id: AtomicU64,
    /// Random for each process: response ids differ across restarts and replicas.
    pub(crate) id_salt: u64,
    pub(crate) next_seed: AtomicU64,
    pub(crate) seed_salt: u64,
}

impl AppState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: EngineHandle,
        model: Arc<LoadedModel>,
        model_id: String,
        api_key: Option<String>,
        geometry: Geometry,
        default_flow: String,
        default_settings: Settings,
        quiet: bool,
    ) -> Self {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            engine,
            model,
            model_id,
            api_key,
            geometry,
            default_flow,
            default_settings,
            started,
            quiet,
            kv_pool_tokens: usize::MAX,
            reasoning: false,
            admission: admission::Admission::default(),
            body_timeout: Duration::from_secs(60),
            header_timeout: Duration::from_secs(30),
            next_id: AtomicU64::new(1),
            id_salt: process_salt(),
            next_seed: AtomicU64::new(1),
            seed_salt: process_salt(),
        }
    }
}

/// 64 random bits (the standard library's per-process hash keys), mixed with the time and the
/// process id.
fn process_salt() -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    std::time::SystemTime::now().hash(&mut h);
    std::process::id().hash(&mut h);
    h.finish()
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{id}", get(routes::model))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .with_state(state)
}

/// Serves until the process ends.
pub async fn serve(listener: TcpListener, state: Arc<AppState>) -> std::io::Result<()> {
    let header_timeout = state.header_timeout;
    let app = router(state);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // A connection that went before it was taken: nothing to wait for.
            Err(e) if is_connection_error(&e) => continue,
            // Out of file descriptors and the like: wait for connections to close.
            Err(e) => {
                eprintln!("vortex: accepting a connection failed: {e}; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // Streamed chunks are small: send each at once.
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// A text as a stream may bring it, for the stream parsers' tests: in two pieces at every
/// character boundary, and a character at a time.
#[cfg(test)]
fn every_split(text: &str) -> Vec<Vec<&str>> {
    let mut splits: Vec<Vec<&str>> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .map(|i| vec![&text[..i], &text[i..]])
        .collect();
    splits.push(text.split_inclusive(|_| true).collect());
    splits
}
