//! What a grammar allows: rules for values, linked by index so that they may recur.

/// A rule's index in its [`Grammar`].
pub type RuleId = u32;

/// The rules of one reply: the value at `root` and the rules it refers to.
#[derive(Debug, Clone, PartialEq)]
pub struct Grammar {
    pub rules: Vec<Rule>,
    pub root: RuleId,
}

/// The values one place in a reply may hold: each JSON kind it allows, and values allowed
/// one by one (`enum`, `const`) in their compact encoding.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rule {
    pub object: Option<ObjectRule>,
    pub array: Option<ArrayRule>,
    /// Any string.
    pub string: bool,
    pub number: Option<Numeric>,
    /// `true` and `false`.
    pub boolean: bool,
    pub null: bool,
    /// Sorted; none of a kind the fields above allow, so the first byte of a value says
    /// whether it is one of these.
    pub literals: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numeric {
    /// No fraction, no exponent.
    Integer,
    Number,
}

/// An object's members, in any order, each at most once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObjectRule {
    /// Sorted by key.
    pub properties: Vec<Property>,
    /// Bit `i`: `properties[i]` must appear.
    pub required: u64,
    /// The rule of members not among `properties`, if they are allowed.
    pub additional: Option<RuleId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Property {
    /// The name as JSON writes it between the quotes (compact escapes).
    pub key: Vec<u8>,
    pub value: RuleId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayRule {
    pub items: RuleId,
    pub min: u32,
    pub max: u32,
}

/// Properties one object may declare (each has a bit in a mask).
pub const MAX_PROPERTIES: usize = 64;

impl Rule {
    /// Any JSON value, whose arrays and members are `itself`.
    pub fn any(itself: RuleId) -> Rule {
        Rule {
            object: Some(ObjectRule {
                additional: Some(itself),
                ..ObjectRule::default()
            }),
            array: Some(ArrayRule {
                items: itself,
                min: 0,
                max: u32::MAX,
            }),
            string: true,
            number: Some(Numeric::Number),
            boolean: true,
            null: true,
            literals: Vec::new(),
        }
    }
}

impl Grammar {
    /// One JSON object, of any members.
    pub fn any_object() -> Grammar {
        let root = Rule {
            object: Some(ObjectRule {
                additional: Some(1),
                ..ObjectRule::default()
            }),
            ..Rule::default()
        };
        Grammar {
            rules: vec![root, Rule::any(1)],
            root: 0,
        }
    }

    pub fn rule(&self, id: RuleId) -> &Rule {
        &self.rules[id as usize]
    }
}
