//! A model's weights on the device: bf16 or fp8 matrices (q|k|v and gate|up fused), f32
//! vectors.

use cudarc::driver::CudaSlice;
use half::bf16;
use vortex_model::config::ModelConfig;
use vortex_model::model::Model;
use vortex_model::weights::Weight;

use crate::blas::{GpuMatrix, Matrix};
use crate::error::driver;
use crate::fp8_weights::Fp8Kernels;
use crate::layer_kernels::LayerKernels;
use crate::{CudaError, Device, KvKernels};

pub struct GpuLayer {
    pub attn_norm: CudaSlice<f32>,
    /// q, k and v projections stacked: `[(hq + 2 hkv) d, hidden]`.
    pub qkv: Matrix,
    pub bias: Option<CudaSlice<f32>>,
    pub q_norm: Option<CudaSlice<f32>>,
    pub k_norm: Option<CudaSlice<f32>>,
    pub wo: Matrix,
    pub ffn_norm: CudaSlice<f32>,
    /// Gate and up projections stacked: `[2 ffn, hidden]`.
    pub gate_up: Matrix,
    pub down: Matrix,
    /// Norms of the attention's and the FFN's outputs before they join the residual stream
    /// (Gemma 3).
    pub post_norms: Option<[CudaSlice<f32>; 2]>,
}

pub struct GpuWeights {
    /// Always bf16: the lookup reads its rows.
    pub embed: Matrix,
    pub layers: Vec<GpuLayer>,
    pub norm: CudaSlice<f32>,
    /// `None` when the output projection is the (tied) embedding.
    pub lm_head: Option<Matrix>,
}

fn upload_f32(dev: &Device, v: &[f32]) -> Result<CudaSlice<f32>, CudaError> {
    dev.stream.clone_htod(v).map_err(driver("cuMemcpyHtoD"))
}

/// Stacks the rows of `ws` (same width) into one bf16 matrix on the device.
fn upload_stacked(dev: &Device, ws: &[&Weight]) -> Result<Matrix, CudaError> {
    let cols = ws[0].cols;
    let mut data: Vec<bf16> = Vec::new();
    for w in ws {
        data.extend(w.to_f32().into_iter().map(bf16::from_f32));
    }
    Ok(Matrix::Bf16(GpuMatrix {
        rows: data.len() / cols,
        cols,
        data: dev
            .stream
            .clone_htod(&data)
            .map_err(driver("cuMemcpyHtoD"))?,
    }))
}

/// `m` as fp8, the bf16 copy dropped.
fn to_fp8(dev: &Device, fp8: &mut Fp8Kernels, m: &mut Matrix) -> Result<(), CudaError> {
    if let Matrix::Bf16(b) = m {
        fp8.reserve(dev, b.rows, b.cols)?;
        *m = Matrix::Fp8(fp8.quantize(dev, b)?);
    }
    Ok(())
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
                    post_norms: match &l.post_norms {
                        Some([a, f]) => Some([upload_f32(dev, a)?, upload_f32(dev, f)?]),
                        None => None,
                    },
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
    /// variance `1 / cols` (as `vortex_model::random`), norms 1 (Gemma's norms after each
    /// sublayer too), no biases.
    pub fn random(
        dev: &Device,
        fill: &KvKernels,
        kernels: &LayerKernels,
        config: &ModelConfig,
        seed: u64,
    ) -> Result<Self, CudaError> {
        let (h, d) = (config.hidden, config.head_dim);
        let mut salt = seed;
        let mut mat = |rows: usize, cols: usize| -> Result<Matrix, CudaError> {
            salt = salt.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut data = dev.zeros::<bf16>(rows * cols)?;
            fill.fill_bf16(dev, &mut data, salt)?;
            kernels.scale(dev, &mut data, 3f32.sqrt() / (cols as f32).sqrt(), 0.0)?;
            Ok(Matrix::Bf16(GpuMatrix { data, rows, cols }))
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
                post_norms: match config.gemma {
                    Some(_) => Some([ones(h)?, ones(h)?]),
                    None => None,
                },
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

    /// Stores every matrix a step multiplies by as fp8 with a scale a row (the embedding stays
    /// bf16 for its lookup; a tied output projection gets an fp8 copy).
    pub fn quantize_fp8(&mut self, dev: &Device, fp8: &mut Fp8Kernels) -> Result<(), CudaError> {
        for l in &mut self.layers {
            for m in [&mut l.qkv, &mut l.wo, &mut l.gate_up, &mut l.down] {
                to_fp8(dev, fp8, m)?;
            }
        }
        match &mut self.lm_head {
            Some(m) => to_fp8(dev, fp8, m)?,
            None => {
                let Matrix::Bf16(e) = &self.embed else {
                    return Err(CudaError::Invalid("the embedding is not bf16".into()));
                };
                fp8.reserve(dev, e.rows, e.cols)?;
                self.lm_head = Some(Matrix::Fp8(fp8.quantize(dev, e)?));
            }
        }
        Ok(())
    }

    /// The embedding table the lookup reads.
    pub fn embed_table(&self) -> Result<&CudaSlice<bf16>, CudaError> {
        match &self.embed {
            Matrix::Bf16(m) => Ok(&m.data),
            Matrix::Fp8(_) => Err(CudaError::Invalid("the embedding is not bf16".into())),
        }
    }

    /// Whether the matrices a step multiplies by are fp8.
    pub fn fp8(&self) -> bool {
        matches!(self.head(), Matrix::Fp8(_))
    }

    /// The output projection.
    pub fn head(&self) -> &Matrix {
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
