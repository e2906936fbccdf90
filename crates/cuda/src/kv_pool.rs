//! The GPU paged KV pool (bf16, or fp8 e4m3) and its kernels: append tokens, fill with random
//! values, the built-in cache phases.

use std::fmt;
use std::sync::LazyLock;

use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use half::bf16;
use vortex_kv::{F8E4M3, KvDtype, KvGeometry, LayerKv, Storage};

use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::page_list::PageList;
use crate::{CudaError, Device, fp8};

/// The pool's element type as the kernels see it, compiled in front of every kernel that reads
/// or writes the pool.
pub(crate) const KV_ELEM: &str = include_str!("kernels/kv_elem.cu");
static SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{KV_ELEM}\n{}", include_str!("kernels/kv.cu")));

/// How the pool stores a key or value element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolDtype {
    #[default]
    Bf16,
    /// fp8 e4m3 with no scale: half the bytes of bf16; finite values past 448 saturate.
    Fp8,
}

impl PoolDtype {
    /// The same element type as the CPU cache names it.
    pub fn kv_dtype(self) -> KvDtype {
        match self {
            PoolDtype::Bf16 => KvDtype::Bf16,
            PoolDtype::Fp8 => KvDtype::Fp8,
        }
    }

    pub fn size(self) -> usize {
        self.kv_dtype().size()
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s.parse::<KvDtype>() {
            Ok(KvDtype::Bf16) => Ok(PoolDtype::Bf16),
            Ok(KvDtype::Fp8) => Ok(PoolDtype::Fp8),
            _ => Err(format!("GPU KV dtype '{s}': expected bf16 or fp8 (e4m3)")),
        }
    }

    /// The kernels' define for this element type.
    pub(crate) fn define(self) -> (&'static str, String) {
        ("KV_FP8", u8::from(self == PoolDtype::Fp8).to_string())
    }
}

impl fmt::Display for PoolDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kv_dtype().name())
    }
}

/// K and V of one layer for every page of the pool, laid out as on the CPU
/// (`[page][kv_head][slot][dim]`), `dtype.size()` bytes an element.
pub struct GpuLayerKv {
    pub k: CudaSlice<u8>,
    pub v: CudaSlice<u8>,
    pub dtype: PoolDtype,
    pub geom: KvGeometry,
    pub num_pages: usize,
}

impl GpuLayerKv {
    /// Whether a pool of `num_pages` pages can exist: kernels take page ids and pool sizes as
    /// 32-bit integers.
    pub fn check_pages(num_pages: usize) -> Result<(), CudaError> {
        if num_pages > i32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "a pool of {num_pages} pages (at most {} on the GPU)",
                i32::MAX
            )));
        }
        Ok(())
    }

    /// A zeroed pool of `num_pages` pages.
    pub fn new(
        dev: &Device,
        geom: KvGeometry,
        num_pages: usize,
        dtype: PoolDtype,
    ) -> Result<Self, CudaError> {
        Self::check_pages(num_pages)?;
        let n = num_pages
            .saturating_mul(geom.page_elems())
            .saturating_mul(dtype.size());
        let alloc = || dev.zeros::<u8>(n);
        Ok(Self {
            k: alloc()?,
            v: alloc()?,
            dtype,
            geom,
            num_pages,
        })
    }

    /// A copy of a CPU layer, each value rounded to `dtype` (exact for a bf16 layer kept bf16).
    pub fn upload(dev: &Device, layer: &LayerKv, dtype: PoolDtype) -> Result<Self, CudaError> {
        let geom = layer.geometry();
        let encode = |s: &Storage| -> Vec<u8> {
            let mut vals = vec![0.0f32; s.len()];
            s.read_f32(0, &mut vals);
            match dtype {
                PoolDtype::Bf16 => vals
                    .iter()
                    .flat_map(|&x| bf16::from_f32(x).to_bits().to_le_bytes())
                    .collect(),
                PoolDtype::Fp8 => vals.iter().map(|&x| fp8::from_f32(x)).collect(),
            }
        };
        let (k, v) = (encode(&layer.k), encode(&layer.v));
        Ok(Self {
            k: dev.stream.clone_htod(&k).map_err(driver("cuMemcpyHtoD"))?,
            v: dev.stream.clone_htod(&v).map_err(driver("cuMemcpyHtoD"))?,
            dtype,
            geom,
            num_pages: layer.k.len() / geom.page_elems(),
        })
    }

    /// The pool as a CPU layer of the same element type.
    pub fn download(&self, dev: &Device) -> Result<LayerKv, CudaError> {
        let get = |buf: &CudaSlice<u8>| -> Result<Storage, CudaError> {
            let bytes = dev.stream.clone_dtoh(buf).map_err(driver("cuMemcpyDtoH"))?;
            Ok(match self.dtype {
                PoolDtype::Bf16 => Storage::Bf16(
                    bytes
                        .chunks_exact(2)
                        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                        .collect(),
                ),
                PoolDtype::Fp8 => Storage::Fp8(bytes.into_iter().map(F8E4M3).collect()),
            })
        };
        let mut layer = LayerKv::new(self.geom, self.dtype.kv_dtype(), 0);
        layer.k = get(&self.k)?;
        layer.v = get(&self.v)?;
        Ok(layer)
    }

    /// Bytes of K and V.
    pub fn bytes(&self) -> usize {
        self.k.len() + self.v.len()
    }
}

/// The pool kernels' source for a geometry and element type.
pub fn module_spec(geom: KvGeometry, dtype: PoolDtype) -> ModuleSpec<'static> {
    ModuleSpec {
        name: "kv.cu",
        source: SOURCE.as_str(),
        defines: vec![
            ("HEAD_DIM", geom.head_dim.to_string()),
            ("PAGE_SIZE", geom.page_size.to_string()),
            dtype.define(),
        ],
    }
}

/// The pool kernels, compiled for one geometry and element type.
pub struct KvKernels {
    append: CudaFunction,
    fill: CudaFunction,
    fill_kv: CudaFunction,
    means: CudaFunction,
    means_fp8: CudaFunction,
    minmax: CudaFunction,
    minmax_fp8: CudaFunction,
    geom: KvGeometry,
    dtype: PoolDtype,
}

impl KvKernels {
    pub fn new(dev: &Device, geom: KvGeometry, dtype: PoolDtype) -> Result<Self, CudaError> {
        let built = build(dev, &module_spec(geom, dtype))?;
        let f = |n: &str| built.function(n);
        Ok(Self {
            append: f("kv_append")?,
            fill: f("fill_uniform_bf16")?,
            fill_kv: f("fill_uniform_kv")?,
            means: f("page_means")?,
            means_fp8: f("page_means_fp8")?,
            minmax: f("page_minmax")?,
            minmax_fp8: f("page_minmax_fp8")?,
            geom,
            dtype,
        })
    }

    /// Fails unless `layer` is a pool these kernels were built for.
    fn check_layer(&self, layer: &GpuLayerKv) -> Result<(), CudaError> {
        if layer.geom != self.geom || layer.dtype != self.dtype {
            return Err(CudaError::Invalid(format!(
                "KV kernels built for {:?} {} cannot use a {:?} {} pool",
                self.geom, self.dtype, layer.geom, layer.dtype
            )));
        }
        Ok(())
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
        self.check_layer(layer)?;
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
    /// into `out` (its bytes, whatever its element type), laid out `[kv_head][pool page]
    /// [head_dim]` like the CPU's page fields.
    pub fn page_means<T: DeviceRepr>(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        pages: &PageList,
        out: &mut CudaSlice<T>,
    ) -> Result<(), CudaError> {
        self.means_as(dev, layer, pages, out, KvDtype::Bf16)
    }

    /// The same means as fp8 e4m3, a byte each (`block_topk_fp8`'s centroids).
    pub fn page_means_fp8(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        pages: &PageList,
        out: &mut CudaSlice<u8>,
    ) -> Result<(), CudaError> {
        self.means_as(dev, layer, pages, out, KvDtype::Fp8)
    }

    fn means_as<T: DeviceRepr>(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        pages: &PageList,
        out: &mut CudaSlice<T>,
        dtype: KvDtype,
    ) -> Result<(), CudaError> {
        let g = self.geom;
        self.check_layer(layer)?;
        let need = g.kv_heads * layer.num_pages * g.head_dim * dtype.size();
        if out.len() * size_of::<T>() < need {
            return Err(CudaError::Invalid(
                "centroid buffer smaller than the pool".into(),
            ));
        }
        let Some((d_pages, cfg)) = self.per_page(layer, pages)? else {
            return Ok(());
        };
        let (heads, num) = (g.kv_heads as i32, layer.num_pages as i32);
        let f = match dtype {
            KvDtype::Fp8 => &self.means_fp8,
            _ => &self.means,
        };
        let mut l = dev.stream.launch_builder(f);
        l.arg(&layer.k).arg(d_pages).arg(&heads).arg(&num).arg(out);
        // SAFETY: argument types match the kernel; pages and sizes were checked above.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(page_means)"))?;
        Ok(())
    }

    /// Quest's cache phase: the elementwise max and min key of each listed page, per KV head,
    /// as bf16 into the bytes of `kmax` and `kmin` (each `[kv_head][pool page][head_dim]`, as
    /// `page_means`).
    pub fn page_minmax<T: DeviceRepr>(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        pages: &PageList,
        kmax: &mut CudaSlice<T>,
        kmin: &mut CudaSlice<T>,
    ) -> Result<(), CudaError> {
        self.minmax_as(dev, layer, pages, kmax, kmin, KvDtype::Bf16)
    }

    /// The same envelopes as fp8 e4m3, a byte each (`quest_fp8`'s).
    pub fn page_minmax_fp8(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        pages: &PageList,
        kmax: &mut CudaSlice<u8>,
        kmin: &mut CudaSlice<u8>,
    ) -> Result<(), CudaError> {
        self.minmax_as(dev, layer, pages, kmax, kmin, KvDtype::Fp8)
    }

    fn minmax_as<T: DeviceRepr>(
        &self,
        dev: &Device,
        layer: &GpuLayerKv,
        pages: &PageList,
        kmax: &mut CudaSlice<T>,
        kmin: &mut CudaSlice<T>,
        dtype: KvDtype,
    ) -> Result<(), CudaError> {
        let g = self.geom;
        self.check_layer(layer)?;
        let need = g.kv_heads * layer.num_pages * g.head_dim * dtype.size();
        if (kmax.len().min(kmin.len())) * size_of::<T>() < need {
            return Err(CudaError::Invalid(
                "min/max buffers smaller than the pool".into(),
            ));
        }
        let Some((d_pages, cfg)) = self.per_page(layer, pages)? else {
            return Ok(());
        };
        let (heads, num) = (g.kv_heads as i32, layer.num_pages as i32);
        let f = match dtype {
            KvDtype::Fp8 => &self.minmax_fp8,
            _ => &self.minmax,
        };
        let mut l = dev.stream.launch_builder(f);
        l.arg(&layer.k)
            .arg(d_pages)
            .arg(&heads)
            .arg(&num)
            .arg(kmax)
            .arg(kmin);
        // SAFETY: argument types match the kernel; pages and sizes were checked above.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(page_minmax)"))?;
        Ok(())
    }

    /// Checks `pages` against the pool, with the launch shape of the cache-phase kernels (a
    /// block per page and KV head, a thread per dim); `None` for no pages.
    fn per_page<'a>(
        &self,
        layer: &GpuLayerKv,
        pages: &'a PageList,
    ) -> Result<Option<(&'a CudaSlice<u32>, LaunchConfig)>, CudaError> {
        let Some(d_pages) = pages.within(layer.num_pages)? else {
            return Ok(None);
        };
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
        self.check_layer(layer)?;
        let n = (layer.k.len() / self.dtype.size()) as u64;
        for (buf, seed) in [(&mut layer.k, seed), (&mut layer.v, seed ^ 0x5bd1_e995)] {
            let mut l = dev.stream.launch_builder(&self.fill_kv);
            l.arg(buf).arg(&n).arg(&seed);
            // SAFETY: argument types match the kernel; it writes the pool's `n` elements.
            unsafe { l.launch(grid_for(n as usize)) }
                .map_err(driver("cuLaunchKernel(fill_uniform_kv)"))?;
        }
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
