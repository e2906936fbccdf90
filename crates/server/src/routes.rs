//! The HTTP routes: authentication, parsing and submitting to the engine; `run.rs` answers,
//! whole or as a stream of server-sent events. A client that goes away drops its event
//! receivers, which cancels its requests in the engine.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::AppState;
use crate::body::Body;
use crate::convert::{self, Prepared};
use crate::error::ApiError;
use crate::protocol::{ChatRequest, CompletionRequest, parse};
use crate::respond::Endpoint;
use crate::run::Run;

type St = State<Arc<AppState>>;

pub async fn completions(State(st): St, headers: HeaderMap, body: Body) -> Response {
    handle(st, headers, body, Endpoint::Completions).await
}

pub async fn chat(State(st): St, headers: HeaderMap, body: Body) -> Response {
    handle(st, headers, body, Endpoint::Chat).await
}

pub async fn models(State(st): St, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [model_card(&st)]})).into_response()
}

pub async fn model(
    State(st): St,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    // An id that is not UTF-8 once decoded gets the API's JSON error, not the router's text.
    let id = match id {
        Ok(Path(id)) => id,
        Err(e) => return ApiError::bad_request(e.body_text()).into_response(),
    };
    if id != st.model_id {
        return ApiError::unknown_model(&id, &st.model_id).into_response();
    }
    Json(model_card(&st)).into_response()
}

fn model_card(st: &AppState) -> Value {
    json!({
        "id": st.model_id,
        "object": "model",
        "created": st.started,
        "owned_by": "vortex",
        // The longest sequence a request may reach: the model's context, or the KV pool.
        "max_model_len": crate::convert::context_limit(st).0,
    })
}

pub async fn health(State(st): St) -> Response {
    if st.engine.is_running() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped").into_response()
    }
}

pub async fn metrics(State(st): St) -> Response {
    let mut text = st.engine.metrics.render();
    text.push_str(&format!(
        "# HELP vortex_requests_held Requests the server holds (running, waiting or streaming).\n\
         # TYPE vortex_requests_held gauge\nvortex_requests_held {}\n",
        st.admission.held()
    ));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

pub async fn not_found(State(st): State<Arc<AppState>>, uri: Uri, headers: HeaderMap) -> Response {
    match key_first(&st, &uri, &headers) {
        Err(e) => e.into_response(),
        Ok(()) => ApiError::new(StatusCode::NOT_FOUND, "no such route").into_response(),
    }
}

pub async fn method_not_allowed(
    State(st): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let refused = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not take that method",
    );
    key_first(&st, &uri, &headers)
        .err()
        .unwrap_or(refused)
        .into_response()
}

/// Under the paths the key guards, a request without it is a 401 whatever the route or
/// method, as vLLM answers: it learns nothing of which routes exist.
fn key_first(st: &AppState, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
    let path = uri.path();
    let guarded =
        path == "/v1" || path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize";
    if guarded {
        authorize(st, headers)
    } else {
        Ok(())
    }
}

pub(crate) fn authorize(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &st.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, k)| k.trim());
    if given.is_some_and(|g| same_key(g.as_bytes(), key.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key (send 'Authorization: Bearer KEY')",
        ))
    }
}

async fn handle(st: Arc<AppState>, headers: HeaderMap, body: Body, ep: Endpoint) -> Response {
    let start = Instant::now();
    let body = match body.0 {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let ticket = match st.admission.admit() {
        Ok(t) => t,
        Err(full) => {
            st.engine.metrics.finished("rejected", None);
            let full = full.into_response();
            log(&st, ep, "-", full.status(), "error=\"server full\"", start);
            return full;
        }
    };
    // Parsing, templating and tokenizing a long prompt would hold up the server's other
    // connections on its few async threads.
    let prepared = {
        let st = st.clone();
        tokio::task::spawn_blocking(move || prepare(&st, &headers, &body, ep)).await
    };
    let prepared = prepared.unwrap_or_else(|e| {
        Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("preparing the request: {e}"),
        ))
    });
    match prepared {
        Ok((prepared, stream, include_usage)) => {
            let id = format!(
                "{}-{:016x}{:08x}",
                if ep == Endpoint::Chat {
                    "chatcmpl"
                } else {
                    "cmpl"
                },
                st.id_salt,
                st.next_id.fetch_add(1, Ordering::Relaxed)
            );
            let mut rxs = Vec::new();
            for spec in prepared.specs.iter().cloned() {
                match st.engine.submit(spec) {
                    Ok(rx) => rxs.push(rx),
                    Err(e) => {
                        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
                            .into_response();
                    }
                }
            }
            let run = Run {
                st,
                ep,
                id,
                created: now_secs(),
                prepared,
                start,
                _ticket: ticket,
            };
            if stream {
                run.stream(rxs, include_usage)
            } else {
                run.whole(rxs).await
            }
        }
        Err(e) => {
            st.engine.metrics.finished("rejected", None);
            log(
                &st,
                ep,
                "-",
                e.status,
                &format!("error={:?}", e.message),
                start,
            );
            e.into_response()
        }
    }
}

fn prepare(
    st: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    ep: Endpoint,
) -> Result<(Prepared, bool, bool), ApiError> {
    authorize(st, headers)?;
    let (prepared, common_stream, usage) = match ep {
        Endpoint::Completions => {
            let (c, r) = parse::<CompletionRequest>(body, false)?;
            let (s, u) = (
                c.stream,
                c.stream_options.as_ref().is_some_and(|o| o.include_usage),
            );
            (convert::completion(st, c, r)?, s, u)
        }
        Endpoint::Chat => {
            let (c, mut r) = parse::<ChatRequest>(body, true)?;
            r.tools_text = crate::protocol::raw_field(body, "tools");
            let (s, u) = (
                c.stream,
                c.stream_options.as_ref().is_some_and(|o| o.include_usage),
            );
            (convert::chat(st, c, r)?, s, u)
        }
    };
    Ok((prepared, common_stream, usage))
}

/// Compares keys in a time that does not depend on where they differ.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn log(
    st: &AppState,
    ep: Endpoint,
    id: &str,
    status: StatusCode,
    detail: &str,
    start: Instant,
) {
    if st.quiet {
        return;
    }
    eprintln!(
        "{} POST {} {} {} {detail} {:.1}ms",
        now_secs(),
        ep.path(),
        status.as_u16(),
        id,
        start.elapsed().as_secs_f64() * 1e3
    );
}

#[cfg(test)]
mod tests {
    use crate::reasoning::{self, ThinkStream};
    use crate::tools::{CallStream, Calling};

    /// Runs `pieces` through the stream path exactly as `Run::stream` chains it; returns
    /// (reasoning, content, call names).
    fn streamed(pieces: &[&str], calling: &Calling) -> (String, String, Vec<String>) {
        let mut think = ThinkStream::default();
        let mut calls = CallStream::new(calling.clone());
        let (mut r, mut c) = (String::new(), String::new());
        for p in pieces {
            let (thought, text) = think.push(p);
            r.push_str(&thought);
            c.push_str(&calls.push(&text));
        }
        let (thought, last) = think.finish();
        r.push_str(&thought);
        let sent = calls.push(&last);
        let (rest, made) = calls.finish();
        c.push_str(&(sent + &rest));
        (r, c, made.into_iter().map(|m| m.name).collect())
    }

    fn whole(text: &str, calling: &Calling) -> (String, String, Vec<String>) {
        let (r, rest) = reasoning::split(text);
        let (c, calls) = calling.split(&rest);
        (
            r.unwrap_or_default(),
            c,
            calls.into_iter().map(|m| m.name).collect(),
        )
    }

    #[test]
    fn stream_with_reasoning_and_tools_matches_whole() {
        let calling = Calling {
            parallel: true,
            names: vec!["f".into(), "g".into()],
            list: false,
        };
        let mut bad = Vec::new();
        for text in [
            "<think>\nr\n</think>\n\nHi <tool_call>{\"name\": \"f\"}</tool_call>",
            "<think>\nr\n</think>\n\n<tool_call>{\"name\": \"f\"}</tool_call>",
            "<think>r</think>\n\n{\"name\": \"f\", \"arguments\": {}}",
            "<think>r <tool_call>{\"name\": \"f\"}</tool_call></think>ok",
            "<think>\ncut <tool_call>",
            "Hi\n<tool_call>{\"name\": \"g\"}</tool_call>\n",
            "<think>\n\n</think>\n\n```json\n{\"name\": \"f\", \"arguments\": {}}\n```",
            "  <think>a\n</think>  \n <tool_call>{\"name\": \"f\"}</tool_call> tail",
            "<think>a</think>b<tool_call>{\"name\": \"h\"}</tool_call>",
            "<think>a</think><tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\"}</tool_call>",
            "<thin",
            " \n",
            "<think>é\n</thi\n",
        ] {
            let want = whole(text, &calling);
            let splits = crate::every_split(text);
            for pieces in splits {
                let got = streamed(&pieces, &calling);
                if got != want {
                    bad.push(format!(
                        "{text:?} {pieces:?}: stream {got:?} whole {want:?}"
                    ));
                    break;
                }
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
