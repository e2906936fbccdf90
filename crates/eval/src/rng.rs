//! A small deterministic generator (SplitMix64): the same seed gives the same samples on every
//! machine and in every version of the dependencies.

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator for one part of an evaluation, independent of the others.
    pub fn derive(seed: u64, parts: &[u64]) -> Self {
        let mut r = Self::new(seed);
        for &p in parts {
            r = Self::new(r.next_u64() ^ p.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A number of exactly `digits` decimal digits (no leading zero).
    pub fn number(&mut self, digits: u32) -> String {
        let lo = 10u64.pow(digits - 1);
        (lo + self.next_u64() % (9 * lo)).to_string()
    }

    /// `len` random capital letters.
    pub fn word(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| (b'A' + self.below(26) as u8) as char)
            .collect()
    }
}
