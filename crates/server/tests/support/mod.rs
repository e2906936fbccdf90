//! What the server's test suites share: the real server on a free loopback port, with a tiny
//! random model, and requests to it.
#![allow(dead_code)]

use std::sync::Arc;

use serde_json::{Value, json};
use vortex_engine::{Engine, EngineConfig, EngineHandle, Metrics, StepBudget};
use vortex_flow::Geometry;
use vortex_flow::runner::FlowRunner;
use vortex_kv::{KvCache, KvDtype, KvGeometry};
use vortex_model::model::KvState;
use vortex_server::AppState;

pub const PAGE: usize = 4;

pub struct Server {
    pub url: String,
    pub client: reqwest::Client,
}

pub async fn start(pages: usize, max_running: usize, api_key: Option<&str>) -> Server {
    start_with(pages, max_running, api_key, |_| {}).await
}

/// A server whose state `configure` adjusts before it starts.
pub async fn start_with(
    pages: usize,
    max_running: usize,
    api_key: Option<&str>,
    configure: impl FnOnce(&mut AppState),
) -> Server {
    let model = Arc::new(vortex_model::random::tiny(11));
    let c = model.model.config.clone();
    let geometry = Geometry {
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        head_dim: c.head_dim,
        page_size: PAGE,
    };
    let flow = vortex_flow::library::load("dense", geometry).unwrap();
    let settings = flow.settings.clone();
    let cache = KvCache::new(
        KvGeometry::new(c.heads_kv, c.head_dim, PAGE).unwrap(),
        KvDtype::F32,
        c.layers,
        pages,
    );
    let metrics = Arc::new(Metrics::default());
    let engine = Engine::new(
        model.clone(),
        KvState::new(cache, FlowRunner::new(flow)),
        EngineConfig {
            max_running,
            budget: StepBudget {
                max_batch_tokens: 64,
                prefill_chunk: 32,
            },
            prefix_caching: true,
            default_flow: "dense".into(),
            decode_ahead: true,
        },
        metrics.clone(),
    );
    let mut state = AppState::new(
        EngineHandle::spawn(engine, metrics),
        model,
        "tiny".into(),
        api_key.map(str::to_string),
        geometry,
        "dense".into(),
        settings,
        true,
    );
    state.kv_pool_tokens = pages * PAGE;
    configure(&mut state);
    let state = Arc::new(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(vortex_server::serve(listener, state));
    Server {
        url,
        client: reqwest::Client::new(),
    }
}

/// The source of the model crate's fixture chat template `name` (qwen3, qwen2.5, smollm2).
pub fn fixture_source(name: &str) -> String {
    let path = format!(
        "{}/../model/tests/fixtures/tokenizer/chat/{name}.jinja",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path).unwrap()
}

pub fn fixture_template(name: &str) -> vortex_model::chat::ChatTemplate {
    vortex_model::chat::ChatTemplate::new(&fixture_source(name), "", "<|im_end|>").unwrap()
}

/// A server whose model renders chats with the template `source`.
pub async fn start_with_source(source: &str, reasoning: bool, api_key: Option<&str>) -> Server {
    let chat = vortex_model::chat::ChatTemplate::new(source, "", "<|im_end|>").unwrap();
    start_with(256, 4, api_key, move |st| {
        let mut m = vortex_model::random::tiny(11);
        m.chat = chat;
        st.model = Arc::new(m);
        st.reasoning = reasoning;
    })
    .await
}

/// A server whose model renders chats with the fixture template `name`.
pub async fn start_with_template(name: &str) -> Server {
    start_with_source(&fixture_source(name), false, None).await
}

impl Server {
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    pub async fn post_raw(&self, path: &str, body: String) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    /// The data lines of a streamed response, `[DONE]` included.
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let text = self
            .client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// The chunks of a streamed response that ended with `[DONE]`.
    pub async fn chunks(&self, path: &str, body: &Value) -> Vec<Value> {
        let lines = self.stream(path, body).await;
        assert_eq!(
            lines.last().map(String::as_str),
            Some("[DONE]"),
            "{lines:?}"
        );
        lines[..lines.len() - 1]
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// A streamed completion of 3000 tokens, its response open (the body not yet read).
    pub async fn long_stream(&self) -> reqwest::Response {
        let mut body = greedy("Stream me something long", 3000);
        body["stream"] = json!(true);
        self.client
            .post(format!("{}/v1/completions", self.url))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// The text `/metrics` serves.
    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }
}

pub fn greedy(prompt: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

pub fn text_of(v: &Value, i: usize) -> String {
    v["choices"][i]["text"].as_str().unwrap().to_string()
}
