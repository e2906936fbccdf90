//! JSON Schema to a [`Grammar`]: the subset that decoding can enforce. A keyword outside it is
//! an error that names it, never a constraint silently dropped.

mod containers;
mod kinds;
mod multiples;
mod numbers;
mod strings;

use std::collections::HashMap;

use serde_json::{Map, Value};

use kinds::{literals, merge};
use multiples::Multiples;
use strings::Patterns;

use super::rules::{Grammar, Numeric, Rule, RuleId};

/// Why a schema cannot be enforced: where in it, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// A JSON pointer into the schema (`#/properties/a`).
    pub at: String,
    pub message: String,
    /// The input breaks its format's own rules in every version of it (a JSON Schema keyword
    /// whose value is of the wrong kind, an unknown type, a `$ref` to nothing; a GBNF syntax
    /// error), rather than asking for what decoding cannot enforce or keeping to a limit.
    pub invalid: bool,
}

impl SchemaError {
    /// An error at `at` that is not [`invalid`](SchemaError::invalid).
    pub(crate) fn new(at: impl Into<String>, message: impl Into<String>) -> Self {
        SchemaError {
            at: at.into(),
            message: message.into(),
            invalid: false,
        }
    }
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.message)
    }
}

/// Keywords that describe and constrain nothing (`discriminator`, OpenAPI's, names the
/// property whose `const` already tells a union's members apart).
const ANNOTATIONS: [&str; 14] = [
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$comment",
    "$defs",
    "definitions",
    "readOnly",
    "writeOnly",
    "deprecated",
    "contentMediaType",
    "contentEncoding",
    "discriminator",
];
const KEYWORDS: [&str; 28] = [
    "multipleOf",
    "uniqueItems",
    "type",
    "prefixItems",
    "additionalItems",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "allOf",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "$ref",
];
/// Rules one grammar may hold (each `$ref` target and nested schema makes one).
const MAX_RULES: usize = 4096;
/// Values one `enum` may list, and bytes of one (literals are indexed by 16 bits).
pub(super) const MAX_LITERALS: usize = 4096;
pub(super) const MAX_LITERAL_BYTES: usize = 4096;
/// Schemas nested in one another (`$ref` counts): compiling recurses once for each.
const MAX_DEPTH: usize = 128;
/// Bytes of literals and property names the rules may hold, copies made for `$ref` and
/// `anyOf` counted: a reference is a copy, so without a bound a small schema could make
/// gigabytes of them.
const MAX_GRAMMAR_BYTES: usize = 32 << 20;
/// Parse states a matcher may hold at once, one for each alternative of a union (or of unions
/// nested in one another) that the bytes of a value so far fit.
pub(super) const MAX_STATES: u32 = 16;

impl Grammar {
    /// The grammar of the JSON values `schema` accepts, for the keywords this module knows.
    pub fn from_schema(schema: &Value) -> Result<Grammar, SchemaError> {
        let mut c = Compiler {
            root: schema,
            rules: Vec::new(),
            refs: HashMap::new(),
            any: None,
            depth: 0,
            bytes: 0,
            patterns: Patterns::default(),
        };
        let root = c.compile(schema, "#")?;
        let rules = c
            .rules
            .into_iter()
            .map(|r| r.expect("every rule is built before compile returns"))
            .collect();
        let g = Grammar { rules, root };
        // A union's alternatives are no unions: one that named a model it is inside must have
        // named an object, an array or a value of another kind.
        if g.rules
            .iter()
            .any(|r| r.either.iter().any(|&e| !g.rule(e).either.is_empty()))
        {
            return err("#", "a union refers to itself without a value between");
        }
        if g.most_states(MAX_STATES)[root as usize] > MAX_STATES {
            return err(
                "#",
                format!(
                    "a value could fit more than {MAX_STATES} alternatives of unions at once \
                     (a union nested in itself, or too many alternatives of objects, arrays or \
                     held strings)"
                ),
            );
        }
        Ok(g)
    }
}

struct Compiler<'a> {
    root: &'a Value,
    /// `None` while a rule is being built (a `$ref` may point at it meanwhile).
    rules: Vec<Option<Rule>>,
    refs: HashMap<String, RuleId>,
    any: Option<RuleId>,
    /// Calls of `compile` in progress.
    depth: usize,
    /// Bytes of the rules built or copied so far (see [`MAX_GRAMMAR_BYTES`]).
    bytes: usize,
    patterns: Patterns,
}

/// What decoding cannot enforce in a schema that may be valid.
fn err<T>(at: &str, message: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError::new(at, message))
}

/// A schema that breaks JSON Schema's own rules ([`SchemaError::invalid`]): only where no
/// draft allows it, as a tool's schema written for another draft must still be taken.
fn invalid<T>(at: &str, message: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError {
        invalid: true,
        ..SchemaError::new(at, message)
    })
}

/// A count keyword's value (`minItems`, `maxLength`, ...), `default` where it is absent.
fn count(obj: &Map<String, Value>, key: &str, default: u32, at: &str) -> Result<u32, SchemaError> {
    match obj.get(key) {
        None => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) => Ok(n.min(u32::MAX as u64) as u32),
            None => err(
                &format!("{at}/{key}"),
                format!("'{key}' must be a non-negative integer"),
            ),
        },
    }
}

impl Compiler<'_> {
    fn reserve(&mut self, at: &str) -> Result<RuleId, SchemaError> {
        if self.rules.len() >= MAX_RULES {
            return err(at, format!("the schema needs more than {MAX_RULES} rules"));
        }
        self.rules.push(None);
        Ok((self.rules.len() - 1) as RuleId)
    }

    fn any(&mut self, at: &str) -> Result<RuleId, SchemaError> {
        if let Some(id) = self.any {
            return Ok(id);
        }
        let id = self.reserve(at)?;
        self.rules[id as usize] = Some(Rule::any(id));
        self.any = Some(id);
        Ok(id)
    }

    /// Counts a rule built or copied against [`MAX_GRAMMAR_BYTES`].
    fn weigh(&mut self, rule: &Rule, at: &str) -> Result<(), SchemaError> {
        let keys = rule
            .object
            .iter()
            .flat_map(|o| &o.properties)
            .map(|p| p.key.len() + 8);
        let literals = rule.literals.iter().map(|l| l.len() + 8);
        self.bytes = keys.chain(literals).fold(self.bytes, usize::saturating_add);
        if self.bytes > MAX_GRAMMAR_BYTES {
            return err(
                at,
                format!(
                    "the schema's values and names, with the copies its references make, come \
                     to more than {} MiB",
                    MAX_GRAMMAR_BYTES >> 20
                ),
            );
        }
        Ok(())
    }

    fn compile(&mut self, s: &Value, at: &str) -> Result<RuleId, SchemaError> {
        if self.depth >= MAX_DEPTH {
            return err(
                at,
                format!("the schema nests more than {MAX_DEPTH} schemas (references count)"),
            );
        }
        self.depth += 1;
        let id = self.compile_nested(s, at);
        self.depth -= 1;
        id
    }

    fn compile_nested(&mut self, s: &Value, at: &str) -> Result<RuleId, SchemaError> {
        if let Some(r) = s.get("$ref") {
            return self.reference(s, r, at);
        }
        let id = self.reserve(at)?;
        let rule = self.build(s, at)?;
        self.weigh(&rule, at)?;
        self.rules[id as usize] = Some(rule);
        Ok(id)
    }

    fn reference(&mut self, s: &Value, r: &Value, at: &str) -> Result<RuleId, SchemaError> {
        let at = format!("{at}/$ref");
        let Some(target) = r.as_str() else {
            return invalid(&at, "'$ref' must be a string");
        };
        // Each schema's place, which names it in errors, is spelled from the reference.
        if target.len() > MAX_LITERAL_BYTES {
            return err(
                &at,
                format!("a '$ref' is at most {MAX_LITERAL_BYTES} bytes"),
            );
        }
        if let Some(k) = s
            .as_object()
            .into_iter()
            .flat_map(Map::keys)
            .find(|k| *k != "$ref" && !ANNOTATIONS.contains(&k.as_str()))
        {
            return err(&at, format!("'$ref' beside '{k}' is not supported"));
        }
        if let Some(&id) = self.refs.get(target) {
            return Ok(id);
        }
        let Some(pointer) = target.strip_prefix('#') else {
            return err(
                &at,
                format!(
                    "only references within the schema ('#/$defs/...') are supported, got '{target}'"
                ),
            );
        };
        let Some(schema) = self.root.pointer(pointer) else {
            return invalid(&at, format!("'{target}' points at nothing in the schema"));
        };
        let id = self.reserve(&at)?;
        self.refs.insert(target.to_string(), id);
        let inner = self.compile(schema, target)?;
        let rule = match self.rules.get(inner as usize) {
            Some(Some(rule)) => rule.clone(),
            _ => {
                return err(
                    &at,
                    format!("'{target}' refers to itself without a value between"),
                );
            }
        };
        self.weigh(&rule, &at)?;
        self.rules[id as usize] = Some(rule);
        Ok(id)
    }

    fn build(&mut self, s: &Value, at: &str) -> Result<Rule, SchemaError> {
        let obj = match s {
            Value::Bool(true) => return Ok(Rule::any(self.any(at)?)),
            Value::Bool(false) => return err(at, "the schema 'false' allows no value"),
            Value::Object(o) => o,
            _ => return invalid(at, "a schema must be an object or a boolean"),
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !KEYWORDS.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()))
        {
            return err(at, format!("the keyword '{k}' is not supported"));
        }
        if obj.get("uniqueItems").is_some_and(|u| !u.is_boolean()) {
            return invalid(
                &format!("{at}/uniqueItems"),
                "'uniqueItems' must be a boolean",
            );
        }
        let structural = |except: &[&str]| {
            obj.keys()
                .find(|k| !ANNOTATIONS.contains(&k.as_str()) && !except.contains(&k.as_str()))
                .cloned()
        };
        if let Some(all) = obj.get("allOf") {
            let here = format!("{at}/allOf");
            if let Some(k) = structural(&["allOf"]) {
                return err(at, format!("'allOf' beside '{k}' is not supported"));
            }
            let [one] = all.as_array().map(Vec::as_slice).unwrap_or_default() else {
                return err(&here, "only a list of one schema is supported");
            };
            let here = format!("{here}/0");
            return self.compiled(one, &here);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = obj.get(key) {
                if let Some(k) = structural(&[key]) {
                    return err(at, format!("'{key}' beside '{k}' is not supported"));
                }
                return self.alternatives(alts, &format!("{at}/{key}"));
            }
        }
        if obj.contains_key("enum") || obj.contains_key("const") {
            if let Some(k) = structural(&["enum", "const", "type"]) {
                return err(
                    at,
                    format!("'enum' or 'const' beside '{k}' is not supported"),
                );
            }
            return literals(obj, at);
        }
        let kinds = kinds(obj.get("type"), at)?;
        let mut rule = Rule::default();
        for kind in kinds {
            match kind {
                "object" => rule.object = Some(self.object(obj, at)?),
                "array" => rule.array = Some(self.array(obj, at)?),
                "string" => rule.string = Some(strings::string(obj, at, &mut self.patterns)?),
                "number" => rule.number = Some(Numeric::Number),
                "integer" if rule.number.is_none() => rule.number = Some(Numeric::Integer),
                "integer" => {}
                "boolean" => rule.boolean = true,
                "null" => rule.null = true,
                other => return invalid(&format!("{at}/type"), format!("unknown type '{other}'")),
            }
        }
        let Some(kind) = rule.number else {
            return Ok(rule);
        };
        let bounded = numbers::bounded(obj);
        // Beside bounds, where no short expression holds both: the multiples within them, one by
        // one (no other kind of the rule starts as a number does).
        let listed = |mut rule: Rule, mut listed: Vec<Vec<u8>>| {
            listed.sort();
            rule.number = None;
            rule.literals = listed;
            Ok(rule)
        };
        let regex = match multiples::multiples(obj, kind, bounded, at)? {
            Multiples::Listed(k) => {
                let bounds = numbers::integer_bounds(obj, at)?;
                return listed(rule, multiples::listed(k, bounds, at)?);
            }
            Multiples::ListedDecimals(k) => {
                let bounds = numbers::number_bounds(obj, at)?;
                return listed(rule, multiples::listed_decimals(k, bounds, at)?);
            }
            Multiples::Expression(regex) => regex,
            Multiples::Decimals(e) => numbers::number_range(obj, at, Some(e))?,
            Multiples::Any if !bounded => return Ok(rule),
            Multiples::Any if kind == Numeric::Number => numbers::number_range(obj, at, None)?,
            Multiples::Any => numbers::integer_range(obj, at)?,
        };
        self.bounded_numbers(rule, &regex, at)
    }

    /// `rule` with its numbers held to `regex` (the schema's bounds over their digits): an
    /// alternative of its own where the rule allows other kinds too.
    fn bounded_numbers(
        &mut self,
        mut rule: Rule,
        regex: &str,
        at: &str,
    ) -> Result<Rule, SchemaError> {
        let numbers = Rule {
            pattern: Some(self.patterns.raw(regex, at)?),
            ..Rule::default()
        };
        rule.number = None;
        if rule == Rule::default() {
            return Ok(numbers);
        }
        self.weigh(&rule, at)?;
        self.union(vec![rule, numbers], at)
    }

    /// A rule of its own for each of `rules`, and the union of them.
    fn union(&mut self, rules: Vec<Rule>, at: &str) -> Result<Rule, SchemaError> {
        let mut either = Vec::new();
        for rule in rules {
            let id = self.reserve(at)?;
            self.rules[id as usize] = Some(rule);
            either.push(id);
        }
        Ok(Rule {
            either,
            ..Rule::default()
        })
    }

    /// The rule `s` compiles to (a copy of it).
    fn compiled(&mut self, s: &Value, at: &str) -> Result<Rule, SchemaError> {
        let id = self.compile(s, at)?;
        match self.rules.get(id as usize) {
            Some(Some(rule)) => Ok(rule.clone()),
            _ => err(at, "refers to itself without a value between"),
        }
    }

    /// One rule of the alternatives merged by kind where a value's first byte tells them apart;
    /// else a union of groups of them, each merged so.
    fn alternatives(&mut self, alts: &Value, at: &str) -> Result<Rule, SchemaError> {
        let Some(list) = alts.as_array().filter(|l| !l.is_empty()) else {
            return invalid(at, "must be a non-empty list of schemas");
        };
        let mut groups: Vec<Rule> = Vec::new();
        // Models this union is inside (a model that holds an `Optional` of itself): not built
        // yet, so not merged by kind, but followed as alternatives of their own.
        let mut enclosing = Vec::new();
        for (i, alt) in list.iter().enumerate() {
            let here = format!("{at}/{i}");
            let id = self.compile(alt, &here)?;
            let Some(rule) = self.rules[id as usize].clone() else {
                enclosing.push(id);
                continue;
            };
            let mut parts = Vec::new();
            for &e in &rule.either {
                match self.rules[e as usize].clone() {
                    Some(alt) => parts.push(alt),
                    None => enclosing.push(e),
                }
            }
            if rule.either.is_empty() {
                parts.push(rule);
            }
            for rule in parts {
                self.weigh(&rule, &here)?;
                group(&mut groups, rule, &here)?;
            }
        }
        if groups.len() == 1 && enclosing.is_empty() {
            return Ok(groups.pop().expect("one group"));
        }
        let mut rule = self.union(groups, at)?;
        rule.either.extend(enclosing);
        Ok(rule)
    }
}

/// Merges `rule` into the first group whose objects and arrays it does not clash with, or adds
/// it as a group of its own.
fn group(groups: &mut Vec<Rule>, rule: Rule, at: &str) -> Result<(), SchemaError> {
    // A held string begins with the same quote as any other string value.
    let held = |r: &Rule| r.string.as_ref().is_some_and(|s| !s.is_any());
    let quoted = |r: &Rule| r.string.is_some() || r.literals.iter().any(|l| l[0] == b'"');
    let clash = |a: &Rule| {
        a.pattern.is_some()
            || rule.pattern.is_some()
            || matches!((&a.object, &rule.object), (Some(x), Some(y)) if x != y)
            || matches!((&a.array, &rule.array), (Some(x), Some(y)) if x != y)
            || (held(a) && quoted(&rule))
            || (held(&rule) && quoted(a))
    };
    if let Some(g) = groups.iter_mut().find(|g| !clash(g)) {
        *g = merge(std::mem::take(g), rule, at)?;
        return Ok(());
    }
    if groups.len() >= MAX_STATES as usize {
        return err(
            at,
            format!("more than {MAX_STATES} alternatives of objects, arrays or held strings"),
        );
    }
    groups.push(rule);
    Ok(())
}

/// The types `type` names (all when absent).
fn kinds<'v>(t: Option<&'v Value>, at: &str) -> Result<Vec<&'v str>, SchemaError> {
    const ALL: [&str; 7] = [
        "object", "array", "string", "number", "integer", "boolean", "null",
    ];
    let here = format!("{at}/type");
    match t {
        None => Ok(ALL.to_vec()),
        Some(Value::String(s)) => Ok(vec![s.as_str()]),
        Some(Value::Array(list)) if !list.is_empty() => list
            .iter()
            .map(|v| {
                v.as_str()
                    .map_or_else(|| invalid(&here, "'type' must list type names"), Ok)
            })
            .collect(),
        Some(_) => invalid(
            &here,
            "'type' must be a type name or a non-empty list of them",
        ),
    }
}
