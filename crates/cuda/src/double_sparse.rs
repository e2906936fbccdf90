//! The index phase of the built-in `double_sparse` flow on the tensor cores
//! (`kernels/double_sparse.cu`), in place of the generated one where it applies: the flow's own
//! graph, at most 8 query heads per KV head, pages of 16 tokens and a multiple of 16 kept
//! channels. Each page's label (its keys at the kept channels) is one m16n8k16 product per 16
//! channels, where the generated kernel scores a page on one thread. The cache phase stays
//! generated, and so does the label's layout.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use std::sync::LazyLock;
use vortex_flow::Flow;
use vortex_flow::library::is_builtin;

use crate::block_topk::SCORES;
use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::index_row::{INDEX_ROW, SelRow};
use crate::launch::{self, RawArgs};
use crate::{CudaError, Device, DeviceTable, MMA, topk};

const OWN: &str = include_str!("kernels/double_sparse.cu");
/// The top-k, the tensor-core helpers and the row code, then the index kernel.
static SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{}\n{MMA}\n{SCORES}\n{INDEX_ROW}\n{OWN}", topk::SOURCE));

/// The kept channels of `flow` when it is the library's `double_sparse` (its channels may be
/// overridden) in a geometry the kernel takes on a device of compute capability `capability`.
pub fn kept_channels(flow: &Flow, capability: (i32, i32)) -> Option<Vec<i32>> {
    if flow.name != "double_sparse" || !is_builtin(flow) {
        return None;
    }
    let g = flow.geometry;
    let label = flow.fields.first()?;
    let channels = flow.consts.iter().find(|c| c.name == "channels")?;
    let ids: Vec<i32> = channels.data.iter().map(|&x| x as i32).collect();
    let fits = g.heads_q <= 8 * g.heads_kv
        && g.page_size == 16
        && label.rows == 16
        && label.cols == ids.len()
        && ids.len().is_multiple_of(16)
        && ids.iter().all(|&c| (0..g.head_dim as i32).contains(&c))
        && capability >= (8, 0);
    fits.then_some(ids)
}

pub fn module_spec(flow: &Flow, label_cols: usize) -> ModuleSpec<'static> {
    let g = flow.geometry;
    ModuleSpec {
        name: "double_sparse.cu",
        source: SOURCE.as_str(),
        defines: vec![
            ("HEAD_DIM", g.head_dim.to_string()),
            ("GROUP", g.group().to_string()),
            ("PAGE_SIZE", g.page_size.to_string()),
            ("LABEL_COLS", label_cols.to_string()),
        ],
    }
}

/// The tensor-core index kernel and the flow's kept channels on the device.
pub struct LabelIndex {
    func: CudaFunction,
    /// Dynamic shared memory the kernel may take.
    shared_limit: u32,
    channels: CudaSlice<i32>,
}

impl LabelIndex {
    /// The kernel for `flow`, or `None` where [`kept_channels`] does not apply.
    pub fn new(dev: &Device, flow: &Flow) -> Result<Option<Self>, CudaError> {
        let Some(ids) = kept_channels(flow, dev.capability) else {
            return Ok(None);
        };
        let built = build(dev, &module_spec(flow, ids.len()))?;
        let func = built.function("label_index")?;
        let shared_limit = topk::allow_longest_rows(dev, &func)?;
        let channels = dev
            .stream
            .clone_htod(&ids)
            .map_err(driver("cuMemcpyHtoD"))?;
        Ok(Some(Self {
            func,
            shared_limit,
            channels,
        }))
    }

    /// Scores each row's candidates from `label` (the cache phase's field of a pool of
    /// `num_pages` pages) and writes the kept pages into `sparse`; the caller has checked the
    /// step (`index_row::check_step`, which gave `shared_bytes`) and the fields.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        &self,
        dev: &Device,
        dense: &DeviceTable,
        label: &CudaSlice<u8>,
        num_pages: usize,
        q: &CudaSlice<f32>,
        (rows, rows_at, beside): (&[SelRow], u64, bool),
        (kv_heads, tolerance, shared_bytes): (usize, f32, u32),
        sparse: &mut DeviceTable,
    ) -> Result<(), CudaError> {
        topk::check_shared(shared_bytes, self.shared_limit)?;
        let (num, heads) = (num_pages as i32, kv_heads as i32);
        let at_block = crate::index_row::ready_at_block(rows, sparse);
        let (indices, ready) = sparse.selection_outputs()?;
        let mut a = RawArgs::default();
        a.buf(dev, label)
            .i32(num)
            .buf(dev, &dense.indptr)
            .buf(dev, &dense.indices)
            .buf(dev, q)
            .buf(dev, &self.channels)
            .addr(rows_at)
            .i32(heads)
            .f32(tolerance)
            .buf(dev, indices)
            .buf(dev, ready)
            .i32(at_block);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (topk::THREADS, 1, 1),
            shared_mem_bytes: shared_bytes,
        };
        // SAFETY: argument types match the kernel; the caller checked the rows against the
        // dense and sparse tables and the label against the pool; the channels were checked
        // against head_dim.
        unsafe { launch::launch(dev, &self.func, cfg, &mut a, beside) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::kept_channels;
    use vortex_flow::Geometry;
    use vortex_flow::library::load;

    fn flow(name: &str, heads_q: usize, heads_kv: usize, head_dim: usize) -> vortex_flow::Flow {
        let g = Geometry {
            heads_q,
            heads_kv,
            head_dim,
            page_size: 16,
        };
        load(name, g).unwrap()
    }

    #[test]
    fn the_library_flow_in_the_common_geometries() {
        // Qwen3-8B's attention: every 8th of 128 channels, 16 of them.
        let c = kept_channels(&flow("double_sparse", 32, 8, 128), (9, 0)).unwrap();
        assert_eq!(c, (0..16).map(|i| 8 * i).collect::<Vec<_>>());
        assert!(kept_channels(&flow("double_sparse", 16, 8, 128), (8, 0)).is_some());
        // Qwen2.5-7B's 7 query heads per KV head.
        assert!(kept_channels(&flow("double_sparse", 28, 4, 128), (9, 0)).is_some());
        // 8 kept channels, 16 query heads per KV head, an older GPU, another flow: generated.
        assert!(kept_channels(&flow("double_sparse", 32, 8, 64), (9, 0)).is_none());
        assert!(kept_channels(&flow("double_sparse", 32, 2, 128), (9, 0)).is_none());
        assert!(kept_channels(&flow("double_sparse", 32, 8, 128), (7, 5)).is_none());
        assert!(kept_channels(&flow("lsh", 32, 8, 128), (9, 0)).is_none());
    }

    fn channels(f: &mut vortex_flow::Flow) -> &mut Vec<f32> {
        &mut f
            .consts
            .iter_mut()
            .find(|c| c.name == "channels")
            .unwrap()
            .data
    }

    #[test]
    fn overridden_channels_are_the_flows() {
        let mut f = flow("double_sparse", 32, 8, 128);
        *channels(&mut f) = (0..16).map(|i| (127 - i) as f32).collect();
        let got = kept_channels(&f, (9, 0)).unwrap();
        assert_eq!((got[0], got[15]), (127, 112));
        // A channel past head_dim: the generated kernel's affair.
        channels(&mut f)[3] = 128.0;
        assert!(kept_channels(&f, (9, 0)).is_none());
    }
}
