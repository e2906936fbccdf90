//! A context-free grammar over characters, compiled from GBNF for the matcher: each rule's
//! alternatives are sequences of character classes and rules. Repeats become right-recursive
//! rules; alternatives that can derive no text are dropped; a rule that can begin with itself
//! (left recursion) is refused, since the matcher expands rules as it reads.

use std::collections::HashMap;

use super::gbnf::{Expr, parse};
use super::rules::{Grammar, Rule};
use super::schema::SchemaError;

/// Items of all alternatives together (a repeat's copies counted).
const MAX_ITEMS: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// One character of class `.0`.
    Class(u32),
    Rule(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alt {
    pub items: Vec<Item>,
    /// `nullable[i]`: the items from `i` on can derive the empty text (`len + 1` entries).
    pub nullable: Vec<bool>,
    /// `closed[i]`: the items from `i` on derive the empty text only.
    pub closed: Vec<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cfg {
    /// Each rule's alternatives, as indices into `alts`.
    pub rules: Vec<Vec<u32>>,
    pub alts: Vec<Alt>,
    /// Sorted, disjoint ranges of code points, none a surrogate (an empty class is in no
    /// alternative).
    pub classes: Vec<Vec<(u32, u32)>>,
    pub root: u32,
}

impl Cfg {
    /// Whether class `c` holds a code point in `lo..=hi`.
    pub fn class_meets(&self, c: u32, lo: u32, hi: u32) -> bool {
        let ranges = &self.classes[c as usize];
        let i = ranges.partition_point(|r| r.1 < lo);
        ranges.get(i).is_some_and(|r| r.0 <= hi)
    }
}

impl Grammar {
    /// The grammar of a reply that GBNF `text` derives from its rule `root`.
    pub fn gbnf(text: &str) -> Result<Grammar, SchemaError> {
        let cfg = compile(text)?;
        Ok(Grammar {
            rules: vec![Rule {
                cfg: Some(std::sync::Arc::new(cfg)),
                ..Rule::default()
            }],
            root: 0,
        })
    }
}

fn error(at: String, message: impl Into<String>) -> SchemaError {
    SchemaError::new(at, message)
}

fn compile(text: &str) -> Result<Cfg, SchemaError> {
    let parsed = parse(text)?;
    let mut ids = HashMap::new();
    for (i, (name, _, line)) in parsed.iter().enumerate() {
        if ids.insert(name.clone(), i as u32).is_some() {
            return Err(error(
                format!("grammar line {line}"),
                format!("rule '{name}' is defined twice"),
            ));
        }
    }
    let Some(&root) = ids.get("root") else {
        return Err(error("grammar".into(), "there is no rule named 'root'"));
    };
    let mut low = Lowering {
        ids,
        rules: vec![Vec::new(); parsed.len()],
        classes: Vec::new(),
        class_ids: HashMap::new(),
        items: 0,
        origin: Vec::new(),
    };
    for (i, (name, body, _)) in parsed.iter().enumerate() {
        let alts = low.alternatives(body, name)?;
        low.rules[i] = alts;
    }
    let rules = prune(low.rules, &low.classes, root)?;
    let names = |r: usize| match parsed.get(r) {
        Some(p) => format!("rule '{}'", p.0),
        None => format!(
            "a repeat or group in rule '{}'",
            low.origin[r - parsed.len()]
        ),
    };
    let nullable = nullable_rules(&rules);
    let empty = empty_only_rules(&rules);
    check_left_recursion(&rules, &nullable, root, names)?;
    let mut cfg = Cfg {
        rules: Vec::new(),
        alts: Vec::new(),
        classes: low.classes,
        root,
    };
    for alts in rules {
        let mut ids = Vec::new();
        for items in alts {
            let suffix = |of: &[bool]| {
                let mut out = vec![true; items.len() + 1];
                for i in (0..items.len()).rev() {
                    out[i] = out[i + 1] && matches!(items[i], Item::Rule(r) if of[r as usize]);
                }
                out
            };
            let (nullable, closed) = (suffix(&nullable), suffix(&empty));
            ids.push(cfg.alts.len() as u32);
            cfg.alts.push(Alt {
                items,
                nullable,
                closed,
            });
        }
        cfg.rules.push(ids);
    }
    Ok(cfg)
}

struct Lowering {
    ids: HashMap<String, u32>,
    /// Each rule's alternatives; rules past the named ones are groups and repeats.
    rules: Vec<Vec<Vec<Item>>>,
    classes: Vec<Vec<(u32, u32)>>,
    class_ids: HashMap<Vec<(u32, u32)>, u32>,
    items: usize,
    /// The named rule each rule past the named ones was written in.
    origin: Vec<String>,
}

impl Lowering {
    fn alternatives(&mut self, e: &Expr, rule: &str) -> Result<Vec<Vec<Item>>, SchemaError> {
        match e {
            Expr::Alt(alts) => alts.iter().map(|a| self.sequence(a, rule)).collect(),
            other => Ok(vec![self.sequence(other, rule)?]),
        }
    }

    fn sequence(&mut self, e: &Expr, rule: &str) -> Result<Vec<Item>, SchemaError> {
        let mut out = Vec::new();
        match e {
            Expr::Seq(parts) => {
                for p in parts {
                    out.extend(self.sequence(p, rule)?);
                }
            }
            Expr::Chars(ranges) => {
                self.count(1, rule)?;
                out.push(Item::Class(self.class(ranges)));
            }
            Expr::Literal(chars) => {
                self.count(chars.len(), rule)?;
                for &c in chars {
                    out.push(Item::Class(self.class(&[(c, c)])));
                }
            }
            Expr::Ref(name) => match self.ids.get(name) {
                Some(&r) => out.push(Item::Rule(r)),
                None => {
                    return Err(error(
                        format!("rule '{rule}'"),
                        format!("rule '{name}' is not defined"),
                    ));
                }
            },
            Expr::Alt(_) => {
                let alts = self.alternatives(e, rule)?;
                out.push(Item::Rule(self.new_rule(alts, rule)));
            }
            Expr::Repeat(inner, min, max) => {
                let once = self.sequence(inner, rule)?;
                for _ in 0..*min {
                    out.extend(once.iter().copied());
                    self.count(once.len(), rule)?;
                }
                match max {
                    // more ::= once more | (empty)
                    None => {
                        let more = self.new_rule(Vec::new(), rule);
                        let mut again = once.clone();
                        again.push(Item::Rule(more));
                        self.count(again.len(), rule)?;
                        self.rules[more as usize] = vec![again, Vec::new()];
                        out.push(Item::Rule(more));
                    }
                    // up_to_j ::= once up_to_(j-1) | (empty), for j up to max - min
                    Some(max) => {
                        let mut up_to: Option<u32> = None;
                        for _ in *min..*max {
                            let mut again = once.clone();
                            again.extend(up_to.map(Item::Rule));
                            self.count(again.len(), rule)?;
                            up_to = Some(self.new_rule(vec![again, Vec::new()], rule));
                        }
                        out.extend(up_to.map(Item::Rule));
                    }
                }
            }
        }
        Ok(out)
    }

    fn count(&mut self, n: usize, rule: &str) -> Result<(), SchemaError> {
        self.items += n;
        if self.items > MAX_ITEMS {
            return Err(error(
                format!("rule '{rule}'"),
                format!("the grammar comes to more than {MAX_ITEMS} items with its repeats"),
            ));
        }
        Ok(())
    }

    fn new_rule(&mut self, alts: Vec<Vec<Item>>, written_in: &str) -> u32 {
        self.rules.push(alts);
        self.origin.push(written_in.to_string());
        (self.rules.len() - 1) as u32
    }

    /// The class of `ranges`, surrogates taken out and ranges merged.
    fn class(&mut self, ranges: &[(u32, u32)]) -> u32 {
        let mut split = Vec::new();
        for &(lo, hi) in ranges {
            for (a, b) in [(lo, hi.min(0xd7ff)), (lo.max(0xe000), hi.min(0x10_ffff))] {
                if a <= b {
                    split.push((a, b));
                }
            }
        }
        split.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::new();
        for (lo, hi) in split {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        if let Some(&id) = self.class_ids.get(&merged) {
            return id;
        }
        let id = self.classes.len() as u32;
        self.class_ids.insert(merged.clone(), id);
        self.classes.push(merged);
        id
    }
}

/// The rules with only the alternatives that can derive some text; an error if `root` cannot.
fn prune(
    mut rules: Vec<Vec<Vec<Item>>>,
    classes: &[Vec<(u32, u32)>],
    root: u32,
) -> Result<Vec<Vec<Vec<Item>>>, SchemaError> {
    let derives = |items: &[Item], productive: &[bool]| {
        items.iter().all(|i| match *i {
            Item::Class(c) => !classes[c as usize].is_empty(),
            Item::Rule(r) => productive[r as usize],
        })
    };
    let productive = settle(&rules, false, derives);
    if !productive[root as usize] {
        return Err(error(
            "grammar".into(),
            "the rule 'root' derives no text (each way through it needs a rule that never \
             ends, or a class of no character)",
        ));
    }
    for alts in &mut rules {
        alts.retain(|a| derives(a, &productive));
    }
    Ok(rules)
}

/// The rules that can derive the empty text.
fn nullable_rules(rules: &[Vec<Vec<Item>>]) -> Vec<bool> {
    settle(rules, false, |a, nullable| {
        a.iter()
            .all(|i| matches!(*i, Item::Rule(x) if nullable[x as usize]))
    })
}

/// The rules that derive the empty text and nothing else.
fn empty_only_rules(rules: &[Vec<Vec<Item>>]) -> Vec<bool> {
    settle(rules, true, |a, empty| {
        a.iter()
            .any(|i| !matches!(*i, Item::Rule(x) if empty[x as usize]))
    })
}

/// A mark per rule, each `from` at first and turned once some alternative of its rule
/// `turns` given the marks so far, until none turns.
fn settle(
    rules: &[Vec<Vec<Item>>],
    from: bool,
    turns: impl Fn(&[Item], &[bool]) -> bool,
) -> Vec<bool> {
    let mut marks = vec![from; rules.len()];
    let mut changed = true;
    while changed {
        changed = false;
        for r in 0..rules.len() {
            if marks[r] == from && rules[r].iter().any(|a| turns(a, &marks)) {
                marks[r] = !from;
                changed = true;
            }
        }
    }
    marks
}

/// Refuses a rule reachable from `root` that can begin with itself, through rules that may
/// derive the empty text before it.
fn check_left_recursion(
    rules: &[Vec<Vec<Item>>],
    nullable: &[bool],
    root: u32,
    name: impl Fn(usize) -> String,
) -> Result<(), SchemaError> {
    // The rules each rule can begin with.
    let first: Vec<Vec<u32>> = rules
        .iter()
        .map(|alts| {
            let mut out = Vec::new();
            for a in alts {
                for item in a {
                    match *item {
                        Item::Rule(r) => {
                            out.push(r);
                            if !nullable[r as usize] {
                                break;
                            }
                        }
                        Item::Class(_) => break,
                    }
                }
            }
            out
        })
        .collect();
    // Depth-first from the root over every rule it refers to; a rule met again on the path of
    // "begins with" edges is left-recursive.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let mut mark = vec![Mark::New; rules.len()];
    let mut order = vec![root];
    let mut reached = vec![false; rules.len()];
    reached[root as usize] = true;
    while let Some(r) = order.pop() {
        for a in &rules[r as usize] {
            for item in a {
                if let Item::Rule(x) = *item
                    && !reached[x as usize]
                {
                    reached[x as usize] = true;
                    order.push(x);
                }
            }
        }
    }
    for start in 0..rules.len() {
        if !reached[start] || mark[start] != Mark::New {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = Mark::Open;
        while let Some(&mut (r, ref mut next)) = path.last_mut() {
            if let Some(&x) = first[r].get(*next) {
                *next += 1;
                match mark[x as usize] {
                    Mark::Open => {
                        return Err(error(
                            name(x as usize),
                            "left recursion: it can begin with itself, which this server does \
                             not follow (write a rule that does with a repeat instead, as `a ::= \
                             b (\"+\" b)*`; a repeat of what may be empty, as `(\"a\"*)*`, is \
                             one too)",
                        ));
                    }
                    Mark::New => {
                        mark[x as usize] = Mark::Open;
                        path.push((x as usize, 0));
                    }
                    Mark::Done => {}
                }
            } else {
                mark[r] = Mark::Done;
                path.pop();
            }
        }
    }
    Ok(())
}
