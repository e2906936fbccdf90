//! Ownership properties of the page allocator under arbitrary sequences of cache operations:
//! no page is ever leaked or owned by more sequences than its reference count says, `append` is
//! all-or-nothing, and freeing everything returns every page.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use vortex_kv::{KvCache, KvDtype, KvError, KvGeometry, PageAllocator, Sequence};

/// One step applied to the cache. Sequence indices pick among the live sequences.
#[derive(Debug, Clone)]
enum Op {
    /// Start a new, empty sequence.
    New,
    /// Append this many tokens to a sequence.
    Append(Index, usize),
    /// Fork a sequence (share all of its pages).
    Fork(Index),
    /// Fork the first `tokens` tokens of a sequence (may exceed its length).
    ForkPrefix(Index, usize),
    /// Free a sequence but keep using it (it is empty afterwards and may grow again).
    Free(Index),
    /// Free a sequence and forget it.
    Drop(Index),
}

fn op() -> impl Strategy<Value = Op> {
    let tokens = prop_oneof![4 => 0usize..=3, 1 => 0usize..=40];
    prop_oneof![
        1 => Just(Op::New),
        6 => (any::<Index>(), tokens).prop_map(|(i, n)| Op::Append(i, n)),
        2 => any::<Index>().prop_map(Op::Fork),
        2 => (any::<Index>(), 0usize..=40).prop_map(|(i, n)| Op::ForkPrefix(i, n)),
        1 => any::<Index>().prop_map(Op::Free),
        1 => any::<Index>().prop_map(Op::Drop),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    page_size: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: usize,
    pages: usize,
    dtype: KvDtype,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop::sample::select(vec![1usize, 2, 16]),
        1usize..=2,
        1usize..=4,
        1usize..=2,
        1usize..=12,
        prop::sample::select(vec![KvDtype::F32, KvDtype::F16, KvDtype::Bf16]),
    )
        .prop_map(
            |(page_size, kv_heads, head_dim, layers, pages, dtype)| Setup {
                page_size,
                kv_heads,
                head_dim,
                layers,
                pages,
                dtype,
            },
        )
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Keep the source tree clean: no proptest-regressions files.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Owner counts implied by the live sequences.
fn expected_refs(total: usize, seqs: &[Sequence]) -> Vec<u32> {
    let mut refs = vec![0u32; total];
    for s in seqs {
        for &p in &s.pages {
            refs[p as usize] += 1;
        }
    }
    refs
}

fn snapshot(a: &PageAllocator) -> (Vec<u32>, usize) {
    let refs = (0..a.total()).map(|p| a.refs(p as u32)).collect();
    (refs, a.free_count())
}

/// Every invariant that must hold between operations.
fn check_invariants(cache: &KvCache, seqs: &[Sequence]) -> Result<(), TestCaseError> {
    let a = cache.allocator();
    let g = cache.geometry();
    if let Err(e) = a.check() {
        return Err(TestCaseError::fail(format!("allocator check failed: {e}")));
    }
    prop_assert_eq!(a.used_count() + a.free_count(), a.total());
    let want = expected_refs(a.total(), seqs);
    for (p, &w) in want.iter().enumerate() {
        prop_assert_eq!(
            a.refs(p as u32),
            w,
            "page {} has {} owners but {} live sequences list it",
            p,
            a.refs(p as u32),
            w
        );
    }
    let free = want.iter().filter(|&&r| r == 0).count();
    prop_assert_eq!(a.free_count(), free, "free list size vs pages nobody lists");
    for (i, s) in seqs.iter().enumerate() {
        prop_assert_eq!(
            s.pages.len(),
            g.pages_for(s.len),
            "sequence {} holds {} tokens in {} pages",
            i,
            s.len,
            s.pages.len()
        );
        let mut sorted = s.pages.clone();
        sorted.sort_unstable();
        sorted.dedup();
        prop_assert_eq!(
            sorted.len(),
            s.pages.len(),
            "sequence {} lists a page twice",
            i
        );
    }
    Ok(())
}

/// Pages `append(seq, tokens)` must take from the free list, computed from the model alone.
fn model_need(g: KvGeometry, seqs: &[Sequence], seq: &Sequence, tokens: usize) -> usize {
    let fresh = g.pages_for(seq.len + tokens) - seq.pages.len();
    let partial = !seq.len.is_multiple_of(g.page_size);
    let shared = seq
        .pages
        .last()
        .is_some_and(|last| seqs.iter().filter(|s| s.pages.contains(last)).count() > 1);
    fresh + usize::from(tokens > 0 && partial && shared)
}

fn run_ops(s: &Setup, ops: &[Op]) -> Result<(), TestCaseError> {
    let g = KvGeometry::new(s.kv_heads, s.head_dim, s.page_size).unwrap();
    let mut cache = KvCache::new(g, s.dtype, s.layers, s.pages);
    let mut seqs: Vec<Sequence> = vec![Sequence::default()];
    check_invariants(&cache, &seqs)?;
    for op in ops {
        match *op {
            Op::New => {
                if seqs.len() < 8 {
                    seqs.push(Sequence::default());
                }
            }
            Op::Append(i, n) => {
                if seqs.is_empty() {
                    continue;
                }
                let i = i.index(seqs.len());
                let before_seq = seqs[i].clone();
                let before_alloc = snapshot(cache.allocator());
                let need = model_need(g, &seqs, &seqs[i], n);
                prop_assert_eq!(cache.pages_needed(&seqs[i], n), need);
                let mut seq = std::mem::take(&mut seqs[i]);
                let res = cache.append(&mut seq, n);
                seqs[i] = seq;
                match res {
                    Ok(slots) => {
                        prop_assert!(
                            need <= before_alloc.1,
                            "append took {need} pages of {}",
                            before_alloc.1
                        );
                        prop_assert_eq!(slots.len(), n);
                        prop_assert_eq!(seqs[i].len, before_seq.len + n);
                        prop_assert_eq!(
                            cache.allocator().free_count(),
                            before_alloc.1 - need,
                            "append of {} took a different number of pages than needed",
                            n
                        );
                        // Pages before the (possibly copied) partial last page are untouched.
                        let kept = before_seq.len / g.page_size;
                        prop_assert_eq!(&seqs[i].pages[..kept], &before_seq.pages[..kept]);
                        for (k, slot) in slots.iter().enumerate() {
                            let t = before_seq.len + k;
                            prop_assert_eq!(slot.page, seqs[i].pages[t / g.page_size]);
                            prop_assert_eq!(slot.offset, t % g.page_size);
                            prop_assert_eq!(
                                slot.completes_page,
                                t % g.page_size == g.page_size - 1
                            );
                        }
                    }
                    Err(e) => {
                        prop_assert_eq!(e, KvError::OutOfPages { total: s.pages });
                        prop_assert!(
                            need > before_alloc.1,
                            "append failed though {need} of {} pages were free",
                            before_alloc.1
                        );
                        prop_assert_eq!(
                            &seqs[i],
                            &before_seq,
                            "failed append changed the sequence"
                        );
                        prop_assert_eq!(
                            snapshot(cache.allocator()),
                            before_alloc,
                            "failed append changed the allocator"
                        );
                    }
                }
            }
            Op::Fork(i) => {
                if seqs.is_empty() || seqs.len() >= 8 {
                    continue;
                }
                let i = i.index(seqs.len());
                let free = cache.allocator().free_count();
                let f = cache.fork(&seqs[i]);
                prop_assert_eq!(&f, &seqs[i]);
                prop_assert_eq!(cache.allocator().free_count(), free, "fork allocated");
                seqs.push(f);
            }
            Op::ForkPrefix(i, n) => {
                if seqs.is_empty() || seqs.len() >= 8 {
                    continue;
                }
                let i = i.index(seqs.len());
                let free = cache.allocator().free_count();
                let f = cache.fork_prefix(&seqs[i], n);
                let len = n.min(seqs[i].len);
                prop_assert_eq!(f.len, len);
                prop_assert_eq!(&f.pages[..], &seqs[i].pages[..g.pages_for(len)]);
                prop_assert_eq!(
                    cache.allocator().free_count(),
                    free,
                    "fork_prefix allocated"
                );
                seqs.push(f);
            }
            Op::Free(i) | Op::Drop(i) => {
                if seqs.is_empty() {
                    continue;
                }
                let i = i.index(seqs.len());
                cache.free(&mut seqs[i]);
                prop_assert_eq!(&seqs[i], &Sequence::default());
                if matches!(op, Op::Drop(_)) {
                    seqs.swap_remove(i);
                }
            }
        }
        check_invariants(&cache, &seqs)?;
    }
    for i in 0..seqs.len() {
        cache.free(&mut seqs[i]);
        check_invariants(&cache, &seqs)?;
    }
    let a = cache.allocator();
    prop_assert_eq!(
        a.free_count(),
        a.total(),
        "pages leaked after freeing everything"
    );
    prop_assert_eq!(a.used_count(), 0);
    for p in 0..a.total() {
        prop_assert_eq!(a.refs(p as u32), 0);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn allocator_never_leaks_or_double_owns(s in setup(), ops in prop::collection::vec(op(), 1..60)) {
        run_ops(&s, &ops)?;
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// The raw allocator against a model: allocate, retain and release in any order.
    #[test]
    fn raw_allocator_matches_model(
        total in 0usize..10,
        steps in prop::collection::vec((0u8..3, any::<Index>()), 0..80),
    ) {
        let mut a = PageAllocator::new(total);
        let mut model = vec![0u32; total];
        for (kind, pick) in steps {
            let used: Vec<u32> = (0..total as u32).filter(|&p| model[p as usize] > 0).collect();
            match kind {
                0 => match a.allocate() {
                    Ok(p) => {
                        prop_assert_eq!(model[p as usize], 0, "allocate handed out page {} in use", p);
                        model[p as usize] = 1;
                    }
                    Err(e) => {
                        prop_assert_eq!(e, KvError::OutOfPages { total });
                        prop_assert!(model.iter().all(|&r| r > 0), "allocate failed with pages free");
                    }
                },
                1 if !used.is_empty() => {
                    let p = used[pick.index(used.len())];
                    a.retain(p);
                    model[p as usize] += 1;
                }
                2 if !used.is_empty() => {
                    let p = used[pick.index(used.len())];
                    let freed = a.release(p);
                    model[p as usize] -= 1;
                    prop_assert_eq!(freed, model[p as usize] == 0);
                }
                _ => {}
            }
            prop_assert!(a.check().is_ok(), "{:?}", a.check());
            prop_assert_eq!(a.used_count() + a.free_count(), a.total());
            prop_assert_eq!(a.free_count(), model.iter().filter(|&&r| r == 0).count());
            for (p, &r) in model.iter().enumerate() {
                prop_assert_eq!(a.refs(p as u32), r);
            }
        }
    }
}

#[test]
fn allocator_hands_out_low_pages_first_and_reports_full() {
    let mut a = PageAllocator::new(3);
    assert_eq!(a.allocate(), Ok(0));
    assert_eq!(a.allocate(), Ok(1));
    assert_eq!(a.allocate(), Ok(2));
    let e = a.allocate().unwrap_err();
    assert_eq!(e, KvError::OutOfPages { total: 3 });
    assert_eq!(e.to_string(), "KV cache is full: all 3 pages are in use");
    assert!(a.release(1));
    assert_eq!(a.allocate(), Ok(1));
    a.check().unwrap();
}

#[test]
#[should_panic(expected = "release of free page")]
fn releasing_a_free_page_panics() {
    let mut a = PageAllocator::new(2);
    a.release(0);
}

#[test]
#[should_panic(expected = "retain of free page")]
fn retaining_a_free_page_panics() {
    let mut a = PageAllocator::new(2);
    a.retain(1);
}

#[test]
fn append_is_all_or_nothing_when_full() {
    let g = KvGeometry::new(1, 2, 2).unwrap();
    let mut cache = KvCache::new(g, KvDtype::F32, 2, 3);
    let mut a = Sequence::default();
    cache.append(&mut a, 3).unwrap(); // 2 pages, the second half full
    let mut b = cache.fork(&a);
    // b needs a copy of the shared partial page plus 2 new pages: 3 > 1 free.
    assert_eq!(cache.pages_needed(&b, 5), 3);
    let before = b.clone();
    assert_eq!(
        cache.append(&mut b, 5),
        Err(KvError::OutOfPages { total: 3 })
    );
    assert_eq!(b, before);
    assert_eq!(cache.allocator().free_count(), 1);
    assert_eq!(cache.allocator().refs(a.pages[1]), 2);
    // Exactly enough: copy the shared partial page.
    let slots = cache.append(&mut b, 1).unwrap();
    assert_eq!(slots.len(), 1);
    assert_ne!(b.pages[1], a.pages[1], "append wrote into a shared page");
    assert_eq!(b.pages[0], a.pages[0]);
    assert_eq!(cache.allocator().free_count(), 0);
    cache.free(&mut a);
    cache.free(&mut b);
    assert_eq!(cache.allocator().free_count(), 3);
    cache.allocator().check().unwrap();
}
