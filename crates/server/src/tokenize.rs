//! `POST /tokenize` and `POST /detokenize`, as vLLM serves them: a prompt's or a conversation's
//! tokens as generation would see them, and tokens back to text.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::body::Body;
use crate::convert::chat_tokens;
use crate::error::ApiError;
use crate::protocol::{ChatRequest, brief, parse, raw_field};
use crate::routes::authorize;

/// `{"prompt": text, "add_special_tokens"?}` or a chat request's `messages` (with `tools`,
/// `chat_template_kwargs`; `add_generation_prompt` true as generation renders them):
/// `{"count", "max_model_len", "tokens"}`.
pub async fn tokenize(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let answer = async {
        authorize(&st, &headers)?;
        let body = body.0?;
        let st2 = st.clone();
        tokio::task::spawn_blocking(move || tokens_of(&st2, &body))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    };
    match answer.await {
        Ok(tokens) => Json(json!({
            "count": tokens.len(),
            "max_model_len": crate::convert::context_limit(&st).0,
            "tokens": tokens,
        }))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

fn tokens_of(st: &AppState, body: &[u8]) -> Result<Vec<u32>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    map.retain(|_, v| !v.is_null());
    check_model(st, map.remove("model"))?;
    if map.contains_key("messages") {
        if let Some(v) = map.remove("add_generation_prompt")
            && v != Value::Bool(true)
        {
            return Err(ApiError::bad_param(
                "add_generation_prompt",
                "only 'add_generation_prompt': true is supported (the prompt ends ready for the \
                 assistant's reply, as generation renders it)",
            ));
        }
        if let Some(k) = map.keys().find(|k| {
            !matches!(
                k.as_str(),
                "messages" | "tools" | "tool_choice" | "chat_template_kwargs"
            )
        }) {
            return Err(ApiError::bad_param(
                k,
                format!("unknown field '{}'", brief(k)),
            ));
        }
        let rebuilt = serde_json::to_vec(&map).unwrap_or_default();
        let (_, mut req) = parse::<ChatRequest>(&rebuilt, true)?;
        req.tools_text = raw_field(body, "tools");
        return Ok(chat_tokens(st, &req)?.0);
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Prompt {
        prompt: String,
        add_special_tokens: Option<bool>,
    }
    let p: Prompt = serde_json::from_value(Value::Object(map))
        .map_err(|e| ApiError::bad_request(format!("expected 'prompt' or 'messages': {e}")))?;
    Ok(st
        .model
        .tokenizer
        .encode(&p.prompt, p.add_special_tokens.unwrap_or(true)))
}

/// `{"tokens": [ids]}`: `{"prompt": text}`, control tokens included.
pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = || -> Result<String, ApiError> {
        authorize(&st, &headers)?;
        let body = body.0?;
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Tokens {
            model: Option<String>,
            tokens: Vec<u32>,
        }
        let t: Tokens = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_param("tokens", format!("expected 'tokens', ids: {e}")))?;
        check_model(st.as_ref(), t.model.map(Value::String))?;
        let tok = &st.model.tokenizer;
        if let Some(&id) = t.tokens.iter().find(|&&id| id as usize >= tok.vocab_size()) {
            return Err(ApiError::bad_param(
                "tokens",
                format!(
                    "token {id} is outside the vocabulary of {}",
                    tok.vocab_size()
                ),
            ));
        }
        Ok(tok.decode(&t.tokens))
    };
    match answer() {
        Ok(text) => Json(json!({"prompt": text})).into_response(),
        Err(e) => e.into_response(),
    }
}

fn check_model(st: &AppState, model: Option<Value>) -> Result<(), ApiError> {
    match model {
        None => Ok(()),
        Some(Value::String(m)) if m == st.model_id => Ok(()),
        Some(other) => Err(ApiError::unknown_model(
            other.as_str().unwrap_or(&other.to_string()),
            &st.model_id,
        )),
    }
}
