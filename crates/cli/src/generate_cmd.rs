//! `vortex generate`: one request through the model, streamed to the terminal.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;
use vortex_cuda::Device;
use vortex_cuda::model::{GpuModel, GpuStep, PoolSpec, WeightSource};
use vortex_kv::{KvGeometry, Sequence};
use vortex_model::chat::ChatMessage;
use vortex_model::chat_prompt::chat_prompt;
use vortex_model::generate::{FinishReason, GenerateParams, generate, generate_with};
use vortex_model::model::ForwardError;
use vortex_model::sampling::SamplingParams;

use crate::device_arg::DeviceArg;
use crate::flow_args::FlowArgs;
use crate::model_args::ModelArgs;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Plain text to continue.
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// A user message, formatted with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[command(flatten)]
    flow: FlowArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Where the model runs: cpu, cuda or cuda:N (flows get generated GPU kernels; block_topk,
    /// block_topk_fp8, quest, quest_fp8 and h2o have hand-written ones).
    #[arg(long, default_value = "cpu")]
    device: DeviceArg,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop before this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Stop at this token id (repeatable).
    #[arg(long)]
    pub stop_token: Vec<u32>,
    /// Keep going past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    pub fn params(&self) -> Result<SamplingParams, String> {
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: Vec::new(),
            seed: self.seed,
        };
        p.validate()?;
        Ok(p)
    }
}

/// Every `--stop-token` inside a vocabulary of `vocab` ids.
fn check_stop_tokens(ids: &[u32], vocab: usize) -> Result<(), String> {
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => Err(format!(
            "--stop-token: token id {t} is outside the vocabulary of {vocab}"
        )),
        None => Ok(()),
    }
}

pub fn run(args: GenerateArgs) -> Result<ExitCode, String> {
    // clap's `requires` lets --system through beside --prompt, which conflicts with --chat.
    if args.system.is_some() && args.chat.is_none() {
        return Err("--system needs --chat (it is the system message of a chat)".into());
    }
    let sampling = args.sampling.params()?;
    let fp8_weights = args
        .model
        .fp8_weights(matches!(args.device, DeviceArg::Cuda(_)))?;
    // A missing GPU is said before any model is fetched or loaded.
    let gpu = match args.device {
        DeviceArg::Cpu => None,
        DeviceArg::Cuda(ordinal) => Some(Device::open(ordinal).map_err(|e| e.to_string())?),
    };
    args.model.kv_elem_bytes(gpu.is_some())?;
    let mut loaded = args.model.load()?;
    if gpu.is_none() {
        loaded.model = args.model.for_cpu(loaded.model);
    }
    let prompt = match (&args.prompt, &args.chat) {
        (Some(p), _) => loaded.tokenizer.encode(p, true),
        (None, Some(c)) => {
            let mut messages = Vec::new();
            if let Some(s) = &args.system {
                messages.push(ChatMessage::system(s));
            }
            messages.push(ChatMessage::user(c));
            chat_prompt(&loaded.chat, &loaded.tokenizer, &messages).map_err(|e| e.to_string())?
        }
        (None, None) => unreachable!("clap requires --prompt or --chat"),
    };
    if prompt.is_empty() {
        return Err("the prompt is empty".into());
    }
    let cfg = &loaded.model.config;
    check_stop_tokens(&args.sampling.stop_token, cfg.vocab)?;
    let max_tokens = args
        .sampling
        .max_tokens
        .min(cfg.max_positions.saturating_sub(prompt.len()));
    if prompt.len().saturating_add(args.sampling.max_tokens) > cfg.max_positions {
        return Err(format!(
            "the prompt has {} tokens; with --max-tokens {} that exceeds the model's context of {}",
            prompt.len(),
            args.sampling.max_tokens,
            cfg.max_positions
        ));
    }
    let flow = args.flow.load(args.model.geometry(cfg), cfg.layers)?;
    let flow_name = flow.name.clone();
    let settings = flow.settings.clone();
    let params = GenerateParams {
        sampling,
        max_tokens,
        stop: args.sampling.stop.clone(),
        // The model's own end tokens stop generation unless --ignore-eos, as in the server.
        stop_tokens: if args.sampling.ignore_eos {
            args.sampling.stop_token.clone()
        } else {
            [args.sampling.stop_token.clone(), loaded.stop_tokens.clone()].concat()
        },
        ignore_eos: args.sampling.ignore_eos,
        settings,
        prefill_chunk: args.model.prefill_chunk,
    };
    let mut stdout = std::io::stdout();
    let json = args.json;
    let mut on_text = |piece: &str| {
        if !json {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
    };
    let out = match gpu {
        None => {
            let mut kv = args.model.kv_state(cfg, flow, prompt.len() + max_tokens)?;
            generate(
                &loaded.model,
                &loaded.tokenizer,
                &mut kv,
                &prompt,
                &params,
                &mut on_text,
            )
        }
        Some(dev) => {
            let geom = KvGeometry::new(cfg.heads_kv, cfg.head_dim, args.model.page_size)
                .map_err(|e| e.to_string())?;
            let pool = PoolSpec {
                page_size: args.model.page_size,
                num_pages: geom.pages_for(prompt.len() + max_tokens) + 1,
                dtype: args.model.gpu_kv_dtype()?,
            };
            let mut gpu = GpuModel::new(
                dev,
                cfg.clone(),
                WeightSource::Model(&loaded.model),
                pool,
                &flow,
            )
            .map_err(|e| e.to_string())?;
            if fp8_weights {
                gpu.use_fp8_weights().map_err(|e| e.to_string())?;
            }
            let mut seq = Sequence::default();
            let slot = gpu.state_slot().map_err(|e| e.to_string())?;
            let backend = |e: vortex_cuda::CudaError| ForwardError::Backend(e.to_string());
            generate_with(
                &mut |tokens| {
                    gpu.forward(&mut [GpuStep {
                        seq: &mut seq,
                        tokens,
                        state: slot.as_ref(),
                        flow: 0,
                    }])
                    .map_err(backend)?;
                    Ok(gpu.logits().map_err(backend)?.pop().unwrap_or_default())
                },
                &loaded.tokenizer,
                &prompt,
                &params,
                &mut on_text,
            )
            .map(|mut o| {
                o.pages_used = seq.pages.len();
                o
            })
        }
    }
    .map_err(|e| e.to_string())?;
    let prefill_tps = out.prompt_tokens as f64 / out.prefill_secs.max(1e-9);
    let decode_tps = out.tokens.len() as f64 / out.decode_secs.max(1e-9);
    let finish = match out.finish {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    };
    if json {
        let v = json!({
            "model": loaded.name,
            "flow": flow_name,
            "text": out.text,
            "tokens": out.tokens,
            "finish_reason": finish,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.tokens.len(),
            "prefill_tokens_per_s": prefill_tps,
            "decode_tokens_per_s": decode_tps,
            "kv_pages_used": out.pages_used,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        println!();
        eprintln!(
            "[{} | flow {flow_name} | prompt {} tokens, prefill {prefill_tps:.1} tok/s | {} tokens, decode {decode_tps:.1} tok/s | {} KV pages | finish: {finish}]",
            loaded.name,
            out.prompt_tokens,
            out.tokens.len(),
            out.pages_used
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::check_stop_tokens;

    #[test]
    fn stop_tokens_must_be_in_the_vocabulary() {
        assert_eq!(check_stop_tokens(&[0, 49151], 49152), Ok(()));
        assert_eq!(
            check_stop_tokens(&[2, 99999999], 49152),
            Err("--stop-token: token id 99999999 is outside the vocabulary of 49152".into())
        );
        assert!(check_stop_tokens(&[49152], 49152).is_err());
    }
}
