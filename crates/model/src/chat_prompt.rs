//! A conversation to prompt tokens. The chat template's own text holds control tokens
//! (`<|im_start|>`); the messages' text is plain text, so a message that spells a control
//! token cannot end its turn or open another.

use crate::chat::{ChatError, ChatMessage, ChatTemplate};
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
    // tokens of the text it stands for, encoded as plain text.
    let mut spelled: Vec<&str> = Vec::new();
    let mut marked = messages.to_vec();
    for (m, out) in messages.iter().zip(&mut marked) {
        let spans = tok.control_token_spans(&m.content);
        if spans.is_empty() {
            continue;
        }
        let mut text = String::with_capacity(m.content.len() + 8 * spans.len());
        let mut from = 0;
        for span in spans {
            text.push_str(&m.content[from..span.start]);
            text.push_str(&format!("{OPEN}{}{CLOSE}", spelled.len()));
            spelled.push(&m.content[span.clone()]);
            from = span.end;
        }
        text.push_str(&m.content[from..]);
        out.content = text;
    }
    let text = template.render_with(&marked, extra)?;
    if spelled.is_empty() {
        return Ok(encode_rendered(tok, &text));
    }
    let mut out = Vec::new();
    let mut from = 0;
    for (at, len, i) in markers(&text, spelled.len()) {
        if from == 0 {
            out.extend(encode_rendered(tok, &text[..at]));
        } else {
            out.extend(tok.encode(&text[from..at], false));
        }
        out.extend(tok.encode_with(spelled[i], false, false));
        from = at + len;
    }
    if from == 0 {
        out.extend(encode_rendered(tok, &text));
    } else {
        out.extend(tok.encode(&text[from..], false));
    }
    Ok(out)
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
