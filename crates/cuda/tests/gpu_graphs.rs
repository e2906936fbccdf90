//! Decode steps replayed from captured CUDA graphs against the same steps launched kernel by
//! kernel, while the batch's sequences complete pages on different steps (as in serving): the
//! logits must be the same, bit for bit, and the graphs must be replayed, not captured anew
//! for every step (dense; the hand-written index phases of block_topk, Quest and h2o; lsh's
//! generated one). Decoding ahead of the host, each step's tokens taken from the last step's
//! argmax on the device, must choose the same tokens as reading each step's argmax first. Skips
//! visibly without a GPU.

mod common;

use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_cuda::PoolDtype;
use vortex_cuda::model::{GpuModel, GpuStep, PoolSpec, WeightSource};
use vortex_flow::Geometry;
use vortex_flow::library::load;
use vortex_flow::state::StateSlot;
use vortex_kv::Sequence;
use vortex_model::config::ModelConfig;

const PAGE: usize = 16;

fn config() -> ModelConfig {
    ModelConfig {
        qk_norm: true,
        gemma: None,
        ..common::small_qwen3()
    }
}

struct Run {
    gpu: GpuModel,
    seqs: Vec<Sequence>,
    slots: Vec<Option<StateSlot>>,
}

impl Run {
    fn new(flow: &str, seed: u64, graphs: bool, batch: usize) -> Option<Self> {
        let dev = common::device_or_skip(&format!("gpu_graphs ({flow})"))?;
        let c = config();
        let g = Geometry {
            heads_q: c.heads_q,
            heads_kv: c.heads_kv,
            head_dim: c.head_dim,
            page_size: PAGE,
        };
        let mut f = load(flow, g).unwrap();
        if flow != "dense" {
            f.settings.budget = Some(4);
            f.settings.budget_ratio = None;
        }
        let pool = PoolSpec {
            page_size: PAGE,
            num_pages: 128,
            dtype: PoolDtype::Bf16,
        };
        let mut gpu = GpuModel::new(dev, c, WeightSource::Random(seed), pool, &f).unwrap();
        gpu.use_graphs = graphs;
        let slots = (0..batch).map(|_| gpu.state_slot().unwrap()).collect();
        Some(Self {
            gpu,
            seqs: vec![Sequence::default(); batch],
            slots,
        })
    }

    fn step(&mut self, tokens: &[Vec<u32>]) -> Vec<Vec<f32>> {
        self.forward(tokens);
        self.gpu.logits().unwrap()
    }

    fn forward(&mut self, tokens: &[Vec<u32>]) {
        let mut steps: Vec<GpuStep> = self
            .seqs
            .iter_mut()
            .zip(tokens)
            .zip(&self.slots)
            .map(|((seq, t), slot)| GpuStep {
                seq,
                tokens: t,
                state: slot.as_ref(),
                flow: 0,
            })
            .collect();
        self.gpu.forward(&mut steps).unwrap();
    }
}

fn replays_match_launches(flow: &str) {
    let seed = common::test_seed();
    // Prompts whose ends lie at different offsets in their last page: every few decode steps
    // some sequence completes a page, and the cache phase runs in that step.
    let lens = [37usize, 42, 47, 52, 61, 66];
    let (Some(mut graphs), Some(mut launches)) = (
        Run::new(flow, seed, true, lens.len()),
        Run::new(flow, seed, false, lens.len()),
    ) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tokens: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..512)).collect())
        .collect();
    let steps = 40;
    for step in 0..=steps {
        let a = graphs.step(&tokens);
        let b = launches.step(&tokens);
        for (row, (a, b)) in a.iter().zip(&b).enumerate() {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{flow}: step {step}, row {row}: replayed logits differ"
            );
        }
        tokens = a
            .iter()
            .map(|l| vec![vortex_model::sampling::argmax(l)])
            .collect();
    }
    let captured = graphs.gpu.graphs_captured;
    eprintln!("{flow}: {captured} graphs captured over {steps} decode steps");
    assert_eq!(launches.gpu.graphs_captured, 0);
    assert!(
        captured > 0 && captured <= steps / 4,
        "{flow}: {captured} graphs captured over {steps} decode steps"
    );
}

#[test]
fn gpu_graphs_replay_dense_steps() {
    replays_match_launches("dense");
}

#[test]
fn gpu_graphs_replay_block_topk_steps() {
    replays_match_launches("block_topk");
}

#[test]
fn gpu_graphs_replay_h2o_steps() {
    replays_match_launches("h2o");
}

/// A generated index phase (and cache phase).
#[test]
fn gpu_graphs_replay_lsh_steps() {
    replays_match_launches("lsh");
}

#[test]
fn gpu_graphs_replay_quest_steps() {
    replays_match_launches("quest");
}

/// fp8 envelopes, scored on the tensor cores.
#[test]
fn gpu_graphs_replay_quest_fp8_steps() {
    replays_match_launches("quest_fp8");
}

/// Greedy decoding ahead of the host against reading each step's tokens first, both replaying
/// graphs: the same tokens at every step and the same last logits, bit for bit. The ahead run is
/// given wrong tokens, which it must not read.
#[test]
fn gpu_graphs_decode_ahead_picks_what_each_step_reads() {
    let seed = common::test_seed();
    let lens = [37usize, 42, 47, 52, 61, 66];
    let (Some(mut read), Some(mut ahead)) = (
        Run::new("block_topk", seed, true, lens.len()),
        Run::new("block_topk", seed, true, lens.len()),
    ) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..512)).collect())
        .collect();
    read.step(&prompts);
    ahead.step(&prompts);
    let wrong: Vec<Vec<u32>> = vec![vec![511]; lens.len()];
    for step in 0..40 {
        let want = read.gpu.argmax().unwrap();
        ahead.gpu.argmax_ahead().unwrap();
        let read_logits = read.step(&want.iter().map(|&t| vec![t]).collect::<Vec<_>>());
        ahead.forward(&wrong);
        assert_eq!(ahead.gpu.picked().unwrap(), want, "step {step}");
        if step == 39 {
            let got = ahead.gpu.logits().unwrap();
            let same = got
                .iter()
                .flatten()
                .zip(read_logits.iter().flatten())
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "the last logits differ");
        }
    }
}

/// Tokens picked ahead are for a decode pass of the same sequences: any other pass is refused
/// before it changes a sequence.
#[test]
fn gpu_graphs_decode_ahead_refuses_another_pass() {
    let Some(mut run) = Run::new("dense", 1, true, 3) else {
        return;
    };
    run.step(&[vec![1, 2, 3], vec![4, 5], vec![6]]);
    run.gpu.argmax_ahead().unwrap();
    let lens: Vec<usize> = run.seqs.iter().map(|s| s.len).collect();
    let tokens = [vec![1], vec![2, 3]];
    let mut steps: Vec<GpuStep> = run
        .seqs
        .iter_mut()
        .take(2)
        .zip(&tokens)
        .map(|(seq, t)| GpuStep {
            seq,
            tokens: t,
            state: None,
            flow: 0,
        })
        .collect();
    let err = run.gpu.forward(&mut steps).unwrap_err().to_string();
    assert!(err.contains("picked ahead"), "{err}");
    assert_eq!(run.seqs.iter().map(|s| s.len).collect::<Vec<_>>(), lens);
    // The decode pass they were picked for still takes them.
    run.step(&[vec![0], vec![0], vec![0]]);
    assert!(run.gpu.picked().is_ok());
}
