//! Numbers held to `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum`, alone and
//! inside objects, arrays and unions; random integers and random replies against the bounds.

use std::sync::Arc;

use serde_json::{Value, json};
use vortex_model::grammar::Grammar;

mod grammar_support;
use grammar_support::*;

#[test]
fn bounds_hold_integers_in_json_spelling() {
    check(
        json!({"type": "integer", "minimum": 0, "maximum": 100}),
        &["0", "100", "57"],
        &["-1", "101", "007", "1.0", "1e2", "-0", ""],
    );
    check(
        json!({"type": "integer", "exclusiveMinimum": 0.5, "exclusiveMaximum": 3}),
        &["1", "2"],
        &["0", "3"],
    );
    check(
        json!({"type": "integer", "minimum": -2.5, "maximum": 1.5}),
        &["-2", "1", "0"],
        &["-3", "2"],
    );
    check(
        json!({"type": "integer", "exclusiveMinimum": -10}),
        &["-9", "0", "123456789012"],
        &["-10", "-11"],
    );
}

#[test]
fn bounds_hold_numbers_written_without_an_exponent() {
    check(
        json!({"type": "number", "minimum": 0, "maximum": 1}),
        &["0", "1", "0.5", "1.000", "0.0001"],
        &["-0.1", "1.01", "1e0", "-0", "00.5", ".5"],
    );
    check(
        json!({"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 0}),
        &["-2.4999", "-1", "-0.001"],
        &["-2.5", "0", "-0", "-0.0", "0.1"],
    );
    check(
        json!({"type": ["number", "null"], "minimum": 0.1}),
        &["null", "0.1", "0.10", "7", "1234.5"],
        &["0.09999", "0", "-3"],
    );
}

#[test]
fn bounded_integers_sit_in_objects_arrays_and_unions() {
    check(
        json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
               "required": ["n"]}),
        &[r#"{"n": 5}"#, r#"{"n":5 }"#, r#"{ "n" : 12 , "x": 1}"#],
        &[r#"{"n": 0}"#, r#"{"n": 5.5}"#, r#"{"n": "5"}"#],
    );
    check(
        json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}}),
        &["[-5, 0, 5]", "[]", "[3,4]"],
        &["[6]", "[-6]", "[55]"],
    );
    check(
        json!({"type": ["integer", "null"], "minimum": 0}),
        &["null", "3"],
        &["-1", "true"],
    );
    check(
        json!({"anyOf": [{"const": -1}, {"type": "integer", "minimum": 10}]}),
        &["-1", "10", "99"],
        &["5", "-10"],
    );
    check(
        json!({"type": ["string", "integer", "boolean"], "maximum": 9}),
        &[r#""x""#, "9", "true", "-4"],
        &["10"],
    );
}

#[test]
fn bounds_it_cannot_hold_are_refused_with_the_place() {
    for (schema, at, says) in [
        (
            json!({"type": "number", "minimum": 1, "exclusiveMaximum": 1}),
            "#",
            "no number is within",
        ),
        (
            json!({"type": "number", "minimum": 9007199254740993u64}),
            "#/minimum",
            "past 2^53",
        ),
        (
            json!({"type": "number", "maximum": 1e-13}),
            "#/maximum",
            "nearer 0 than 1e-12",
        ),
        (
            json!({"type": "integer", "minimum": 3, "maximum": 2}),
            "#",
            "no integer is within",
        ),
        (
            json!({"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3}),
            "#",
            "no integer is within",
        ),
        (
            json!({"type": "integer", "minimum": "a"}),
            "#/minimum",
            "must be a number",
        ),
        (
            json!({"type": "integer", "maximum": 1e19}),
            "#/maximum",
            "past 1e18",
        ),
    ] {
        let e = Grammar::from_schema(&schema).expect_err("refused");
        assert_eq!(e.at, at, "{schema}: {e}");
        assert!(e.message.contains(says), "{schema}: {e}");
    }
}

const BOUNDS: [(Option<i64>, Option<i64>); 6] = [
    (Some(0), None),
    (None, Some(-3)),
    (Some(-150), Some(7)),
    (Some(99), Some(1001)),
    (Some(-20000), Some(-19999)),
    (Some(5), Some(5)),
];

fn schema(lo: Option<i64>, hi: Option<i64>) -> Value {
    let mut s = json!({"type": "integer"});
    if let Some(l) = lo {
        s["minimum"] = json!(l);
    }
    if let Some(h) = hi {
        s["maximum"] = json!(h);
    }
    s
}

#[test]
fn random_integers_are_taken_exactly_when_within_the_bounds() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for (lo, hi) in BOUNDS {
        let s = schema(lo, hi);
        for _ in 0..2000 {
            let x = rng.below(60_000) as i64 - 30_000;
            let within = lo.is_none_or(|l| x >= l) && hi.is_none_or(|h| x <= h);
            assert_eq!(accepts(&s, &x.to_string()), within, "{s}: {x}");
        }
    }
}

#[test]
fn random_replies_walked_through_the_matcher_keep_to_the_bounds() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (lo, hi) in BOUNDS {
        let s = json!({"type": "array", "items": schema(lo, hi), "maxItems": 3});
        let g = Arc::new(Grammar::from_schema(&s).unwrap());
        for _ in 0..200 {
            let text = random_reply(&g, &mut rng, 0, 12);
            let v: Vec<i64> = serde_json::from_slice(&text).unwrap();
            for x in v {
                assert!(
                    lo.is_none_or(|l| x >= l) && hi.is_none_or(|h| x <= h),
                    "{s}: {x}"
                );
            }
        }
    }
}

#[test]
fn random_replies_of_bounded_numbers_keep_to_the_bounds() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let bounds = [
        json!({"minimum": 0, "maximum": 1}),
        json!({"exclusiveMinimum": -0.75, "exclusiveMaximum": 0.125}),
        json!({"minimum": 2.5}),
        json!({"exclusiveMaximum": -10.01}),
        json!({"minimum": 99.99, "maximum": 100}),
    ];
    for b in bounds {
        let mut items = b.clone();
        items["type"] = json!("number");
        let s = json!({"type": "array", "items": items, "maxItems": 3});
        let g = Arc::new(Grammar::from_schema(&s).unwrap());
        let get = |k: &str| b.get(k).and_then(Value::as_f64);
        for _ in 0..200 {
            let text = random_reply(&g, &mut rng, 0, 8);
            let v: Vec<f64> = serde_json::from_slice(&text).unwrap();
            for x in v {
                let ok = get("minimum").is_none_or(|l| x >= l)
                    && get("maximum").is_none_or(|h| x <= h)
                    && get("exclusiveMinimum").is_none_or(|l| x > l)
                    && get("exclusiveMaximum").is_none_or(|h| x < h);
                assert!(ok, "{s}: {x} in {}", String::from_utf8_lossy(&text));
            }
        }
    }
}

#[test]
fn random_replies_of_bounded_decimals_keep_to_their_places() {
    let mut rng = Rng(0x0fed_cba9_8765_4321);
    let schemas = [
        (json!({"minimum": 0, "maximum": 10, "multipleOf": 0.01}), 2),
        (json!({"exclusiveMinimum": -0.75, "multipleOf": 0.1}), 1),
        (
            json!({"minimum": 99.991, "exclusiveMaximum": 100, "multipleOf": 0.001}),
            3,
        ),
    ];
    for (b, places) in schemas {
        let mut items = b.clone();
        items["type"] = json!("number");
        let s = json!({"type": "array", "items": items, "maxItems": 3});
        let g = Arc::new(Grammar::from_schema(&s).unwrap());
        let get = |k: &str| b.get(k).and_then(Value::as_f64);
        for _ in 0..200 {
            let text = random_reply(&g, &mut rng, 0, 8);
            let reply = String::from_utf8(text).unwrap();
            let inner = reply.trim().trim_start_matches('[').trim_end_matches(']');
            for t in inner.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                let x: f64 = t.parse().unwrap();
                let decimals = t.split_once('.').map_or(0, |(_, f)| f.len());
                let ok = decimals <= places
                    && get("minimum").is_none_or(|l| x >= l)
                    && get("maximum").is_none_or(|h| x <= h)
                    && get("exclusiveMinimum").is_none_or(|l| x > l)
                    && get("exclusiveMaximum").is_none_or(|h| x < h);
                assert!(ok, "{s}: {t} in {reply}");
            }
        }
    }
}
