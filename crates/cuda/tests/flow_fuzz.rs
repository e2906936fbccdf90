//! Random well-typed flows: page fields of every dtype and several shapes, written by cache
//! phases over K and V; index phases of dot products, column folds, envelopes, products by
//! constant matrices, softmax and reductions over pages, and state. Every flow the checker
//! accepts must run on the CPU (cache and index phases) and be generated as CUDA, or be
//! declined with a message, without a panic. Needs no GPU. Where NVRTC loads
//! (`VORTEX_CUDA_LIB_DIR`), the generated texts must also compile for sm_90.
//!
//! `VORTEX_FLOW_FUZZ_CASES` sets the flows tried (default 120); `VORTEX_FLOW_FUZZ_SEED` the
//! first seed.

use std::panic::{AssertUnwindSafe, catch_unwind};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vortex_cuda::PoolDtype;
use vortex_cuda::compile::compile_all;
use vortex_flow::runner::{FlowRunner, StepSeq};
use vortex_flow::{Flow, Geometry, compile};
use vortex_kv::{KvCache, KvDtype, KvGeometry, Sequence};

const GEOMETRIES: [Geometry; 4] = [
    geom(8, 2, 64, 16),
    geom(2, 2, 32, 8),
    geom(7, 1, 128, 16),
    geom(3, 3, 16, 4),
];

const fn geom(heads_q: usize, heads_kv: usize, head_dim: usize, page_size: usize) -> Geometry {
    Geometry {
        heads_q,
        heads_kv,
        head_dim,
        page_size,
    }
}

/// A page field's shape.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// `[1, D]`: one key-wide row.
    Row,
    /// `[1, 1]`.
    Scalar,
    /// `[2, D]`.
    Rows2,
    /// `[1, 8]`: eight columns (a product by a constant, or kept channels).
    Narrow,
    /// `[1, D / 2]`: half a key's columns.
    Half,
    /// `[P, D / 8]`: an eighth of every key's channels.
    Channels,
}

/// Builds one random flow's text.
struct Writer<'a> {
    rng: &'a mut StdRng,
}

impl Writer<'_> {
    fn pick<'s>(&mut self, xs: &[&'s str]) -> &'s str {
        xs[self.rng.random_range(0..xs.len())]
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// A per-page `[P, D]` value of the cache phase.
    fn keys(&mut self, depth: u32) -> String {
        if depth == 0 || self.chance(0.4) {
            return self.pick(&["K", "V"]).to_string();
        }
        let a = self.keys(depth - 1);
        match self.rng.random_range(0..8) {
            0 => format!("abs({a})"),
            1 => format!("({a} * {})", self.keys(depth - 1)),
            2 => format!("({a} - {})", self.keys(depth - 1)),
            3 => format!("maximum({a}, {})", self.keys(depth - 1)),
            4 => format!("where({a} > 0, {a}, {})", self.keys(depth - 1)),
            5 => format!("normalize({a}, cols)"),
            6 => format!("softmax({a}, rows)"),
            _ => format!("({a} * 0.5 + 1)"),
        }
    }

    fn reduction(&mut self) -> &'static str {
        self.pick(&["sum", "mean", "max", "min", "norm"])
    }

    /// The cache phase's value for a field of `shape`.
    fn summary(&mut self, shape: Shape) -> String {
        let keys = self.keys(2);
        match shape {
            Shape::Row if self.chance(0.2) => format!("slice({keys}, rows, 0, 1)"),
            Shape::Row => format!("{}({keys}, rows)", self.reduction()),
            Shape::Scalar => format!(
                "{}({}({keys}, rows), cols)",
                self.reduction(),
                self.reduction()
            ),
            Shape::Rows2 => format!("slice({keys}, rows, 0, 2)"),
            Shape::Half => format!("slice({}({keys}, rows), cols, 0, D / 2)", self.reduction()),
            Shape::Channels => format!("keep({keys}, eighth)"),
            Shape::Narrow => {
                let row = format!("{}({keys}, rows)", self.reduction());
                match self.rng.random_range(0..3) {
                    0 => format!("sign(matmul({row}, planes))"),
                    1 => format!("keep({row}, channels)"),
                    _ => format!("slice({row}, cols, 0, 8)"),
                }
            }
        }
    }

    /// A step value of the query's shape, `[G, D]`.
    fn query(&mut self) -> String {
        self.pick(&[
            "q",
            "q",
            "q",
            "(q * 2)",
            "abs(q)",
            "normalize(q, cols)",
            "sign(q)",
            "(q - mean(q, cols))",
        ])
        .to_string()
    }

    /// A per-page `[G, 1]` value read from `field`, of `shape`; `other` is a second field
    /// of the same shape, if any.
    fn read(&mut self, field: &str, shape: Shape, other: Option<&str>) -> String {
        let q = self.query();
        match shape {
            Shape::Row => {
                let op = self.pick(&["*", "+", "-"]);
                match (self.rng.random_range(0..6), other) {
                    (0, Some(o)) => format!("sum(maximum({q} * {field}, {q} * {o}), cols)"),
                    (1, Some(o)) => format!("sum(minimum({o} * {q}, {q} * {field}), cols)"),
                    (2, _) => format!("norm({q} - {field}, cols)"),
                    (3, _) => format!("{}({q} {op} {field}, cols)", self.reduction()),
                    (4, _) => format!("{}(maximum({field}, {q}), cols)", self.reduction()),
                    _ => format!("dot({q}, {field})"),
                }
            }
            Shape::Scalar => format!("(mean({q}, cols) * {field})"),
            Shape::Rows2 => format!("{}(dot({q}, {field}), cols)", self.reduction()),
            Shape::Half => format!("dot(slice({q}, cols, D / 2, D / 2), {field})"),
            Shape::Channels => format!(
                "{}(dot(keep({q}, eighth), {field}), cols)",
                self.reduction()
            ),
            Shape::Narrow if self.chance(0.3) => {
                format!("mean(eq(sign(matmul(q, planes)), {field}), cols)")
            }
            Shape::Narrow => {
                let narrow = self.pick(&["matmul(q, planes)", "keep(q, channels)"]);
                let narrow = if self.chance(0.5) {
                    format!("sign({narrow})")
                } else {
                    narrow.to_string()
                };
                format!("dot({narrow}, {field})")
            }
        }
    }

    /// A per-page `[G, 1]` value combining `parts` (each `[G, 1]`).
    fn combine(&mut self, parts: &[String], depth: u32) -> String {
        let leaf = |w: &mut Self| parts[w.rng.random_range(0..parts.len())].clone();
        if depth == 0 || self.chance(0.3) {
            return match self.rng.random_range(0..12) {
                0 => format!("({} + pos / npages)", leaf(self)),
                1 => format!("({} * 0.5 + pos)", leaf(self)),
                _ => leaf(self),
            };
        }
        let a = self.combine(parts, depth - 1);
        let b = self.combine(parts, depth - 1);
        match self.rng.random_range(0..11) {
            0 => format!("({a} + {b})"),
            1 => format!("({a} * 0.5 - {b} * 0.25)"),
            2 => format!("maximum({a}, {b})"),
            3 => format!("where({a} > {b}, {a}, {b})"),
            4 => format!("softmax({a}, pages)"),
            5 => format!("({a} - max({a}, pages))"),
            6 => format!("({a} / (norm({a}, pages) + 1))"),
            7 => format!("exp(minimum({a}, 10))"),
            8 => format!("sigmoid({a})"),
            9 => format!("({a} - mean({b}, pages))"),
            _ => format!("abs({a})"),
        }
    }

    fn flow(&mut self) -> String {
        let dtypes = ["f32", "f16", "bf16", "fp8"];
        let shapes = [
            Shape::Row,
            Shape::Row,
            Shape::Scalar,
            Shape::Rows2,
            Shape::Narrow,
            Shape::Half,
            Shape::Channels,
        ];
        let count = self.rng.random_range(1..=4);
        let mut fields: Vec<(String, Shape)> = Vec::new();
        let mut text = String::from("flow fuzz \"a random flow\"\nparam budget = 4\n");
        if self.chance(0.3) {
            text.push_str("param tolerance = 0.1\n");
        }
        text.push_str("const planes[D, 8] = randn(5)\nconst channels[1, 8] = range(0, 1)\n");
        text.push_str("const eighth[1, D / 8] = range(0, 8)\n");
        for i in 0..count {
            let shape = shapes[self.rng.random_range(0..shapes.len())];
            let dims = match shape {
                Shape::Row => "1, D",
                Shape::Scalar => "1, 1",
                Shape::Rows2 => "2, D",
                Shape::Narrow => "1, 8",
                Shape::Half => "1, D / 2",
                Shape::Channels => "P, D / 8",
            };
            let dtype = dtypes[self.rng.random_range(0..dtypes.len())];
            text.push_str(&format!("page f{i}[{dims}] {dtype}\n"));
            fields.push((format!("f{i}"), shape));
        }
        let state = self.chance(0.3);
        let states = if state {
            self.rng.random_range(1..=2)
        } else {
            0
        };
        if states > 0 {
            text.push_str("state mass[1, 1]\n");
        }
        if states > 1 {
            text.push_str("state seen[1, 1]\n");
        }
        text.push_str("cache:\n");
        for (name, shape) in &fields {
            let value = self.summary(*shape);
            text.push_str(&format!("  {name} = {value}\n"));
        }
        text.push_str("index:\n");
        let mut parts = Vec::new();
        for (name, shape) in &fields {
            let other = fields
                .iter()
                .find(|(n, s)| s == shape && n != name)
                .map(|(n, _)| n.as_str());
            let value = self.read(name, *shape, other);
            // Some values by name, so that later lines share them.
            if self.chance(0.4) {
                let named = format!("p{}", parts.len());
                text.push_str(&format!("  {named} = {value}\n"));
                parts.push(named);
            } else {
                parts.push(value);
            }
        }
        let combined = self.combine(&parts, 3);
        let fold = self.pick(&["max", "sum", "mean"]);
        text.push_str(&format!("  score = {fold}({combined}, rows)\n"));
        let score = if state {
            text.push_str("  total = load(mass) * 0.5 + score\n  save(mass, total)\n");
            if states > 1 {
                text.push_str("  save(seen, maximum(load(seen), score))\n");
            }
            "total"
        } else {
            "score"
        };
        let topk = self.pick(&["topk", "approx_topk"]);
        text.push_str(&format!("  {topk}({score})\n"));
        text
    }
}

/// Runs `flow`'s cache phase over 5 pages and a bit and its index phase twice (state saved
/// by the first step is loaded by the second).
fn run_on_cpu(flow: Flow, rng: &mut StdRng) {
    let g = flow.geometry;
    let runner = FlowRunner::new(flow);
    let kv = KvGeometry::new(g.heads_kv, g.head_dim, g.page_size).unwrap();
    let mut cache = KvCache::new(kv, KvDtype::Bf16, 1, 16);
    let mut seq = Sequence::default();
    let width = g.heads_kv * g.head_dim;
    for slot in cache.append(&mut seq, 5 * g.page_size + 3).unwrap() {
        let k: Vec<f32> = (0..width).map(|_| rng.random_range(-2.0..2.0)).collect();
        let v: Vec<f32> = (0..width).map(|_| rng.random_range(-2.0..2.0)).collect();
        cache
            .layer_mut(0)
            .write_token(slot.page, slot.offset, &k, &v)
            .unwrap();
    }
    let complete = seq.pages[..seq.complete_pages(g.page_size)].to_vec();
    let mut fields = runner.new_fields(16);
    runner.summarize(cache.layer(0), &mut fields, &complete);
    let settings = runner.flow.settings.clone();
    let mut state = runner.new_state(1);
    for _ in 0..2 {
        let q: Vec<f32> = (0..g.heads_q * g.head_dim)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut batch = [StepSeq {
            seq: &seq,
            settings: &settings,
            state: (!runner.flow.states.is_empty()).then_some(&mut state.layers[0]),
        }];
        let scores = runner.scores(0, &fields, &q, &mut batch);
        assert_eq!(scores.len(), g.heads_kv, "a row of scores a KV head");
    }
}

/// The CUDA texts of `flow`'s generated kernels for both pool dtypes, or `None` where the
/// GPU declines the flow (with a message).
fn cuda_texts(flow: &Flow) -> Option<Vec<String>> {
    let text = match vortex_cuda::generated::source(flow) {
        Ok(text) => text,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "a declined flow says why");
            return None;
        }
    };
    let g = flow.geometry;
    let geom = KvGeometry::new(g.heads_kv, g.head_dim, g.page_size).unwrap();
    let texts = [PoolDtype::Bf16, PoolDtype::Fp8]
        .map(|d| vortex_cuda::generated::module_spec(flow, geom, d, &text).text())
        .to_vec();
    Some(texts)
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_flows_run_on_the_cpu_and_generate_cuda() {
    let cases = env_number("VORTEX_FLOW_FUZZ_CASES", 120);
    let first = env_number("VORTEX_FLOW_FUZZ_SEED", 0);
    let nvrtc = vortex_cuda::libs::load_nvrtc().is_ok();
    if !nvrtc {
        eprintln!("flow_fuzz: NVRTC not found; the generated CUDA is written, not compiled");
    }
    let (mut accepted, mut generated) = (0, 0);
    let mut jobs = Vec::new();
    for seed in first..first + cases {
        let mut rng = StdRng::seed_from_u64(seed);
        let source = Writer { rng: &mut rng }.flow();
        let g = GEOMETRIES[seed as usize % GEOMETRIES.len()];
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let Ok(flow) = compile("fuzz.flow", &source, g) else {
                return (false, None);
            };
            let texts = cuda_texts(&flow);
            run_on_cpu(flow, &mut rng);
            (true, texts)
        }));
        let Ok((ok, texts)) = outcome else {
            panic!("seed {seed}, geometry {g:?}: panicked on\n{source}");
        };
        accepted += usize::from(ok);
        if let Some(texts) = texts {
            generated += 1;
            if nvrtc {
                jobs.extend(texts.into_iter().map(|t| (seed, source.clone(), t)));
            }
        }
    }
    eprintln!("flow_fuzz: {cases} flows, {accepted} accepted, {generated} generated as CUDA");
    // The writer aims at valid flows: most must pass the checker, or this tests little.
    assert!(
        accepted * 10 >= cases as usize * 9,
        "only {accepted} of {cases} random flows passed the checker"
    );
    assert!(
        generated * 2 >= accepted,
        "only {generated} of {accepted} flows generated CUDA"
    );
    if nvrtc {
        let texts: Vec<(&str, &str)> = jobs.iter().map(|(_, _, t)| ("fuzz", t.as_str())).collect();
        for (result, (seed, source, _)) in compile_all(&texts, "sm_90").iter().zip(&jobs) {
            if let Err(e) = result {
                panic!("seed {seed}: the generated CUDA does not compile: {e}\n{source}");
            }
        }
    }
}
