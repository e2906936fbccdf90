//! Chat templates: rendering a model's Jinja chat template (as Hugging Face's
//! `apply_chat_template` does) with minijinja.
//!
//! The environment matches transformers': `trim_blocks` and `lstrip_blocks` on, loop controls,
//! Python string/dict methods (`.strip()`, `.startswith()`, `.split()`, `.items()`, ... via
//! minijinja-contrib's pycompat), `raise_exception(msg)`, `strftime_now(fmt)` and a `tojson`
//! filter that writes like Python's `json.dumps` (`", "` and `": "` separators, non-ASCII kept,
//! key order kept, optional `indent`). Models without a template get ChatML
//! ([`ChatTemplate::chatml`]).

mod strftime;
mod tojson;

use std::fmt;

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

pub use strftime::strftime;
use strftime::strftime_now;
use tojson::{tojson, write_json};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant's tool calls as JSON text, as templates read them: `[{"id", "type":
    /// "function", "function": {"name", "arguments": {...}}}]` (text, so that the order of the
    /// arguments' keys is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<String>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant's reasoning sent back with the history (Qwen3's template reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
        }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

/// The ChatML template used when a model ships none (transformers' old default).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Gemma's turns, for a Gemma file that ships no template (a base model's): no system role, so
/// system messages go before the next turn's text (in a user turn of their own where none
/// follows); the assistant's role is `model`; contents are trimmed, as Gemma's own template does.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}{% set ns = namespace(system='') %}{% for message in messages %}{% if message['role'] == 'system' %}{% set ns.system = ns.system + (message['content'] | trim) + '\n\n' %}{% else %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' + ns.system + (message['content'] | trim) + '<end_of_turn>\n' }}{% set ns.system = '' %}{% endif %}{% endfor %}{% if ns.system %}{{ '<start_of_turn>user\n' + (ns.system | trim) + '<end_of_turn>\n' }}{% endif %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// The template for a model that ships none, where its vocabulary says which: Gemma's turns
/// where `<start_of_turn>` is a control token (ChatML otherwise, from
/// [`ChatTemplate::from_model`]).
pub fn fallback_template(tok: &crate::tokenizer::Tokenizer) -> Option<&'static str> {
    tok.token_to_id("<start_of_turn>")
        .is_some_and(|id| tok.is_special(id))
        .then_some(GEMMA_TEMPLATE)
}

/// A template that failed to compile or render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatError {
    /// The template does not compile.
    Syntax(String),
    /// Rendering failed (including `raise_exception` from the template).
    Render(String),
    /// Messages / tools / extra variables given as JSON could not be parsed.
    Json(String),
}

impl fmt::Display for ChatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChatError::Syntax(m) => write!(f, "chat template does not compile: {m}"),
            ChatError::Render(m) => write!(f, "chat template failed: {m}"),
            ChatError::Json(m) => write!(f, "bad chat JSON: {m}"),
        }
    }
}

impl std::error::Error for ChatError {}

fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// The variables a template is always given.
const RESERVED: [&str; 6] = [
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "tools",
    "documents",
];

/// Options for [`ChatTemplate::render_json`].
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// End with the assistant header so the model writes the reply.
    pub add_generation_prompt: bool,
    /// Tool definitions as JSON text (an array), passed as `tools`; key order is kept.
    pub tools: Option<String>,
    /// Extra template variables as JSON text (an object), e.g. `{"enable_thinking": false}`.
    pub extra: Option<String>,
}

/// A compiled chat template plus the special-token strings it may use.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    chatml_fallback: bool,
}

const NAME: &str = "chat";
/// The longest template accepted; real ones take a few KiB.
const MAX_TEMPLATE_BYTES: usize = 128 << 10;
/// minijinja's parser recurses on constructs its nesting limit does not count (a long run of
/// unary operators or filters), so templates compile on a thread whose stack holds the deepest
/// one [`MAX_TEMPLATE_BYTES`] allows; renders run on one too. Only the pages it touches are
/// committed.
const TEMPLATE_STACK_BYTES: usize = 1 << 30;
/// Instructions one render may run: ample for any conversation, and a bound for a template that
/// loops without end.
const RENDER_FUEL: u64 = 50_000_000;

impl ChatTemplate {
    /// Compiles `source`; `bos_token` / `eos_token` are the strings the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(ChatError::Syntax(format!(
                "a chat template of {} bytes (at most {MAX_TEMPLATE_BYTES})",
                source.len()
            )));
        }
        let owned = source.to_string();
        let env = std::thread::Builder::new()
            .name("chat-template".into())
            .stack_size(TEMPLATE_STACK_BYTES)
            .spawn(move || {
                let mut env = Environment::new();
                env.set_trim_blocks(true);
                env.set_lstrip_blocks(true);
                env.set_keep_trailing_newline(false);
                env.set_fuel(Some(RENDER_FUEL));
                crate::chat_limits::install(&mut env);
                env.add_function("raise_exception", raise_exception);
                env.add_function("strftime_now", strftime_now(None));
                env.add_filter("tojson", tojson);
                env.add_template_owned(NAME, owned)
                    .map_err(|e| ChatError::Syntax(describe(&e)))?;
                Ok(env)
            })
            .map_err(|e| ChatError::Syntax(format!("compiling the chat template: {e}")))?
            .join()
            .map_err(|_| ChatError::Syntax("compiling the chat template failed".into()))??;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            chatml_fallback: false,
        })
    }

    /// ChatML (`<|im_start|>role\ncontent<|im_end|>\n`).
    pub fn chatml() -> ChatTemplate {
        match ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>") {
            Ok(mut t) => {
                t.chatml_fallback = true;
                t
            }
            // The built-in template compiles; this arm is unreachable in practice.
            Err(e) => unreachable!("built-in ChatML template: {e}"),
        }
    }

    /// The model's template when it has one (non-empty), else ChatML.
    pub fn from_model(
        source: Option<&str>,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, ChatError> {
        match source.filter(|s| !s.trim().is_empty()) {
            Some(s) => ChatTemplate::new(s, bos_token, eos_token),
            None => {
                let mut t = ChatTemplate::chatml();
                t.bos_token = bos_token.to_string();
                t.eos_token = eos_token.to_string();
                Ok(t)
            }
        }
    }

    /// Makes `strftime_now` use this date instead of today's (reproducible prompts).
    pub fn with_fixed_date(mut self, year: i32, month: u32, day: u32) -> ChatTemplate {
        self.env
            .add_function("strftime_now", strftime_now(Some((year, month, day))));
        self
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether this is the ChatML fallback.
    pub fn is_chatml_fallback(&self) -> bool {
        self.chatml_fallback
    }

    /// Renders `messages`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_value(
            Value::from_serialize(messages),
            add_generation_prompt,
            Value::from(()),
            None,
        )
    }

    /// Renders `messages` for the assistant's turn with extra template variables (such as
    /// `enable_thinking`); they may not replace what the template is given itself.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatError> {
        self.render_with_tools(messages, None, extra)
    }

    /// As [`render_with`](Self::render_with), with tool definitions (OpenAI's `tools` array,
    /// as JSON text: its keys keep their order) given to the template as `tools`.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools_json: Option<&str>,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatError> {
        if let Some(k) = extra.keys().find(|k| RESERVED.contains(&k.as_str())) {
            return Err(ChatError::Json(format!(
                "'{k}' is given to the template by the server and cannot be set"
            )));
        }
        let extra = (!extra.is_empty()).then(|| Value::from_serialize(extra));
        let tools = match tools_json {
            Some(t) => parse_json("tools", t)?,
            None => Value::from(()),
        };
        let messages = messages
            .iter()
            .map(|m| {
                let mut fields = vec![
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ];
                if let Some(calls) = &m.tool_calls {
                    fields.push(("tool_calls", parse_json("tool_calls", calls)?));
                }
                if let Some(id) = &m.tool_call_id {
                    fields.push(("tool_call_id", Value::from(id.as_str())));
                }
                if let Some(r) = &m.reasoning_content {
                    fields.push(("reasoning_content", Value::from(r.as_str())));
                }
                Ok(Value::from_iter(fields))
            })
            .collect::<Result<Vec<Value>, ChatError>>()?;
        self.render_value(Value::from(messages), true, tools, extra)
    }

    /// Whether the template writes tool calls as `<tool_call>` blocks of JSON (Hermes' format,
    /// as Qwen2.5 and Qwen3 do), the format the server reads back.
    pub fn writes_tool_call_blocks(&self) -> bool {
        self.source.contains("<tool_call>") && self.source.contains("tools")
    }

    /// Renders messages given as JSON text (an array of objects with `role`, `content` and
    /// whatever else the template reads, e.g. `tool_calls`), with tools and extra variables.
    pub fn render_json(
        &self,
        messages_json: &str,
        opts: &RenderOptions,
    ) -> Result<String, ChatError> {
        let messages = parse_json("messages", messages_json)?;
        if messages.kind() != ValueKind::Seq {
            return Err(ChatError::Json("messages: expected an array".into()));
        }
        let tools = match &opts.tools {
            Some(t) => parse_json("tools", t)?,
            None => Value::from(()),
        };
        let extra = match &opts.extra {
            Some(x) => {
                let v = parse_json("extra", x)?;
                if v.kind() != ValueKind::Map {
                    return Err(ChatError::Json("extra: expected an object".into()));
                }
                Some(v)
            }
            None => None,
        };
        self.render_value(messages, opts.add_generation_prompt, tools, extra)
    }

    fn render_value(
        &self,
        messages: Value,
        add_generation_prompt: bool,
        tools: Value,
        extra: Option<Value>,
    ) -> Result<String, ChatError> {
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), messages),
            (
                "add_generation_prompt".into(),
                Value::from(add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(self.bos_token.as_str())),
            ("eos_token".into(), Value::from(self.eos_token.as_str())),
            ("tools".into(), tools),
            ("documents".into(), Value::from(())),
        ];
        if let Some(extra) = extra
            && let Ok(keys) = extra.try_iter()
        {
            for k in keys {
                let v = extra.get_item(&k).unwrap_or_default();
                let name = k.to_string();
                ctx.retain(|(n, _)| *n != name);
                ctx.push((name, v));
            }
        }
        let ctx: Value = ctx.into_iter().collect();
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        // Values nested as deep as the fuel allows are dropped recursively: the render gets a
        // stack for them, as compiling does.
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("chat-render".into())
                .stack_size(TEMPLATE_STACK_BYTES)
                .spawn_scoped(scope, || {
                    tmpl.render(ctx)
                        .map_err(|e| ChatError::Render(describe(&e)))
                })
                .map_err(|e| ChatError::Render(format!("rendering the chat template: {e}")))?
                .join()
                .map_err(|_| ChatError::Render("rendering the chat template failed".into()))?
        })
    }
}

/// JSON text as a template value, objects' keys in their order.
fn parse_json(what: &str, s: &str) -> Result<Value, ChatError> {
    serde_json::from_str::<Value>(s).map_err(|e| ChatError::Json(format!("{what}: {e}")))
}

/// JSON text re-written as `tojson` writes it (keys in their order, no escapes but for control
/// characters), so that text spelled with escapes (`\u003c`) is spelled out as a template
/// will write it.
pub(crate) fn canonical_json(what: &str, s: &str) -> Result<String, ChatError> {
    let v = parse_json(what, s)?;
    let mut out = String::with_capacity(s.len());
    write_json(&v, None, false, 0, &mut out)
        .map_err(|e| ChatError::Json(format!("{what}: {e}")))?;
    Ok(out)
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {msg}"),
    ))
}
