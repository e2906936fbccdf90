//! Replies held to JSON over HTTP: `response_format` on both endpoints, whole and streamed,
//! and `tool_choice` forcing a call, with the tiny random model (whose free text is never JSON).

use serde_json::{Value, json};

mod support;

use support::*;

/// A schema whose every reply is short (its whitespace runs are bounded), so that even a
/// random model completes it.
fn small_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "size": {"enum": ["small", "large"]},
            "n": {"type": "null"},
        },
        "required": ["ok", "size"],
        "additionalProperties": false,
    })
}

fn conforms(v: &Value) -> bool {
    let o = v.as_object().unwrap();
    o.keys().all(|k| ["ok", "size", "n"].contains(&k.as_str()))
        && o["ok"].is_boolean()
        && (o["size"] == "small" || o["size"] == "large")
        && o.get("n").is_none_or(Value::is_null)
}

/// The chat request with `extra` is a 400 that names `param` and says `says`.
async fn assert_refused(s: &Server, extra: Value, param: &str, says: &str) {
    let (status, v) = s.post("/v1/chat/completions", &chat(extra.clone())).await;
    assert_eq!(status, 400, "{extra}: {v}");
    assert_eq!(v["error"]["param"], param, "{extra}: {v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{extra}: {message}");
}

/// A request with `extra` and `seed` on both endpoints: the chat reply and its finish reason,
/// and the completion of `prompt` (at most `max_tokens`, where given).
async fn both_endpoints(
    s: &Server,
    extra: &Value,
    seed: usize,
    prompt: &str,
    max_tokens: Option<u64>,
) -> (String, Value, String) {
    let mut body = chat(extra.clone());
    body["seed"] = json!(seed);
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{extra}: {v}");
    let choice = &v["choices"][0];
    let reply = choice["message"]["content"].as_str().unwrap().to_string();
    let mut body = extra.clone();
    body["prompt"] = json!(prompt);
    body["seed"] = json!(seed);
    if let Some(n) = max_tokens {
        body["max_tokens"] = json!(n);
    }
    let (status, c) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{extra}: {c}");
    let completion = c["choices"][0]["text"].as_str().unwrap().to_string();
    (reply, choice["finish_reason"].clone(), completion)
}

/// The chat reply held to `format` with `seed`: the response, and its content as JSON.
async fn held_reply(s: &Server, format: &Value, seed: u64) -> (Value, Value) {
    let body = chat(json!({"response_format": format, "seed": seed}));
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let reply = serde_json::from_str(text).unwrap();
    (v, reply)
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Answer in JSON"}],
        "max_tokens": 400, "temperature": 1.0, "seed": 3});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_reply_parses_and_conforms_whole_and_streamed() {
    let s = start(512, 4, None).await;
    let format = json!({"type": "json_schema",
        "json_schema": {"name": "answer", "schema": small_schema(), "strict": true}});
    for seed in 0..3 {
        let body = chat(json!({"response_format": format, "seed": seed}));
        let (status, v) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        let reply: Value = serde_json::from_str(text).unwrap();
        assert!(conforms(&reply), "{text}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let deltas: String = s
            .stream("/v1/chat/completions", &streamed)
            .await
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|e| {
                e["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect();
        assert_eq!(deltas, text);
    }
}

/// Two object schemas that share a key, as a union of two models is written.
fn union_schema() -> Value {
    json!({
        "$defs": {"Answer": small_schema(), "Nothing": {
            "type": "object",
            "properties": {"ok": {"type": "null"}, "why": {"enum": [1, 2]}},
            "required": ["ok", "why"],
            "additionalProperties": false,
        }},
        "anyOf": [{"$ref": "#/$defs/Answer"}, {"$ref": "#/$defs/Nothing"}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_held_to_a_union_of_objects_conforms_to_one_of_them() {
    let s = start(512, 4, None).await;
    let format = json!({"type": "json_schema",
        "json_schema": {"name": "answer", "schema": union_schema()}});
    for seed in 0..4 {
        let (v, reply) = held_reply(&s, &format, seed).await;
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        let nothing = reply.as_object().unwrap().len() == 2
            && reply["ok"].is_null()
            && (reply["why"] == 1 || reply["why"] == 2);
        assert!(conforms(&reply) || nothing, "{text}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
}

/// Strings held to a format, a pattern and a length, an integer to bounds: a random model's
/// reply keeps to each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_keeps_its_strings_and_integers_to_their_rules() {
    let s = start(512, 4, None).await;
    let schema = json!({
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
            "note": {"type": "string", "maxLength": 3},
            "n": {"type": "integer", "minimum": -3, "exclusiveMaximum": 4},
        },
        "required": ["day", "code", "note", "n"],
        "additionalProperties": false,
    });
    let format = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    for seed in 0..3 {
        let (v, reply) = held_reply(&s, &format, seed).await;
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        let day = reply["day"].as_str().unwrap().as_bytes();
        let digits = |r: std::ops::Range<usize>, s: &[u8]| s[r].iter().all(u8::is_ascii_digit);
        assert!(day.len() == 10 && digits(0..4, day) && day[4] == b'-' && day[7] == b'-');
        let code = reply["code"].as_str().unwrap().as_bytes();
        assert!(
            code.len() == 6 && code[..2].iter().all(u8::is_ascii_uppercase),
            "{text}"
        );
        assert!(code[2] == b'-' && digits(3..6, code), "{text}");
        let note = reply["note"].as_str().unwrap();
        assert!(note.chars().count() <= 3, "{text}");
        assert!((-3..=3).contains(&reply["n"].as_i64().unwrap()), "{text}");
        assert_eq!(reply.as_object().unwrap().len(), 4, "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_object_reply_is_one_object_on_both_endpoints() {
    let s = start(512, 4, None).await;
    // `}` (byte 125) is the likeliest token wherever the grammar allows it.
    let object = json!({"response_format": {"type": "json_object"}, "logit_bias": {"125": 100}});
    let (status, v) = s.post("/v1/chat/completions", &chat(object.clone())).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "{}", "{v}");
    let mut body = object;
    body["prompt"] = json!("JSON:");
    body["max_tokens"] = json!(8);
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "{}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Cut short by max_tokens, a reply is a beginning of an object and ends by its length.
    let body = chat(json!({"response_format": {"type": "json_object"}, "max_tokens": 3}));
    let (_, v) = s.post("/v1/chat/completions", &body).await;
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with('{')
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

/// vLLM's ways to hold a reply: `structured_outputs` (a schema, its text, any object, a
/// choice, a regular expression or a GBNF grammar), `guided_json`, `guided_choice`,
/// `guided_regex` and `guided_grammar`, and llama.cpp's `grammar`, on both endpoints;
/// structural tags are refused, and so is asking twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_structured_outputs_and_guided_fields_hold_replies_too() {
    let s = start(512, 4, None).await;
    let text = small_schema().to_string();
    for (seed, extra) in [
        json!({"structured_outputs": {"json": small_schema()}}),
        json!({"structured_outputs": {"json": text}}),
        json!({"guided_json": small_schema()}),
        json!({"guided_json": text}),
    ]
    .into_iter()
    .enumerate()
    {
        let (reply, _, completion) = both_endpoints(&s, &extra, seed, "JSON:", Some(400)).await;
        for text in [reply, completion] {
            let reply: Value = serde_json::from_str(&text).unwrap();
            assert!(conforms(&reply), "{extra}: {reply}");
        }
    }
    let phone = r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}";
    let is_phone = |t: &str| {
        t.len() == 14
            && t.bytes().enumerate().all(|(i, b)| match i {
                0 => b == b'(',
                4 => b == b')',
                5 => b == b' ',
                9 => b == b'-',
                _ => b.is_ascii_digit(),
            })
    };
    let phone_gbnf = r#"root ::= "(" digit{3} ") " digit{3} "-" digit{4}
                        digit ::= [0-9]"#;
    for (seed, extra) in [
        json!({"guided_regex": phone}),
        json!({"structured_outputs": {"regex": phone}}),
        json!({"grammar": phone_gbnf}),
        json!({"guided_grammar": phone_gbnf}),
        json!({"structured_outputs": {"grammar": phone_gbnf}}),
    ]
    .into_iter()
    .enumerate()
    {
        let (reply, finish, completion) = both_endpoints(&s, &extra, seed, "Call:", Some(40)).await;
        assert!(is_phone(&reply), "{extra}: {reply}");
        assert_eq!(finish, "stop");
        assert!(is_phone(&completion), "{extra}: {completion}");
    }
    let choices = ["positive", "negative", "neutral", "pos"];
    for (seed, extra) in [
        json!({"guided_choice": choices}),
        json!({"structured_outputs": {"choice": choices}}),
    ]
    .into_iter()
    .enumerate()
    {
        let (reply, finish, completion) =
            both_endpoints(&s, &extra, seed, "Sentiment:", None).await;
        assert!(choices.contains(&reply.as_str()), "{extra}: {reply}");
        assert_eq!(finish, "stop");
        assert!(
            choices.contains(&completion.as_str()),
            "{extra}: {completion}"
        );
    }
    let body =
        chat(json!({"structured_outputs": {"json_object": true}, "logit_bias": {"125": 100}}));
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "{}", "{v}");
    for (extra, param, says) in [
        (
            json!({"structured_outputs": {"structural_tag": {}}}),
            "structured_outputs",
            "'structured_outputs.structural_tag' is not supported",
        ),
        (
            json!({"grammar": "root ::= root \"a\" | \"a\""}),
            "grammar",
            "'grammar': rule 'root': left recursion",
        ),
        (
            json!({"guided_grammar": 7}),
            "guided_grammar",
            "'guided_grammar' must be a string",
        ),
        (
            json!({"guided_regex": "("}),
            "guided_regex",
            "'guided_regex': regex: cannot be enforced",
        ),
        (
            json!({"structured_outputs": {"regex": 5}}),
            "structured_outputs",
            "'structured_outputs.regex' must be a string",
        ),
        (
            json!({"guided_choice": ["a", 1]}),
            "guided_choice",
            "a list of strings",
        ),
        (
            json!({"structured_outputs": {"choice": []}}),
            "structured_outputs",
            "at least one",
        ),
        (
            json!({"guided_choice": ["a"], "guided_json": small_schema()}),
            "guided_choice",
            "'guided_json' and 'guided_choice' both say",
        ),
        (
            json!({"structured_outputs": {"json": small_schema(), "json_object": true}}),
            "structured_outputs",
            "one of 'json', 'json_object', 'choice', 'regex' and 'grammar'",
        ),
        (
            json!({"guided_json": "{not json"}),
            "guided_json",
            "not a JSON schema's text",
        ),
        (
            json!({"guided_json": {"type": "string", "format": "iri"}}),
            "guided_json",
            "the format \"iri\" is not supported",
        ),
        (
            json!({"guided_json": small_schema(), "response_format": {"type": "json_object"}}),
            "guided_json",
            "'response_format' and 'guided_json' both say",
        ),
    ] {
        assert_refused(&s, extra, param, says).await;
    }
}

fn tool(name: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters": parameters}})
}

/// `tool_choice` "required" or a named tool: the reply is calls of offered tools (one call of
/// the named one; with "required", one or more unless `parallel_tool_calls` is false), each
/// call's arguments as its tool's schema says, read back as `tool_calls`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_choice_returns_calls() {
    let s = start_with_template("qwen3").await;
    let city = json!({"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": false});
    let hour = json!({"type": "object", "properties": {"h": {"type": "integer", "minimum": 0,
        "maximum": 23}}, "required": ["h"], "additionalProperties": false});
    let tools = json!([tool("get_weather", city), tool("alarm", hour)]);
    let required = json!("required");
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let mut calls_read = 0;
    for (choice, parallel, names) in [
        (&required, true, vec!["get_weather", "alarm"]),
        (&required, false, vec!["get_weather", "alarm"]),
        (&named, true, vec!["get_weather"]),
    ] {
        for seed in 0..3 {
            let body = chat(json!({"tools": tools, "tool_choice": choice, "seed": seed,
                "max_tokens": 200, "parallel_tool_calls": parallel}));
            let (status, v) = s.post("/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{v}");
            let c = &v["choices"][0];
            if c["finish_reason"] == "length" {
                // A list of calls may run on past the limit.
                assert!(parallel && names.len() > 1, "{v}");
                continue;
            }
            assert_eq!(c["finish_reason"], "tool_calls", "{v}");
            let calls = c["message"]["tool_calls"].as_array().unwrap();
            assert!(!calls.is_empty() && (parallel && names.len() > 1 || calls.len() == 1));
            for call in calls {
                let name = call["function"]["name"].as_str().unwrap();
                assert!(names.contains(&name), "{v}");
                let args = call["function"]["arguments"].as_str().unwrap();
                let args: Value = serde_json::from_str(args).unwrap();
                calls_read += 1;
                match name {
                    "get_weather" => {
                        assert!(args == json!({"city": "Paris"}) || args == json!({"city": "Rome"}))
                    }
                    _ => assert!((0..24).contains(&args["h"].as_i64().unwrap()), "{v}"),
                }
            }
        }
    }
    assert!(calls_read >= 4, "{calls_read} calls read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_enforced_is_a_400_that_says_why() {
    let s = start_with_template("qwen3").await;
    let schema = |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let weather = json!([tool("get_weather", json!({"type": "object"}))]);
    for (extra, param, says) in [
        (
            json!({"response_format": schema(json!({"type": "string", "pattern": "a(?=b)"}))}),
            "response_format",
            "#/pattern: cannot be enforced",
        ),
        (
            json!({"response_format": schema(json!({"type": "number", "multipleOf": 0.5}))}),
            "response_format",
            "'multipleOf'",
        ),
        (
            json!({"response_format": schema(json!({"properties": {"a": {"not": {}}}}))}),
            "response_format",
            "#/properties/a: the keyword 'not'",
        ),
        (
            json!({"response_format": schema(json!({"type": "object", "required": ["a"]}))}),
            "response_format",
            "'a' is not in 'properties'",
        ),
        (
            json!({"response_format": schema(json!(7))}),
            "response_format",
            "'response_format.json_schema.schema' has the wrong type",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format",
            "holding 'schema'",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
            "is missing",
        ),
        (
            json!({"response_format": {"type": "json_object", "schema": {}}}),
            "response_format",
            "unknown field",
        ),
        (
            json!({"response_format": "json"}),
            "response_format",
            "must be an object",
        ),
        (
            json!({"tool_choice": "required"}),
            "tool_choice",
            "needs at least one tool",
        ),
        (
            json!({"tools": weather, "tool_choice": {"type": "function", "function": {"name": "f"}}}),
            "tool_choice",
            "not among 'tools'",
        ),
        (
            json!({"tools": weather, "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
            "ask for one",
        ),
    ] {
        assert_refused(&s, extra, param, says).await;
    }
    let mut body = json!({"prompt": "x", "response_format": schema(json!({"not": {}}))});
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("response_format")),
        "{v}"
    );
    body["response_format"] = json!({"type": "text"});
    assert_eq!(s.post("/v1/completions", &body).await.0, 200);
}

/// `$defs` a0 -> a1 -> ... -> a(n-1) -> null.
fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let next = if i + 1 == n {
            json!({"type": "null"})
        } else {
            json!({"$ref": format!("#/$defs/a{}", i + 1)})
        };
        defs.insert(format!("a{i}"), next);
    }
    json!({"$defs": defs, "$ref": "#/$defs/a0"})
}

/// Schemas made to exhaust the server (a chain of references deep enough to overflow a
/// thread's stack, references that copy a large enum thousands of times) are 400s, at once,
/// in a response format as in a forced tool's parameters; the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_made_to_exhaust_the_server_are_refused_quickly() {
    let s = start_with_template("qwen3").await;
    let values: Vec<Value> = (0..4096)
        .map(|i| Value::from(format!("{i:04}{}", "x".repeat(1000))))
        .collect();
    let mut defs = serde_json::Map::new();
    defs.insert("e".into(), json!({"enum": values}));
    for i in 0..4000 {
        defs.insert(format!("r{i}"), json!({"$ref": "#/$defs/e"}));
    }
    let alts: Vec<Value> = (0..4000)
        .map(|i| json!({"$ref": format!("#/$defs/r{i}")}))
        .collect();
    let copies = json!({"$defs": defs, "type": "array", "items": {"anyOf": alts}});
    for (schema, says) in [(ref_chain(5000), "nests more than"), (copies, "MiB")] {
        let start = std::time::Instant::now();
        let format =
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema.clone()}});
        let (status, v) = s
            .post(
                "/v1/chat/completions",
                &chat(json!({"response_format": format})),
            )
            .await;
        assert_eq!(status, 400, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
        // A forced tool's parameters are compiled while the tools are offered (this prompt
        // then holds too many tokens).
        let tools = json!([{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"a": schema}}}}]);
        let body = chat(json!({"tools": tools, "tool_choice": "required", "max_tokens": 8}));
        let (status, v) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{v}");
        assert!(start.elapsed().as_secs() < 20, "{:?}", start.elapsed());
        let (status, v) = s
            .post("/v1/chat/completions", &chat(json!({"max_tokens": 2})))
            .await;
        assert_eq!(status, 200, "{v}");
    }
}
