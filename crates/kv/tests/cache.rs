//! Contents of the paged KV cache: copy-on-write keeps every sequence's tokens intact through
//! forks and appends, for every dtype; plus geometry, page-table and slot unit tests.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use vortex_kv::{KvCache, KvDtype, KvError, KvGeometry, PageTable, Sequence, Slot};

const DTYPES: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Fp8];

/// A value unique (before rounding) to one element of one token: varied mantissa and exponent
/// so that rounding to f16/bf16 rarely maps two elements to the same value.
fn value(token: u64, layer: usize, head: usize, dim: usize, is_v: bool) -> f32 {
    let mut h = token
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((layer as u64) << 40 | (head as u64) << 20 | (dim as u64) << 1 | is_v as u64);
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 32;
    let mant = (h & 0xFFFF) as f32 / 65536.0 + 0.5; // [0.5, 1.5)
    let exp = ((h >> 16) % 12) as i32 - 6;
    let sign = if (h >> 24) & 1 == 1 { -1.0 } else { 1.0 };
    sign * mant * 2f32.powi(exp)
}

/// One token's K and V for one layer, head-major as `write_token` takes them.
fn token_kv(g: KvGeometry, token: u64, layer: usize) -> (Vec<f32>, Vec<f32>) {
    let mut k = Vec::with_capacity(g.kv_heads * g.head_dim);
    let mut v = Vec::with_capacity(g.kv_heads * g.head_dim);
    for h in 0..g.kv_heads {
        for d in 0..g.head_dim {
            k.push(value(token, layer, h, d, false));
            v.push(value(token, layer, h, d, true));
        }
    }
    (k, v)
}

/// Writes the tokens `ids` (one per slot) into every layer.
fn write_slots(cache: &mut KvCache, slots: &[Slot], ids: &[u64]) {
    let g = cache.geometry();
    assert_eq!(slots.len(), ids.len());
    for l in 0..cache.num_layers() {
        for (slot, &id) in slots.iter().zip(ids) {
            let (k, v) = token_kv(g, id, l);
            cache
                .layer_mut(l)
                .write_token(slot.page, slot.offset, &k, &v)
                .unwrap();
        }
    }
}

/// Checks that `seq` reads back exactly the tokens `ids`, rounded to the cache's dtype.
fn check_contents(cache: &KvCache, seq: &Sequence, ids: &[u64]) -> Result<(), String> {
    let g = cache.geometry();
    if seq.len != ids.len() {
        return Err(format!(
            "sequence holds {} tokens, model {}",
            seq.len,
            ids.len()
        ));
    }
    let mut buf = vec![0f32; g.head_dim];
    for l in 0..cache.num_layers() {
        let layer = cache.layer(l);
        let dt = layer.dtype();
        for (t, &id) in ids.iter().enumerate() {
            let page = seq.pages[t / g.page_size];
            let offset = t % g.page_size;
            for h in 0..g.kv_heads {
                let at = layer.head_offset(page, h) + offset * g.head_dim;
                for (is_v, storage) in [(false, &layer.k), (true, &layer.v)] {
                    storage.read_f32(at, &mut buf);
                    for (d, &got) in buf.iter().enumerate() {
                        let want = dt.round(value(id, l, h, d, is_v));
                        if got.to_bits() != want.to_bits() {
                            return Err(format!(
                                "layer {l} token {t} (id {id}) head {h} dim {d} {}: got {got}, want {want} (page {page}, slot {offset}, {dt})",
                                if is_v { "V" } else { "K" }
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn cache(
    dtype: KvDtype,
    kv_heads: usize,
    head_dim: usize,
    page_size: usize,
    layers: usize,
    pages: usize,
) -> KvCache {
    KvCache::new(
        KvGeometry::new(kv_heads, head_dim, page_size).unwrap(),
        dtype,
        layers,
        pages,
    )
}

#[test]
fn fork_then_append_to_both_keeps_each_sequence_own_tokens() {
    for dtype in DTYPES {
        for page_size in [1, 2, 16] {
            // Lengths that end mid-page and on a page boundary.
            for prefix in [1, 3, page_size, 2 * page_size + 1] {
                let mut c = cache(dtype, 2, 3, page_size, 2, 64);
                let mut next = 0u64;
                let mut ids_of = |n: usize| {
                    let ids: Vec<u64> = (next..next + n as u64).collect();
                    next += n as u64;
                    ids
                };
                let mut a = Sequence::default();
                let mut a_ids = ids_of(prefix);
                let slots = c.append(&mut a, prefix).unwrap();
                write_slots(&mut c, &slots, &a_ids);
                let mut b = c.fork(&a);
                let mut b_ids = a_ids.clone();
                // Append to both, interleaved, a few tokens at a time.
                for (n_a, n_b) in [(1, 2), (3, 1), (page_size, page_size + 1)] {
                    let new = ids_of(n_a);
                    let slots = c.append(&mut a, n_a).unwrap();
                    write_slots(&mut c, &slots, &new);
                    a_ids.extend(new);
                    let new = ids_of(n_b);
                    let slots = c.append(&mut b, n_b).unwrap();
                    write_slots(&mut c, &slots, &new);
                    b_ids.extend(new);
                    let ctx = format!("{dtype} page_size {page_size} prefix {prefix}");
                    check_contents(&c, &a, &a_ids).unwrap_or_else(|e| panic!("{ctx}: a: {e}"));
                    check_contents(&c, &b, &b_ids).unwrap_or_else(|e| panic!("{ctx}: b: {e}"));
                }
                // Full pages of the prefix are still shared; nothing else is.
                let shared = prefix / page_size;
                assert_eq!(a.pages[..shared], b.pages[..shared]);
                for p in &a.pages[shared..] {
                    assert!(!b.pages.contains(p), "page {p} written by both sequences");
                }
                c.free(&mut a);
                check_contents(&c, &b, &b_ids).unwrap();
                c.free(&mut b);
                assert_eq!(c.allocator().free_count(), 64);
            }
        }
    }
}

#[test]
fn fork_prefix_mid_page_copies_only_the_prefix() {
    for dtype in DTYPES {
        let mut c = cache(dtype, 1, 4, 16, 1, 8);
        let mut a = Sequence::default();
        let a_ids: Vec<u64> = (0..10).collect();
        let slots = c.append(&mut a, 10).unwrap();
        write_slots(&mut c, &slots, &a_ids);
        let mut b = c.fork_prefix(&a, 5);
        assert_eq!(b.len, 5);
        assert_eq!(b.pages, a.pages);
        assert_eq!(c.allocator().refs(a.pages[0]), 2);
        // b continues differently from a at token 5: it must not overwrite a's token 5.
        let slots = c.append(&mut b, 3).unwrap();
        assert_ne!(b.pages[0], a.pages[0]);
        let b_ids: Vec<u64> = (0..5).chain(100..103).collect();
        write_slots(&mut c, &slots, &b_ids[5..]);
        check_contents(&c, &a, &a_ids).unwrap();
        check_contents(&c, &b, &b_ids).unwrap();
        assert_eq!(c.allocator().refs(a.pages[0]), 1);
        c.free(&mut a);
        c.free(&mut b);
        assert_eq!(c.allocator().free_count(), 8);
    }
}

/// Operations for the content property test.
#[derive(Debug, Clone)]
enum Op {
    Append(Index, usize),
    Fork(Index),
    ForkPrefix(Index, usize),
    Free(Index),
}

fn op() -> impl Strategy<Value = Op> {
    let tokens = prop_oneof![4 => 0usize..=3, 1 => 0usize..=34];
    prop_oneof![
        6 => (any::<Index>(), tokens).prop_map(|(i, n)| Op::Append(i, n)),
        2 => any::<Index>().prop_map(Op::Fork),
        2 => (any::<Index>(), 0usize..=34).prop_map(|(i, n)| Op::ForkPrefix(i, n)),
        1 => any::<Index>().prop_map(Op::Free),
    ]
}

fn run_contents(
    dtype: KvDtype,
    page_size: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: usize,
    pages: usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut c = cache(dtype, kv_heads, head_dim, page_size, layers, pages);
    // (sequence, the token ids it holds, in order)
    let mut seqs: Vec<(Sequence, Vec<u64>)> = vec![(Sequence::default(), vec![])];
    let mut next = 0u64;
    for op in ops {
        match *op {
            Op::Append(i, n) => {
                let i = i.index(seqs.len());
                let (seq, ids) = &mut seqs[i];
                let before = seq.clone();
                match c.append(seq, n) {
                    Ok(slots) => {
                        let new: Vec<u64> = (next..next + n as u64).collect();
                        next += n as u64;
                        write_slots(&mut c, &slots, &new);
                        ids.extend(new);
                    }
                    Err(e) => {
                        prop_assert!(
                            matches!(e, KvError::OutOfPages { .. }),
                            "unexpected error {:?}",
                            e
                        );
                        prop_assert_eq!(&*seq, &before);
                    }
                }
            }
            Op::Fork(i) if seqs.len() < 8 => {
                let i = i.index(seqs.len());
                let f = c.fork(&seqs[i].0);
                let ids = seqs[i].1.clone();
                seqs.push((f, ids));
            }
            Op::ForkPrefix(i, n) if seqs.len() < 8 => {
                let i = i.index(seqs.len());
                let f = c.fork_prefix(&seqs[i].0, n);
                let ids = seqs[i].1[..f.len].to_vec();
                seqs.push((f, ids));
            }
            Op::Free(i) => {
                let i = i.index(seqs.len());
                c.free(&mut seqs[i].0);
                seqs[i].1.clear();
            }
            _ => {}
        }
        if let Err(e) = c.allocator().check() {
            return Err(TestCaseError::fail(e));
        }
        for (k, (seq, ids)) in seqs.iter().enumerate() {
            if let Err(e) = check_contents(&c, seq, ids) {
                return Err(TestCaseError::fail(format!(
                    "sequence {k} after {op:?}: {e}"
                )));
            }
        }
    }
    for (seq, _) in &mut seqs {
        c.free(seq);
    }
    prop_assert_eq!(c.allocator().free_count(), pages);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 192,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Every live sequence reads back exactly the tokens written for it, whatever forks,
    /// appends (including failed ones) and frees happened in between.
    #[test]
    fn copy_on_write_preserves_every_sequence(
        dtype in prop::sample::select(DTYPES.to_vec()),
        page_size in prop::sample::select(vec![1usize, 2, 16]),
        kv_heads in 1usize..=2,
        head_dim in 1usize..=3,
        layers in 1usize..=2,
        pages in 1usize..=10,
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run_contents(dtype, page_size, kv_heads, head_dim, layers, pages, &ops)?;
    }
}

#[test]
fn geometry_rejects_bad_page_sizes() {
    for bad in [0usize, 3, 6, 100, 512, 1024] {
        let e = KvGeometry::new(8, 128, bad).unwrap_err();
        assert_eq!(e, KvError::BadPageSize(bad));
        let msg = e.to_string();
        assert!(msg.contains(&format!("page_size {bad}")), "{msg}");
        assert!(msg.contains("power of two"), "{msg}");
        assert!(msg.contains("256"), "{msg}");
    }
    for good in [1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
        let g = KvGeometry::new(8, 128, good).unwrap();
        assert_eq!(g.page_size, good);
        assert_eq!(g.head_elems(), good * 128);
        assert_eq!(g.page_elems(), 8 * good * 128);
    }
    assert_eq!(
        KvGeometry::new(0, 128, 16),
        Err(KvError::ZeroDimension("kv_heads"))
    );
    assert_eq!(
        KvGeometry::new(8, 0, 16),
        Err(KvError::ZeroDimension("head_dim"))
    );
    assert_eq!(
        KvError::ZeroDimension("head_dim").to_string(),
        "head_dim must be at least 1"
    );
}

#[test]
fn geometry_pages_for() {
    let g = KvGeometry::new(1, 1, 16).unwrap();
    assert_eq!(g.pages_for(0), 0);
    assert_eq!(g.pages_for(1), 1);
    assert_eq!(g.pages_for(16), 1);
    assert_eq!(g.pages_for(17), 2);
    let g = KvGeometry::new(1, 1, 1).unwrap();
    assert_eq!(g.pages_for(5), 5);
}

#[test]
fn dense_page_table_matches_sequences() {
    for page_size in [1usize, 2, 16] {
        let mut c = cache(KvDtype::F32, 2, 2, page_size, 1, 64);
        let lens = [0usize, 1, page_size, page_size + 1, 3 * page_size - 1, 5];
        let mut seqs: Vec<Sequence> = Vec::new();
        for &n in &lens {
            let mut s = Sequence::default();
            c.append(&mut s, n).unwrap();
            seqs.push(s);
        }
        // A fork shares pages: both rows list them.
        let f = c.fork(&seqs[4]);
        seqs.push(f);
        let refs: Vec<&Sequence> = seqs.iter().collect();
        let t = PageTable::dense(&refs, page_size);
        assert_eq!(t.rows(), seqs.len());
        assert_eq!(t.batch(), seqs.len());
        assert_eq!(t.rows_per_seq, 1);
        assert_eq!(t.indptr.len(), seqs.len() + 1);
        assert_eq!(t.indptr[0], 0);
        assert_eq!(
            t.indices.len(),
            seqs.iter().map(|s| s.pages.len()).sum::<usize>()
        );
        for (r, s) in seqs.iter().enumerate() {
            assert_eq!(t.pages(r), &s.pages[..], "row {r}");
            assert_eq!(t.indptr[r + 1] - t.indptr[r], s.pages.len() as u32);
            assert_eq!(
                t.last_page_len[r] as usize,
                s.last_page_len(page_size),
                "row {r}"
            );
            assert_eq!(t.tokens(r, page_size), s.len, "row {r}");
            for head in 0..2 {
                assert_eq!(t.row(r, head), r);
            }
        }
        // Explicit last_page_len values.
        let want: Vec<u32> = lens
            .iter()
            .chain(std::iter::once(&lens[4]))
            .map(|&n| {
                if n == 0 {
                    0
                } else {
                    ((n - 1) % page_size + 1) as u32
                }
            })
            .collect();
        assert_eq!(t.last_page_len, want);
    }
    let empty = PageTable::dense(&[], 16);
    assert_eq!(empty.rows(), 0);
    assert_eq!(empty.indptr, vec![0]);
}

#[test]
fn sequence_page_counts() {
    let s = Sequence {
        pages: vec![4, 7, 9],
        len: 33,
    };
    assert_eq!(s.last_page_len(16), 1);
    assert_eq!(s.complete_pages(16), 2);
    let s = Sequence {
        pages: vec![4, 7],
        len: 32,
    };
    assert_eq!(s.last_page_len(16), 16);
    assert_eq!(s.complete_pages(16), 2);
    assert_eq!(Sequence::default().last_page_len(16), 0);
}

#[test]
fn slot_completes_page_exactly_when_a_page_fills() {
    for page_size in [1usize, 2, 16] {
        let mut c = cache(KvDtype::F16, 1, 1, page_size, 1, 32);
        let mut s = Sequence::default();
        let mut pos = 0usize;
        // Mixed batch sizes, including 0, crossing several page boundaries.
        for n in [0usize, 1, 2, 0, 5, 17, 1, 3] {
            let slots = c.append(&mut s, n).unwrap();
            assert_eq!(slots.len(), n);
            for slot in slots {
                assert_eq!(slot.offset, pos % page_size);
                assert_eq!(slot.page, s.pages[pos / page_size]);
                let fills = (pos + 1).is_multiple_of(page_size);
                assert_eq!(
                    slot.completes_page, fills,
                    "page_size {page_size} token {pos}"
                );
                pos += 1;
                // After a completing slot every page of the sequence so far is full.
                if slot.completes_page {
                    assert_eq!(pos % page_size, 0);
                }
            }
            assert_eq!(s.len, pos);
            assert_eq!(s.complete_pages(page_size), pos / page_size);
        }
    }
}

#[test]
fn slot_after_copy_on_write_completes_the_copied_page() {
    // A fork of a sequence one token short of a full page: the copy's first slot fills it.
    let mut c = cache(KvDtype::F32, 1, 1, 2, 1, 4);
    let mut a = Sequence::default();
    c.append(&mut a, 3).unwrap();
    let mut b = c.fork(&a);
    let slots = c.append(&mut b, 1).unwrap();
    assert_eq!(slots.len(), 1);
    assert_eq!(slots[0].offset, 1);
    assert!(slots[0].completes_page);
    assert_ne!(slots[0].page, a.pages[1]);
    assert_eq!(slots[0].page, b.pages[1]);
}

#[test]
fn write_token_rejects_wrong_widths() {
    let mut c = cache(KvDtype::F32, 2, 3, 2, 1, 1);
    let layer = c.layer_mut(0);
    assert_eq!(
        layer.write_token(0, 0, &[0.0; 5], &[0.0; 6]),
        Err(KvError::ShapeMismatch {
            what: "key",
            expected: 6,
            got: 5
        })
    );
    assert_eq!(
        layer.write_token(0, 0, &[0.0; 6], &[0.0; 7]),
        Err(KvError::ShapeMismatch {
            what: "value",
            expected: 6,
            got: 7
        })
    );
}

#[test]
fn dtype_round_matches_storage() {
    for dtype in DTYPES {
        let c = cache(dtype, 1, 1, 1, 1, 1);
        let mut s = c.layer(0).k.clone();
        for x in [0.1f32, -3.3, 1e-5, 65504.0, 1.0 / 3.0, 1e30] {
            s.write_f32(0, &[x]);
            let mut out = [0f32];
            s.read_f32(0, &mut out);
            assert_eq!(out[0].to_bits(), dtype.round(x).to_bits(), "{dtype} {x}");
        }
    }
}

#[test]
fn f16_saturates_finite_values_past_its_range() {
    let max = 65504.0f32;
    for (x, want) in [
        (1e30f32, max),
        (-70000.0, -max),
        (65520.0, max),
        (max, max),
        (f32::INFINITY, f32::INFINITY),
        (f32::NEG_INFINITY, f32::NEG_INFINITY),
    ] {
        assert_eq!(KvDtype::F16.round(x), want, "{x}");
    }
    assert!(KvDtype::F16.round(f32::NAN).is_nan());
}
