//! Schemas a client may send to stall or crash the server, and the matcher against serde_json.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use vortex_model::grammar::{Grammar, Matcher};

mod grammar_support;
use grammar_support::no_name_twice;

/// Compiles `schema` on a thread with the stack of the server's blocking threads (2 MiB), in
/// at most `limit`; returns whether it compiled.
fn compile_like_the_server(schema: Value, limit: Duration) -> bool {
    let start = Instant::now();
    let ok = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || Grammar::from_schema(&schema).is_ok())
        .unwrap()
        .join()
        .unwrap();
    let took = start.elapsed();
    assert!(took < limit, "compiled in {took:?}");
    ok
}

/// `$defs` a0 -> a1 -> ... -> a(n-1) -> null.
fn ref_chain(n: usize) -> Value {
    let mut defs = Map::new();
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

#[test]
fn a_long_chain_of_references_does_not_overflow_the_stack() {
    assert!(!compile_like_the_server(
        ref_chain(5000),
        Duration::from_secs(5)
    ));
    assert!(compile_like_the_server(
        ref_chain(100),
        Duration::from_secs(1)
    ));
    // Through objects too: each link a property.
    for (n, ok) in [(60, true), (3000, false)] {
        assert_eq!(
            compile_like_the_server(objects_chain(n), Duration::from_secs(5)),
            ok
        );
    }
}

fn objects_chain(n: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        defs.insert(
            format!("a{i}"),
            json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/a{}", i + 1)}}}),
        );
    }
    defs.insert(format!("a{n}"), json!({"type": "null"}));
    json!({"$defs": defs, "$ref": "#/$defs/a0"})
}

/// A large enum, and many places that hold it, each through a reference of its own.
#[test]
fn references_do_not_copy_a_large_enum_without_bound() {
    let values: Vec<Value> = (0..4096)
        .map(|i| Value::from(format!("{i:04}{}", "x".repeat(1000))))
        .collect();
    let mut defs = Map::new();
    defs.insert("e".into(), json!({"enum": values}));
    let n = 4000;
    for i in 0..n {
        defs.insert(format!("r{i}"), json!({"$ref": "#/$defs/e"}));
    }
    let alts: Vec<Value> = (0..n)
        .map(|i| json!({"$ref": format!("#/$defs/r{i}")}))
        .collect();
    let schema = json!({"$defs": defs, "type": "array", "items": {"anyOf": alts}});
    assert!(!compile_like_the_server(schema, Duration::from_secs(5)));
    // One reference to it is fine.
    let values: Vec<Value> = (0..1000).map(|i| Value::from(format!("{i:04}"))).collect();
    let schema = json!({"$defs": {"e": {"enum": values}}, "items": {"$ref": "#/$defs/e"}});
    assert!(compile_like_the_server(schema, Duration::from_secs(1)));
}

#[test]
fn many_alternatives_of_one_large_enum_compile_quickly() {
    let values: Vec<Value> = (0..4096)
        .map(|i| Value::from(format!("{i:04}{}", "x".repeat(200))))
        .collect();
    let alts: Vec<Value> = (0..50_000).map(|_| json!({"$ref": "#/$defs/e"})).collect();
    let schema = json!({"$defs": {"e": {"enum": values}}, "anyOf": alts});
    assert!(!compile_like_the_server(schema, Duration::from_secs(5)));
}

/// Long property names are refused rather than matched past the 16 bits a name's length has.
#[test]
fn property_names_and_references_are_bounded() {
    let long = "k".repeat(70_000);
    let schema = json!({"type": "object", "properties": {long.clone(): {"type": "null"}},
        "required": [long], "additionalProperties": false});
    assert!(!compile_like_the_server(schema, Duration::from_secs(1)));
    // A long reference: every place under it would be named by a copy of it.
    let name = "d".repeat(70_000);
    let schema =
        json!({"$defs": {name.clone(): {"type": "null"}}, "$ref": format!("#/$defs/{name}")});
    assert!(!compile_like_the_server(schema, Duration::from_secs(1)));
}

#[test]
fn self_references_and_empty_sets_are_errors() {
    for s in [
        json!({"$ref": "#"}),
        json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        json!({"anyOf": [{"$ref": "#"}]}),
        json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}),
        json!({"anyOf": []}),
        json!({"type": []}),
        json!({"enum": []}),
        json!({"type": "string", "enum": []}),
        json!({"type": "string", "enum": [1]}),
        json!(false),
        json!({"type": "object", "properties": {"a": false}, "required": ["a"]}),
        json!({"type": "array", "minItems": 2, "maxItems": 1}),
        json!({"$ref": "#/nowhere"}),
        json!({"$ref": "http://example.com/s"}),
        json!({"$ref": 1}),
        json!({"type": 1}),
        json!({"type": "object", "properties": {"a": {}}, "required": ["a", "b"]}),
        json!({"type": "array", "minItems": -1}),
        json!({"type": "array", "minItems": 1.5}),
    ] {
        let got = compile_like_the_server(s.clone(), Duration::from_secs(1));
        assert!(!got, "{s} compiled");
    }
    // Huge bounds are clamped, not overflowed.
    for s in [
        json!({"type": "array", "minItems": 1_000_000_000_000_000_000u64}),
        json!({"type": "array", "maxItems": 0}),
        json!({"type": "array", "minItems": u64::MAX, "maxItems": u64::MAX}),
    ] {
        assert!(
            compile_like_the_server(s.clone(), Duration::from_secs(1)),
            "{s}"
        );
    }
}

fn any_value() -> Arc<Grammar> {
    Arc::new(Grammar::from_schema(&json!({})).unwrap())
}

fn whole(g: &Arc<Grammar>, text: &[u8]) -> bool {
    let mut m = Matcher::new(g.clone());
    m.advance(text) && m.is_complete()
}

#[test]
fn numbers_escapes_and_bytes_as_json_has_them() {
    let g = any_value();
    for good in [
        &b"-0"[..],
        b"0",
        b"1E+5",
        b"1e-5",
        b"-1.5e3",
        b"\"\\u00e9\"",
        b"\"\xc3\xa9\"",
        b"\"\xf0\x9f\x98\x80\"",
        b"[]",
        b"{}",
        b"{\"a\":[1,{\"b\":null}]}",
    ] {
        assert!(whole(&g, good), "{}", String::from_utf8_lossy(good));
    }
    for bad in [
        &b"01"[..],
        b"1.",
        b"1e",
        b"-",
        b"1e+",
        b".5",
        b"+1",
        b"\"\\x\"",
        b"\"\x01\"",
        b"\"\x1f\"",
        b"\"\xff\"",
        b"\"\xc0\xaf\"",
        b"\"\x80\"",
        b"\"\xed\xa0\x80\"",
        b"\"\\ud800\"",
        b"\"\xc3\"",
        b"[1,]",
        b"{\"a\":1,}",
        b"{\"a\"}",
        b"{\"a\":1,\"a\":2}",
        b"{\"a\":1,\"\\u0061\":2}",
        b" 1",
        b"1 ",
        b"tru",
        b"nul",
    ] {
        assert!(!whole(&g, bad), "{}", String::from_utf8_lossy(bad));
    }
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
            "[\\x00-\\x1f\"\\\\/é€😀]{0,4}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                prop::collection::btree_map(".{0,5}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn valid_json_is_taken_byte_by_byte(v in json_value(), pretty in any::<bool>()) {
            let g = any_value();
            let text = if pretty {
                serde_json::to_string_pretty(&v).unwrap()
            } else {
                v.to_string()
            };
            let bytes = text.as_bytes();
            let mut m = Matcher::new(g);
            for (i, &b) in bytes.iter().enumerate() {
                prop_assert!(m.advance(&[b]), "byte {i} of {text:?}");
                if i + 1 < bytes.len() && !v.is_number() {
                    prop_assert!(!m.is_complete(), "complete at {i} of {text:?}");
                }
            }
            prop_assert!(m.is_complete(), "{text:?}");
        }

        #[test]
        fn whatever_the_matcher_completes_serde_json_parses(
            v in json_value(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, prop::sample::select(
                vec![0u8, 1, 0x1f, b' ', b'"', b'\\', b'u', b'0', b'.', b'e', b'-', b'+', b',', b':',
                     b'{', b'}', b'[', b']', 0x80, 0xbf, 0xc0, 0xc3, 0xed, 0xa0, 0xf4, 0x90, 0xff]
            )), 1..4),
        ) {
            let g = any_value();
            let mut bytes = v.to_string().into_bytes();
            for (at, op, b) in edits {
                let i = at.index(bytes.len() + 1);
                match op {
                    0 => bytes.insert(i, b),
                    1 if i < bytes.len() => bytes[i] = b,
                    _ if i < bytes.len() => { bytes.remove(i); }
                    _ => {}
                }
            }
            let mut m = Matcher::new(g.clone());
            let mut taken = 0;
            for &b in &bytes {
                if !m.advance(&[b]) {
                    break;
                }
                taken += 1;
            }
            if taken == bytes.len() && m.is_complete() {
                // JSON's grammar has numbers of any size; serde_json's values do not.
                let parsed = serde_json::from_slice::<Value>(&bytes)
                    .map_err(|e| e.to_string())
                    .or_else(|e| if e.contains("number out of range") { Ok(Value::Null) } else { Err(e) });
                prop_assert!(parsed.is_ok(), "{:?}: {:?}", String::from_utf8_lossy(&bytes), parsed);
            }
            // What is taken, whole, is what serde_json takes whole with no name twice in an
            // object.
            let parsed = no_name_twice(&bytes)
                && bytes.first().is_some_and(|b| !b" \t\r\n".contains(b))
                && bytes.last().is_some_and(|b| !b" \t\r\n".contains(b));
            if parsed && !has_ws_run(&bytes, 21) && !has_surrogate_escape(&bytes) {
                prop_assert!(whole(&g, &bytes), "{:?}", String::from_utf8_lossy(&bytes));
            }
        }
    }

    fn has_ws_run(bytes: &[u8], n: usize) -> bool {
        let mut run = 0;
        for b in bytes {
            run = if b" \t\r\n".contains(b) { run + 1 } else { 0 };
            if run >= n {
                return true;
            }
        }
        false
    }

    fn has_surrogate_escape(bytes: &[u8]) -> bool {
        bytes
            .windows(3)
            .any(|w| w[0] == b'\\' && w[1] == b'u' && (w[2] == b'd' || w[2] == b'D'))
    }
}
