//! What a reply is held to while it is sampled: free text, one JSON object (`json_object`),
//! JSON that a schema describes (`json_schema`), through `response_format` or vLLM's fields,
//! one of a few texts (vLLM's `choice`), text a regular expression matches (`regex`) or text a
//! GBNF grammar derives (vLLM's `grammar`, llama.cpp's `grammar`).

use serde_json::Value;
use vortex_model::grammar::Grammar;

use crate::error::ApiError;
use crate::protocol::{Common, brief};

/// The grammar a request asks for through `response_format`, vLLM's `structured_outputs`,
/// `guided_json`, `guided_choice`, `guided_regex` or `guided_grammar`, or llama.cpp's
/// `grammar` (one of them at most); `None` for free text.
pub fn requested(common: &Common) -> Result<Option<Grammar>, ApiError> {
    let asks = [
        ("response_format", grammar(common.response_format.as_ref())?),
        (
            "structured_outputs",
            structured_outputs(common.structured_outputs.as_ref())?,
        ),
        ("guided_json", guided_json(common.guided_json.as_ref())?),
        (
            "guided_choice",
            common
                .guided_choice
                .as_ref()
                .map(|c| choice("guided_choice", c))
                .transpose()?,
        ),
        (
            "guided_regex",
            common
                .guided_regex
                .as_ref()
                .map(|r| regex("guided_regex", r))
                .transpose()?,
        ),
        (
            "guided_grammar",
            common
                .guided_grammar
                .as_ref()
                .map(|g| gbnf("guided_grammar", g))
                .transpose()?,
        ),
        (
            "grammar",
            common
                .grammar
                .as_ref()
                .map(|g| gbnf("grammar", g))
                .transpose()?,
        ),
    ];
    let mut asked = asks.into_iter().filter_map(|(field, g)| Some((field, g?)));
    let first = asked.next();
    if let (Some((a, _)), Some((b, _))) = (&first, asked.next()) {
        return Err(ApiError::bad_param(
            b,
            format!("'{a}' and '{b}' both say what the reply is held to: ask in one of them"),
        ));
    }
    Ok(first.map(|(_, g)| g))
}

/// vLLM's `structured_outputs`: `{"json": schema}`, `{"json_object": true}`, `{"choice":
/// [texts]}`, `{"regex": expression}` or `{"grammar": gbnf}`; structural tags are refused.
fn structured_outputs(spec: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let bad = |m: String| ApiError::bad_param("structured_outputs", m);
    let Some(spec) = spec else {
        return Ok(None);
    };
    let Some(fields) = spec.as_object() else {
        return Err(bad("'structured_outputs' must be an object".into()));
    };
    let mut grammar = None;
    for (k, v) in fields {
        let asked = match (k.as_str(), v) {
            (_, Value::Null) | ("json_object", Value::Bool(false)) => None,
            ("json", schema) => Some(schema_of("structured_outputs.json", schema)?),
            ("json_object", Value::Bool(true)) => Some(Grammar::any_object()),
            ("json_object", _) => {
                return Err(bad(
                    "'structured_outputs.json_object' must be a boolean".into()
                ));
            }
            ("choice", choices) => Some(choice("structured_outputs.choice", choices)?),
            ("regex", expression) => Some(regex("structured_outputs.regex", expression)?),
            ("grammar", text) => Some(gbnf("structured_outputs.grammar", text)?),
            ("structural_tag", _) => {
                return Err(bad(
                    "'structured_outputs.structural_tag' is not supported: this server holds \
                     replies to JSON, a choice, a regular expression or a GBNF grammar ('json', \
                     'json_object', 'choice', 'regex', 'grammar')"
                        .into(),
                ));
            }
            (other, _) => {
                return Err(bad(format!(
                    "unknown field 'structured_outputs.{}'",
                    brief(other)
                )));
            }
        };
        if asked.is_some() && grammar.replace(asked).is_some() {
            return Err(bad(
                "'structured_outputs' may ask for one of 'json', 'json_object', 'choice', \
                 'regex' and 'grammar'"
                    .into(),
            ));
        }
    }
    Ok(grammar.flatten())
}

/// A list of texts the reply must be one of, for the field `at`.
fn choice(at: &str, spec: &Value) -> Result<Grammar, ApiError> {
    let bad = |m: String| bad_at(at, m);
    let texts = spec
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| bad(format!("'{at}' must be a list of strings")))?;
    Grammar::choice(&texts).map_err(|e| bad(format!("'{at}': {e}")))
}

/// A regular expression the reply must match whole, for the field `at`.
fn regex(at: &str, spec: &Value) -> Result<Grammar, ApiError> {
    text_grammar(at, spec, Grammar::regex)
}

/// A GBNF grammar whose rule `root` the reply must be, for the field `at`.
fn gbnf(at: &str, spec: &Value) -> Result<Grammar, ApiError> {
    text_grammar(at, spec, Grammar::gbnf)
}

/// The grammar `compile` makes of the text in field `at`.
fn text_grammar<E: std::fmt::Display>(
    at: &str,
    spec: &Value,
    compile: impl Fn(&str) -> Result<Grammar, E>,
) -> Result<Grammar, ApiError> {
    let bad = |m: String| bad_at(at, m);
    let text = spec
        .as_str()
        .ok_or_else(|| bad(format!("'{at}' must be a string")))?;
    compile(text).map_err(|e| bad(format!("'{at}': {e}")))
}

/// vLLM's older `guided_json`: a schema, or its text.
fn guided_json(spec: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    spec.map(|s| schema_of("guided_json", s)).transpose()
}

/// A schema given as JSON or as its text, for the field `at`.
fn schema_of(at: &str, spec: &Value) -> Result<Grammar, ApiError> {
    let bad = |m: String| bad_at(at, m);
    let parsed;
    let schema = match spec {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text)
                .map_err(|e| bad(format!("'{at}' is not a JSON schema's text: {e}")))?;
            &parsed
        }
        other => other,
    };
    if !schema.is_object() && !schema.is_boolean() {
        return Err(bad(format!("'{at}' must be a JSON schema")));
    }
    Grammar::from_schema(schema).map_err(|e| bad(format!("'{at}' cannot be enforced: {e}")))
}

/// The grammar a request's `response_format` asks for; `None` for free text.
fn grammar(format: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let bad = |m: String| ApiError::bad_param("response_format", m);
    let Some(format) = format else {
        return Ok(None);
    };
    let Some(fields) = format.as_object() else {
        return Err(bad("'response_format' must be an object".into()));
    };
    let allowed: &[&str] = match fields.get("type").and_then(Value::as_str) {
        Some("text") => &["type"],
        Some("json_object") => &["type"],
        Some("json_schema") => &["type", "json_schema"],
        _ => {
            return Err(bad(format!(
                "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got {}",
                brief(&format.to_string())
            )));
        }
    };
    if let Some(k) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(format!("unknown field 'response_format.{}'", brief(k))));
    }
    match fields.get("type").and_then(Value::as_str) {
        Some("json_object") => Ok(Some(Grammar::any_object())),
        Some("json_schema") => json_schema(fields.get("json_schema")).map(Some),
        _ => Ok(None),
    }
}

/// OpenAI's `{"name", "description"?, "schema", "strict"?}`.
fn json_schema(spec: Option<&Value>) -> Result<Grammar, ApiError> {
    let bad = |m: String| ApiError::bad_param("response_format", m);
    let Some(spec) = spec.and_then(Value::as_object) else {
        return Err(bad(
            "'response_format.json_schema' must be an object holding 'schema'".into(),
        ));
    };
    for (k, v) in spec {
        let ok = match k.as_str() {
            "name" | "description" => v.is_string(),
            "strict" => v.is_boolean() || v.is_null(),
            "schema" => v.is_object() || v.is_boolean(),
            other => {
                return Err(bad(format!(
                    "unknown field 'response_format.json_schema.{}'",
                    brief(other)
                )));
            }
        };
        if !ok {
            return Err(bad(format!(
                "'response_format.json_schema.{k}' has the wrong type ({})",
                brief(&v.to_string())
            )));
        }
    }
    let Some(schema) = spec.get("schema") else {
        return Err(bad("'response_format.json_schema.schema' is missing".into()));
    };
    Grammar::from_schema(schema).map_err(|e| {
        bad(format!(
            "'response_format.json_schema.schema' cannot be enforced: {e}"
        ))
    })
}

/// A 400 for the request field that `at` (a field, or a path into one) lies in.
fn bad_at(at: &str, message: String) -> ApiError {
    ApiError::bad_param(at.split('.').next().unwrap_or(at), message)
}
