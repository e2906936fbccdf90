//! A bf16 KV pool of random keys and values, with sequences on shuffled pages, and the values
//! a GPU pool of either element type holds for it.

#![allow(dead_code)] // each test binary uses part of it

use cudarc::driver::CudaSlice;
use half::bf16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_cuda::PoolDtype;
use vortex_flow::library::load;
use vortex_flow::runner::FlowRunner;
use vortex_flow::{Geometry, Settings};
use vortex_kv::{KvDtype, KvGeometry, LayerKv, PageFields, PageTable, Sequence, Storage};

/// A case of the index-phase tests: (heads_q, kv_heads, head_dim, page, budget, sinks, recent,
/// sequence lengths).
pub type SelectionCase = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    &'static [usize],
);

/// A generator from [`crate::common::test_seed`].
pub fn seeded_rng() -> StdRng {
    StdRng::seed_from_u64(crate::common::test_seed())
}

/// The case's flow geometry and KV geometry.
pub fn case_geometry(case: &SelectionCase) -> (Geometry, KvGeometry) {
    let &(heads_q, kv_heads, dim, page, _, _, _, _) = case;
    let g = Geometry {
        heads_q,
        heads_kv: kv_heads,
        head_dim: dim,
        page_size: page,
    };
    (g, KvGeometry::new(kv_heads, dim, page).unwrap())
}

/// The CPU runner of built-in `flow` in the case's geometry, its settings with the case's fixed
/// budget, sinks and recent pages, and the KV geometry.
pub fn case_runner(flow: &str, case: &SelectionCase) -> (FlowRunner, Settings, KvGeometry) {
    let (g, kv) = case_geometry(case);
    let runner = FlowRunner::new(load(flow, g).unwrap());
    let settings = case_settings(&runner.flow.settings, case);
    (runner, settings, kv)
}

/// `settings` with the case's fixed budget, sinks and recent pages.
pub fn case_settings(settings: &Settings, case: &SelectionCase) -> Settings {
    let &(_, _, _, _, budget, sinks, recent, _) = case;
    let mut settings = settings.clone();
    settings.budget = Some(budget);
    settings.budget_ratio = None;
    settings.sinks = sinks;
    settings.recent = recent;
    settings
}

/// `pages` pages of bf16 keys and values, uniform in [-1, 1).
pub fn random_layer(rng: &mut StdRng, geom: KvGeometry, pages: usize) -> LayerKv {
    let mut layer = LayerKv::new(geom, KvDtype::Bf16, 0);
    let n = pages * geom.page_elems();
    let mut draw = || {
        Storage::Bf16(
            (0..n)
                .map(|_| bf16::from_f32(rng.random::<f32>() * 2.0 - 1.0))
                .collect(),
        )
    };
    layer.k = draw();
    layer.v = draw();
    layer
}

/// An f32 copy of `layer` with every value rounded as a pool of `dtype` stores it: what the CPU
/// reads to check kernels over such a pool.
pub fn pool_values(layer: &LayerKv, dtype: PoolDtype) -> LayerKv {
    let round = |s: &Storage| {
        let mut v = vec![0.0f32; s.len()];
        s.read_f32(0, &mut v);
        Storage::F32(v.iter().map(|&x| dtype.kv_dtype().round(x)).collect())
    };
    let mut out = LayerKv::new(layer.geometry(), KvDtype::F32, 0);
    out.k = round(&layer.k);
    out.v = round(&layer.v);
    out
}

/// A pool holding sequences of `lens` tokens (plus three spare pages).
pub struct RandomPool {
    pub layer: LayerKv,
    pub pages: usize,
    pub seqs: Vec<Sequence>,
    /// The sequences' complete pages, in sequence order.
    pub complete: Vec<u32>,
}

impl RandomPool {
    pub fn new(rng: &mut StdRng, kv: KvGeometry, lens: &[usize]) -> Self {
        let page = kv.page_size;
        let pages = lens.iter().map(|l| l.div_ceil(page)).sum::<usize>() + 3;
        let layer = random_layer(rng, kv, pages);
        let mut free: Vec<u32> = (0..pages as u32).collect();
        free.shuffle(rng);
        let seqs: Vec<Sequence> = lens
            .iter()
            .map(|&len| Sequence {
                pages: free.drain(..len.div_ceil(page)).collect(),
                len,
            })
            .collect();
        let complete = seqs
            .iter()
            .flat_map(|s| s.pages[..s.complete_pages(page)].iter().copied())
            .collect();
        Self {
            layer,
            pages,
            seqs,
            complete,
        }
    }
}

/// The CPU's page fields as they are stored, copied to the device.
pub fn upload_fields(dev: &vortex_cuda::Device, fields: &PageFields) -> Vec<CudaSlice<u8>> {
    fields
        .data
        .iter()
        .map(|s| {
            let bytes: Vec<u8> = match s {
                Storage::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Storage::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Storage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Storage::Fp8(v) => v.iter().map(|x| x.0).collect(),
            };
            dev.stream.clone_htod(&bytes).unwrap()
        })
        .collect()
}

/// The pages the GPU kept (`got`) against the CPU's (`want`), row by row, given the CPU's
/// `scores` of each row's logical pages. Scores computed in another order may swap pages that
/// tie to rounding at the threshold (at most one row in ten, or one row where there are fewer
/// than twenty: a long row has a thousand candidates near its threshold); any other difference
/// is a bug.
pub fn assert_rows_agree(
    at: &str,
    seqs: &[Sequence],
    kv_heads: usize,
    scores: &[Vec<f32>],
    got: &PageTable,
    want: &PageTable,
) {
    assert_eq!(got.indptr, want.indptr, "{at}: row lengths");
    assert_eq!(got.last_page_len, want.last_page_len, "{at}");
    let mut differing = 0;
    for (r, row_scores) in scores.iter().enumerate().take(want.rows()) {
        if got.pages(r) == want.pages(r) {
            continue;
        }
        differing += 1;
        let s = r / kv_heads;
        let logical = |p: u32| seqs[s].pages.iter().position(|&x| x == p).unwrap();
        let only = |a: &[u32], b: &[u32]| -> Vec<f32> {
            a.iter()
                .filter(|p| !b.contains(p))
                .map(|&p| row_scores[logical(p)])
                .collect()
        };
        let lo = only(got.pages(r), want.pages(r))
            .into_iter()
            .fold(f32::INFINITY, f32::min);
        let hi = only(want.pages(r), got.pages(r))
            .into_iter()
            .fold(f32::NEG_INFINITY, f32::max);
        assert!(
            hi - lo <= 1e-4 * (1.0 + hi.abs()),
            "{at}: row {r} keeps other pages ({lo} vs {hi})"
        );
    }
    assert!(
        differing <= (want.rows() / 10).max(1),
        "{at}: {differing} of {} rows differ",
        want.rows()
    );
}
