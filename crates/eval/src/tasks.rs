//! The synthetic long-context tasks, in the style of RULER: each sample is a haystack of filler
//! text with facts planted at chosen depths, a question, and the answers scored by exact match.

use serde::{Deserialize, Serialize};

use crate::rng::Rng;
use crate::text::{Filler, key};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// A five-digit pass key in repeated noise.
    Passkey,
    /// One seven-digit number for a named key in varied text, at one of several depths.
    Needle,
    /// Four keys with numbers at random depths; the question asks for one (the rest distract).
    Multikey,
    /// A chain of variable assignments (and a distracting chain); name every variable that
    /// holds the value.
    Vartrack,
}

/// Depths (share of the haystack before the needle) that `needle` cycles through.
pub const NEEDLE_DEPTHS: [f64; 5] = [0.1, 0.3, 0.5, 0.7, 0.9];

impl Task {
    pub const ALL: [Task; 4] = [Task::Passkey, Task::Needle, Task::Multikey, Task::Vartrack];

    pub fn name(self) -> &'static str {
        match self {
            Task::Passkey => "passkey",
            Task::Needle => "needle",
            Task::Multikey => "multikey",
            Task::Vartrack => "vartrack",
        }
    }

    pub fn parse(s: &str) -> Result<Task, String> {
        Task::ALL
            .into_iter()
            .find(|t| t.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = Task::ALL.iter().map(|t| t.name()).collect();
                format!("unknown task '{s}' (tasks are {})", names.join(", "))
            })
    }

    /// Tokens generated at most for an answer.
    pub fn max_tokens(self) -> usize {
        match self {
            Task::Passkey => 8,
            Task::Needle | Task::Multikey => 12,
            Task::Vartrack => 24,
        }
    }

    fn filler(self) -> Filler {
        match self {
            Task::Passkey | Task::Vartrack => Filler::Noise,
            Task::Needle | Task::Multikey => Filler::Essay,
        }
    }

    /// The facts, question and answers of sample `index` of `samples` at the nominal context
    /// `length` (haystack not yet sized).
    pub fn spec(self, seed: u64, length: usize, index: usize, samples: usize) -> Spec {
        let mut r = Rng::derive(seed, &[self as u64 + 1, length as u64, index as u64]);
        let filler_seed = r.next_u64();
        match self {
            Task::Passkey => {
                let k = r.number(5);
                let depth = r.unit();
                Spec {
                    intro: "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there.".into(),
                    facts: vec![(depth, format!("The pass key is {k}. Remember it. {k} is the pass key."))],
                    question: "What is the pass key? The pass key is".into(),
                    answers: vec![k],
                    depth: Some(depth),
                    filler: self.filler(),
                    filler_seed,
                }
            }
            Task::Needle => {
                let name = key(&mut r);
                let v = r.number(7);
                let depth = NEEDLE_DEPTHS[needle_depth(index, samples)];
                Spec {
                    intro: MAGIC_INTRO.into(),
                    facts: vec![(
                        depth,
                        format!("One of the special magic numbers for {name} is: {v}."),
                    )],
                    question: format!(
                        "What is the special magic number for {name} mentioned in the provided text? The special magic number for {name} mentioned in the provided text is"
                    ),
                    answers: vec![v],
                    depth: Some(depth),
                    filler: self.filler(),
                    filler_seed,
                }
            }
            Task::Multikey => {
                let mut names: Vec<String> = Vec::new();
                while names.len() < 4 {
                    let k = key(&mut r);
                    if !names.contains(&k) {
                        names.push(k);
                    }
                }
                let facts: Vec<(f64, String)> = names
                    .iter()
                    .map(|n| {
                        let v = r.number(7);
                        (
                            r.unit(),
                            format!("One of the special magic numbers for {n} is: {v}."),
                        )
                    })
                    .collect();
                let asked = r.below(names.len());
                let answer = facts[asked]
                    .1
                    .rsplit(' ')
                    .next()
                    .unwrap()
                    .trim_end_matches('.')
                    .to_string();
                let name = &names[asked];
                Spec {
                    intro: MAGIC_INTRO.into(),
                    depth: Some(facts[asked].0),
                    facts,
                    question: format!(
                        "What is the special magic number for {name} mentioned in the provided text? The special magic number for {name} mentioned in the provided text is"
                    ),
                    answers: vec![answer],
                    filler: self.filler(),
                    filler_seed,
                }
            }
            Task::Vartrack => {
                let mut names: Vec<String> = Vec::new();
                while names.len() < 6 {
                    let w = r.word(5);
                    if !names.contains(&w) {
                        names.push(w);
                    }
                }
                let value = r.number(5);
                let mut other = r.number(5);
                while other == value {
                    other = r.number(5);
                }
                let mut facts = Vec::new();
                for (chain, v) in [(&names[..3], &value), (&names[3..], &other)] {
                    let mut depths: Vec<f64> = (0..chain.len()).map(|_| r.unit()).collect();
                    depths.sort_by(f64::total_cmp);
                    for (i, name) in chain.iter().enumerate() {
                        let rhs = if i == 0 {
                            v.clone()
                        } else {
                            format!("VAR {}", chain[i - 1])
                        };
                        facts.push((depths[i], format!("VAR {name} = {rhs}.")));
                    }
                }
                Spec {
                    intro: "Memorize and track the chain(s) of variable assignment hidden in the following text.".into(),
                    facts,
                    question: format!("Question: Find all variables that are assigned the value {value} in the text above. Answer: According to the chain(s) of variables assignment in the text above, 3 variables are assigned the value {value}, they are:"),
                    answers: names[..3].to_vec(),
                    depth: None,
                    filler: self.filler(),
                    filler_seed,
                }
            }
        }
    }
}

const MAGIC_INTRO: &str = "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you about the numbers afterwards.";

/// A sample before its haystack is sized to a token count.
#[derive(Debug, Clone)]
pub struct Spec {
    pub intro: String,
    /// `(depth, sentence)`: planted after that share of the filler.
    pub facts: Vec<(f64, String)>,
    pub question: String,
    pub answers: Vec<String>,
    /// Depth of the fact the question asks about, where there is one.
    pub depth: Option<f64>,
    filler: Filler,
    filler_seed: u64,
}

impl Spec {
    /// The prompt with `units` units of filler.
    pub fn render(&self, units: usize) -> String {
        let mut facts: Vec<(usize, &str)> = self
            .facts
            .iter()
            .map(|(d, s)| (((d * units as f64).round() as usize).min(units), s.as_str()))
            .collect();
        facts.sort_by_key(|f| f.0);
        let mut body = String::new();
        let mut next = facts.iter().peekable();
        for i in 0..=units {
            while let Some((_, s)) = next.next_if(|f| f.0 == i) {
                body.push_str(s);
                body.push(' ');
            }
            if i < units {
                body.push_str(&self.filler.unit(self.filler_seed, i));
                body.push(' ');
            }
        }
        format!("{}\n\n{}\n\n{}", self.intro, body.trim_end(), self.question)
    }
}

/// A sample sized to its context length: the prompt text and the tokens it encodes to.
#[derive(Debug, Clone)]
pub struct Sample {
    pub task: Task,
    pub index: usize,
    pub prompt: Vec<u32>,
    pub answers: Vec<String>,
    pub depth: Option<f64>,
}

/// Sizes the haystack so that the prompt encodes to at most `target` tokens, as close as the
/// filler's granularity allows. `encode` turns text into tokens.
pub fn fit(
    spec: &Spec,
    target: usize,
    encode: &dyn Fn(&str) -> Vec<u32>,
) -> Result<Vec<u32>, String> {
    let base = encode(&spec.render(0)).len();
    if base >= target {
        return Err(format!(
            "a context of {target} tokens cannot hold the task ({base} tokens without any filler)"
        ));
    }
    const PROBE: usize = 64;
    let per_unit = ((encode(&spec.render(PROBE)).len() - base) as f64 / PROBE as f64).max(0.5);
    let mut units = ((target - base) as f64 / per_unit) as usize;
    let mut best: Option<Vec<u32>> = None;
    for _ in 0..12 {
        let tokens = encode(&spec.render(units));
        if tokens.len() <= target {
            let gap = target - tokens.len();
            let done = gap as f64 <= per_unit * 2.0;
            best = Some(tokens);
            if done {
                break;
            }
            units += (gap as f64 / per_unit).floor().max(1.0) as usize;
        } else {
            let over = tokens.len() - target;
            units = units.saturating_sub((over as f64 / per_unit).ceil() as usize + 1);
        }
    }
    best.ok_or_else(|| format!("could not size the haystack to {target} tokens"))
}

/// Tokens of filler a prompt must have room for: with less, the task measures nothing.
pub const MIN_FILLER_TOKENS: usize = 64;

/// Tokens of `task`'s text without any filler (its first sample's), at the nominal `length`.
pub fn fixed_tokens(
    task: Task,
    seed: u64,
    length: usize,
    samples: usize,
    encode: &dyn Fn(&str) -> Vec<u32>,
) -> usize {
    encode(&task.spec(seed, length, 0, samples).render(0)).len()
}

/// Which of [`NEEDLE_DEPTHS`] sample `index` of `samples` uses: spread from the first to the
/// last when there are fewer samples than depths (the middle one for a single sample), in
/// turn when there are more.
fn needle_depth(index: usize, samples: usize) -> usize {
    let n = NEEDLE_DEPTHS.len();
    match samples {
        0 | 1 => n / 2,
        s if s <= n => (index * (n - 1) + (s - 1) / 2) / (s - 1),
        _ => index % n,
    }
}

/// Sample `index` of `samples` of `task` at the nominal context `length`, for a prompt of at
/// most `target` tokens. The sample depends on the nominal length, not on the target, so runs
/// that reserve different room for the answer see the same samples.
pub fn sample(
    task: Task,
    seed: u64,
    (length, target): (usize, usize),
    (index, samples): (usize, usize),
    encode: &dyn Fn(&str) -> Vec<u32>,
) -> Result<Sample, String> {
    let spec = task.spec(seed, length, index, samples);
    let prompt = fit(&spec, target, encode)?;
    Ok(Sample {
        task,
        index,
        prompt,
        answers: spec.answers,
        depth: spec.depth,
    })
}
