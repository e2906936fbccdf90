//! From a parsed request to engine requests: the prompt tokens, the sampling parameters, the
//! limits and the flow with its settings, each checked with a message that names the field.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use vortex_engine::{FlowChoice, RequestSpec};
use vortex_flow::Settings;
use vortex_model::chat::{ChatError, ChatMessage};
use vortex_model::chat_prompt::chat_prompt_with_tools;
use vortex_model::grammar::Grammar;
use vortex_model::sampling::{SamplingParams, choice_seed, unseeded};

use crate::AppState;
use crate::error::ApiError;
use crate::protocol::{ChatRequest, Common, CompletionRequest, Prompt, VortexOptions};
use crate::{response_format, tools};

/// Choices one request may ask for, of each prompt.
const MAX_N: u64 = 16;
/// Prompts of one completion request; each is a request of its own to the engine (times `n`).
const MAX_PROMPTS: usize = 64;
/// Choices of one request, over all its prompts.
const MAX_CHOICES: u64 = 128;
const MAX_LOGPROBS: u64 = 20;
const MAX_STOPS: usize = 16;
/// Token ids `stop_token_ids` may list.
const MAX_STOP_TOKENS: usize = 64;
/// Bytes of one stop string: each is searched for after every token, on the engine's thread.
const MAX_STOP_BYTES: usize = 256;
/// Tokens one request may bias (OpenAI's limit).
const MAX_LOGIT_BIAS: usize = 300;

/// What the handlers need beside the engine requests.
pub struct Prepared {
    /// One engine request per choice: `n` for each prompt, prompt by prompt.
    pub specs: Vec<RequestSpec>,
    pub flow: String,
    pub settings: Settings,
    /// Each prompt's tokens.
    pub prompt_tokens: Vec<usize>,
    /// Tool calls are read out of the replies (chat with tools offered).
    pub calling: Option<tools::Calling>,
    /// The chat prompt ends with `<think>` (QwQ's, Qwen3-Thinking's templates): the reply
    /// begins inside its reasoning.
    pub thinking_opened: bool,
    /// The completions' texts begin with their prompts' (`echo`).
    pub echo: Option<Echo>,
    /// vLLM's `prompt_logprobs`: the prompt tokens' log-probabilities go in the response, with
    /// this many most likely tokens each.
    pub prompt_logprobs: Option<usize>,
}

/// What `echo` puts before each choice.
pub struct Echo {
    /// Each prompt's tokens decoded, control tokens included.
    pub texts: Vec<String>,
}

impl Echo {
    /// The text before choice `i` of `choices` (each prompt's choices one after another).
    pub fn text(&self, i: usize, choices: usize) -> &str {
        &self.texts[i / (choices / self.texts.len())]
    }
}

pub fn completion(
    st: &AppState,
    common: Common,
    req: CompletionRequest,
) -> Result<Prepared, ApiError> {
    let tok = &st.model.tokenizer;
    let prompts = match req.prompt {
        Prompt::Text(t) => vec![tok.encode(&t, true)],
        Prompt::Tokens(ids) => vec![ids],
        Prompt::Texts(v) => v.iter().map(|t| tok.encode(t, true)).collect(),
        Prompt::TokenLists(v) => v,
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_param("prompt", "'prompt' is an empty list"));
    }
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::bad_param(
            "prompt",
            format!(
                "at most {MAX_PROMPTS} prompts in one request, got {}",
                prompts.len()
            ),
        ));
    }
    let logprobs = req
        .logprobs
        .map(|k| check_logprobs("logprobs", k))
        .transpose()?;
    let grammar = response_format::requested(&common)?;
    let echo = req.echo.then(|| {
        // The tokens decoded, control tokens too, so that the text and the tokens' offsets
        // agree where the tokenizer began the prompt with one (a BOS).
        let texts = prompts
            .iter()
            .map(|ids| tok.decode_with(ids, false))
            .collect();
        Echo { texts }
    });
    let max = MaxTokens {
        field: "max_tokens",
        given: common.max_tokens,
        default: 16,
        prompt_alone: req.echo,
    };
    let mut prepared = prepare(st, common, prompts, max, logprobs, grammar)?;
    if let (Some(_), Some(k), Some(top)) = (&echo, logprobs, prepared.prompt_logprobs)
        && k != top
    {
        return Err(ApiError::bad_param(
            "prompt_logprobs",
            format!(
                "'echo' with 'logprobs' {k} and 'prompt_logprobs' {top} ask for the prompt's \
                 log-probabilities twice: give both the same number, or one"
            ),
        ));
    }
    if echo.is_some() {
        for spec in &mut prepared.specs {
            spec.prompt_logprobs = logprobs.or(spec.prompt_logprobs);
        }
    }
    prepared.echo = echo;
    Ok(prepared)
}

pub fn chat(st: &AppState, common: Common, req: ChatRequest) -> Result<Prepared, ApiError> {
    let (prompt, mut tools_offered) = chat_tokens(st, &req)?;
    let format = response_format::requested(&common)?;
    let grammar = match (format, tools_offered.as_mut().and_then(|o| o.forced.take())) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_param(
                "response_format",
                "'response_format' (or vLLM's 'structured_outputs' or a 'guided_' field) says \
                 what the reply is held to and 'tool_choice' asks for a tool call: ask for one",
            ));
        }
        (format, call) => format.or(call),
    };
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (false, Some(_)) => {
            return Err(ApiError::bad_param(
                "top_logprobs",
                "'top_logprobs' needs 'logprobs': true",
            ));
        }
        (false, None) => None,
        (true, k) => Some(check_logprobs("top_logprobs", k.unwrap_or(0))?),
    };
    let context = st.model.model.config.max_positions;
    let max = MaxTokens {
        field: if req.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        },
        given: req.max_completion_tokens.or(common.max_tokens),
        default: context.saturating_sub(prompt.len()).max(1),
        prompt_alone: false,
    };
    let tail = &prompt[prompt.len().saturating_sub(16)..];
    let thinking_opened = st.reasoning
        && st
            .model
            .tokenizer
            .decode(tail)
            .trim_end()
            .ends_with("<think>");
    let mut prepared = prepare(st, common, vec![prompt], max, logprobs, grammar)?;
    prepared.calling = tools_offered.map(|o| tools::Calling {
        parallel: req.parallel_tool_calls.unwrap_or(true),
        names: o.names,
        list: o.list,
    });
    prepared.thinking_opened = thinking_opened;
    Ok(prepared)
}

/// A conversation's prompt tokens as the chat template makes them, and the tools offered (their
/// JSON text and names), if any.
pub fn chat_tokens(
    st: &AppState,
    req: &ChatRequest,
) -> Result<(Vec<u32>, Option<tools::Offered>), ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_param("messages", "'messages' is empty"));
    }
    let tools_offered = tools::offered(
        req.tools.as_deref(),
        req.tools_text.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls.unwrap_or(true),
    )?;
    let template = &st.model.chat;
    let reads_calls = template.writes_tool_call_blocks();
    if tools_offered.is_some() && !reads_calls {
        return Err(ApiError::bad_param(
            "tools",
            "this model's chat template has no tool-call format this server reads (it reads \
             <tool_call> blocks, as Qwen2.5's and Qwen3's templates teach)",
        ));
    }
    let messages = req
        .messages
        .iter()
        .map(|m| {
            let bad = |msg: String| ApiError::bad_param("messages", msg);
            // The role goes into the template as it is: only the roles the templates know, so
            // that no role can carry control text.
            let role = match m.role.as_str() {
                "system" | "user" | "assistant" | "tool" => m.role.as_str(),
                // OpenAI's newer name for the system message.
                "developer" => "system",
                other => {
                    return Err(bad(format!(
                        "unknown message role {other:?}: expected system, developer, user, \
                         assistant or tool"
                    )));
                }
            };
            if m.function_call.is_some() {
                return Err(bad(
                    "'function_call' in a message is not supported: send 'tool_calls'".into(),
                ));
            }
            let calls = match &m.tool_calls {
                Some(Value::Array(c)) if c.is_empty() => None,
                Some(_) if m.role != "assistant" => {
                    return Err(bad("only an assistant message may hold 'tool_calls'".into()));
                }
                Some(c) => Some(tools::history_calls(c).map_err(bad)?),
                None => None,
            };
            if (calls.is_some() || m.role == "tool") && !reads_calls {
                return Err(bad(
                    "this model's chat template writes no tool calls or tool results".into(),
                ));
            }
            let text = match &m.content {
                Some(c) => c.text()?,
                None if m.role == "assistant" => String::new(),
                None => return Err(bad(format!("a '{}' message needs 'content'", m.role))),
            };
            let mut message = ChatMessage::new(role.to_string(), text);
            message.tool_calls = calls;
            message.tool_call_id = m.tool_call_id.clone();
            if m.role == "assistant" {
                message.reasoning_content = m.reasoning_content.clone();
            }
            Ok(message)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let extra = req.chat_template_kwargs.clone().unwrap_or_default();
    let prompt = chat_prompt_with_tools(
        template,
        &st.model.tokenizer,
        &messages,
        tools_offered.as_ref().map(|o| o.text.as_str()),
        &extra,
    )
    .map_err(|e| match e {
        ChatError::Json(m) if m.starts_with("tools") => ApiError::bad_param("tools", m),
        ChatError::Json(m) if m.starts_with("tool_calls") => ApiError::bad_param("messages", m),
        ChatError::Json(m) => ApiError::bad_param("chat_template_kwargs", m),
        e => ApiError::bad_param("messages", format!("chat template: {e}")),
    })?;
    Ok((prompt, tools_offered))
}

fn check_logprobs(name: &str, k: u64) -> Result<usize, ApiError> {
    if k > MAX_LOGPROBS {
        return Err(ApiError::bad_param(
            name,
            format!("'{name}' must be at most {MAX_LOGPROBS}, got {k}"),
        ));
    }
    Ok(k as usize)
}

/// The most tokens a request's choices may generate, as it asks.
struct MaxTokens {
    /// The field that asks (`max_tokens`, chat's `max_completion_tokens`), for messages.
    field: &'static str,
    given: Option<u64>,
    /// The most where none is given, room allowing.
    default: usize,
    /// 0 asks for the prompt alone (completions' `echo`): it is computed and scored, and
    /// nothing is generated.
    prompt_alone: bool,
}

fn prepare(
    st: &AppState,
    c: Common,
    prompts: Vec<Vec<u32>>,
    max: MaxTokens,
    logprobs: Option<usize>,
    grammar: Option<Grammar>,
) -> Result<Prepared, ApiError> {
    if let Some(m) = &c.model
        && *m != st.model_id
    {
        return Err(ApiError::unknown_model(m, &st.model_id));
    }
    let cfg = &st.model.model.config;
    let (max_name, requested) = (max.field, max.given);
    let generates = requested != Some(0);
    if !generates && !max.prompt_alone {
        return Err(ApiError::bad_param(
            max_name,
            format!("'{max_name}' must be at least 1"),
        ));
    }
    let min_tokens = c.min_tokens.unwrap_or(0);
    let (limit, what) = context_limit(st);
    // Each prompt's most tokens to generate.
    let mut max_tokens = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.iter().enumerate() {
        let which = if prompts.len() > 1 {
            format!("prompt {i}: ")
        } else {
            String::new()
        };
        let room = prompt_room(st, prompt, generates)
            .map_err(|m| ApiError::bad_param("prompt", format!("{which}{m}")))?;
        let most = match requested {
            None => max.default.min(room),
            Some(m) if m > room as u64 => {
                return Err(ApiError::bad_param(
                    max_name,
                    format!(
                        "{which}'{max_name}' is {m} but the prompt has {} tokens and {what} \
                         {limit}: at most {room} can be generated",
                        prompt.len()
                    ),
                ));
            }
            Some(m) => m as usize,
        };
        if min_tokens > most as u64 {
            return Err(ApiError::bad_param(
                "min_tokens",
                format!("{which}'min_tokens' is {min_tokens}, more than the {most} tokens allowed"),
            ));
        }
        max_tokens.push(most);
    }
    let n = c.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad_param(
            "n",
            format!("'n' must be 1 to {MAX_N}, got {n}"),
        ));
    }
    if prompts.len() as u64 * n > MAX_CHOICES {
        return Err(ApiError::bad_param(
            "n",
            format!(
                "{} prompts of {n} choices each are {} choices; one request may ask for at \
                 most {MAX_CHOICES}",
                prompts.len(),
                prompts.len() as u64 * n
            ),
        ));
    }
    let stop = c.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad_param(
            "stop",
            format!("at most {MAX_STOPS} stop strings, got {}", stop.len()),
        ));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::bad_param(
            "stop",
            format!(
                "a stop string is at most {MAX_STOP_BYTES} bytes, got one of {}",
                long.len()
            ),
        ));
    }
    let stop_tokens = stop_token_ids(c.stop_token_ids.unwrap_or_default(), cfg.vocab)?;
    let logit_bias = logit_bias(c.logit_bias.unwrap_or_default(), cfg.vocab)?;
    let sampling = SamplingParams {
        temperature: c.temperature.unwrap_or(1.0),
        top_k: match c.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::bad_param(
                    "top_k",
                    format!("'top_k' must be positive, or -1 or 0 for all tokens; got {k}"),
                ));
            }
        },
        top_p: c.top_p.unwrap_or(1.0),
        min_p: c.min_p.unwrap_or(0.0),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        logit_bias,
        seed: c.seed.map_or_else(
            || unseeded(st.next_seed.fetch_add(1, Ordering::Relaxed), st.seed_salt),
            |s| s as u64,
        ),
    };
    sampling
        .validate()
        .map_err(|e| ApiError::bad_param(e.field, e.to_string()))?;
    let prompt_logprobs = c
        .prompt_logprobs
        .map(|k| check_logprobs("prompt_logprobs", k))
        .transpose()?;
    if prompt_logprobs.is_some() && c.stream {
        return Err(ApiError::bad_param(
            "prompt_logprobs",
            "'prompt_logprobs' is given in whole responses only: ask without 'stream' (or, on \
             completions, with 'echo' and 'logprobs')",
        ));
    }
    let (flow, choice, settings) = flow_choice(st, c.vortex.unwrap_or_default())?;
    let grammar = grammar.map(Arc::new);
    // Prompt by prompt; each prompt's choices drawn as if it came alone.
    let specs = prompts
        .iter()
        .zip(&max_tokens)
        .flat_map(|(prompt, &max_tokens)| (0..n).map(move |i| (prompt, max_tokens, i)))
        .map(|(prompt, max_tokens, i)| RequestSpec {
            prompt: prompt.clone(),
            sampling: SamplingParams {
                seed: choice_seed(sampling.seed, i),
                ..sampling.clone()
            },
            max_tokens,
            min_tokens: min_tokens as usize,
            stop: stop.clone(),
            keep_stop: c.include_stop_str_in_output,
            stop_tokens: stop_tokens.clone(),
            skip_special: c.skip_special_tokens.unwrap_or(true),
            ignore_eos: c.ignore_eos,
            flow: choice.clone(),
            settings: settings.clone(),
            logprobs,
            prompt_logprobs,
            grammar: grammar.clone(),
        })
        .collect();
    Ok(Prepared {
        specs,
        flow,
        settings,
        prompt_tokens: prompts.iter().map(Vec::len).collect(),
        calling: None,
        thinking_opened: false,
        echo: None,
        prompt_logprobs,
    })
}

/// The most tokens a sequence may hold, and what sets it: a request must fit the model's
/// context and the KV pool, which never grows.
pub(crate) fn context_limit(st: &AppState) -> (usize, &'static str) {
    let positions = st.model.model.config.max_positions;
    if st.kv_pool_tokens < positions {
        (st.kv_pool_tokens, "the server's KV pool holds")
    } else {
        (positions, "the model's context is")
    }
}

/// The tokens left to generate after `prompt`, or why it cannot be served: a prompt that
/// `generates` must leave room in the context, one alone may fill it.
fn prompt_room(st: &AppState, prompt: &[u32], generates: bool) -> Result<usize, String> {
    let vocab = st.model.model.config.vocab;
    if prompt.is_empty() {
        return Err("the prompt is empty".into());
    }
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(format!("token id {t} is outside the vocabulary of {vocab}"));
    }
    let (limit, what) = context_limit(st);
    let len = prompt.len();
    if generates && len >= limit {
        return Err(format!(
            "the prompt has {len} tokens; {what} {limit} (room must be left to generate)"
        ));
    }
    if len > limit {
        return Err(format!("the prompt has {len} tokens; {what} {limit}"));
    }
    Ok(limit - len)
}

/// `stop_token_ids`, each inside the vocabulary.
fn stop_token_ids(ids: Vec<i64>, vocab: usize) -> Result<Vec<u32>, ApiError> {
    let bad = |m: String| ApiError::bad_param("stop_token_ids", m);
    if ids.len() > MAX_STOP_TOKENS {
        return Err(bad(format!(
            "at most {MAX_STOP_TOKENS} stop tokens, got {}",
            ids.len()
        )));
    }
    ids.into_iter()
        .map(|id| match u32::try_from(id) {
            Ok(t) if (t as usize) < vocab => Ok(t),
            _ => Err(bad(format!(
                "token id {id} is outside the vocabulary of {vocab}"
            ))),
        })
        .collect()
}

/// `logit_bias`'s entries as (token id, bias), each id inside the vocabulary.
fn logit_bias(
    map: std::collections::BTreeMap<String, f32>,
    vocab: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::bad_param("logit_bias", m);
    if map.len() > MAX_LOGIT_BIAS {
        return Err(bad(format!(
            "at most {MAX_LOGIT_BIAS} tokens may be biased, got {}",
            map.len()
        )));
    }
    map.into_iter()
        .map(|(k, b)| match k.parse::<u32>() {
            // One spelling an id ("120", not "0120" or "+120"), so that biases cannot add up.
            Ok(id) if id.to_string() != k => {
                Err(bad(format!("the keys are token ids in decimal, got {k:?}")))
            }
            Ok(id) if (id as usize) < vocab => Ok((id, b)),
            Ok(id) => Err(bad(format!(
                "token id {id} is outside the vocabulary of {vocab}"
            ))),
            Err(_) => Err(bad(format!("the keys are token ids, got {k:?}"))),
        })
        .collect()
}

/// The flow a request runs and its settings: the server's default unless the `vortex` object
/// names a built-in flow, with the object's settings applied on top.
fn flow_choice(
    st: &AppState,
    v: VortexOptions,
) -> Result<(String, Option<FlowChoice>, Settings), ApiError> {
    // The setting a request gave that makes its budget too small, to name in an error.
    let always_kept = if v.budget.is_some() {
        "vortex.budget"
    } else if v.sinks.is_some() {
        "vortex.sinks"
    } else if v.recent.is_some() {
        "vortex.recent"
    } else {
        "vortex.budget"
    };
    let (name, choice, mut settings) = match v.flow {
        None => (st.default_flow.clone(), None, st.default_settings.clone()),
        Some(name) if name == st.default_flow => (name, None, st.default_settings.clone()),
        Some(name) => {
            if vortex_flow::library::builtin_source(&name).is_none() {
                let names: Vec<&str> = vortex_flow::library::BUILTIN.iter().map(|b| b.0).collect();
                return Err(ApiError::bad_param(
                    "vortex.flow",
                    format!(
                        "unknown flow '{name}'; this server runs '{}' by default and knows {}",
                        st.default_flow,
                        names.join(", ")
                    ),
                ));
            }
            let flow = vortex_flow::library::load(&name, st.geometry)
                .map_err(|e| ApiError::bad_param("vortex.flow", format!("flow '{name}': {e}")))?;
            let settings = flow.settings.clone();
            (name.clone(), Some(FlowChoice { name, flow }), settings)
        }
    };
    let one = |x: f64| vec![x];
    let overrides: [(&str, Option<Vec<f64>>); 7] = [
        ("budget", v.budget.map(one)),
        ("budget_ratio", v.budget_ratio.map(one)),
        ("sinks", v.sinks.map(one)),
        ("recent", v.recent.map(one)),
        ("dense_layers", v.dense_layers),
        ("min_context", v.min_context.map(one)),
        ("tolerance", v.tolerance.map(one)),
    ];
    for (key, values) in overrides {
        if let Some(values) = values {
            settings
                .set(key, &values)
                .map_err(|e| ApiError::bad_param(&format!("vortex.{key}"), e))?;
        }
    }
    settings
        .check()
        .map_err(|e| ApiError::bad_param(always_kept, e))?;
    settings
        .check_layers(st.model.model.config.layers)
        .map_err(|e| ApiError::bad_param("vortex.dense_layers", e))?;
    Ok((name, choice, settings))
}
