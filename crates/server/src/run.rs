//! One accepted request answered by the engine's events: whole, or as a stream of server-sent
//! events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use vortex_engine::Event;

use crate::AppState;
use crate::admission::Ticket;
use crate::convert::Prepared;
use crate::error::ApiError;
use crate::reasoning::ThinkStream;
use crate::respond::{self, Choice, Endpoint, Meta};
use crate::routes::log;
use crate::tools::CallStream;

/// A choice whose events ended without its finish or an error.
const ENGINE_STOPPED: &str = "the engine stopped before the request finished";

/// One accepted request on its way through the engine.
pub(crate) struct Run {
    pub(crate) st: Arc<AppState>,
    pub(crate) ep: Endpoint,
    pub(crate) id: String,
    /// When the request was accepted: every chunk of a stream carries the same.
    pub(crate) created: u64,
    pub(crate) prepared: Prepared,
    pub(crate) start: Instant,
    /// Held until the response is complete or the client has left.
    pub(crate) _ticket: Ticket,
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

    pub(crate) async fn whole(self, rxs: Vec<UnboundedReceiver<Event>>) -> Response {
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

    pub(crate) fn stream(
        self,
        rxs: Vec<UnboundedReceiver<Event>>,
        include_usage: bool,
    ) -> Response {
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
