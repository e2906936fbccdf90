//! What a grammar allows: rules for values, linked by index so that they may recur.

/// A rule's index in its [`Grammar`].
pub type RuleId = u32;

/// The rules of one reply: the value at `root` and the rules it refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grammar {
    pub rules: Vec<Rule>,
    pub root: RuleId,
}

/// The values one place in a reply may hold: each JSON kind it allows, and values allowed
/// one by one (`enum`, `const`) in their compact encoding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectRule {
    /// Sorted by key.
    pub properties: Vec<Property>,
    /// Bit `i`: `properties[i]` must appear.
    pub required: u64,
    /// The rule of members not among `properties`, if they are allowed.
    pub additional: Option<RuleId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
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

    /// An object of exactly these members, all required, each value as its grammar allows.
    pub fn object_of(members: Vec<(&str, Grammar)>) -> Grammar {
        let mut rules = vec![Rule::default()];
        let mut properties = Vec::new();
        for (name, g) in members {
            let offset = rules.len() as RuleId;
            rules.extend(g.rules.into_iter().map(|r| r.shifted(offset)));
            let quoted = serde_json::Value::from(name).to_string();
            properties.push(Property {
                key: quoted.as_bytes()[1..quoted.len() - 1].to_vec(),
                value: g.root + offset,
            });
        }
        properties.sort_by(|a, b| a.key.cmp(&b.key));
        rules[0].object = Some(ObjectRule {
            required: (0..properties.len()).fold(0, |m, i| m | 1 << i),
            properties,
            additional: None,
        });
        Grammar { rules, root: 0 }
    }

    /// The objects the grammar allows at its root, if it allows any.
    pub fn objects_only(mut self) -> Option<Grammar> {
        let object = self.rule(self.root).object.clone()?;
        self.rules.push(Rule {
            object: Some(object),
            ..Rule::default()
        });
        self.root = (self.rules.len() - 1) as RuleId;
        Some(self)
    }
}

impl Rule {
    /// The rule in a grammar whose rules moved `offset` places on.
    fn shifted(mut self, offset: RuleId) -> Rule {
        if let Some(o) = &mut self.object {
            o.properties.iter_mut().for_each(|p| p.value += offset);
            o.additional = o.additional.map(|a| a + offset);
        }
        if let Some(a) = &mut self.array {
            a.items += offset;
        }
        self
    }
}
