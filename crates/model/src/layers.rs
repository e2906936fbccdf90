//! The element-wise pieces of a decoder layer: RMSNorm, rotary position embedding, SwiGLU and
//! GeGLU.

use crate::config::{ModelConfig, RopeScaling, RopeStyle};

/// `out = x / rms(x) * weight`, row by row (`x` and `out` are `[rows, weight.len()]`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss: f32 = sum_squares(xr);
        let inv = 1.0 / (ss / n as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * w;
        }
    }
}

fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    for c in chunks {
        for i in 0..16 {
            acc[i] += c[i] * c[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// RMSNorm applied to every head of `x` (`[tokens, heads, head_dim]`) in place (Qwen3 QK-norm).
pub fn head_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    for h in x.chunks_exact_mut(d) {
        let inv = 1.0 / (sum_squares(h) / d as f32 + eps).sqrt();
        for (v, &w) in h.iter_mut().zip(weight) {
            *v *= inv * w;
        }
    }
}

/// Rotation frequencies of a model: `inv_freq[i]` for each channel pair.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    style: RopeStyle,
}

impl Rope {
    pub fn new(cfg: &ModelConfig) -> Self {
        Self::with_theta(cfg, cfg.rope_theta)
    }

    /// Gemma 3's local layers' rotation: base `local_rope_theta`, no scaling.
    pub fn local(cfg: &ModelConfig) -> Option<Self> {
        let g = cfg.gemma?;
        let d = cfg.head_dim;
        Some(Self {
            inv_freq: (0..d / 2)
                .map(|i| 1.0 / g.local_rope_theta.powf(2.0 * i as f32 / d as f32))
                .collect(),
            style: cfg.rope_style,
        })
    }

    fn with_theta(cfg: &ModelConfig, theta: f32) -> Self {
        let d = cfg.head_dim;
        let mut inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 1.0 / theta.powf(2.0 * i as f32 / d as f32))
            .collect();
        match cfg.rope_scaling {
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_positions,
            }) => {
                let old = original_max_positions as f32;
                let (low_wl, high_wl) = (old / low, old / high);
                for f in &mut inv_freq {
                    let wavelength = 2.0 * std::f32::consts::PI / *f;
                    *f = if wavelength < high_wl {
                        *f
                    } else if wavelength > low_wl {
                        *f / factor
                    } else {
                        let smooth = (old / wavelength - low) / (high - low);
                        (1.0 - smooth) * *f / factor + smooth * *f
                    };
                }
            }
            Some(RopeScaling::Linear { factor }) => inv_freq.iter_mut().for_each(|f| *f /= factor),
            None => {}
        }
        if let Some(factors) = &cfg.rope_freq_factors {
            for (f, d) in inv_freq.iter_mut().zip(factors) {
                *f /= d;
            }
        }
        Self {
            inv_freq,
            style: cfg.rope_style,
        }
    }

    /// The rotation frequency of each channel pair.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// Rotates every head of one token's `x` (`[heads, head_dim]`) for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize, cos_sin: &mut Vec<(f32, f32)>) {
        cos_sin.clear();
        cos_sin.extend(self.inv_freq.iter().map(|f| {
            let a = pos as f32 * f;
            (a.cos(), a.sin())
        }));
        let half = self.inv_freq.len();
        for h in x.chunks_exact_mut(2 * half) {
            for (i, &(c, s)) in cos_sin.iter().enumerate() {
                let (a, b) = match self.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Halves => (i, i + half),
                };
                let (x0, x1) = (h[a], h[b]);
                h[a] = x0 * c - x1 * s;
                h[b] = x0 * s + x1 * c;
            }
        }
    }
}

/// `gate = silu(gate) * up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `gate = gelu(gate) * up`, with GELU's tanh approximation (Gemma's).
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        // tanh(y) = 1 - 2 / (e^2y + 1), which saturates to +-1 without a NaN.
        let tanh = 1.0 - 2.0 / ((2.0 * inner).exp() + 1.0);
        *g = 0.5 * x * (1.0 + tanh) * u;
    }
}
