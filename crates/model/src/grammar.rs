//! Constrained decoding: replies held to JSON, to JSON that a schema describes, to one of a few
//! texts, to a regular expression, or to a context-free grammar (GBNF). A [`Grammar`] (compiled
//! from a JSON Schema, any JSON object, the texts, the expression or the grammar) drives a byte-level [`Matcher`]; a [`Vocabulary`] turns
//! the matcher's state into the set of tokens that may come next.

mod cfg;
mod choice;
mod gbnf;
mod matcher;
mod pattern;
mod rules;
mod schema;
mod states;
mod string;
mod text_tokens;
mod vocabulary;

pub use matcher::{Mark, Matcher, StateKey};
pub use rules::{ArrayRule, Grammar, Numeric, ObjectRule, Property, Rule, RuleId};
pub use schema::SchemaError;
pub use vocabulary::{Constraint, TokenSet, Vocabulary};

/// Whitespace bytes one run may hold between the parts of a reply: enough for indented JSON,
/// too few for a model to loop on.
pub const MAX_WHITESPACE: u8 = 20;
