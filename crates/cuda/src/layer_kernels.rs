//! The element-wise and row kernels of a decoder layer: embedding, RMSNorm, the q/k/v epilogue
//! (bias, QK-norm, RoPE, KV append), the gated activations (SwiGLU, Gemma's GELU), norms after a
//! sublayer and conversions.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

use crate::blas::{F16_INPUT_SHIFT, Input};
use crate::compile::{ModuleSpec, build};
use crate::error::driver;
use crate::kv_pool::{KV_ELEM, PoolDtype, grid_for};
use crate::{CudaError, Device, GpuLayerKv};
use std::sync::LazyLock;

static SOURCE: LazyLock<String> =
    LazyLock::new(|| format!("{KV_ELEM}\n{INPUT16}\n{}", include_str!("kernels/model.cu")));
/// A product's 16-bit input from an f32 value (`to_input`), for kernels that write one.
pub(crate) const INPUT16: &str = include_str!("kernels/input16.cu");

/// The layer kernels for heads of `head_dim`, writing K and V into a pool of `page_size`-token
/// pages of `dtype` elements.
pub fn module_spec(head_dim: usize, page_size: usize, dtype: PoolDtype) -> ModuleSpec<'static> {
    ModuleSpec {
        name: "model.cu",
        source: SOURCE.as_str(),
        defines: vec![
            dtype.define(),
            ("HEAD_DIM", head_dim.to_string()),
            ("PAGE_SIZE", page_size.to_string()),
            ("F16_INPUT_SHIFT", F16_INPUT_SHIFT.to_string()),
            ("RMS_THREADS", RMS_THREADS.to_string()),
        ],
    }
}

/// How q and k are rotated and normalised: the model's RoPE frequencies on the device.
pub struct RopeTable {
    pub inv_freq: CudaSlice<f32>,
    /// Pairs `(i, i + d/2)` rather than `(2i, 2i + 1)`.
    pub halves: bool,
}

/// Per-layer vectors of the q/k/v epilogue (f32, absent when the model has none).
pub struct QkvExtras<'a> {
    pub bias: Option<&'a CudaSlice<f32>>,
    pub q_norm: Option<&'a CudaSlice<f32>>,
    pub k_norm: Option<&'a CudaSlice<f32>>,
    pub eps: f32,
}

pub struct LayerKernels {
    embed: CudaFunction,
    norm: CudaFunction,
    qkv: CudaFunction,
    gate: CudaFunction,
    norm_add: CudaFunction,
    convert: CudaFunction,
    scale: CudaFunction,
    head_dim: usize,
    page_size: usize,
    dtype: PoolDtype,
}

/// Threads a block of `rms_norm_rows`.
const RMS_THREADS: u32 = 256;

fn rows_config(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn check(ok: bool, what: &str) -> Result<(), CudaError> {
    if ok {
        Ok(())
    } else {
        Err(CudaError::Invalid(format!("{what}: buffer sizes disagree")))
    }
}

impl LayerKernels {
    pub fn new(
        dev: &Device,
        head_dim: usize,
        page_size: usize,
        dtype: PoolDtype,
    ) -> Result<Self, CudaError> {
        if head_dim == 0 || head_dim % 2 == 1 || head_dim > 1024 {
            return Err(CudaError::Unsupported(format!("head_dim {head_dim}")));
        }
        let built = build(dev, &module_spec(head_dim, page_size, dtype))?;
        let f = |n: &str| built.function(n);
        Ok(Self {
            embed: f("embed_rows")?,
            norm: f("rms_norm_rows")?,
            qkv: f("qkv_post")?,
            gate: f("gate_mul")?,
            norm_add: f("rms_norm_add_rows")?,
            convert: f("to_input_kernel")?,
            scale: f("scale_bf16")?,
            head_dim,
            page_size,
            dtype,
        })
    }

    /// `x[r] = table[tokens[r]] * scale`; token ids must be checked against the vocabulary
    /// first.
    #[allow(clippy::too_many_arguments)]
    pub fn embed(
        &self,
        dev: &Device,
        table: &CudaSlice<bf16>,
        tokens: &CudaSlice<u32>,
        n: usize,
        hidden: usize,
        scale: f32,
        x: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        check(tokens.len() >= n && x.len() >= n * hidden, "embed")?;
        let h = hidden as i32;
        let mut l = dev.stream.launch_builder(&self.embed);
        l.arg(table).arg(tokens).arg(&h).arg(&scale).arg(x);
        // SAFETY: argument types match; rows and sizes checked above, token ids by the caller.
        unsafe { l.launch(rows_config(n, 256)) }.map_err(driver("cuLaunchKernel(embed_rows)"))?;
        Ok(())
    }

    /// `out[r] = rms_norm(x[rows[r]]) * w` stored as `input`, `rows` `None` meaning rows
    /// `0..n`.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        dev: &Device,
        x: &CudaSlice<f32>,
        rows: Option<&CudaSlice<i32>>,
        n: usize,
        w: &CudaSlice<f32>,
        eps: f32,
        out: &mut CudaSlice<bf16>,
        input: Input,
    ) -> Result<(), CudaError> {
        let hidden = w.len();
        check(out.len() >= n * hidden, "rms_norm")?;
        if rows.is_none() {
            check(x.len() >= n * hidden, "rms_norm")?;
        }
        let h = hidden as i32;
        let mut l = dev.stream.launch_builder(&self.norm);
        l.arg(x);
        match rows {
            Some(r) => l.arg(r),
            None => l.arg(&0u64),
        };
        let f16 = input.f16_flag();
        l.arg(w).arg(&h).arg(&eps).arg(out).arg(&f16);
        // SAFETY: argument types match (a null pointer for absent rows); sizes checked above.
        unsafe { l.launch(rows_config(n, RMS_THREADS)) }
            .map_err(driver("cuLaunchKernel(rms_norm_rows)"))?;
        Ok(())
    }

    /// The q/k/v epilogue of `n` tokens: `qkv` is f32 `[n][(hq + 2 hkv) d]`; q goes to `q`
    /// (`[n][hq][d]`), k and v into `kv` at `slots` (device `(page, slot)` pairs, checked
    /// against the pool by the caller), rotated for positions `pos`.
    #[allow(clippy::too_many_arguments)]
    pub fn qkv_post(
        &self,
        dev: &Device,
        qkv: &CudaSlice<f32>,
        n: usize,
        hq: usize,
        extras: &QkvExtras,
        rope: &RopeTable,
        pos: &CudaSlice<i32>,
        slots: &CudaSlice<u32>,
        q: &mut CudaSlice<f32>,
        kv: &mut GpuLayerKv,
    ) -> Result<(), CudaError> {
        let (d, hkv) = (self.head_dim, kv.geom.kv_heads);
        check(
            kv.geom.head_dim == d
                && kv.geom.page_size == self.page_size
                && kv.dtype == self.dtype
                && qkv.len() >= n * (hq + 2 * hkv) * d
                && q.len() >= n * hq * d
                && pos.len() >= n
                && slots.len() >= 2 * n
                && rope.inv_freq.len() == d / 2,
            "qkv_post",
        )?;
        if n == 0 {
            return Ok(());
        }
        let (halves, hq_i, hkv_i) = (rope.halves as i32, hq as i32, hkv as i32);
        let mut l = dev.stream.launch_builder(&self.qkv);
        l.arg(qkv);
        for v in [extras.bias, extras.q_norm, extras.k_norm] {
            match v {
                Some(b) => l.arg(b),
                None => l.arg(&0u64),
            };
        }
        l.arg(&extras.eps)
            .arg(&rope.inv_freq)
            .arg(&halves)
            .arg(pos)
            .arg(slots)
            .arg(&hq_i)
            .arg(&hkv_i)
            .arg(q)
            .arg(&mut kv.k)
            .arg(&mut kv.v);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, (hq + 2 * hkv) as u32, 1),
            block_dim: (d.max(32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match (null pointers for absent vectors); sizes checked above.
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(qkv_post)"))?;
        Ok(())
    }

    /// `out[r] = act(gu[r][..ffn]) * gu[r][ffn..]` stored as `input`: SiLU, or with `gelu`
    /// GELU's tanh approximation.
    #[allow(clippy::too_many_arguments)]
    pub fn gate_mul(
        &self,
        dev: &Device,
        gu: &CudaSlice<f32>,
        rows: usize,
        ffn: usize,
        gelu: bool,
        out: &mut CudaSlice<bf16>,
        input: Input,
    ) -> Result<(), CudaError> {
        check(
            gu.len() >= rows * 2 * ffn && out.len() >= rows * ffn,
            "gate_mul",
        )?;
        let (r, f, g, f16) = (rows as i32, ffn as i32, gelu as i32, input.f16_flag());
        let mut l = dev.stream.launch_builder(&self.gate);
        l.arg(gu).arg(&r).arg(&f).arg(&g).arg(out).arg(&f16);
        // SAFETY: argument types match; sizes checked above.
        unsafe { l.launch(grid_for(rows * ffn)) }.map_err(driver("cuLaunchKernel(gate_mul)"))?;
        Ok(())
    }

    /// `x[r] += rms_norm(y[r]) * w` for rows `0..n`.
    pub fn rms_norm_add(
        &self,
        dev: &Device,
        y: &CudaSlice<f32>,
        n: usize,
        w: &CudaSlice<f32>,
        eps: f32,
        x: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let hidden = w.len();
        check(
            y.len() >= n * hidden && x.len() >= n * hidden,
            "rms_norm_add",
        )?;
        let h = hidden as i32;
        let mut l = dev.stream.launch_builder(&self.norm_add);
        l.arg(y).arg(w).arg(&h).arg(&eps).arg(x);
        // SAFETY: argument types match; sizes checked above.
        unsafe { l.launch(rows_config(n, RMS_THREADS)) }
            .map_err(driver("cuLaunchKernel(rms_norm_add_rows)"))?;
        Ok(())
    }

    /// The first `n` values of `x` stored as `input`.
    pub fn to_input(
        &self,
        dev: &Device,
        x: &CudaSlice<f32>,
        n: usize,
        out: &mut CudaSlice<bf16>,
        input: Input,
    ) -> Result<(), CudaError> {
        check(x.len() >= n && out.len() >= n, "to_input")?;
        let (n64, f16) = (n as u64, input.f16_flag());
        let mut l = dev.stream.launch_builder(&self.convert);
        l.arg(x).arg(&n64).arg(out).arg(&f16);
        // SAFETY: argument types match; sizes checked above.
        unsafe { l.launch(grid_for(n)) }.map_err(driver("cuLaunchKernel(to_input)"))?;
        Ok(())
    }

    /// `x = x * scale + offset`, elementwise in place.
    pub fn scale(
        &self,
        dev: &Device,
        x: &mut CudaSlice<bf16>,
        scale: f32,
        offset: f32,
    ) -> Result<(), CudaError> {
        let n = x.len() as u64;
        let mut l = dev.stream.launch_builder(&self.scale);
        l.arg(x).arg(&n).arg(&scale).arg(&offset);
        // SAFETY: argument types match; the kernel touches `n` elements.
        unsafe { l.launch(grid_for(n as usize)) }.map_err(driver("cuLaunchKernel(scale_bf16)"))?;
        Ok(())
    }
}
