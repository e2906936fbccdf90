//! An object's and an array's keywords.

use serde_json::{Map, Value};

use super::{Compiler, MAX_LITERAL_BYTES, SchemaError, count, err};
use crate::grammar::rules::{ArrayRule, MAX_PROPERTIES, ObjectRule, Property};

/// Places one tuple may declare.
const MAX_PLACES: usize = 256;

impl Compiler<'_> {
    pub(super) fn object(
        &mut self,
        obj: &Map<String, Value>,
        at: &str,
    ) -> Result<ObjectRule, SchemaError> {
        let mut properties = Vec::new();
        match obj.get("properties") {
            None => {}
            Some(Value::Object(props)) => {
                if props.len() > MAX_PROPERTIES {
                    return err(
                        &format!("{at}/properties"),
                        format!(
                            "at most {MAX_PROPERTIES} properties are supported, got {}",
                            props.len()
                        ),
                    );
                }
                for (name, schema) in props {
                    let here = format!("{at}/properties/{name}");
                    let key = compact_key(name, &here)?;
                    let value = self.compile(schema, &here)?;
                    properties.push(Property { key, value });
                }
            }
            Some(_) => {
                return err(
                    &format!("{at}/properties"),
                    "'properties' must be an object",
                );
            }
        }
        properties.sort_by(|a, b| a.key.cmp(&b.key));
        let mut required = 0u64;
        match obj.get("required") {
            None => {}
            Some(Value::Array(names)) => {
                for name in names {
                    let here = format!("{at}/required");
                    let Some(name) = name.as_str() else {
                        return err(&here, "'required' must list property names");
                    };
                    let key = compact_key(name, &here)?;
                    match properties.iter().position(|p| p.key == key) {
                        Some(i) => required |= 1 << i,
                        None => {
                            return err(
                                &here,
                                format!("the required property '{name}' is not in 'properties'"),
                            );
                        }
                    }
                }
            }
            Some(_) => return err(&format!("{at}/required"), "'required' must be a list"),
        }
        let additional = match obj.get("additionalProperties") {
            None | Some(Value::Bool(true)) => Some(self.any(at)?),
            Some(Value::Bool(false)) => None,
            Some(s) => Some(self.compile(s, &format!("{at}/additionalProperties"))?),
        };
        Ok(ObjectRule {
            properties,
            required,
            additional,
        })
    }

    pub(super) fn array(
        &mut self,
        obj: &Map<String, Value>,
        at: &str,
    ) -> Result<ArrayRule, SchemaError> {
        // A tuple's places: `prefixItems`, or a list of `items` as drafts before 2020-12 wrote
        // it; then the rest, as `items` (or, after a list, `additionalItems`) says.
        let (places, rest) = match (obj.get("prefixItems"), obj.get("items")) {
            (Some(_), Some(Value::Array(_))) => {
                return err(
                    at,
                    "'prefixItems' beside a list of 'items' is not supported",
                );
            }
            (Some(list), _) => (Some((list, "prefixItems")), "items"),
            (None, Some(list @ Value::Array(_))) => (Some((list, "items")), "additionalItems"),
            (None, _) => (None, "items"),
        };
        let mut prefix = Vec::new();
        if let Some((list, key)) = places {
            let here = format!("{at}/{key}");
            let Some(list) = list.as_array() else {
                return err(&here, format!("'{key}' must be a list of schemas"));
            };
            if list.len() > MAX_PLACES {
                return err(&here, format!("at most {MAX_PLACES} places"));
            }
            for (i, s) in list.iter().enumerate() {
                prefix.push(self.compile(s, &format!("{here}/{i}"))?);
            }
        }
        let (items, closed) = match obj.get(rest) {
            None | Some(Value::Bool(true)) => (self.any(at)?, false),
            Some(Value::Bool(false)) => (self.any(at)?, true),
            Some(s) => (self.compile(s, &format!("{at}/{rest}"))?, false),
        };
        let (min, mut max) = (
            count(obj, "minItems", 0, at)?,
            count(obj, "maxItems", u32::MAX, at)?,
        );
        if closed {
            max = max.min(prefix.len() as u32);
        }
        if min > max {
            return err(
                at,
                format!("'minItems' ({min}) is more than the array may hold ({max})"),
            );
        }
        Ok(ArrayRule {
            prefix,
            items,
            min,
            max,
        })
    }
}

/// A property name as JSON writes it between quotes, in the one spelling keys are matched in.
fn compact_key(name: &str, at: &str) -> Result<Vec<u8>, SchemaError> {
    let text = Value::from(name).to_string();
    if text.len() > MAX_LITERAL_BYTES {
        return err(
            at,
            format!("a property name is at most {MAX_LITERAL_BYTES} bytes"),
        );
    }
    if text.contains("\\u") {
        return err(
            at,
            "property names with control characters are not supported",
        );
    }
    Ok(text.as_bytes()[1..text.len() - 1].to_vec())
}
