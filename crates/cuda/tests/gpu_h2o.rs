//! The GPU index phase of the built-in `h2o` flow against the CPU flow runner over several
//! decode steps: each request's accumulated mass on the device matches its CPU state after
//! every step, the same pages are selected, and a slot taken again starts from zero. Skips
//! visibly without a GPU.

mod common;
#[path = "common/random_pool.rs"]
mod random_pool;

use half::bf16;
use rand::Rng;
use random_pool::{RandomPool, SelectionCase, case_runner, seeded_rng};
use vortex_cuda::DeviceTable;
use vortex_cuda::h2o::HeavyHitters;
use vortex_cuda::index_row::sel_rows;
use vortex_flow::Settings;
use vortex_flow::runner::StepSeq;
use vortex_flow::state::{RequestState, StateSlot};
use vortex_kv::{PageTable, Sequence};

const STEPS: usize = 4;

#[test]
fn h2o_accumulates_the_cpu_mass_and_selects_its_pages() {
    let Some(dev) = common::device_or_skip("h2o_accumulates_the_cpu_mass_and_selects_its_pages")
    else {
        return;
    };
    let mut rng = seeded_rng();
    // Each case has a sequence that the budget covers (dense: no index phase, no state) and
    // one whose last page is complete.
    let cases: &[SelectionCase] = &[
        (
            32,
            8,
            128,
            16,
            128,
            1,
            4,
            &[33_000, 5000, 2048, 100, 20_000],
        ),
        (8, 2, 64, 8, 40, 4, 8, &[9000, 333, 41, 20_000]),
        (16, 4, 128, 16, 300, 2, 3, &[70_000, 4096, 1000]),
        // Fewer than four query heads per KV head: unused columns of the tensor-core scores.
        (16, 8, 128, 16, 128, 1, 4, &[20_000, 3000, 700]),
        (9, 3, 64, 16, 64, 1, 2, &[9000, 500, 40]),
        // Seven and eight query heads per KV head: the parts and rests in two tiles.
        (14, 2, 64, 16, 64, 1, 2, &[9000, 1000]),
        (16, 2, 128, 16, 96, 1, 2, &[9000, 3000, 41]),
    ];
    let mut most_parts = 1;
    for case in cases {
        let (runner, settings, kv) = case_runner("h2o", case);
        let &(heads_q, kv_heads, dim, page, _, _, _, lens) = case;
        let RandomPool {
            layer,
            pages: pool,
            seqs,
            complete,
        } = RandomPool::new(&mut rng, kv, lens);
        let mut fields = runner.new_fields(pool);
        runner.summarize(&layer, &mut fields, &complete);
        let mut states: Vec<RequestState> = seqs.iter().map(|_| runner.new_state(1)).collect();

        let refs: Vec<&Sequence> = seqs.iter().collect();
        let dense = DeviceTable::upload(&dev, &PageTable::dense(&refs, page), kv_heads, page, pool)
            .unwrap();
        let centroid = dev
            .stream
            .clone_htod(fields.data[0].as_slice::<bf16>().unwrap())
            .unwrap();
        let mut h2o = HeavyHitters::new(&dev, kv, heads_q, &[true], pool).unwrap();
        let slots: Vec<StateSlot> = seqs.iter().map(|_| h2o.take_slot(&dev).unwrap()).collect();
        let slot_refs: Vec<Option<&StateSlot>> = slots.iter().map(Some).collect();
        let per_seq: Vec<&Settings> = seqs.iter().map(|_| &settings).collect();
        let rows = sel_rows(&dense.row_pages, &per_seq, 0, lens, kv_heads);
        assert!(rows.iter().any(|r| r.dense != 0) && rows.iter().any(|r| r.dense == 0));

        for step in 0..STEPS {
            // Peaked enough that the pages' masses differ well beyond rounding.
            let q: Vec<f32> = (0..lens.len() * heads_q * dim)
                .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * 4.0)
                .collect();
            let mut batch: Vec<StepSeq> = seqs
                .iter()
                .zip(states.iter_mut())
                .map(|(seq, st)| StepSeq {
                    seq,
                    settings: &settings,
                    state: Some(&mut st.layers[0]),
                })
                .collect();
            let mut want = PageTable::default();
            runner.select(0, &fields, &q, &mut batch, &mut want);

            let dq = dev.stream.clone_htod(&q).unwrap();
            // Steps alternate between the blocks a row the step plans (a cluster of them where
            // rows are few) and one block a row.
            h2o.split.fixed = if step % 2 == 0 { None } else { Some(1) };
            most_parts = most_parts.max(h2o.parts(&rows));
            let mut sparse = h2o.prepare(&dev, &dense, &rows, &slot_refs, None).unwrap();
            h2o.launch(&dev, 0, &dense, &centroid, pool, &dq, &rows, &mut sparse)
                .unwrap();
            let got = sparse.download(&dev).unwrap();
            assert_eq!(got.indptr, want.indptr, "step {step}: row lengths");
            assert_eq!(got.last_page_len, want.last_page_len);

            // The mass of every complete page after this step, [kv_head][page] on the device
            // and [page][kv_head] on the CPU (empty for a sequence never scored).
            let mut masses = Vec::new();
            for (b, seq) in seqs.iter().enumerate() {
                let gpu = h2o.mass(&dev, 0, &slots[b]).unwrap();
                let cpu = &states[b].layers[0].fields[0];
                let n = seq.complete_pages(page);
                let mut m = vec![vec![0.0f32; n]; kv_heads];
                for (h, mh) in m.iter_mut().enumerate() {
                    for (p, x) in mh.iter_mut().enumerate() {
                        let c = cpu.get(p * kv_heads + h).copied().unwrap_or(0.0);
                        let d = gpu[h * pool + p];
                        assert!(
                            (c - d).abs() <= 1e-4 * c.abs() + 1e-7,
                            "step {step} seq {b} head {h} page {p}: mass {d} vs {c}"
                        );
                        *x = c;
                    }
                }
                masses.push(m);
            }
            // Masses summed in a different order may swap pages that tie to rounding at the
            // threshold; any other difference is a bug.
            let mut differing = 0;
            for r in 0..want.rows() {
                if got.pages(r) == want.pages(r) {
                    continue;
                }
                differing += 1;
                let (s, h) = (r / kv_heads, r % kv_heads);
                let pos = |p: u32| seqs[s].pages.iter().position(|&x| x == p).unwrap();
                let mass = |a: &[u32], b: &[u32]| -> Vec<f32> {
                    a.iter()
                        .filter(|p| !b.contains(p))
                        .map(|&p| masses[s][h][pos(p)])
                        .collect()
                };
                let lo = mass(got.pages(r), want.pages(r))
                    .into_iter()
                    .fold(f32::INFINITY, f32::min);
                let hi = mass(want.pages(r), got.pages(r))
                    .into_iter()
                    .fold(f32::NEG_INFINITY, f32::max);
                assert!(
                    hi - lo <= 1e-5 * hi.abs(),
                    "step {step} row {r}: pages differ beyond rounding ({lo} vs {hi})"
                );
            }
            assert!(
                differing * 20 <= want.rows(),
                "step {step}: {differing} of {} rows differ",
                want.rows()
            );
        }
        // Two sequences may not share a slot.
        let mut shared = slot_refs.clone();
        shared[1] = shared[0];
        assert!(h2o.prepare(&dev, &dense, &rows, &shared, None).is_err());
        // A slot handed back and taken again holds no mass of its last request.
        let id = slots[0].id();
        drop(slot_refs);
        drop(slots);
        let again = h2o.take_slot(&dev).unwrap();
        assert_eq!(again.id(), id);
        let m = h2o.mass(&dev, 0, &again).unwrap();
        assert!(m.iter().all(|&x| x == 0.0), "a reused slot starts at zero");
    }
    if dev.clusters {
        assert!(most_parts > 1, "no step split its rows over a cluster");
    }
}
