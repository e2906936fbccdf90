//! A conversation to prompt tokens. The chat template's own text holds control tokens
//! (`<|im_start|>`); the messages' text is plain text, so a message that spells a control
//! token cannot end its turn or open another one.

use crate::chat::{ChatError, ChatMessage, ChatTemplate};
use crate::tokenizer::{TokenId, Tokenizer};

/// The tokens of `messages` rendered by `template`, ready for the assistant's turn.
pub fn chat_prompt(
    template: &ChatTemplate,
    tok: &Tokenizer,
    messages: &[ChatMessage],
) -> Result<Vec<TokenId>, ChatError> {
    let spelled: Vec<usize> = (0..messages.len())
        .filter(|&i| tok.spells_control_token(&messages[i].content))
        .collect();
    if spelled.is_empty() {
        return Ok(encode_rendered(tok, &template.render(messages, true)?));
    }
    // Such contents are rendered as markers, and each marker's place takes its content's
    // tokens, encoded as plain text.
    let mut marked = messages.to_vec();
    for &i in &spelled {
        marked[i].content = marker(i);
    }
    let text = template.render(&marked, true)?;
    let mut places = Vec::with_capacity(spelled.len());
    for &i in &spelled {
        let m = marker(i);
        let found: Vec<usize> = text.match_indices(&m).map(|(at, _)| at).collect();
        let [at] = found[..] else {
            return Err(ChatError::Render(format!(
                "message {i} spells a control token, and the chat template does not place its \
                 content as given"
            )));
        };
        places.push((at, m.len(), i));
    }
    places.sort_unstable();
    let mut out = Vec::new();
    let mut from = 0;
    for (at, len, i) in places {
        if from == 0 {
            out.extend(encode_rendered(tok, &text[..at]));
        } else {
            out.extend(tok.encode(&text[from..at], false));
        }
        out.extend(tok.encode_with(&messages[i].content, false, false));
        from = at + len;
    }
    out.extend(tok.encode(&text[from..], false));
    Ok(out)
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

/// Text no message holds: two private-use characters around the message's index.
fn marker(i: usize) -> String {
    format!("\u{F8FE}{i}\u{F8FF}")
}
