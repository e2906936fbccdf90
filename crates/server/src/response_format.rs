//! `response_format`: free text, one JSON object (`json_object`), or JSON that a schema
//! describes (`json_schema`), held to it while it is sampled.

use serde_json::Value;
use vortex_model::grammar::Grammar;

use crate::error::ApiError;
use crate::protocol::brief;

/// The grammar a request's `response_format` asks for; `None` for free text.
pub fn grammar(format: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
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
