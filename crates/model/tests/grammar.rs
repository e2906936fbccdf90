//! The JSON matcher: what it accepts with and without a schema, byte by byte.

use std::sync::Arc;

use serde_json::{Value, json};
use vortex_model::grammar::{Grammar, MAX_WHITESPACE, Matcher};

fn schema(s: Value) -> Arc<Grammar> {
    Arc::new(Grammar::from_schema(&s).expect("a supported schema"))
}

/// Whether `text` is a whole reply the grammar allows, fed in one go and byte by byte.
fn accepts(g: &Arc<Grammar>, text: &[u8]) -> bool {
    let mut m = Matcher::new(g.clone());
    let whole = m.advance(text) && m.is_complete();
    let mut m = Matcher::new(g.clone());
    let bytewise = text.iter().all(|&b| m.advance(&[b])) && m.is_complete();
    assert_eq!(whole, bytewise, "{}", String::from_utf8_lossy(text));
    whole
}

fn object() -> Arc<Grammar> {
    Arc::new(Grammar::any_object())
}

#[test]
fn json_objects_are_accepted_and_other_text_is_not() {
    let g = object();
    for ok in [
        "{}",
        r#"{"a": [1, -2.5e+3, 0, 0.5, 1E-2, true, false, null, "x\n\u00e9\ud83d"]}"#
            .replace("\\ud83d", "")
            .as_str(),
        "{\n  \"a\": {\"b\": [[], {}]},\n  \"c\": \"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"\n}",
        "{\"é\": \"日本 🙂\"}",
    ] {
        assert!(accepts(&g, ok.as_bytes()), "{ok}");
    }
    for bad in [
        "",
        "[]",
        "1",
        "\"a\"",
        "{",
        "{\"a\":}",
        "{\"a\":1,}",
        "{'a':1}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":-}",
        "{\"a\":1e}",
        "{\"a\":.5}",
        "{\"a\":tru}",
        "{\"a\" 1}",
        "{} x",
        " {}",
        "{} ",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\u{1}\"}",
        "{\"a\":[1 2]}",
        "{\"a\":[,]}",
        "{,}",
    ] {
        assert!(!accepts(&g, bad.as_bytes()), "{bad:?}");
    }
}

#[test]
fn multi_byte_characters_may_be_split_and_must_be_valid() {
    let g = object();
    let mut m = Matcher::new(g.clone());
    for piece in [
        &b"{\"k\": \"\xe6"[..],
        b"\x97",
        b"\xa5\xf0\x9f",
        b"\x99\x82\"}",
    ] {
        assert!(m.advance(piece));
    }
    assert!(m.is_complete());
    for bad in [
        &b"\xc0\xaf"[..],
        b"\xed\xa0\x80",
        b"\xf5\x80\x80\x80",
        b"\xe6\x97",
        b"\x80",
        b"\xff",
    ] {
        let mut text = b"{\"k\":\"".to_vec();
        text.extend_from_slice(bad);
        text.extend_from_slice(b"\"}");
        assert!(!accepts(&g, &text), "{bad:x?}");
    }
}

#[test]
fn a_refused_byte_leaves_the_matcher_as_it_was() {
    let mut m = Matcher::new(object());
    assert!(m.advance(b"{\"a\": 12"));
    assert!(!m.advance(b"3x"));
    assert!(m.advance(b"3}"));
    assert!(m.is_complete());
}

#[test]
fn whitespace_runs_are_bounded() {
    let g = object();
    let run = |n: usize| format!("{{{}\"a\":{}1}}", " ".repeat(n), "\n".repeat(n));
    assert!(accepts(&g, run(MAX_WHITESPACE as usize).as_bytes()));
    assert!(!accepts(&g, run(MAX_WHITESPACE as usize + 1).as_bytes()));
    // Runs apart from one another each have the whole allowance.
    let spaced = format!(
        "{{\"a\":{0}[{0}1{0},{0}2{0}]{0}}}",
        " ".repeat(MAX_WHITESPACE as usize)
    );
    assert!(accepts(&g, spaced.as_bytes()));
}

/// A random JSON value of bounded depth, from a tiny generator.
fn random_value(rng: &mut u64, depth: u32) -> Value {
    let mut next = |n: u64| {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng % n
    };
    let kind = if depth == 0 { next(5) } else { next(7) };
    match kind {
        0 => Value::Null,
        1 => Value::Bool(next(2) == 0),
        2 => json!(next(2000) as i64 - 1000),
        3 => json!((next(100000) as f64 - 50000.0) / 64.0 * 10f64.powi(next(9) as i32 - 4)),
        4 => {
            let chars = ["a", "é", "\"", "\\", "\n", "\u{1}", "日", "🙂", "/", " "];
            Value::String((0..next(6)).map(|_| chars[next(10) as usize]).collect())
        }
        5 => Value::Array((0..next(4)).map(|_| random_value(rng, depth - 1)).collect()),
        _ => Value::Object(
            (0..next(4))
                .map(|i| (format!("k{i}"), random_value(rng, depth - 1)))
                .collect(),
        ),
    }
}

#[test]
fn any_json_object_serde_writes_is_accepted_and_what_is_accepted_parses() {
    let g = object();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..400 {
        let v = Value::Object(
            [("v".to_string(), random_value(&mut rng, 4))]
                .into_iter()
                .collect(),
        );
        for text in [v.to_string(), serde_json::to_string_pretty(&v).unwrap()] {
            assert!(accepts(&g, text.as_bytes()), "{text}");
            // Every prefix is allowed; cut anywhere but the end, it is not complete.
            let mut m = Matcher::new(g.clone());
            for (i, &b) in text.as_bytes().iter().enumerate() {
                assert!(!m.is_complete(), "complete after {i} bytes of {text}");
                assert!(m.advance(&[b]));
            }
            // One byte changed: accepted only if it is still JSON.
            let mut bytes = text.clone().into_bytes();
            let at = (rng % bytes.len() as u64) as usize;
            bytes[at] = b"{}[]\",:0-.e \\atn"[(rng >> 20) as usize % 16];
            if accepts(&g, &bytes) {
                // JSON's syntax bounds no exponent; serde refuses those past f64's range.
                let parsed: Result<Value, _> = serde_json::from_slice(&bytes);
                let in_syntax = match parsed {
                    Ok(p) => p.is_object(),
                    Err(e) => e.to_string().contains("out of range"),
                };
                assert!(in_syntax, "{}", String::from_utf8_lossy(&bytes));
            }
        }
    }
}

#[test]
fn numbers_follow_json_syntax_and_integers_take_no_fraction() {
    let n = schema(json!({"type": "number"}));
    let i = schema(json!({"type": "integer"}));
    for ok in ["0", "-0", "12", "-3.25", "1e5", "1E+5", "2.5e-3"] {
        assert!(accepts(&n, ok.as_bytes()), "{ok}");
    }
    for bad in ["01", "-", "1.", ".5", "1e", "1e+", "+1", "--1", "0x1"] {
        assert!(!accepts(&n, bad.as_bytes()), "{bad}");
    }
    assert!(accepts(&i, b"-120") && accepts(&i, b"0"));
    assert!(!accepts(&i, b"1.0") && !accepts(&i, b"1e3"));
}

/// A reply held to a few texts is one of them, byte for byte; a text that is the beginning of
/// another may end the reply or go on; bad lists are refused.
#[test]
fn a_choice_is_one_of_its_texts_exactly() {
    let choices: Vec<String> = ["yes", "yes!", "no", "maybe so", "ça va", "{\"a\": 1}"]
        .map(String::from)
        .to_vec();
    let g = Arc::new(Grammar::choice(&choices).unwrap());
    for c in &choices {
        assert!(accepts(&g, c.as_bytes()), "{c}");
    }
    for bad in [
        "",
        "y",
        "ye",
        "yes!!",
        "nope",
        "maybe",
        "maybe so ",
        " no",
        "\"no\"",
        "ça",
    ] {
        assert!(!accepts(&g, bad.as_bytes()), "{bad}");
    }
    let mut m = Matcher::new(g.clone());
    assert!(m.advance(b"yes") && m.is_complete() && !m.is_done());
    assert!(m.advance(b"!") && m.is_done());
    let mut m = Matcher::new(g.clone());
    assert!(m.advance(b"no") && m.is_done());
    let refused = |list: &[&str]| {
        Grammar::choice(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).is_err()
    };
    assert!(refused(&[]));
    assert!(refused(&["a", ""]));
    assert!(refused(&["a", " b"]));
    assert!(refused(&["a", &"x".repeat(5000)]));
    assert!(!refused(&["a", "a"]));
}

/// A reply held to a regular expression is text it matches whole; where nothing may follow
/// the reply is done; bad or huge expressions are refused.
#[test]
fn a_regex_reply_is_text_the_expression_matches_whole() {
    let g = Arc::new(Grammar::regex(r"\d{3}-\d{4}( ext\. \d+)?").unwrap());
    for ok in ["555-1234", "555-1234 ext. 7", "000-0000 ext. 12345"] {
        assert!(accepts(&g, ok.as_bytes()), "{ok}");
    }
    for bad in [
        "",
        "555-123",
        "5551234",
        "555-1234 ",
        " 555-1234",
        "555-1234 ext.",
        "a",
    ] {
        assert!(!accepts(&g, bad.as_bytes()), "{bad}");
    }
    let mut m = Matcher::new(g.clone());
    assert!(m.advance(b"555-1234") && m.is_complete() && !m.is_done());
    let g = Arc::new(Grammar::regex("(yes|no)").unwrap());
    let mut m = Matcher::new(g.clone());
    assert!(m.advance(b"yes") && m.is_done());
    // Whitespace and characters past ASCII are the expression's to allow.
    let g = Arc::new(Grammar::regex(r"\s*ça[^\n]{0,3}").unwrap());
    assert!(accepts(&g, "  ça va".as_bytes()));
    assert!(!accepts(&g, b"\xc3"));
    assert!(!accepts(&g, "ça\nva".as_bytes()));
    // Expressions nothing matches, which would end a reply that does not match them.
    for none in [
        r"ab[^\s\S]",
        r"[^\s\S]",
        "^$x",
        "[a&&b]",
        r"a[^\x00-\x{10FFFF}]",
    ] {
        let e = Grammar::regex(none).unwrap_err();
        assert!(e.to_string().contains("matches no text"), "{none}: {e}");
    }
    // A long expression is refused before it is parsed: 200,000 `\w` (a class of about 770
    // ranges each) took 1.5 s and 1.3 GB to parse.
    let start = std::time::Instant::now();
    let e = Grammar::regex(&r"\w".repeat(200_000)).unwrap_err();
    assert!(e.to_string().contains("at most 4096 bytes"), "{e}");
    assert!(start.elapsed().as_secs_f32() < 0.5, "{:?}", start.elapsed());
    // A syntax error quotes the expression as sent.
    let e = Grammar::regex("(red|blue").unwrap_err().to_string();
    assert!(e.contains("(red|blue") && !e.contains("(?:"), "{e}");
    for bad in ["(", "a{99999999}", r"[ab]*a[ab]{30}", &"a".repeat(5000)] {
        let start = std::time::Instant::now();
        assert!(Grammar::regex(bad).is_err(), "{bad}");
        assert!(
            start.elapsed().as_secs_f32() < 2.0,
            "{bad}: {:?}",
            start.elapsed()
        );
    }
    // Large automata are built or refused quickly.
    for big in [
        "(?:a|b|c|d|e|f|g|h){1,4000}x{1000}",
        r"(?:\w+\s+){5,200}\w{1,50}",
        r"[ab]*a[ab]{12}",
    ] {
        let start = std::time::Instant::now();
        let _ = Grammar::regex(big);
        assert!(
            start.elapsed().as_secs_f32() < 2.0,
            "{big}: {:?}",
            start.elapsed()
        );
    }
}
