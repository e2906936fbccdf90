//! Portable fallbacks of the vector primitives.

use vortex_kv::KvElem;

pub fn dot<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

pub fn axpy<T: KvElem>(acc: &mut [f32], w: f32, x: &[T]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a += w * v.to_f32();
    }
}

pub fn sum(x: &[f32]) -> f32 {
    x.iter().sum()
}

pub fn max(x: &[f32]) -> f32 {
    x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

pub fn scale(x: &mut [f32], c: f32) {
    x.iter_mut().for_each(|v| *v *= c);
}

pub fn exp_shifted(x: &mut [f32], shift: f32) -> f32 {
    let mut sum = 0.0;
    for v in x {
        *v = (*v - shift).exp();
        sum += *v;
    }
    sum
}

pub fn group_scores<T: KvElem>(q: &[f32], keys: &[T], dim: usize, scale: f32, scores: &mut [f32]) {
    let tokens = keys.len() / dim;
    if tokens == 0 {
        return;
    }
    for (qh, row) in q.chunks_exact(dim).zip(scores.chunks_exact_mut(tokens)) {
        for (s, k) in row.iter_mut().zip(keys.chunks_exact(dim)) {
            *s = scale * dot(qh, k);
        }
    }
}

pub fn group_accumulate<T: KvElem>(probs: &[f32], values: &[T], dim: usize, acc: &mut [f32]) {
    let tokens = values.len() / dim;
    if tokens == 0 {
        return;
    }
    for (a, p) in acc.chunks_exact_mut(dim).zip(probs.chunks_exact(tokens)) {
        for (&w, v) in p.iter().zip(values.chunks_exact(dim)) {
            axpy(a, w, v);
        }
    }
}
