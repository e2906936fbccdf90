//! Dense causal prefill attention over the paged KV cache (tiled, online softmax): on the
//! tensor cores for head widths that are multiples of 32 up to 128, else in f32 on the cores.

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::kv_pool::{KV_ELEM, PoolDtype};
use crate::prefill_shape::{MAX_GROUP, MmaShape};
use crate::{CudaError, Device, DeviceTable, GpuLayerKv};
use std::sync::LazyLock;
use vortex_kv::KvGeometry;

static SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{KV_ELEM}\n{}", include_str!("kernels/prefill.cu")));
static SOURCE_MMA: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}\n{}\n{}",
        SOURCE.as_str(),
        crate::MMA,
        include_str!("kernels/prefill_mma.cu")
    )
});
/// Query tokens per block of the f32 kernel (one warp each), as its `TQ`.
pub const TILE_TOKENS: usize = 8;
const KEY_TILE: usize = 32;
/// `VORTEX_NO_MMA_PREFILL=1` keeps prefill attention on the CUDA cores (to compare the two).
fn cuda_core_prefill() -> bool {
    std::env::var_os("VORTEX_NO_MMA_PREFILL").is_some_and(|v| v != "0")
}

/// Whether the tensor-core kernel takes this shape on a device of compute `capability`.
pub fn on_tensor_cores(head_dim: usize, group: usize, capability: (i32, i32)) -> bool {
    head_dim.is_multiple_of(32) && head_dim <= 128 && group <= MAX_GROUP && capability >= (8, 0)
}

/// Query tokens per block: its rows over `group` on the tensor cores, else `TILE_TOKENS`.
pub fn tile_tokens(mma: Option<MmaShape>, group: usize) -> usize {
    match mma {
        Some(shape) => shape.rows() / group,
        None => TILE_TOKENS,
    }
}

/// The kernels' source; with `mma`, the tensor-core kernel too, in that shape.
pub fn module_spec(
    geom: KvGeometry,
    dtype: PoolDtype,
    group: usize,
    mma: Option<MmaShape>,
) -> ModuleSpec<'static> {
    let mut defines = vec![
        dtype.define(),
        ("HEAD_DIM", geom.head_dim.to_string()),
        ("GROUP", group.to_string()),
        ("PAGE_SIZE", geom.page_size.to_string()),
    ];
    if let Some(shape) = mma {
        defines.extend(shape.defines());
    }
    ModuleSpec {
        name: "prefill.cu",
        source: if mma.is_some() {
            SOURCE_MMA.as_str()
        } else {
            SOURCE.as_str()
        },
        defines,
    }
}

/// Dynamic shared memory of the f32 kernel: its tile's queries.
fn query_bytes(head_dim: usize, group: usize) -> usize {
    TILE_TOKENS * group * head_dim * 4
}

/// Shared memory of the kernel for `group` query heads per KV head of width `head_dim`: the
/// queries, and the key and value tiles.
pub fn shared_bytes(head_dim: usize, group: usize) -> usize {
    query_bytes(head_dim, group) + KEY_TILE * (head_dim + 2) * 2 + KEY_TILE * head_dim * 2
}

/// The least shared memory a block may ask for on the GPUs the kernels target (compute
/// capability 8.6 and 8.9; 8.0 and 9.0 give more).
const TARGET_BLOCK_SHARED: usize = 99 << 10;

/// Whether the kernel fits a block's shared memory for this shape on every target GPU.
pub fn fits(head_dim: usize, group: usize) -> bool {
    shared_bytes(head_dim, group) <= TARGET_BLOCK_SHARED
}

/// One sequence's new tokens in a prefill: `tokens` query rows from `first_row`, at positions
/// `start..start + tokens`, reading row `table_row` of the page table (which already holds
/// their keys).
#[derive(Debug, Clone, Copy)]
pub struct PrefillSeq {
    pub first_row: usize,
    pub tokens: usize,
    pub start: usize,
    pub table_row: usize,
}

/// The tiles of a prefill, `per_tile` tokens at most each: `(first row, tokens, table row,
/// first position)` per block.
pub fn tiles(seqs: &[PrefillSeq], per_tile: usize) -> Vec<[i32; 4]> {
    let mut out = Vec::new();
    for s in seqs {
        for t0 in (0..s.tokens).step_by(per_tile) {
            let n = per_tile.min(s.tokens - t0);
            out.push([
                (s.first_row + t0) as i32,
                n as i32,
                s.table_row as i32,
                (s.start + t0) as i32,
            ]);
        }
    }
    out
}

pub struct PrefillAttention {
    func: CudaFunction,
    /// Query tokens per block.
    pub tile_tokens: usize,
    /// The tensor-core kernel's shape; `None` runs the f32 kernel.
    mma: Option<MmaShape>,
    /// The launch's dynamic shared memory.
    dynamic_bytes: u32,
    pub geom: KvGeometry,
    pub dtype: PoolDtype,
    pub heads_q: usize,
}

impl PrefillAttention {
    pub fn new(
        dev: &Device,
        geom: KvGeometry,
        dtype: PoolDtype,
        heads_q: usize,
    ) -> Result<Self, CudaError> {
        let d = geom.head_dim;
        if heads_q == 0 || !heads_q.is_multiple_of(geom.kv_heads) || d % 2 == 1 {
            return Err(CudaError::Unsupported(format!(
                "prefill attention with {heads_q} query heads, {} KV heads, head_dim {d}",
                geom.kv_heads
            )));
        }
        let group = heads_q / geom.kv_heads;
        let mma = (on_tensor_cores(d, group, dev.capability) && !cuda_core_prefill())
            .then(|| MmaShape::choose(d, dtype, dev.block_shared, dev.sm_shared))
            .flatten();
        if mma.is_none() && (!fits(d, group) || shared_bytes(d, group) > dev.block_shared) {
            return Err(CudaError::Unsupported(format!(
                "prefill attention with {group} query heads per KV head at head_dim {d}"
            )));
        }
        let built = build(dev, &module_spec(geom, dtype, group, mma))?;
        let (func, dynamic_bytes) = if let Some(shape) = mma {
            (
                built.function("prefill_attention_mma")?,
                shape.shared_bytes(d),
            )
        } else {
            (built.function("prefill_attention")?, query_bytes(d, group))
        };
        func.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            dynamic_bytes as i32,
        )
        .map_err(driver("cuFuncSetAttribute"))?;
        Ok(Self {
            func,
            tile_tokens: tile_tokens(mma, group),
            mma,
            dynamic_bytes: dynamic_bytes as u32,
            geom,
            dtype,
            heads_q,
        })
    }

    /// `out[r] = softmax(scale q[r] Kᵀ) V` over each row's past and itself (with `window`, only
    /// the last `window` positions, its own included), for the tiles of `seqs`; `q` and `out`
    /// are f32 `[rows][heads_q][head_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        table: &DeviceTable,
        seqs: &[PrefillSeq],
        tiles: &CudaSlice<i32>,
        q: &CudaSlice<f32>,
        scale: f32,
        window: Option<usize>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        if window == Some(0) {
            return Err(CudaError::Invalid(
                "a sliding window of 0 positions (it holds the query's own at least)".into(),
            ));
        }
        let g = self.geom;
        let row_elems = self.heads_q * g.head_dim;
        let rows = seqs
            .iter()
            .map(|s| s.first_row + s.tokens)
            .max()
            .unwrap_or(0);
        let pages_ok = seqs.iter().all(|s| {
            s.table_row < table.row_pages.len()
                && (table.row_pages[s.table_row] as usize) * g.page_size >= s.start + s.tokens
        });
        if layer.geom != g
            || layer.dtype != self.dtype
            || table.rows_per_seq != 1
            || !pages_ok
            || q.len() < rows * row_elems
            || out.len() < rows * row_elems
            || tiles.len()
                < 4 * seqs
                    .iter()
                    .map(|s| s.tokens.div_ceil(self.tile_tokens))
                    .sum::<usize>()
        {
            return Err(CudaError::Invalid(
                "prefill attention: pool, table, tiles and rows disagree".into(),
            ));
        }
        let n_tiles: usize = seqs
            .iter()
            .map(|s| s.tokens.div_ceil(self.tile_tokens))
            .sum();
        if n_tiles == 0 {
            return Ok(());
        }
        let (hq, hkv) = (self.heads_q as i32, g.kv_heads as i32);
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        // Positions are 32-bit in the kernel: a window past them is no window.
        let window = window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
        let mut l = dev.stream.launch_builder(&self.func);
        l.arg(&layer.k)
            .arg(&layer.v)
            .arg(&table.indptr)
            .arg(&table.indices)
            .arg(q)
            .arg(tiles)
            .arg(&hq)
            .arg(&hkv)
            .arg(&scale_log2)
            .arg(&window)
            .arg(out);
        let cfg = LaunchConfig {
            grid_dim: (n_tiles as u32, g.kv_heads as u32, 1),
            block_dim: (
                self.mma.map_or(TILE_TOKENS * 32, |s| s.threads()) as u32,
                1,
                1,
            ),
            shared_mem_bytes: self.dynamic_bytes,
        };
        // SAFETY: argument types match; every tile's positions lie within its table row's
        // pages (checked above), which were checked against the pool on upload.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(prefill_attention)"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_every_row_once_within_its_sequence() {
        let seqs = [
            PrefillSeq {
                first_row: 0,
                tokens: 19,
                start: 5,
                table_row: 0,
            },
            PrefillSeq {
                first_row: 19,
                tokens: 1,
                start: 40,
                table_row: 1,
            },
        ];
        let t = tiles(&seqs, 8);
        assert_eq!(
            t,
            vec![[0, 8, 0, 5], [8, 8, 0, 13], [16, 3, 0, 21], [19, 1, 1, 40]]
        );
        assert!(fits(128, 4) && fits(128, 8) && fits(256, 4) && !fits(128, 32));
        assert!(on_tensor_cores(128, 4, (9, 0)) && on_tensor_cores(64, 3, (8, 0)));
        assert!(!on_tensor_cores(256, 4, (9, 0)) && !on_tensor_cores(128, 4, (7, 5)));
        let four_warps = Some(MmaShape {
            warps: 4,
            keys: 64,
            blocks: 2,
        });
        assert_eq!(tile_tokens(four_warps, 4), 32);
        assert_eq!(tile_tokens(four_warps, 3), 42);
        assert_eq!(tile_tokens(None, 4), TILE_TOKENS);
        assert_eq!(tiles(&seqs[..1], 16).len(), 2);
    }
}
