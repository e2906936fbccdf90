//! Log-probabilities where the logits are (`kernels/logprobs.cu`), for requests that ask for
//! them: each row's log-sum-exp and best tokens are taken from its raw logits before a mask or
//! a draw ([`RowLogprobs::queue`]), the drawn token's after it ([`RowLogprobs::finish`]), and
//! only those numbers come back, not the row.

use std::sync::LazyLock;

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, LaunchConfig, PushKernelArg};

use crate::buf::Buf;
use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::{CudaError, Device};

static SOURCE: LazyLock<String> = LazyLock::new(|| include_str!("kernels/logprobs.cu").into());

/// Threads of a row's block (`LP_THREADS`).
const THREADS: u32 = 512;

pub fn module_spec() -> ModuleSpec<'static> {
    ModuleSpec {
        name: "logprobs.cu",
        source: SOURCE.as_str(),
        defines: Vec::new(),
    }
}

/// One row's log-probabilities: the drawn token's, and the best tokens' (id, log-probability),
/// best first, lower ids first among equals.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    pub token: f32,
    pub top: Vec<(u32, f32)>,
}

pub struct LogprobKernels {
    rows_fn: CudaFunction,
    chosen_fn: CudaFunction,
}

/// The device buffers of one pass's log-probabilities.
#[derive(Default)]
pub struct RowLogprobs {
    rows: Buf<i32>,
    lse: Buf<f32>,
    top_ids: Buf<u32>,
    top_lp: Buf<f32>,
    pick_of: Buf<i32>,
    chosen: Buf<f32>,
    /// Rows queued, and the best tokens of each.
    n: usize,
    top: usize,
}

impl LogprobKernels {
    pub fn new(dev: &Device) -> Result<Self, CudaError> {
        let built = build(dev, &module_spec())?;
        Ok(Self {
            rows_fn: built.function("logprob_rows")?,
            chosen_fn: built.function("chosen_logprobs")?,
        })
    }
}

impl RowLogprobs {
    /// Queues the log-sum-exp and the `top` best tokens of each of `rows` (of `logits`, rows of
    /// `vocab`), from the logits as they are now.
    pub fn queue(
        &mut self,
        dev: &Device,
        k: &LogprobKernels,
        logits: &CudaSlice<f32>,
        vocab: usize,
        rows: &[usize],
        top: usize,
    ) -> Result<(), CudaError> {
        self.n = rows.len();
        self.top = top;
        if rows.is_empty() {
            return Ok(());
        }
        if rows.iter().any(|&r| (r + 1) * vocab > logits.len()) {
            return Err(CudaError::Invalid(
                "log-probabilities of a row past the logits".into(),
            ));
        }
        let ids: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        self.rows.load(dev, &ids)?;
        self.lse.ensure(dev, rows.len(), false)?;
        self.top_ids.ensure(dev, rows.len() * top, false)?;
        self.top_lp.ensure(dev, rows.len() * top, false)?;
        let (vocab_i, top_i) = (vocab as i32, top as i32);
        let mut l = dev.stream.launch_builder(&k.rows_fn);
        l.arg(logits)
            .arg(&vocab_i)
            .arg(&*self.rows)
            .arg(&top_i)
            .arg(&mut *self.lse)
            .arg(&mut *self.top_ids)
            .arg(&mut *self.top_lp);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match the kernel; every row is within `logits` (checked) and
        // the outputs hold `rows * top` values.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(logprob_rows)"))?;
        Ok(())
    }

    /// Queues the drawn tokens' log-probabilities: row `j`'s token is `picks[pick_of[j]]`,
    /// read from `logits` (masked or not: a mask keeps the logits of the tokens it allows).
    pub fn queue_chosen(
        &mut self,
        dev: &Device,
        k: &LogprobKernels,
        logits: &CudaSlice<f32>,
        vocab: usize,
        picks: &CudaSlice<u32>,
        pick_of: &[usize],
    ) -> Result<(), CudaError> {
        let n = self.n;
        if pick_of.len() != n || pick_of.iter().any(|&p| p >= picks.len()) {
            return Err(CudaError::Invalid(
                "log-probabilities: picks do not match the rows queued".into(),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let p: Vec<i32> = pick_of.iter().map(|&p| p as i32).collect();
        self.pick_of.load(dev, &p)?;
        self.chosen.ensure(dev, n, false)?;
        let (vocab_i, n_i) = (vocab as i32, n as i32);
        let mut l = dev.stream.launch_builder(&k.chosen_fn);
        l.arg(logits)
            .arg(&vocab_i)
            .arg(&*self.rows)
            .arg(picks)
            .arg(&*self.pick_of)
            .arg(&*self.lse)
            .arg(&n_i)
            .arg(&mut *self.chosen);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(128) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match the kernel; `pick_of` indexes `picks` (checked).
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(chosen_logprobs)"))?;
        Ok(())
    }

    /// Rows queued, and the best tokens each.
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.top)
    }

    /// The device's results once [`queue_chosen`](Self::queue_chosen) ran: the drawn tokens'
    /// log-probabilities (one a row), and the best tokens' ids and log-probabilities (`top` a
    /// row).
    pub fn outputs(&self) -> (CudaView<'_, f32>, CudaView<'_, u32>, CudaView<'_, f32>) {
        let (n, top) = (self.n.max(1), self.top);
        (
            self.chosen.slice(..n),
            self.top_ids.slice(..(n * top).max(1)),
            self.top_lp.slice(..(n * top).max(1)),
        )
    }

    /// The queued rows' log-probabilities once their tokens are drawn, as
    /// [`queue_chosen`](Self::queue_chosen) takes them, copied back at once.
    pub fn finish(
        &mut self,
        dev: &Device,
        k: &LogprobKernels,
        logits: &CudaSlice<f32>,
        vocab: usize,
        picks: &CudaSlice<u32>,
        pick_of: &[usize],
    ) -> Result<Vec<Logprobs>, CudaError> {
        self.queue_chosen(dev, k, logits, vocab, picks, pick_of)?;
        let (n, top) = (self.n, self.top);
        if n == 0 {
            return Ok(Vec::new());
        }
        let (chosen, ids, lps) = self.outputs();
        let s = &dev.stream;
        let get = |e| driver("cuMemcpyDtoH")(e);
        Ok(assemble(
            &s.clone_dtoh(&chosen).map_err(get)?,
            &s.clone_dtoh(&ids).map_err(get)?,
            &s.clone_dtoh(&lps).map_err(get)?,
            n,
            top,
        ))
    }
}

/// `n` rows' [`Logprobs`] from the copied outputs of [`RowLogprobs::outputs`].
pub fn assemble(chosen: &[f32], ids: &[u32], lps: &[f32], n: usize, top: usize) -> Vec<Logprobs> {
    (0..n)
        .map(|j| Logprobs {
            token: chosen[j],
            top: (0..top)
                .map(|t| (ids[j * top + t], lps[j * top + t]))
                .collect(),
        })
        .collect()
}
