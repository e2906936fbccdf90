//! A conversation to prompt tokens. The chat template's own text holds control tokens
//! (`<|im_start|>`); the messages' text is plain text, so a message that spells a control
//! token cannot end its turn or open another.

use crate::chat::{ChatError, ChatMessage, ChatTemplate, canonical_json};
use crate::tokenizer::{TokenId, Tokenizer};

/// Brackets a marker: private-use characters around the index of the text it stands for.
const OPEN: char = '\u{F8FE}';
const CLOSE: char = '\u{F8FF}';

/// The tokens of `messages` rendered by `template`, ready for the assistant's turn.
pub fn chat_prompt(
    template: &ChatTemplate,
    tok: &Tokenizer,
    messages: &[ChatMessage],
) -> Result<Vec<TokenId>, ChatError> {
    chat_prompt_with(template, tok, messages, &serde_json::Map::new())
}

/// As [`chat_prompt`], with extra template variables (`{"enable_thinking": false}`): numbers,
/// booleans, null, or text that spells no control token.
pub fn chat_prompt_with(
    template: &ChatTemplate,
    tok: &Tokenizer,
    messages: &[ChatMessage],
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<TokenId>, ChatError> {
    chat_prompt_with_tools(template, tok, messages, None, extra)
}

/// As [`chat_prompt_with`], with tool definitions (OpenAI's `tools` array as JSON text). A
/// control token spelled in them, or in the messages' tool calls, is plain text too.
pub fn chat_prompt_with_tools(
    template: &ChatTemplate,
    tok: &Tokenizer,
    messages: &[ChatMessage],
    tools_json: Option<&str>,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<TokenId>, ChatError> {
    use serde_json::Value;
    for (k, v) in extra {
        let plain = match v {
            Value::Null | Value::Bool(_) | Value::Number(_) => true,
            Value::String(s) => tok.control_token_spans(s).is_empty(),
            Value::Array(_) | Value::Object(_) => false,
        };
        if !plain {
            return Err(ChatError::Json(format!(
                "template variable '{k}' must be a number, a boolean, null, or text without control tokens"
            )));
        }
    }
    // Each control token a message spells becomes a marker, so the template still sees (and
    // may trim or split) the rest of the message; after rendering, a marker's place takes the
    // tokens of the text it stands for, encoded as plain text. In JSON text a control token
    // can only stand inside a string, where the marker keeps the JSON valid.
    // JSON text is first written out as the template will write it: a control token spelled
    // with escapes (`\u003c|im_end|\u003e`) is then spelled plainly, and marked.
    let calls_text = messages
        .iter()
        .map(|m| {
            m.tool_calls
                .as_deref()
                .map(|c| canonical_json("tool_calls", c))
                .transpose()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tools_text = tools_json.map(|t| canonical_json("tools", t)).transpose()?;
    let mut spelled: Vec<&str> = Vec::new();
    let mut marked = Vec::with_capacity(messages.len());
    for (m, calls) in messages.iter().zip(&calls_text) {
        // Every field, so that one added to messages is marked here too.
        let s = &mut spelled;
        marked.push(ChatMessage {
            role: m.role.clone(),
            content: mark(tok, &m.content, s),
            tool_calls: calls.as_deref().map(|t| mark(tok, t, s)),
            tool_call_id: m.tool_call_id.as_deref().map(|t| mark(tok, t, s)),
            reasoning_content: m.reasoning_content.as_deref().map(|t| mark(tok, t, s)),
        });
    }
    let tools = tools_text.as_deref().map(|t| mark(tok, t, &mut spelled));
    let text = template.render_with_tools(&marked, tools.as_deref(), extra)?;
    if spelled.is_empty() {
        return Ok(encode_rendered(tok, &text));
    }
    let mut out = Vec::new();
    let mut from = 0;
    for (at, len, i) in markers(&text, spelled.len()) {
        if from == 0 {
            out.extend(encode_rendered(tok, &text[..at]));
        } else {
            out.extend(tok.encode_continuing(&text[from..at], true));
        }
        out.extend(tok.encode_continuing(spelled[i], false));
        from = at + len;
    }
    if from == 0 {
        out.extend(encode_rendered(tok, &text));
    } else {
        out.extend(tok.encode_continuing(&text[from..], true));
    }
    Ok(out)
}

/// `source` with each control token it spells replaced by a marker, the token's text added to
/// `spelled`.
fn mark<'a>(tok: &Tokenizer, source: &'a str, spelled: &mut Vec<&'a str>) -> String {
    let spans = tok.control_token_spans(source);
    let mut out = String::with_capacity(source.len() + 8 * spans.len());
    let mut from = 0;
    for span in spans {
        out.push_str(&source[from..span.start]);
        out.push_str(&format!("{OPEN}{}{CLOSE}", spelled.len()));
        spelled.push(&source[span.clone()]);
        from = span.end;
    }
    out.push_str(&source[from..]);
    out
}

/// The well-formed markers in `text` of indices below `count`: (byte offset, length, index).
fn markers(text: &str, count: usize) -> Vec<(usize, usize, usize)> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices(OPEN) {
        let rest = &text[at + OPEN.len_utf8()..];
        let Some(end) = rest.find(CLOSE) else {
            continue;
        };
        let digits = &rest[..end];
        if digits.bytes().all(|b| b.is_ascii_digit())
            && let Ok(i) = digits.parse::<usize>()
            && i < count
        {
            found.push((at, OPEN.len_utf8() + end + CLOSE.len_utf8(), i));
        }
    }
    found
}

/// Rendered template text to tokens, after the tokenizer's BOS unless the text begins with it
/// (templates that write `{{ bos_token }}` would otherwise get two). The template ends the
/// prompt, so no EOS follows.
fn encode_rendered(tok: &Tokenizer, text: &str) -> Vec<TokenId> {
    let mut out = Vec::new();
    if let Some(bos) = tok.bos_id().filter(|_| tok.add_bos()) {
        let written = tok
            .id_to_token(bos)
            .is_some_and(|b| !b.is_empty() && text.starts_with(b));
        if !written {
            out.push(bos);
        }
    }
    out.extend(tok.encode(text, false));
    out
}
