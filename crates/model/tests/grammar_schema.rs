//! JSON Schema keywords: what each allows, and the schemas that are refused with a reason.

use std::sync::Arc;

use serde_json::{Value, json};
use vortex_model::grammar::{Grammar, Matcher};

mod grammar_support;
use grammar_support::*;

#[test]
fn objects_take_their_properties_in_any_order_each_once() {
    let s = json!({"type": "object", "properties": {
        "a": {"type": "integer"}, "ab": {"type": "string"}, "b": {"type": "boolean"}},
        "required": ["a", "ab"], "additionalProperties": false});
    check(
        s,
        &[
            r#"{"a":1,"ab":"x"}"#,
            r#"{ "ab" : "x" , "b" : true , "a" : -2 }"#,
        ],
        &[
            r#"{"a":1}"#,
            r#"{"a":1,"ab":"x","c":1}"#,
            r#"{"a":1,"a":2,"ab":"x"}"#,
            r#"{"a":"1","ab":"x"}"#,
            r#"{"a":1,"ab":"x",}"#,
            r#"{"\u0061":1,"ab":"x"}"#,
        ],
    );
}

#[test]
fn additional_properties_default_to_any_and_may_have_a_schema() {
    let open = json!({"type": "object", "properties": {"a": {"type": "null"}}});
    check(
        open,
        &[r#"{"a":null,"x":[1,{}]}"#, r#"{"ax":1}"#, "{}"],
        &[r#"{"a":1}"#, r#"{"a":null,"a":null}"#],
    );
    let typed = json!({"type": "object", "additionalProperties": {"type": "number"}});
    check(typed, &[r#"{"x":1.5,"y":2}"#, "{}"], &[r#"{"x":"1"}"#]);
    let closed = json!({"type": "object", "additionalProperties": false});
    check(closed, &["{}", "{ }"], &[r#"{"x":1}"#]);
}

/// Names the object does not declare are compared with those written before it, as JSON reads
/// them (where no name is declared, in any spelling; else written without `\u` escapes).
#[test]
fn an_object_takes_each_name_once() {
    let open = json!({"type": "object", "properties": {"a": {"type": "null"}}});
    check(
        open,
        &[
            r#"{"x":1,"xy":2,"y":{"x":3,"y":[{"x":4}]},"a":null}"#,
            r#"{"x":1,"X":2,"x ":3}"#,
        ],
        &[
            r#"{"x":1,"x":2}"#,
            r#"{"x":1,"a":null,"y":2,"x":3}"#,
            r#"{"y":{"x":1,"x":2}}"#,
            r#"{"\u0078":1}"#,
        ],
    );
    let typed = json!({"type": "object", "additionalProperties": {"type": "integer"}});
    check(
        typed,
        &[
            r#"{"x":1,"\u0079":2,"\\":3,"\/":4}"#,
            r#"{"a":1,"\u0041":2,"\u00e9":3,"\u00c9":4}"#,
        ],
        &[
            r#"{"x":1,"\u0078":2}"#,
            r#"{"\n":1,"\u000a":2}"#,
            r#"{"/":1,"\/":2}"#,
            r#"{"é":1,"\u00e9":2}"#,
        ],
    );
    // Members counted toward minProperties are members a parser reads.
    let counted = json!({"type": "object", "minProperties": 2,
                         "additionalProperties": {"type": "integer"}});
    check(counted, &[r#"{"x":1,"y":2}"#], &[r#"{"x":1,"x":2}"#]);
    // A name taken may go on but not close.
    let g = Arc::new(Grammar::from_schema(&json!({"type": "object"})).unwrap());
    let mut m = Matcher::new(g);
    assert!(m.advance(br#"{"ab":1,"ab"#));
    assert!(!m.accepts(b"\"") && m.accepts(b"c\"") && m.accepts(b"\\u0063\""));
}

/// `propertyNames` listing names, as Pydantic writes `dict[Literal[...], T]` and dicts keyed
/// by an `Enum`: the names it lists, each once, of the additional properties' schema.
#[test]
fn property_names_listed_hold_an_objects_names() {
    let literal_keys = json!({"type": "object", "additionalProperties": {"type": "integer"},
        "propertyNames": {"enum": ["a", "b"]}});
    check(
        literal_keys,
        &["{}", r#"{"a":1}"#, r#"{"b":2,"a":1}"#],
        &[
            r#"{"c":1}"#,
            r#"{"a":"1"}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"ab":1}"#,
        ],
    );
    let enum_keys = json!({"type": "object", "additionalProperties": {"type": "number"},
        "propertyNames": {"$ref": "#/$defs/Color"},
        "$defs": {"Color": {"title": "Color", "type": "string", "enum": ["red", "green"]}}});
    check(
        enum_keys,
        &[r#"{"green":1.5,"red":0}"#],
        &[r#"{"blue":1}"#, r#"{"red":null}"#],
    );
    // Declared properties keep their schemas; one not named is dropped; a name not declared
    // takes the additional properties' schema.
    let declared = json!({"type": "object",
        "properties": {"a": {"type": "string"}, "z": {"type": "integer"}}, "required": ["a"],
        "additionalProperties": {"type": "boolean"}, "propertyNames": {"const": "a"}});
    check(
        declared,
        &[r#"{"a":"x"}"#],
        &["{}", r#"{"a":"x","z":1}"#, r#"{"a":true}"#],
    );
    let both = json!({"type": "object", "properties": {"b": {"type": "null"}},
        "required": ["b"], "propertyNames": {"enum": ["a", "b", 3]}});
    check(
        both,
        &[r#"{"b":null}"#, r#"{"a":[1],"b":null}"#],
        &[r#"{"a":1}"#, r#"{"b":1}"#, r#"{"3":1,"b":null}"#],
    );
    let closed = json!({"type": "object", "additionalProperties": false,
        "properties": {"a": {"type": "null"}, "b": {"type": "null"}},
        "propertyNames": {"enum": ["b", "c"]}});
    check(
        closed,
        &["{}", r#"{"b":null}"#],
        &[r#"{"a":null}"#, r#"{"c":null}"#],
    );
    let any = json!({"type": "object", "propertyNames": {"type": "string"}});
    check(any, &[r#"{"x":1,"y":"2"}"#], &[r#"{"x":1,"x":2}"#]);
    let none = json!({"type": "object", "propertyNames": false});
    check(none, &["{}"], &[r#"{"x":1}"#]);
}

#[test]
fn property_names_other_than_a_list_are_refused() {
    let msg = refusal(json!({"type": "object", "propertyNames": {"pattern": "^x"}}));
    assert!(
        msg.starts_with("#/propertyNames") && msg.contains("list of names"),
        "{msg}"
    );
    let msg = refusal(
        json!({"type": "object", "properties": {"a": {}}, "required": ["a"],
        "propertyNames": {"enum": ["b"]}}),
    );
    assert!(msg.contains("required property 'a'"), "{msg}");
    let names: Vec<String> = (0..65).map(|i| format!("n{i}")).collect();
    let msg = refusal(json!({"type": "object", "propertyNames": {"enum": names}}));
    assert!(msg.contains("at most 64 properties"), "{msg}");
    // A reference to the object being built (its rule not made yet) is refused, not a panic.
    let msg = refusal(json!({"type": "object", "propertyNames": {"$ref": "#"}}));
    assert!(msg.starts_with("#/propertyNames"), "{msg}");
    let msg = refusal(
        json!({"$ref": "#/$defs/O", "$defs": {"O": {"type": "object",
        "propertyNames": {"$ref": "#/$defs/O"}}}}),
    );
    assert!(msg.contains("propertyNames"), "{msg}");
}

/// Every prefix of up to 10 tokens, over a few, of an object that declares a name and takes
/// others: never a dead end, and each complete one writes no name twice.
#[test]
fn prefixes_of_objects_never_dead_end_nor_repeat_a_name() {
    let tokens: [&[u8]; 10] = [
        b"{", b"}", b":", b",", b"1", b"\"a\"", b"\"b\"", b"\"b", b"b\"", b"\"",
    ];
    for schema in [
        json!({"type": "object", "properties": {"a": {"type": "integer"}},
               "additionalProperties": {"type": "integer"}}),
        json!({"type": "object", "additionalProperties": {"anyOf": [{"type": "integer"},
               {"type": "object"}]}}),
    ] {
        let g = Arc::new(Grammar::from_schema(&schema).unwrap());
        let (walked, complete) = walk_prefixes(&g, &tokens, 10, |text| {
            assert!(no_name_twice(text), "{}", String::from_utf8_lossy(text));
        });
        // Reached: {"b":1,"bb":1} and {"b":{"b":1}}, not {"b":1,"b":1}.
        assert!(
            walked > 2_000 && complete > 30,
            "{schema}: {walked} {complete}"
        );
    }
}

#[test]
fn tuples_take_each_place_then_the_rest() {
    let pair = json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2, "maxItems": 2});
    check(
        pair,
        &[r#"[1, "a"]"#, r#"[ -3 ,"" ]"#],
        &[r#"[1]"#, r#"["a", 1]"#, r#"[1, "a", 2]"#, "[]"],
    );
    let rest =
        json!({"type": "array", "prefixItems": [{"const": "x"}], "items": {"type": "boolean"}});
    check(
        rest,
        &[r#"["x"]"#, r#"["x", true, false]"#, "[]"],
        &[r#"["x", 1]"#, r#"[true]"#],
    );
    let closed = json!({"type": "array", "prefixItems": [{"type": "null"}], "items": false});
    check(closed, &["[null]", "[]"], &["[null, null]"]);
    // Drafts before 2020-12: a list of `items`, then `additionalItems`.
    let old = json!({"type": "array", "items": [{"type": "integer"}], "additionalItems": {"type": "string"}});
    check(
        old,
        &[r#"[1, "a", "b"]"#, "[2]"],
        &[r#"[1, 2]"#, r#"["a"]"#],
    );
}

#[test]
fn arrays_take_items_and_bounds() {
    let s = json!({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2});
    check(
        s,
        &[r#"["a"]"#, r#"[ "a" , "b" ]"#],
        &["[]", r#"["a","b","c"]"#, "[1]"],
    );
    check(
        json!({"type": "array"}),
        &["[]", r#"[1,"a",[null]]"#],
        &["{}"],
    );
}

#[test]
fn enums_and_consts_take_their_values_written_compactly() {
    let s = json!({"enum": ["red", "re", 1, 12, 1.5, true, null, {"k": [1]}]});
    check(
        s,
        &[
            r#""red""#,
            r#""re""#,
            "1",
            "12",
            "1.5",
            "true",
            "null",
            r#"{"k":[1]}"#,
        ],
        &[r#""r""#, "2", "123", "false", r#"{"k": [1]}"#, r#""red ""#],
    );
    check(json!({"const": "x"}), &[r#""x""#], &[r#""y""#]);
    check(
        json!({"type": "string", "enum": ["a", 1]}),
        &[r#""a""#],
        &["1"],
    );
}

#[test]
fn types_and_alternatives_combine_by_kind() {
    check(
        json!({"type": ["string", "null"]}),
        &[r#""a""#, "null"],
        &["1", "true"],
    );
    check(
        json!({"anyOf": [{"type": "integer"}, {"type": "number"}]}),
        &["1", "1.5"],
        &["\"1\""],
    );
    check(
        json!({"oneOf": [{"type": "object", "properties": {"a": {"const": 1}}, "additionalProperties": false},
                         {"type": "array", "items": {"type": "boolean"}}, {"enum": ["x", 2]}]}),
        &[r#"{"a":1}"#, "[true]", r#""x""#, "2"],
        &[r#"{"a":2}"#, "[1]", r#""y""#, "3"],
    );
    check(json!({}), &["1", "{}", "[]", "\"a\"", "null"], &[""]);
    check(json!(true), &["false"], &["nul"]);
}

#[test]
fn references_may_recur() {
    let tree = json!({
        "$ref": "#/$defs/node",
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"], "additionalProperties": false}}});
    check(
        tree,
        &[r#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]}"#],
        &[r#"{"v":1,"kids":[{}]}"#],
    );
    // A model that holds an `Optional` of itself (Pydantic's `next: Optional["Node"]`).
    let list = json!({
        "$ref": "#/$defs/node",
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer"},
            "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}], "default": null}},
            "required": ["v"], "additionalProperties": false}}});
    check(
        list.clone(),
        &[
            r#"{"v":1}"#,
            r#"{"v":1,"next":null}"#,
            r#"{"v":1,"next":{"v":2,"next":{"v":3,"next":null}}}"#,
        ],
        &[
            r#"{"v":1,"next":{}}"#,
            r#"{"v":1,"next":1}"#,
            r#"{"v":1,"next":{"v":2,"next":"x"}}"#,
        ],
    );
    let g = Arc::new(Grammar::from_schema(&list).unwrap());
    let pieces: [&[u8]; 8] = [
        b"{",
        b"}",
        b"\"v\":1",
        b"\"next\":",
        b",",
        b"null",
        b"1",
        b"{}",
    ];
    let (walked, complete) = walk_prefixes(&g, &pieces, 9, |text| {
        serde_json::from_slice::<Value>(text).unwrap();
    });
    assert!(walked > 100 && complete > 5, "{walked} {complete}");
    // One within an `Optional` union of two models, each holding the other.
    let pair = json!({
        "$ref": "#/$defs/a",
        "$defs": {
            "a": {"type": "object", "properties": {"b": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "null"}]}}},
            "b": {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]},
                                                    "n": {"type": "integer"}}}}});
    check(
        pair,
        &[r#"{"b":{"a":{"b":null},"n":1}}"#, r#"{"b":null}"#],
        &[r#"{"b":{"a":{"b":1}}}"#],
    );
    // The same inside a union nested in another.
    let nested = json!({"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {
        "next": {"anyOf": [{"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]},
                           {"type": "string"}]}}}}});
    check(
        nested,
        &[r#"{"next":{"next":"x"}}"#, r#"{"next":null}"#],
        &[r#"{"next":1}"#],
    );
    // A union that names itself alone holds no value.
    let bare = json!({"$ref": "#/$defs/u", "$defs": {"u": {"anyOf": [{"$ref": "#/$defs/u"}, {"type": "null"}]}}});
    assert!(refusal(bare).contains("itself"));
    let old = json!({"type": "object", "properties": {"x": {"$ref": "#/definitions/x"}},
        "definitions": {"x": {"type": "string", "title": "X", "description": "d", "default": "a", "examples": ["b"]}},
        "$schema": "https://json-schema.org/draft/2020-12/schema"});
    check(old, &[r#"{"x":"s"}"#], &[r#"{"x":1}"#]);
}

fn refusal(schema: Value) -> String {
    Grammar::from_schema(&schema)
        .expect_err("an unsupported schema")
        .to_string()
}

#[test]
fn keywords_it_cannot_enforce_are_refused_by_name() {
    for kw in ["patternProperties", "contains", "uniqueItems", "not", "if"] {
        let msg =
            refusal(json!({"type": "object", "properties": {"a": {"type": "string", kw: 1}}}));
        assert!(
            msg.contains(&format!("'{kw}'")) && msg.starts_with("#/properties/a"),
            "{msg}"
        );
    }
}

#[test]
fn malformed_or_ambiguous_schemas_are_refused() {
    for (schema, says) in [
        (json!(5), "must be an object"),
        (json!(false), "allows no value"),
        (json!({"type": 5}), "'type'"),
        (json!({"type": "text"}), "unknown type 'text'"),
        (json!({"properties": []}), "'properties' must be an object"),
        (
            json!({"properties": {"a": {}}, "required": "a"}),
            "'required' must be a list",
        ),
        (
            json!({"properties": {"a": {}}, "required": ["b"]}),
            "'b' is not in 'properties'",
        ),
        (json!({"$ref": "http://x/s.json"}), "within the schema"),
        (json!({"$ref": "#/$defs/none"}), "points at nothing"),
        (
            json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
            "refers to itself",
        ),
        (
            json!({"$ref": "#/$defs/a", "type": "string"}),
            "'$ref' beside 'type'",
        ),
        (
            json!({"type": "array", "minItems": 3, "maxItems": 2}),
            "more than the array may hold (2)",
        ),
        (
            json!({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2}),
            "more than the array may hold (1)",
        ),
        (
            json!({"type": "array", "prefixItems": [{}], "items": [{}]}),
            "'prefixItems' beside a list of 'items'",
        ),
        (
            json!({"type": "array", "prefixItems": {}}),
            "must be a list of schemas",
        ),
        (json!({"type": "array", "minItems": -1}), "non-negative"),
        (json!({"enum": []}), "allows no value"),
        (json!({"enum": 1}), "must be a list"),
        (json!({"anyOf": []}), "non-empty list"),
        (
            json!({"anyOf": (0..17).map(|i| json!({"type": "object", "required": [i.to_string()],
                "properties": {i.to_string(): {}}})).collect::<Vec<_>>()}),
            "more than 16 alternatives of objects, arrays or held strings",
        ),
        (
            json!({"$ref": "#/$defs/t", "$defs": {"t": {"anyOf": [
                {"type": "object", "properties": {"a": {"$ref": "#/$defs/t"}, "x": {}}},
                {"type": "object", "properties": {"a": {"$ref": "#/$defs/t"}, "y": {}}}]}}}),
            "more than 16 alternatives of unions at once",
        ),
        (
            json!({"anyOf": [{"type": "integer"}, {"const": 1.5}]}),
            "beside 'integer'",
        ),
        (json!({"type": "string", "anyOf": [{}]}), "beside 'type'"),
        (
            json!({"anyOf": [{"enum": (0..3000).collect::<Vec<_>>()}, {"enum": (3000..6000).collect::<Vec<_>>()}]}),
            "at most 4096",
        ),
    ] {
        let msg = refusal(schema.clone());
        assert!(msg.contains(says), "{schema}: {msg}");
    }
}

#[test]
fn annotations_and_keywords_that_ask_nothing_here_are_taken() {
    // pydantic's discriminated union, and fields marked read-only or deprecated.
    let pet = |kind: &str| {
        json!({"type": "object", "properties": {"kind": {"const": kind}, "name": {"type": "string",
            "readOnly": true, "deprecated": true}}, "required": ["kind"]})
    };
    check(
        json!({"oneOf": [pet("cat"), pet("dog")], "discriminator": {"propertyName": "kind"}}),
        &[r#"{"kind":"cat"}"#, r#"{"name":"x","kind":"dog"}"#],
        &[r#"{"kind":"cow"}"#],
    );
    check(
        json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": false}),
        &["[1,1]", "[]"],
        &["[1.5]"],
    );
    // multipleOf applies to numbers only.
    check(
        json!({"type": "string", "multipleOf": 3}),
        &[r#""a""#],
        &["3"],
    );
    let msg = refusal(json!({"type": "array", "uniqueItems": true}));
    assert!(
        msg.starts_with("#/uniqueItems") && msg.contains("'uniqueItems' true"),
        "{msg}"
    );
    assert!(refusal(json!({"type": "array", "uniqueItems": 1})).contains("boolean"));
}

#[test]
fn unique_items_hold_values_listed_one_by_one() {
    let unique = |items: Value| json!({"type": "array", "items": items, "uniqueItems": true});
    check(
        unique(json!({"enum": ["a", "ab", "b"]})),
        &["[]", r#"["a"]"#, r#"["a","ab"]"#, r#"["ab", "a", "b"]"#],
        &[
            r#"["a","a"]"#,
            r#"["ab","b","ab"]"#,
            r#"["a","ab","b","a"]"#,
        ],
    );
    // Numbers end where what follows says: 1 taken leaves 12.
    check(
        unique(json!({"enum": [1, 12, 2]})),
        &["[1,12]", "[12,1,2]", "[ 2 , 1 ]"],
        &["[1,1]", "[12,12]", "[1,2,1]", "[1,12,2,1]"],
    );
    // Pydantic's set of an enum: the values through a reference.
    check(
        json!({"$defs": {"Color": {"enum": ["red", "green"], "type": "string"}},
               "type": "array", "items": {"$ref": "#/$defs/Color"}, "uniqueItems": true}),
        &[r#"["green","red"]"#],
        &[r#"["red","red"]"#, r#"["blue"]"#],
    );
    // Values that differ in JSON, however alike; 64 of them; unique arrays inside an array; on
    // a string, uniqueItems asks nothing.
    check(
        unique(json!({"enum": [{"a": 1}, {"a": 1, "b": 2}, [1], [1, 1]]})),
        &[r#"[{"a":1},{"a":1,"b":2},[1],[1,1]]"#],
        &[r#"[[1],[1]]"#],
    );
    check(
        unique(json!({"enum": (0..64).collect::<Vec<_>>()})),
        &["[63,0,62]"],
        &["[63,0,63]"],
    );
    check(
        json!({"type": "array", "items": unique(json!({"enum": [1, 2]}))}),
        &["[[1,2],[2,1],[1]]"],
        &["[[1,2],[2,2]]"],
    );
    check(
        json!({"type": "string", "uniqueItems": true}),
        &[r#""a""#],
        &["[1,1]"],
    );
    // As many items as values at most.
    check(
        json!({"type": "array", "items": {"enum": [true, false]}, "uniqueItems": true,
               "minItems": 2}),
        &["[true,false]", "[false,true]"],
        &["[true]", "[true,true]", "[true,false,true]"],
    );
    for (schema, says) in [
        (
            unique(json!({"type": "number"})),
            "only for 'items' of values listed one by one",
        ),
        (
            unique(json!({"type": "string", "maxLength": 3})),
            "or of strings or integers with no other keyword",
        ),
        (
            unique(json!({"type": "integer", "minimum": 0})),
            "or of strings or integers with no other keyword",
        ),
        (
            unique(json!({"anyOf": [{"type": "string"}, {"const": 1.5}]})),
            "only for 'items' of values listed one by one",
        ),
        (
            unique(json!({"type": ["string", "boolean"]})),
            "only for 'items' of values listed one by one",
        ),
        (
            json!({"type": "array", "uniqueItems": true}),
            "only for 'items' of values listed one by one",
        ),
        (
            unique(json!({"enum": ["a", null]})),
            "only for 'items' of values listed one by one",
        ),
        (
            json!({"type": "array", "prefixItems": [{"const": 1}], "items": {"const": 2},
                   "uniqueItems": true}),
            "without 'prefixItems'",
        ),
        (unique(json!({"enum": [1, 1.0]})), "equal in JSON"),
        (unique(json!({"enum": [[1], [1.0]]})), "equal in JSON"),
        (
            unique(json!({"enum": (0..65).collect::<Vec<_>>()})),
            "more than 64 values",
        ),
        (
            unique(json!({"enum": [{"a": 1, "b": 2}, {"b": 2, "a": 1.0}]})),
            "equal in JSON",
        ),
        (
            json!({"type": "array", "items": {"enum": ["x", "y"]}, "uniqueItems": true,
                   "minItems": 3}),
            "'minItems' (3) is more than the array may hold (2)",
        ),
    ] {
        let msg = refusal(schema.clone());
        assert!(msg.contains(says), "{schema}: {msg}");
    }
}

#[test]
fn unique_items_hold_strings_and_integers() {
    let unique = |items: Value| json!({"type": "array", "items": items, "uniqueItems": true});
    // Pydantic's set[str]: a string equal to one taken may go on, not close.
    check(
        unique(json!({"type": "string"})),
        &[
            "[]",
            r#"["a","b"]"#,
            r#"["a","ab","b",""]"#,
            r#"["a\n","a"]"#,
            r#"["\"","\\"]"#,
            r#"["é","e"]"#,
        ],
        &[
            r#"["a","a"]"#,
            r#"["a","b","a"]"#,
            r#"["",""]"#,
            r#"["a\n","a\n"]"#,
            // Written without \u escapes, so that equal strings are spelled alike.
            r#"["\u0061"]"#,
            r#"["a\/"]"#,
        ],
    );
    // set[int]: an integer equal to one taken may go on, not end; 0 and -0 are one.
    check(
        unique(json!({"type": "integer"})),
        &[
            "[1,12,-1,0]",
            "[0]",
            "[-0]",
            "[10,1]",
            "[ 1 , 11 ]",
            "[-12,-1,12,1]",
        ],
        &[
            "[1,1]", "[0,-0]", "[-0,0]", "[12,12]", "[1.0]", "[1,2,1]", "[1 ,1]",
        ],
    );
    // Strings and integers together: "1" is no 1.
    check(
        unique(json!({"type": ["string", "integer"]})),
        &[r#"["1",1]"#, r#"[1,"1","-0",0]"#],
        &[r#"["1","1"]"#, r#"[1,"1",1]"#],
    );
    // Unique arrays in an array; a union where another array schema takes repeats.
    check(
        json!({"type": "array", "items": unique(json!({"type": "string"}))}),
        &[r#"[["a"],["a"]]"#, r#"[["a","b"],[],["b","a"]]"#],
        &[r#"[["a","a"]]"#, r#"[["a"],["b","b"]]"#],
    );
    check(
        json!({"anyOf": [unique(json!({"type": "string"})),
                         {"type": "array", "items": {"type": "string"}, "maxItems": 3}]}),
        &[r#"["a","a","a"]"#, r#"["a","b","c","d"]"#],
        &[r#"["a","a","b","c"]"#],
    );
    check(
        json!({"type": "object", "properties": {
            "tags": unique(json!({"type": "string"})), "ids": unique(json!({"type": "integer"}))}}),
        &[
            r#"{"tags":["x","y"],"ids":[1,2]}"#,
            r#"{"ids":[7],"tags":["7"]}"#,
        ],
        &[r#"{"tags":["x","x"]}"#, r#"{"ids":[3,3]}"#],
    );
}

#[test]
fn replies_drawn_under_unique_strings_and_integers_repeat_no_item() {
    let g = Arc::new(
        Grammar::from_schema(
            &json!({"type": "array", "items": {"type": ["string", "integer"]},
                                     "uniqueItems": true}),
        )
        .unwrap(),
    );
    let mut rng = Rng(0x510e_527f_ade6_82d1);
    for _ in 0..300 {
        let text = random_reply(&g, &mut rng, 10, 2);
        let items: Vec<Value> = serde_json::from_slice(&text).unwrap();
        for (i, a) in items.iter().enumerate() {
            assert!(
                !items[..i].contains(a),
                "{}",
                String::from_utf8_lossy(&text)
            );
        }
    }
}

/// Every prefix over a small alphabet that a set of strings and integers takes: never a dead
/// end, and each complete one holds no item twice.
#[test]
fn prefixes_under_unique_strings_and_integers_never_dead_end() {
    let schema = json!({"type": "array", "items": {"type": ["string", "integer"]},
                        "uniqueItems": true});
    let g = Arc::new(Grammar::from_schema(&schema).unwrap());
    let alphabet: Vec<[u8; 1]> = b"[]\",a0-".iter().map(|&b| [b]).collect();
    let pieces: Vec<&[u8]> = alphabet.iter().map(|b| &b[..]).collect();
    let (walked, complete) = walk_prefixes(&g, &pieces, 10, |text| {
        let items: Vec<Value> = serde_json::from_slice(text).unwrap();
        let same = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        };
        for (i, a) in items.iter().enumerate() {
            assert!(
                !items[..i].iter().any(|b| same(a, b)),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    });
    // Reached: ["a","a"] may not close, [0,0] and [0,-0] may not end.
    assert!(walked > 10_000 && complete > 500, "{walked} {complete}");
    for (text, ok) in [
        (&b"[\"a\",\"a"[..], true),
        (b"[0,", true),
        (b"[0,0", false),
        (b"[0,-0", false),
    ] {
        let mut m = Matcher::new(g.clone());
        assert_eq!(m.advance(text), ok, "{}", String::from_utf8_lossy(text));
    }
    let mut m = Matcher::new(g.clone());
    assert!(m.advance(b"[\"a\",\"a"));
    assert!(!m.accepts(b"\"") && m.accepts(b"a\""));
}

#[test]
fn objects_hold_their_count_of_members() {
    check(
        json!({"type": "object", "minProperties": 2}),
        &[r#"{"a":1,"b":2}"#, r#"{"a":1,"b":2,"c":[]}"#],
        &["{}", r#"{"a":1}"#],
    );
    check(
        json!({"type": "object", "maxProperties": 2}),
        &["{}", r#"{"a":1,"b":2}"#],
        &[r#"{"a":1,"b":2,"c":3}"#],
    );
    // A required member keeps its place within the most: after "a", only "c" may come.
    check(
        json!({"properties": {"a": {}, "b": {}, "c": {}}, "required": ["c"],
               "maxProperties": 2, "additionalProperties": false}),
        &[r#"{"c":1}"#, r#"{"a":1,"c":2}"#, r#"{"c":1,"b":2}"#],
        &[r#"{"a":1,"b":2}"#, r#"{"a":1,"b":2,"c":3}"#, "{}"],
    );
    // A required name that an optional one begins: once the required one just fits, the
    // optional one may not close.
    check(
        json!({"properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}},
               "required": ["ab"], "maxProperties": 1}),
        &[r#"{"ab":1}"#],
        &[r#"{"a":1,"ab":1}"#, r#"{"a":1}"#],
    );
    // Pydantic's dict with a least and a most length.
    check(
        json!({"type": "object", "additionalProperties": {"type": "integer"},
               "minProperties": 1, "maxProperties": 3}),
        &[r#"{"x":1}"#, r#"{"x":1,"y":2,"z":3}"#],
        &["{}", r#"{"x":1,"y":2,"z":3,"w":4}"#, r#"{"x":"a"}"#],
    );
    for (schema, says) in [
        (
            json!({"type": "object", "minProperties": 3, "maxProperties": 2}),
            "'minProperties' (3) is more than 'maxProperties' (2)",
        ),
        (
            json!({"properties": {"a": {}, "b": {}}, "required": ["a", "b"], "maxProperties": 1}),
            "2 required properties are more than 'maxProperties' (1)",
        ),
        (
            json!({"properties": {"a": {}}, "additionalProperties": false, "minProperties": 2}),
            "'minProperties' (2) is more than the 1 properties",
        ),
        (
            json!({"type": "object", "maxProperties": -1}),
            "non-negative",
        ),
    ] {
        let msg = refusal(schema.clone());
        assert!(msg.contains(says), "{schema}: {msg}");
    }
}

#[test]
fn replies_drawn_under_member_counts_keep_them_and_end() {
    let mut rng = Rng(0x6a09_e667_f3bc_c908);
    for (schema, least, most) in [
        (
            json!({"type": "object", "minProperties": 2, "maxProperties": 3,
                "additionalProperties": {"type": "boolean"}}),
            2,
            3,
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"},
                               "c": {"type": "null"}, "d": {"type": "null"}},
                "required": ["d"], "minProperties": 2, "maxProperties": 2,
                "additionalProperties": false}),
            2,
            2,
        ),
        (
            json!({"type": "object", "properties": {"ab": {"const": 1}, "ac": {"const": 2}},
                   "required": ["ac"],
                "maxProperties": 2, "additionalProperties": {"const": 0}}),
            1,
            2,
        ),
    ] {
        let g = Arc::new(Grammar::from_schema(&schema).unwrap());
        for _ in 0..300 {
            let text = String::from_utf8(random_reply(&g, &mut rng, 6, usize::MAX)).unwrap();
            let v: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
            assert!((least..=most).contains(&v.len()), "{schema}: {text}");
            if let Some(req) = schema["required"].as_array() {
                assert!(
                    req.iter().all(|r| v.contains_key(r.as_str().unwrap())),
                    "{text}"
                );
            }
        }
    }
}

#[test]
fn replies_drawn_under_unique_items_repeat_no_item_and_end() {
    let g = Arc::new(
        Grammar::from_schema(&json!({
            "type": "array",
            "items": {"enum": [1, 12, 123, 2, "a", "ab", [1], {"k": 1}]},
            "uniqueItems": true,
        }))
        .unwrap(),
    );
    let mut rng = Rng(0x2d35_8dcc_aa6c_78a5);
    let mut longest = 0;
    for _ in 0..500 {
        let text = String::from_utf8(random_reply(&g, &mut rng, 12, usize::MAX)).unwrap();
        let items: Vec<Value> = serde_json::from_str(&text).unwrap();
        for (i, a) in items.iter().enumerate() {
            assert!(!items[..i].contains(a), "{text}");
        }
        longest = longest.max(items.len());
    }
    // A reply can take every value, and then must end.
    assert_eq!(longest, 8);
}

#[test]
fn multiples_hold_integers_and_decimals() {
    check(
        json!({"type": "integer", "multipleOf": 5}),
        &["0", "5", "10", "-15", "1000005", "95"],
        &["3", "-0", "12", "5.0", "05", "-", "1e1"],
    );
    check(
        json!({"type": "integer", "multipleOf": 8}),
        &["0", "8", "96", "104", "1000", "-2008", "123456"],
        &["4", "100", "1004", "12"],
    );
    check(
        json!({"type": "integer", "multipleOf": 100}),
        &["0", "100", "-2300"],
        &["10", "50", "1010"],
    );
    // Every integer is a multiple of 1 and of 0.5.
    check(
        json!({"type": "integer", "multipleOf": 0.5}),
        &["3", "-7"],
        &["3.5"],
    );
    // Numbers held to a multiple of an integer are written as integers.
    check(
        json!({"type": "number", "multipleOf": 1}),
        &["0", "42", "-3"],
        &["1.0", "0.5"],
    );
    check(
        json!({"type": "number", "multipleOf": 0.01}),
        &["0", "19", "19.9", "19.99", "-0.05"],
        &["19.999", "1e2", "01.5", "1."],
    );
    // Beside bounds on both sides: the multiples of an integer within them, whatever it is.
    check(
        json!({"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5}),
        &["0", "5", "10", "95", "100"],
        &["3", "105", "-5", "010", "1", "10.0"],
    );
    check(
        json!({"type": ["integer", "null"], "exclusiveMinimum": -10, "maximum": 10, "multipleOf": 3}),
        &["-9", "0", "9", "null"],
        &["-10", "10", "4", "-0"],
    );
    check(
        json!({"type": "number", "minimum": 0.5, "maximum": 2000, "multipleOf": 7}),
        &["7", "1995"],
        &["0", "2002", "7.0"],
    );
    // 0.1, 0.01, ... beside bounds on either side or both: at most that many decimals within
    // them.
    check(
        json!({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 10}),
        &["0", "10", "9.99", "0.01", "5.5", "10.00", "0.10"],
        &["10.01", "-0.01", "1.234", "0.001", "-0", "0.100", "11"],
    );
    check(
        json!({"type": ["number", "null"], "multipleOf": 0.1, "exclusiveMinimum": 0.05}),
        &["0.1", "7", "123.4", "null"],
        &["0", "0.05", "0.12", "-1", "0.0"],
    );
    check(
        json!({"type": "number", "multipleOf": 0.001, "minimum": -1.2345, "maximum": -1.2}),
        &["-1.234", "-1.2", "-1.20", "-1.23", "-1.200"],
        &["-1.2345", "-1.235", "-1.199", "-1.2001", "-1.2000"],
    );
    // Other fractions beside bounds on both sides: their multiples within them, listed.
    check(
        json!({"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 5}),
        &["0", "0.5", "4.5", "5"],
        &["0.50", "5.5", "0.25", "-0.5", "1.0", "-0"],
    );
    check(
        json!({"type": ["number", "null"], "multipleOf": 0.3, "exclusiveMinimum": -1,
               "exclusiveMaximum": 0.9}),
        &["-0.9", "-0.3", "0", "0.6", "null"],
        &["0.9", "-1.2", "0.1", "0.8999999999999999"],
    );
    // A large integer multiple is not taken for one every integer meets.
    check(
        json!({"type": "integer", "multipleOf": 2000000000u64, "minimum": 0,
               "maximum": 10000000000u64}),
        &["0", "2000000000", "10000000000"],
        &["1", "7", "3000000000"],
    );
    check(
        json!({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 10}}}),
        &[r#"{"n":20}"#],
        &[r#"{"n":25}"#],
    );
    for (schema, says) in [
        (
            json!({"type": "integer", "multipleOf": 3}),
            "'multipleOf' 3 is not supported",
        ),
        (
            json!({"type": "number", "multipleOf": 0.25}),
            "'multipleOf' 0.25",
        ),
        (json!({"type": "integer", "multipleOf": 0}), "above 0"),
        (json!({"type": "integer", "multipleOf": "5"}), "above 0"),
        (
            json!({"type": "integer", "multipleOf": 5, "minimum": 0}),
            "both a lower and an upper bound",
        ),
        (
            json!({"type": "integer", "multipleOf": 1.5, "minimum": 0, "maximum": 10}),
            "supported on 'number' only",
        ),
        (
            json!({"type": "number", "multipleOf": 0.25, "minimum": 0}),
            "both a lower and an upper bound",
        ),
        // Near 0.1, or near 1/3, is not taken for it.
        (
            json!({"type": "number", "multipleOf": 0.10000000005, "minimum": 0, "maximum": 1}),
            "of at most 9 decimals",
        ),
        (
            json!({"type": "integer", "multipleOf": 0.3333333333}),
            "not supported without bounds",
        ),
        (
            json!({"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 1.0000000001}),
            "bounds of more than 9 decimals",
        ),
        (
            json!({"type": "number", "multipleOf": 1e300, "minimum": 0, "maximum": 10}),
            "supported below 1e18",
        ),
        (
            json!({"type": "number", "multipleOf": 0.01, "exclusiveMinimum": 0.001,
                   "exclusiveMaximum": 0.002}),
            "no number is within",
        ),
        (
            json!({"type": "integer", "multipleOf": 2, "minimum": 0, "maximum": 10000}),
            "more than 4096 multiples",
        ),
        (
            json!({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6}),
            "no multiple of 7",
        ),
    ] {
        let msg = refusal(schema.clone());
        assert!(msg.contains(says), "{schema}: {msg}");
    }
}
