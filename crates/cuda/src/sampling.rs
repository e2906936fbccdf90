//! Choosing tokens where the logits are: the argmax of each row, or draws at a temperature over
//! the tokens that top-k, top-p and min-p keep ([`DeviceDraw`]), with only the ids copied back.
//! A row is read by a cluster of [`SPLIT`] blocks where the device has clusters. Plain draws
//! from 16 rows of 151,936 logits on an H200, and with top-p 0.9: one block a row 73 and 240 us,
//! clusters of 2 blocks 40 and 137, of 4 24 and 92, of 8 29 and 129 (blocks of 512 or 256
//! threads were slower in clusters of 4 and 8).

use std::sync::LazyLock;

use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, ValidAsZeroBits};
use vortex_model::sampling::{DeviceDraw, SamplingParams};

use crate::buf::Buf;
use crate::compile::{ModuleSpec, build};
use crate::launch::{CLUSTER, RawArgs, launch, launch_in_clusters};
use crate::{CudaError, Device};

static SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{CLUSTER}\n{}", include_str!("kernels/sampling.cu")));

/// Threads of a row's block.
const THREADS: u32 = 1024;
/// Buckets a cut's search splits a span of logits into.
const BINS: usize = 1024;
/// Blocks a row is split over, in one cluster.
pub const SPLIT: u32 = 4;

pub fn module_spec() -> ModuleSpec<'static> {
    ModuleSpec {
        name: "sampling.cu",
        source: SOURCE.as_str(),
        defines: vec![("SAMPLE_BINS", BINS.to_string())],
    }
}

pub struct SamplingKernels {
    argmax: CudaFunction,
    draw: CudaFunction,
    mask: CudaFunction,
}

/// One draw as the kernel reads it (`DrawArgs` in `sampling.cu`).
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct DrawArgs {
    /// The row of logits it draws from.
    row: i32,
    /// 1 / temperature, or 0 for the argmax.
    inv_t: f32,
    /// 0 keeps every token.
    top_k: u32,
    top_p: f32,
    min_p: f32,
    _pad: u32,
    seed: u64,
}

const _: () = assert!(size_of::<DrawArgs>() == 32);
// SAFETY: plain `repr(C)` numbers, the layout the kernel declares.
unsafe impl DeviceRepr for DrawArgs {}
// SAFETY: all-zero numbers are a valid value.
unsafe impl ValidAsZeroBits for DrawArgs {}

/// The draws of one launch on the device: for each, its row of logits and how to choose.
#[derive(Default)]
pub struct Draws {
    args: Buf<DrawArgs>,
    len: usize,
    /// One past the largest row.
    rows_read: usize,
}

impl Draws {
    /// Copies `picks` (row, draw) to the device in one copy; a temperature of 0 picks the
    /// row's argmax.
    pub fn load(&mut self, dev: &Device, picks: &[(usize, DeviceDraw)]) -> Result<(), CudaError> {
        let args = picks
            .iter()
            .map(|&(row, d)| {
                let params = SamplingParams {
                    temperature: d.temperature,
                    top_k: d.top_k,
                    top_p: d.top_p,
                    min_p: d.min_p,
                    ..SamplingParams::default()
                };
                params
                    .validate()
                    .map_err(|e| CudaError::Invalid(format!("a draw out of range ({e}): {d:?}")))?;
                let row = i32::try_from(row)
                    .map_err(|_| CudaError::Invalid(format!("a draw from row {row}")))?;
                Ok(DrawArgs {
                    row,
                    inv_t: if d.temperature > 0.0 {
                        1.0 / d.temperature
                    } else {
                        0.0
                    },
                    // A top-k past any vocabulary keeps every token, as 0 does.
                    top_k: u32::try_from(d.top_k).unwrap_or(0),
                    top_p: d.top_p,
                    min_p: d.min_p,
                    _pad: 0,
                    seed: d.seed,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        self.args.load(dev, &args)?;
        self.len = picks.len();
        self.rows_read = picks.iter().map(|p| p.0 + 1).max().unwrap_or(0);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Blocks a masked row's logits are split over.
const MASK_SLICES: u32 = 16;

/// Token sets on the device, for [`SamplingKernels::mask`]: for each, the row of logits it
/// holds to it.
#[derive(Default)]
pub struct Masks {
    rows: Buf<i32>,
    bits: Buf<u64>,
    len: usize,
    words: usize,
    /// One past the largest row.
    rows_read: usize,
}

impl Masks {
    /// Copies `masks` (row, the set's words, `vocab.div_ceil(64)` each) to the device.
    pub fn load(
        &mut self,
        dev: &Device,
        vocab: usize,
        masks: &[(usize, &[u64])],
    ) -> Result<(), CudaError> {
        let words = vocab.div_ceil(64);
        let mut rows = Vec::with_capacity(masks.len());
        let mut bits = Vec::with_capacity(masks.len() * words);
        for &(row, set) in masks {
            if set.len() != words {
                return Err(CudaError::Invalid(format!(
                    "a mask of {} words for a vocabulary of {vocab}",
                    set.len()
                )));
            }
            rows.push(
                i32::try_from(row)
                    .map_err(|_| CudaError::Invalid(format!("a mask for row {row}")))?,
            );
            bits.extend_from_slice(set);
        }
        self.rows.load(dev, &rows)?;
        self.bits.load(dev, &bits)?;
        self.len = masks.len();
        self.words = words;
        self.rows_read = masks.iter().map(|m| m.0 + 1).max().unwrap_or(0);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Launches `func` over `rows` rows, each split over a cluster where the device has them.
fn launch_rows(
    dev: &Device,
    func: &CudaFunction,
    rows: usize,
    args: &mut RawArgs,
) -> Result<(), CudaError> {
    // Rows are the grid's y, at most 65535.
    let rows = match u16::try_from(rows) {
        Ok(r) => u32::from(r),
        Err(_) => {
            return Err(CudaError::Invalid(format!(
                "{rows} rows to choose from at once (at most 65535)"
            )));
        }
    };
    let split = if dev.clusters { SPLIT } else { 1 };
    let cfg = LaunchConfig {
        grid_dim: (split, rows, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the callers pass the kernel's arguments in order and check its buffers' sizes;
    // the cluster divides the grid.
    unsafe {
        launch_in_clusters(
            dev,
            func,
            cfg,
            args,
            false,
            dev.clusters.then_some((split, 1, 1)),
        )
    }
}

impl SamplingKernels {
    pub fn new(dev: &Device) -> Result<Self, CudaError> {
        let built = build(dev, &module_spec())?;
        Ok(Self {
            argmax: built.function("argmax_rows")?,
            draw: built.function("draw_rows")?,
            mask: built.function("mask_rows")?,
        })
    }

    /// Sets the logits of each of `masks`' rows to -inf outside its token set (rows of `vocab`,
    /// `rows` of them).
    pub fn mask(
        &self,
        dev: &Device,
        logits: &mut CudaSlice<f32>,
        rows: usize,
        vocab: usize,
        masks: &Masks,
    ) -> Result<(), CudaError> {
        let n = masks.len;
        if n == 0 {
            return Ok(());
        }
        if logits.len() < rows * vocab
            || masks.rows_read > rows
            || masks.words != vocab.div_ceil(64)
        {
            return Err(CudaError::Invalid("mask: buffer sizes disagree".into()));
        }
        let mut args = RawArgs::default();
        args.buf(dev, logits)
            .i32(vocab as i32)
            .buf(dev, &masks.rows)
            .buf(dev, &masks.bits)
            .i32(masks.words as i32);
        let cfg = LaunchConfig {
            grid_dim: (MASK_SLICES, n as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments are the kernel's, in order; every row and mask is within its
        // buffer, checked above and by `Masks::load`.
        unsafe { launch(dev, &self.mask, cfg, &mut args, false) }
    }

    /// `out[r]` = the index of the largest of `logits[r]` (`rows` rows of `vocab`).
    pub fn argmax(
        &self,
        dev: &Device,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
        out: &mut CudaSlice<u32>,
    ) -> Result<(), CudaError> {
        if logits.len() < rows * vocab || out.len() < rows {
            return Err(CudaError::Invalid("argmax: buffer sizes disagree".into()));
        }
        if rows == 0 {
            return Ok(());
        }
        let mut args = RawArgs::default();
        args.buf(dev, logits).i32(vocab as i32).buf(dev, out);
        launch_rows(dev, &self.argmax, rows, &mut args)
    }

    /// `out[j]` = the token the `j`-th of `draws` chooses from its row of `logits` (rows of
    /// `vocab`, `rows` of them).
    pub fn draw(
        &self,
        dev: &Device,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
        draws: &Draws,
        out: &mut CudaSlice<u32>,
    ) -> Result<(), CudaError> {
        let n = draws.len;
        if logits.len() < rows * vocab || out.len() < n || draws.rows_read > rows {
            return Err(CudaError::Invalid("draw: buffer sizes disagree".into()));
        }
        if n == 0 {
            return Ok(());
        }
        let mut args = RawArgs::default();
        args.buf(dev, logits)
            .i32(vocab as i32)
            .buf(dev, &draws.args)
            .buf(dev, out);
        // Every draw's row is within `logits`, checked above.
        launch_rows(dev, &self.draw, n, &mut args)
    }
}
