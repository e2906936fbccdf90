//! The device buffers of a forward pass, grown as batches grow and kept between passes.

use cudarc::driver::CudaSlice;
use half::bf16;
use vortex_model::config::ModelConfig;

use crate::buf::Buf;
use crate::page_list::PageList;
use crate::sampling::{Draws, Masks};
use crate::{CudaError, Device};

/// The products' inputs (`h`, `attn_in`, `act`, `last`) hold 16-bit values stored as
/// [`crate::blas::Input`] says for the product that reads them: bf16, or scaled f16 for fp8
/// weights.
#[derive(Default)]
pub struct Scratch {
    pub tokens: Buf<u32>,
    pub pos: Buf<i32>,
    pub slots: Buf<u32>,
    pub last_rows: Buf<i32>,
    pub tiles: Buf<i32>,
    /// The residual stream, f32 `[rows][hidden]`.
    pub x: Buf<f32>,
    /// Normalised rows, the input of a projection.
    pub h: Buf<bf16>,
    pub qkv: Buf<f32>,
    /// Exactly `[rows][hq][d]` of a decode pass: the decode kernels check their sizes. A
    /// decode pass's attention writes `attn_in` itself.
    pub q: Buf<f32>,
    /// The same for prefill passes (at least their rows), apart so that an engine step of a
    /// prefill pass and a decode pass keeps both where they are, and the prefill attention's f32
    /// output.
    pub q_prefill: Buf<f32>,
    pub attn_prefill: Buf<f32>,
    /// A sublayer's output before its norm joins it to the residual stream (Gemma 3), f32
    /// `[rows][hidden]`.
    pub post: Buf<f32>,
    pub attn_in: Buf<bf16>,
    pub gu: Buf<f32>,
    pub act: Buf<bf16>,
    pub last: Buf<bf16>,
    pub logits: Buf<f32>,
    pub next: Buf<u32>,
    /// How the tokens drawn into `next` are chosen.
    pub draws: Draws,
    /// The token sets rows of `logits` are held to before a draw.
    pub masks: Masks,
    /// The pages the pass's tokens complete, for the cache phase of every layer.
    pub completed: PageList,
}

impl Scratch {
    /// Sizes every buffer for `n` rows of `seqs` sequences and copies the rows' inputs.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        &mut self,
        dev: &Device,
        cfg: &ModelConfig,
        n: usize,
        decode_only: bool,
        seqs: usize,
        tokens: &[u32],
        pos: &[i32],
        slots: &[u32],
        last_rows: &[i32],
    ) -> Result<(), CudaError> {
        self.tokens.load(dev, tokens)?;
        self.pos.load(dev, pos)?;
        self.slots.load(dev, slots)?;
        self.last_rows.load(dev, last_rows)?;
        self.size(dev, cfg, n, decode_only, seqs)
    }

    /// Allocates what a prefill pass of `n` rows of `seqs` sequences needs, ahead of it.
    pub fn reserve(
        &mut self,
        dev: &Device,
        cfg: &ModelConfig,
        n: usize,
        seqs: usize,
    ) -> Result<(), CudaError> {
        self.tokens.ensure(dev, n, false)?;
        self.pos.ensure(dev, n, false)?;
        self.slots.ensure(dev, seqs, false)?;
        self.last_rows.ensure(dev, seqs, false)?;
        self.size(dev, cfg, n, false, seqs)
    }

    fn size(
        &mut self,
        dev: &Device,
        cfg: &ModelConfig,
        n: usize,
        decode_only: bool,
        seqs: usize,
    ) -> Result<(), CudaError> {
        let (hq, hkv, d) = (cfg.heads_q, cfg.heads_kv, cfg.head_dim);
        // Saturating: a size past memory is refused by the allocation, not wrapped.
        let per_row = |width: usize| n.saturating_mul(width);
        let q_width = hq.saturating_mul(d);
        self.x.ensure(dev, per_row(cfg.hidden), false)?;
        self.h
            .ensure(dev, per_row(cfg.hidden.max(cfg.ffn)), false)?;
        self.qkv
            .ensure(dev, per_row((hq + 2 * hkv).saturating_mul(d)), false)?;
        if decode_only {
            self.q.ensure(dev, per_row(q_width), true)?;
        } else {
            self.q_prefill.ensure(dev, per_row(q_width), false)?;
            self.attn_prefill.ensure(dev, per_row(q_width), false)?;
        }
        self.attn_in.ensure(dev, per_row(q_width), false)?;
        self.gu
            .ensure(dev, per_row(cfg.ffn.saturating_mul(2)), false)?;
        self.act.ensure(dev, per_row(cfg.ffn), false)?;
        if cfg.gemma.is_some() {
            self.post.ensure(dev, per_row(cfg.hidden), false)?;
        }
        self.last
            .ensure(dev, seqs.saturating_mul(cfg.hidden), false)?;
        self.logits
            .ensure(dev, seqs.saturating_mul(cfg.vocab), false)?;
        self.next.ensure(dev, seqs, false)?;
        Ok(())
    }

    /// Device addresses of the buffers a decode pass reads or writes.
    pub fn addresses(&self, dev: &Device) -> Vec<u64> {
        let a = |b: &Option<CudaSlice<f32>>| b.as_ref().map_or(0, |b| crate::address(dev, b));
        let h = |b: &Option<CudaSlice<bf16>>| b.as_ref().map_or(0, |b| crate::address(dev, b));
        let u = |b: &Option<CudaSlice<u32>>| b.as_ref().map_or(0, |b| crate::address(dev, b));
        let i = |b: &Option<CudaSlice<i32>>| b.as_ref().map_or(0, |b| crate::address(dev, b));
        vec![
            u(&self.tokens.0),
            i(&self.pos.0),
            u(&self.slots.0),
            i(&self.last_rows.0),
            a(&self.x.0),
            h(&self.h.0),
            a(&self.qkv.0),
            a(&self.q.0),
            h(&self.attn_in.0),
            a(&self.gu.0),
            h(&self.act.0),
            h(&self.last.0),
            a(&self.logits.0),
            a(&self.post.0),
        ]
    }

    pub fn load_tiles(&mut self, dev: &Device, tiles: &[i32]) -> Result<(), CudaError> {
        self.tiles.load(dev, tiles)
    }
}
