//! Length distributions for prompts and outputs: `4096`, `2048:4096`, `128,1k:2k`.

use std::fmt;

use rand::Rng;

use crate::bench_attention::parse_tokens;

/// Token counts drawn per request. Each comma-separated item is a fixed count or an inclusive
/// uniform range `lo:hi`; a request picks one item uniformly, then a count within it.
#[derive(Clone, Debug, PartialEq)]
pub struct Dist {
    items: Vec<(usize, usize)>,
}

impl Dist {
    pub fn parse(s: &str) -> Result<Dist, String> {
        let mut items = Vec::new();
        for item in s.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(format!("'{s}': empty item in the list"));
            }
            let (lo, hi) = match item.split_once(':') {
                Some((a, b)) => (parse_tokens(a)?, parse_tokens(b)?),
                None => {
                    let n = parse_tokens(item)?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(format!(
                    "'{item}': the range's low end is above its high end"
                ));
            }
            items.push((lo, hi));
        }
        Ok(Dist { items })
    }

    /// The largest length it draws.
    pub fn max(&self) -> usize {
        self.items.iter().map(|&(_, hi)| hi).max().unwrap_or(0)
    }

    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        let (lo, hi) = self.items[rng.random_range(0..self.items.len())];
        rng.random_range(lo..=hi)
    }
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}:{hi}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{SeedableRng, rngs::StdRng};

    #[test]
    fn fixed_range_and_list() {
        assert_eq!(Dist::parse("4096").unwrap().items, vec![(4096, 4096)]);
        assert_eq!(Dist::parse("2k:4k").unwrap().items, vec![(2048, 4096)]);
        assert_eq!(
            Dist::parse("128, 256,1:8").unwrap().items,
            vec![(128, 128), (256, 256), (1, 8)]
        );
        assert_eq!(Dist::parse("128,1:8").unwrap().to_string(), "128,1:8");
    }

    #[test]
    fn malformed() {
        for bad in [
            "", "0", "-5", "abc", "10:", ":10", "8:4", "1,,2", "1:2:3", "1.5",
        ] {
            assert!(Dist::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn samples_stay_in_range_and_cover_it() {
        let d = Dist::parse("10:20,100").unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let xs: Vec<usize> = (0..2000).map(|_| d.sample(&mut rng)).collect();
        assert!(xs.iter().all(|&x| (10..=20).contains(&x) || x == 100));
        assert!(xs.contains(&10) && xs.contains(&20) && xs.contains(&100));
        let fixed = xs.iter().filter(|&&x| x == 100).count();
        assert!((800..1200).contains(&fixed), "{fixed}");
    }
}
