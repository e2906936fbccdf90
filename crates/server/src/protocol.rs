//! The request bodies of the OpenAI-compatible endpoints, parsed strictly: an unknown field or
//! a value of the wrong type is a 400 that names it. A `null` is an absent field, and OpenAI
//! fields this server does not implement are accepted when they ask for nothing.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::error::ApiError;

/// A struct from a JSON object only (serde's derive also takes an array of the fields' values
/// in order, which no client means).
fn object<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    Option::<serde_json::Map<String, Value>>::deserialize(d)?
        .map(|m| serde_json::from_value(Value::Object(m)).map_err(serde::de::Error::custom))
        .transpose()
}

/// A list of structs, each from a JSON object only, as [`object`].
fn objects<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Vec<T>, D::Error> {
    Vec::<serde_json::Map<String, Value>>::deserialize(d)?
        .into_iter()
        .map(|m| serde_json::from_value(Value::Object(m)).map_err(serde::de::Error::custom))
        .collect()
}

/// Fields both endpoints accept.
const COMMON: [&str; 31] = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "user",
    "stream",
    "stream_options",
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "min_tokens",
    "stop_token_ids",
    "vortex",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_choice",
    "guided_regex",
    "guided_grammar",
    "grammar",
    "prompt_logprobs",
];
const COMPLETION_ONLY: [&str; 2] = ["prompt", "echo"];
const CHAT_ONLY: [&str; 7] = [
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "chat_template_kwargs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];
/// OpenAI fields without an implementation here, by endpoint.
const COMPLETION_UNSUPPORTED: [&str; 2] = ["best_of", "suffix"];
const CHAT_UNSUPPORTED: [&str; 6] = [
    "functions",
    "function_call",
    "store",
    "metadata",
    "service_tier",
    "modalities",
];

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    /// Signed, as in OpenAI's schema; the sampler takes its bits.
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string, as in OpenAI's schema) to a bias added to its logit.
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    pub user: Option<String>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, deserialize_with = "object")]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub ignore_eos: bool,
    /// vLLM's: the stop string that ended the text stays at its end.
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    /// vLLM's: control tokens are left out of the text (the default).
    pub skip_special_tokens: Option<bool>,
    /// vLLM's: nothing ends the generation before this many tokens.
    pub min_tokens: Option<u64>,
    /// vLLM's: token ids that end the generation, as the model's end tokens do (left out of
    /// the text).
    pub stop_token_ids: Option<Vec<i64>>,
    #[serde(default, deserialize_with = "object")]
    pub vortex: Option<VortexOptions>,
    /// Free text, one JSON object, or JSON a schema describes (checked in
    /// `response_format.rs`).
    pub response_format: Option<Value>,
    /// vLLM's ways to hold a reply: `{"json": schema}`, `{"json_object": true}`, `{"choice":
    /// [texts]}`, `{"regex": expression}` or `{"grammar": gbnf}`, and the older `guided_json`
    /// (a schema, or its text).
    pub structured_outputs: Option<Value>,
    pub guided_json: Option<Value>,
    /// vLLM's: the reply is one of these texts.
    pub guided_choice: Option<Value>,
    /// vLLM's: the reply is text this regular expression matches whole.
    pub guided_regex: Option<Value>,
    /// vLLM's: the reply is text this GBNF grammar derives.
    pub guided_grammar: Option<Value>,
    /// llama.cpp's: the same.
    pub grammar: Option<Value>,
    /// vLLM's: each prompt token's log-probability, with this many most likely tokens.
    pub prompt_logprobs: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The per-request sparse-attention choice: a built-in flow and settings that override the
/// flow's own (and the server's) for this request.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VortexOptions {
    pub flow: Option<String>,
    pub budget: Option<f64>,
    pub budget_ratio: Option<f64>,
    pub sinks: Option<f64>,
    pub recent: Option<f64>,
    pub dense_layers: Option<Vec<f64>>,
    pub min_context: Option<f64>,
    pub tolerance: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// Log-probabilities of this many alternatives per token (0: only the chosen token's).
    pub logprobs: Option<u64>,
    /// The text (and with `logprobs`, the log-probabilities) begins with the prompt's.
    #[serde(default)]
    pub echo: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    #[serde(deserialize_with = "objects")]
    pub messages: Vec<Message>,
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<u64>,
    /// Extra variables for the chat template, e.g. `{"enable_thinking": false}` (vLLM's).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Function definitions (checked in `tools.rs`).
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// The `tools` array as the client wrote it, keys in their order (set by `parse`).
    #[serde(skip)]
    pub tools_text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    /// Absent or `null` in an assistant message that only called tools.
    pub content: Option<Content>,
    pub name: Option<String>,
    /// An assistant's calls (checked in `tools.rs`).
    pub tool_calls: Option<Value>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
    /// OpenAI's older form of a tool call: accepted so that such a history gets a clear
    /// message.
    pub function_call: Option<Value>,
    /// What OpenAI returns in an assistant message, sent back with the history; not given to
    /// the template.
    pub refusal: Option<String>,
    /// An assistant's reasoning as `--reasoning-parser` returned it: given to the template
    /// (Qwen3's writes it back for the turns after the last user message).
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(#[serde(deserialize_with = "objects")] Vec<ContentPart>),
}

/// One part of a message's content; parts other than text carry other keys.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

impl Content {
    pub fn text(&self) -> Result<String, ApiError> {
        match self {
            Content::Text(t) => Ok(t.clone()),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    ("text", None) => Err(ApiError::bad_param(
                        "messages",
                        "a content part of type 'text' needs its 'text'",
                    )),
                    (kind, _) => Err(ApiError::bad_param(
                        "messages",
                        format!("content parts of type '{kind}' are not supported (only text)"),
                    )),
                })
                .collect(),
        }
    }
}

/// Parses a request body: JSON object, known fields only, right types.
pub fn parse<T: DeserializeOwned>(body: &[u8], chat: bool) -> Result<(Common, T), ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    map.retain(|_, v| !v.is_null());
    // A message's `null` fields too (a history sent back holds `"refusal": null` and the like).
    if let Some(Value::Array(messages)) = map.get_mut("messages") {
        for m in messages {
            if let Value::Object(fields) = m {
                fields.retain(|_, v| !v.is_null());
            }
        }
    }
    let unsupported: &[&str] = if chat {
        &CHAT_UNSUPPORTED
    } else {
        &COMPLETION_UNSUPPORTED
    };
    let n = map.get("n").and_then(Value::as_u64).unwrap_or(1);
    for key in unsupported {
        if let Some(v) = map.remove(*key)
            && !asks_for_nothing(key, &v, n)
        {
            return Err(ApiError::bad_param(
                key,
                format!(
                    "'{key}' is not supported by this server (got {})",
                    brief(&v.to_string())
                ),
            ));
        }
    }
    let value = Value::Object(map);
    let Value::Object(map) = &value else {
        unreachable!("built as an object just above")
    };
    let own: &[&str] = if chat { &CHAT_ONLY } else { &COMPLETION_ONLY };
    if let Some(k) = map
        .keys()
        .find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str()))
    {
        let k = brief(k);
        return Err(ApiError::bad_param(&k, format!("unknown field '{k}'")));
    }
    let field_error = |e: serde_json::Error| {
        // Name the offending field: serde's message for untagged and nested values lacks it.
        let culprit = map
            .iter()
            .find(|(k, v)| check_field(k, v, chat).is_err())
            .map(|(k, v)| (k.clone(), check_field(k, v, chat).unwrap_err()));
        match culprit {
            Some((k, msg)) => ApiError::bad_param(&k, format!("'{k}': {msg}")),
            None => ApiError::bad_request(format!("invalid request: {e}")),
        }
    };
    let common: Common = serde_json::from_value(value.clone()).map_err(field_error)?;
    if common.stream_options.is_some() && !common.stream {
        return Err(ApiError::bad_param(
            "stream_options",
            "'stream_options' is only allowed with 'stream': true",
        ));
    }
    let own: T = serde_json::from_value(value.clone()).map_err(field_error)?;
    Ok((common, own))
}

/// Whether an unsupported field's value leaves the request as if it were absent.
fn asks_for_nothing(key: &str, v: &Value, n: u64) -> bool {
    match key {
        "functions" => v.as_array().is_some_and(Vec::is_empty),
        "function_call" => matches!(v.as_str(), Some("none" | "auto")),
        "best_of" => v.as_u64() == Some(n),
        "suffix" => v.as_str() == Some(""),
        // Nothing is stored here; tags of what would be are harmless.
        "store" => v.as_bool() == Some(false),
        "metadata" => v.is_object(),
        "service_tier" => matches!(v.as_str(), Some("auto" | "default")),
        "modalities" => v.as_array().is_some_and(|m| m.iter().all(|x| x == "text")),
        _ => false,
    }
}

/// Checks one field alone, to say which one is malformed.
fn check_field(key: &str, value: &Value, chat: bool) -> Result<(), String> {
    let single = Value::Object([(key.to_string(), value.clone())].into_iter().collect());
    // Serde names the type of a value of several shapes; say which shapes are taken instead.
    let err = |e: serde_json::Error| {
        let m = e.to_string();
        match key {
            _ if !m.contains("untagged enum") => m,
            "prompt" => "must be a string, a list of token ids (whole numbers from 0 to \
                         4294967295), or a list of one of either"
                .into(),
            "stop" => "must be a string or a list of strings".into(),
            "messages" => "a message's 'content' must be a string or a list of content parts \
                           ({\"type\": \"text\", \"text\": ...})"
                .into(),
            _ => m,
        }
    };
    serde_json::from_value::<Common>(single.clone()).map_err(err)?;
    if chat {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Partial {
            messages: Option<Vec<Message>>,
            max_completion_tokens: Option<u64>,
            logprobs: Option<bool>,
            top_logprobs: Option<u64>,
            chat_template_kwargs: Option<serde_json::Map<String, Value>>,
            tools: Option<Vec<Value>>,
            tool_choice: Option<Value>,
            parallel_tool_calls: Option<bool>,
        }
        serde_json::from_value::<Partial>(single).map_err(err)?;
    } else {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Partial {
            prompt: Option<Prompt>,
            logprobs: Option<u64>,
            echo: Option<bool>,
        }
        serde_json::from_value::<Partial>(single).map_err(err)?;
    }
    Ok(())
}

/// The text of a body's top-level field `key` as the client wrote it (serde_json's values sort
/// an object's keys; a template shows tools in the order given). `None` when absent or null.
pub fn raw_field(body: &[u8], key: &str) -> Option<String> {
    let fields: std::collections::HashMap<String, &serde_json::value::RawValue> =
        serde_json::from_slice(body).ok()?;
    fields
        .get(key)
        .map(|v| v.get().to_string())
        .filter(|t| t != "null")
}

/// At most the first 64 characters of what a client sent, for an error message that echoes it.
pub(crate) fn brief(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_wrong_types_name_the_field() {
        let e = parse::<CompletionRequest>(br#"{"prompt": "hi", "bogus": 1}"#, false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("bogus"));
        let e = parse::<CompletionRequest>(br#"{"prompt": "hi", "max_tokens": "ten"}"#, false)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{}", e.message);
        let e = parse::<ChatRequest>(br#"{"messages": [{"content": "x"}]}"#, true).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"), "{}", e.message);
        let e = parse::<CompletionRequest>(br#"{"prompt": "hi", "vortex": {"flw": "x"}}"#, false)
            .unwrap_err();
        assert!(e.message.contains("flw"), "{}", e.message);
        // What is echoed back is cut short.
        let long = "k".repeat(100_000);
        let body = format!(r#"{{"prompt": "hi", "{long}": 1, "tools": ["{long}"]}}"#);
        let e = parse::<CompletionRequest>(body.as_bytes(), false).unwrap_err();
        assert!(e.message.len() < 200, "{} bytes", e.message.len());
        let body = format!(r#"{{"prompt": "hi", "{long}": 1}}"#);
        let e = parse::<CompletionRequest>(body.as_bytes(), false).unwrap_err();
        assert!(e.message.len() < 200 && e.param.unwrap().len() < 100);
        assert!(parse::<CompletionRequest>(b"{not json", false).is_err());
        assert!(parse::<CompletionRequest>(b"[1]", false).is_err());
    }

    #[test]
    fn values_of_several_shapes_say_which_they_take() {
        let e = parse::<CompletionRequest>(br#"{"prompt": [1, -2]}"#, false).unwrap_err();
        assert!(e.message.contains("list of token ids"), "{}", e.message);
        let e = parse::<ChatRequest>(
            br#"{"messages": [{"role": "user", "content": "x"}], "stop": [1]}"#,
            true,
        )
        .unwrap_err();
        assert!(
            e.message.contains("a string or a list of strings"),
            "{}",
            e.message
        );
        let e = parse::<ChatRequest>(br#"{"messages": [{"role": "user", "content": 5}]}"#, true)
            .unwrap_err();
        assert!(e.message.contains("list of content parts"), "{}", e.message);
    }

    #[test]
    fn a_history_sent_back_keeps_its_null_and_refusal_fields() {
        let (_, r) = parse::<ChatRequest>(
            br#"{"messages": [{"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "Yo", "refusal": null, "function_call": null,
                  "audio": null, "annotations": null, "tool_calls": null},
                 {"role": "assistant", "content": "No", "refusal": "I cannot"},
                 {"role": "user", "content": "Hi"}],
                 "chat_template_kwargs": {"enable_thinking": false}}"#,
            true,
        )
        .unwrap();
        assert_eq!(r.messages.len(), 4);
        assert_eq!(r.chat_template_kwargs.unwrap()["enable_thinking"], false);
    }

    #[test]
    fn prompts_take_every_openai_shape() {
        for body in [
            r#"{"prompt": "hi"}"#,
            r#"{"prompt": [1, 2, 3]}"#,
            r#"{"prompt": ["hi"]}"#,
            r#"{"prompt": [[1, 2]]}"#,
        ] {
            parse::<CompletionRequest>(body.as_bytes(), false).unwrap();
        }
        let (c, r) = parse::<ChatRequest>(
            br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
                 "stop": "x", "stream": true, "stream_options": {"include_usage": true}}"#,
            true,
        )
        .unwrap();
        assert_eq!(r.messages[0].content.as_ref().unwrap().text().unwrap(), "a");
        assert!(c.stream && c.stream_options.unwrap().include_usage);
    }
}
