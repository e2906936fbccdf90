//! The device buffers of a forward pass, grown as batches grow and kept between passes.

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use half::bf16;
use vortex_model::config::ModelConfig;

use crate::error::driver;
use crate::page_list::PageList;
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
    pub attn_in: Buf<bf16>,
    pub gu: Buf<f32>,
    pub act: Buf<bf16>,
    pub last: Buf<bf16>,
    pub logits: Buf<f32>,
    pub next: Buf<u32>,
    /// The rows, inverse temperatures and seeds of the tokens drawn into `next`.
    pub draw_rows: Buf<i32>,
    pub draw_inv_t: Buf<f32>,
    pub draw_seeds: Buf<u64>,
    /// The pages the pass's tokens complete, for the cache phase of every layer.
    pub completed: PageList,
}

/// A device buffer that is reallocated only when a pass needs more (or, when `exact`, other).
pub struct Buf<T>(Option<CudaSlice<T>>);

impl<T> Default for Buf<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T> std::ops::Deref for Buf<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.0
            .as_ref()
            .expect("scratch buffers are sized before use")
    }
}

impl<T> std::ops::DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.0
            .as_mut()
            .expect("scratch buffers are sized before use")
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> Buf<T> {
    fn ensure(&mut self, dev: &Device, len: usize, exact: bool) -> Result<(), CudaError> {
        let len = len.max(1);
        let fits = self.0.as_ref().is_some_and(|b| {
            if exact {
                b.len() == len
            } else {
                b.len() >= len
            }
        });
        if !fits {
            self.0 = Some(dev.stream.alloc_zeros(len).map_err(driver("cuMemAlloc"))?);
        }
        Ok(())
    }

    fn load(&mut self, dev: &Device, data: &[T]) -> Result<(), CudaError> {
        self.ensure(dev, data.len(), false)?;
        if !data.is_empty() {
            let buf = self.0.as_mut().expect("just ensured");
            dev.upload(data, &mut buf.slice_mut(..data.len()))?;
        }
        Ok(())
    }
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
        self.x.ensure(dev, n * cfg.hidden, false)?;
        self.h.ensure(dev, n * cfg.hidden.max(cfg.ffn), false)?;
        self.qkv.ensure(dev, n * (hq + 2 * hkv) * d, false)?;
        if decode_only {
            self.q.ensure(dev, n * hq * d, true)?;
        } else {
            self.q_prefill.ensure(dev, n * hq * d, false)?;
            self.attn_prefill.ensure(dev, n * hq * d, false)?;
        }
        self.attn_in.ensure(dev, n * hq * d, false)?;
        self.gu.ensure(dev, n * 2 * cfg.ffn, false)?;
        self.act.ensure(dev, n * cfg.ffn, false)?;
        self.last.ensure(dev, seqs * cfg.hidden, false)?;
        self.logits.ensure(dev, seqs * cfg.vocab, false)?;
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
        ]
    }

    pub fn load_tiles(&mut self, dev: &Device, tiles: &[i32]) -> Result<(), CudaError> {
        self.tiles.load(dev, tiles)
    }

    /// Copies the draws' rows, inverse temperatures and seeds.
    pub fn load_draws(
        &mut self,
        dev: &Device,
        rows: &[i32],
        inv_t: &[f32],
        seeds: &[u64],
    ) -> Result<(), CudaError> {
        self.draw_rows.load(dev, rows)?;
        self.draw_inv_t.load(dev, inv_t)?;
        self.draw_seeds.load(dev, seeds)
    }
}
