//! Weight matrices stored as fp8 (e4m3) with one f32 scale an output row, quantized on the
//! device from bf16, and their products: a decode step's few rows on the tensor cores
//! (`kernels/fp8_matmul.cu`, half the weight bytes of bf16, x taken as scaled f16:
//! [`Input::F16Scaled`]), more rows dequantized to bf16 a slice of rows at a time for cuBLAS.

use std::sync::LazyLock;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

use crate::blas::{Cublas, F16_INPUT_SHIFT, GpuMatrix, Input};
use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::kv_pool::KV_ELEM;
use crate::launch::{CLUSTER, RawArgs, largest_cluster, launch_in_clusters};
use crate::{CudaError, Device, MMA};

static SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{KV_ELEM}\n{MMA}\n{CLUSTER}\n{}",
        include_str!("kernels/fp8_matmul.cu")
    )
});

/// Rows of x the tensor-core product takes in one pass; more go through cuBLAS.
pub const MAX_STEP_ROWS: usize = 64;
/// Output rows a block of the product owns (`FP8_ROWS`).
const BLOCK_ROWS: usize = 32;
/// Weights along k a warp takes at a time (`FP8_CHUNK`); the product needs `cols` a multiple.
const CHUNK: usize = 64;
/// bf16 elements of the dequantized slice of rows handed to cuBLAS (64 MiB).
const STAGING: usize = 1 << 25;

/// How the product's blocks are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Shape {
    /// Warps a block (2, 4 or 8, splitting the block's k between them) in the products of up to
    /// 16 rows of x, and of more.
    pub warps: [usize; 2],
    /// Chunks of weights each warp keeps in flight.
    pub depth: usize,
    /// Warps a block in the products of up to 16 rows by matrices of at least
    /// [`TALL_BLOCKS_PER_SM`] row blocks a multiprocessor (0: as `warps[0]`).
    pub tall_warps: usize,
    /// Blocks a multiprocessor that splitting k aims at where the row blocks alone are fewer.
    pub blocks_per_sm: usize,
    /// Whether a row tile's split blocks, up to [`MAX_CLUSTER`], add their sums as one cluster
    /// (where [`Device::clusters`](crate::Device::clusters)) rather than through device memory.
    pub clusters: bool,
}

/// The most blocks a cluster may portably hold.
pub const MAX_CLUSTER: usize = 8;

/// Row blocks a multiprocessor from which a matrix is tall (see [`Fp8Shape::tall_warps`]).
pub const TALL_BLOCKS_PER_SM: usize = 4;

impl Default for Fp8Shape {
    /// The fastest measured on an H200 (BENCHMARKS.md, "CUDA, an eighteenth pass" and "a
    /// twentieth pass"): more warps pay where fewer rows of x leave each block less to do,
    /// except for matrices with rows enough for several blocks a multiprocessor; deeper
    /// pipelines took registers and were slower; where more than two blocks a multiprocessor
    /// would fit, splitting k further cost more in partial sums than it gained; split sums
    /// added in a cluster made a layer's products at 16 rows 2-3% faster.
    fn default() -> Self {
        Self {
            warps: [8, 4],
            depth: 1,
            tall_warps: 4,
            blocks_per_sm: 2,
            clusters: true,
        }
    }
}

impl Fp8Shape {
    /// Whether the product of `tiles` tiles of 8 rows of x by a matrix of `row_blocks` row
    /// blocks, on a device of `sms` multiprocessors, takes the tall matrices' kernel.
    pub fn is_tall(&self, tiles: usize, row_blocks: usize, sms: usize) -> bool {
        tiles <= 2 && row_blocks >= TALL_BLOCKS_PER_SM * sms
    }

    fn tall(&self) -> usize {
        if self.tall_warps == 0 {
            self.warps[0]
        } else {
            self.tall_warps
        }
    }

    /// Warps a block of that product.
    pub fn warps_for(&self, tiles: usize, row_blocks: usize, sms: usize) -> usize {
        if self.is_tall(tiles, row_blocks, sms) {
            self.tall()
        } else {
            self.warps[usize::from(tiles > 2)]
        }
    }
}

/// The kernels' module (the pool's element type only selects helpers it does not use).
pub fn module_spec(shape: Fp8Shape) -> ModuleSpec<'static> {
    ModuleSpec {
        name: "fp8_matmul.cu",
        source: SOURCE.as_str(),
        defines: vec![
            ("KV_FP8", "0".to_string()),
            ("FP8_WARPS_FEW", shape.warps[0].to_string()),
            ("FP8_WARPS_MANY", shape.warps[1].to_string()),
            ("FP8_WARPS_TALL", shape.tall().to_string()),
            ("FP8_DEPTH", shape.depth.to_string()),
            ("F16_INPUT_SHIFT", F16_INPUT_SHIFT.to_string()),
        ],
    }
}

/// A `rows x cols` matrix of e4m3 values, row-major, and each row's scale.
pub struct Fp8Matrix {
    pub data: CudaSlice<u8>,
    pub scales: CudaSlice<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl Fp8Matrix {
    pub fn bytes(&self) -> usize {
        self.rows * self.cols + self.rows * 4
    }
}

/// How a product of `n` rows by a matrix is cut: x rows a pass (8 a tile) and splits of k over
/// blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub tiles: usize,
    pub splits: usize,
}

/// Tiles of 8 rows of x a product of `n` rows takes: 1, 2, 4 or 8.
fn tiles(n: usize) -> usize {
    n.div_ceil(8)
        .next_power_of_two()
        .clamp(1, MAX_STEP_ROWS / 8)
}

impl Plan {
    /// Splits k so that the blocks come near `target` where the rows alone give fewer (never
    /// past it), each of a block's `warps` keeping at least one chunk.
    pub fn new(n: usize, rows: usize, cols: usize, target: usize, warps: usize) -> Self {
        let row_blocks = rows.div_ceil(BLOCK_ROWS);
        let most = (cols / CHUNK / warps).max(1);
        let splits = (target / row_blocks).clamp(1, most);
        Self {
            tiles: tiles(n),
            splits,
        }
    }

    /// f32 partial sums the split blocks leave.
    fn work(&self, rows: usize) -> usize {
        if self.splits > 1 {
            rows.div_ceil(BLOCK_ROWS) * self.splits * BLOCK_ROWS * self.tiles * 8
        } else {
            0
        }
    }
}

pub struct Fp8Kernels {
    shape: Fp8Shape,
    quantize: CudaFunction,
    dequantize: CudaFunction,
    /// `fp8_matmul_1`, `_2`, `_4`, `_8`.
    products: [CudaFunction; 4],
    /// `fp8_matmul_tall_1`, `_2`.
    tall_products: [CudaFunction; 2],
    /// The most blocks of each product (as `products`, then `tall_products`) that the driver
    /// runs as one cluster: split blocks beyond it add their sums through device memory.
    cluster_most: [u32; 6],
    sms: usize,
    work: CudaSlice<f32>,
    /// One counter a row block of a split product, zero between launches.
    counters: CudaSlice<u32>,
    staging: Option<CudaSlice<bf16>>,
}

impl Fp8Kernels {
    pub fn new(dev: &Device) -> Result<Self, CudaError> {
        Self::with_shape(dev, Fp8Shape::default())
    }

    /// The kernels with products built as `shape` says.
    pub fn with_shape(dev: &Device, shape: Fp8Shape) -> Result<Self, CudaError> {
        if !shape.warps.iter().all(|w| matches!(w, 2 | 4 | 8))
            || !matches!(shape.tall_warps, 0 | 2 | 4 | 8)
            || shape.depth == 0
            || shape.blocks_per_sm == 0
        {
            return Err(CudaError::Invalid(format!("fp8 product shape {shape:?}")));
        }
        if dev.capability.0 < 8 {
            return Err(CudaError::Unsupported(format!(
                "fp8 weights need compute capability 8.0 or later ({} has {}.{})",
                dev.name, dev.capability.0, dev.capability.1
            )));
        }
        let built = build(dev, &module_spec(shape))?;
        let products = [
            built.function("fp8_matmul_1")?,
            built.function("fp8_matmul_2")?,
            built.function("fp8_matmul_4")?,
            built.function("fp8_matmul_8")?,
        ];
        let tall_products = [
            built.function("fp8_matmul_tall_1")?,
            built.function("fp8_matmul_tall_2")?,
        ];
        // Each product's block: the few-rows warps up to 2 tiles of x, else the many-rows'.
        let threads = |warps: usize| (warps * 32) as u32;
        let blocks = products
            .iter()
            .enumerate()
            .map(|(i, f)| (f, threads(shape.warps[usize::from(i > 1)])))
            .chain(tall_products.iter().map(|f| (f, threads(shape.tall()))));
        let mut cluster_most = [1u32; 6];
        for (most, (func, threads)) in cluster_most.iter_mut().zip(blocks) {
            if shape.clusters {
                *most = largest_cluster(dev, func, threads, 0, MAX_CLUSTER as u32)?;
            }
        }
        Ok(Self {
            shape,
            quantize: built.function("fp8_quantize_rows")?,
            dequantize: built.function("fp8_dequantize")?,
            products,
            tall_products,
            cluster_most,
            sms: dev.sms,
            work: dev.zeros::<f32>(1)?,
            counters: dev.zeros::<u32>(1)?,
            staging: None,
        })
    }

    /// The most blocks of each product the driver runs as one cluster (`fp8_matmul_1` to `_8`,
    /// then `fp8_matmul_tall_1` and `_2`; 1 each without clusters).
    pub fn cluster_most(&self) -> [u32; 6] {
        self.cluster_most
    }

    /// Sets aside what products by a `rows x cols` matrix need, so that none allocates while a
    /// step is being captured.
    pub fn reserve(&mut self, dev: &Device, rows: usize, cols: usize) -> Result<(), CudaError> {
        let work = (0..4)
            .map(|i| self.plan(1 << (3 + i), rows, cols).work(rows))
            .max()
            .unwrap_or(0);
        if work > self.work.len() {
            self.work = dev.zeros::<f32>(work)?;
        }
        let blocks = rows.div_ceil(BLOCK_ROWS);
        if blocks > self.counters.len() {
            self.counters = dev.zeros::<u32>(blocks)?;
        }
        let staging = STAGING.min(rows * cols);
        if self.staging.as_ref().is_none_or(|s| s.len() < staging) {
            self.staging = Some(dev.zeros::<bf16>(staging)?);
        }
        Ok(())
    }

    /// How a product of `n` rows by a matrix of `cols` columns takes its rows of x: f16 on the
    /// tensor cores, bf16 through cuBLAS.
    pub fn input_for(n: usize, cols: usize) -> Input {
        if Self::on_tensor_cores(n, cols) {
            Input::F16Scaled
        } else {
            Input::Bf16
        }
    }

    fn on_tensor_cores(n: usize, cols: usize) -> bool {
        n <= MAX_STEP_ROWS && cols.is_multiple_of(CHUNK)
    }

    /// How a product of `n` rows by a `rows x cols` matrix is cut.
    pub fn plan(&self, n: usize, rows: usize, cols: usize) -> Plan {
        let warps = self.warps(n, rows);
        Plan::new(n, rows, cols, self.shape.blocks_per_sm * self.sms, warps)
    }

    /// Warps a block of the product of `n` rows by a matrix of `rows` rows.
    fn warps(&self, n: usize, rows: usize) -> usize {
        self.shape
            .warps_for(tiles(n), rows.div_ceil(BLOCK_ROWS), self.sms)
    }

    /// The products index a matrix with 32-bit integers.
    fn check_size(rows: usize, cols: usize) -> Result<(), CudaError> {
        if rows.saturating_mul(cols) > i32::MAX as usize {
            return Err(CudaError::Unsupported(format!(
                "an fp8 matrix of {rows} x {cols} (at most {} values)",
                i32::MAX
            )));
        }
        Ok(())
    }

    /// `w` quantized: each row scaled so that its largest magnitude is 448.
    pub fn quantize(&self, dev: &Device, w: &GpuMatrix) -> Result<Fp8Matrix, CudaError> {
        // Said here, at load, rather than by every product of the matrix.
        Self::check_size(w.rows, w.cols)?;
        let mut data = dev.zeros::<u8>(w.rows * w.cols)?;
        let mut scales = dev.zeros::<f32>(w.rows)?;
        if w.rows > 0 {
            let cols = w.cols as i32;
            let mut l = dev.stream.launch_builder(&self.quantize);
            l.arg(&w.data).arg(&cols).arg(&mut data).arg(&mut scales);
            let cfg = LaunchConfig {
                grid_dim: (w.rows as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: argument types match; a block reads and writes one row of `cols`.
            unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(fp8_quantize_rows)"))?;
        }
        Ok(Fp8Matrix {
            data,
            scales,
            rows: w.rows,
            cols: w.cols,
        })
    }

    /// Rows `[row0, row0 + rows)` of `w` as bf16 into `out`.
    fn dequantize(
        &self,
        dev: &Device,
        w: &Fp8Matrix,
        row0: usize,
        rows: usize,
        out: &mut CudaSlice<bf16>,
    ) -> Result<(), CudaError> {
        let (r0, n, cols) = (row0 as i64, rows as i64, w.cols as i32);
        let mut l = dev.stream.launch_builder(&self.dequantize);
        l.arg(&w.data)
            .arg(&w.scales)
            .arg(&r0)
            .arg(&n)
            .arg(&cols)
            .arg(out);
        let blocks = (rows * w.cols).div_ceil(256).min(4 * 1024) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match; the caller checked the range and `out`'s size.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(fp8_dequantize)"))?;
        Ok(())
    }

    /// `out[n, w.rows] = x[n, w.cols] · wᵀ`, plus what `out` held when `accumulate` is set.
    /// At most [`MAX_STEP_ROWS`] rows on the tensor cores, else through cuBLAS a slice of
    /// dequantized rows at a time; `x` stored as [`Fp8Kernels::input_for`] says.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &mut self,
        dev: &Device,
        blas: &Cublas,
        x: &CudaSlice<bf16>,
        input: Input,
        n: usize,
        w: &Fp8Matrix,
        out: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let want = Self::input_for(n, w.cols);
        if input != want {
            return Err(CudaError::Invalid(format!(
                "an fp8 product of {n} rows by {} columns takes x as {want:?}, not {input:?}",
                w.cols
            )));
        }
        if x.len() < n * w.cols || out.len() < n * w.rows || w.data.len() < w.rows * w.cols {
            return Err(CudaError::Invalid(format!(
                "fp8 matmul [{n} x {}] by [{} x {}]ᵀ: buffers of {}, {} and {} elements",
                w.cols,
                w.rows,
                w.cols,
                x.len(),
                w.data.len(),
                out.len()
            )));
        }
        if n == 0 || w.rows == 0 {
            return Ok(());
        }
        Self::check_size(w.rows, w.cols)?;
        if Self::on_tensor_cores(n, w.cols) {
            self.step_product(dev, x, n, w, out, accumulate)
        } else {
            self.staged_product(dev, blas, x, n, w, out, accumulate)
        }
    }

    fn step_product(
        &mut self,
        dev: &Device,
        x: &CudaSlice<bf16>,
        n: usize,
        w: &Fp8Matrix,
        out: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let plan = self.plan(n, w.rows, w.cols);
        let blocks = w.rows.div_ceil(BLOCK_ROWS);
        if plan.work(w.rows) > self.work.len() || blocks > self.counters.len() {
            self.reserve(dev, w.rows, w.cols)?;
        }
        let tile_index = plan.tiles.trailing_zeros() as usize;
        let (func, most) = if self.shape.is_tall(plan.tiles, blocks, self.sms) {
            (
                &self.tall_products[tile_index],
                self.cluster_most[4 + tile_index],
            )
        } else {
            (&self.products[tile_index], self.cluster_most[tile_index])
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, plan.splits as u32, 1),
            block_dim: ((self.warps(n, w.rows) * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = RawArgs::default();
        args.buf(dev, &w.data)
            .buf(dev, &w.scales)
            .buf(dev, x)
            .buf(dev, &*out)
            .i32(w.rows as i32)
            .i32(w.cols as i32)
            .i32(n as i32)
            .i32(accumulate as i32)
            .buf(dev, &self.work)
            .buf(dev, &self.counters);
        // A row tile's split blocks add their sums through each other's shared memory where
        // they can form one cluster.
        let cluster = (self.shape.clusters && (2..=most as usize).contains(&plan.splits))
            .then_some((1, plan.splits as u32, 1));
        // SAFETY: the arguments match the kernel's parameters; sizes were checked by `matmul`,
        // and the split blocks' partial sums and counters fit the buffers reserved above. The
        // kernel waits for the one ahead before it touches anything but the weights. A cluster
        // spans the grid's y, the splits.
        unsafe { launch_in_clusters(dev, func, cfg, &mut args, true, cluster) }
    }

    #[allow(clippy::too_many_arguments)]
    fn staged_product(
        &mut self,
        dev: &Device,
        blas: &Cublas,
        x: &CudaSlice<bf16>,
        n: usize,
        w: &Fp8Matrix,
        out: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        self.reserve(dev, w.rows, w.cols)?;
        let mut staging = self.staging.take().expect("reserved above");
        let step = (staging.len() / w.cols).max(1);
        let mut result = Ok(());
        let mut row0 = 0;
        while row0 < w.rows && result.is_ok() {
            let rows = step.min(w.rows - row0);
            if rows * w.cols > staging.len() {
                // A single row wider than the staging slice: grow it.
                match dev.zeros::<bf16>(rows * w.cols) {
                    Ok(s) => staging = s,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            result = self
                .dequantize(dev, w, row0, rows, &mut staging)
                .and_then(|()| {
                    blas.gemm_rows(
                        dev, x, n, &staging, rows, w.cols, out, w.rows, row0, accumulate,
                    )
                });
            row0 += rows;
        }
        self.staging = Some(staging);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tall_matrices_take_their_own_warps_at_few_rows() {
        let shape = Fp8Shape::default();
        // Qwen3-8B's gate|up (768 row blocks) on 132 multiprocessors, and its q|k|v (192).
        assert_eq!(shape.warps_for(2, 768, 132), 4);
        assert_eq!(shape.warps_for(2, 192, 132), 8);
        // Beyond 16 rows of x, the many-rows warps whatever the matrix.
        assert_eq!(shape.warps_for(4, 768, 132), 4);
        assert!(!shape.is_tall(4, 768, 132));
        // Without tall warps, tall matrices take the few-rows warps.
        let plain = Fp8Shape {
            tall_warps: 0,
            ..shape
        };
        assert_eq!(plain.warps_for(1, 10_000, 132), 8);
        assert_eq!(Fp8Kernels::input_for(16, 4096), Input::F16Scaled);
        assert_eq!(Fp8Kernels::input_for(65, 4096), Input::Bf16);
        assert_eq!(Fp8Kernels::input_for(16, 96), Input::Bf16);
    }

    /// The shapes `gpu_fp8_split_sums_are_the_same_in_clusters` takes, `target / s` row blocks
    /// (the last tile cut short), split k `s` ways on devices of many sizes.
    #[test]
    fn plans_split_each_cluster_size() {
        for sms in [46, 108, 114, 128, 132, 170] {
            let target = 2 * sms;
            for s in 2..=MAX_CLUSTER + 1 {
                let rows = 32 * (target / s) - 5;
                // 16 rows of x take 8 warps a block (k allows 8 splits), 64 take 4 (16).
                let (n, warps) = if s <= MAX_CLUSTER { (16, 8) } else { (64, 4) };
                assert_eq!(
                    Plan::new(n, rows, 4096, target, warps).splits,
                    s,
                    "{sms} SMs"
                );
            }
        }
    }

    #[test]
    fn plans_fill_the_device_in_one_wave() {
        // Qwen3-8B's output projection at batch 16, 264 blocks aimed for: 128 row blocks.
        assert_eq!(
            Plan::new(16, 4096, 4096, 264, 8),
            Plan {
                tiles: 2,
                splits: 2
            }
        );
        // 192 row blocks: no split (two would pass the target).
        assert_eq!(Plan::new(16, 6144, 4096, 264, 8).splits, 1);
        // Enough rows alone: no split.
        assert_eq!(Plan::new(1, 151_936, 4096, 528, 8).splits, 1);
        // k too short to split further: a chunk a warp at least.
        assert_eq!(Plan::new(64, 64, 1024, 528, 8).splits, 2);
        assert_eq!(Plan::new(64, 64, 1024, 528, 4).splits, 4);
        assert_eq!(Plan::new(64, 64, 1024, 528, 8).tiles, 8);
        assert_eq!(Plan::new(9, 64, 1024, 528, 8).tiles, 2);
        assert_eq!(Plan::new(40, 64, 1024, 528, 8).tiles, 8);
    }
}
