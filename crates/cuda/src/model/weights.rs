//! A model's weights on the device: bf16 matrices (q|k|v and gate|up fused), f32 vectors.

use cudarc::driver::CudaSlice;
use half::bf16;
use vortex_model::config::ModelConfig;
use vortex_model::model::Model;
use vortex_model::weights::Weight;

use crate::blas::GpuMatrix;
use crate::error::driver;
use crate::layer_kernels::LayerKernels;
use crate::{CudaError, Device, KvKernels};

pub struct GpuLayer {
    pub attn_norm: CudaSlice<f32>,
    /// q, k and v projections stacked: `[(hq + 2 hkv) d, hidden]`.
    pub qkv: GpuMatrix,
    pub bias: Option<CudaSlice<f32>>,
    pub q_norm: Option<CudaSlice<f32>>,
    pub k_norm: Option<CudaSlice<f32>>,
    pub wo: GpuMatrix,
    pub ffn_norm: CudaSlice<f32>,
    /// Gate and up projections stacked: `[2 ffn, hidden]`.
    pub gate_up: GpuMatrix,
    pub down: GpuMatrix,
}

pub struct GpuWeights {
    pub embed: GpuMatrix,
    pub layers: Vec<GpuLayer>,
    pub norm: CudaSlice<f32>,
    /// `None` when the output projection is the (tied) embedding.
    pub lm_head: Option<GpuMatrix>,
}

fn upload_f32(dev: &Device, v: &[f32]) -> Result<CudaSlice<f32>, CudaError> {
    dev.stream.clone_htod(v).map_err(driver("cuMemcpyHtoD"))
}

/// Stacks the rows of `ws` (same width) into one bf16 matrix on the device.
fn upload_stacked(dev: &Device, ws: &[&Weight]) -> Result<GpuMatrix, CudaError> {
    let cols = ws[0].cols;
    let mut data: Vec<bf16> = Vec::new();
    for w in ws {
        data.extend(w.to_f32().into_iter().map(bf16::from_f32));
    }
    Ok(GpuMatrix {
        rows: data.len() / cols,
        cols,
        data: dev
            .stream
            .clone_htod(&data)
            .map_err(driver("cuMemcpyHtoD"))?,
    })
}

impl GpuWeights {
    /// Copies a loaded model's weights, dequantized to bf16.
    pub fn upload(dev: &Device, model: &Model) -> Result<Self, CudaError> {
        let layers = model
            .layers
            .iter()
            .map(|l| {
                Ok(GpuLayer {
                    attn_norm: upload_f32(dev, &l.attn_norm)?,
                    qkv: upload_stacked(dev, &[&l.wq, &l.wk, &l.wv])?,
                    bias: match &l.bias {
                        Some(b) => Some(upload_f32(dev, &b.concat())?),
                        None => None,
                    },
                    q_norm: match &l.qk_norm {
                        Some([q, _]) => Some(upload_f32(dev, q)?),
                        None => None,
                    },
                    k_norm: match &l.qk_norm {
                        Some([_, k]) => Some(upload_f32(dev, k)?),
                        None => None,
                    },
                    wo: upload_stacked(dev, &[&l.wo])?,
                    ffn_norm: upload_f32(dev, &l.ffn_norm)?,
                    gate_up: upload_stacked(dev, &[&l.gate, &l.up])?,
                    down: upload_stacked(dev, &[&l.down])?,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        Ok(Self {
            embed: upload_stacked(dev, &[&model.embed])?,
            layers,
            norm: upload_f32(dev, &model.norm)?,
            lm_head: match &model.lm_head {
                Some(w) => Some(upload_stacked(dev, &[w])?),
                None => None,
            },
        })
    }

    /// Weights of `config`'s shape drawn on the device from `seed`: each matrix uniform with
    /// variance `1 / cols` (as `vortex_model::random`), norms 1, no biases.
    pub fn random(
        dev: &Device,
        fill: &KvKernels,
        kernels: &LayerKernels,
        config: &ModelConfig,
        seed: u64,
    ) -> Result<Self, CudaError> {
        let (h, d) = (config.hidden, config.head_dim);
        let mut salt = seed;
        let mut mat = |rows: usize, cols: usize| -> Result<GpuMatrix, CudaError> {
            salt = salt.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut data = dev
                .stream
                .alloc_zeros::<bf16>(rows * cols)
                .map_err(driver("cuMemAlloc"))?;
            fill.fill_bf16(dev, &mut data, salt)?;
            kernels.scale(dev, &mut data, 3f32.sqrt() / (cols as f32).sqrt(), 0.0)?;
            Ok(GpuMatrix { data, rows, cols })
        };
        let ones = |n: usize| upload_f32(dev, &vec![1.0; n]);
        let width = (config.heads_q + 2 * config.heads_kv) * d;
        let mut layers = Vec::with_capacity(config.layers);
        for _ in 0..config.layers {
            layers.push(GpuLayer {
                attn_norm: ones(h)?,
                qkv: mat(width, h)?,
                bias: None,
                q_norm: if config.qk_norm { Some(ones(d)?) } else { None },
                k_norm: if config.qk_norm { Some(ones(d)?) } else { None },
                wo: mat(h, config.heads_q * d)?,
                ffn_norm: ones(h)?,
                gate_up: mat(2 * config.ffn, h)?,
                down: mat(h, config.ffn)?,
            });
        }
        Ok(Self {
            embed: mat(config.vocab, h)?,
            layers,
            norm: ones(h)?,
            lm_head: if config.tied_embeddings {
                None
            } else {
                Some(mat(config.vocab, h)?)
            },
        })
    }

    /// The output projection.
    pub fn head(&self) -> &GpuMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of weights one decode step reads: every layer's matrices and the output
    /// projection (the embedding lookup reads only the batch's rows).
    pub fn step_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.qkv.bytes() + l.wo.bytes() + l.gate_up.bytes() + l.down.bytes())
            .sum();
        layers + self.head().bytes()
    }
}
