//! Server-sent events as OpenAI-style streaming APIs send them: `data: {json}` events separated by
//! blank lines, ending with `data: [DONE]`; and what one event's JSON chunk says.

use serde_json::Value;

/// Splits a byte stream into the data of complete events, whatever the network reads cut.
#[derive(Default)]
pub struct SseParser {
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    /// Data lines of the event being read.
    data: Vec<String>,
}

impl SseParser {
    /// Feeds bytes read from the network; returns the data of each event they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..nl]);
            rest = &rest[nl + 1..];
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut events);
        }
        self.partial.extend_from_slice(rest);
        events
    }

    /// The stream has ended: an event cut short of its blank line still counts.
    pub fn finish(&mut self) -> Vec<String> {
        let mut events = Vec::new();
        let line = std::mem::take(&mut self.partial);
        if !line.is_empty() {
            self.line(&line, &mut events);
        }
        self.line(b"", &mut events);
        events
    }

    fn line(&mut self, line: &[u8], events: &mut Vec<String>) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if !self.data.is_empty() {
                events.push(std::mem::take(&mut self.data).join("\n"));
            }
            return;
        }
        let line = String::from_utf8_lossy(line);
        // Comments (`: keep-alive`) and other fields (`event:`, `id:`, `retry:`) carry no data.
        if let Some(value) = line.strip_prefix("data:") {
            let value = value.strip_prefix(' ').unwrap_or(value);
            self.data.push(value.to_string());
        }
    }
}

/// What one event of a completion stream says.
#[derive(Debug, Default, PartialEq)]
pub struct Chunk {
    /// The end of the stream (`[DONE]`).
    pub done: bool,
    /// Bytes of generated text it carries (`choices[0].text`, or `delta.content` for chat).
    pub text_len: usize,
    /// `usage.prompt_tokens` and `usage.completion_tokens`, in the usage chunk.
    pub usage: Option<(u64, u64)>,
    /// Why the server gave up, from an `error` object sent inside the stream.
    pub error: Option<String>,
}

/// Reads one event's data.
pub fn parse_chunk(data: &str) -> Result<Chunk, String> {
    if data.trim() == "[DONE]" {
        return Ok(Chunk {
            done: true,
            ..Chunk::default()
        });
    }
    let v: Value = serde_json::from_str(data).map_err(|e| {
        let head: String = data.chars().take(120).collect();
        format!("bad JSON in stream ({e}): {head}")
    })?;
    let mut chunk = Chunk::default();
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let msg = err
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| err.to_string());
        chunk.error = Some(msg);
    }
    if let Some(choice) = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
    {
        let text = choice
            .get("text")
            .or_else(|| choice.get("delta").and_then(|d| d.get("content")))
            .and_then(Value::as_str);
        chunk.text_len = text.map_or(0, str::len);
    }
    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
        let field = |name: &str| u.get(name).and_then(Value::as_u64).unwrap_or(0);
        chunk.usage = Some((field("prompt_tokens"), field("completion_tokens")));
    }
    Ok(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        ": keep-alive\n\n",
        "data: {\"id\":\"c1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"Hello\",\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"text\":\" wörld\",\"finish_reason\":\"length\"}],\"usage\":null}\r\n\r\n",
        "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\n\n",
        "data: [DONE]\n\n",
    );

    fn chunks(events: &[String]) -> Vec<Chunk> {
        events.iter().map(|e| parse_chunk(e).unwrap()).collect()
    }

    fn check(all: &[Chunk]) {
        assert_eq!(all.len(), 4);
        assert_eq!(all[0].text_len, 5);
        assert_eq!(all[1].text_len, " wörld".len());
        assert_eq!(all[2].text_len, 0);
        assert_eq!(all[2].usage, Some((7, 2)));
        assert!(all[0].usage.is_none() && all[1].usage.is_none());
        assert!(all[3].done);
    }

    #[test]
    fn whole_stream_at_once() {
        let mut p = SseParser::default();
        let mut events = p.push(STREAM.as_bytes());
        events.extend(p.finish());
        check(&chunks(&events));
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let bytes = STREAM.as_bytes();
        // Cuts inside the JSON, inside the multi-byte 'ö', between '\r' and '\n', and between
        // the two newlines that end an event.
        for cut in 1..bytes.len() {
            let mut p = SseParser::default();
            let mut events = p.push(&bytes[..cut]);
            events.extend(p.push(&bytes[cut..]));
            events.extend(p.finish());
            check(&chunks(&events));
        }
        // One byte per read.
        let mut p = SseParser::default();
        let mut events = Vec::new();
        for b in bytes {
            events.extend(p.push(std::slice::from_ref(b)));
        }
        assert!(p.finish().is_empty());
        check(&chunks(&events));
    }

    #[test]
    fn done_without_blank_line_at_end() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: [DONE]").is_empty());
        assert_eq!(p.finish(), vec!["[DONE]".to_string()]);
    }

    #[test]
    fn multi_line_data_and_other_fields() {
        let mut p = SseParser::default();
        let events = p.push(b"event: message\nid: 3\ndata: {\"a\":\ndata:1}\n\n");
        assert_eq!(events, vec!["{\"a\":\n1}".to_string()]);
    }

    #[test]
    fn chat_delta_and_errors() {
        let c = parse_chunk(r#"{"choices":[{"delta":{"content":"hi"}}]}"#).unwrap();
        assert_eq!(c.text_len, 2);
        let c =
            parse_chunk(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#).unwrap();
        assert_eq!(c.text_len, 0);
        let c =
            parse_chunk(r#"{"error":{"message":"out of memory","type":"server_error"}}"#).unwrap();
        assert_eq!(c.error.as_deref(), Some("out of memory"));
        assert!(parse_chunk("{not json").is_err());
    }
}
