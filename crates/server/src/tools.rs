//! Tool calling in Hermes' format, the one Qwen2.5's and Qwen3's templates teach: the model
//! writes each call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. Requests'
//! tool definitions and histories are checked here; calls are read back out of the text.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use vortex_model::grammar::Grammar;

use crate::error::ApiError;
use crate::tool_choice::{self, ToolChoice};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// Tools one request may define.
const MAX_TOOLS: usize = 128;

/// How a request's replies are read for tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calling {
    /// `parallel_tool_calls: false`: only the first call is returned.
    pub parallel: bool,
    /// The offered tools' names.
    pub names: Vec<String>,
    /// The reply is held to a bare list of calls (`tool_choice: "required"`).
    pub list: bool,
}

impl Calling {
    /// A reply's text and the calls it wrote (see [`split`]), as many as allowed. A reply that
    /// is nothing but one call's JSON, bare or in a ```json fence, with its arguments and the
    /// name of an offered tool, is that call too: small models often leave out the tags. So is
    /// a bare list of such calls where the reply was held to one (`tool_choice: "required"`).
    pub fn split(&self, text: &str) -> (String, Vec<Call>) {
        let (mut content, mut calls) = split(text, &|c: &Call| self.names.contains(&c.name));
        if calls.is_empty()
            && let Some(bare) = self.bare_calls(text)
        {
            (content, calls) = (String::new(), bare);
        }
        if !self.parallel {
            calls.truncate(1);
        }
        (content, calls)
    }

    /// Whether the reply ends with a whole call, nothing but whitespace after it: where
    /// `max_tokens` cut it there, its calls are all there is to read.
    pub fn ends_in_call(&self, text: &str) -> bool {
        let t = text.trim_end();
        if self.bare_calls(t).is_some() {
            return true;
        }
        let Some(body) = t.strip_suffix(CLOSE) else {
            return false;
        };
        body.rfind(OPEN)
            .and_then(|at| parse_call(&body[at + OPEN.len()..]))
            .is_some_and(|c| self.names.contains(&c.name))
    }

    fn bare_calls(&self, text: &str) -> Option<Vec<Call>> {
        let t = text.trim();
        let t = t
            .strip_prefix("```json")
            .or_else(|| t.strip_prefix("```"))
            .and_then(|r| r.strip_suffix("```"))
            .unwrap_or(t)
            .trim();
        // Each call as the model wrote it, arguments included.
        let one = |text: &str| {
            let call = serde_json::from_str::<Value>(text)
                .is_ok_and(|v| v.is_object() && v.get("arguments").is_some());
            call.then(|| parse_call(text))
                .flatten()
                .filter(|c| self.names.contains(&c.name))
        };
        match serde_json::from_str::<Vec<&RawValue>>(t) {
            Ok(list) if self.list && !list.is_empty() => {
                list.iter().map(|raw| one(raw.get())).collect()
            }
            _ => one(t).map(|c| vec![c]),
        }
    }
}

/// One call the model wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    /// JSON text of the arguments as the model wrote them.
    pub arguments: String,
}

/// The tools a request offers the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    /// The definitions' JSON text, for the template.
    pub text: String,
    pub names: Vec<String>,
    /// The grammar of the call (or list of calls) `tool_choice` forces, if it forces one.
    pub forced: Option<Grammar>,
    /// The forced reply is a list of calls.
    pub list: bool,
}

/// Checks `tools` and `tool_choice`. Returns what the model is offered (`tool_choice` absent,
/// "auto", "required" or a named function), `None` when nothing ("none", or no tools).
pub fn offered(
    tools: Option<&[Value]>,
    tools_text: Option<&str>,
    choice: Option<&Value>,
    parallel: bool,
) -> Result<Option<Offered>, ApiError> {
    let tools = tools.unwrap_or_default();
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::bad_param(
            "tools",
            format!("at most {MAX_TOOLS} tools, got {}", tools.len()),
        ));
    }
    let name = |t: &Value| t.pointer("/function/name").cloned();
    for (i, t) in tools.iter().enumerate() {
        check_tool(t).map_err(|m| ApiError::bad_param("tools", format!("tools[{i}]: {m}")))?;
        if let Some(j) = tools[..i].iter().position(|u| name(u) == name(t)) {
            return Err(ApiError::bad_param(
                "tools",
                format!("tools[{i}] has the name of tools[{j}]: a call could not tell them apart"),
            ));
        }
    }
    let choice = tool_choice::parse(choice)?;
    let forced = tool_choice::call_grammar(&choice, tools, parallel)?;
    if tools.is_empty() || choice == ToolChoice::None {
        return Ok(None);
    }
    let text = tools_text.map_or_else(|| Value::from(tools.to_vec()).to_string(), str::to_string);
    let names = tools
        .iter()
        .filter_map(|t| t.pointer("/function/name")?.as_str().map(str::to_string))
        .collect();
    Ok(Some(Offered {
        text,
        names,
        list: forced.as_ref().is_some_and(|f| f.1),
        forced: forced.map(|f| f.0),
    }))
}

/// A definition as OpenAI takes it: `{"type": "function", "function": {"name", "description"?,
/// "parameters"?, "strict"?}}`.
fn check_tool(t: &Value) -> Result<(), String> {
    let obj = t.as_object().ok_or("a tool must be an object")?;
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "type" | "function"))
    {
        return Err(format!("unknown field '{}'", crate::protocol::brief(k)));
    }
    if obj.get("type").and_then(Value::as_str) != Some("function") {
        return Err("'type' must be \"function\"".into());
    }
    let f = obj
        .get("function")
        .and_then(Value::as_object)
        .ok_or("'function' must be an object")?;
    for (k, v) in f.iter().filter(|(_, v)| !v.is_null()) {
        let ok = match k.as_str() {
            "name" => v.as_str().is_some_and(valid_name),
            "description" => v.is_string(),
            "parameters" => v.is_object(),
            "strict" => v.is_boolean(),
            other => {
                return Err(format!(
                    "unknown field 'function.{}'",
                    crate::protocol::brief(other)
                ));
            }
        };
        if !ok {
            return Err(match k.as_str() {
                "name" => "'function.name' must be 1 to 64 letters, digits, '_' or '-'".into(),
                "parameters" => "'function.parameters' must be a JSON Schema object".into(),
                "strict" => "'function.strict' must be a boolean".into(),
                _ => format!("'function.{k}' must be a string"),
            });
        }
    }
    if f.get("name").is_none_or(Value::is_null) {
        return Err("'function.name' is missing".into());
    }
    Ok(())
}

fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An assistant message's `tool_calls` as JSON text for the template: each call's arguments
/// (JSON text, as OpenAI sends them) given as the object they spell, keys in their order, as
/// templates that write `arguments | tojson` need.
pub fn history_calls(calls: &Value) -> Result<String, String> {
    let calls = calls.as_array().ok_or("'tool_calls' must be a list")?;
    let mut out = Vec::with_capacity(calls.len());
    for c in calls {
        let name = c
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or("a tool call needs 'function.name'")?;
        if c.get("type").is_some_and(|t| t != "function") {
            return Err("a tool call's 'type' must be \"function\"".into());
        }
        let arguments = match c.pointer("/function/arguments") {
            None | Some(Value::Null) => "{}".to_string(),
            // Some clients send a call without arguments as an empty string.
            Some(Value::String(text)) if text.trim().is_empty() => "{}".to_string(),
            Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(_)) => text.trim().to_string(),
                _ => {
                    return Err(format!(
                        "the arguments of a call to '{}' are not a JSON object",
                        crate::protocol::brief(name)
                    ));
                }
            },
            Some(v @ Value::Object(_)) => v.to_string(),
            Some(_) => return Err("a tool call's 'function.arguments' must be a string".into()),
        };
        let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
        out.push(format!(
            r#"{{"id": {}, "type": "function", "function": {{"name": {}, "arguments": {arguments}}}}}"#,
            json!(id),
            json!(name)
        ));
    }
    Ok(format!("[{}]", out.join(", ")))
}

/// Splits a reply into its text and the calls it wrote. A block that is not a complete call
/// (cut short, or not JSON with a name) or whose call `offered` refuses (a tool not offered)
/// stays in the text.
pub fn split(text: &str, offered: &dyn Fn(&Call) -> bool) -> (String, Vec<Call>) {
    let (mut content, mut calls) = (String::new(), Vec::new());
    let mut rest = text;
    // Whitespace next to a call is dropped, as the stream drops it (see `CallStream`).
    let mut after_call = false;
    while let Some(at) = rest.find(OPEN) {
        let after = &rest[at + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else {
            break;
        };
        match parse_call(&after[..end]).filter(|c| offered(c)) {
            Some(call) => {
                content.push_str(unpadded(&rest[..at], after_call).trim_end());
                calls.push(call);
                after_call = true;
            }
            None => {
                let block = &rest[..at + OPEN.len() + end + CLOSE.len()];
                content.push_str(unpadded(block, after_call));
                after_call = false;
            }
        }
        rest = &after[end + CLOSE.len()..];
    }
    content.push_str(unpadded(rest, after_call));
    (content, calls)
}

/// `piece` without the whitespace at its start when a call comes before it.
fn unpadded(piece: &str, after_call: bool) -> &str {
    if after_call {
        piece.trim_start()
    } else {
        piece
    }
}

fn parse_call(body: &str) -> Option<Call> {
    #[derive(Deserialize)]
    struct Body<'a> {
        name: String,
        #[serde(borrow)]
        arguments: Option<&'a RawValue>,
    }
    let b: Body = serde_json::from_str(body.trim()).ok()?;
    let arguments = match b.arguments {
        None => "{}".to_string(),
        Some(raw) => match serde_json::from_str::<Value>(raw.get()).ok()? {
            Value::Object(_) => raw.get().to_string(),
            // Some models write the arguments as a string of JSON.
            Value::String(s) if serde_json::from_str::<Value>(&s).is_ok_and(|v| v.is_object()) => s,
            _ => return None,
        },
    };
    Some(Call {
        name: b.name,
        arguments,
    })
}

/// A streamed reply's text as it may go out: text before the first call goes at once (but for
/// an end that may begin `<tool_call>`), the rest is held and read when the reply ends. So is a
/// reply that begins like a bare call (`{` or a fence).
#[derive(Debug)]
pub struct CallStream {
    calling: Calling,
    held: String,
    /// Everything from here on waits for the end of the reply.
    holding: bool,
    /// Some text has gone out.
    sent: bool,
}

impl CallStream {
    pub fn new(calling: Calling) -> CallStream {
        CallStream {
            calling,
            held: String::new(),
            holding: false,
            sent: false,
        }
    }

    /// Adds `text`; returns what can be sent as content now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.holding {
            return String::new();
        }
        if !self.sent {
            match self.held.trim_start().chars().next() {
                None => return String::new(),
                Some('{' | '`') => {
                    self.holding = true;
                    return String::new();
                }
                Some('[') if self.calling.list => {
                    self.holding = true;
                    return String::new();
                }
                Some(_) => {}
            }
        }
        let out = self.release();
        self.sent |= !out.is_empty();
        out
    }

    /// The held text up to a call's start, or up to an end that may begin one.
    /// Whitespace before a call is dropped with it (as `split` drops it), so it waits too.
    fn release(&mut self) -> String {
        if let Some(at) = self.held.find(OPEN) {
            self.holding = true;
            let cut = self.held[..at].trim_end().len();
            return self.held.drain(..cut).collect();
        }
        // The longest end of the held text that begins `<tool_call>` (ASCII), and the
        // whitespace before it.
        let p = (1..OPEN.len().min(self.held.len() + 1))
            .rev()
            .find(|&n| self.held.ends_with(&OPEN[..n]))
            .unwrap_or(0);
        let cut = self.held[..self.held.len() - p].trim_end().len();
        self.held.drain(..cut).collect()
    }

    /// Whether the reply so far ends with a whole call ([`Calling::ends_in_call`]).
    pub fn ends_in_call(&self) -> bool {
        self.holding && self.calling.ends_in_call(&self.held)
    }

    /// At the end of the reply: the text still to send, and the calls.
    pub fn finish(self) -> (String, Vec<Call>) {
        if self.holding {
            self.calling.split(&self.held)
        } else {
            (self.held, Vec::new())
        }
    }
}

/// The calls in OpenAI's shape; `id` names the response, each call's id adds its choice and
/// place. With `index`, as a stream's delta writes them.
pub fn calls_json(calls: &[Call], id: &str, choice: usize, index: bool) -> Value {
    let suffix = id.rsplit('-').next().unwrap_or(id);
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut v = json!({
                    "id": format!("call_{suffix}_{choice}_{k}"),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                });
                if index {
                    v["index"] = json!(k);
                }
                v
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calling(parallel: bool) -> Calling {
        Calling {
            parallel,
            names: vec!["f".into(), "get_weather".into()],
            list: false,
        }
    }

    fn call(name: &str, arguments: &str) -> Call {
        Call {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn calls_are_read_out_of_the_text() {
        let text = "<think>\nweather</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = split(text, &|_| true);
        assert_eq!(content, "<think>\nweather</think>");
        assert_eq!(
            calls,
            [
                call("get_weather", r#"{"city": "Paris", "days": 2}"#),
                call("now", "{}")
            ]
        );
        // Arguments written as a string of JSON; no arguments at all.
        let (_, calls) = split(
            r#"<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>"#,
            &|_| true,
        );
        assert_eq!(calls, [call("f", r#"{"x": 1}"#)]);
        let (_, calls) = split(r#"<tool_call>{"name": "f"}</tool_call>"#, &|_| true);
        assert_eq!(calls, [call("f", "{}")]);
    }

    #[test]
    fn what_is_not_a_complete_call_stays_text() {
        for text in [
            "plain answer",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\":",
            "<tool_call>not json</tool_call> after",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
        ] {
            assert_eq!(split(text, &|_| true), (text.to_string(), vec![]), "{text}");
        }
        // A bad block beside a good one: the bad one stays in the text.
        let (content, calls) = split(
            "<tool_call>x</tool_call><tool_call>{\"name\": \"g\"}</tool_call>",
            &|_| true,
        );
        assert_eq!(content, "<tool_call>x</tool_call>");
        assert_eq!(calls, [call("g", "{}")]);
    }

    #[test]
    fn a_stream_sends_text_before_the_calls_and_holds_the_rest() {
        let text = "Let me check. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"<\"}}\n</tool_call>";
        // Every split of the text into two pieces, and one character at a time.
        for p in crate::every_split(text) {
            let mut s = CallStream::new(calling(true));
            let sent: String = p.iter().map(|t| s.push(t)).collect();
            let (rest, calls) = s.finish();
            // The space before the call goes with it, as in the whole reply.
            assert_eq!(sent, "Let me check.", "{p:?}");
            assert_eq!(rest, "");
            assert_eq!(calls, [call("f", r#"{"a": "<"}"#)]);
        }
        // Text that only looks like the start of a call, and the whitespace before it, goes
        // out once it is not one, or at the end.
        let mut s = CallStream::new(calling(false));
        assert_eq!(s.push("a <tool"), "a");
        assert_eq!(s.push("s> b <"), " <tools> b");
        assert_eq!(s.finish(), (" <".to_string(), vec![]));
    }

    #[test]
    fn a_call_to_a_tool_not_offered_stays_text() {
        let text = "<tool_call>{\"name\": \"delete_all\"}</tool_call><tool_call>{\"name\": \"f\"}</tool_call>";
        let (content, calls) = calling(true).split(text);
        assert_eq!(content, "<tool_call>{\"name\": \"delete_all\"}</tool_call>");
        assert_eq!(calls, [call("f", "{}")]);
    }

    #[test]
    fn a_reply_of_one_calls_json_is_that_call() {
        let c = calling(true);
        let want = vec![call("get_weather", r#"{"city": "Paris"}"#)];
        for text in [
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            "```json\n{\n \"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            " ```\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}```\n",
        ] {
            let (content, calls) = c.split(text);
            assert_eq!((content.as_str(), calls.len()), ("", 1), "{text}");
            assert_eq!(calls[0].name, want[0].name);
            assert_eq!(
                serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
                json!({"city": "Paris"})
            );
        }
        // Not a call: a tool not offered, no arguments, text around it, or not an object.
        for text in [
            r#"{"name": "delete_all", "arguments": {}}"#,
            r#"{"name": "get_weather"}"#,
            r#"Here: {"name": "get_weather", "arguments": {}}"#,
            r#"[{"name": "get_weather", "arguments": {}}]"#,
        ] {
            assert_eq!(c.split(text), (text.to_string(), vec![]), "{text}");
        }
        // Streamed: held from its first brace, read at the end.
        let mut s = CallStream::new(calling(true));
        assert_eq!(s.push("  "), "");
        assert_eq!(s.push(r#"{"name": "get_weather", "#), "");
        assert_eq!(s.push(r#""arguments": {"city": "Paris"}}"#), "");
        assert!(s.ends_in_call());
        assert_eq!(s.finish(), (String::new(), want));
        // A reply that only began like one goes out whole at the end.
        let mut s = CallStream::new(calling(true));
        assert_eq!(s.push("{braces} and text"), "");
        assert!(!s.ends_in_call());
        assert_eq!(s.finish(), ("{braces} and text".to_string(), vec![]));
        // Tagged calls end a reply where nothing but whitespace follows the last one.
        let tagged = "<tool_call>{\"name\": \"get_weather\"}</tool_call>";
        assert!(c.ends_in_call(&format!("Checking. {tagged}\n")));
        assert!(!c.ends_in_call(&format!("{tagged} then")));
        assert!(!c.ends_in_call("<tool_call>{\"name\": \"delete_all\"}</tool_call>"));
    }

    /// "required" with several tools: each call's arguments as its own tool's schema says,
    /// whichever member comes first; with parallel calls, a list of one call or more.
    #[test]
    fn required_calls_follow_each_tools_schema_and_may_be_several() {
        let tool = |name: &str, member: &str| {
            json!({"type": "function", "function": {"name": name, "parameters": {
                "type": "object", "properties": {member: {"type": "string", "maxLength": 8}},
                "required": [member], "additionalProperties": false}}})
        };
        let tools = [tool("get_weather", "city"), tool("get_time", "zone")];
        let forced = |parallel| {
            let o = offered(Some(&tools), None, Some(&json!("required")), parallel).unwrap();
            let o = o.unwrap();
            (o.forced.unwrap(), o.list)
        };
        let (one, list) = forced(false);
        assert!(!list);
        let mut m = vortex_model::grammar::Matcher::new(std::sync::Arc::new(one));
        for good in [
            r#"{"name": "get_time", "arguments": {"zone": "UTC"}}"#,
            r#"{"arguments": {"city": "Paris"}, "name": "get_weather"}"#,
        ] {
            assert!(m.accepts(good.as_bytes()), "{good}");
        }
        for bad in [
            r#"{"name": "get_time", "arguments": {"city""#,
            r#"{"arguments": {"city": "Paris"}, "name": "get_time""#,
            r#"{"name": "get_time", "arguments": {"zone": "a long zone""#,
        ] {
            assert!(!m.accepts(bad.as_bytes()), "{bad}");
        }
        let (several, list) = forced(true);
        assert!(list);
        let mut m = vortex_model::grammar::Matcher::new(std::sync::Arc::new(several));
        let two = r#"[{"name": "get_time", "arguments": {"zone": "UTC"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]"#;
        assert!(m.accepts(two.as_bytes()));
        assert!(!m.accepts(b"[]"));
        let calling = |parallel| Calling {
            parallel,
            names: vec!["get_time".into(), "get_weather".into()],
            list: true,
        };
        let (content, calls) = calling(true).split(two);
        assert_eq!(content, "");
        assert_eq!(
            calls,
            vec![
                call("get_time", r#"{"zone": "UTC"}"#),
                call("get_weather", r#"{"city": "Rome"}"#)
            ]
        );
        assert_eq!(calling(false).split(two).1.len(), 1);
        let mut s = CallStream::new(calling(true));
        let (first, rest) = two.split_at(8);
        assert_eq!(s.push(first), "");
        assert_eq!(s.push(rest), "");
        assert_eq!(s.finish().1.len(), 2);
    }

    /// Past 16 tools, "required" compiles none of their schemas: any of the names, any
    /// arguments.
    #[test]
    fn many_tools_required_take_any_arguments() {
        let tools: Vec<Value> = (0..17)
            .map(|i| {
                json!({"type": "function", "function": {"name": format!("t{i}"), "parameters": {
                    "type": "object", "properties": {"x": {"type": "integer"}},
                    "additionalProperties": false}}})
            })
            .collect();
        let o = offered(Some(&tools), None, Some(&json!("required")), false).unwrap();
        let mut m =
            vortex_model::grammar::Matcher::new(std::sync::Arc::new(o.unwrap().forced.unwrap()));
        assert!(m.accepts(br#"{"name": "t16", "arguments": {"y": "z"}}"#));
        assert!(!m.accepts(br#"{"name": "t17""#));
    }

    #[test]
    fn tools_and_choices_are_checked() {
        let tool = json!({"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}});
        let text = r#"[{"type": "function", "function": {"name": "get_weather"}}]"#;
        let got = offered(Some(std::slice::from_ref(&tool)), Some(text), None, true).unwrap();
        let want = Offered {
            text: text.to_string(),
            names: vec!["get_weather".to_string()],
            forced: None,
            list: false,
        };
        assert_eq!(got, Some(want));
        // A forced call: the name and the tool's arguments, all else refused.
        let required = json!("required");
        let forced = offered(
            Some(std::slice::from_ref(&tool)),
            None,
            Some(&required),
            false,
        )
        .unwrap()
        .and_then(|o| o.forced)
        .unwrap();
        let mut m = vortex_model::grammar::Matcher::new(std::sync::Arc::new(forced));
        assert!(m.accepts(br#"{"arguments": {"x": [1]}, "name": "get_weather"}"#));
        for bad in [
            &br#"{"name": "other""#[..],
            br#"{"name": "get_weather", "x""#,
            br#"{"arguments": []"#,
        ] {
            assert!(!m.accepts(bad), "{}", String::from_utf8_lossy(bad));
        }
        assert!(m.advance(br#"{"name": "get_weather", "arguments": {}}"#) && m.is_complete());
        let auto = json!("auto");
        assert!(
            offered(Some(std::slice::from_ref(&tool)), None, Some(&auto), true)
                .unwrap()
                .is_some()
        );
        assert_eq!(
            offered(
                Some(std::slice::from_ref(&tool)),
                None,
                Some(&json!("none")),
                true
            )
            .unwrap(),
            None
        );
        assert_eq!(offered(None, None, Some(&auto), true).unwrap(), None);
        // A null in a definition is an absent field, as elsewhere in a request.
        let nulls = json!({"type": "function", "function": {"name": "f", "description": null, "strict": null}});
        assert!(offered(Some(&[nulls]), None, None, true).unwrap().is_some());
        // A forced call's schema that no draft of JSON Schema allows is a 400; one that asks
        // for what decoding cannot enforce, or that another draft writes, takes any object.
        let with = |parameters: Value| json!({"type": "function", "function": {"name": "f", "parameters": parameters}});
        let recursive = json!({"$ref": "#/definitions/Node", "definitions": {"Node": {
            "type": "object", "properties": {"child": {"allOf": [{"$ref": "#/definitions/Node"}]}}}}});
        for (parameters, refused) in [
            (json!({"type": "bogus"}), true),
            (json!({"$ref": "#/nope"}), true),
            (json!({"type": "object", "properties": "x"}), true),
            (json!({"anyOf": []}), true),
            (json!({"type": "object", "not": {"required": ["a"]}}), false),
            (
                json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 1}}}),
                false,
            ),
            (
                json!({"type": "object", "properties": {"n": {"type": "number", "minimum": 0, "exclusiveMinimum": true}}}),
                false,
            ),
            (
                json!({"type": "object", "properties": {"s": {"type": "string", "maxLength": 10.0}}}),
                false,
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "[^\\s\\S]"}}}),
                false,
            ),
            (recursive, false),
        ] {
            let got = offered(
                Some(&[with(parameters.clone())]),
                None,
                Some(&required),
                true,
            );
            match got {
                Err(e) => assert!(
                    refused && e.message.contains("tools[0].function.parameters"),
                    "{parameters}: {}",
                    e.message
                ),
                Ok(o) => assert!(
                    !refused && o.and_then(|o| o.forced).is_some(),
                    "{parameters}"
                ),
            }
        }
        let twice = [tool.clone(), tool.clone()];
        let e = offered(Some(&twice), None, None, true).unwrap_err();
        assert!(
            e.message.contains("tools[1] has the name of tools[0]"),
            "{}",
            e.message
        );
        for (bad, choice) in [
            (
                json!({"type": "function", "function": {"name": "a b"}}),
                None,
            ),
            (json!({"type": "retrieval"}), None),
            (
                json!({"type": "function", "function": {"name": "f", "extra": 1}}),
                None,
            ),
            (
                json!({"type": "function", "function": {"description": "no name"}}),
                None,
            ),
            (
                json!({"type": "function", "function": {"name": "f", "parameters": "x"}}),
                None,
            ),
            (tool.clone(), Some(json!("any"))),
            (
                tool.clone(),
                Some(json!({"type": "function", "function": {"name": "get_time"}})),
            ),
        ] {
            let e = offered(
                Some(std::slice::from_ref(&bad)),
                None,
                choice.as_ref(),
                true,
            )
            .unwrap_err();
            assert!(e.param.is_some(), "{bad} {choice:?}: {}", e.message);
        }
    }

    #[test]
    fn history_calls_become_the_templates_objects() {
        let calls = json!([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}}]);
        assert_eq!(
            history_calls(&calls).unwrap(),
            r#"[{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": [2]}}}]"#
        );
        // Arguments left out, null or an empty string are no arguments.
        for args in [json!(null), json!(""), json!(" ")] {
            let calls = json!([{"function": {"name": "f", "arguments": args}}]);
            assert!(
                history_calls(&calls)
                    .unwrap()
                    .contains(r#""arguments": {}"#)
            );
        }
        for bad in [
            json!({"function": {"name": "f"}}),
            json!([{"function": {"arguments": "{}"}}]),
            json!([{"function": {"name": "f", "arguments": "not json"}}]),
            json!([{"function": {"name": "f", "arguments": 3}}]),
            json!([{"type": "code", "function": {"name": "f"}}]),
        ] {
            assert!(history_calls(&bad).is_err(), "{bad}");
        }
    }
}
