//! The matrix form of a generated index phase: where every per-page sum over a head's dims is a
//! product of the query with page fields, the tensor cores compute them (`mma.sync` m16n8k16,
//! f32 sums), as the hand-written centroid and envelope scorers do (`kernels/scores.cu`). A
//! warp takes 16 pages a tile as the rows of the products and the row's query heads as their
//! columns, each head split into a part and a rest (bf16, or f16 for fp8 fields) so that the
//! sums see the f32 query to about 2^-16 (bf16) or 2^-22 (f16); a page's fields of one
//! 128-byte line (an fp8 centroid) take two tiles a step. The query's parts and rests stay in
//! the lanes' registers, those that do not fit in shared memory. The sums land in shared
//! memory, and a lane a page computes the rest of the score from them.
//!
//! A sum is `dot(q, f)`, `sum(q * f, cols)` or `mean(q * f, cols)` (any 1-row field of bf16 or
//! fp8), or the sum of the larger or smaller of two products by the query,
//! `sum(maximum(q * a, q * b), cols)` (fp8 fields), Quest's bound:
//! `max(q, 0) . max(a, b) + min(q, 0) . min(a, b)` (the smaller swaps `max(a, b)` and
//! `min(a, b)`). The element-wise maximum and minimum skip a NaN factor as the CPU's do; bf16
//! fields take the lane form there, since an infinite factor would meet a zero part of the
//! query. The form needs compute capability 8.0 (bf16 fields) or 8.9 (fp8: the hardware widens
//! e4m3 pairs to f16); below it the kernel keeps the lane form.

use std::fmt::Write;

use vortex_flow::ir::{Axis, BinaryOp, Flow, Graph, Input, NodeId, Op, ReduceOp};
use vortex_kv::KvDtype;

use super::expr::{self, Leaves, at, is_leaf};
use super::index::{IndexLeaves, STATIC_SHARED_BYTES, shared_before_pages, store_key};
use super::lanes::{Kind, LaneForm};
use super::{By, compute};

/// Query heads a KV head, at most: two column tiles of 8 hold their parts and rests.
const MAX_GROUP: usize = 8;
/// Query heads a KV head from which the form is always taken. With two or three, the lane
/// form's arithmetic a page is small: the form is taken only for several sums or a product by
/// fp8 fields. At two, the lane form took 6% less time for Quest's bound alone from fp8 fields
/// and 2% less for a bf16 dot product, but 24% more for an fp8 dot product and 45% more for
/// three sums (H100, BENCHMARKS.md, the sixty-fifth pass).
const MIN_GROUP: usize = 4;
/// Sums a tile, at most (each a tile of f32 accumulators and its share of shared memory).
const MAX_SUMS: usize = 4;
/// Warps of an index block (`TK_WARPS`), each with its own sums in shared memory.
const TOPK_WARPS: usize = crate::topk::THREADS as usize / 32;
/// 32-bit words of query parts and rests and of a step's fields a lane may hold, and of both
/// together.
const MAX_QUERY_WORDS: usize = 64;
const MAX_FIELD_WORDS: usize = 64;
const MAX_LANE_WORDS: usize = 96;

/// What a sum multiplies the query by.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Product {
    /// One field.
    Field(usize),
    /// The larger (`true`) or smaller of the products by two fields.
    Pair(bool, usize, usize),
}

/// A sum over a head's dims the tensor cores compute: node `id`, `[GROUP, 1]` a page, divided
/// by the dims where it is a `mean`.
#[derive(Clone, Copy, Debug)]
struct Sum {
    id: NodeId,
    product: Product,
    mean: bool,
}

pub(super) struct MatrixForm<'a> {
    sums: Vec<Sum>,
    /// The fields the sums read, in order.
    fields: Vec<usize>,
    /// The fields are fp8 (f16 products), else bf16.
    fp8: bool,
    /// Tiles of 16 pages a warp loads at a step.
    step_tiles: usize,
    /// The query's last sets of parts and rests, held in shared memory instead of registers.
    shared_sets: usize,
    /// The lane form's kinds of the nodes, by id.
    kinds: &'a [Kind],
}

impl MatrixForm<'_> {
    fn plain(&self) -> bool {
        self.sums
            .iter()
            .any(|s| matches!(s.product, Product::Field(_)))
    }
    fn signed(&self) -> bool {
        self.sums
            .iter()
            .any(|s| matches!(s.product, Product::Pair(..)))
    }
    /// The query's sets of parts and rests, by name, with what each holds of a query value
    /// `x`: the query, or its positive and negative parts for the larger or smaller of two
    /// products. The last `shared_sets` are in shared memory.
    fn sets(&self) -> Vec<(&'static str, &'static str)> {
        let mut sets = Vec::new();
        if self.plain() {
            sets.push(("qw", "x"));
        }
        if self.signed() {
            sets.push(("qp", "fmaxf(x, 0.0f)"));
            sets.push(("qn", "fminf(x, 0.0f)"));
        }
        sets
    }
    /// Set `name` is in shared memory.
    fn in_shared(&self, name: &str) -> bool {
        let sets = self.sets();
        sets.iter().position(|&(n, _)| n == name) >= Some(sets.len() - self.shared_sets)
    }
    /// A lane's two words of set `name`'s part or rest, where the set is held.
    fn words(&self, name: &str) -> [&'static str; 2] {
        if self.in_shared(name) {
            SHARED_WORDS
        } else {
            REGISTER_WORDS
        }
    }
    /// The compute capability the form needs.
    fn arch(&self) -> u32 {
        if self.fp8 { 890 } else { 800 }
    }
    /// The form, in words.
    pub(super) fn describe(&self) -> String {
        let arch = self.arch();
        format!(
            "the matrix form: {} sum(s) of products by the query on the tensor cores, 16 pages a \
             warp (compute capability {}.{} or later; the lane form below it)",
            self.sums.len(),
            arch / 100,
            arch / 10 % 10
        )
    }
}

/// The matrix form of `flow`'s index phase, where the lane form `lanes` (which it has) reads
/// every split value only through sums the tensor cores can compute.
pub(super) fn plan<'a>(flow: &Flow, lanes: &'a LaneForm) -> Option<MatrixForm<'a>> {
    let index = flow.index.as_ref()?;
    let g = &index.graph;
    let geometry = flow.geometry;
    let (group, dim) = (geometry.group(), geometry.head_dim);
    if !(2..=MAX_GROUP).contains(&group) || !dim.is_multiple_of(32) || lanes.cols() != dim {
        return None;
    }
    let kinds = lanes.kinds();
    let mut sums = Vec::new();
    let mut parts = vec![false; g.nodes.len()];
    for (id, n) in g.nodes.iter().enumerate() {
        if kinds[id] != Kind::Reducing {
            continue;
        }
        let (product, nodes, mean) = sum_of(flow, g, id)?;
        if n.ty.rows != group || n.ty.cols != 1 {
            return None;
        }
        for j in nodes {
            parts[j] = true;
        }
        sums.push(Sum { id, product, mean });
    }
    // Every split value is a factor of a sum, computed by the tensor cores alone.
    if (0..g.nodes.len()).any(|id| kinds[id] == Kind::Split && !parts[id]) {
        return None;
    }
    let mut fields: Vec<usize> = Vec::new();
    for s in &sums {
        let read = match s.product {
            Product::Field(f) => vec![f],
            Product::Pair(_, a, b) => vec![a, b],
        };
        for f in read {
            if !fields.contains(&f) {
                fields.push(f);
            }
        }
    }
    let dtypes: Vec<KvDtype> = fields.iter().map(|&f| flow.fields[f].dtype).collect();
    let fp8 = dtypes.first() == Some(&KvDtype::Fp8);
    if sums.is_empty()
        || sums.len() > MAX_SUMS
        || !dtypes.iter().all(|&d| d == dtypes[0])
        || !matches!(dtypes[0], KvDtype::Bf16 | KvDtype::Fp8)
    {
        return None;
    }
    let plain = sums.iter().any(|s| matches!(s.product, Product::Field(_)));
    let signed = sums.iter().any(|s| matches!(s.product, Product::Pair(..)));
    if (signed && !fp8) || (group < MIN_GROUP && sums.len() < 2 && !(fp8 && plain)) {
        return None;
    }
    // Two tiles a step where a page's fields are one 128-byte line (an fp8 centroid at head_dim
    // 128), as the hand-written scorers take, and their sums fit in shared memory.
    let one_line = fp8 && fields.len() == 1 && dim <= 128;
    let field_words =
        |tiles: usize| tiles * fields.len() * 2 * (dim / 32) * if fp8 { 2 } else { 4 };
    // The query's sets of parts and rests (the query; its positive and negative parts) are held
    // in registers where they all fit beside a step's fields, else half as many as would, the
    // rest read from shared memory: the sums' other operands take the registers then (with two
    // of three sets held at 8 query heads a KV head, ptxas spilled 152 bytes a thread; with one,
    // 16; with both of Quest's sets beside its two fp8 fields at head_dim 256, 80).
    let sets = usize::from(plain) + 2 * usize::from(signed);
    let set_words = (dim / 32) * 2 * tiles(group) * 2;
    let most_tiles = if one_line { 2 } else { 1 };
    let query_words = MAX_QUERY_WORDS.min(MAX_LANE_WORDS.saturating_sub(field_words(most_tiles)));
    let fit = query_words / set_words;
    let shared_sets = if sets <= fit { 0 } else { sets - fit / 2 };
    let room = STATIC_SHARED_BYTES
        .saturating_sub(shared_before_pages(flow, g))
        .saturating_sub(shared_sets * set_words * 32 * 4);
    let sums_bytes = |tiles: usize| TOPK_WARPS * sums.len() * 16 * tiles * group * 4;
    let step_tiles = match (one_line && sums_bytes(2) <= room, sums_bytes(1) <= room) {
        (true, _) => 2,
        (false, true) => 1,
        (false, false) => return None,
    };
    (field_words(step_tiles) <= MAX_FIELD_WORDS).then_some(MatrixForm {
        sums,
        fields,
        fp8,
        step_tiles,
        shared_sets,
        kinds,
    })
}

/// Column tiles of 8 the query's parts and rests take.
fn tiles(group: usize) -> usize {
    if group <= 4 { 1 } else { 2 }
}

/// What reduction `id` multiplies the query by, the nodes it reads for it and whether it is a
/// mean; `None` where it is not such a sum.
fn sum_of(flow: &Flow, g: &Graph, id: NodeId) -> Option<(Product, Vec<NodeId>, bool)> {
    let is_query = |j: NodeId| g.nodes[j].op == Op::Input(Input::Q);
    // A field of one row of a head's dims (not one value broadcast over them).
    let field = |j: NodeId| match g.nodes[j].op {
        Op::Field(f)
            if flow.fields[f].rows == 1 && flow.fields[f].cols == flow.geometry.head_dim =>
        {
            Some(f)
        }
        _ => None,
    };
    // A product of the query and a field, in either order.
    let by_query = |p: NodeId| match g.nodes[p].op {
        Op::Binary(BinaryOp::Mul, a, b) if is_query(a) => field(b),
        Op::Binary(BinaryOp::Mul, a, b) if is_query(b) => field(a),
        _ => None,
    };
    match g.nodes[id].op {
        Op::Dot(a, b) if is_query(a) => Some((Product::Field(field(b)?), vec![], false)),
        Op::Reduce(op @ (ReduceOp::Sum | ReduceOp::Mean), Axis::Cols, x) => {
            let mean = op == ReduceOp::Mean;
            if let Some(f) = by_query(x) {
                return Some((Product::Field(f), vec![x], mean));
            }
            let (larger, a, b) = match g.nodes[x].op {
                Op::Binary(BinaryOp::Max, a, b) => (true, a, b),
                Op::Binary(BinaryOp::Min, a, b) => (false, a, b),
                _ => return None,
            };
            let pair = Product::Pair(larger, by_query(a)?, by_query(b)?);
            Some((pair, vec![x, a, b], mean))
        }
        _ => None,
    }
}

/// Device helpers of the form, in front of the kernel.
const HELPERS: &str = r#"#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// bf16 bits of x, rounded to nearest even (finite x), and of what that part leaves (`rest`).
__device__ __forceinline__ unsigned int mx_bf16_part(float x, bool rest) {
    const unsigned int u = __float_as_uint(x);
    const unsigned int hi = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    if (!rest) return hi;
    const unsigned int v = __float_as_uint(x - __uint_as_float(hi << 16));
    return (v + 0x7fffu + ((v >> 16) & 1u)) >> 16;
}
// The same with f16 parts.
__device__ __forceinline__ unsigned int mx_f16_part(float x, bool rest) {
    unsigned short hi, lo;
    float back;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hi) : "f"(x));
    asm("cvt.f32.f16 %0, %1;" : "=f"(back) : "h"(hi));
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(lo) : "f"(x - back));
    return rest ? lo : hi;
}
// Asks L2 for the 128-byte line at p.
__device__ __forceinline__ void mx_prefetch(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
// Element-wise larger and smaller of two f16 pairs; a NaN loses to a number, as fmaxf's does.
__device__ __forceinline__ unsigned int mx_max2(unsigned int a, unsigned int b) {
    unsigned int r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ unsigned int mx_min2(unsigned int a, unsigned int b) {
    unsigned int r;
    asm("min.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// Eight e4m3 values -> their f16 pairs, in order (exact).
__device__ __forceinline__ uint4 mx_words(uint2 v) {
    return make_uint4(e4m3x2_f16x2(v.x), e4m3x2_f16x2(v.x >> 16), e4m3x2_f16x2(v.y),
                      e4m3x2_f16x2(v.y >> 16));
}
#endif
"#;

/// The form's device helpers, for a kernel that takes it.
pub(super) fn helpers() -> &'static str {
    HELPERS
}

/// A lane's two words of a query set's part or rest: in its registers, or in shared memory.
const REGISTER_WORDS: [&str; 2] = ["[0]", "[1]"];
const SHARED_WORDS: [&str; 2] = ["[lane].x", "[lane].y"];

/// The page loop of the matrix form, within `#if` on the compute capability it needs; `other`,
/// the lane form's loop, below it.
pub(super) fn page_loop(flow: &Flow, form: &MatrixForm, other: &str) -> Result<String, String> {
    let index = flow.index.as_ref().expect("an index phase");
    let qtiles = tiles(flow.geometry.group());
    let mut s = query_sets(form, qtiles);
    s.push_str(&step_loads(flow, form));
    for (k, sum) in form.sums.iter().enumerate() {
        s.push_str(&sum_products(form, k, sum, qtiles));
    }
    s.push_str(&scores(flow, &index.graph, form)?);
    s.push_str(other);
    s.push_str("#endif\n");
    Ok(s)
}

/// The query's parts and rests, in registers or in shared memory ([`MatrixForm::sets`]), from
/// the row's query heads `qg`.
fn query_sets(form: &MatrixForm, qtiles: usize) -> String {
    let part = if form.fp8 {
        "mx_f16_part"
    } else {
        "mx_bf16_part"
    };
    let mut s = format!(
        "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {arch}
    {{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    // Column g of the products: query head hq's part, or its rest ({qtiles} tile(s) of 8).
    const int hq = {qtiles} == 1 ? (g & 3) : g;
    float xq[HEAD_DIM / 32][2][4];
    _Pragma(\"unroll\") for (int c = 0; c < HEAD_DIM / 32; c++) _Pragma(\"unroll\") for (int m = 0; m < 2; m++) _Pragma(\"unroll\") for (int j = 0; j < 4; j++)
        xq[c][m][j] = hq < GROUP ? qg[hq * HEAD_DIM + 32 * c + 8 * t + 4 * m + j] : 0.0f;
",
        arch = form.arch(),
    );
    if form.fp8 {
        // As scores.cu: every row scaled by a power of two so that its largest value lies in
        // [2^13, 2^14) before the f16 split, and the sums back (both exact).
        s.push_str(
            "    float big = 0.0f;
    _Pragma(\"unroll\") for (int c = 0; c < HEAD_DIM / 32; c++) _Pragma(\"unroll\") for (int m = 0; m < 2; m++) _Pragma(\"unroll\") for (int j = 0; j < 4; j++) big = fmaxf(big, fabsf(xq[c][m][j]));
    _Pragma(\"unroll\") for (int o = 16; o > 0; o >>= 1) big = fmaxf(big, __shfl_xor_sync(TK_FULL, big, o));
    const int e = max(-126, ((__float_as_int(big) >> 23) & 0xff) - 140);
    const float qscale = __int_as_float((127 - e) << 23), sscale = __int_as_float((127 + e) << 23);
",
        );
    } else {
        s.push_str("    const float qscale = 1.0f, sscale = 1.0f;\n");
    }
    for (name, value) in form.sets() {
        // A set in shared memory: every lane's words, written by the first warp.
        let (decl, only) = if !form.in_shared(name) {
            let decl = format!("unsigned int {name}[HEAD_DIM / 32][2][{qtiles}][2]");
            (decl, "")
        } else {
            let decl = format!("__shared__ uint2 {name}[HEAD_DIM / 32][2][{qtiles}][32]");
            (decl, "if (warp == 0) ")
        };
        let [w0, w1] = form.words(name);
        let _ = writeln!(
            s,
            "    {decl};
    {only}_Pragma(\"unroll\") for (int c = 0; c < HEAD_DIM / 32; c++) _Pragma(\"unroll\") for (int m = 0; m < 2; m++) _Pragma(\"unroll\") for (int k = 0; k < {qtiles}; k++) {{
        const bool rest = {qtiles} == 1 ? g >= 4 : k == 1;
        unsigned int p[4];
        _Pragma(\"unroll\") for (int j = 0; j < 4; j++) {{ const float x = xq[c][m][j]; p[j] = {part}(({value}) * qscale, rest); }}
        {name}[c][m][k]{w0} = p[0] | (p[1] << 16);
        {name}[c][m][k]{w1} = p[2] | (p[3] << 16);
    }}"
        );
    }
    if form.shared_sets > 0 {
        s.push_str("    __syncthreads();\n");
    }
    s
}

/// The warp's loop over steps of its pages, each step's fields loaded (as `x{field}[row
/// group][chunk]`) and the next one's fetched into L2.
fn step_loads(flow: &Flow, form: &MatrixForm) -> String {
    let sums = form.sums.len();
    let vec = if form.fp8 { "uint2" } else { "uint4" };
    let mut s = String::new();
    // Tiles of 16 pages a warp loads at once: a page's fields of one 128-byte line (an fp8
    // centroid) take two a step, to keep as many bytes in flight as a bf16 centroid's tile.
    let row_bytes = flow.geometry.head_dim * if form.fp8 { 1 } else { 2 };
    let lines = row_bytes.div_ceil(128);
    let st = form.step_tiles;
    let rows = 2 * st;
    let _ = writeln!(
        s,
        "    __shared__ float mx_sums[TK_WARPS][{sums}][{pages}][GROUP];
    // The page ids of the warp's step and of its next one, rows 8 r + g.
    unsigned int ids[2][{rows}];
    _Pragma(\"unroll\") for (int a = 0; a < 2; a++) _Pragma(\"unroll\") for (int r = 0; r < {rows}; r++) {{
        const int i = lo + {pages} * (warp + a * TK_WARPS) + 8 * r + g;
        ids[a][r] = i < hi ? logical[row.sinks + i] : 0u;
    }}
    for (int base = lo + {pages} * warp; base < hi; base += {pages} * TK_WARPS) {{",
        pages = 16 * st
    );
    for &f in &form.fields {
        // Rows past the candidates read page 0 and are never stored.
        let _ = writeln!(
            s,
            "        {vec} x{f}[{rows}][HEAD_DIM / 32];
        _Pragma(\"unroll\") for (int r = 0; r < {rows}; r++) _Pragma(\"unroll\") for (int c = 0; c < HEAD_DIM / 32; c++)
            x{f}[r][c] = __ldg(reinterpret_cast<const {vec}*>(f{f}) + ((unsigned long long)row.head * num_pages + ids[0][r]) * (HEAD_DIM / 8) + 4 * c + t);"
        );
    }
    // While this step's fields load, the next step's rows are fetched into L2 (as the
    // hand-written scorers do): more bytes in flight, no registers held for them.
    // The page is picked, not indexed: an index known only at run time would put ids in local
    // memory.
    let pick = (1..rows).fold("ids[1][0]".to_string(), |acc, r| {
        format!("r == {r} ? ids[1][{r}] : {acc}")
    });
    for &f in &form.fields {
        let _ = writeln!(
            s,
            "        _Pragma(\"unroll\") for (int li = t; li < {rows} * {lines}; li += 4) {{
            const int r = li / {lines};
            const unsigned int page = {pick};
            if (base + {pages} * TK_WARPS + 8 * r + g < hi) mx_prefetch(reinterpret_cast<const char*>(f{f}) + ((unsigned long long)row.head * num_pages + page) * {row_bytes} + 128 * (li % {lines}));
        }}",
            pages = 16 * st
        );
    }
    let _ = writeln!(
        s,
        "        _Pragma(\"unroll\") for (int r = 0; r < {rows}; r++) {{
            ids[0][r] = ids[1][r];
            const int i = base + {ahead} * TK_WARPS + 8 * r + g;
            ids[1][r] = i < hi ? logical[row.sinks + i] : 0u;
        }}",
        ahead = 32 * st
    );
    s
}

/// Sum `k` of each tile of the step into the warp's `mx_sums`.
fn sum_products(form: &MatrixForm, k: usize, sum: &Sum, qtiles: usize) -> String {
    let (mma, words) = if form.fp8 {
        ("mma_f16", "mx_words")
    } else {
        ("mma_bf16", "")
    };
    let st = form.step_tiles;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "        _Pragma(\"unroll\") for (int st = 0; st < {st}; st++) {{"
    );
    let _ = writeln!(s, "        float d{k}[{qtiles}][4] = {{}};");
    let _ = writeln!(
        s,
        "        _Pragma(\"unroll\") for (int c = 0; c < HEAD_DIM / 32; c++) {{"
    );
    let mut products = Vec::new();
    match sum.product {
        Product::Field(f) => {
            let _ = writeln!(
                s,
                "            const uint4 a0 = {words}(x{f}[2 * st][c]), a1 = {words}(x{f}[2 * st + 1][c]);"
            );
            products.push(("a0", "a1", "qw"));
        }
        Product::Pair(larger, a, b) => {
            let _ = writeln!(
                s,
                "            const uint4 u0 = {words}(x{a}[2 * st][c]), u1 = {words}(x{a}[2 * st + 1][c]), v0 = {words}(x{b}[2 * st][c]), v1 = {words}(x{b}[2 * st + 1][c]);
            const uint4 hi0 = make_uint4(mx_max2(u0.x, v0.x), mx_max2(u0.y, v0.y), mx_max2(u0.z, v0.z), mx_max2(u0.w, v0.w));
            const uint4 hi1 = make_uint4(mx_max2(u1.x, v1.x), mx_max2(u1.y, v1.y), mx_max2(u1.z, v1.z), mx_max2(u1.w, v1.w));
            const uint4 lo0 = make_uint4(mx_min2(u0.x, v0.x), mx_min2(u0.y, v0.y), mx_min2(u0.z, v0.z), mx_min2(u0.w, v0.w));
            const uint4 lo1 = make_uint4(mx_min2(u1.x, v1.x), mx_min2(u1.y, v1.y), mx_min2(u1.z, v1.z), mx_min2(u1.w, v1.w));"
            );
            if larger {
                products.extend([("hi0", "hi1", "qp"), ("lo0", "lo1", "qn")]);
            } else {
                products.extend([("lo0", "lo1", "qp"), ("hi0", "hi1", "qn")]);
            }
        }
    }
    for (r0, r1, q) in products {
        let [w0, w1] = form.words(q);
        let _ = writeln!(
            s,
            "            _Pragma(\"unroll\") for (int k = 0; k < {qtiles}; k++) {{
                {mma}(d{k}[k], {r0}.x, {r1}.x, {r0}.y, {r1}.y, {q}[c][0][k]{w0}, {q}[c][0][k]{w1});
                {mma}(d{k}[k], {r0}.z, {r1}.z, {r0}.w, {r1}.w, {q}[c][1][k]{w0}, {q}[c][1][k]{w1});
            }}"
        );
    }
    // Lane t holds columns 2t, 2t + 1 of rows g and g + 8: with one tile, lanes t < 2 hold
    // heads 2t, 2t + 1 and lanes t + 2 their rests; with two, parts and rests a tile each.
    let _ = writeln!(
        s,
        "        }}
        _Pragma(\"unroll\") for (int j = 0; j < 4; j++) {{
            float v = ({qtiles} == 1 ? d{k}[0][j] + __shfl_xor_sync(TK_FULL, d{k}[0][j], 2) : d{k}[0][j] + d{k}[{qtiles} - 1][j]) * sscale;{mean}
            const int h = 2 * t + (j & 1);
            if (({qtiles} == 2 || t < 2) && h < GROUP) mx_sums[warp][{k}][16 * st + g + 8 * (j >> 1)][h] = v;
        }}
        }}",
        mean = if sum.mean {
            " v = __fdiv_rn(v, (float)HEAD_DIM);"
        } else {
            ""
        }
    );
    s
}

/// Each page's score from its sums, a lane a page, and its key stored; the loop and the
/// form's scope closed.
fn scores(flow: &Flow, g: &Graph, form: &MatrixForm) -> Result<String, String> {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "        __syncwarp();
        if (lane < {pages}) {{
        const int i = base + lane;
        const bool valid = i < hi;
        const int lp = row.sinks + i;
        const unsigned long long field_base = (unsigned long long)row.head * num_pages + (valid ? logical[lp] : 0u);
        (void)lp; (void)field_base;",
        pages = 16 * form.step_tiles
    );
    for (k, sum) in form.sums.iter().enumerate() {
        let _ = writeln!(
            s,
            "        float n{id}[GROUP]; _Pragma(\"unroll\") for (int h = 0; h < GROUP; h++) n{id}[h] = mx_sums[warp][{k}][lane][h];",
            id = sum.id
        );
    }
    s.push_str(&rest_of_score(flow, g, form)?);
    s.push_str(
        "        }
        __syncwarp();
    }
    }
#else
",
    );
    Ok(s)
}

/// A page's score from its sums (in `n{id}`), a lane a page, and its key stored.
fn rest_of_score(flow: &Flow, g: &Graph, form: &MatrixForm) -> Result<String, String> {
    let index = flow.index.as_ref().expect("an index phase");
    let mut whole = IndexLeaves {
        flow,
        staged: false,
        held: Vec::new(),
        inline: Vec::new(),
    };
    let inline = expr::inlinable(g, &|_| false);
    whole.inline = (0..g.nodes.len())
        .map(|id| inline[id] && form.kinds[id] == Kind::Whole)
        .collect();
    let mut s = String::new();
    for (id, n) in g.nodes.iter().enumerate() {
        if is_leaf(&n.op) || !n.ty.per_page || form.kinds[id] != Kind::Whole || whole.inlined(id) {
            continue;
        }
        let _ = write!(s, "        float n{id}[{}];\n        ", n.ty.elems());
        s.push_str(&compute(flow, g, &whole, id, By::Thread)?);
    }
    s.push_str(&store_key(
        &at(g, &whole, index.score, "0", "0")?,
        Some("valid"),
    ));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vortex_flow::library::load;
    use vortex_flow::{Geometry, compile};

    /// The form of `flow` (its lane form kept for the test's length).
    fn form(flow: &Flow) -> Option<MatrixForm<'static>> {
        plan(flow, Box::leak(Box::new(super::super::lanes::plan(flow)?)))
    }

    /// The fp8 flows' sums (a centroid's dot product, Quest's bound) and bf16 centroids take the
    /// form; bf16 envelopes (an infinite bound would meet a zero part of the query), a
    /// reduction other than a sum, mixed field types, and sixteen query heads a KV head do not.
    #[test]
    fn sums_of_products_by_the_query_take_the_matrix_form() {
        let g = Geometry::default();
        for (name, fp8, pair) in [
            ("block_topk", false, false),
            ("block_topk_fp8", true, false),
            ("quest_fp8", true, true),
        ] {
            let f = form(&load(name, g).unwrap()).unwrap_or_else(|| panic!("{name}"));
            assert_eq!((f.fp8, f.signed(), f.plain()), (fp8, pair, !pair), "{name}");
        }
        assert!(form(&load("quest", g).unwrap()).is_none());
        let flow = |fields: &str, index: &str| {
            let src = format!(
                "flow t \"test\"\n{fields}cache:\n  a = max(K, rows)\n  b = min(K, rows)\nindex:\n{index}"
            );
            compile("t.flow", &src, g).unwrap()
        };
        let fp8 = "page a[1, D] fp8\npage b[1, D] fp8\n";
        let smaller = flow(
            fp8,
            "  s = sum(minimum(a * q, q * b), cols)\n  topk(max(s + mean(q * a, cols), rows))\n",
        );
        let f = form(&smaller).unwrap();
        assert_eq!(f.sums.len(), 2);
        assert_eq!(f.sums[0].product, Product::Pair(false, 0, 1));
        assert_eq!(f.sums[1].product, Product::Field(0));
        assert!(!f.sums[0].mean && f.sums[1].mean);
        assert!(form(&flow(fp8, "  topk(max(max(q * a, cols), rows))\n")).is_none());
        // A one-value field broadcast over the dims is no row to multiply.
        let one = "page a[1, D] fp8\npage b[1, 1] fp8\n";
        let cache = |src: String| src.replace("b = min(K, rows)", "b = min(min(K, rows), cols)");
        let text = |index: &str| {
            cache(format!(
                "flow t \"test\"\n{one}cache:\n  a = max(K, rows)\n  b = min(K, rows)\nindex:\n{index}"
            ))
        };
        let broadcast =
            compile("t.flow", &text("  topk(max(sum(q * b, cols), rows))\n"), g).unwrap();
        assert!(super::super::lanes::plan(&broadcast).is_some() && form(&broadcast).is_none());
        let sums = compile("sums.flow", include_str!("../../tests/flows/sums.flow"), g).unwrap();
        assert_eq!(form(&sums).unwrap().sums.len(), 3);
        let mixed = "page a[1, D] bf16\npage b[1, D] fp8\n";
        assert!(form(&flow(mixed, "  topk(max(dot(q, a) + dot(q, b), rows))\n")).is_none());
        let wide_group = Geometry {
            heads_q: 32,
            heads_kv: 2,
            ..g
        };
        assert!(form(&load("block_topk", wide_group).unwrap()).is_none());
        // Two query heads a KV head: an fp8 dot product and several sums, not Quest's bound
        // alone or a bf16 dot product; one, none.
        let pair = Geometry { heads_q: 16, ..g };
        assert!(form(&load("block_topk_fp8", pair).unwrap()).is_some());
        assert!(
            form(
                &compile(
                    "sums.flow",
                    include_str!("../../tests/flows/sums.flow"),
                    pair
                )
                .unwrap()
            )
            .is_some()
        );
        assert!(form(&load("quest_fp8", pair).unwrap()).is_none());
        assert!(form(&load("block_topk", pair).unwrap()).is_none());
        let single = Geometry { heads_q: 8, ..g };
        assert!(form(&load("block_topk_fp8", single).unwrap()).is_none());
    }

    /// One fp8 field a page takes two tiles a step where its sums fit in shared memory beside
    /// the step values, one tile where only that fits, and no matrix form where neither does.
    #[test]
    fn the_sums_in_shared_memory_decide_the_tiles_a_step() {
        let g = Geometry {
            heads_q: 64,
            ..Geometry::default()
        };
        assert_eq!(
            form(&load("block_topk_fp8", g).unwrap())
                .unwrap()
                .step_tiles,
            2
        );
        assert_eq!(form(&load("quest_fp8", g).unwrap()).unwrap().step_tiles, 1);
        // Four sums of 8 heads, 16 pages a tile: 32 KiB a tile beside the top-k's and the
        // query's 13 KiB, and then a step value of 4 KiB (the query squared).
        let src = include_str!("../../tests/flows/crowded.flow");
        let crowded = compile("crowded.flow", src, g).unwrap();
        assert!(super::super::lanes::plan(&crowded).is_some() && form(&crowded).is_none());
        let without = src
            .replace("  w = q * q\n", "")
            .replace(" + max(max(w, cols), rows)", "");
        let four = compile("four.flow", &without, g).unwrap();
        assert_eq!(form(&four).unwrap().sums.len(), 4);
        assert_eq!(form(&four).unwrap().step_tiles, 1);
    }

    /// The query's sets stay in registers beside a step's fields where both fit, and give way
    /// to them where not: Quest's two fp8 fields at head_dim 256 take the lane's 64 words, so
    /// both of its sets go to shared memory, as none do at head_dim 128.
    #[test]
    fn the_query_sets_give_way_to_a_step_s_fields() {
        let at = |head_dim| Geometry {
            head_dim,
            ..Geometry::default()
        };
        let quest = |g| form(&load("quest_fp8", g).unwrap()).unwrap();
        assert_eq!(quest(at(128)).shared_sets, 0);
        let wide = quest(at(256));
        assert_eq!((wide.shared_sets, wide.step_tiles), (2, 1));
        assert!(wide.in_shared("qp") && wide.in_shared("qn"));
        let block = form(&load("block_topk_fp8", at(256)).unwrap()).unwrap();
        assert_eq!((block.shared_sets, block.step_tiles), (0, 1));
    }

    /// The loop keeps the lane form below the compute capability it needs, splits the query
    /// into positive and negative parts for Quest's bound, and combines the sums per page.
    #[test]
    fn the_matrix_loop_falls_back_to_the_lane_form() {
        let flow = load("quest_fp8", Geometry::default()).unwrap();
        let f = form(&flow).unwrap();
        let src = page_loop(&flow, &f, "LANES\n").unwrap();
        assert!(src.starts_with("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890"));
        assert!(src.contains("#else\nLANES\n#endif\n"));
        assert!(src.contains("unsigned int qp[") && src.contains("unsigned int qn["));
        assert!(!src.contains("unsigned int qw["));
        assert!(src.contains("mma_f16(d0[k], hi0.x, hi1.x"));
        assert!(src.contains("tk_key("));
        let block = load("block_topk", Geometry::default()).unwrap();
        let src = page_loop(&block, &form(&block).unwrap(), "").unwrap();
        assert!(src.contains("__CUDA_ARCH__ >= 800") && src.contains("mma_bf16(d0[k], a0.x"));
    }
}
