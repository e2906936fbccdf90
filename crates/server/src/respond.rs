//! Response bodies and stream chunks in OpenAI's shapes, for completions and chat.

use serde_json::{Value, json};
use vortex_engine::{FinishReason, TokenLogprob, Usage};
use vortex_flow::Settings;
use vortex_model::tokenizer::Tokenizer;

use crate::reasoning;
use crate::tools::{self, Call, Calling};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

/// One choice as it accumulates.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
    /// Where the next token's text begins, for streamed completions' `text_offset`.
    pub offsets: TextOffsets,
    /// Log-probabilities of the prompt's tokens, the second on (`echo` with `logprobs`).
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// The prompt the text begins with (`echo`), whose tokens begin the log-probabilities,
    /// and whether they were asked for.
    pub echoed: Option<(Vec<u32>, bool)>,
}

/// Characters of the text the tokens so far decode to. A token may end inside a character;
/// its bytes wait for the rest, and each invalid byte sequence counts as one character, as
/// the lossy text shows it.
#[derive(Debug, Clone, Default)]
pub struct TextOffsets {
    chars: usize,
    tail: Vec<u8>,
}

impl TextOffsets {
    /// The offset of a token in the text, and then its bytes added.
    pub fn next(&mut self, bytes: &[u8]) -> usize {
        let at = self.chars;
        self.tail.extend_from_slice(bytes);
        let mut rest = &self.tail[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.chars += s.chars().count();
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    self.chars += std::str::from_utf8(valid).map_or(0, |s| s.chars().count());
                    match e.error_len() {
                        Some(n) => {
                            self.chars += 1;
                            rest = &after[n..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.tail = rest.to_vec();
        at
    }
}

/// Everything the response says besides the choices.
pub struct Meta<'a> {
    pub endpoint: Endpoint,
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
    pub flow: &'a str,
    pub settings: &'a Settings,
    /// Chat replies' tool calls are read out of their text.
    pub calling: Option<&'a Calling>,
    /// Chat replies' reasoning is read out of their text (see `reasoning.rs`).
    pub reasoning: bool,
    /// The prompt ended with `<think>`: replies begin inside their reasoning.
    pub thinking_opened: bool,
}

impl Meta<'_> {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn vortex(&self) -> Value {
        json!({"flow": self.flow, "settings": self.settings})
    }

    fn envelope(&self, chunk: bool, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

/// Tokens of a request: its prompts', its choices' and, of its prompts, those found cached.
/// `choices` hold each prompt's in turn, as many for each.
pub struct Totals {
    pub prompt: usize,
    pub completion: usize,
    pub cached: usize,
}

impl Totals {
    pub fn of(prompt_tokens: &[usize], choices: &[Choice]) -> Totals {
        let per_prompt = choices.len().div_ceil(prompt_tokens.len().max(1)).max(1);
        Totals {
            prompt: prompt_tokens.iter().sum(),
            completion: choices.iter().map(|c| c.usage.completion_tokens).sum(),
            // Each prompt counts once, however many choices it has.
            cached: choices
                .chunks(per_prompt)
                .map(|c| c.iter().map(|c| c.usage.cached_tokens).max().unwrap_or(0))
                .sum(),
        }
    }
}

/// Usage summed over the prompts and the choices.
pub fn usage_json(prompt_tokens: &[usize], choices: &[Choice]) -> Value {
    let t = Totals::of(prompt_tokens, choices);
    json!({
        "prompt_tokens": t.prompt,
        "completion_tokens": t.completion,
        "total_tokens": t.prompt + t.completion,
        "prompt_tokens_details": {"cached_tokens": t.cached},
    })
}

fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Log-probabilities in the endpoint's format; `offsets` has seen the tokens before them.
pub fn logprobs_json(
    endpoint: Endpoint,
    tok: &Tokenizer,
    lps: &[TokenLogprob],
    offsets: &mut TextOffsets,
) -> Value {
    match endpoint {
        Endpoint::Completions => {
            let entries: Vec<(u32, Option<&TokenLogprob>)> =
                lps.iter().map(|lp| (lp.token, Some(lp))).collect();
            completion_logprobs(tok, &entries, offsets)
        }
        Endpoint::Chat => {
            let entry = |id: u32, l: f32| {
                let (t, b) = token_text(tok, id);
                json!({"token": t, "logprob": l, "bytes": b})
            };
            let content: Vec<Value> = lps
                .iter()
                .map(|lp| {
                    let mut e = entry(lp.token, lp.logprob);
                    e["top_logprobs"] =
                        Value::Array(lp.top.iter().map(|&(id, l)| entry(id, l)).collect());
                    e
                })
                .collect();
            json!({"content": content})
        }
    }
}

/// Completions' log-probabilities of `entries`: each token, and its log-probability where it
/// has one (a prompt's first token has none: `null`, as OpenAI's `echo` gives it).
fn completion_logprobs(
    tok: &Tokenizer,
    entries: &[(u32, Option<&TokenLogprob>)],
    offsets: &mut TextOffsets,
) -> Value {
    let (mut tokens, mut at) = (Vec::new(), Vec::new());
    for &(id, _) in entries {
        let (t, bytes) = token_text(tok, id);
        at.push(offsets.next(&bytes));
        tokens.push(t);
    }
    // The chosen token is among its alternatives, as in OpenAI's completions (up to
    // logprobs + 1 of them).
    let top: Vec<Value> = entries
        .iter()
        .map(|&(_, lp)| {
            let Some(lp) = lp else { return Value::Null };
            let m: serde_json::Map<String, Value> = lp
                .top
                .iter()
                .chain(std::iter::once(&(lp.token, lp.logprob)))
                .map(|&(id, l)| (token_text(tok, id).0, json!(l)))
                .collect();
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": tokens,
        "token_logprobs": entries.iter().map(|&(_, lp)| lp.map(|l| l.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": at,
    })
}

/// A choice's log-probabilities where its text begins with its prompt `prompt` (`echo`).
fn echoed_logprobs(tok: &Tokenizer, prompt: &[u32], c: &Choice) -> Value {
    let generated = c.logprobs.iter().map(|lp| (lp.token, Some(lp)));
    let entries: Vec<_> = prompt_entries(prompt, &c.prompt_logprobs)
        .chain(generated)
        .collect();
    completion_logprobs(tok, &entries, &mut TextOffsets::default())
}

/// A completion's log-probabilities of its prompt `prompt` alone, scored by `scores` (from the
/// second token on), the first of an echoed stream; `offsets` goes on to the generated tokens.
pub fn prompt_logprobs_json(
    tok: &Tokenizer,
    prompt: &[u32],
    scores: &[TokenLogprob],
    offsets: &mut TextOffsets,
) -> Value {
    let entries: Vec<_> = prompt_entries(prompt, scores).collect();
    completion_logprobs(tok, &entries, offsets)
}

/// vLLM's `prompt_logprobs`: `null` for the first token, then for each token a map from token
/// ids (as text) to `{logprob, rank, decoded_token}`: the prompt's token and the most likely
/// ones. A prompt token's rank is `null` where the pass did not count it (a GPU's) and the token
/// is not among the most likely.
pub fn vllm_prompt_logprobs(tok: &Tokenizer, prompt: &[u32], scores: &[TokenLogprob]) -> Value {
    let entry = |id: u32, logprob: f32, rank: Option<u32>| json!({"logprob": logprob, "rank": rank, "decoded_token": tok.decode(&[id])});
    let rows = prompt_entries(prompt, scores).map(|(id, lp)| {
        let Some(lp) = lp else {
            return Value::Null;
        };
        let place = |i: usize| Some(i as u32 + 1);
        let rank = lp.top.iter().position(|t| t.0 == id).map_or(lp.rank, place);
        let mut m = serde_json::Map::new();
        m.insert(id.to_string(), entry(id, lp.logprob, rank));
        for (i, &(t, l)) in lp.top.iter().enumerate() {
            m.entry(t.to_string())
                .or_insert_with(|| entry(t, l, place(i)));
        }
        Value::Object(m)
    });
    Value::Array(rows.collect())
}

/// Each prompt token with its score: none for the first (`null`, as OpenAI's `echo` gives it).
fn prompt_entries<'a>(
    prompt: &'a [u32],
    scores: &'a [TokenLogprob],
) -> impl Iterator<Item = (u32, Option<&'a TokenLogprob>)> + 'a {
    let scored = |(i, &id): (usize, &u32)| (id, i.checked_sub(1).and_then(|j| scores.get(j)));
    prompt.iter().enumerate().map(scored)
}

/// The whole (non-streamed) response.
pub fn full(meta: &Meta, tok: &Tokenizer, choices: &[Choice], prompt_tokens: &[usize]) -> Value {
    let wants_logprobs = choices
        .iter()
        .any(|c| !c.logprobs.is_empty() || c.echoed.as_ref().is_some_and(|e| e.1));
    let items = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = match &c.echoed {
                _ if !wants_logprobs => Value::Null,
                Some((prompt, _)) => echoed_logprobs(tok, prompt, c),
                None => logprobs_json(meta.endpoint, tok, &c.logprobs, &mut TextOffsets::default()),
            };
            let finish = c.finish.map(FinishReason::as_str);
            match meta.endpoint {
                Endpoint::Completions => {
                    json!({"index": i, "text": c.text, "logprobs": lp, "finish_reason": finish})
                }
                Endpoint::Chat => {
                    let (reasoning, rest) = if meta.reasoning && meta.thinking_opened {
                        reasoning::split(&format!("<think>{}", c.text))
                    } else if meta.reasoning {
                        reasoning::split(&c.text)
                    } else {
                        (None, c.text.clone())
                    };
                    let ends_in_call = meta.calling.is_some_and(|c| c.ends_in_call(&rest));
                    let (content, calls) = match meta.calling {
                        Some(calling) => calling.split(&rest),
                        None => (rest, Vec::new()),
                    };
                    // A reply of reasoning or calls alone has no content (null, as OpenAI's
                    // and vLLM's).
                    let bare = content.is_empty() && (reasoning.is_some() || !calls.is_empty());
                    let mut message = json!({"role": "assistant", "content": content});
                    if bare {
                        message["content"] = Value::Null;
                    }
                    if let Some(r) = reasoning {
                        message["reasoning_content"] = json!(r);
                    }
                    if !calls.is_empty() {
                        message["tool_calls"] = tools::calls_json(&calls, meta.id, i, false);
                    }
                    json!({
                        "index": i,
                        "message": message,
                        "logprobs": lp,
                        "finish_reason": finish_with_calls(finish, &calls, ends_in_call),
                    })
                }
            }
        })
        .collect();
    let mut body = meta.envelope(false, items);
    body["usage"] = usage_json(prompt_tokens, choices);
    body["vortex"] = meta.vortex();
    body
}

/// A reply that stopped after writing calls finishes with "tool_calls", as OpenAI's do; so
/// does one that `max_tokens` cut right after a whole call (`ends_in_call`), as vLLM's.
pub fn finish_with_calls<'a>(
    finish: Option<&'a str>,
    calls: &[Call],
    ends_in_call: bool,
) -> Option<&'a str> {
    match finish {
        Some("stop") if !calls.is_empty() => Some("tool_calls"),
        Some("length") if !calls.is_empty() && ends_in_call => Some("tool_calls"),
        f => f,
    }
}

/// A chat stream chunk whose delta holds reasoning text.
pub fn reasoning_chunk(meta: &Meta, index: usize, text: &str) -> Value {
    let delta = json!({"reasoning_content": text});
    meta.envelope(
        true,
        vec![json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null})],
    )
}

/// A chat stream chunk whose delta holds a choice's tool calls.
pub fn calls_chunk(meta: &Meta, index: usize, calls: &[Call]) -> Value {
    let delta = json!({"tool_calls": tools::calls_json(calls, meta.id, index, true)});
    meta.envelope(
        true,
        vec![json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null})],
    )
}

/// A stream chunk: the first of a chat choice (role only), a text delta, or the finish.
pub fn chunk(
    meta: &Meta,
    index: usize,
    text: Option<&str>,
    logprobs: Option<Value>,
    finish: Option<&str>,
) -> Value {
    let finish_reason = finish;
    let choice = match meta.endpoint {
        Endpoint::Completions => json!({
            "index": index,
            "text": text.unwrap_or(""),
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }),
        Endpoint::Chat => {
            let delta = match text {
                None if finish.is_none() => json!({"role": "assistant", "content": ""}),
                None => json!({}),
                Some(t) => json!({"content": t}),
            };
            json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason})
        }
    };
    let mut c = meta.envelope(true, vec![choice]);
    if finish.is_some() {
        c["vortex"] = meta.vortex();
    }
    c
}

/// The last chunk when `stream_options.include_usage` is set: no choices, the usage.
pub fn usage_chunk(meta: &Meta, prompt_tokens: &[usize], choices: &[Choice]) -> Value {
    let mut c = meta.envelope(true, vec![]);
    c["usage"] = usage_json(prompt_tokens, choices);
    c["vortex"] = meta.vortex();
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_each_prompt_and_its_cache_once() {
        let choice = |completion, cached| Choice {
            usage: Usage {
                completion_tokens: completion,
                cached_tokens: cached,
                ..Usage::default()
            },
            ..Choice::default()
        };
        // Two prompts of 3 and 5 tokens, two choices each.
        let choices = [choice(1, 2), choice(2, 0), choice(3, 0), choice(4, 4)];
        let u = usage_json(&[3, 5], &choices);
        assert_eq!(u["prompt_tokens"], 8);
        assert_eq!(u["completion_tokens"], 10);
        assert_eq!(u["total_tokens"], 18);
        assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 6);
    }

    #[test]
    fn tool_calls_take_the_message_and_the_finish() {
        let settings = Settings::default();
        let meta = |calling| Meta {
            endpoint: Endpoint::Chat,
            id: "chatcmpl-00ab",
            created: 0,
            model: "m",
            flow: "dense",
            settings: &settings,
            calling,
            reasoning: false,
            thinking_opened: false,
        };
        let tok = vortex_model::random::tiny(1).tokenizer;
        let text = "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": 2}}\n</tool_call>\n<tool_call>{\"name\": \"g\"}</tool_call>";
        let choice = |text: &str, finish| Choice {
            text: text.into(),
            finish: Some(finish),
            ..Choice::default()
        };
        let names = vec!["f".to_string(), "g".to_string(), "h".to_string()];
        let (all, one) = (
            Calling {
                parallel: true,
                names: names.clone(),
                list: false,
            },
            Calling {
                parallel: false,
                names,
                list: false,
            },
        );
        let on = Some(&all);
        let v = full(&meta(on), &tok, &[choice(text, FinishReason::Stop)], &[3]);
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["message"]["content"], "Checking.");
        assert_eq!(
            c["message"]["tool_calls"],
            json!([
                {"id": "call_00ab_0_0", "type": "function",
                 "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": 2}"}},
                {"id": "call_00ab_0_1", "type": "function",
                 "function": {"name": "g", "arguments": "{}"}},
            ])
        );
        // Only calls: no content. One call at most without parallel calls.
        let only =
            "<tool_call>{\"name\": \"g\"}</tool_call><tool_call>{\"name\": \"h\"}</tool_call>";
        let v = full(
            &meta(Some(&one)),
            &tok,
            &[choice(only, FinishReason::Stop)],
            &[3],
        );
        let m = &v["choices"][0]["message"];
        assert!(m["content"].is_null(), "{v}");
        assert_eq!(m["tool_calls"].as_array().unwrap().len(), 1);
        // Without tools offered, or cut short, the text is the content.
        let v = full(&meta(None), &tok, &[choice(text, FinishReason::Stop)], &[3]);
        assert_eq!(v["choices"][0]["message"]["content"], text);
        assert!(v["choices"][0]["message"].get("tool_calls").is_none());
        let cut = "<tool_call>{\"name\": \"f\", \"argu";
        let v = full(&meta(on), &tok, &[choice(cut, FinishReason::Length)], &[3]);
        assert_eq!(v["choices"][0]["message"]["content"], cut);
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        // Cut by `max_tokens` right after whole calls, bare or tagged: the calls are all of it;
        // cut in the text after a call, it is still a reply cut short.
        let bare = "{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n";
        for (text, finish) in [
            (bare, "tool_calls"),
            (text, "tool_calls"),
            (&format!("{text}\nAnd then"), "length"),
        ] {
            let v = full(&meta(on), &tok, &[choice(text, FinishReason::Length)], &[3]);
            assert_eq!(v["choices"][0]["finish_reason"], finish, "{text}");
            assert!(
                v["choices"][0]["message"]["tool_calls"].is_array(),
                "{text}"
            );
        }
        // With reasoning read out, the thinking is its own field and the calls come after it.
        let thought = format!("<think>\nweather?\n</think>\n\n{text}");
        let mut with = meta(on);
        with.reasoning = true;
        let v = full(&with, &tok, &[choice(&thought, FinishReason::Stop)], &[3]);
        let m = &v["choices"][0]["message"];
        assert_eq!(m["reasoning_content"], "weather?");
        assert_eq!(m["content"], "Checking.");
        assert_eq!(m["tool_calls"].as_array().unwrap().len(), 2);
        let v = full(
            &meta(on),
            &tok,
            &[choice(&thought, FinishReason::Stop)],
            &[3],
        );
        assert!(
            v["choices"][0]["message"]
                .get("reasoning_content")
                .is_none()
        );
        // A stream's delta numbers its calls.
        let calls = [Call {
            name: "f".into(),
            arguments: "{}".into(),
        }];
        let c = calls_chunk(&meta(on), 2, &calls);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["choices"][0]["index"], 2);
        assert_eq!(c["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        assert_eq!(
            c["choices"][0]["delta"]["tool_calls"][0]["id"],
            "call_00ab_2_0"
        );
    }

    #[test]
    fn text_offsets_count_characters_across_split_tokens() {
        let mut o = TextOffsets::default();
        // "a", then "日" (e6 97 a5) split over two tokens, then "b", an invalid byte, "c".
        let tokens: [&[u8]; 5] = [b"a", b"\xe6\x97", b"\xa5b", b"\xff", b"c"];
        let at: Vec<usize> = tokens.iter().map(|t| o.next(t)).collect();
        assert_eq!(at, [0, 1, 1, 3, 4]);
        assert_eq!(o.next(b""), 5);
    }
}
