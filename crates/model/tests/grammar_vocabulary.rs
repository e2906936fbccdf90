//! The token mask: the trie walk gives exactly the tokens a check of each token alone gives.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use vortex_model::grammar::{Constraint, Grammar, Matcher, TokenSet, Vocabulary};

/// Token `SPECIAL` is never written, `END` ends a reply.
const SPECIAL: u32 = 0;
const END: u32 = 1;

/// Every string of up to two bytes over an alphabet JSON cares about, with a few longer ones
/// and the halves of multi-byte characters.
fn tiny_tokens() -> Vec<Option<Vec<u8>>> {
    let alphabet = b"{}[]\":, \n\\/antrue1-.e0";
    let mut tokens: Vec<Option<Vec<u8>>> = vec![None, None];
    for &a in alphabet {
        tokens.push(Some(vec![a]));
        for &b in alphabet {
            tokens.push(Some(vec![a, b]));
        }
    }
    for long in [
        &b"\"name\""[..],
        b"\"n",
        b"ame",
        b"true",
        b"null",
        b"false",
        b"\": \"",
        b"\"}",
        b"12",
        b"\xc3",
        b"\xa9",
        b"\xc3\xa9",
        b"\xe6\x97",
        b"\xa5",
        b"\\u00e9",
        b"\\ud800",
        b"    ",
        b"\"a\":",
        b"},{",
        b"\"]}",
        b"\"additional\"",
    ] {
        tokens.push(Some(long.to_vec()));
    }
    tokens
}

fn vocabulary(tokens: &[Option<Vec<u8>>]) -> Arc<Vocabulary> {
    Arc::new(Vocabulary::new(tokens.len(), |id| {
        tokens[id as usize].as_deref()
    }))
}

/// The tokens allowed next, one token at a time.
fn brute_force(m: &mut Matcher, tokens: &[Option<Vec<u8>>]) -> TokenSet {
    let mut set = TokenSet::empty(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        if let Some(t) = t
            && m.accepts(t)
        {
            set.insert(id as u32);
        }
    }
    set
}

/// Walks random allowed tokens, checking the mask against brute force at every step.
fn compare_along_random_replies(g: Grammar, seeds: u64, steps: usize) {
    compare_with_tokens(g, &tiny_tokens(), seeds, steps);
}

/// The same over the tokens `tokens`.
fn compare_with_tokens(g: Grammar, tokens: &[Option<Vec<u8>>], seeds: u64, steps: usize) {
    let g = Arc::new(g);
    let vocab = vocabulary(tokens);
    for seed in 1..=seeds {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut m = Matcher::new(g.clone());
        let mut c = Constraint::new(g.clone(), vocab.clone(), vec![END]);
        for step in 0..steps {
            let mut want = brute_force(&mut m, tokens);
            assert_eq!(vocab.allowed(&mut m), want, "seed {seed} step {step}");
            if m.is_complete() || want.is_empty() {
                want.insert(END);
            }
            let got = c.allowed().clone();
            assert_eq!(got, want, "seed {seed} step {step}");
            assert!(!got.contains(SPECIAL));
            let ids: Vec<u32> = got.ids().collect();
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let pick = ids[(rng % ids.len() as u64) as usize];
            if pick == END {
                break;
            }
            assert!(c.accept(pick));
            assert!(m.advance(tokens[pick as usize].as_deref().unwrap()));
        }
    }
}

#[test]
fn the_mask_equals_brute_force_for_any_object() {
    compare_along_random_replies(Grammar::any_object(), 40, 60);
}

#[test]
fn the_mask_equals_brute_force_for_a_schema() {
    let g = Grammar::from_schema(&json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "n": {"type": "integer"},
            "tags": {"type": "array", "items": {"enum": ["a", "ab", 1, 12, true]}, "maxItems": 3},
        },
        "required": ["name"],
        "additionalProperties": {"type": ["null", "boolean"]},
    }))
    .unwrap();
    compare_along_random_replies(g, 40, 60);
}

#[test]
fn the_mask_equals_brute_force_for_a_union() {
    let g = Grammar::from_schema(&json!({"anyOf": [
        {"type": "object", "properties": {"name": {"type": "string"}, "a": {"type": "integer"}},
         "required": ["name"], "additionalProperties": false},
        {"type": "object", "properties": {"name": {"type": "integer"}, "n": {"type": "array",
            "items": {"anyOf": [{"type": "array", "items": {"type": "integer"}},
                                {"type": "array", "items": {"type": "boolean"}}]}}},
         "additionalProperties": false},
        {"type": "object", "properties": {"n": {"type": "null"}}, "required": ["n"]},
        {"type": "array", "items": {"type": "string"}},
        {"type": "null"},
    ]}))
    .unwrap();
    compare_along_random_replies(g, 60, 60);
}

#[test]
fn the_mask_equals_brute_force_for_held_strings() {
    let g = Grammar::from_schema(&json!({
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^(tr|an)[0-9]+$", "maxLength": 5},
            "name": {"type": "string", "minLength": 2, "maxLength": 4},
            "when": {"anyOf": [{"type": "string", "format": "date"}, {"const": "never"}]},
            "n": {"type": ["integer", "null"], "minimum": -12, "maximum": 130},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}],
                "items": false},
        },
        "required": ["id", "name"],
        "additionalProperties": false,
    }))
    .unwrap();
    compare_along_random_replies(g, 60, 40);
}

/// Strings held to a pattern and a least length, which a reply reaches through the pattern's
/// repeats: a state comes back with fewer characters still needed, so the kept tokens of a
/// state must differ by what is left to write.
#[test]
fn the_mask_equals_brute_force_for_least_lengths() {
    let g = Grammar::from_schema(&json!({
        "type": "object",
        "properties": {
            "x": {"type": "string", "pattern": "^(aaa|bb)+$", "minLength": 5, "maxLength": 7},
            "y": {"type": "string", "pattern": "^(aaa|bb)+$", "minLength": 2, "maxLength": 7},
            "z": {"type": "string", "pattern": "^(ab|b\"a|é)+$", "minLength": 4, "maxLength": 6},
            "w": {"type": "string", "pattern": "^(aa|bbb)+$", "minLength": 5, "maxLength": 5},
        },
        "required": ["x", "y", "z", "w"],
        "additionalProperties": false,
    }))
    .unwrap();
    // Every string of up to three pieces, and a few longer ones.
    let pieces: [&[u8]; 13] = [
        b"a",
        b"b",
        b"\"",
        b"\\",
        b"\\\"",
        b"\\n",
        b":",
        b",",
        b"{",
        b"}",
        b"\xc3",
        b"\xa9",
        b"\xc3\xa9",
    ];
    let mut tokens: Vec<Option<Vec<u8>>> = vec![None, None];
    for a in pieces {
        tokens.push(Some(a.to_vec()));
        for b in pieces {
            tokens.push(Some([a, b].concat()));
            for c in pieces {
                tokens.push(Some([a, b, c].concat()));
            }
        }
    }
    for long in [
        &b"\"x\":\""[..],
        b"\"y\":\"",
        b"\"z\":\"",
        b"\"w\":\"",
        b"aaaa",
        b"bbbb",
        b"abab",
    ] {
        tokens.push(Some(long.to_vec()));
    }
    compare_with_tokens(g, &tokens, 150, 40);
}

/// Once only required members fit, a member's name is no longer any name.
#[test]
fn the_mask_equals_brute_force_for_member_counts() {
    let g = Grammar::from_schema(&json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "an": {"type": "boolean"}},
        "required": ["an"],
        "minProperties": 1,
        "maxProperties": 2,
        "additionalProperties": {"type": "null"},
    }))
    .unwrap();
    compare_along_random_replies(g, 80, 40);
}

#[test]
fn the_mask_equals_brute_force_for_unique_items() {
    let g = Grammar::from_schema(&json!({
        "type": "object",
        "properties": {
            "a": {"type": "array", "items": {"enum": ["a", "an", "n", 1, 10, 0, true]},
                  "uniqueItems": true},
            "n": {"type": "array", "items": {"enum": [1, 10, 100]}, "uniqueItems": true,
                  "minItems": 2},
        },
        "required": ["a"],
        "additionalProperties": false,
    }))
    .unwrap();
    compare_along_random_replies(g, 60, 60);
}

/// A string equal to one taken may not close, and 0 taken may not begin again: the free-string
/// fast path checks each token that leaves the string.
#[test]
fn the_mask_equals_brute_force_for_unique_strings_and_integers() {
    let g = Grammar::from_schema(&json!({
        "type": "object",
        "properties": {
            "s": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
            "i": {"type": "array", "items": {"type": "integer"}, "uniqueItems": true},
            "u": {"type": "array", "items": {"type": ["string", "integer"]}, "uniqueItems": true},
        },
        "additionalProperties": false,
    }))
    .unwrap();
    let mut tokens = tiny_tokens();
    for t in [
        &b"\"s\":[\""[..],
        b"\"i\":[",
        b"\"u\":[",
        b"\",\"",
        b"\"a\",\"a",
    ] {
        tokens.push(Some(t.to_vec()));
    }
    compare_with_tokens(g, &tokens, 120, 60);
}

/// A model that holds an `Optional` of itself: the union follows the model beside `null`.
#[test]
fn the_mask_equals_brute_force_for_a_model_holding_an_optional_of_itself() {
    let g = Grammar::from_schema(&json!({
        "$ref": "#/$defs/node",
        "$defs": {"node": {"type": "object", "properties": {
            "a": {"type": "integer"},
            "n": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
            "additionalProperties": false}},
    }))
    .unwrap();
    let mut tokens = tiny_tokens();
    for t in [&b"\"n\":"[..], b"\"n\":{", b"\"a\":1", b"null}"] {
        tokens.push(Some(t.to_vec()));
    }
    compare_with_tokens(g, &tokens, 60, 40);
}

/// A name the object does not declare, equal to one written before, may not close.
#[test]
fn the_mask_equals_brute_force_for_names_written_once() {
    let mut tokens = tiny_tokens();
    for t in [&b"\"x\":1,"[..], b"\"x\"", b"x\":", b"\"\\u0078\""] {
        tokens.push(Some(t.to_vec()));
    }
    for schema in [
        json!({"type": "object", "properties": {"a": {"type": "integer"}},
               "additionalProperties": {"type": "integer"}}),
        json!({"type": "object", "additionalProperties": {"type": "integer"}}),
    ] {
        compare_with_tokens(Grammar::from_schema(&schema).unwrap(), &tokens, 80, 40);
    }
}

#[test]
fn the_mask_equals_brute_force_for_a_gbnf_grammar() {
    let g = Grammar::gbnf(
        r#"root ::= "[" (item ("," item)*)? "]" | "true"
           item ::= "\"" [a-n]{0,3} "\"" | "-"? [0-9]+ ("." [0-9]+)? | "null" | root"#,
    )
    .unwrap();
    compare_along_random_replies(g, 80, 40);
    // Several ways open at once: the states are all of them.
    let g = Grammar::gbnf(r#"root ::= ("a" | "an" | "ant")+ ("," root)? | "true" "1"*"#).unwrap();
    compare_along_random_replies(g, 80, 30);
}

#[test]
fn the_mask_equals_brute_force_for_a_choice() {
    let choices = ["true", "tree", "a", "an", "ant", "1-e", "\"n\""].map(String::from);
    compare_along_random_replies(Grammar::choice(&choices).unwrap(), 40, 10);
}

#[test]
fn the_mask_equals_brute_force_for_a_regex() {
    compare_along_random_replies(
        Grammar::regex(r"(tr?ue|an+t)[0-9]{1,3}(\.e)?").unwrap(),
        40,
        12,
    );
}

#[test]
fn end_tokens_come_exactly_when_the_reply_is_complete() {
    let g = Arc::new(Grammar::any_object());
    let tokens = tiny_tokens();
    let vocab = vocabulary(&tokens);
    let id = |s: &[u8]| tokens.iter().position(|t| t.as_deref() == Some(s)).unwrap() as u32;
    let mut c = Constraint::new(g, vocab, vec![END]);
    assert!(!c.allowed().contains(END));
    assert!(c.accept(id(b"{}")));
    let last = c.allowed();
    assert_eq!(last.ids().collect::<Vec<_>>(), vec![END]);
    assert!(!c.accept(id(b"}")), "nothing may follow the object");
    assert!(c.accept(END));
}

/// The Qwen2.5 tokenizer, if its GGUF is in the model cache.
fn qwen() -> Option<vortex_model::tokenizer::Tokenizer> {
    let path = vortex_model::fetch::cached_path("qwen2.5-coder-0.5b").ok()?;
    if !Path::new(&path).is_file() {
        println!("SKIP: no qwen2.5-coder-0.5b in the model cache");
        return None;
    }
    let file = vortex_model::gguf::GgufFile::open(&path).ok()?;
    vortex_model::gguf_model::gguf_tokenizer(&file).ok()
}

/// On a real vocabulary, in the states with the most tokens to try: the mask matches brute
/// force, and how long it takes is printed.
#[test]
fn the_mask_on_qwen_matches_brute_force_and_is_timed() {
    let Some(tok) = qwen() else { return };
    let start = Instant::now();
    let vocab = Arc::new(Vocabulary::of(&tok));
    println!(
        "vocabulary of {}: built in {:?}",
        vocab.size(),
        start.elapsed()
    );
    let object = Arc::new(Grammar::any_object());
    let schema = Arc::new(
        Grammar::from_schema(&json!({"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"],
            "additionalProperties": false}))
        .unwrap(),
    );
    let open = Arc::new(
        Grammar::from_schema(&json!({"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]}))
        .unwrap(),
    );
    let pets = Arc::new(
        Grammar::from_schema(&json!({"anyOf": [
            {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
             "required": ["kind", "lives"], "additionalProperties": false},
            {"type": "object", "properties": {"kind": {"const": "dog"}, "bark": {"type": "string"}},
             "required": ["kind", "bark"], "additionalProperties": false}]}))
        .unwrap(),
    );
    let held = Arc::new(
        Grammar::from_schema(&json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 64},
            "code": {"type": "string", "pattern": "^[A-Z][a-z ]+$"},
            "day": {"type": "string", "format": "date"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "p": {"type": "number", "minimum": 0, "maximum": 1}},
            "required": ["name", "code", "day"], "additionalProperties": false}))
        .unwrap(),
    );
    for (what, g, prefix) in [
        ("start of an object", &object, ""),
        ("a key, others allowed", &open, "{\""),
        ("in a key, others allowed", &open, "{\"na"),
        ("a key of any object", &object, "{\""),
        ("start of a value", &object, "{\"a\": "),
        ("inside a string", &object, "{\"a\": \"hel"),
        ("after a value", &object, "{\"a\": 1"),
        ("a declared key", &schema, "{\""),
        ("a string property", &schema, "{\"name\": \"Jo"),
        ("a key of a union", &pets, "{\""),
        ("a string of at most 64", &held, "{\"name\": \"Jo"),
        (
            "3 characters left of 64",
            &held,
            &format!("{{\"name\": \"{}", "x".repeat(61)),
        ),
        ("a string to a pattern", &held, "{\"code\": \"Jo"),
        ("a date", &held, "{\"day\": \"2024-"),
        ("an integer to 150", &held, "{\"age\": "),
        ("in an integer to 150", &held, "{\"age\": 1"),
        ("a number from 0 to 1, after 0.", &held, "{\"p\": 0."),
        (
            "a string in a union",
            &pets,
            "{\"kind\": \"dog\", \"bark\": \"wo",
        ),
    ] {
        let mut m = Matcher::new(g.clone());
        assert!(m.advance(prefix.as_bytes()));
        let runs = 20;
        let start = Instant::now();
        let mut set = vocab.allowed(&mut m);
        for _ in 1..runs {
            set = vocab.allowed(&mut m);
        }
        let each = start.elapsed() / runs;
        let mut want = TokenSet::empty(vocab.size());
        for id in 0..vocab.size() as u32 {
            let bytes = vocab.bytes(id);
            if !bytes.is_empty() && m.accepts(bytes) {
                want.insert(id);
            }
        }
        assert_eq!(set, want, "{what}");
        let n = set.ids().count();
        println!("{what:>20}: {n:>6} tokens allowed, mask in {each:?}");
    }
    // A reply comes back to a pattern's loop at every token: its tokens are kept.
    let byte = |b: u8| {
        (0..vocab.size() as u32)
            .find(|&id| vocab.bytes(id) == [b])
            .unwrap()
    };
    let mut c = Constraint::new(held.clone(), vocab.clone(), Vec::new());
    for &b in b"{\"code\": \"Jo" {
        assert!(c.accept(byte(b)));
    }
    let runs = 20;
    let start = Instant::now();
    for _ in 0..runs {
        assert!(c.allowed().contains(byte(b'o')));
        assert!(c.accept(byte(b'o')));
    }
    let each = start.elapsed() / runs;
    println!("a string to a pattern, its loop again: mask and token in {each:?}");
}

/// A sampler held to a grammar draws a complete reply from any logits, on every sampling path.
#[test]
fn a_constrained_sampler_writes_whole_json_from_random_logits() {
    use vortex_model::sampling::{Sampler, SamplingParams};
    let tokens = tiny_tokens();
    let vocab = vocabulary(&tokens);
    let g = Arc::new(Grammar::any_object());
    let mut complete = 0;
    for seed in 0..30u64 {
        let params = SamplingParams {
            temperature: [0.0, 1.0, 0.7][seed as usize % 3],
            top_k: [0, 5, 0][seed as usize % 3],
            top_p: [1.0, 1.0, 0.9][seed as usize % 3],
            repetition_penalty: 1.3,
            seed,
            ..SamplingParams::default()
        };
        let constraint = Constraint::new(g.clone(), vocab.clone(), vec![END]);
        // Holding off the end for longer than the reply takes gives way to the grammar.
        let mut sampler = Sampler::new(params, &[])
            .with_min_tokens(vec![END], 1000)
            .constrained(constraint);
        assert!(!sampler.is_plain_greedy() && sampler.device_draw().is_none());
        let mut rng = seed + 1;
        let mut text = Vec::new();
        for _ in 0..400 {
            let mut logits: Vec<f32> = (0..tokens.len())
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    (rng % 1000) as f32 / 100.0
                })
                .collect();
            // Closing tokens likelier, so that most replies end within the budget.
            for (id, t) in tokens.iter().enumerate() {
                if t.as_deref()
                    .is_some_and(|t| t.contains(&b'}') || t.contains(&b']'))
                {
                    logits[id] += 4.0;
                }
            }
            let token = sampler.sample(&mut logits);
            assert_ne!(token, SPECIAL, "seed {seed}");
            if token == END {
                break;
            }
            text.extend_from_slice(tokens[token as usize].as_deref().unwrap());
        }
        let mut m = Matcher::new(g.clone());
        assert!(m.advance(&text), "{}", String::from_utf8_lossy(&text));
        if m.is_complete() {
            complete += 1;
            match serde_json::from_slice::<serde_json::Value>(&text) {
                Ok(v) => assert!(v.is_object()),
                // JSON's syntax bounds no exponent; serde refuses those past f64's range.
                Err(e) => assert!(e.to_string().contains("out of range"), "{e}"),
            }
        }
    }
    assert!(complete >= 10, "{complete} of 30 replies complete");
}

/// Where the vocabulary cannot go on and no token ends the reply, the sampler says that the
/// token it had to record broke the grammar; a sampler that could go on never does.
#[test]
fn a_sampler_with_nothing_allowed_says_it_broke_the_grammar() {
    use vortex_model::sampling::{Sampler, SamplingParams};
    // Only "{" and "x": an object's first member or end cannot be written.
    let tokens: Vec<Option<Vec<u8>>> = vec![Some(b"{".to_vec()), Some(b"x".to_vec())];
    let vocab = vocabulary(&tokens);
    let g = Arc::new(Grammar::any_object());
    for end in [vec![], vec![1]] {
        let constraint = Constraint::new(g.clone(), vocab.clone(), end.clone());
        let mut sampler = Sampler::new(SamplingParams::default(), &[]).constrained(constraint);
        assert_eq!(sampler.sample(&mut [0.0, 1.0]), 0);
        assert!(!sampler.off_grammar());
        let token = sampler.sample(&mut [0.0, 1.0]);
        assert_eq!(
            sampler.off_grammar(),
            end.is_empty(),
            "end tokens {end:?}: drew {token}"
        );
    }
}
