//! Where a sampler's next token may be chosen: on a device, where the logits are, when nothing
//! the host applies would change them (only the argmax, a draw, or a draw under a grammar's
//! mask), and how.

use super::{DeviceDraw, GREEDY_BELOW, Sampler, splitmix};
use crate::grammar::TokenSet;

impl Sampler {
    /// Whether the next token is the argmax of the logits, whatever they are: greedy, with no
    /// penalty or bias to apply first (so a device can pick it where the logits are).
    pub fn is_plain_greedy(&self) -> bool {
        self.params.temperature < GREEDY_BELOW && self.unchanged(0) && self.constraint.is_none()
    }

    /// For sampling with nothing that changes the logits (no penalty or bias): how a device
    /// that draws where the logits are draws this sequence's next token, its noise seeded from
    /// the request's seed and the number of tokens drawn so far. Its draws follow the same
    /// distribution as [`sample`](Self::sample)'s, from other random numbers.
    pub fn device_draw(&self) -> Option<DeviceDraw> {
        self.device_draw_after(0)
    }

    /// [`device_draw`](Self::device_draw) for the draw after `unrecorded` more tokens: those
    /// chosen on a device ahead of the host and not recorded yet.
    pub fn device_draw_after(&self, unrecorded: u64) -> Option<DeviceDraw> {
        let drawn = self.params.temperature >= GREEDY_BELOW
            && self.unchanged(unrecorded)
            && self.constraint.is_none();
        drawn.then(|| self.draw_after(unrecorded))
    }

    /// For a request held to a grammar, with nothing else that changes the logits: the tokens
    /// the grammar allows next, and how a device chooses among them ([`DeviceDraw::ARGMAX`]
    /// when greedy). The choice must be recorded before the next call.
    pub fn masked_device_draw(&mut self) -> Option<(DeviceDraw, TokenSet)> {
        if !self.picks_under_mask() {
            return None;
        }
        let draw = if self.params.temperature < GREEDY_BELOW {
            DeviceDraw::ARGMAX
        } else {
            self.draw_after(0)
        };
        Some((draw, self.constraint.as_mut()?.allowed().clone()))
    }

    /// Whether the request is held to a grammar and nothing else changes its logits, so that
    /// a device may choose its token from the logits under the grammar's mask.
    pub fn picks_under_mask(&self) -> bool {
        self.constraint.is_some() && self.unchanged(0)
    }

    /// Whether the request is held to a grammar.
    pub fn is_held(&self) -> bool {
        self.constraint.is_some()
    }

    /// Whether, once one more token is recorded (one chosen ahead of the host), a device may
    /// choose the token after it under the grammar's mask, whatever that token is: the request
    /// is held to a grammar and nothing else will change its logits then.
    pub fn picks_under_mask_next(&self) -> bool {
        self.constraint.is_some() && self.unpenalized() && !self.min_tokens_ahead(1)
    }

    /// Whether `token` may come next: any token, unless the request is held to a grammar.
    pub fn allows(&mut self, token: u32) -> bool {
        self.constraint
            .as_mut()
            .is_none_or(|c| c.allowed().contains(token))
    }

    /// Whether no penalty, bias or held-off end token changes the logits of the draw after
    /// `unrecorded` more tokens.
    fn unchanged(&self, unrecorded: u64) -> bool {
        self.unpenalized() && !self.banning(unrecorded)
    }

    /// Whether no penalty or bias applies to the logits.
    fn unpenalized(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty == 1.0
            && p.frequency_penalty == 0.0
            && p.presence_penalty == 0.0
            && p.logit_bias.is_empty()
    }

    /// The device's draw after `unrecorded` more tokens, its noise seeded from the request's
    /// seed and the number of tokens drawn before it.
    fn draw_after(&self, unrecorded: u64) -> DeviceDraw {
        let p = &self.params;
        let draw = self.draws.wrapping_add(unrecorded);
        DeviceDraw {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            seed: splitmix(splitmix(p.seed) ^ draw.wrapping_mul(0xD6E8_FEB8_6659_FD93)),
        }
    }
}
