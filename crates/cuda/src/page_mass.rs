//! Exact attention mass on each page of a row (`kernels/page_mass.cu`): each query head's
//! softmax over every token of its sequence, summed per page over the KV head's group, and the
//! recall of the pages a selection kept against it (`vortex serve --recall-every`), all on the
//! device.

use std::sync::LazyLock;

use cudarc::driver::{CudaFunction, CudaSlice, CudaViewMut, LaunchConfig, PushKernelArg};
use vortex_kv::KvGeometry;

use crate::buf::Buf;
use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::kv_pool::KV_ELEM;
use crate::{CudaError, Device, DeviceTable, GpuLayerKv, MMA, MMA_KEYS, PoolDtype};

static SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{KV_ELEM}\n{MMA}\n{MMA_KEYS}\n{}",
        include_str!("kernels/page_mass.cu")
    )
});

/// Threads of a block (`PM_THREADS`).
const THREADS: u32 = 256;
/// A block's logits stay within this many bytes of static shared memory, its queries beside.
const LOGIT_BYTES: usize = 32 << 10;
/// Tokens a block scores at most on the CUDA cores, so that short rows still spread over many
/// blocks.
const CHUNK_TOKENS: usize = 1024;
/// Tokens a block scores on the tensor cores, whose scores stay in registers: 2,048 measured
/// 3-12% faster than 1,024 and 512 (BENCHMARKS.md).
const MMA_CHUNK_TOKENS: usize = 2048;
/// Scratch memory a measure takes by default (a row longer than it holds takes its own).
pub const SCRATCH_BYTES: usize = 32 << 20;

/// Whether `page_mass.cu` scores keys on the tensor cores (`PM_MMA`, within `mma_keys.cu`'s
/// MMA_KEYS condition) on a device of compute capability `capability`: head_dim 128 only.
pub fn tensor_core_masses(
    geom: KvGeometry,
    dtype: PoolDtype,
    group: usize,
    capability: (i32, i32),
) -> bool {
    let arch = match dtype {
        PoolDtype::Fp8 => (8, 9),
        PoolDtype::Bf16 => (8, 0),
    };
    (geom.head_dim, geom.page_size) == (128, 16) && (1..=8).contains(&group) && capability >= arch
}

/// Pages a block scores: [`MMA_CHUNK_TOKENS`] worth on the tensor cores (`mma`); on the CUDA
/// cores as many as its logits allow, at least one.
fn chunk_pages(geom: KvGeometry, group: usize, mma: bool) -> Result<usize, CudaError> {
    if mma {
        return Ok(MMA_CHUNK_TOKENS / geom.page_size);
    }
    let tokens = CHUNK_TOKENS.min(LOGIT_BYTES / 4 / group.max(1));
    let pages = (tokens / geom.page_size).max(1);
    let shared = 4 * group * (pages * geom.page_size + geom.head_dim + 1);
    if !geom.head_dim.is_multiple_of(8) || shared > 48 << 10 {
        return Err(CudaError::Unsupported(format!(
            "page masses for {group} query heads of {} per KV head over pages of {} tokens",
            geom.head_dim, geom.page_size
        )));
    }
    Ok(pages)
}

/// The kernels' source for a geometry, element type and group, on a device of compute
/// capability `capability`.
pub fn module_spec(
    geom: KvGeometry,
    dtype: PoolDtype,
    group: usize,
    capability: (i32, i32),
) -> Result<ModuleSpec<'static>, CudaError> {
    let mma = tensor_core_masses(geom, dtype, group, capability);
    Ok(ModuleSpec {
        name: "page_mass.cu",
        source: SOURCE.as_str(),
        defines: vec![
            ("HEAD_DIM", geom.head_dim.to_string()),
            ("PAGE_SIZE", geom.page_size.to_string()),
            ("GROUP", group.to_string()),
            ("CHUNK_PAGES", chunk_pages(geom, group, mma)?.to_string()),
            ("PM_MMA", u8::from(mma).to_string()),
            dtype.define(),
        ],
    })
}

/// A row to measure: a sequence of the dense table, a KV head, and where the pages it kept lie
/// in the sparse table's indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeasuredRow {
    pub seq: u32,
    pub head: u32,
    pub kept_at: u32,
    pub kept: u32,
}

/// The page-mass kernels, built for one pool geometry, element type and group.
pub struct PageMass {
    part: CudaFunction,
    sum: CudaFunction,
    recall: CudaFunction,
    geom: KvGeometry,
    dtype: PoolDtype,
    group: usize,
    chunk_pages: usize,
}

/// Scratch memory of [`PageMass::measure`], kept between measured steps: its rows, and for a
/// batch of them the raw page sums, the masses and each page's largest logits, in turn.
pub struct MassScratch {
    rows: Buf<u32>,
    work: Buf<f32>,
    /// Bytes of `work` a batch may take.
    budget: usize,
    /// The last batch: its first row, rows, stride, and where its masses start in `work`.
    last: (usize, usize, usize, usize),
}

impl PageMass {
    pub fn new(
        dev: &Device,
        geom: KvGeometry,
        dtype: PoolDtype,
        group: usize,
    ) -> Result<Self, CudaError> {
        let capability = dev.capability;
        let built = build(dev, &module_spec(geom, dtype, group, capability)?)?;
        Ok(Self {
            part: built.function("page_mass_part")?,
            sum: built.function("page_mass_sum")?,
            recall: built.function("page_mass_recall")?,
            geom,
            dtype,
            group,
            chunk_pages: chunk_pages(
                geom,
                group,
                tensor_core_masses(geom, dtype, group, capability),
            )?,
        })
    }

    /// For each of `rows` (a sequence of `dense`, one query per sequence in `q`, a KV head and
    /// its kept pages in `sparse`), its mass recall and top-k recall into `recall` (two values a
    /// row; see `page_mass_recall`). Returns `stride`, the most pages of the rows' sequences;
    /// the last batch's masses stay in `scratch` ([`MassScratch::masses`]), each row's adding
    /// up to the group's size.
    #[allow(clippy::too_many_arguments)]
    pub fn measure(
        &self,
        dev: &Device,
        kv: &GpuLayerKv,
        dense: &DeviceTable,
        q: &CudaSlice<f32>,
        scale: f32,
        sparse: &CudaSlice<u32>,
        rows: &[MeasuredRow],
        scratch: &mut MassScratch,
        recall: &mut CudaViewMut<f32>,
    ) -> Result<usize, CudaError> {
        let g = self.geom;
        if kv.geom != g || kv.dtype != self.dtype || dense.kv_heads != g.kv_heads {
            return Err(CudaError::Invalid(format!(
                "page-mass kernels built for {g:?} {} cannot read a {:?} {} pool",
                self.dtype, kv.geom, kv.dtype
            )));
        }
        if dense.rows_per_seq != 1
            || dense.num_pages > kv.num_pages
            || q.len() != dense.batch * g.kv_heads * self.group * g.head_dim
        {
            return Err(CudaError::Invalid(
                "page masses need the dense table of the pool and one query per sequence".into(),
            ));
        }
        if let Some(r) = rows.iter().find(|r| {
            r.seq as usize >= dense.batch
                || r.head as usize >= g.kv_heads
                || r.kept_at as usize + r.kept as usize > sparse.len()
        }) {
            return Err(CudaError::Invalid(format!(
                "measuring {r:?} in a step of {} sequences, {} KV heads and {} kept pages",
                dense.batch,
                g.kv_heads,
                sparse.len()
            )));
        }
        if recall.len() < 2 * rows.len() {
            return Err(CudaError::Invalid(
                "a recall buffer smaller than the rows".into(),
            ));
        }
        let stride = rows
            .iter()
            .map(|r| dense.row_pages[r.seq as usize] as usize)
            .max()
            .unwrap_or(0);
        if rows.is_empty() {
            return Ok(0);
        }
        if stride == 0 {
            return Err(CudaError::Invalid(
                "measuring the rows of sequences with no pages".into(),
            ));
        }
        let chunks = stride.div_ceil(self.chunk_pages) as u32;
        let flat: Vec<u32> = rows
            .iter()
            .flat_map(|r| [r.seq, r.head, r.kept_at, r.kept])
            .collect();
        scratch.rows.load(dev, &flat)?;
        // Rows go in batches whose masses fit the scratch memory: raw sums, masses, and each
        // page's largest logits.
        let raw_len = self.group * stride;
        let per_row = 2 * raw_len + stride;
        let batch = (scratch.budget / 4 / per_row).clamp(1, rows.len());
        scratch.work.ensure(dev, batch * per_row, false)?;
        let (heads, stride_i) = (g.kv_heads as i32, stride as i32);
        let s = &dev.stream;
        for first in (0..rows.len()).step_by(batch) {
            let n = batch.min(rows.len() - first);
            let first_i = first as i32;
            let (mut raw, mut rest) = scratch.work.split_at_mut(n * raw_len);
            let (mut mass, mut rest) = rest.split_at_mut(n * stride);
            let (mut page_max, _) = rest.split_at_mut(n * raw_len);
            let mut l = s.launch_builder(&self.part);
            l.arg(&kv.k)
                .arg(&dense.indptr)
                .arg(&dense.indices)
                .arg(&dense.last_page_len)
                .arg(q)
                .arg(&*scratch.rows)
                .arg(&first_i)
                .arg(&heads)
                .arg(&scale)
                .arg(&stride_i)
                .arg(&mut page_max)
                .arg(&mut raw);
            let cfg = LaunchConfig {
                grid_dim: (n as u32, chunks, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: argument types match the kernel; the rows, table and queries were
            // checked above and the views hold `n` rows of `stride` pages.
            unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(page_mass_part)"))?;
            let mut l = s.launch_builder(&self.sum);
            l.arg(&dense.indptr)
                .arg(&*scratch.rows)
                .arg(&first_i)
                .arg(&mut page_max)
                .arg(&mut raw)
                .arg(&stride_i)
                .arg(&mut mass);
            let cfg = LaunchConfig {
                grid_dim: (n as u32, 1, 1),
                ..cfg
            };
            // SAFETY: as above.
            unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(page_mass_sum)"))?;
            let mut l = s.launch_builder(&self.recall);
            l.arg(&dense.indptr)
                .arg(&dense.indices)
                .arg(&*scratch.rows)
                .arg(&first_i)
                .arg(&mut mass)
                .arg(&stride_i)
                .arg(sparse)
                .arg(&mut *recall);
            // SAFETY: as above; each row's kept pages lie within `sparse`, and `recall` holds
            // two values for each row.
            unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(page_mass_recall)"))?;
            scratch.last = (first, n, stride, n * raw_len);
        }
        Ok(stride)
    }
}

impl Default for MassScratch {
    fn default() -> Self {
        Self::with_budget(SCRATCH_BYTES)
    }
}

impl MassScratch {
    /// Scratch whose batches take at most `budget` bytes (at least a row).
    pub fn with_budget(budget: usize) -> Self {
        Self {
            rows: Buf::default(),
            work: Buf::default(),
            budget,
            last: (0, 0, 0, 0),
        }
    }

    /// Takes the scratch memory now, so that measuring later allocates nothing (longer rows
    /// than it holds one at a time excepted).
    pub fn reserve(&mut self, dev: &Device) -> Result<(), CudaError> {
        self.work.ensure(dev, self.budget / 4, false)
    }

    /// The masses of the last batch of the last [`PageMass::measure`]: its first row, and its
    /// rows' masses, `stride` (what `measure` returned) a row.
    pub fn masses(&self, dev: &Device) -> Result<(usize, Vec<f32>), CudaError> {
        let (first, rows, stride, at) = self.last;
        if rows * stride == 0 {
            return Ok((first, Vec::new()));
        }
        let masses = dev
            .stream
            .clone_dtoh(&self.work.slice(at..at + rows * stride))
            .map_err(driver("cuMemcpyDtoH"))?;
        Ok((first, masses))
    }
}

#[cfg(test)]
mod tests {
    use super::{chunk_pages, tensor_core_masses};
    use crate::PoolDtype::{Bf16, Fp8};
    use vortex_kv::KvGeometry;

    /// Keys of head_dim 128 in pages of 16, up to 8 query heads per KV head, go to the tensor
    /// cores where the pool's element type can (bf16 from compute capability 8.0, fp8 from
    /// 8.9), in blocks of 2,048 tokens; the rest to the CUDA cores, in blocks of at most 1,024.
    #[test]
    fn tensor_core_masses_where_the_keys_fit_the_tiles() {
        let g = KvGeometry::new(8, 128, 16).unwrap();
        for group in 1..=8 {
            assert!(tensor_core_masses(g, Bf16, group, (8, 0)));
            assert!(tensor_core_masses(g, Fp8, group, (9, 0)));
            assert!(!tensor_core_masses(g, Fp8, group, (8, 6)));
        }
        assert!(!tensor_core_masses(g, Bf16, 16, (9, 0)));
        assert!(!tensor_core_masses(g, Bf16, 4, (7, 5)));
        for other in [
            KvGeometry::new(8, 64, 16).unwrap(),
            KvGeometry::new(8, 128, 32).unwrap(),
        ] {
            assert!(!tensor_core_masses(other, Bf16, 4, (9, 0)));
        }
        assert_eq!(chunk_pages(g, 4, true).unwrap(), 128);
        assert_eq!(chunk_pages(g, 4, false).unwrap(), 64);
        assert_eq!(chunk_pages(g, 16, false).unwrap(), 32);
    }
}
