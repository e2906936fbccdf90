//! An object's and an array's keywords.

use serde_json::{Map, Value};

use super::{Compiler, MAX_LITERAL_BYTES, SchemaError, count, err, invalid};
use crate::grammar::rules::{
    ArrayRule, MAX_PROPERTIES, MAX_UNIQUE_LITERALS, Numeric, ObjectRule, Property, Rule, RuleId,
    StringRule, UniqueItems,
};

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
                return invalid(
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
                        return invalid(&here, "'required' must list property names");
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
            Some(_) => return invalid(&format!("{at}/required"), "'required' must be a list"),
        }
        let mut additional = match obj.get("additionalProperties") {
            None | Some(Value::Bool(true)) => Some(self.any(at)?),
            Some(Value::Bool(false)) => None,
            Some(s) => Some(self.compile(s, &format!("{at}/additionalProperties"))?),
        };
        if let Some(names) = obj.get("propertyNames") {
            let here = format!("{at}/propertyNames");
            if let Some(names) = self.property_names(names, &here)? {
                required = only_named(&mut properties, required, &names, additional, &here)?;
                additional = None;
            }
        }
        let min_members = count(obj, "minProperties", 0, at)?;
        let max_members = obj
            .contains_key("maxProperties")
            .then(|| count(obj, "maxProperties", u32::MAX, at))
            .transpose()?;
        let most = max_members.unwrap_or(u32::MAX);
        let declared = properties.len() as u32;
        if min_members > most {
            return err(
                at,
                format!("'minProperties' ({min_members}) is more than 'maxProperties' ({most})"),
            );
        }
        if required.count_ones() > most {
            return err(
                at,
                format!(
                    "{} required properties are more than 'maxProperties' ({most})",
                    required.count_ones()
                ),
            );
        }
        if additional.is_none() && min_members > declared {
            return err(
                at,
                format!(
                    "'minProperties' ({min_members}) is more than the {declared} properties the \
                     object may have"
                ),
            );
        }
        Ok(ObjectRule {
            min_members,
            max_members,
            properties,
            required,
            additional,
        })
    }

    /// The names `propertyNames` lists (`enum` or `const`, as Pydantic writes a dict keyed
    /// by a `Literal` or an `Enum`), or `None` where it allows any name.
    fn property_names(
        &mut self,
        names: &Value,
        at: &str,
    ) -> Result<Option<Vec<Vec<u8>>>, SchemaError> {
        match names {
            Value::Bool(true) => return Ok(None),
            Value::Bool(false) => return Ok(Some(Vec::new())),
            _ => {}
        }
        let id = self.compile(names, at)?;
        // A reference to a schema still being built (the object itself, say) lists no names.
        let Some(rule) = self.rules[id as usize].as_ref() else {
            return err(
                at,
                "'propertyNames' is supported only as a list of names ('enum' or 'const')",
            );
        };
        let any_string = Rule {
            string: Some(StringRule::ANY),
            ..Rule::default()
        };
        if *rule == any_string {
            return Ok(None);
        }
        if rule.literals.is_empty()
            || *rule
                != (Rule {
                    literals: rule.literals.clone(),
                    ..Rule::default()
                })
        {
            return err(
                at,
                "'propertyNames' is supported only as a list of names ('enum' or 'const')",
            );
        }
        let mut keys = Vec::new();
        for literal in &rule.literals {
            // Values other than strings name no property.
            if let Ok(Value::String(name)) = serde_json::from_slice(literal) {
                keys.push(compact_key(&name, at)?);
            }
        }
        Ok(Some(keys))
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
                return invalid(&here, format!("'{key}' must be a list of schemas"));
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
        let unique = if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
            let kind = self.unique_items(&prefix, items, at)?;
            if kind == UniqueItems::Literals {
                // Distinct items: at most one of each literal.
                max = max.min(self.unique_literals(items, at)? as u32);
            }
            Some(kind)
        } else {
            None
        };
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
            unique,
        })
    }

    /// How the items of an array with `uniqueItems` true are kept unique: values listed one by
    /// one, or strings and integers with no other keyword.
    fn unique_items(
        &self,
        prefix: &[RuleId],
        items: RuleId,
        at: &str,
    ) -> Result<UniqueItems, SchemaError> {
        let rule = self.rules[items as usize].as_ref();
        let only_literals = rule.is_some_and(|r| {
            !r.literals.is_empty()
                && Rule {
                    literals: Vec::new(),
                    ..r.clone()
                } == Rule::default()
        });
        let free = rule.is_some_and(|r| {
            let string = r.string.as_ref().is_some_and(StringRule::is_any);
            let integer = r.number == Some(Numeric::Integer);
            (string || integer)
                && r.string.as_ref().is_none_or(StringRule::is_any)
                && Rule {
                    string: None,
                    number: None,
                    ..r.clone()
                } == Rule::default()
        });
        match (prefix.is_empty(), only_literals, free) {
            (true, true, _) => Ok(UniqueItems::Literals),
            (true, _, true) => Ok(UniqueItems::Free),
            _ => err(
                &format!("{at}/uniqueItems"),
                "'uniqueItems' true is supported only for 'items' of values listed one by one \
                 ('enum' or 'const', no null), or of strings or integers with no other keyword, \
                 without 'prefixItems'",
            ),
        }
    }

    /// How many distinct items an array of unique literals may hold.
    fn unique_literals(&self, items: RuleId, at: &str) -> Result<usize, SchemaError> {
        let here = format!("{at}/uniqueItems");
        let literals = &self.rules[items as usize]
            .as_ref()
            .expect("checked")
            .literals;
        if literals.len() > MAX_UNIQUE_LITERALS {
            return err(
                &here,
                format!("'uniqueItems' true over more than {MAX_UNIQUE_LITERALS} values"),
            );
        }
        let values: Vec<Value> = literals
            .iter()
            .map(|l| serde_json::from_slice(l).expect("literals are JSON"))
            .collect();
        for (i, a) in values.iter().enumerate() {
            if values[..i].iter().any(|b| same_value(a, b)) {
                return err(
                    &here,
                    format!("'uniqueItems' true over values equal in JSON ({a} twice)"),
                );
            }
        }
        Ok(literals.len())
    }
}

/// Whether two JSON values are equal as JSON Schema compares them: numbers by value (1 and 1.0
/// are one), objects whatever their members' order. Numbers compare as doubles, so two integers
/// beyond 2^53 that differ may be taken for one (refused, never wrongly allowed twice).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

/// `properties` (sorted, `required` a bit each) held to `names`: a declared property not
/// named is dropped, and each name not declared becomes a property of the `additional` schema
/// (none where additional properties are refused). Returns the new `required`.
fn only_named(
    properties: &mut Vec<Property>,
    required: u64,
    names: &[Vec<u8>],
    additional: Option<RuleId>,
    at: &str,
) -> Result<u64, SchemaError> {
    let mut kept = Vec::new();
    let mut now_required = 0u64;
    for (i, p) in std::mem::take(properties).into_iter().enumerate() {
        let named = names.contains(&p.key);
        if !named && required & (1 << i) != 0 {
            return err(
                at,
                format!(
                    "the required property '{}' is not among the names 'propertyNames' allows",
                    String::from_utf8_lossy(&p.key)
                ),
            );
        }
        if named {
            if required & (1 << i) != 0 {
                now_required |= 1 << kept.len();
            }
            kept.push(p);
        }
    }
    if let Some(value) = additional {
        for key in names {
            if !kept.iter().any(|p| &p.key == key) {
                kept.push(Property {
                    key: key.clone(),
                    value,
                });
            }
        }
    }
    if kept.len() > MAX_PROPERTIES {
        return err(
            at,
            format!(
                "at most {MAX_PROPERTIES} properties are supported, and 'propertyNames' names {}",
                kept.len()
            ),
        );
    }
    // Sorted again, the required bits following their properties.
    let mut order: Vec<usize> = (0..kept.len()).collect();
    order.sort_by(|&a, &b| kept[a].key.cmp(&kept[b].key));
    let mut sorted_required = 0u64;
    for (new, &old) in order.iter().enumerate() {
        if now_required & (1 << old) != 0 {
            sorted_required |= 1 << new;
        }
    }
    let mut slots: Vec<Option<Property>> = kept.into_iter().map(Some).collect();
    *properties = order
        .iter()
        .map(|&i| slots[i].take().expect("once"))
        .collect();
    Ok(sorted_required)
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
