//! Matrix products of quantized weights with f32 activations: the entry points, the split of
//! rows into parallel tasks, and each task's pass over its rows with the kernels of its level.

use std::marker::PhantomData;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::acts::{Acts, ActsSet};
#[cfg(target_arch = "x86_64")]
use super::dot_avx2 as avx2;
#[cfg(target_arch = "x86_64")]
use super::dot_avx512 as avx512;
use super::dot_scalar as scalar;
use super::error::QuantError;
use super::isa::{Isa, IsaLevel};
use super::q8::{BlockQ8K, BlockQ8x2};
use super::qmatrix::QMatrix;
use super::row_groups::{GROUP_ROWS, RowGroups};
#[cfg(target_arch = "x86_64")]
use super::row_tiles::{FloatTiles, PairTiles, RowTiles, TILE_ROWS, float_kind};
use super::types::{GgmlType, QK, QK_K};

/// `out[t][r] = Σ_c w[r][c] * x[t][c]` for `n` tokens: `x` is `[n, cols]`, `out` is `[n, rows]`,
/// both row-major. Uses the best instruction set of this CPU and all rayon threads.
///
/// Quantized weights stay quantized: activations are quantized to 8 bits per block (32 elements
/// for Q4_0/Q4_1/Q5_0/Q8_0, 256 for Q4_K/Q6_K) and multiplied with integer dot products, so the
/// result carries the activations' rounding error (at most half a step of 1/127 of each block's
/// largest magnitude). Float weights are multiplied in f32, except bf16 ones where the `Isa`
/// takes bf16 pairs ([`Isa::bf16_pairs`]): their activations are rounded to bf16 (at most half a
/// unit in the last of its 8 bits) and the products summed in f32.
pub fn matmul(w: &QMatrix, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), QuantError> {
    matmul_with(detected(), w, x, n, out)
}

/// [`matmul`] with the kernels of `isa`.
pub fn matmul_with(
    isa: Isa,
    w: &QMatrix,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    matmul_many_with(isa, &[*w], x, n, &mut [out])
}

/// [`matmul`] of several matrices with the same activations (e.g. the query, key and value
/// projections): `x` is quantized once and all rows share one parallel pass, which matters for
/// matrices too small to be worth splitting over threads on their own. `outs[i]` receives
/// `ws[i] · x`.
pub fn matmul_many(
    ws: &[QMatrix],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
) -> Result<(), QuantError> {
    matmul_many_with(detected(), ws, x, n, outs)
}

/// [`matmul_many`] with the kernels of `isa`.
pub fn matmul_many_with(
    isa: Isa,
    ws: &[QMatrix],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
) -> Result<(), QuantError> {
    check_len("outputs", ws.len(), outs.len())?;
    for (w, out) in ws.iter().zip(outs.iter()) {
        check_len("activations", n.saturating_mul(w.cols()), x.len())?;
        check_len("output", n.saturating_mul(w.rows()), out.len())?;
    }
    let Some(cols) = ws.first().map(|w| w.cols()) else {
        return Ok(());
    };
    if n == 0 {
        return Ok(());
    }
    if cols == 0 {
        outs.iter_mut().for_each(|o| o.fill(0.0));
        return Ok(());
    }
    let level = isa.level();
    if let Some(w) = ws
        .iter()
        .find(|w| w.groups_only() && level == IsaLevel::Scalar)
    {
        return Err(QuantError::GroupsOnly { ty: w.ty() });
    }
    let acts = ActsSet::quantize(isa, ws, x, n, cols);
    let jobs: Vec<Job> = ws
        .iter()
        .zip(outs.iter_mut())
        .map(|(w, out)| Job {
            level,
            w,
            groups: w.groups().filter(|_| level != IsaLevel::Scalar),
            acts: acts.for_type(w.ty()),
            n,
            out: Columns::new(out, w.rows(), n),
        })
        .collect();
    run(&jobs);
    Ok(())
}

fn detected() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(Isa::detect)
}

fn check_len(what: &'static str, expected: usize, found: usize) -> Result<(), QuantError> {
    if expected == found {
        Ok(())
    } else {
        Err(QuantError::BufferLength {
            what,
            expected,
            found,
        })
    }
}

/// Rows `t0..t0 + NT` of `v`, each `len` long.
fn token_rows<T, const NT: usize>(v: &[T], len: usize, t0: usize) -> [&[T]; NT] {
    std::array::from_fn(|i| &v[(t0 + i) * len..(t0 + i + 1) * len])
}

/// Weight bytes per parallel task are kept within these bounds (the upper one so that a task's
/// rows stay in L2 while token panels pass over them).
const MIN_TASK_BYTES: usize = 32 << 10;
const MAX_TASK_BYTES: usize = 256 << 10;
/// Below this much weight traffic (bytes times tokens) a product runs on the calling thread.
/// Low enough that a small model's decode matrices (70 KB and up) use every thread: one core
/// runs the kernels at about half the memory bandwidth.
const PAR_MIN_WORK: usize = 64 << 10;
/// Tokens per kernel call; each weight block is decoded once per call. A call's tokens meet
/// every row of a task before the next tokens do, so that their activations (most of what a
/// call reads: a row's weights are read once for all of them) stay in L1 while the rows stream
/// from L2. Measured against panels of 32 tokens that met each row in calls of 4: 1.07-1.32x
/// for the 32-element formats at 16 and 512 tokens, 1.00-1.07x for the K-quants.
const MAX_NT: usize = 8;

/// `$body` with `$nt` (1 to [`MAX_NT`] tokens) as the constant `$n`, for the kernels' const
/// generic token count.
macro_rules! with_call_size {
    ($nt:expr, $n:ident => $body:expr) => {
        match $nt {
            8 => {
                const $n: usize = 8;
                $body
            }
            7 => {
                const $n: usize = 7;
                $body
            }
            6 => {
                const $n: usize = 6;
                $body
            }
            5 => {
                const $n: usize = 5;
                $body
            }
            4 => {
                const $n: usize = 4;
                $body
            }
            3 => {
                const $n: usize = 3;
                $body
            }
            2 => {
                const $n: usize = 2;
                $body
            }
            _ => {
                const $n: usize = 1;
                $body
            }
        }
    };
}

struct Job<'a> {
    level: IsaLevel,
    w: &'a QMatrix<'a>,
    /// `w`'s rows regrouped, where this job's kernels read them.
    groups: Option<&'a RowGroups>,
    acts: Acts<'a>,
    n: usize,
    /// The product, `[n, rows]`; each task owns a range of its rows.
    out: Columns<'a>,
}

/// Fills each job's output with its product, splitting all rows into tasks of similar weight
/// bytes.
fn run(jobs: &[Job]) {
    let n = jobs.first().map_or(1, |j| j.n);
    let total: usize = jobs.iter().map(|j| j.w.rows() * j.w.row_bytes()).sum();
    let threads = rayon::current_num_threads();
    if threads == 1 || total.saturating_mul(n) < PAR_MIN_WORK {
        for job in jobs {
            job.rows(0..job.w.rows());
        }
        return;
    }
    let task_bytes = (total / (threads * 8)).clamp(MIN_TASK_BYTES, MAX_TASK_BYTES);
    let mut tasks = Vec::new();
    for job in jobs {
        let mut task_rows = (task_bytes / job.w.row_bytes().max(1)).max(1);
        if job.groups.is_some() {
            task_rows = task_rows.next_multiple_of(GROUP_ROWS);
        }
        for row0 in (0..job.w.rows()).step_by(task_rows) {
            tasks.push((job, row0..(row0 + task_rows).min(job.w.rows())));
        }
    }
    tasks.into_par_iter().for_each(|(job, rows)| job.rows(rows));
}

/// A product's output, `[n, rows]` row-major, written by tasks that each own a range of rows
/// (a column range of every token's output).
#[derive(Clone, Copy)]
struct Columns<'a> {
    ptr: *mut f32,
    rows: usize,
    n: usize,
    out: PhantomData<&'a mut [f32]>,
}

// SAFETY: tasks write disjoint rows through it while it holds the output's unique borrow.
unsafe impl Send for Columns<'_> {}
// SAFETY: as above.
unsafe impl Sync for Columns<'_> {}

impl<'a> Columns<'a> {
    fn new(out: &'a mut [f32], rows: usize, n: usize) -> Self {
        assert_eq!(out.len(), rows * n);
        Self {
            ptr: out.as_mut_ptr(),
            rows,
            n,
            out: PhantomData,
        }
    }

    /// `out[t][r0..r0 + vals.len()] = vals`.
    ///
    /// # Safety
    /// No other task may write these rows.
    #[inline]
    unsafe fn set_run(self, t: usize, r0: usize, vals: &[f32]) {
        assert!(t < self.n && r0 + vals.len() <= self.rows);
        // SAFETY: in bounds (checked above); the caller owns these rows.
        let dst = unsafe { self.ptr.add(t * self.rows + r0) };
        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), dst, vals.len()) };
    }

    /// `out[t][r] = v`.
    ///
    /// # Safety
    /// No other task may write row `r`.
    #[inline]
    unsafe fn set(self, t: usize, r: usize, v: f32) {
        assert!(t < self.n && r < self.rows);
        // SAFETY: in bounds (checked above); the caller owns row r.
        unsafe { *self.ptr.add(t * self.rows + r) = v };
    }

    /// Rows `rows` of a one-token output, as a slice.
    ///
    /// # Safety
    /// As [`Columns::set`], for every row of the range.
    unsafe fn token_row(self, rows: std::ops::Range<usize>) -> &'a mut [f32] {
        assert!(self.n == 1 && rows.end <= self.rows && rows.start <= rows.end);
        // SAFETY: in bounds (checked above), and the caller owns these rows.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(rows.start), rows.len()) }
    }
}

impl Job<'_> {
    /// Rows `rows` of the product, into its output; the caller owns those rows of it. Where
    /// the job has groups, `rows` starts at a group's first row.
    fn rows(&self, rows: std::ops::Range<usize>) {
        let grouped = self.groups.map_or(0, |g| g.rows());
        let split = grouped.clamp(rows.start, rows.end);
        if split > rows.start {
            self.grouped_rows(rows.start..split);
        }
        self.file_rows(split..rows.end);
    }

    /// [`Job::rows`] from the groups: `rows` are whole groups.
    fn grouped_rows(&self, rows: std::ops::Range<usize>) {
        let groups = self.groups.expect("a job with groups");
        assert!(rows.start.is_multiple_of(GROUP_ROWS) && rows.end.is_multiple_of(GROUP_ROWS));
        let (n, out) = (self.n, self.out);
        for t in (0..n).step_by(MAX_NT) {
            for g in rows.start / GROUP_ROWS..rows.end / GROUP_ROWS {
                let w = groups.group(g);
                let put = |vals: &[[f32; GROUP_ROWS]]| {
                    for (i, v) in vals.iter().enumerate() {
                        // SAFETY: this task owns the group's rows (see `run`).
                        unsafe { out.set_run(t + i, g * GROUP_ROWS, v) };
                    }
                };
                with_call_size!((n - t).min(MAX_NT), NT => put(&self.group_dots::<NT>(w, t)));
            }
        }
    }

    /// Group `g` (its bytes) times tokens `t0..t0 + NT`, with the kernels of the job's level.
    /// Groups exist only where the CPU has AVX2.
    #[inline]
    fn group_dots<const NT: usize>(&self, g: &[u8], t0: usize) -> [[f32; GROUP_ROWS]; NT] {
        let (ty, cols) = (self.w.ty(), self.w.cols());
        #[cfg(target_arch = "x86_64")]
        {
            use super::dot_avx2::{Q4_0, Q4_1, Q5_0, Q8_0};
            use super::dot_groups::{avx2, avxvnni, vnni};
            macro_rules! products {
                ($level:ident) => {
                    match (self.acts, ty) {
                        (Acts::Q8K(y), GgmlType::Q4_K) => {
                            $level::dot_q4_k(g, token_rows(y, cols / QK_K, t0))
                        }
                        (Acts::Q8K(y), _) => $level::dot_q6_k(g, token_rows(y, cols / QK_K, t0)),
                        (Acts::Q8(y), _) => {
                            let ys = token_rows(y, (cols / QK).div_ceil(2), t0);
                            match ty {
                                GgmlType::Q4_0 => $level::dot_block32::<NT, Q4_0>(g, ys),
                                GgmlType::Q4_1 => $level::dot_block32::<NT, Q4_1>(g, ys),
                                GgmlType::Q5_0 => $level::dot_block32::<NT, Q5_0>(g, ys),
                                _ => $level::dot_block32::<NT, Q8_0>(g, ys),
                            }
                        }
                        (Acts::F32(_) | Acts::Bf16(_), _) => {
                            unreachable!("float weights are not grouped")
                        }
                    }
                };
            }
            // SAFETY: a job has groups only at these levels (`matmul_many_with`), which detection
            // found on this CPU.
            let v = unsafe {
                match self.level {
                    IsaLevel::Avx512Vnni => products!(vnni),
                    IsaLevel::AvxVnni => products!(avxvnni),
                    _ => products!(avx2),
                }
            };
            // SAFETY: `__m256` and `[f32; 8]` have the same size, and every bit pattern is
            // valid.
            v.map(|v| unsafe { std::mem::transmute::<std::arch::x86_64::__m256, [f32; 8]>(v) })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (ty, cols, g, t0);
            unreachable!("row groups need AVX2")
        }
    }

    /// [`Job::rows`] from the file's layout.
    fn file_rows(&self, rows: std::ops::Range<usize>) {
        let (n, out) = (self.n, self.out);
        if n == 1 {
            // SAFETY: this task owns `rows` (see `run`).
            return self.gemv(rows.start, unsafe { out.token_row(rows) });
        }
        // Float weights with AVX-512 (and bf16 ones on pairs) take tiles of rows: at 16 tokens
        // and more, all but the first tokens find the rows in L2. One token streams its rows
        // one at a time (above): three interleaved row streams from DRAM ran at 0.55-0.6x.
        #[cfg(target_arch = "x86_64")]
        match self.acts {
            Acts::Bf16(x) => return self.tiled_rows(PairTiles, x, rows),
            Acts::F32(x) if self.level == IsaLevel::Avx512Vnni => {
                return self.tiled_rows(FloatTiles(float_kind(self.w.ty())), x, rows);
            }
            _ => {}
        }
        // Measured and rejected: kernels taking several rows of this layout at once (sharing
        // activation loads: faster with cached weights, but interleaved row streams ran at half
        // speed from DRAM; row groups store such rows as one stream instead); splitting rows
        // into column chunks to keep the tokens' activations in L1 (0.87-1.17x).
        for t in (0..n).step_by(MAX_NT) {
            let nt = (n - t).min(MAX_NT);
            for r in rows.clone() {
                let w = self.w.row(r);
                let put = |vals: &[f32]| {
                    for (i, &v) in vals.iter().enumerate() {
                        // SAFETY: this task owns row r (see `run`).
                        unsafe { out.set(t + i, r, v) };
                    }
                };
                with_call_size!(nt, NT => put(&self.dots::<NT>(w, t)));
            }
        }
    }

    /// [`Job::file_rows`] by a row-tile kernel, [`TILE_ROWS`] rows at a time (each sum as one
    /// row alone gives it).
    #[cfg(target_arch = "x86_64")]
    fn tiled_rows<K: RowTiles>(&self, kernel: K, x: &[K::Act], rows: std::ops::Range<usize>) {
        let (n, out, cols) = (self.n, self.out, self.w.cols());
        for t in (0..n).step_by(MAX_NT) {
            let nt = (n - t).min(MAX_NT);
            let mut r = rows.start;
            while r < rows.end {
                let take = (rows.end - r).min(TILE_ROWS);
                with_call_size!(nt, NT => {
                    let xs: [&[K::Act]; NT] = token_rows(x, cols, t);
                    let put = |k: usize, vals: [f32; NT]| {
                        for (i, v) in vals.into_iter().enumerate() {
                            // SAFETY: this task owns rows r..r + take (see `run`).
                            unsafe { out.set(t + i, r + k, v) };
                        }
                    };
                    if take == TILE_ROWS {
                        let w: [&[u8]; TILE_ROWS] = std::array::from_fn(|k| self.w.row(r + k));
                        for (k, vals) in kernel.rows(w, xs).into_iter().enumerate() {
                            put(k, vals);
                        }
                    } else {
                        for k in 0..take {
                            put(k, kernel.rows([self.w.row(r + k)], xs)[0]);
                        }
                    }
                });
                r += take;
            }
        }
    }

    /// [`Job::rows`] for one token (decode): a plain pass over the rows, whose per-row
    /// bookkeeping would otherwise cost a good share of a short row's dot product. (Software
    /// prefetching ahead of the rows was measured slower: the kernels are compute-bound here.)
    fn gemv(&self, row0: usize, out: &mut [f32]) {
        if out.is_empty() {
            return;
        }
        let rb = self.w.row_bytes();
        let data = &self.w.data()[row0 * rb..(row0 + out.len()) * rb];
        let (level, ty) = (self.level, self.w.ty());
        let mut each = |dot: &dyn Fn(&[u8]) -> f32| {
            for (o, w) in out.iter_mut().zip(data.chunks_exact(rb)) {
                *o = dot(w);
            }
        };
        match self.acts {
            #[cfg(target_arch = "x86_64")]
            Acts::F32(x) if level == IsaLevel::Avx512Vnni => {
                let kernel = FloatTiles(float_kind(ty));
                each(&|w| kernel.rows([w], [x])[0][0])
            }
            Acts::F32(x) => each(&|w| float_dots(level, ty, w, [x])[0]),
            Acts::Q8(y) => each(&|w| q8_dots(level, ty, w, [y])[0]),
            Acts::Q8K(y) => each(&|w| q8k_dots(level, ty, w, [y])[0]),
            #[cfg(target_arch = "x86_64")]
            Acts::Bf16(x) => each(&|w| PairTiles.rows([w], [x])[0][0]),
            #[cfg(not(target_arch = "x86_64"))]
            Acts::Bf16(_) => unreachable!("bf16 pairs need AVX-512 BF16"),
        }
    }

    /// Weight row `w` times tokens `t0..t0 + NT`.
    #[inline]
    fn dots<const NT: usize>(&self, w: &[u8], t0: usize) -> [f32; NT] {
        let (level, ty, cols) = (self.level, self.w.ty(), self.w.cols());
        match self.acts {
            Acts::F32(x) => float_dots(level, ty, w, token_rows(x, cols, t0)),
            Acts::Q8(v) => q8_dots(level, ty, w, token_rows(v, (cols / QK).div_ceil(2), t0)),
            Acts::Q8K(v) => q8k_dots(level, ty, w, token_rows(v, cols / QK_K, t0)),
            Acts::Bf16(_) => unreachable!("bf16 pairs take `tiled_rows`"),
        }
    }
}

fn float_dots<const NT: usize>(
    level: IsaLevel,
    ty: GgmlType,
    w: &[u8],
    xs: [&[f32]; NT],
) -> [f32; NT] {
    #[cfg(target_arch = "x86_64")]
    if level != IsaLevel::Scalar {
        // SAFETY: an Isa above Scalar exists only if detection found AVX2, FMA and F16C.
        return unsafe { avx2::dot_float(float_kind(ty), w, xs) };
    }
    let _ = level;
    match ty {
        GgmlType::F16 => scalar::dot_f16(w, xs),
        GgmlType::BF16 => scalar::dot_bf16(w, xs),
        _ => scalar::dot_f32(w, xs),
    }
}

fn q8_dots<const NT: usize>(
    level: IsaLevel,
    ty: GgmlType,
    w: &[u8],
    ys: [&[BlockQ8x2]; NT],
) -> [f32; NT] {
    // SAFETY (every arm): a level other than Scalar exists only if detection found its features.
    #[cfg(target_arch = "x86_64")]
    match level {
        IsaLevel::Avx512Vnni => {
            return unsafe {
                match ty {
                    GgmlType::Q4_0 => avx512::dot_q4_0(w, ys),
                    GgmlType::Q4_1 => avx512::dot_q4_1(w, ys),
                    GgmlType::Q5_0 => avx512::dot_q5_0(w, ys),
                    _ => avx512::dot_q8_0(w, ys),
                }
            };
        }
        // AVX-VNNI serves the row groups only; rows in the file's layout take AVX2's kernels.
        IsaLevel::AvxVnni | IsaLevel::Avx2 => {
            return unsafe {
                match ty {
                    GgmlType::Q4_0 => avx2::dot_q4_0(w, ys),
                    GgmlType::Q4_1 => avx2::dot_q4_1(w, ys),
                    GgmlType::Q5_0 => avx2::dot_q5_0(w, ys),
                    _ => avx2::dot_q8_0(w, ys),
                }
            };
        }
        IsaLevel::Scalar => {}
    }
    let _ = level;
    match ty {
        GgmlType::Q4_0 => scalar::dot_q4_0(w, ys),
        GgmlType::Q4_1 => scalar::dot_q4_1(w, ys),
        GgmlType::Q5_0 => scalar::dot_q5_0(w, ys),
        _ => scalar::dot_q8_0(w, ys),
    }
}

fn q8k_dots<const NT: usize>(
    level: IsaLevel,
    ty: GgmlType,
    w: &[u8],
    ys: [&[BlockQ8K]; NT],
) -> [f32; NT] {
    // SAFETY (every arm): a level other than Scalar exists only if detection found its features.
    #[cfg(target_arch = "x86_64")]
    match level {
        IsaLevel::Avx512Vnni => {
            return unsafe {
                match ty {
                    GgmlType::Q4_K => avx512::dot_q4_k(w, ys),
                    _ => avx512::dot_q6_k(w, ys),
                }
            };
        }
        IsaLevel::AvxVnni | IsaLevel::Avx2 => {
            return unsafe {
                match ty {
                    GgmlType::Q4_K => avx2::dot_q4_k(w, ys),
                    _ => avx2::dot_q6_k(w, ys),
                }
            };
        }
        IsaLevel::Scalar => {}
    }
    let _ = level;
    match ty {
        GgmlType::Q4_K => scalar::dot_q4_k(w, ys),
        _ => scalar::dot_q6_k(w, ys),
    }
}
