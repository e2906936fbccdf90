//! `vortex`: check, explain and benchmark sparse-attention flows.

mod bench_attention;
mod bench_cuda;
mod bench_cuda_decode;
mod bench_cuda_sparse;
mod bench_decode;
mod bench_serve;
mod device_arg;
#[cfg(test)]
mod doc_commands;
mod eval_cmd;
mod flow_args;
mod flow_cmd;
mod flow_template;
mod generate_cmd;
mod limits;
mod model_args;
mod model_cmd;
mod serve_cmd;

use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use vortex_flow::Geometry;

#[derive(Parser)]
#[command(
    name = "vortex",
    version,
    about = "Serving engine for LLMs with programmable sparse decode attention"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Work with flows: list the built-ins, check, explain.
    #[command(subcommand)]
    Flow(flow_cmd::FlowCommand),
    /// Generate text with a model (streams tokens, ends with a summary).
    Generate(generate_cmd::GenerateArgs),
    /// Fetch, list and describe models.
    #[command(subcommand)]
    Model(model_cmd::ModelCommand),
    /// Serve the OpenAI-compatible HTTP API (completions, chat, models, health, metrics).
    Serve(Box<serve_cmd::ServeArgs>),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Long-context accuracy of sparse flows against dense, with attention fidelity.
    Eval(eval_cmd::EvalArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Paged decode attention, dense against every flow, over batch x context x budget (on the
    /// CPU, or a GPU with --device).
    Attention(bench_attention::AttentionArgs),
    /// Prefill and decode tokens/s of a model, dense against sparse flows.
    Decode(bench_decode::DecodeArgs),
    /// Load a running server over its HTTP API: throughput, TTFT, TPOT, latency percentiles.
    Serve(Box<bench_serve::ServeArgs>),
}

/// The attention shape a flow is checked or run for.
#[derive(Args, Clone, Copy, Debug)]
pub struct GeometryArgs {
    /// Query heads.
    #[arg(long, default_value_t = 32)]
    pub heads_q: usize,
    /// KV heads (query heads must be a multiple).
    #[arg(long, default_value_t = 8)]
    pub heads_kv: usize,
    /// Width of one head.
    #[arg(long, default_value_t = 128)]
    pub head_dim: usize,
    /// Tokens per KV page (a power of two, 1 to 256).
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
}

impl GeometryArgs {
    pub fn geometry(&self) -> Result<Geometry, String> {
        let g = Geometry {
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            page_size: self.page_size,
        };
        g.validate().map(|_| g)
    }
}

/// Every value of every command may be a negative number (`--budget -1`), so that it gets the
/// flag's own message rather than "unexpected argument '-1'".
fn negatives_as_values(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        let takes_values = a.get_action().takes_values();
        a.allow_negative_numbers(takes_values)
    })
    .mut_subcommands(negatives_as_values)
}

fn main() -> ExitCode {
    let matches = negatives_as_values(Cli::command()).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Flow(cmd) => flow_cmd::run(cmd),
        Command::Generate(args) => generate_cmd::run(args),
        Command::Model(cmd) => model_cmd::run(cmd),
        Command::Serve(args) => serve_cmd::run(*args),
        Command::Bench(BenchCommand::Attention(args)) => bench_attention::run(args),
        Command::Bench(BenchCommand::Decode(args)) => bench_decode::run(args),
        Command::Bench(BenchCommand::Serve(args)) => bench_serve::run(*args),
        Command::Eval(args) => eval_cmd::run_eval(args),
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}
