//! The GPU paged KV pool (bf16) and its kernels: append tokens, fill with random values.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;
use vortex_kv::{KvDtype, KvGeometry, LayerKv, Storage};

use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::{CudaError, Device};

const SOURCE: &str = include_str!("kernels/kv.cu");

/// K and V of one layer for every page of the pool, laid out as on the CPU
/// (`[page][kv_head][slot][dim]`).
pub struct GpuLayerKv {
    pub k: CudaSlice<bf16>,
    pub v: CudaSlice<bf16>,
    pub geom: KvGeometry,
    pub num_pages: usize,
}

impl GpuLayerKv {
    /// A zeroed pool of `num_pages` pages.
    pub fn new(dev: &Device, geom: KvGeometry, num_pages: usize) -> Result<Self, CudaError> {
        let n = num_pages * geom.page_elems();
        let alloc = || {
            dev.stream
                .alloc_zeros::<bf16>(n)
                .map_err(driver("cuMemAlloc"))
        };
        Ok(Self {
            k: alloc()?,
            v: alloc()?,
            geom,
            num_pages,
        })
    }

    /// A copy of a bf16 CPU layer.
    pub fn upload(dev: &Device, layer: &LayerKv) -> Result<Self, CudaError> {
        let (Some(k), Some(v)) = (layer.k.as_slice::<bf16>(), layer.v.as_slice::<bf16>()) else {
            return Err(CudaError::Unsupported(format!(
                "KV dtype {} (the GPU pool is bf16)",
                layer.dtype()
            )));
        };
        let geom = layer.geometry();
        Ok(Self {
            k: dev.stream.clone_htod(k).map_err(driver("cuMemcpyHtoD"))?,
            v: dev.stream.clone_htod(v).map_err(driver("cuMemcpyHtoD"))?,
            geom,
            num_pages: k.len() / geom.page_elems(),
        })
    }

    /// The pool as a CPU layer.
    pub fn download(&self, dev: &Device) -> Result<LayerKv, CudaError> {
        let mut layer = LayerKv::new(self.geom, KvDtype::Bf16, 0);
        layer.k = Storage::Bf16(
            dev.stream
                .clone_dtoh(&self.k)
                .map_err(driver("cuMemcpyDtoH"))?,
        );
        layer.v = Storage::Bf16(
            dev.stream
                .clone_dtoh(&self.v)
                .map_err(driver("cuMemcpyDtoH"))?,
        );
        Ok(layer)
    }

    /// Bytes of K and V.
    pub fn bytes(&self) -> usize {
        2 * self.k.len() * 2
    }
}

/// The pool kernels' source for a geometry.
pub fn module_spec(geom: KvGeometry) -> ModuleSpec<'static> {
    ModuleSpec {
        name: "kv.cu",
        source: SOURCE,
        defines: vec![
            ("HEAD_DIM", geom.head_dim.to_string()),
            ("PAGE_SIZE", geom.page_size.to_string()),
        ],
    }
}

/// The pool kernels, compiled for one geometry.
pub struct KvKernels {
    append: CudaFunction,
    fill: CudaFunction,
    means: CudaFunction,
    minmax: CudaFunction,
    geom: KvGeometry,
}

impl KvKernels {
    pub fn new(dev: &Device, geom: KvGeometry) -> Result<Self, CudaError> {
        let built = build(dev, &module_spec(geom))?;
        let f = |n: &str| built.function(n);
        Ok(Self {
            append: f("kv_append")?,
            fill: f("fill_uniform_bf16")?,
            means: f("page_means")?,
            minmax: f("page_minmax")?,
            geom,
        })
    }

    /// Writes tokens into the pool: `slots[t] = (page, slot)`, and `k`, `v` hold
    /// `slots.len() * kv_heads * head_dim` values each (token-major, then head).
    pub fn append(
        &self,
        dev: &Device,
        layer: &mut GpuLayerKv,
        slots: &[(u32, u32)],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), CudaError> {
        let g = self.geom;
        if layer.geom != g {
            return Err(CudaError::Invalid(
                "KV kernels built for another geometry".into(),
            ));
        }
        let width = slots.len() * g.kv_heads * g.head_dim;
        if k.len() != width || v.len() != width {
            return Err(CudaError::Invalid(format!(
                "append: {} slots need {width} key and value elements, got {} and {}",
                slots.len(),
                k.len(),
                v.len()
            )));
        }
        if let Some(s) = slots
            .iter()
            .find(|s| s.0 as usize >= layer.num_pages || s.1 as usize >= g.page_size)
        {
            return Err(CudaError::Invalid(format!(
                "append: slot {s:?} outside the pool"
            )));
        }
        if slots.is_empty() {
            return Ok(());
        }
        let flat: Vec<u32> = slots.iter().flat_map(|&(p, s)| [p, s]).collect();
        let s = &dev.stream;
        let d_slots = s.clone_htod(&flat).map_err(driver("cuMemcpyHtoD"))?;
        let dk = s.clone_htod(k).map_err(driver("cuMemcpyHtoD"))?;
        let dv = s.clone_htod(v).map_err(driver("cuMemcpyHtoD"))?;
        let (tokens, heads) = (slots.len() as i32, g.kv_heads as i32);
        let mut l = s.launch_builder(&self.append);
        l.arg(&mut layer.k)
            .arg(&mut layer.v)
            .arg(&dk)
            .arg(&dv)
            .arg(&d_slots)
            .arg(&tokens)
            .arg(&heads);
        // SAFETY: argument types match the kernel; indices were checked above.
        unsafe { l.launch(grid_for(width)) }.map_err(driver("cuLaunchKernel(kv_append)"))?;
        Ok(())
    }

    /// The mean key of each of `pages` per KV head (block top-k's cache phase), written as bf16
    /// into `out`, laid out `[kv_head][pool page][head_dim]` like the CPU's page fields.
    pub fn page_means(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        pages: &[u32],
        out: &mut CudaSlice<bf16>,
    ) -> Result<(), CudaError> {
        let g = self.geom;
        if out.len() < g.kv_heads * layer.num_pages * g.head_dim {
            return Err(CudaError::Invalid(
                "centroid buffer smaller than the pool".into(),
            ));
        }
        let Some((d_pages, cfg)) = self.per_page(dev, layer, pages)? else {
            return Ok(());
        };
        let (heads, num) = (g.kv_heads as i32, layer.num_pages as i32);
        let mut l = dev.stream.launch_builder(&self.means);
        l.arg(&layer.k).arg(&d_pages).arg(&heads).arg(&num).arg(out);
        // SAFETY: argument types match the kernel; pages and sizes were checked above.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(page_means)"))?;
        Ok(())
    }

    /// Quest's cache phase: the elementwise max and min key of each listed page, per KV head,
    /// into `kmax` and `kmin` (each `[kv_head][pool page][head_dim]`, as `page_means`).
    pub fn page_minmax(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        pages: &[u32],
        kmax: &mut CudaSlice<bf16>,
        kmin: &mut CudaSlice<bf16>,
    ) -> Result<(), CudaError> {
        let g = self.geom;
        let need = g.kv_heads * layer.num_pages * g.head_dim;
        if kmax.len() < need || kmin.len() < need {
            return Err(CudaError::Invalid(
                "min/max buffers smaller than the pool".into(),
            ));
        }
        let Some((d_pages, cfg)) = self.per_page(dev, layer, pages)? else {
            return Ok(());
        };
        let (heads, num) = (g.kv_heads as i32, layer.num_pages as i32);
        let mut l = dev.stream.launch_builder(&self.minmax);
        l.arg(&layer.k)
            .arg(&d_pages)
            .arg(&heads)
            .arg(&num)
            .arg(kmax)
            .arg(kmin);
        // SAFETY: argument types match the kernel; pages and sizes were checked above.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(page_minmax)"))?;
        Ok(())
    }

    /// Checks `pages` against the pool and copies them to the device, with the launch shape of
    /// the cache-phase kernels (a block per page and KV head, a thread per dim); `None` for no
    /// pages.
    fn per_page(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        pages: &[u32],
    ) -> Result<Option<(CudaSlice<u32>, LaunchConfig)>, CudaError> {
        if pages.iter().any(|&p| p as usize >= layer.num_pages) {
            return Err(CudaError::Invalid("page outside the pool".into()));
        }
        if pages.is_empty() {
            return Ok(None);
        }
        let d_pages = dev
            .stream
            .clone_htod(pages)
            .map_err(driver("cuMemcpyHtoD"))?;
        let cfg = LaunchConfig {
            grid_dim: (pages.len() as u32, self.geom.kv_heads as u32, 1),
            block_dim: (self.geom.head_dim as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        Ok(Some((d_pages, cfg)))
    }

    /// Fills a bf16 buffer with uniform values in [-1, 1) drawn on the device from `seed`.
    pub fn fill_bf16(
        &self,
        dev: &Device,
        buf: &mut CudaSlice<bf16>,
        seed: u64,
    ) -> Result<(), CudaError> {
        let n = buf.len() as u64;
        let mut l = dev.stream.launch_builder(&self.fill);
        l.arg(buf).arg(&n).arg(&seed);
        // SAFETY: argument types match the kernel; it writes `n` elements.
        unsafe { l.launch(grid_for(n as usize)) }
            .map_err(driver("cuLaunchKernel(fill_uniform_bf16)"))?;
        Ok(())
    }

    /// Fills K and V with uniform values in [-1, 1) drawn on the device from `seed`.
    pub fn fill_uniform(
        &self,
        dev: &Device,
        layer: &mut GpuLayerKv,
        seed: u64,
    ) -> Result<(), CudaError> {
        self.fill_bf16(dev, &mut layer.k, seed)?;
        self.fill_bf16(dev, &mut layer.v, seed ^ 0x5bd1_e995)?;
        Ok(())
    }
}

/// A grid-stride launch over `n` elements: 256 threads per block, at most 65536 blocks.
pub(crate) fn grid_for(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}
