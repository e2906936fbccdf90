//! One streamed completion over HTTP, timed on the client; and the server's model list.

use std::time::Instant;

use reqwest::{Client, RequestBuilder, StatusCode};
use serde_json::Value;

use super::sse::{SseParser, parse_chunk};

/// What one streamed request did. Times are seconds from just before the request was sent.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// HTTP status, when a response came.
    pub status: Option<u16>,
    /// Why the request failed; `None` when it streamed to `[DONE]`.
    pub error: Option<String>,
    /// Arrival of each chunk that carried generated text (the first one is the TTFT).
    pub chunk_times: Vec<f64>,
    /// End of the stream (`[DONE]`), or of the failure.
    pub e2e: f64,
    /// `(prompt_tokens, completion_tokens)` from the usage chunk.
    pub usage: Option<(u64, u64)>,
}

impl Outcome {
    pub fn ttft(&self) -> Option<f64> {
        self.chunk_times.first().copied()
    }
}

fn authorize(req: RequestBuilder, api_key: Option<&str>) -> RequestBuilder {
    match api_key {
        Some(key) => req.bearer_auth(key),
        None => req,
    }
}

/// An error with its causes, which carry the useful part (`connection refused`).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !msg.contains(&s) {
            msg.push_str(": ");
            msg.push_str(&s);
        }
        cause = c.source();
    }
    msg
}

/// `HTTP 400: message` from an error response, with the OpenAI-style `error.message` if present.
async fn http_error(status: StatusCode, resp: reqwest::Response) -> String {
    let body = resp.text().await.unwrap_or_default();
    let msg = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| {
            let e = v.get("error")?;
            e.get("message")
                .and_then(Value::as_str)
                .or(e.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| body.trim().chars().take(200).collect());
    format!("HTTP {}: {msg}", status.as_u16())
}

/// POSTs `body` (a request with `"stream": true`) to `url` and reads the event stream to its end,
/// noting when each chunk with text arrives. Never fails: failures are in [`Outcome::error`].
pub async fn stream_completion(
    client: &Client,
    url: &str,
    api_key: Option<&str>,
    body: &Value,
) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome::default();
    let req = authorize(client.post(url).json(body), api_key);
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(error_chain(&e));
            out.e2e = start.elapsed().as_secs_f64();
            return out;
        }
    };
    let status = resp.status();
    out.status = Some(status.as_u16());
    if status != StatusCode::OK {
        out.error = Some(http_error(status, resp).await);
        out.e2e = start.elapsed().as_secs_f64();
        return out;
    }
    let mut parser = SseParser::default();
    let mut done = false;
    loop {
        let (events, eof) = match resp.chunk().await {
            Ok(Some(bytes)) => (parser.push(&bytes), false),
            Ok(None) => (parser.finish(), true),
            Err(e) => {
                out.error = Some(format!("stream broken: {}", error_chain(&e)));
                break;
            }
        };
        let now = start.elapsed().as_secs_f64();
        for data in events {
            let chunk = match parse_chunk(&data) {
                Ok(c) => c,
                Err(e) => {
                    out.error = Some(e);
                    break;
                }
            };
            if chunk.done {
                done = true;
                out.e2e = now;
                break;
            }
            if let Some(e) = chunk.error {
                out.error = Some(format!("error in stream: {e}"));
                break;
            }
            if chunk.text_len > 0 {
                out.chunk_times.push(now);
            }
            if chunk.usage.is_some() {
                out.usage = chunk.usage;
            }
        }
        if done || out.error.is_some() {
            break;
        }
        if eof {
            out.error = Some("stream ended without [DONE]".into());
            break;
        }
    }
    if !done {
        out.e2e = start.elapsed().as_secs_f64();
    }
    out
}

/// The ids the server's `GET {base}/v1/models` lists.
pub async fn list_models(
    client: &Client,
    base: &str,
    api_key: Option<&str>,
) -> Result<Vec<String>, String> {
    let url = format!("{base}/v1/models");
    let resp = authorize(client.get(&url), api_key)
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {}", error_chain(&e)))?;
    let status = resp.status();
    if status != StatusCode::OK {
        return Err(format!("GET {url}: {}", http_error(status, resp).await));
    }
    let v: Value = resp
        .json()
        .await
        .map_err(|e| format!("GET {url}: {}", error_chain(&e)))?;
    Ok(v.get("data")
        .and_then(Value::as_array)
        .map(|models| {
            models
                .iter()
                .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}
