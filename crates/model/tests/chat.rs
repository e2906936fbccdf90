//! Chat-template tests: the real SmolLM2, Qwen2.5 and Qwen3 templates (copied from the GGUF
//! metadata / tokenizer_config.json into tests/fixtures/tokenizer/chat/) against transformers'
//! `apply_chat_template` output (tests/fixtures/tokenizer/chat/expected.json, made by
//! scripts/make_tokenizer_fixtures.py), plus the ChatML fallback and the helper functions.

use std::path::Path;

use vortex_model::chat::{CHATML_TEMPLATE, ChatError, ChatMessage, ChatTemplate, RenderOptions};

fn fixture_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/chat")
}

#[derive(serde::Deserialize)]
struct Case {
    template: String,
    conversation: String,
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    extra: Option<serde_json::Value>,
    bos_token: String,
    eos_token: String,
    expected: String,
}

#[test]
fn real_templates_match_transformers() {
    let text = std::fs::read_to_string(fixture_dir().join("expected.json")).unwrap();
    // Each case also as a minijinja value, which keeps key order (serde_json::Value would
    // sort the tools' keys), re-serialized to JSON text for render_json.
    let ordered: Vec<minijinja::Value> = serde_json::from_str(&text).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    assert!(cases.len() >= 20);
    for (case, ord) in cases.iter().zip(&ordered) {
        let source =
            std::fs::read_to_string(fixture_dir().join(format!("{}.jinja", case.template)))
                .unwrap();
        let t = ChatTemplate::new(&source, &case.bos_token, &case.eos_token).unwrap();
        let label = format!(
            "{} / {} / gen={} / tools={} / extra={:?}",
            case.template,
            case.conversation,
            case.add_generation_prompt,
            case.tools.is_some(),
            case.extra
        );
        let field = |k: &str| {
            let v = ord.get_attr(k).unwrap();
            (!v.is_undefined()).then(|| serde_json::to_string(&v).unwrap())
        };
        let opts = RenderOptions {
            add_generation_prompt: case.add_generation_prompt,
            tools: field("tools"),
            extra: field("extra"),
        };
        let messages = field("messages").unwrap();
        let got = t
            .render_json(&messages, &opts)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(got, case.expected, "{label}");
        if case.add_generation_prompt {
            let extra = match &case.extra {
                Some(serde_json::Value::Object(m)) => m.clone(),
                _ => Default::default(),
            };
            let got = t
                .render_with_tools(&case.messages, field("tools").as_deref(), &extra)
                .unwrap_or_else(|e| panic!("{label} (render_with_tools): {e}"));
            assert_eq!(got, case.expected, "{label} (render_with_tools)");
        }
        if case.tools.is_none() && case.extra.is_none() {
            let got = t
                .render(&case.messages, case.add_generation_prompt)
                .unwrap();
            assert_eq!(got, case.expected, "{label} (render)");
        }
    }
    println!("{} renderings match transformers", cases.len());
}

#[test]
fn smollm2_system_user_prompt() {
    let source = std::fs::read_to_string(fixture_dir().join("smollm2.jinja")).unwrap();
    let t = ChatTemplate::from_model(Some(&source), "<|im_start|>", "<|im_end|>").unwrap();
    assert!(!t.is_chatml_fallback());
    let out = t
        .render(
            &[ChatMessage::system("Be brief."), ChatMessage::user("Hi")],
            true,
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn chatml_fallback() {
    for t in [
        ChatTemplate::chatml(),
        ChatTemplate::from_model(None, "", "<|im_end|>").unwrap(),
        ChatTemplate::from_model(Some("  "), "", "<|im_end|>").unwrap(),
    ] {
        assert!(t.is_chatml_fallback());
        assert_eq!(t.source(), CHATML_TEMPLATE);
        let out = t
            .render(
                &[ChatMessage::user("2+2?"), ChatMessage::assistant("4")],
                false,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        );
        let out = t.render(&[ChatMessage::user("hi")], true).unwrap();
        assert!(out.ends_with("<|im_start|>assistant\n"));
    }
}

#[test]
fn helper_functions_and_python_methods() {
    let src = concat!(
        "{{ bos_token }}{% for m in messages %}",
        "{{ m.content.strip().upper() }}|{{ m.role.startswith('us') }}|{{ m.content.split(',')[-1].lstrip() }}|",
        "{% endfor %}",
        "{{ strftime_now('%d %B %Y') }}|{{ {'b': 1, 'a': [1.5, 'é', none, true]} | tojson }}|",
        "{{ {'k': {'x': 1}} | tojson(indent=2) }}|{{ enable_thinking is defined }}|{{ tools is none }}",
        "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    );
    let t = ChatTemplate::new(src, "<s>", "</s>")
        .unwrap()
        .with_fixed_date(2024, 7, 26);
    let out = t.render(&[ChatMessage::user("  a, b ")], false).unwrap();
    assert_eq!(
        out,
        "<s>A, B|True|b |26 July 2024|{\"b\": 1, \"a\": [1.5, \"é\", null, true]}|{\n  \"k\": {\n    \"x\": 1\n  }\n}|False|True01"
    );
    let out = t
        .render_json(
            r#"[{"role": "user", "content": "x"}]"#,
            &RenderOptions {
                extra: Some(r#"{"enable_thinking": false}"#.into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(out.ends_with("|True|True01"), "{out}");
}

#[test]
fn strftime_now_defaults_to_today() {
    let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
    let year: i32 = t.render(&[], false).unwrap().parse().unwrap();
    assert!(year >= 2024, "{year}");
}

#[test]
fn errors_are_values() {
    let e = ChatTemplate::new("{% for x in %}", "", "").unwrap_err();
    assert!(matches!(e, ChatError::Syntax(_)), "{e}");
    let t = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&[ChatMessage::user("x")], false).unwrap(), "ok");
    let e = t.render(&[ChatMessage::system("x")], false).unwrap_err();
    assert!(
        matches!(&e, ChatError::Render(m) if m.contains("Conversation must start with user")),
        "{e}"
    );
    let t = ChatTemplate::chatml();
    assert!(matches!(
        t.render_json("not json", &RenderOptions::default()),
        Err(ChatError::Json(_))
    ));
    assert!(matches!(
        t.render_json("{}", &RenderOptions::default()),
        Err(ChatError::Json(_))
    ));
    let bad_extra = RenderOptions {
        extra: Some("[1]".into()),
        ..Default::default()
    };
    assert!(matches!(
        t.render_json("[]", &bad_extra),
        Err(ChatError::Json(_))
    ));
    // A template that fails at render time (string + number).
    let t = ChatTemplate::new("{{ messages[0].content + 1 }}", "", "").unwrap();
    assert!(matches!(
        t.render(&[ChatMessage::user("x")], false),
        Err(ChatError::Render(_))
    ));
}

/// Templates from a model file are input too: one that would recurse the parser off its stack,
/// one past the size limit and one that loops without end are errors, not crashes or hangs.
#[test]
fn hostile_templates_are_errors() {
    let deep = format!("{{{{ {}1 }}}}", "-".repeat(120_000));
    match ChatTemplate::new(&deep, "", "") {
        Ok(t) => {
            let _ = t.render(&[ChatMessage::user("x")], false);
        }
        Err(e) => assert!(matches!(e, ChatError::Syntax(_)), "{e}"),
    }
    let huge = "x".repeat(200_000);
    assert!(matches!(
        ChatTemplate::new(&huge, "", ""),
        Err(ChatError::Syntax(m)) if m.contains("at most")
    ));
    let endless = ChatTemplate::new(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    assert!(matches!(
        endless.render(&[ChatMessage::user("x")], false),
        Err(ChatError::Render(_))
    ));
    // One call asking for terabytes is refused, not allocated; ordinary widths still work.
    for wide in [
        "{{ 'x'|indent(10000000000000) }}",
        "{{ 'x'|indent(width=18446744073709551615) }}",
        "{{ '%1000000000000s'|format('x') }}",
        "{{ '%.99999999999999999999999f'|format(1.5) }}",
        "{{ '{:>1000000000000}'.format('x') }}",
    ] {
        let t = ChatTemplate::new(wide, "", "").unwrap();
        let r = t.render(&[ChatMessage::user("x")], false);
        assert!(
            matches!(&r, Err(ChatError::Render(m)) if m.contains("wider")),
            "{wide}: {r:?}"
        );
    }
    let t = ChatTemplate::new(
        "{{ 'a\nb'|indent(2) }}|{{ '%5s'|format('x') }}|{{ '{:>3}{{}}'.format('y') }}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::user("x")], false).unwrap(),
        "a\n  b|    x|  y{}"
    );
    // A value nested 100,000 deep is dropped on the render's own stack.
    let nested = ChatTemplate::new(
        "{% set ns = namespace(x=[]) %}{% for i in range(100) %}{% for j in range(1000) %}\
         {% set ns.x = [ns.x] %}{% endfor %}{% endfor %}done",
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        nested.render(&[ChatMessage::user("x")], false).unwrap(),
        "done"
    );
}

/// Qwen3's template with tools, an assistant's tool call and the tool's answer, as the template
/// writes them: the tools' and the arguments' keys in the order given.
#[test]
fn qwen3_renders_tools_and_tool_calls() {
    let source = std::fs::read_to_string(fixture_dir().join("qwen3.jinja")).unwrap();
    let t = ChatTemplate::new(&source, "", "<|im_end|>").unwrap();
    assert!(t.writes_tool_call_blocks());
    assert!(!ChatTemplate::chatml().writes_tool_call_blocks());
    let tool = r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}"#;
    let mut call = ChatMessage::assistant("");
    call.tool_calls = Some(
        r#"[{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"days": 2, "city": "Paris"}}}]"#
            .into(),
    );
    let mut answer = ChatMessage::new("tool", "sunny");
    answer.tool_call_id = Some("call_1".into());
    let messages = [ChatMessage::user("Weather in Paris?"), call, answer];
    let got = t
        .render_with_tools(&messages, Some(&format!("[{tool}]")), &Default::default())
        .unwrap();
    let want = format!(
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tool}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\nWeather in Paris?<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"days\": 2, \"city\": \"Paris\"}}}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(got, want);
    // Tools that are not JSON are an error.
    assert!(
        t.render_with_tools(&messages, Some("[{"), &Default::default())
            .is_err()
    );
}

/// Gemma's turns, for a Gemma file without a template: system text joins the next turn (or a
/// user turn of its own at the end), the assistant is `model`, contents are trimmed.
#[test]
fn gemma_turns() {
    let t = ChatTemplate::new(vortex_model::chat::GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
    let out = t
        .render(
            &[
                ChatMessage::system("Be brief. "),
                ChatMessage::user(" 2+2?"),
                ChatMessage::assistant("4\n"),
                ChatMessage::user("And 3+3?"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nBe brief.\n\n2+2?<end_of_turn>\n<start_of_turn>model\n4\
         <end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n<start_of_turn>model\n"
    );
    let alone = t
        .render(&[ChatMessage::system("Only this.")], false)
        .unwrap();
    assert_eq!(alone, "<bos><start_of_turn>user\nOnly this.<end_of_turn>\n");
}
