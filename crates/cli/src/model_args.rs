//! Command-line choice of a model and its KV cache, shared by the commands that run one.

use clap::Args;
use vortex_cuda::PoolDtype;
use vortex_flow::runner::FlowRunner;
use vortex_flow::{Flow, Geometry};
use vortex_kv::{KvCache, KvDtype, KvGeometry};
use vortex_model::config::ModelConfig;
use vortex_model::loader::LoadedModel;
use vortex_model::model::{KvState, Model};

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// A model alias (see `vortex model list`), a GGUF file or a Hugging Face folder.
    #[arg(long, default_value = vortex_model::fetch::DEFAULT_MODEL)]
    pub model: String,
    /// Tokens per KV page (a power of two, 1 to 256).
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// Storage type of the KV cache: f32, f16, bf16 or fp8 (e4m3, no scale) on the CPU; bf16 or
    /// fp8 with --device cuda.
    #[arg(long = "kv-dtype", default_value = "bf16", value_parser = ["f32", "f16", "bf16", "fp8"])]
    pub kv_dtype_name: String,
    /// Storage type of the weight matrices. With --device cuda: bf16, or fp8 (e4m3 with a scale
    /// an output row, quantized when loaded; a decode step reads half the bytes); `eval` runs on
    /// the CPU with the same fp8 values, to measure what they cost in accuracy. On the CPU: the
    /// file's own types (bf16, the default), or q8_0 (float matrices quantized to Q8_0 when
    /// loaded, as llama.cpp's Q8_0; quantized ones stay as they are).
    #[arg(long = "weight-dtype", default_value = "bf16", value_parser = ["bf16", "fp8", "q8_0"])]
    pub weight_dtype: String,
    /// Prompt tokens per prefill pass (at least 2).
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

impl ModelArgs {
    /// The CPU cache's storage type.
    pub fn kv_dtype(&self) -> Result<KvDtype, String> {
        let s = &self.kv_dtype_name;
        s.parse().map_err(|e| format!("--kv-dtype {s}: {e}"))
    }

    /// The GPU pool's storage type.
    pub fn gpu_kv_dtype(&self) -> Result<PoolDtype, String> {
        PoolDtype::parse(&self.kv_dtype_name).map_err(|e| format!("--kv-dtype: {e}"))
    }

    /// Bytes of one stored K or V element on the CPU (`gpu` false) or the GPU; fails for a type
    /// that device cannot store, so that a command can say so before it loads a model.
    pub fn kv_elem_bytes(&self, gpu: bool) -> Result<usize, String> {
        if gpu {
            self.gpu_kv_dtype().map(PoolDtype::size)
        } else {
            self.kv_dtype().map(KvDtype::size)
        }
    }

    /// Whether the GPU stores its weight matrices as fp8; an error for the CPU (`gpu` false),
    /// which multiplies by the file's own types or Q8_0, and for q8_0 on the GPU.
    pub fn fp8_weights(&self, gpu: bool) -> Result<bool, String> {
        let fp8 = self.weight_dtype == "fp8";
        if fp8 && !gpu {
            return Err(
                "--weight-dtype fp8 needs --device cuda (the CPU multiplies by the file's own weight types, or q8_0)"
                    .into(),
            );
        }
        if gpu && self.weight_dtype == "q8_0" {
            return Err(
                "--weight-dtype q8_0 is for the CPU; with --device cuda use bf16 or fp8".into(),
            );
        }
        Ok(fp8)
    }

    /// `model` ready for the CPU's steps: with `--weight-dtype q8_0` its float matrices
    /// quantized (said on stderr), then every matrix's rows regrouped for the products.
    pub fn for_cpu(&self, mut model: Model) -> Model {
        if self.weight_dtype == "q8_0" {
            let before = model.weight_bytes();
            model = vortex_model::quantize::q8_0_model(model);
            let after = model.weight_bytes();
            if after < before {
                eprintln!(
                    "weights: float matrices quantized to Q8_0 ({:.1} MB read a token, was {:.1} MB)",
                    after as f64 / 1e6,
                    before as f64 / 1e6
                );
            } else {
                eprintln!(
                    "weights: no matrix a step multiplies by is float; --weight-dtype q8_0 changes none"
                );
            }
        }
        model.group_rows();
        model
    }

    /// Resolves (fetching if needed) and loads the model.
    pub fn load(&self) -> Result<LoadedModel, String> {
        self.prepare()?;
        let path = vortex_model::fetch::resolve(&self.model).map_err(|e| e.to_string())?;
        vortex_model::loader::load(&path).map_err(|e| e.to_string())
    }

    /// Instead of `--model`, a model of a named geometry or a `config.json`'s with seeded random
    /// weights and a byte-level tokenizer whose other ids decode to words (so that streamed
    /// output shows every token); nothing is downloaded. With `on_device` the host
    /// keeps only its shape: a GPU draws the weights.
    pub fn load_random(
        &self,
        geometry: &str,
        seed: u64,
        on_device: bool,
    ) -> Result<LoadedModel, String> {
        self.prepare()?;
        let config = vortex_model::random::geometry(geometry)?;
        let mut loaded = vortex_model::random::tiny(seed);
        loaded.tokenizer = vortex_model::random::byte_tokenizer(config.vocab);
        loaded.model = if on_device {
            vortex_model::model::Model::without_weights(config)
        } else {
            crate::limits::check_memory(
                &format!("random f32 weights of {geometry}"),
                vortex_model::random::random_weight_bytes(&config),
            )?;
            vortex_model::random::random_weights(config, seed)
        };
        loaded.name = format!("random {geometry}");
        loaded.file_bytes = loaded.model.weight_bytes() as u64;
        Ok(loaded)
    }

    /// What every way of loading does first: the thread pool, and the prefill chunk's check.
    fn prepare(&self) -> Result<(), String> {
        if let Some(t) = self.threads {
            rayon::ThreadPoolBuilder::new()
                .num_threads(crate::limits::check_threads(t)?)
                .build_global()
                .map_err(|e| e.to_string())?;
        }
        // A pass of one token is a decode step, which attends through the flow.
        if self.prefill_chunk < 2 {
            return Err("--prefill-chunk must be at least 2".into());
        }
        Ok(())
    }

    pub fn geometry(&self, cfg: &ModelConfig) -> Geometry {
        Geometry {
            heads_q: cfg.heads_q,
            heads_kv: cfg.heads_kv,
            head_dim: cfg.head_dim,
            page_size: self.page_size,
        }
    }

    /// A KV cache with room for `tokens` tokens, and the flow's summaries.
    pub fn kv_state(
        &self,
        cfg: &ModelConfig,
        flow: Flow,
        tokens: usize,
    ) -> Result<KvState, String> {
        let geom = KvGeometry::new(cfg.heads_kv, cfg.head_dim, self.page_size)
            .map_err(|e| e.to_string())?;
        let pages = geom.pages_for(tokens) + 1;
        let cache = KvCache::new(geom, self.kv_dtype()?, cfg.layers, pages);
        Ok(KvState::for_model(cache, FlowRunner::new(flow), cfg))
    }
}
