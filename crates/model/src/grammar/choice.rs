//! A reply that is exactly one of a few texts (vLLM's `guided_choice`): the texts as the
//! literals of the root rule, written raw rather than as JSON.

use super::rules::{Grammar, Rule};
use super::schema::{MAX_LITERAL_BYTES, MAX_LITERALS, SchemaError};

impl Grammar {
    /// The grammar of a reply that is one of `choices`, byte for byte.
    pub fn choice(choices: &[String]) -> Result<Grammar, SchemaError> {
        let bad = |at: usize, message: String| SchemaError::new(format!("choice {at}"), message);
        if choices.is_empty() {
            return Err(SchemaError::new("choices", "there must be at least one"));
        }
        if choices.len() > MAX_LITERALS {
            return Err(SchemaError::new(
                "choices",
                format!("at most {MAX_LITERALS}"),
            ));
        }
        for (i, c) in choices.iter().enumerate() {
            if c.is_empty() {
                return Err(bad(i, "a choice may not be empty".into()));
            }
            if c.len() > MAX_LITERAL_BYTES {
                return Err(bad(
                    i,
                    format!("a choice is at most {MAX_LITERAL_BYTES} bytes"),
                ));
            }
            // The matcher reads whitespace before a value as such.
            if c.starts_with([' ', '\t', '\n', '\r']) {
                return Err(bad(i, "a choice may not start with whitespace".into()));
            }
        }
        let mut literals: Vec<Vec<u8>> = choices.iter().map(|c| c.as_bytes().to_vec()).collect();
        literals.sort();
        literals.dedup();
        Ok(Grammar {
            rules: vec![Rule {
                literals,
                ..Rule::default()
            }],
            root: 0,
        })
    }
}
