//! The HTTP routes: authentication, parsing, submitting to the engine, and answering whole or
//! as a stream of server-sent events. A client that goes away drops its event receivers, which
//! cancels its requests in the engine.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use vortex_engine::Event;

use crate::AppState;
use crate::admission::Ticket;
use crate::body::Body;
use crate::convert::{self, Prepared};
use crate::error::ApiError;
use crate::protocol::{ChatRequest, CompletionRequest, parse};
use crate::reasoning::ThinkStream;
use crate::respond::{self, Choice, Endpoint, Meta};
use crate::tools::CallStream;

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

/// A choice whose events ended without its finish or an error.
const ENGINE_STOPPED: &str = "the engine stopped before the request finished";

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

/// One accepted request on its way through the engine.
struct Run {
    st: Arc<AppState>,
    ep: Endpoint,
    id: String,
    /// When the request was accepted: every chunk of a stream carries the same.
    created: u64,
    prepared: Prepared,
    start: Instant,
    /// Held until the response is complete or the client has left.
    _ticket: Ticket,
}

impl Run {
    fn meta(&self) -> Meta<'_> {
        Meta {
            endpoint: self.ep,
            id: &self.id,
            created: self.created,
            model: &self.st.model_id,
            flow: &self.prepared.flow,
            settings: &self.prepared.settings,
            calling: self.prepared.calling.as_ref(),
            reasoning: self.ep == Endpoint::Chat && self.st.reasoning,
            thinking_opened: self.prepared.thinking_opened,
        }
    }

    async fn whole(self, rxs: Vec<UnboundedReceiver<Event>>) -> Response {
        let (tx, mut rx) = unbounded_channel();
        let n = rxs.len();
        forward_all(rxs, tx);
        let mut choices = vec![Choice::default(); n];
        let mut failure = None;
        while let Some((i, ev)) = rx.recv().await {
            match ev {
                Event::Delta {
                    text,
                    logprobs,
                    prompt,
                    ..
                } => {
                    choices[i].text.push_str(&text);
                    choices[i].logprobs.extend(logprobs);
                    choices[i].prompt_logprobs.extend(prompt);
                }
                Event::Finished { reason, usage, .. } => {
                    choices[i].finish = Some(reason);
                    choices[i].usage = usage;
                }
                // The other choices are cancelled as `rx` drops, not waited for.
                Event::Failed(e) => {
                    failure = Some(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e));
                    break;
                }
                Event::Refused(e) => {
                    failure = Some(ApiError::new(StatusCode::BAD_REQUEST, e));
                    break;
                }
            }
        }
        if failure.is_none() && choices.iter().any(|c| c.finish.is_none()) {
            failure = Some(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ENGINE_STOPPED,
            ));
        }
        if let Some(err) = failure {
            self.log(err.status, &choices);
            return err.into_response();
        }
        if let Some(echo) = &self.prepared.echo {
            for (i, c) in choices.iter_mut().enumerate() {
                c.text.insert_str(0, echo.text(i, n));
                let spec = &self.prepared.specs[i];
                c.echoed = Some((spec.prompt.clone(), spec.logprobs.is_some()));
            }
        }
        let tok = &self.st.model.tokenizer;
        let mut body = respond::full(&self.meta(), tok, &choices, &self.prepared.prompt_tokens);
        if self.prepared.prompt_logprobs.is_some() {
            let specs = &self.prepared.specs;
            let scored = |i: usize| {
                let (spec, c) = (&specs[i], &choices[i]);
                respond::vllm_prompt_logprobs(tok, &spec.prompt, &c.prompt_logprobs)
            };
            match self.ep {
                Endpoint::Completions => {
                    for i in 0..choices.len() {
                        body["choices"][i]["prompt_logprobs"] = scored(i);
                    }
                }
                // One prompt, whichever choice scored it.
                Endpoint::Chat => body["prompt_logprobs"] = scored(0),
            }
        }
        self.log(StatusCode::OK, &choices);
        Json(body).into_response()
    }

    fn stream(self, rxs: Vec<UnboundedReceiver<Event>>, include_usage: bool) -> Response {
        let (sse_tx, sse_rx) = tokio::sync::mpsc::channel::<SseEvent>(64);
        tokio::spawn(async move {
            let (tx, mut rx) = unbounded_channel();
            let n = rxs.len();
            forward_all(rxs, tx);
            let mut choices = vec![Choice::default(); n];
            let mut calls: Vec<Option<CallStream>> = (0..n)
                .map(|_| self.prepared.calling.clone().map(CallStream::new))
                .collect();
            let reasoning = self.meta().reasoning;
            let opened = self.prepared.thinking_opened;
            let mut thinks: Vec<Option<ThinkStream>> = (0..n)
                .map(|_| {
                    reasoning.then(|| {
                        let mut t = ThinkStream::default();
                        if opened {
                            t.push("<think>");
                        }
                        t
                    })
                })
                .collect();
            let send = |v: Value| SseEvent::default().data(v.to_string());
            if self.ep == Endpoint::Chat {
                for i in 0..n {
                    if sse_tx
                        .send(send(respond::chunk(&self.meta(), i, None, None, None)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            // Choices whose echoed prompt (`echo`) is still to be sent, before their first token.
            let mut echo_due = vec![self.prepared.echo.is_some(); n];
            // The status of the error sent, if one was.
            let mut failed: Option<StatusCode> = None;
            loop {
                let next = tokio::select! {
                    _ = sse_tx.closed() => break,
                    next = rx.recv() => next,
                };
                let Some((i, mut ev)) = next else {
                    // Every choice's events ended: one that neither finished nor failed was
                    // dropped by a stopped engine.
                    if failed.is_none() && choices.iter().any(|c| c.finish.is_none()) {
                        let err = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ENGINE_STOPPED);
                        failed = Some(err.status);
                        let _ = sse_tx.send(send(err.body())).await;
                    }
                    break;
                };
                if let Event::Delta { prompt, .. } = &mut ev {
                    choices[i].prompt_logprobs.append(prompt);
                }
                let mut out = Vec::new();
                let first = match &ev {
                    Event::Delta { text, tokens, .. } => !text.is_empty() || !tokens.is_empty(),
                    Event::Finished { .. } => true,
                    Event::Failed(_) | Event::Refused(_) => false,
                };
                if first && echo_due[i] {
                    echo_due[i] = false;
                    out.push(self.echo_chunk(i, &mut choices[i]));
                }
                let more = match ev {
                    Event::Delta { text, logprobs, .. } => {
                        choices[i].text.push_str(&text);
                        let mut out = Vec::new();
                        let text = match &mut thinks[i] {
                            Some(t) => {
                                let (thought, text) = t.push(&text);
                                if !thought.is_empty() {
                                    out.push(respond::reasoning_chunk(&self.meta(), i, &thought));
                                }
                                text
                            }
                            None => text,
                        };
                        // Text from a tool call on waits for the end of the reply.
                        let text = match &mut calls[i] {
                            Some(c) => c.push(&text),
                            None => text,
                        };
                        let lp = (!logprobs.is_empty()).then(|| {
                            respond::logprobs_json(
                                self.ep,
                                &self.st.model.tokenizer,
                                &logprobs,
                                &mut choices[i].offsets,
                            )
                        });
                        choices[i].logprobs.extend(logprobs);
                        match (out.last_mut(), lp) {
                            // Reasoning alone: its tokens' log-probabilities go with it.
                            (Some(thought), Some(lp)) if text.is_empty() => {
                                thought["choices"][0]["logprobs"] = lp;
                            }
                            (_, lp) if !text.is_empty() || lp.is_some() => {
                                out.push(respond::chunk(&self.meta(), i, Some(&text), lp, None));
                            }
                            _ => {}
                        }
                        out
                    }
                    Event::Finished { reason, usage, .. } => {
                        choices[i].finish = Some(reason);
                        choices[i].usage = usage;
                        let mut out = Vec::new();
                        let mut last = String::new();
                        if let Some(t) = thinks[i].take() {
                            let (thought, text) = t.finish();
                            if !thought.is_empty() {
                                out.push(respond::reasoning_chunk(&self.meta(), i, &thought));
                            }
                            last = text;
                        }
                        let (rest, made, ends_in_call) = match calls[i].take() {
                            Some(mut c) => {
                                let sent = c.push(&last);
                                let ends_in_call = c.ends_in_call();
                                let (rest, made) = c.finish();
                                (sent + &rest, made, ends_in_call)
                            }
                            None => (last, Vec::new(), false),
                        };
                        if !rest.is_empty() {
                            out.push(respond::chunk(&self.meta(), i, Some(&rest), None, None));
                        }
                        if !made.is_empty() {
                            out.push(respond::calls_chunk(&self.meta(), i, &made));
                        }
                        let finish =
                            respond::finish_with_calls(Some(reason.as_str()), &made, ends_in_call);
                        out.push(respond::chunk(&self.meta(), i, None, None, finish));
                        out
                    }
                    Event::Failed(e) => {
                        let err = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e);
                        failed = Some(err.status);
                        vec![err.body()]
                    }
                    Event::Refused(e) => {
                        let err = ApiError::new(StatusCode::BAD_REQUEST, e);
                        failed = Some(err.status);
                        vec![err.body()]
                    }
                };
                out.extend(more);
                if out.is_empty() {
                    continue;
                }
                // After an error nothing else is sent; the other choices are cancelled as
                // `rx` drops.
                let mut gone = false;
                for v in out {
                    gone = gone || sse_tx.send(send(v)).await.is_err();
                }
                if gone || failed.is_some() {
                    break;
                }
            }
            let finished = choices.iter().all(|c| c.finish.is_some());
            if finished {
                if include_usage {
                    let u =
                        respond::usage_chunk(&self.meta(), &self.prepared.prompt_tokens, &choices);
                    let _ = sse_tx.send(send(u)).await;
                }
                let _ = sse_tx.send(SseEvent::default().data("[DONE]")).await;
                self.log(StatusCode::OK, &choices);
            } else if let Some(status) = failed {
                self.log(status, &choices);
            } else {
                // The client left: its choices were cancelled.
                self.log(StatusCode::OK, &choices);
            }
        });
        let events = futures_util::stream::unfold(sse_rx, |mut rx| async move {
            rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
        });
        Sse::new(events)
            .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(1)))
            .into_response()
    }

    /// Choice `i`'s echoed prompt as a stream's chunk: its text, and its tokens'
    /// log-probabilities where they were asked for (`c` holds the prompt's scores so far: all
    /// of them, since they come before any token).
    fn echo_chunk(&self, i: usize, c: &mut Choice) -> Value {
        let echo = self.prepared.echo.as_ref().expect("an echoed request");
        let text = echo.text(i, self.prepared.specs.len());
        let spec = &self.prepared.specs[i];
        c.text.push_str(text);
        let tok = &self.st.model.tokenizer;
        let lp = spec.logprobs.map(|_| {
            respond::prompt_logprobs_json(tok, &spec.prompt, &c.prompt_logprobs, &mut c.offsets)
        });
        respond::chunk(&self.meta(), i, Some(text), lp, None)
    }

    fn log(&self, status: StatusCode, choices: &[Choice]) {
        let totals = respond::Totals::of(&self.prepared.prompt_tokens, choices);
        let finish: Vec<&str> = choices
            .iter()
            .map(|c| c.finish.map_or("cancelled", |f| f.as_str()))
            .collect();
        let detail = format!(
            "flow={} n={} prompt={} cached={} completion={} finish={}",
            self.prepared.flow,
            choices.len(),
            totals.prompt,
            totals.cached,
            totals.completion,
            finish.join(",")
        );
        log(&self.st, self.ep, &self.id, status, &detail, self.start);
    }
}

/// Forwards every choice's events into one channel, tagged with the choice index; stops when
/// that channel's receiver is gone, dropping the engine receivers (which cancels them).
/// Compares keys in a time that does not depend on where they differ.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

fn forward_all(rxs: Vec<UnboundedReceiver<Event>>, tx: UnboundedSender<(usize, Event)>) {
    for (i, mut rx) in rxs.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tx.closed() => break,
                    ev = rx.recv() => match ev {
                        Some(ev) => {
                            if tx.send((i, ev)).is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
        });
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn log(st: &AppState, ep: Endpoint, id: &str, status: StatusCode, detail: &str, start: Instant) {
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
