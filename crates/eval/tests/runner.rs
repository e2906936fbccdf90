//! The runner on a tiny random model: every task is sized to its length, dense comes first and
//! is exact, every flow answers every sample, and bad plans are refused with a clear message.

mod common;

use vortex_eval::report::{accuracy_tables, cells};
use vortex_eval::runner::{EvalPlan, Progress, run};
use vortex_eval::spec::{Budget, flow_specs};
use vortex_eval::tasks::Task;
use vortex_flow::Geometry;
use vortex_kv::KvDtype;

fn plan(tasks: Vec<Task>, lengths: Vec<usize>, flows: &[&str]) -> EvalPlan {
    let g = Geometry {
        heads_q: 4,
        heads_kv: 2,
        head_dim: 16,
        page_size: 16,
    };
    let names: Vec<String> = flows.iter().map(|s| s.to_string()).collect();
    EvalPlan {
        tasks,
        lengths,
        flows: flow_specs(&names, &[Budget::parse("1/8").unwrap()], g).unwrap(),
        samples: 2,
        seed: 5,
        fidelity_steps: 1,
        fidelity_layer_stride: 1,
        speed_tokens: 4,
        page_size: 16,
        kv_dtype: KvDtype::Bf16,
        prefill_chunk: 256,
        stop_tokens: vec![],
    }
}

#[test]
fn runs_every_flow_on_every_sample() {
    let model = common::tiny_model(1);
    let tok = common::byte_tokenizer();
    let p = plan(Task::ALL.to_vec(), vec![1024], &["streaming", "quest"]);
    let mut prefilled = 0;
    let res = run(&model, &tok, &p, &mut |e| {
        if let Progress::Prefilled {
            prompt_tokens,
            task,
            ..
        } = e
        {
            prefilled += 1;
            assert!(prompt_tokens + task.max_tokens() + 4 < 1024);
            assert!(
                prompt_tokens > 900,
                "the haystack fills the length: {prompt_tokens}"
            );
        }
    })
    .unwrap();
    assert_eq!(prefilled, 4 * 2);
    assert_eq!(res.samples.len(), 4 * 2 * 3);
    assert_eq!(
        res.speed.len(),
        3,
        "one speed measurement per flow and length"
    );
    for r in res.samples.iter().filter(|r| r.flow == "dense") {
        assert_eq!(r.fidelity.rows, 2 * 2);
        assert!((r.fidelity.mass_recall - 1.0).abs() < 1e-9 && r.fidelity.rel_error < 1e-4);
    }
    let sparse: Vec<_> = res
        .samples
        .iter()
        .filter(|r| r.flow == "streaming 1/8")
        .collect();
    assert!(sparse.iter().all(|r| r.fidelity.mass_recall < 1.0));
    let labels: Vec<String> = p.flows.iter().map(|f| f.label.clone()).collect();
    assert_eq!(labels[0], "dense");
    let c = cells(&res, &p.tasks, &p.lengths, &labels);
    assert_eq!(c.len(), 5 * 3, "four tasks and all, three flows");
    assert!(
        c.iter()
            .filter(|c| c.flow == "dense")
            .all(|c| c.gap_vs_dense == 0.0)
    );
    let t = accuracy_tables(&c, &p.lengths, &labels);
    let dense_row = t.find("| dense |").unwrap();
    assert!(dense_row < t.find("| streaming 1/8 |").unwrap());
}

#[test]
fn samples_are_deterministic_and_answers_planted() {
    let tok = common::byte_tokenizer();
    let enc = |t: &str| tok.encode(t, false);
    for task in Task::ALL {
        let a = vortex_eval::tasks::sample(task, 9, (800, 700), (1, 3), &enc).unwrap();
        let b = vortex_eval::tasks::sample(task, 9, (800, 700), (1, 3), &enc).unwrap();
        // The room left for the answer does not change the sample.
        let shorter = vortex_eval::tasks::sample(task, 9, (800, 690), (1, 3), &enc).unwrap();
        assert_eq!(a.answers, shorter.answers);
        assert_eq!(a.depth, shorter.depth);
        assert_eq!(a.prompt, b.prompt);
        let text = tok.decode(&a.prompt);
        for ans in &a.answers {
            assert!(
                text.contains(ans.as_str()),
                "{task:?}: {ans} not in the prompt"
            );
        }
        let c = vortex_eval::tasks::sample(task, 10, (800, 700), (1, 3), &enc).unwrap();
        assert_ne!(a.prompt, c.prompt, "another seed gives another sample");
    }
}

#[test]
fn bad_plans_are_refused() {
    let model = common::tiny_model(1);
    let err = plan(vec![Task::Passkey], vec![8192], &["quest"])
        .validate(&model)
        .unwrap_err();
    assert!(err.contains("beyond the model's context of 4096"), "{err}");
    let err = plan(vec![Task::Passkey], vec![40], &["quest"])
        .validate(&model)
        .unwrap_err();
    assert!(err.contains("too short"), "{err}");
    assert!(Task::parse("passkey").is_ok());
    let err = Task::parse("haystack").unwrap_err();
    assert!(
        err.contains("unknown task 'haystack'") && err.contains("vartrack"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("vortex-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.flow");
    std::fs::write(&bad, "flow bad \"x\"\nindex:\n  s = dot(q, K)\n  topk(s)\n").unwrap();
    let err = flow_specs(
        &[bad.display().to_string()],
        &[Budget::parse("1/8").unwrap()],
        Geometry::default(),
    )
    .unwrap_err();
    assert!(
        err.contains("bad.flow:3:") && err.contains("error"),
        "{err}"
    );
}

/// A length whose prompt would hold no filler is refused before any sample runs, naming the
/// task and the length.
#[test]
fn lengths_without_room_for_filler_are_refused_up_front() {
    let model = common::tiny_model(1);
    let tok = common::byte_tokenizer();
    let p = plan(
        vec![Task::Passkey, Task::Needle],
        vec![1024, 200],
        &["quest"],
    );
    let mut ran = 0;
    let err = run(&model, &tok, &p, &mut |_| ran += 1).unwrap_err();
    assert!(err.contains("at length 200"), "{err}");
    assert_eq!(ran, 0, "nothing ran before the refusal");
}

/// Needle depths spread over the samples asked for: two samples test the first and the last
/// depth, one the middle.
#[test]
fn needle_depths_spread_over_the_samples() {
    let tok = common::byte_tokenizer();
    let enc = |t: &str| tok.encode(t, false);
    let depths = |samples: usize| -> Vec<f64> {
        (0..samples)
            .map(|i| {
                vortex_eval::tasks::sample(Task::Needle, 3, (900, 800), (i, samples), &enc)
                    .unwrap()
                    .depth
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(depths(1), [0.5]);
    assert_eq!(depths(2), [0.1, 0.9]);
    assert_eq!(depths(4), [0.1, 0.3, 0.7, 0.9]);
    assert_eq!(depths(7), [0.1, 0.3, 0.5, 0.7, 0.9, 0.1, 0.3]);
}
