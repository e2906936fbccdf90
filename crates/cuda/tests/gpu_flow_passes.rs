//! Generated index phases that run in passes (a softmax or reductions over pages, per-request
//! state) on the GPU against the CPU flow runner over several decode steps: the same pages are
//! kept for every (sequence, KV head), and each request's state on the device matches its CPU
//! state after every step. Skips visibly without a GPU.

mod common;
#[path = "common/pass_flows.rs"]
#[allow(dead_code)] // wide runs in gpu_generated_flows
mod pass_flows;
#[path = "common/random_pool.rs"]
mod random_pool;

use pass_flows::{DECAY, FIVE_STATES, HALVES_FP8, PREVIOUS, SIX_FP8, SPREAD};
use rand::Rng;
use random_pool::{
    RandomPool, SelectionCase, assert_rows_agree, case_geometry, case_settings, seeded_rng,
    upload_fields,
};
use vortex_cuda::generated::GeneratedFlow;
use vortex_cuda::index_row::sel_rows;
use vortex_cuda::{DeviceTable, PoolDtype, codegen};
use vortex_flow::runner::{FlowRunner, StepSeq};
use vortex_flow::state::{RequestState, StateSlot};
use vortex_flow::{Flow, Geometry, Settings, compile, library};
use vortex_kv::{PageTable, Sequence};

const STEPS: usize = 3;

fn flows(g: Geometry) -> Vec<Flow> {
    vec![
        library::load("h2o", g).unwrap(),
        compile("spread.flow", SPREAD, g).unwrap(),
        compile("decay.flow", DECAY, g).unwrap(),
        compile("halves_fp8.flow", HALVES_FP8, g).unwrap(),
        compile("six_fp8.flow", SIX_FP8, g).unwrap(),
        compile("previous.flow", PREVIOUS, g).unwrap(),
        compile("five_states.flow", FIVE_STATES, g).unwrap(),
    ]
}

#[test]
fn flows_in_passes_match_the_cpu_runner() {
    let Some(dev) = common::device_or_skip("flows_in_passes_match_the_cpu_runner") else {
        return;
    };
    let mut rng = seeded_rng();
    // Each case has a sequence the budget covers (dense: no index phase, no state). In the
    // first, the longest sequence's budget is only its sinks and recent pages: its rows keep no
    // candidate but still read and save state, and the launch sizes its keys for the others.
    let cases: &[SelectionCase] = &[
        (32, 8, 128, 16, 64, 1, 4, &[9000, 2100, 300, 40]),
        (8, 2, 64, 8, 24, 2, 2, &[3000, 777, 64]),
        (16, 2, 128, 16, 48, 1, 2, &[5000, 900, 30]),
    ];
    // Every flow's kernels compiled at once on every core, not one by one in the loop.
    let all: Vec<Flow> = cases
        .iter()
        .flat_map(|c| flows(case_geometry(c).0))
        .collect();
    let builds: Vec<_> = all.iter().map(|f| (f, PoolDtype::Bf16)).collect();
    GeneratedFlow::warm(&dev, &builds).unwrap();
    let mut ran = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        let &(heads_q, kv_heads, dim, page, _, sinks, recent, lens) = case;
        let (g, kv) = case_geometry(case);
        for flow in flows(g) {
            assert!(codegen::runs_in_passes(&flow), "{}", flow.name);
            let runner = FlowRunner::new(flow);
            let name = runner.flow.name.clone();
            let settings = case_settings(&runner.flow.settings, case);
            let starved = Settings {
                budget: Some(sinks + recent),
                ..settings.clone()
            };
            let seq_settings: Vec<&Settings> = (0..lens.len())
                .map(|b| {
                    if ci == 0 && b == 0 {
                        &starved
                    } else {
                        &settings
                    }
                })
                .collect();
            let RandomPool {
                layer,
                pages: pool,
                seqs,
                complete,
            } = RandomPool::new(&mut rng, kv, lens);
            let mut fields = runner.new_fields(pool);
            runner.summarize(&layer, &mut fields, &complete);
            let gpu_fields = upload_fields(&dev, &fields);
            let mut gen_flow = GeneratedFlow::new(&dev, &runner.flow, PoolDtype::Bf16)
                .unwrap()
                .for_sequences(&dev, &[true], pool)
                .unwrap();
            let keeps = !runner.flow.states.is_empty();
            assert_eq!(gen_flow.keeps_state(), keeps);
            let slots: Vec<StateSlot> = if keeps {
                seqs.iter()
                    .map(|_| gen_flow.take_slot(&dev).unwrap())
                    .collect()
            } else {
                Vec::new()
            };
            let slot_refs: Vec<Option<&StateSlot>> =
                (0..seqs.len()).map(|b| slots.get(b)).collect();
            let mut states: Vec<RequestState> = seqs.iter().map(|_| runner.new_state(1)).collect();

            let refs: Vec<&Sequence> = seqs.iter().collect();
            let dense =
                DeviceTable::upload(&dev, &PageTable::dense(&refs, page), kv_heads, page, pool)
                    .unwrap();
            let rows = sel_rows(&dense.row_pages, &seq_settings, 0, lens, kv_heads);
            assert!(rows.iter().any(|r| r.dense != 0) && rows.iter().any(|r| r.dense == 0));
            assert_eq!(
                rows.iter().any(|r| r.dense == 0 && r.k == 0),
                ci == 0,
                "{name}: a row that keeps no candidate"
            );
            if codegen::scratch_floats(&runner.flow) > 0 && !keeps {
                let mut short = GeneratedFlow::new(&dev, &runner.flow, PoolDtype::Bf16)
                    .unwrap()
                    .for_sequences(&dev, &[true], 2)
                    .unwrap();
                assert!(
                    short
                        .prepare(&dev, &dense, &rows, &slot_refs, None)
                        .is_err(),
                    "{name}: rows longer than the scratch holds"
                );
            }
            if keeps {
                let none = vec![None; seqs.len()];
                assert!(
                    gen_flow.prepare(&dev, &dense, &rows, &none, None).is_err(),
                    "{name}: a step without state slots"
                );
            }

            for step in 0..STEPS {
                let q: Vec<f32> = (0..lens.len() * heads_q * dim)
                    .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * 4.0)
                    .collect();
                let mut batch: Vec<StepSeq> = seqs
                    .iter()
                    .zip(states.iter_mut())
                    .zip(&seq_settings)
                    .map(|((seq, st), &settings)| StepSeq {
                        seq,
                        settings,
                        state: keeps.then_some(&mut st.layers[0]),
                    })
                    .collect();
                let scores = runner.scores(0, &fields, &q, &mut batch);
                let mut want = PageTable::default();
                runner.table_from_scores(0, &batch, &scores, &mut want);

                let dq = dev.stream.clone_htod(&q).unwrap();
                let mut sparse = gen_flow
                    .prepare(&dev, &dense, &rows, &slot_refs, None)
                    .unwrap();
                gen_flow
                    .launch(&dev, 0, &dense, &gpu_fields, pool, &dq, &rows, &mut sparse)
                    .unwrap();
                let got = sparse.download(&dev).unwrap();
                let at = format!("{name} ({heads_q}/{kv_heads}/{dim}) step {step}");

                // Every state field of every complete page: [kv_head][page][elems] on the
                // device, [page][kv_head][elems] on the CPU (empty for a sequence never scored).
                for (f, spec) in runner.flow.states.iter().enumerate() {
                    let e = spec.rows * spec.cols;
                    for (b, seq) in seqs.iter().enumerate() {
                        let gpu = gen_flow.state(&dev, 0, f, &slots[b]).unwrap();
                        let cpu = &states[b].layers[0].fields[f];
                        for h in 0..kv_heads {
                            for p in 0..seq.complete_pages(page) {
                                for i in 0..e {
                                    let c = cpu.get((p * kv_heads + h) * e + i).copied();
                                    let d = gpu[(h * pool + p) * e + i];
                                    let c = c.unwrap_or(0.0);
                                    assert!(
                                        (c - d).abs() <= 1e-4 * c.abs() + 1e-6,
                                        "{at}: state {} seq {b} head {h} page {p} [{i}]: {d} vs {c}",
                                        spec.name
                                    );
                                }
                            }
                        }
                    }
                }

                assert_rows_agree(&at, &seqs, kv_heads, &scores, &got, &want);
            }
            ran.push(format!("{name}/{heads_q}/{dim}"));
        }
    }
    eprintln!("compared: {}", ran.join(", "));
}
