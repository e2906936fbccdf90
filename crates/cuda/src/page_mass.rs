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
use crate::{CudaError, Device, DeviceTable, GpuLayerKv, PoolDtype};

static SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{KV_ELEM}\n{}", include_str!("kernels/page_mass.cu")));

/// Threads of a block (`PM_THREADS`).
const THREADS: u32 = 256;
/// A block's logits stay within this many bytes of static shared memory, its queries beside.
const LOGIT_BYTES: usize = 32 << 10;
/// Tokens a block scores at most, so that short rows still spread over many blocks.
const CHUNK_TOKENS: usize = 1024;

/// Pages a block scores: as many as its logits allow, at least one.
fn chunk_pages(geom: KvGeometry, group: usize) -> Result<usize, CudaError> {
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

/// The kernels' source for a geometry, element type and group.
pub fn module_spec(
    geom: KvGeometry,
    dtype: PoolDtype,
    group: usize,
) -> Result<ModuleSpec<'static>, CudaError> {
    Ok(ModuleSpec {
        name: "page_mass.cu",
        source: SOURCE.as_str(),
        defines: vec![
            ("HEAD_DIM", geom.head_dim.to_string()),
            ("PAGE_SIZE", geom.page_size.to_string()),
            ("GROUP", group.to_string()),
            ("CHUNK_PAGES", chunk_pages(geom, group)?.to_string()),
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

/// Device buffers of [`PageMass::launch`], kept between measured steps.
#[derive(Default)]
pub struct MassScratch {
    rows: Buf<u32>,
    part_max: Buf<f32>,
    raw: Buf<f32>,
    mass: Buf<f32>,
}

impl PageMass {
    pub fn new(
        dev: &Device,
        geom: KvGeometry,
        dtype: PoolDtype,
        group: usize,
    ) -> Result<Self, CudaError> {
        let built = build(dev, &module_spec(geom, dtype, group)?)?;
        Ok(Self {
            part: built.function("page_mass_part")?,
            sum: built.function("page_mass_sum")?,
            recall: built.function("page_mass_recall")?,
            geom,
            dtype,
            group,
            chunk_pages: chunk_pages(geom, group)?,
        })
    }

    /// For each of `rows` (a sequence of `dense`, one query per sequence in `q`, a KV head and
    /// its kept pages in `sparse`), its mass recall and top-k recall into `recall` (two values a
    /// row; see `page_mass_recall`). The masses stay in `scratch` ([`MassScratch::masses`]):
    /// row `r`'s page `p` at `r * stride + p`, `stride` (returned) the most pages of the rows'
    /// sequences, each row's masses adding up to the group's size.
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
        if stride == 0 {
            return Ok(0);
        }
        let chunks = stride.div_ceil(self.chunk_pages);
        let n = rows.len();
        let flat: Vec<u32> = rows
            .iter()
            .flat_map(|r| [r.seq, r.head, r.kept_at, r.kept])
            .collect();
        scratch.rows.load(dev, &flat)?;
        scratch
            .part_max
            .ensure(dev, n * chunks * self.group, false)?;
        scratch.raw.ensure(dev, n * self.group * stride, false)?;
        scratch.mass.ensure(dev, n * stride, false)?;
        let (heads, chunks_i, stride_i) = (g.kv_heads as i32, chunks as i32, stride as i32);
        let s = &dev.stream;
        let mut l = s.launch_builder(&self.part);
        l.arg(&kv.k)
            .arg(&dense.indptr)
            .arg(&dense.indices)
            .arg(&dense.last_page_len)
            .arg(q)
            .arg(&*scratch.rows)
            .arg(&heads)
            .arg(&scale)
            .arg(&chunks_i)
            .arg(&stride_i)
            .arg(&mut *scratch.part_max)
            .arg(&mut *scratch.raw);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, chunks as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match the kernel; the rows, table and queries were checked
        // above and the buffers hold `n` rows of `chunks` and `stride`.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(page_mass_part)"))?;
        let mut l = s.launch_builder(&self.sum);
        l.arg(&dense.indptr)
            .arg(&*scratch.rows)
            .arg(&*scratch.part_max)
            .arg(&*scratch.raw)
            .arg(&chunks_i)
            .arg(&stride_i)
            .arg(&mut *scratch.mass);
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
            .arg(&*scratch.mass)
            .arg(&stride_i)
            .arg(sparse)
            .arg(recall);
        // SAFETY: as above; each row's kept pages lie within `sparse`.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(page_mass_recall)"))?;
        Ok(stride)
    }
}

impl MassScratch {
    /// The masses of the last [`PageMass::measure`]: `rows` rows of `stride`.
    pub fn masses(&self, dev: &Device, rows: usize, stride: usize) -> Result<Vec<f32>, CudaError> {
        if rows * stride == 0 {
            return Ok(Vec::new());
        }
        dev.stream
            .clone_dtoh(&self.mass.slice(..rows * stride))
            .map_err(driver("cuMemcpyDtoH"))
    }
}
