//! Unions of object and array schemas: the matcher accepts a text exactly when a plain
//! validator of the schema, on the value serde_json reads from it, does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use vortex_model::grammar::{Grammar, Matcher};

mod grammar_support;
use grammar_support::*;

/// Whether `v` is valid under `s` (a schema of the supported keywords), by their plain meaning.
fn valid(root: &Value, s: &Value, v: &Value) -> bool {
    if let Some(Value::String(r)) = s.get("$ref") {
        return valid(root, root.pointer(&r[1..]).unwrap(), v);
    }
    if let Some(Value::Array(alts)) = s.get("anyOf").or_else(|| s.get("oneOf")) {
        return alts.iter().any(|a| valid(root, a, v));
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t],
        Some(Value::Array(ts)) => ts.iter().map(|t| t.as_str().unwrap()).collect(),
        _ => vec!["object", "array", "string", "number", "boolean", "null"],
    };
    let of_type = types.iter().any(|&t| match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64(),
        "boolean" => v.is_boolean(),
        _ => v.is_null(),
    });
    if !of_type {
        return false;
    }
    if let Some(Value::Array(e)) = s.get("enum") {
        return e.contains(v);
    }
    if let Some(c) = s.get("const") {
        return c == v;
    }
    let none = Map::new();
    match v {
        Value::Object(o) => {
            let props = s
                .get("properties")
                .and_then(Value::as_object)
                .unwrap_or(&none);
            let required = s.get("required").and_then(Value::as_array);
            required
                .into_iter()
                .flatten()
                .all(|k| o.contains_key(k.as_str().unwrap()))
                && o.iter().all(|(k, x)| match props.get(k) {
                    Some(p) => valid(root, p, x),
                    None => match s.get("additionalProperties") {
                        None | Some(Value::Bool(true)) => true,
                        Some(Value::Bool(false)) => false,
                        Some(a) => valid(root, a, x),
                    },
                })
        }
        Value::Array(a) => {
            let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let max = s
                .get("maxItems")
                .and_then(Value::as_u64)
                .unwrap_or(u64::MAX);
            (min..=max).contains(&(a.len() as u64))
                && a.iter()
                    .all(|x| s.get("items").is_none_or(|i| valid(root, i, x)))
        }
        _ => true,
    }
}

/// What the validator says of a text the matcher may be given: JSON, with no whitespace
/// around the value (the matcher's rule for a reply).
fn reference(schema: &Value, text: &str) -> bool {
    let bare = !text.starts_with(char::is_whitespace) && !text.ends_with(char::is_whitespace);
    bare && serde_json::from_str::<Value>(text).is_ok_and(|v| valid(schema, schema, &v))
}

fn whole(g: &Arc<Grammar>, text: &str) -> bool {
    let mut m = Matcher::new(g.clone());
    m.advance(text.as_bytes()) && m.is_complete()
}

const KEYS: [&str; 8] = ["kind", "lives", "bark", "a", "b", "c", "v", "zz"];

fn any_leaf(rng: &mut Rng) -> Value {
    [
        json!(null),
        json!(1),
        json!(-2.5),
        json!("s"),
        json!(true),
        json!({}),
        json!([]),
    ][rng.below(7)]
    .clone()
}

/// A random value of schema `s`, mostly valid (an alternative's own values).
fn sample(root: &Value, s: &Value, rng: &mut Rng, depth: u32) -> Value {
    if depth > 6 {
        return any_leaf(rng);
    }
    if let Some(Value::String(r)) = s.get("$ref") {
        return sample(root, root.pointer(&r[1..]).unwrap(), rng, depth + 1);
    }
    if let Some(Value::Array(alts)) = s.get("anyOf").or_else(|| s.get("oneOf")) {
        return sample(root, &alts[rng.below(alts.len())], rng, depth + 1);
    }
    if let Some(Value::Array(e)) = s.get("enum") {
        return e[rng.below(e.len())].clone();
    }
    if let Some(c) = s.get("const") {
        return c.clone();
    }
    let t = match s.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => ts[rng.below(ts.len())].as_str().unwrap(),
        _ => return any_leaf(rng),
    };
    match t {
        "object" => {
            let mut o = Map::new();
            let props = s.get("properties").and_then(Value::as_object);
            let required = s.get("required").and_then(Value::as_array);
            for (k, p) in props.into_iter().flatten() {
                let needed = required.is_some_and(|r| r.contains(&json!(k)));
                if needed || rng.below(2) == 0 {
                    o.insert(k.clone(), sample(root, p, rng, depth + 1));
                }
            }
            if s.get("additionalProperties") != Some(&json!(false)) && rng.below(3) == 0 {
                o.insert("zz".into(), any_leaf(rng));
            }
            Value::Object(o)
        }
        "array" => {
            let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = s.get("maxItems").and_then(Value::as_u64).unwrap_or(4) as usize;
            let n = min + rng.below(max.min(min + 3) - min + 1);
            let items = s.get("items").cloned().unwrap_or(json!({}));
            (0..n)
                .map(|_| sample(root, &items, rng, depth + 1))
                .collect()
        }
        "string" => json!(["", "a", "x y"][rng.below(3)]),
        "integer" => json!(rng.below(40) as i64 - 5),
        "number" => json!(1.5),
        "boolean" => json!(rng.below(2) == 0),
        _ => Value::Null,
    }
}

/// Changes one place in `v`: a value of another kind, a member dropped, added or renamed.
fn mutate(v: &mut Value, rng: &mut Rng) {
    match v {
        Value::Object(o) if !o.is_empty() && rng.below(3) > 0 => {
            let k = o.keys().nth(rng.below(o.len())).unwrap().clone();
            match rng.below(4) {
                0 => {
                    o.remove(&k);
                }
                1 => {
                    let x = o.remove(&k).unwrap();
                    o.insert(KEYS[rng.below(KEYS.len())].into(), x);
                }
                2 => {
                    o.insert(KEYS[rng.below(KEYS.len())].into(), any_leaf(rng));
                }
                _ => mutate(o.get_mut(&k).unwrap(), rng),
            }
        }
        Value::Array(a) if !a.is_empty() && rng.below(3) > 0 => {
            let i = rng.below(a.len());
            match rng.below(3) {
                0 => {
                    a.remove(i);
                }
                1 => a.push(a[i].clone()),
                _ => mutate(&mut a[i], rng),
            }
        }
        _ => *v = any_leaf(rng),
    }
}

/// Texts of values sampled from `schema`, some changed, some cut or with a byte changed:
/// the matcher and the validator agree on each; returns how many each accepted.
fn agree_on_random_texts(schema: &Value, seeds: u64) -> usize {
    let g = Arc::new(Grammar::from_schema(schema).unwrap());
    let mut accepted = 0;
    for seed in 1..=seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut v = sample(schema, schema, &mut rng, 0);
        for _ in 0..rng.below(3) {
            mutate(&mut v, &mut rng);
        }
        let mut text = match rng.below(2) {
            0 => v.to_string(),
            _ => serde_json::to_string_pretty(&v).unwrap(),
        };
        if rng.below(5) == 0 {
            let i = rng.below(text.len());
            let b = b"{}[],:\"0t "[rng.below(10)];
            let mut bytes = text.into_bytes();
            match rng.below(2) {
                0 => bytes[i] = b,
                _ => bytes.truncate(i),
            }
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        let want = reference(schema, &text);
        assert_eq!(whole(&g, &text), want, "{text}");
        accepted += usize::from(want);
    }
    accepted
}

fn pets() -> Value {
    json!({
        "Cat": {"title": "Cat", "type": "object", "properties": {
            "kind": {"const": "cat"}, "lives": {"type": "integer"}},
            "required": ["kind", "lives"], "additionalProperties": false},
        "Dog": {"title": "Dog", "type": "object", "properties": {
            "kind": {"const": "dog"}, "bark": {"type": "string"}, "good": {"type": "boolean"}},
            "required": ["kind", "bark"], "additionalProperties": false},
    })
}

fn check(schema: &Value, good: &[&str], bad: &[&str]) {
    let g = Arc::new(Grammar::from_schema(schema).unwrap());
    for text in good.iter().chain(bad) {
        assert_eq!(whole(&g, text), reference(schema, text), "{text}");
    }
    for text in good {
        assert!(whole(&g, text), "{text}");
    }
    for text in bad {
        assert!(!whole(&g, text), "{text}");
    }
    let accepted = agree_on_random_texts(schema, 3000);
    assert!(
        (300..2700).contains(&accepted),
        "{accepted} of 3000 accepted"
    );
}

#[test]
fn a_union_of_two_referenced_models() {
    let schema = json!({"$defs": pets(), "type": "object", "properties": {
        "pet": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"type": "null"}]},
        "owner": {"type": "string"}}, "required": ["pet"], "additionalProperties": false});
    check(
        &schema,
        &[
            r#"{"pet":{"kind":"cat","lives":9}}"#,
            r#"{"pet":{"lives":9,"kind":"cat"},"owner":"a"}"#,
            r#"{"pet":{"bark":"woof","kind":"dog","good":true}}"#,
            r#"{"pet": null}"#,
            "{\n  \"pet\": {\n    \"kind\": \"dog\",\n    \"bark\": \"\"\n  }\n}",
        ],
        &[
            r#"{"pet":{"kind":"cat","bark":"woof"}}"#,
            r#"{"pet":{"kind":"dog","lives":9}}"#,
            r#"{"pet":{"kind":"cat"}}"#,
            r#"{"pet":{"lives":9}}"#,
            r#"{"pet":{"kind":"cow","lives":9}}"#,
            r#"{"pet":{"kind":"dog","bark":"x","lives":1}}"#,
            r#"{"pet":{}}"#,
            r#"{"pet":[]}"#,
        ],
    );
}

#[test]
fn overlapping_keys_of_different_kinds_and_open_objects() {
    let schema = json!({"anyOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
         "required": ["a"], "additionalProperties": false},
        {"type": "object", "properties": {"a": {"type": "string"}, "c": {"type": "boolean"}},
         "required": ["a", "c"], "additionalProperties": false},
        {"type": "object", "properties": {"v": {"type": "null"}}, "required": ["v"]},
        {"type": "string"},
    ]});
    check(
        &schema,
        &[
            r#"{"a":1}"#,
            r#"{"b":"x","a":1}"#,
            r#"{"a":"s","c":false}"#,
            r#"{"c":true,"a":""}"#,
            r#"{"v":null,"a":[1]}"#,
            r#""s""#,
        ],
        &[
            r#"{"a":"s"}"#,
            r#"{"a":1,"c":true}"#,
            r#"{"a":"s","b":"x","c":true}"#,
            r#"{"c":true}"#,
            r#"{}"#,
            r#"{"v":1}"#,
            "1",
        ],
    );
    let g = Arc::new(Grammar::from_schema(&schema).unwrap());
    assert!(!whole(&g, r#"{"a":1,"a":1}"#), "each member at most once");
}

#[test]
fn unions_nested_in_unions() {
    let inner = json!({"anyOf": [
        {"type": "object", "properties": {"p": {"type": "integer"}}, "required": ["p"],
         "additionalProperties": false},
        {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
         "additionalProperties": false},
        {"type": "array", "items": {"type": "integer"}}]});
    let schema = json!({"anyOf": [
        {"type": "object", "properties": {"v": inner, "w": {"type": "integer"}},
         "required": ["v", "w"], "additionalProperties": false},
        {"type": "object", "properties": {"v": {"type": "object", "properties": {
            "p": {"type": "string"}}, "additionalProperties": false}},
         "required": ["v"], "additionalProperties": false},
        {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
    ]});
    check(
        &schema,
        &[
            r#"{"v":{"p":1},"w":2}"#,
            r#"{"w":2,"v":{"q":"x"}}"#,
            r#"{"v":[1,2],"w":0}"#,
            r#"{"v":{"p":"s"}}"#,
            r#"{"v":{}}"#,
            r#"["a"]"#,
            "null",
        ],
        &[
            r#"{"v":{"p":1}}"#,
            r#"{"v":{"p":"s"},"w":2}"#,
            r#"{"v":{},"w":2}"#,
            r#"{"v":{"q":1},"w":2}"#,
            r#"{"v":["a"],"w":1}"#,
            "[1]",
        ],
    );
}

#[test]
fn arrays_of_a_union_and_a_union_of_arrays() {
    let pets_list = json!({"$defs": pets(), "type": "array", "maxItems": 4,
        "items": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}});
    check(
        &pets_list,
        &[
            "[]",
            r#"[{"kind":"cat","lives":1},{"kind":"dog","bark":""},{"lives":2,"kind":"cat"}]"#,
        ],
        &[
            r#"[{"kind":"cat","bark":""}]"#,
            r#"[{"kind":"cat","lives":1},{}]"#,
            r#"[{"kind":"cat","lives":1},{"kind":"cat","lives":1},{"kind":"cat","lives":1},{"kind":"cat","lives":1},{"kind":"cat","lives":1}]"#,
        ],
    );
    let arrays = json!({"anyOf": [
        {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
        {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}, "minItems": 2},
    ]});
    check(
        &arrays,
        &["[]", "[1,2,3]", r#"["a"]"#, "[[true],[]]", "[[],[]]"],
        &[
            "[1,2,3,4]",
            r#"[1,"a"]"#,
            "[[true]]",
            "[[1],[]]",
            r#"["a",1]"#,
        ],
    );
}

#[test]
fn a_refused_byte_and_rollback_leave_every_alternative_as_it_was() {
    let schema = json!({"$defs": pets(), "type": "array",
        "items": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}});
    let g = Arc::new(Grammar::from_schema(&schema).unwrap());
    let mut m = Matcher::new(g);
    assert!(m.advance(br#"[{"kind":"#));
    m.commit();
    let mark = m.checkpoint();
    assert!(m.advance(br#""cat","lives":1}"#));
    assert!(!m.advance(b"x"));
    m.rollback(mark);
    assert!(!m.advance(br#""cow""#));
    assert!(m.advance(br#""dog","bark":"b"}]"#));
    assert!(m.is_done());
}

#[test]
fn adversarial_unions_are_refused_quickly() {
    let start = Instant::now();
    // A union in each member of a union, 2 ways at each of `n` levels: 2^n states.
    let nested = |n: usize| {
        let mut defs = Map::new();
        for i in 0..n {
            let next = json!({"$ref": format!("#/$defs/l{}", i + 1)});
            defs.insert(
                format!("l{i}"),
                json!({"anyOf": [
                {"type": "object", "properties": {"x": next}, "additionalProperties": false},
                {"type": "object", "properties": {"x": next, "y": {}}, "required": ["y"]}]}),
            );
        }
        defs.insert(format!("l{n}"), json!({"type": "integer"}));
        json!({"$defs": defs, "$ref": "#/$defs/l0"})
    };
    assert!(Grammar::from_schema(&nested(4)).is_ok());
    for n in [5, 25] {
        let msg = Grammar::from_schema(&nested(n)).unwrap_err().to_string();
        assert!(msg.contains("more than 16"), "{msg}");
    }
    assert!(Grammar::from_schema(&nested(1000)).is_err());
    let many: Vec<Value> = (0..5000)
        .map(|i| json!({"type": "array", "maxItems": i}))
        .collect();
    let msg = Grammar::from_schema(&json!({"anyOf": many}))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("more than 16 alternatives"), "{msg}");
    let same: Vec<Value> = (0..1000).map(|_| json!({"type": "object"})).collect();
    assert!(Grammar::from_schema(&json!({"anyOf": same})).is_ok());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}
