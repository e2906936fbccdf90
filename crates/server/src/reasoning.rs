//! Reasoning in Qwen3's format, read out of a chat reply as vLLM's `--reasoning-parser qwen3`
//! does: a reply that opens with `<think>` reasons until `</think>`; that part is returned as
//! `reasoning_content`, the rest as the content.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A reply's reasoning (when it opens with `<think>`; newlines at its ends dropped) and the
/// rest (leading whitespace dropped). Reasoning cut short, without `</think>`, is all of it.
pub fn split(text: &str) -> (Option<String>, String) {
    let Some(after) = text.trim_start().strip_prefix(OPEN) else {
        return (None, text.to_string());
    };
    match after.find(CLOSE) {
        Some(i) => (
            Some(after[..i].trim_matches('\n').to_string()),
            after[i + CLOSE.len()..].trim_start().to_string(),
        ),
        None => (
            Some(after.trim_start_matches('\n').to_string()),
            String::new(),
        ),
    }
}

/// [`split`] as a reply streams: each piece of text gives the reasoning and the content that
/// can go out now; together they are what [`split`] gives for the whole text.
#[derive(Debug, Default)]
pub struct ThinkStream {
    held: String,
    state: State,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but what may begin `<think>` yet.
    #[default]
    Start,
    /// Inside the reasoning; `fresh` until its first character that is not a newline.
    Thinking {
        fresh: bool,
    },
    /// Past `</think>`, before the content's first character that is not whitespace.
    After,
    Content,
}

impl ThinkStream {
    /// Adds `text`; returns the reasoning and the content to send now.
    pub fn push(&mut self, text: &str) -> (String, String) {
        self.held.push_str(text);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if t.starts_with(OPEN) {
                        let at = self.held.len() - t.len() + OPEN.len();
                        self.held.drain(..at);
                        self.state = State::Thinking { fresh: true };
                    } else if OPEN.starts_with(t) {
                        return (reasoning, content);
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking { fresh } => {
                    if fresh {
                        let n = self.held.len() - self.held.trim_start_matches('\n').len();
                        self.held.drain(..n);
                        if self.held.is_empty() {
                            return (reasoning, content);
                        }
                        self.state = State::Thinking { fresh: false };
                    }
                    if let Some(i) = self.held.find(CLOSE) {
                        reasoning.push_str(self.held[..i].trim_end_matches('\n'));
                        self.held.drain(..i + CLOSE.len());
                        self.state = State::After;
                    } else {
                        let keep = held_back(&self.held);
                        reasoning.extend(self.held.drain(..self.held.len() - keep));
                        return (reasoning, content);
                    }
                }
                State::After => {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        self.held.clear();
                        return (reasoning, content);
                    }
                    let n = self.held.len() - t.len();
                    self.held.drain(..n);
                    self.state = State::Content;
                }
                State::Content => {
                    content.push_str(&self.held);
                    self.held.clear();
                    return (reasoning, content);
                }
            }
        }
    }

    /// At the end of the reply: the reasoning and the content still held.
    pub fn finish(self) -> (String, String) {
        match self.state {
            State::Start | State::Content => (String::new(), self.held),
            State::Thinking { .. } => (self.held, String::new()),
            State::After => (String::new(), String::new()),
        }
    }
}

/// Bytes at the end of reasoning text that wait for the next piece: newlines, then what may
/// begin `</think>` (the newlines before it are dropped). ASCII, so a char boundary.
fn held_back(text: &str) -> usize {
    let p = (0..CLOSE.len())
        .rev()
        .find(|&p| text.ends_with(&CLOSE[..p]))
        .unwrap_or(0);
    let rest = &text[..text.len() - p];
    p + rest.len() - rest.trim_end_matches('\n').len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_is_read_out_of_the_reply() {
        let cases = [
            (
                "<think>\nThe user wants...\n</think>\n\nParis.",
                Some("The user wants..."),
                "Paris.",
            ),
            ("  <think>a</think>b", Some("a"), "b"),
            ("<think>\n\n</think>\n\nHi", Some(""), "Hi"),
            ("<think>\ncut short", Some("cut short"), ""),
            ("No thinking here.", None, "No thinking here."),
            (
                "Text <think>late</think> x",
                None,
                "Text <think>late</think> x",
            ),
            ("", None, ""),
        ];
        for (text, reasoning, content) in cases {
            assert_eq!(
                split(text),
                (reasoning.map(str::to_string), content.to_string()),
                "{text:?}"
            );
        }
    }

    /// Streamed in every two pieces, and a character at a time, the reasoning and the content
    /// add up to what `split` reads from the whole text.
    #[test]
    fn a_stream_gives_what_the_whole_reply_gives() {
        for text in [
            "<think>\nThe user wants é...\n\n</think>\n\nParis, \u{1F600}.",
            "  <think>a</think>b",
            "<think>\n\n</think>\n\n<tool_call>{}</tool_call>",
            "<think>\ncut short\n",
            "<thin",
            "<think",
            "No thinking here.",
            "   ",
            "<think>x</think",
            "<think>x\n</thi\nnk></think>y",
        ] {
            let splits = crate::every_split(text);
            let (want_r, want_c) = split(text);
            for pieces in splits {
                let mut s = ThinkStream::default();
                let (mut r, mut c) = (String::new(), String::new());
                for p in &pieces {
                    let (a, b) = s.push(p);
                    r.push_str(&a);
                    c.push_str(&b);
                }
                let (a, b) = s.finish();
                r.push_str(&a);
                c.push_str(&b);
                assert_eq!(r, want_r.clone().unwrap_or_default(), "{pieces:?}");
                assert_eq!(c, want_c, "{pieces:?}");
            }
        }
    }
}
