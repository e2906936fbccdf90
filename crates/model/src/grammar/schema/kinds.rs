//! Places that hold values of several kinds: `enum` and `const` values, and the alternatives
//! of `anyOf`, merged into one rule whose kinds a value's first byte tells apart.

use serde_json::{Map, Value};

use super::{MAX_LITERAL_BYTES, MAX_LITERALS, SchemaError, err, invalid, kinds};
use crate::grammar::rules::{Numeric, Rule};

pub(super) fn literals(obj: &Map<String, Value>, at: &str) -> Result<Rule, SchemaError> {
    let values: Vec<&Value> = match (obj.get("enum"), obj.get("const")) {
        (Some(_), Some(_)) => return err(at, "'enum' beside 'const' is not supported"),
        (Some(Value::Array(v)), None) => v.iter().collect(),
        (Some(_), None) => return invalid(&format!("{at}/enum"), "'enum' must be a list"),
        (None, Some(c)) => vec![c],
        (None, None) => Vec::new(),
    };
    let kinds = kinds(obj.get("type"), at)?;
    let of_type = |v: &Value| {
        kinds.iter().any(|&k| match k {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "number" => v.is_number(),
            "integer" => v.is_i64() || v.is_u64(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => false,
        })
    };
    let mut rule = Rule::default();
    for v in values.into_iter().filter(|v| of_type(v)) {
        if v.is_null() {
            rule.null = true;
        } else {
            let text = v.to_string();
            if text.len() > MAX_LITERAL_BYTES {
                return err(
                    at,
                    format!("a value of 'enum' or 'const' is at most {MAX_LITERAL_BYTES} bytes"),
                );
            }
            rule.literals.push(text.into_bytes());
        }
    }
    if rule.literals.is_empty() && !rule.null {
        return err(
            at,
            "'enum' or 'const' allows no value (of the given 'type')",
        );
    }
    normalize(rule, at)
}

/// The values either rule allows, where a value's first byte still says which part of the
/// merged rule it belongs to. The rules' objects, and their arrays, do not differ.
pub(super) fn merge(a: Rule, b: Rule, at: &str) -> Result<Rule, SchemaError> {
    let object = a.object.or(b.object);
    let array = a.array.or(b.array);
    let mut literals = a.literals;
    literals.extend(b.literals);
    normalize(
        Rule {
            object,
            array,
            string: a.string.or(b.string),
            number: match (a.number, b.number) {
                (Some(Numeric::Number), _) | (_, Some(Numeric::Number)) => Some(Numeric::Number),
                (x, y) => x.or(y),
            },
            boolean: a.boolean || b.boolean,
            null: a.null || b.null,
            literals,
            either: Vec::new(),
            pattern: None,
            cfg: None,
        },
        at,
    )
}

/// Drops the literals the rule's kinds allow anyway; a literal that shares its first byte with
/// a kind it is not of would make the rule ambiguous.
fn normalize(mut rule: Rule, at: &str) -> Result<Rule, SchemaError> {
    let mut kept = Vec::new();
    for lit in std::mem::take(&mut rule.literals) {
        let integer = !lit.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
        let covered = match lit[0] {
            b'"' if rule.string.as_ref().is_some_and(|s| !s.is_any()) => {
                return err(
                    at,
                    "a string value beside a string schema with a pattern, format or length is \
                     not supported",
                );
            }
            b'"' => rule.string.is_some(),
            b'-' | b'0'..=b'9' => match rule.number {
                Some(Numeric::Number) => true,
                Some(Numeric::Integer) if integer => true,
                Some(Numeric::Integer) => {
                    return err(at, "a fractional value beside 'integer' is not supported");
                }
                None => false,
            },
            b't' | b'f' => rule.boolean,
            b'{' if rule.object.is_some() => {
                return err(
                    at,
                    "an object value beside an object schema is not supported",
                );
            }
            b'[' if rule.array.is_some() => {
                return err(at, "an array value beside an array schema is not supported");
            }
            _ => false,
        };
        if !covered {
            kept.push(lit);
        }
    }
    kept.sort();
    kept.dedup();
    if kept.len() > MAX_LITERALS {
        return err(
            at,
            format!(
                "at most {MAX_LITERALS} values may be allowed one by one (enum, const) in one place"
            ),
        );
    }
    rule.literals = kept;
    Ok(rule)
}
