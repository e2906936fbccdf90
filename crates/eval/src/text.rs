//! Filler text for the haystacks: a repeated noise paragraph (as in RULER's passkey and variable
//! tracking) or varied essay-like sentences (for the needles), both generated, never read from disk.

use crate::rng::Rng;

/// The kind of text around the needles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filler {
    /// "The grass is green. The sky is blue. ..." over and over.
    Noise,
    /// Grammatical sentences drawn from small word lists, each one different.
    Essay,
}

const NOISE: &str =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

const SUBJECTS: [&str; 16] = [
    "The old river",
    "A quiet engineer",
    "The village council",
    "Every good startup",
    "The northern wind",
    "A patient teacher",
    "The small bakery",
    "Our first prototype",
    "The city library",
    "A curious student",
    "The mountain road",
    "The evening train",
    "A careful investor",
    "The local orchestra",
    "The harbour master",
    "A young painter",
];

const VERBS: [&str; 16] = [
    "slowly changed",
    "quietly rebuilt",
    "carefully studied",
    "often ignored",
    "gradually shaped",
    "rarely questioned",
    "patiently measured",
    "openly admired",
    "briefly visited",
    "steadily improved",
    "happily described",
    "never forgot",
    "boldly rewrote",
    "eagerly followed",
    "kindly explained",
    "loudly praised",
];

const OBJECTS: [&str; 16] = [
    "the shape of the valley",
    "a long list of small habits",
    "the rules of the market",
    "the colour of the morning sky",
    "an unfinished letter",
    "the price of bread",
    "the history of the town",
    "a map of forgotten paths",
    "the sound of the sea",
    "every detail of the plan",
    "the old stone bridge",
    "a box of faded photographs",
    "the habits of migrating birds",
    "the design of the new square",
    "a simple way to keep time",
    "the last page of the book",
];

const TAILS: [&str; 12] = [
    "before the winter came",
    "after a long discussion",
    "without telling anyone",
    "over many quiet years",
    "during the summer festival",
    "while the rain kept falling",
    "as the lights went out",
    "in the spring of that year",
    "for reasons nobody remembered",
    "with surprising care",
    "at the end of the season",
    "long after midnight",
];

impl Filler {
    /// Unit `i` of the filler: the same `i` and `seed` always give the same text.
    pub fn unit(self, seed: u64, i: usize) -> String {
        match self {
            Filler::Noise => NOISE.to_string(),
            Filler::Essay => {
                let mut r = Rng::derive(seed, &[0xE55A, i as u64]);
                format!(
                    "{} {} {} {}.",
                    r.pick(&SUBJECTS),
                    r.pick(&VERBS),
                    r.pick(&OBJECTS),
                    r.pick(&TAILS)
                )
            }
        }
    }
}

/// Adjective-noun keys for the needles, e.g. `brave-otter`.
pub fn key(r: &mut Rng) -> String {
    const ADJ: [&str; 20] = [
        "brave", "calm", "eager", "fancy", "gentle", "hollow", "icy", "jolly", "kind", "lucky",
        "mighty", "nimble", "odd", "proud", "quick", "rapid", "silent", "tidy", "vivid", "witty",
    ];
    const NOUN: [&str; 20] = [
        "otter", "falcon", "maple", "harbor", "lantern", "meadow", "pebble", "comet", "violin",
        "glacier", "thistle", "beacon", "canyon", "orchid", "walrus", "saddle", "quartz", "raven",
        "tundra", "anchor",
    ];
    format!("{}-{}", r.pick(&ADJ), r.pick(&NOUN))
}
