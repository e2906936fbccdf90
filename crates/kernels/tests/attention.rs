use std::time::Instant;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use vortex_kernels::attention::{AttentionError, decode_attention};
use vortex_kernels::bandwidth::measure_read_bandwidth;
use vortex_kernels::simd::{Level, Simd};
use vortex_kv::{KvDtype, KvGeometry, LayerKv, PageId, PageTable, Storage};

const DTYPES: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Fp8];

fn random_vec(rng: &mut StdRng, n: usize, amplitude: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-amplitude..amplitude))
        .collect()
}

fn random_layer(rng: &mut StdRng, geom: KvGeometry, dtype: KvDtype, num_pages: usize) -> LayerKv {
    let mut layer = LayerKv::new(geom, dtype, num_pages);
    let n = num_pages * geom.page_elems();
    layer.k.write_f32(0, &random_vec(rng, n, 1.0));
    layer.v.write_f32(0, &random_vec(rng, n, 1.0));
    layer
}

/// One row per sequence, of the given token counts, over distinct random pages of the pool.
fn dense_table(rng: &mut StdRng, num_pages: usize, page_size: usize, lens: &[usize]) -> PageTable {
    let mut pool: Vec<PageId> = (0..num_pages as PageId).collect();
    pool.shuffle(rng);
    let mut table = PageTable::new(1);
    let mut next = 0;
    for &len in lens {
        let pages = len.div_ceil(page_size);
        table.push_row(&pool[next..next + pages], (len - 1) % page_size + 1);
        next += pages;
    }
    table
}

/// One row per (sequence, KV head), each a random subset of the pool in random order.
fn sparse_table(
    rng: &mut StdRng,
    num_pages: usize,
    page_size: usize,
    batch: usize,
    kv_heads: usize,
) -> PageTable {
    let mut table = PageTable::new(kv_heads);
    let mut pool: Vec<PageId> = (0..num_pages as PageId).collect();
    for _ in 0..batch * kv_heads {
        pool.shuffle(rng);
        let n = rng.random_range(1..=num_pages);
        table.push_row(&pool[..n], rng.random_range(1..=page_size));
    }
    table
}

/// Gathers every token of each row and takes the full softmax in f64.
fn reference(
    layer: &LayerKv,
    table: &PageTable,
    q: &[f32],
    heads_q: usize,
    scale: f32,
) -> Vec<f32> {
    let geom = layer.geometry();
    let (d, ps) = (geom.head_dim, geom.page_size);
    let group = heads_q / geom.kv_heads;
    let mut out = vec![0.0; table.batch() * heads_q * d];
    let (mut k, mut v) = (vec![0.0; d], vec![0.0; d]);
    for seq in 0..table.batch() {
        for qh in 0..heads_q {
            let head = qh / group;
            let row = table.row(seq, head);
            let pages = table.pages(row);
            let qv = &q[(seq * heads_q + qh) * d..][..d];
            let mut scores = Vec::new();
            let mut rows = Vec::new();
            for (i, &page) in pages.iter().enumerate() {
                let tokens = if i + 1 == pages.len() {
                    table.last_page_len[row] as usize
                } else {
                    ps
                };
                for slot in 0..tokens {
                    let off = layer.head_offset(page, head) + slot * d;
                    layer.k.read_f32(off, &mut k);
                    layer.v.read_f32(off, &mut v);
                    let dot: f64 = qv.iter().zip(&k).map(|(a, b)| *a as f64 * *b as f64).sum();
                    scores.push(scale as f64 * dot);
                    rows.push(v.clone());
                }
            }
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let o = &mut out[(seq * heads_q + qh) * d..][..d];
            for (j, o) in o.iter_mut().enumerate() {
                let x: f64 = weights
                    .iter()
                    .zip(&rows)
                    .map(|(w, r)| w * r[j] as f64)
                    .sum();
                *o = (x / total) as f32;
            }
        }
    }
    out
}

fn max_difference(got: &[f32], want: &[f32]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() as f64)
        .fold(0.0, f64::max)
}

/// Whether decode attention over a `dtype` pool of `head_dim` runs the bf16 pair products here:
/// a bf16 pool, `head_dim` a multiple of 32, AVX-512 kernels, and the pairs allowed on this CPU.
fn bf16_pairs(dtype: KvDtype, head_dim: usize) -> bool {
    dtype == KvDtype::Bf16
        && head_dim.is_multiple_of(32)
        && Simd::detect().level() == Level::Avx512
        && vortex_kernels::simd::bf16_pairs()
}

/// Runs the kernel and the reference on the same inputs and checks they agree: a relative error
/// below 1e-5; where the products run on bf16 pairs, against the reference of the queries rounded
/// to bf16 as they round them, and with 2^-9 of the largest value magnitude (1) more, the most
/// that rounding each weight to bf16 (2^-9 of it) moves a weighted mean of the values.
fn check(
    rng: &mut StdRng,
    layer: &LayerKv,
    table: &PageTable,
    heads_q: usize,
    q_amplitude: f32,
    what: &str,
) {
    let d = layer.geometry().head_dim;
    let q = random_vec(rng, table.batch() * heads_q * d, q_amplitude);
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![f32::NAN; q.len()];
    decode_attention(layer, table, &q, heads_q, scale, &mut out).unwrap();
    let pairs = bf16_pairs(layer.dtype(), d);
    let rounded: Vec<f32> = q
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect();
    let want = reference(
        layer,
        table,
        if pairs { &rounded } else { &q },
        heads_q,
        scale,
    );
    let magnitude = want.iter().map(|x| x.abs() as f64).fold(0.0, f64::max);
    let err = max_difference(&out, &want);
    let bound = 1e-5 * magnitude + if pairs { 1.0 / 512.0 } else { 0.0 };
    assert!(
        err <= bound,
        "{what} dtype {} (bf16 pairs: {pairs}): error {err:e}, bound {bound:e}",
        layer.dtype()
    );
}

#[test]
fn dense_ragged_batches() {
    let mut rng = StdRng::seed_from_u64(1);
    for dtype in DTYPES {
        for (page_size, head_dim, kv_heads, group) in [
            (16, 64, 2, 4),
            (1, 32, 2, 1),
            (64, 128, 1, 8),
            (16, 40, 3, 5),
            (4, 8, 4, 2),
            (16, 17, 2, 3),
        ] {
            let geom = KvGeometry::new(kv_heads, head_dim, page_size).unwrap();
            let lens: Vec<usize> = (0..rng.random_range(1..=5))
                .map(|_| rng.random_range(1..=300))
                .collect();
            let num_pages = lens.iter().map(|l| l.div_ceil(page_size)).sum::<usize>() + 3;
            let layer = random_layer(&mut rng, geom, dtype, num_pages);
            let table = dense_table(&mut rng, num_pages, page_size, &lens);
            let what = format!("dense ps={page_size} d={head_dim} kvh={kv_heads} g={group}");
            check(&mut rng, &layer, &table, kv_heads * group, 2.0, &what);
        }
    }
}

#[test]
fn sparse_per_head_tables() {
    let mut rng = StdRng::seed_from_u64(2);
    for dtype in DTYPES {
        for (page_size, head_dim, kv_heads, group) in [
            (16, 64, 4, 4),
            (1, 16, 2, 5),
            (64, 128, 2, 1),
            (16, 128, 2, 8),
        ] {
            let geom = KvGeometry::new(kv_heads, head_dim, page_size).unwrap();
            let num_pages = 200 / page_size + 4;
            let layer = random_layer(&mut rng, geom, dtype, num_pages);
            let batch = rng.random_range(1..=3);
            let table = sparse_table(&mut rng, num_pages, page_size, batch, kv_heads);
            let what = format!("sparse ps={page_size} d={head_dim} kvh={kv_heads} g={group}");
            check(&mut rng, &layer, &table, kv_heads * group, 2.0, &what);
        }
    }
}

#[test]
fn long_rows_split_and_merge() {
    let mut rng = StdRng::seed_from_u64(3);
    for dtype in DTYPES {
        let geom = KvGeometry::new(2, 64, 16).unwrap();
        let lens = [5000usize, 37, 2100];
        let num_pages = lens.iter().map(|l| l.div_ceil(16)).sum::<usize>();
        let layer = random_layer(&mut rng, geom, dtype, num_pages);
        let table = dense_table(&mut rng, num_pages, 16, &lens);
        for threads in [1, 3, 8] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            // Large queries make the softmax peaky, so chunk maxima differ widely.
            for amplitude in [0.5, 8.0] {
                pool.install(|| {
                    let what = format!("long threads={threads} amplitude={amplitude}");
                    check(&mut rng, &layer, &table, 8, amplitude, &what);
                });
            }
        }
    }
}

/// A row's output is the same to the bit alone as in a batch of other rows: how a row is cut
/// into chunks, whose partial softmax states merge in an order that rounds, depends on the row
/// alone. Dense and sparse tables, rows long enough to be cut.
#[test]
fn a_row_is_the_same_alone_as_in_a_batch() {
    let mut rng = StdRng::seed_from_u64(17);
    let (group, dim) = (3, 64);
    for (kv_heads, rows_per_seq) in [(2, 1), (2, 2)] {
        let geom = KvGeometry::new(kv_heads, dim, 16).unwrap();
        let layer = random_layer(&mut rng, geom, KvDtype::Bf16, 700);
        let mut batch = PageTable::new(rows_per_seq);
        let mut pool: Vec<PageId> = (0..700).collect();
        for len in [300, 2, 650, 40] {
            for _ in 0..rows_per_seq {
                pool.shuffle(&mut rng);
                batch.push_row(&pool[..len], rng.random_range(1..=16));
            }
        }
        let width = kv_heads * group * dim;
        let q = random_vec(&mut rng, 4 * width, 2.0);
        let mut together = vec![0.0; q.len()];
        decode_attention(&layer, &batch, &q, kv_heads * group, 0.125, &mut together).unwrap();
        for seq in 0..4 {
            let mut alone = PageTable::new(rows_per_seq);
            for head in 0..rows_per_seq {
                let row = batch.row(seq, head);
                alone.push_row(batch.pages(row), batch.last_page_len[row] as usize);
            }
            let mut out = vec![0.0; width];
            let q = &q[seq * width..(seq + 1) * width];
            decode_attention(&layer, &alone, q, kv_heads * group, 0.125, &mut out).unwrap();
            assert!(
                out == together[seq * width..(seq + 1) * width],
                "sequence {seq} of {rows_per_seq} rows each differs alone"
            );
        }
    }
}

/// A row's output is the same to the bit on any number of threads: threads share out a row's
/// chunks, they do not change where it is cut.
#[test]
fn a_row_is_the_same_on_any_number_of_threads() {
    let mut rng = StdRng::seed_from_u64(23);
    let (group, dim) = (2, 64);
    for (kv_heads, rows_per_seq) in [(2, 1), (2, 2)] {
        let geom = KvGeometry::new(kv_heads, dim, 16).unwrap();
        let layer = random_layer(&mut rng, geom, KvDtype::Bf16, 2100);
        let mut table = PageTable::new(rows_per_seq);
        let mut pool: Vec<PageId> = (0..2100).collect();
        for len in [2100, 3, 700, 1200] {
            for _ in 0..rows_per_seq {
                pool.shuffle(&mut rng);
                table.push_row(&pool[..len], rng.random_range(1..=16));
            }
        }
        let heads_q = kv_heads * group;
        let q = random_vec(&mut rng, 4 * heads_q * dim, 2.0);
        let outputs: Vec<Vec<f32>> = [1, 2, 5, 16]
            .into_iter()
            .map(|threads| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut out = vec![0.0; q.len()];
                pool.install(|| decode_attention(&layer, &table, &q, heads_q, 0.125, &mut out))
                    .unwrap();
                out
            })
            .collect();
        for (i, out) in outputs.iter().enumerate().skip(1) {
            assert!(
                *out == outputs[0],
                "{rows_per_seq} rows a sequence: run {i} differs from one thread's"
            );
        }
    }
}

#[test]
fn long_sparse_rows() {
    let mut rng = StdRng::seed_from_u64(7);
    for dtype in DTYPES {
        let geom = KvGeometry::new(4, 32, 16).unwrap();
        let layer = random_layer(&mut rng, geom, dtype, 400);
        let table = sparse_table(&mut rng, 400, 16, 2, 4);
        check(&mut rng, &layer, &table, 12, 4.0, "long sparse");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn matches_reference_on_random_shapes(
        seed in any::<u64>(),
        kv_heads in 1usize..4,
        group in 1usize..7,
        head_dim in 1usize..80,
        page_size in prop::sample::select(vec![1usize, 2, 8, 16, 64]),
        dtype in prop::sample::select(DTYPES.to_vec()),
        sparse in any::<bool>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let geom = KvGeometry::new(kv_heads, head_dim, page_size).unwrap();
        let num_pages = 300 / page_size + 2;
        let layer = random_layer(&mut rng, geom, dtype, num_pages);
        let batch = rng.random_range(1..=3);
        let table = if sparse {
            sparse_table(&mut rng, num_pages, page_size, batch, kv_heads)
        } else {
            // Whole pages per sequence: lengths rounded up to pages still fit the pool.
            let max_len = num_pages / batch * page_size;
            let lens: Vec<usize> = (0..batch).map(|_| rng.random_range(1..=max_len)).collect();
            dense_table(&mut rng, num_pages, page_size, &lens)
        };
        check(&mut rng, &layer, &table, kv_heads * group, 3.0, "random shape");
    }
}

#[test]
fn page_size_one_long_row() {
    let mut rng = StdRng::seed_from_u64(4);
    let geom = KvGeometry::new(1, 32, 1).unwrap();
    let layer = random_layer(&mut rng, geom, KvDtype::F32, 3000);
    let table = dense_table(&mut rng, 3000, 1, &[3000]);
    check(&mut rng, &layer, &table, 4, 4.0, "page size 1");
}

#[test]
fn shared_pages_and_single_token() {
    let mut rng = StdRng::seed_from_u64(5);
    let geom = KvGeometry::new(2, 64, 16).unwrap();
    let layer = random_layer(&mut rng, geom, KvDtype::Bf16, 8);
    let mut table = PageTable::new(1);
    table.push_row(&[3, 1, 4], 16);
    table.push_row(&[3, 1, 5], 1);
    table.push_row(&[7], 1);
    table.push_row(&[3, 3, 3], 9);
    check(&mut rng, &layer, &table, 8, 2.0, "shared pages");
}

/// A NaN in one key makes the outputs of the query heads that read it NaN, and only those, with
/// whichever kernel level the machine runs.
#[test]
fn a_nan_key_reaches_only_its_heads() {
    let mut rng = StdRng::seed_from_u64(9);
    let (kv_heads, head_dim, page_size, group) = (2, 64, 16, 3);
    let geom = KvGeometry::new(kv_heads, head_dim, page_size).unwrap();
    for dtype in DTYPES {
        let lens = [100, 37];
        let num_pages = 12;
        let mut layer = random_layer(&mut rng, geom, dtype, num_pages);
        let table = dense_table(&mut rng, num_pages, page_size, &lens);
        // Token 5 of sequence 0's second page, KV head 1.
        let page = table.pages(table.row(0, 0))[1] as usize;
        let at = page * geom.page_elems() + page_size * head_dim + 5 * head_dim + 7;
        layer.k.write_f32(at, &[f32::NAN]);
        let heads_q = kv_heads * group;
        let q = random_vec(&mut rng, lens.len() * heads_q * head_dim, 1.0);
        let mut out = vec![0.0; q.len()];
        decode_attention(&layer, &table, &q, heads_q, 0.125, &mut out).unwrap();
        for (i, head) in out.chunks_exact(head_dim).enumerate() {
            let nan = i / heads_q == 0 && (i % heads_q) / group == 1;
            assert!(
                head.iter().all(|v| v.is_nan() == nan),
                "{dtype}: head {i} expected nan={nan}"
            );
        }
    }
}

#[test]
fn empty_batch_is_a_no_op() {
    let geom = KvGeometry::new(2, 8, 4).unwrap();
    let layer = LayerKv::new(geom, KvDtype::F32, 4);
    let table = PageTable::new(1);
    decode_attention(&layer, &table, &[], 4, 1.0, &mut []).unwrap();
}

#[test]
fn bad_inputs_return_errors() {
    let geom = KvGeometry::new(2, 8, 4).unwrap();
    let layer = LayerKv::new(geom, KvDtype::F32, 4);
    let mut table = PageTable::new(1);
    table.push_row(&[0, 1], 3);
    let q = vec![0.5; 4 * 8];
    let mut out = vec![0.0; 4 * 8];
    let run = |layer: &LayerKv, table: &PageTable, q: &[f32], heads_q, out: &mut [f32]| {
        let result = decode_attention(layer, table, q, heads_q, 1.0, out);
        if let Err(e) = &result {
            assert!(!e.to_string().is_empty());
        }
        result
    };
    assert!(run(&layer, &table, &q, 4, &mut out).is_ok());

    let err = run(&layer, &table, &q[1..], 4, &mut out).unwrap_err();
    assert!(matches!(err, AttentionError::Shape { what: "query", .. }));
    let err = run(&layer, &table, &q, 4, &mut out[..8]).unwrap_err();
    assert!(matches!(err, AttentionError::Shape { what: "output", .. }));
    let huge = usize::MAX - 1;
    let err = run(&layer, &table, &q, huge, &mut out).unwrap_err();
    assert!(matches!(err, AttentionError::Shape { .. }));
    for heads_q in [0, 3, 5] {
        let err = run(&layer, &table, &q, heads_q, &mut out).unwrap_err();
        assert!(
            matches!(err, AttentionError::HeadGrouping { .. }),
            "{heads_q}"
        );
    }

    let mut bad = table.clone();
    bad.push_row(&[], 0);
    let err = run(&layer, &bad, &vec![0.0; 64], 4, &mut vec![0.0; 64]).unwrap_err();
    assert_eq!(err, AttentionError::EmptyRow { row: 1 });

    for len in [0, 5] {
        let mut bad = table.clone();
        bad.last_page_len[0] = len;
        let err = run(&layer, &bad, &q, 4, &mut out).unwrap_err();
        assert!(matches!(err, AttentionError::LastPageLen { .. }));
    }

    let mut bad = table.clone();
    bad.indices[1] = 4;
    let err = run(&layer, &bad, &q, 4, &mut out).unwrap_err();
    assert!(matches!(
        err,
        AttentionError::PageOutOfRange { page: 4, .. }
    ));

    let mut bad = table.clone();
    bad.rows_per_seq = 3;
    let err = run(&layer, &bad, &q, 4, &mut out).unwrap_err();
    assert!(matches!(err, AttentionError::RowsPerSeq { .. }));

    let mut bad = table.clone();
    bad.rows_per_seq = 2;
    let err = run(&layer, &bad, &q, 4, &mut out).unwrap_err();
    assert!(matches!(err, AttentionError::MalformedTable(_)));

    for broken in [
        PageTable {
            indptr: vec![],
            ..table.clone()
        },
        PageTable {
            indptr: vec![0, 3],
            ..table.clone()
        },
        PageTable {
            indptr: vec![1, 2],
            ..table.clone()
        },
        PageTable {
            last_page_len: vec![],
            ..table.clone()
        },
    ] {
        let err = run(&layer, &broken, &q, 4, &mut out).unwrap_err();
        assert!(
            matches!(err, AttentionError::MalformedTable(_)),
            "{broken:?}"
        );
    }
    let mut bad = table.clone();
    bad.indptr = vec![0, 2, 1, 2];
    bad.last_page_len = vec![1, 1, 1];
    let err = run(&layer, &bad, &vec![0.0; 96], 4, &mut vec![0.0; 96]).unwrap_err();
    assert!(matches!(err, AttentionError::MalformedTable(_)));

    let mut mixed = layer.clone();
    mixed.v = Storage::zeros(KvDtype::Bf16, mixed.k.len());
    let err = run(&mixed, &table, &q, 4, &mut out).unwrap_err();
    assert_eq!(err, AttentionError::KvStorage);
    let mut short = layer.clone();
    short.v = Storage::zeros(KvDtype::F32, 10);
    assert_eq!(
        run(&short, &table, &q, 4, &mut out).unwrap_err(),
        AttentionError::KvStorage
    );
}

/// Decode throughput at long context against the machine's read bandwidth. The probe and the
/// kernel are timed in turns, so both see the same machine load; the best of each over a few
/// rounds is printed. Each case alternates between two disjoint page sets (each beyond the last-level
/// cache) so no call finds the previous call's data in cache.
/// `cargo test --release -p vortex-kernels --test attention -- --ignored --nocapture`
#[test]
#[ignore]
fn timing_long_context() {
    let (kv_heads, heads_q, head_dim, page_size) = (8, 32, 128, 16);
    let geom = KvGeometry::new(kv_heads, head_dim, page_size).unwrap();
    let mut rng = StdRng::seed_from_u64(6);
    for dtype in DTYPES {
        for (batch, context, sparse) in [
            (1, 16 << 10, false),
            (1, 32 << 10, false),
            (1, 64 << 10, false),
            (8, 4 << 10, false),
            (1, 32 << 10, true),
        ] {
            let pages = batch * context / page_size;
            let mut layer = LayerKv::new(geom, dtype, 2 * pages);
            let n = 2 * pages * geom.page_elems();
            let values: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 1e-3).collect();
            layer.k.write_f32(0, &values);
            layer.v.write_f32(0, &values);
            drop(values);
            let tables: Vec<PageTable> = (0..2)
                .map(|set| {
                    let mut table = if sparse {
                        // Every KV head reads its own random half of twice as many pages.
                        let mut t = PageTable::new(kv_heads);
                        let mut all: Vec<PageId> = (0..2 * pages as PageId).collect();
                        for _ in 0..kv_heads {
                            all.shuffle(&mut rng);
                            t.push_row(&all[..pages], page_size);
                        }
                        t
                    } else {
                        dense_table(&mut rng, pages, page_size, &vec![context; batch])
                    };
                    if !sparse {
                        let offset = (set * pages) as PageId;
                        table.indices.iter_mut().for_each(|p| *p += offset);
                    }
                    table
                })
                .collect();
            let q = random_vec(&mut rng, batch * heads_q * head_dim, 1.0);
            let mut out = vec![0.0; q.len()];
            let scale = 1.0 / (head_dim as f32).sqrt();
            let bytes = (2 * batch * context * kv_heads * head_dim * dtype.size()) as f64;
            let (mut gbs, mut bandwidth) = (0.0f64, 0.0f64);
            for _ in 0..5 {
                bandwidth = bandwidth.max(measure_read_bandwidth(1 << 29, 2));
                let mut seconds = f64::MAX;
                for i in 0..6 {
                    let start = Instant::now();
                    decode_attention(&layer, &tables[i % 2], &q, heads_q, scale, &mut out).unwrap();
                    seconds = seconds.min(start.elapsed().as_secs_f64());
                }
                gbs = gbs.max(bytes / seconds / 1e9);
            }
            let kind = if sparse { "sparse" } else { "dense" };
            println!(
                "{dtype:>4} {kind:>6} batch {batch} context {context:>5}: {gbs:5.1} GB/s, \
                 read bandwidth {bandwidth:5.1} GB/s: {:3.0}%",
                100.0 * gbs / bandwidth
            );
        }
    }
}

/// A first page whose every score is -inf weighs nothing; it does not make the output NaN.
#[test]
fn a_first_page_of_minus_infinite_scores_weighs_nothing() {
    let geom = KvGeometry::new(1, 1, 1).unwrap();
    let mut layer = LayerKv::new(geom, KvDtype::F32, 2);
    layer.k.write_f32(0, &[f32::NEG_INFINITY, 1.0]);
    layer.v.write_f32(0, &[5.0, 7.0]);
    let mut table = PageTable::new(1);
    table.push_row(&[0, 1], 1);
    let mut out = [0.0f32];
    decode_attention(&layer, &table, &[1.0], 1, 1.0, &mut out).unwrap();
    assert_eq!(out[0], 7.0);
}
