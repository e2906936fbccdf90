//! `tool_choice`: "auto" lets the model choose, "none" offers no tools, a named function forces
//! one call, held to the bare JSON object `{"name": ..., "arguments": {...}}` that the reply
//! parser reads as a call, and "required" forces a list of one call or more (one call where
//! `parallel_tool_calls` is false).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vortex_model::grammar::Grammar;

use crate::error::ApiError;
use crate::protocol::brief;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

pub fn parse(choice: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let named = |v: &Value| {
        let o = v.as_object()?;
        let f = o.get("function")?.as_object()?;
        let only =
            o.keys().all(|k| k == "type" || k == "function") && f.keys().all(|k| k == "name");
        (only && o.get("type")? == "function")
            .then(|| f.get("name")?.as_str().map(str::to_string))
            .flatten()
    };
    match choice {
        None => Ok(ToolChoice::Auto),
        Some(Value::String(s)) if s == "auto" => Ok(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => Ok(ToolChoice::None),
        Some(Value::String(s)) if s == "required" => Ok(ToolChoice::Required),
        Some(v) => named(v).map(ToolChoice::Named).ok_or_else(|| {
            ApiError::bad_param(
                "tool_choice",
                format!(
                    "'tool_choice' must be \"auto\", \"none\", \"required\" or {{\"type\": \
                     \"function\", \"function\": {{\"name\": ...}}}}, got {}",
                    brief(&v.to_string())
                ),
            )
        }),
    }
}

/// The grammar of what `choice` forces among `tools` (definitions already checked), and
/// whether it is a list of calls; `None` where it forces nothing.
pub fn call_grammar(
    choice: &ToolChoice,
    tools: &[Value],
    parallel: bool,
) -> Result<Option<(Grammar, bool)>, ApiError> {
    let bad = |m: String| ApiError::bad_param("tool_choice", m);
    let names: Vec<&str> = tools
        .iter()
        .filter_map(|t| t.pointer("/function/name")?.as_str())
        .collect();
    let allowed = match choice {
        ToolChoice::Auto | ToolChoice::None => return Ok(None),
        ToolChoice::Required if names.is_empty() => {
            return Err(bad(
                "'tool_choice' \"required\" needs at least one tool in 'tools'".into(),
            ));
        }
        ToolChoice::Required => names,
        ToolChoice::Named(n) if names.contains(&n.as_str()) => vec![n.as_str()],
        ToolChoice::Named(n) => {
            return Err(bad(format!(
                "'tool_choice' names '{}', which is not among 'tools'",
                brief(n)
            )));
        }
    };
    let name = |names: &[&str]| {
        Grammar::from_schema(&json!({ "enum": names }))
            .map_err(|e| bad(format!("the tools' names: {e}")))
    };
    let call = |tool: &str| -> Result<Grammar, ApiError> {
        Ok(Grammar::object_of(vec![
            ("name", name(&[tool])?),
            ("arguments", parameters(tools, tool)?),
        ]))
    };
    let any_call = |names: &[&str]| -> Result<Grammar, ApiError> {
        Ok(Grammar::object_of(vec![
            ("name", name(names)?),
            ("arguments", Grammar::any_object()),
        ]))
    };
    let one = match allowed.as_slice() {
        [tool] => call(tool)?,
        // Each tool's call with its own arguments, followed together until the name tells them
        // apart; where too many to follow, or too much to compile for one request, any
        // arguments beside any of the names.
        several if several.len() > MAX_UNION || schema_bytes(tools) > MAX_UNION_SCHEMA_BYTES => {
            any_call(several)?
        }
        several => {
            let start = Instant::now();
            let mut calls = Vec::new();
            for t in several {
                if start.elapsed() > MAX_UNION_COMPILE {
                    break;
                }
                calls.push(call(t)?);
            }
            match calls.len() == several.len() {
                true => Grammar::union(calls).map_or_else(|| any_call(several), Ok)?,
                false => any_call(several)?,
            }
        }
    };
    Ok(Some(match choice {
        ToolChoice::Required if parallel => (Grammar::array_of(one, 1), true),
        _ => (one, false),
    }))
}

/// Tools whose calls may be followed together (the grammar's bound on a union).
const MAX_UNION: usize = 16;
/// Bytes of the tools' `parameters` compiled for one forced choice among several: each
/// schema's own limits bound one compilation, this bounds their sum.
const MAX_UNION_SCHEMA_BYTES: usize = 64 << 10;
/// Time their compilation may take before the rest is given up (each schema's own limits
/// bound the one compiling then).
const MAX_UNION_COMPILE: Duration = Duration::from_secs(1);

fn schema_bytes(tools: &[Value]) -> usize {
    tools
        .iter()
        .filter_map(|t| t.pointer("/function/parameters"))
        .map(|p| p.to_string().len())
        .sum()
}

/// A tool's arguments: as its `parameters` schema says where decoding can enforce that schema;
/// else (no schema, keywords decoding cannot enforce, or a schema of no objects) any object,
/// and the tool checks its own arguments. A schema that no draft of JSON Schema allows is a
/// 400 (`SchemaError::invalid`).
fn parameters(tools: &[Value], name: &str) -> Result<Grammar, ApiError> {
    let named = |t: &Value| t.pointer("/function/name").and_then(Value::as_str) == Some(name);
    let Some(i) = tools.iter().position(named) else {
        return Ok(Grammar::any_object());
    };
    let Some(schema) = tools[i].pointer("/function/parameters") else {
        return Ok(Grammar::any_object());
    };
    match Grammar::from_schema(schema) {
        Ok(g) => Ok(g.objects_only().unwrap_or_else(Grammar::any_object)),
        Err(e) if e.invalid => Err(ApiError::bad_param(
            "tools",
            format!("tools[{i}].function.parameters: {e}"),
        )),
        Err(_) => Ok(Grammar::any_object()),
    }
}
