//! What a grammar allows: rules for values, linked by index so that they may recur.

use std::sync::Arc;

use super::cfg::Cfg;
use super::pattern::Pattern;
use super::schema::MAX_STATES;
use super::string::Spelling;

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
    pub string: Option<StringRule>,
    pub number: Option<Numeric>,
    /// `true` and `false`.
    pub boolean: bool,
    pub null: bool,
    /// Sorted; none of a kind the fields above allow, so the first byte of a value says
    /// whether it is one of these.
    pub literals: Vec<Vec<u8>>,
    /// If not empty, the rule allows nothing of its own but the values of any of these rules,
    /// none of which has alternatives itself: a value is followed in each that its bytes fit.
    pub either: Vec<RuleId>,
    /// If set, the rule allows nothing else: raw text the expression matches whole.
    pub pattern: Option<Arc<Pattern>>,
    /// If set, the rule allows nothing else: raw text the grammar derives.
    pub cfg: Option<Arc<Cfg>>,
}

/// The strings a place allows: their characters (as JSON decodes them) matched whole by
/// `pattern`, and their length in characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StringRule {
    pub pattern: Option<Arc<Pattern>>,
    pub min: u32,
    pub max: u32,
}

impl StringRule {
    pub const ANY: StringRule = StringRule {
        pattern: None,
        min: 0,
        max: u32::MAX,
    };

    pub fn is_any(&self) -> bool {
        *self == StringRule::ANY
    }
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
    /// `minProperties` and `maxProperties` (`None`: no most).
    pub min_members: u32,
    pub max_members: Option<u32>,
}

impl ObjectRule {
    /// Whether, after `members` members of which the declared ones are `seen`, one more may
    /// be a member the object does not require: the members it still requires fit beside it.
    pub fn takes_optional(&self, seen: u64, members: u32) -> bool {
        let missing = (self.required & !seen).count_ones();
        self.max_members
            .is_none_or(|max| u64::from(members) + 1 + u64::from(missing) <= u64::from(max))
    }

    /// How its members' names are written: one spelling per name where some are declared, so
    /// that raw bytes compare as names do; any spelling else.
    pub fn name_spelling(&self) -> Spelling {
        if self.properties.is_empty() {
            Spelling::Any
        } else {
            Spelling::Compact
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Property {
    /// The name as JSON writes it between the quotes (compact escapes).
    pub key: Vec<u8>,
    pub value: RuleId,
}

/// An array's items: the rule of each of its first places (a tuple's), then `items`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayRule {
    pub prefix: Vec<RuleId>,
    pub items: RuleId,
    pub min: u32,
    pub max: u32,
    /// `uniqueItems` true: no item twice (only without `prefix`).
    pub unique: Option<UniqueItems>,
}

/// How an array's items are kept unique.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UniqueItems {
    /// Every item is one of the `items` rule's literals, at most [`MAX_UNIQUE_LITERALS`] of
    /// them and no two equal as JSON values: the array's frame marks those taken.
    Literals,
    /// Every item is a string, written without `\u` or `\/` escapes so that equal strings are
    /// spelled alike, or an integer: the matcher keeps the items taken as written (`-0` as `0`).
    Free,
}

/// Literals an array's unique items may be chosen from (each has a bit in a mask).
pub const MAX_UNIQUE_LITERALS: usize = 64;

impl ArrayRule {
    /// The rule of the item at `place` (from 0).
    pub fn item(&self, place: u32) -> RuleId {
        self.prefix
            .get(place as usize)
            .copied()
            .unwrap_or(self.items)
    }
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
                prefix: Vec::new(),
                items: itself,
                min: 0,
                max: u32::MAX,
                unique: None,
            }),
            string: Some(StringRule::ANY),
            number: Some(Numeric::Number),
            boolean: true,
            null: true,
            literals: Vec::new(),
            either: Vec::new(),
            pattern: None,
            cfg: None,
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
            ..ObjectRule::default()
        });
        Grammar { rules, root: 0 }
    }

    /// A value of any of `grammars`, each followed while the bytes fit it; `None` where more
    /// than `MAX_STATES` (16) could be followed at once.
    pub fn union(grammars: Vec<Grammar>) -> Option<Grammar> {
        let mut rules = Vec::new();
        let mut either = Vec::new();
        for g in grammars {
            let offset = rules.len() as RuleId;
            let root = g.rule(g.root);
            match root.either.is_empty() {
                true => either.push(g.root + offset),
                false => either.extend(root.either.iter().map(|e| e + offset)),
            }
            rules.extend(g.rules.into_iter().map(|r| r.shifted(offset)));
        }
        rules.push(Rule {
            either,
            ..Rule::default()
        });
        let g = Grammar {
            root: (rules.len() - 1) as RuleId,
            rules,
        };
        (g.most_states(MAX_STATES)[g.root as usize] <= MAX_STATES).then_some(g)
    }

    /// An array of at least `min` values of `items`.
    pub fn array_of(items: Grammar, min: u32) -> Grammar {
        let offset = 1;
        let mut rules = vec![Rule {
            array: Some(ArrayRule {
                prefix: Vec::new(),
                items: items.root + offset,
                min,
                max: u32::MAX,
                unique: None,
            }),
            ..Rule::default()
        }];
        rules.extend(items.rules.into_iter().map(|r| r.shifted(offset)));
        Grammar { rules, root: 0 }
    }

    /// The objects the grammar allows at its root, if it allows any.
    pub fn objects_only(mut self) -> Option<Grammar> {
        let root = self.rule(self.root);
        let alternatives = match root.either.is_empty() {
            true => vec![self.root],
            false => root.either.clone(),
        };
        let mut either = Vec::new();
        for alt in alternatives {
            if let Some(object) = self.rule(alt).object.clone() {
                self.rules.push(Rule {
                    object: Some(object),
                    ..Rule::default()
                });
                either.push((self.rules.len() - 1) as RuleId);
            }
        }
        self.root = match either.len() {
            0 => return None,
            1 => either[0],
            _ => {
                self.rules.push(Rule {
                    either,
                    ..Rule::default()
                });
                (self.rules.len() - 1) as RuleId
            }
        };
        Some(self)
    }

    /// The most parse states a matcher may hold at once in a value of each rule, each capped
    /// at `cap + 1`: one, but where a union's alternatives all fit the bytes so far.
    pub fn most_states(&self, cap: u32) -> Vec<u32> {
        let n = self.rules.len();
        let mut users = vec![Vec::new(); n];
        for (i, r) in self.rules.iter().enumerate() {
            for c in r.inner().chain(r.either.iter().copied()) {
                users[c as usize].push(i);
            }
        }
        let firsts = self.first_bytes();
        let mut most = vec![1u32; n];
        let mut work: Vec<usize> = (0..n).collect();
        while let Some(i) = work.pop() {
            let r = &self.rules[i];
            // A union's alternatives are followed from its first byte, which drops those that
            // cannot begin with it.
            let here = match r.either.is_empty() {
                true => r.inner().map(|c| most[c as usize]).max().unwrap_or(1),
                false => (0..8)
                    .map(|bit| {
                        r.either
                            .iter()
                            .filter(|&&e| firsts[e as usize] & (1 << bit) != 0)
                            .map(|&e| most[e as usize])
                            .sum::<u32>()
                    })
                    .max()
                    .unwrap_or(1),
            };
            if here.min(cap + 1) > most[i] {
                most[i] = here.min(cap + 1);
                work.extend(&users[i]);
            }
        }
        most
    }
}

impl Grammar {
    /// For each rule, the kinds of byte its values may begin with, a bit each (see
    /// [`Rule::first_bytes`]); a union's are its alternatives'.
    fn first_bytes(&self) -> Vec<u8> {
        let mut firsts: Vec<u8> = self.rules.iter().map(Rule::first_bytes).collect();
        let mut changed = true;
        while changed {
            changed = false;
            for (i, r) in self.rules.iter().enumerate() {
                let all = r
                    .either
                    .iter()
                    .fold(firsts[i], |f, &e| f | firsts[e as usize]);
                changed |= all != firsts[i];
                firsts[i] = all;
            }
        }
        firsts
    }
}

impl Rule {
    /// The kinds of byte this rule's own values may begin with, a bit each: `{`, `[`, `"`, a
    /// number's, `t`, `f`, `n`, any other. Raw text may begin with any.
    fn first_bytes(&self) -> u8 {
        if self.pattern.is_some() || self.cfg.is_some() {
            return u8::MAX;
        }
        let of = |b: u8| match b {
            b'{' => 1,
            b'[' => 2,
            b'"' => 4,
            b'-' | b'0'..=b'9' => 8,
            b't' => 16,
            b'f' => 32,
            b'n' => 64,
            _ => 128,
        };
        let kinds = [
            (self.object.is_some(), 1),
            (self.array.is_some(), 2),
            (self.string.is_some(), 4),
            (self.number.is_some(), 8),
            (self.boolean, 16 | 32),
            (self.null, 64),
        ];
        let own = kinds.iter().filter(|k| k.0).fold(0, |f, k| f | k.1);
        self.literals
            .iter()
            .fold(own, |f, l| f | l.first().map_or(128, |&b| of(b)))
    }

    /// The rules of the values inside this rule's objects and arrays.
    fn inner(&self) -> impl Iterator<Item = RuleId> + '_ {
        let object = self.object.iter();
        let values = object
            .clone()
            .flat_map(|o| o.properties.iter().map(|p| p.value));
        let additional = object.filter_map(|o| o.additional);
        values.chain(additional).chain(
            self.array
                .iter()
                .flat_map(|a| a.prefix.iter().copied().chain([a.items])),
        )
    }

    /// The rule in a grammar whose rules moved `offset` places on.
    fn shifted(mut self, offset: RuleId) -> Rule {
        if let Some(o) = &mut self.object {
            o.properties.iter_mut().for_each(|p| p.value += offset);
            o.additional = o.additional.map(|a| a + offset);
        }
        if let Some(a) = &mut self.array {
            a.items += offset;
            a.prefix.iter_mut().for_each(|p| *p += offset);
        }
        self.either.iter_mut().for_each(|e| *e += offset);
        self
    }
}
