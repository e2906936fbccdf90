//! Where an engine's forward passes run ([`ForwardPass`]: the CPU model, or a device backend
//! with its own weights and pool), and what a pass is asked for and gives back per sequence.

use std::sync::Arc;

use vortex_flow::Flow;
use vortex_kv::Sequence;

use crate::grammar::TokenSet;
use crate::logprob::TokenLogprob;
use crate::model::{ForwardError, KvState, Model, SeqStep};
use crate::sampling::DeviceDraw;

/// Where an engine's forward passes run: the CPU model itself ([`CpuPass`]) or a device
/// backend that keeps its own copy of the weights and KV pool, indexed by the same pages.
pub trait ForwardPass: Send {
    /// [`Model::forward`]'s contract: appends each sequence's tokens (pages from `kv`'s
    /// allocator) and returns, for each sequence's last new token, what `wants` asks of it (one
    /// entry a sequence). A pass may give logits where less was asked.
    fn forward(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        wants: &[Wants],
    ) -> Result<Vec<Next>, ForwardError>;

    /// Loads `flow` beside those loaded before, for the requests that choose it (its index is
    /// the next), with its cache phase over the complete pages of `seqs`. A pass that keeps no
    /// flow of its own (the CPU's, which reads the engine's) keeps this default.
    fn load_flow(&mut self, _flow: &Flow, _seqs: &[&Sequence]) -> Result<(), String> {
        Ok(())
    }

    /// Whether the pass gives the logits of prompt rows ([`forward_scoring`](Self::forward_scoring)).
    fn scores_prompts(&self) -> bool {
        false
    }

    /// [`forward`](Self::forward), scoring also the prompt rows `scored` asks for: their
    /// log-probabilities, an entry of `scored` each, as [`Model::forward_scoring`] gives them.
    /// A pass that does not [`scores_prompts`](Self::scores_prompts) keeps this default.
    fn forward_scoring(
        &mut self,
        _model: &Model,
        _kv: &mut KvState,
        _batch: &mut [SeqStep],
        _wants: &[Wants],
        _scored: &[PromptRows],
    ) -> Result<Scored, ForwardError> {
        Err(ForwardError::Backend(
            "this forward pass does not give the logits of prompt rows".into(),
        ))
    }

    /// Whether the pass takes [`Wants::Scored`]: log-probabilities where the logits are, so
    /// that a request asking for them need not copy its logits back.
    fn scores_logprobs(&self) -> bool {
        false
    }

    /// Whether the pass can choose a token as `wants` asks on its device, ahead of the host
    /// (see [`queue_decode`](Self::queue_decode)). A pass that cannot keeps this default.
    fn picks_ahead(&self, _wants: &Wants) -> bool {
        false
    }

    /// Whether [`pick_ahead`](Self::pick_ahead) takes [`Wants::MaskedDraw`]: a draw under a
    /// grammar's mask, which the engine can only make once the token before it is back, while
    /// the pass queued on that token runs.
    fn masks_ahead(&self) -> bool {
        false
    }

    /// Decoding ahead of the host: queues a decode pass (one new token a sequence, appended
    /// as [`forward`](Self::forward) appends) and returns before it runs. With `picked`, each
    /// sequence's token is the one the last [`pick_ahead`](Self::pick_ahead) chose for it: the
    /// batch must be that pass's sequences in the same order, and its tokens are not read.
    fn queue_decode(
        &mut self,
        _model: &Model,
        _kv: &mut KvState,
        _batch: &mut [SeqStep],
        _picked: bool,
    ) -> Result<(), ForwardError> {
        Err(no_ahead())
    }

    /// Chooses the next token of each sequence of the last queued pass on the device, as
    /// `wants` say (one each, all of a kind [`picks_ahead`](Self::picks_ahead) accepts), for
    /// the next [`queue_decode`](Self::queue_decode) to take. Returns at once.
    fn pick_ahead(&mut self, _wants: &[Wants]) -> Result<(), ForwardError> {
        Err(no_ahead())
    }

    /// The picks of the last [`pick_ahead`](Self::pick_ahead), once they are back: a
    /// [`Next::Token`] a row, or [`Next::Scored`] where it asked for [`Wants::Scored`]. A pass
    /// queued since has taken their tokens; no pass queued later will.
    fn picked(&mut self) -> Result<Vec<Next>, ForwardError> {
        Err(no_ahead())
    }

    /// Forgets tokens picked ahead that no pass will take (the engine failed the requests
    /// they were for), so that the next pass reads its own.
    fn discard_ahead(&mut self) {}

    /// Where the passes run, for messages (`cpu`, `cuda:0`).
    fn device(&self) -> String {
        "cpu".into()
    }
}

fn no_ahead() -> ForwardError {
    ForwardError::Backend("this forward pass does not decode ahead of the host".into())
}

/// Forward passes on the CPU, through [`Model::forward`].
pub struct CpuPass;

impl ForwardPass for CpuPass {
    fn forward(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        _wants: &[Wants],
    ) -> Result<Vec<Next>, ForwardError> {
        Ok(model
            .forward(kv, batch)?
            .into_iter()
            .map(Next::Logits)
            .collect())
    }

    fn scores_prompts(&self) -> bool {
        true
    }

    fn forward_scoring(
        &mut self,
        model: &Model,
        kv: &mut KvState,
        batch: &mut [SeqStep],
        _wants: &[Wants],
        scored: &[PromptRows],
    ) -> Result<Scored, ForwardError> {
        let (logits, scores) = model.forward_scoring(kv, batch, scored)?;
        let next = logits.into_iter().map(Next::Logits).collect();
        Ok((next, scores))
    }
}

/// What the caller needs of a sequence's last new token after a pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Wants {
    /// Its logits, for a sampler.
    Logits,
    /// Only its most likely token (greedy decoding with nothing that changes the logits): a
    /// device can choose it where the logits are and copy back one id.
    Argmax,
    /// A token drawn as the [`DeviceDraw`] says, with nothing that changes the logits first: a
    /// device can draw it where the logits are.
    Draw(DeviceDraw),
    /// The [`DeviceDraw`] from only the tokens of the set (a reply held to a grammar; the set
    /// follows the token before, so it is picked ahead only once that token is back: see
    /// [`ForwardPass::masks_ahead`]).
    MaskedDraw(DeviceDraw, Arc<TokenSet>),
    /// The pick the inner `Wants` says (`Argmax`, `Draw` or `MaskedDraw`) and the
    /// log-probabilities of the logits as the model gave them (before a mask): the picked
    /// token's and the `usize` most likely tokens' (a request that asks for `logprobs`, on a
    /// pass that [`scores_logprobs`](ForwardPass::scores_logprobs)).
    Scored(Box<Wants>, usize),
    /// Nothing (a prompt chunk before the last, a token recomputed after a preemption).
    Nothing,
}

impl Wants {
    /// The token to choose on the device, for the rows a device may pick ([`Wants::Argmax`],
    /// [`Wants::Draw`]).
    pub fn device_pick(&self) -> Option<DeviceDraw> {
        match *self {
            Wants::Argmax => Some(DeviceDraw::ARGMAX),
            Wants::Draw(d) => Some(d),
            Wants::MaskedDraw(..) | Wants::Scored(..) | Wants::Logits | Wants::Nothing => None,
        }
    }
}

/// A sequence's prompt rows to score in a pass: its first `next.len()` new rows, row `r`
/// followed by prompt token `next[r]`, with the `top` most likely tokens of each.
#[derive(Debug, Clone, Copy)]
pub struct PromptRows<'a> {
    /// Its index in the batch.
    pub seq: usize,
    pub next: &'a [u32],
    pub top: usize,
}

/// What [`ForwardPass::forward_scoring`] gives: a [`Next`] a sequence, and the scores of each
/// [`PromptRows`], a row each.
pub type Scored = (Vec<Next>, Vec<Vec<TokenLogprob>>);

/// What a pass gives for a sequence's last new token.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Logits(Vec<f32>),
    /// The token chosen as asked: the argmax (the lowest id among equals), or the draw.
    Token(u32),
    /// The token chosen as a [`Wants::Scored`] asks, with its log-probability and the most
    /// likely tokens' (id, log-probability), most likely first, lower ids first among equals.
    Scored {
        token: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
    },
    Nothing,
}
