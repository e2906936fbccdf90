//! The flow compiler's CUDA code generator: a checked flow becomes one CUDA module with a
//! cache-phase kernel (one thread per page and KV head computes every field) and an
//! index-phase kernel (one block per sequence and KV head: the step values once in shared
//! memory, then each candidate page's score, the top-k in shared memory and the sparse page
//! table row, sinks and recent pages reserved as the CPU's selection does).
//!
//! Flows with per-request state or operators across pages are not generated yet (the built-in
//! `h2o` runs the hand-written kernel of [`crate::h2o`]).

pub mod expr;

use std::fmt::Write;

use vortex_flow::ir::{Flow, Graph, Input, Node, NodeId, Op};
use vortex_kv::KvDtype;

use expr::{Leaves, PRELUDE, at, element, is_leaf};

/// Page fields a generated module passes (unused ones are null).
pub const MAX_FIELDS: usize = 4;
/// Shared memory the index kernel's step values may take.
const STEP_SHARED_BYTES: usize = 32 << 10;
/// A thread's arrays whose values take at most this many steps in all (values times inner
/// loop length) are computed with unrolled loops.
const UNROLL_WORK: usize = 1024;
/// Pages whose fields the index phase reads are staged from this many bytes each...
const MIN_STAGED_PAGE_BYTES: usize = 256;
/// ...to this many (a tile takes at least one page).
const MAX_STAGED_PAGE_BYTES: usize = 64 << 10;

/// Why a flow has no generated kernels.
pub fn unsupported(flow: &Flow) -> Option<String> {
    if !flow.states.is_empty() {
        return Some(format!(
            "flow '{}' keeps per-request state, which the GPU code generator does not handle yet",
            flow.name
        ));
    }
    if flow.fields.len() > MAX_FIELDS {
        return Some(format!("more than {MAX_FIELDS} page fields"));
    }
    if let Some(f) = flow
        .fields
        .iter()
        .find(|f| !matches!(f.dtype, KvDtype::Bf16 | KvDtype::F32))
    {
        return Some(format!(
            "page field '{}' of type {} (GPU fields are bf16 or f32)",
            f.name, f.dtype
        ));
    }
    let graphs = [
        flow.cache.as_ref().map(|c| &c.graph),
        flow.index.as_ref().map(|i| &i.graph),
    ];
    for g in graphs.into_iter().flatten() {
        if let Some(n) = g.nodes.iter().find(|n| n.op.crosses_pages()) {
            return Some(format!(
                "flow '{}' uses {} across pages, which the GPU code generator does not handle yet",
                flow.name,
                n.op.label()
            ));
        }
    }
    None
}

fn field_read(flow: &Flow, f: usize, base: &str, r: &str, c: &str) -> String {
    let spec = &flow.fields[f];
    let idx = format!("{base} * {} + ({r}) * {} + ({c})", spec.elems(), spec.cols);
    match spec.dtype {
        KvDtype::F32 => format!("((const float*)f{f})[{idx}]"),
        _ => format!("vx_bf16(((const unsigned short*)f{f})[{idx}])"),
    }
}

fn consts(flow: &Flow) -> String {
    let mut s = String::new();
    for (k, c) in flow.consts.iter().enumerate() {
        // Bit patterns: a constant's initialiser must be a constant expression.
        let vals: Vec<String> = c
            .data
            .iter()
            .map(|x| format!("0x{:08x}u", x.to_bits()))
            .collect();
        let _ = writeln!(
            s,
            "__constant__ unsigned int C{k}[{}] = {{{}}};",
            c.data.len().max(1),
            if vals.is_empty() {
                "0u".into()
            } else {
                vals.join(", ")
            }
        );
    }
    s
}

/// Who computes a node's values: one thread all of them (into its own array), or the block's
/// threads in turn (into shared memory).
#[derive(Clone, Copy, PartialEq)]
enum By {
    Thread,
    Block,
}

/// Statements computing node `id` into its array, element by element.
fn compute(flow: &Flow, g: &Graph, l: &dyn Leaves, id: NodeId, by: By) -> Result<String, String> {
    let n = &g.nodes[id];
    let body = element(flow, g, l, id)?;
    let (from, step) = match by {
        By::Thread => ("0", "1"),
        By::Block => ("threadIdx.x", "TOPK_THREADS"),
    };
    // A thread's small arrays stay in registers only when every index into them is a
    // constant: unroll the loop over their values.
    let unroll = by == By::Thread && n.ty.elems() * expr::inner_len(g, id) <= UNROLL_WORK;
    Ok(format!(
        "{pragma}for (int el = {from}; el < {e}; el += {step}) {{ const int r = el / {c}, c = el % {c}; (void)r; (void)c; float v; {body} {arr}[el] = v; }}\n",
        pragma = if unroll { "_Pragma(\"unroll\") " } else { "" },
        e = n.ty.elems(),
        c = n.ty.cols,
        arr = l.array(id, n),
    ))
}

struct CacheLeaves;

impl Leaves for CacheLeaves {
    fn leaf(&self, op: &Op, r: &str, c: &str) -> Option<String> {
        match op {
            Op::Input(Input::K) => Some(format!(
                "vx_bf16(kpool[kv_base + ({r}) * HEAD_DIM + ({c})])"
            )),
            Op::Input(Input::V) => Some(format!(
                "vx_bf16(vpool[kv_base + ({r}) * HEAD_DIM + ({c})])"
            )),
            Op::Const(k) => Some(const_read(*k, r, c)),
            _ => None,
        }
    }
    fn array(&self, id: NodeId, _: &Node) -> String {
        format!("n{id}")
    }
}

struct IndexLeaves<'a> {
    flow: &'a Flow,
    /// The fields read by the index phase are staged tile by tile in shared memory.
    staged: bool,
}

/// 32-bit words of one page's (and KV head's) value of field `f`, when it is a whole number.
fn field_words(flow: &Flow, f: usize) -> Option<usize> {
    let spec = &flow.fields[f];
    match spec.dtype {
        KvDtype::F32 => Some(spec.elems()),
        _ => spec.elems().is_multiple_of(2).then_some(spec.elems() / 2),
    }
}

/// A staged field's element `(r, c)` of the tile's page `slot`; pages are one word apart more
/// than their size, so that the lanes' pages fall in different banks.
fn staged_read(flow: &Flow, f: usize, r: &str, c: &str) -> String {
    let spec = &flow.fields[f];
    let words = field_words(flow, f).expect("staged fields have whole words");
    let idx = format!("({r}) * {} + ({c})", spec.cols);
    match spec.dtype {
        KvDtype::F32 => format!("__uint_as_float(stage{f}[slot * {} + {idx}])", words + 1),
        _ => format!(
            "vx_bf16(reinterpret_cast<const unsigned short*>(stage{f} + slot * {})[{idx}])",
            words + 1
        ),
    }
}

impl Leaves for IndexLeaves<'_> {
    fn leaf(&self, op: &Op, r: &str, c: &str) -> Option<String> {
        match op {
            Op::Input(Input::Q) => Some(format!("qg[({r}) * HEAD_DIM + ({c})]")),
            Op::Input(Input::Pos) => Some("((float)lp)".into()),
            Op::Input(Input::NPages) => Some("((float)complete)".into()),
            Op::Field(f) if self.staged => Some(staged_read(self.flow, *f, r, c)),
            Op::Field(f) => Some(field_read(self.flow, *f, "field_base", r, c)),
            Op::Const(k) => Some(const_read(*k, r, c)),
            _ => None,
        }
    }
    fn array(&self, id: NodeId, node: &Node) -> String {
        if node.ty.per_page {
            format!("n{id}")
        } else {
            format!("s{id}")
        }
    }
}

fn const_read(k: usize, r: &str, c: &str) -> String {
    format!("__uint_as_float(C{k}[CONST_COLS_{k} * ({r}) + ({c})])")
}

fn const_defines(flow: &Flow) -> String {
    flow.consts
        .iter()
        .enumerate()
        .map(|(k, c)| format!("#define CONST_COLS_{k} {}\n", c.cols))
        .collect()
}

fn cache_kernel(flow: &Flow) -> Result<String, String> {
    let mut s = String::from(
        "extern \"C\" __global__ void flow_cache(const unsigned short* __restrict__ kpool,
    const unsigned short* __restrict__ vpool, const unsigned int* __restrict__ pages, int n,
    int kv_heads, int num_pages, void* f0, void* f1, void* f2, void* f3) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int h = blockIdx.y;
    const unsigned int page = pages[i];
    const unsigned long long kv_base = ((unsigned long long)page * kv_heads + h) * PAGE_SIZE * HEAD_DIM;
    (void)kv_base; (void)vpool; (void)f0; (void)f1; (void)f2; (void)f3;
",
    );
    let Some(cache) = &flow.cache else {
        s.push_str("}\n");
        return Ok(s);
    };
    let g = &cache.graph;
    for (id, n) in g.nodes.iter().enumerate() {
        if is_leaf(&n.op) {
            continue;
        }
        let _ = writeln!(s, "    float n{id}[{}];", n.ty.elems());
        s.push_str("    ");
        s.push_str(&compute(flow, g, &CacheLeaves, id, By::Thread)?);
    }
    for &(f, id) in &cache.outputs {
        let spec = &flow.fields[f];
        let value = at(g, &CacheLeaves, id, "r", "c")?;
        let idx = format!(
            "((unsigned long long)h * num_pages + page) * {} + r * {} + c",
            spec.elems(),
            spec.cols
        );
        let store = match spec.dtype {
            KvDtype::F32 => format!("((float*)f{f})[{idx}] = {value};"),
            _ => format!("((unsigned short*)f{f})[{idx}] = vx_to_bf16({value});"),
        };
        let _ = writeln!(
            s,
            "    for (int r = 0; r < {}; r++) for (int c = 0; c < {}; c++) {store}",
            spec.rows, spec.cols
        );
    }
    s.push_str("}\n");
    Ok(s)
}

/// The fields the index phase reads, when it stages them in shared memory: `(field, words)`
/// for each, and the shared words a page takes (each field one word more than its size, and
/// the page's id). Small fields (LSH's 64-byte signature) read well enough in place; staging
/// pays from a few hundred bytes per page (measured: double_sparse's 512 bytes 1.5x faster,
/// LSH 15% slower staged).
pub fn staging(flow: &Flow) -> Option<(Vec<(usize, usize)>, usize)> {
    let g = &flow.index.as_ref()?.graph;
    let read: Vec<(usize, usize)> = (0..flow.fields.len())
        .filter(|&f| g.nodes.iter().any(|n| n.op == Op::Field(f)))
        .map(|f| field_words(flow, f).map(|w| (f, w)))
        .collect::<Option<_>>()?;
    let field_words: usize = read.iter().map(|&(_, w)| w + 1).sum();
    (MIN_STAGED_PAGE_BYTES..=MAX_STAGED_PAGE_BYTES)
        .contains(&(field_words * 4))
        .then_some((read, field_words + 1))
}

fn index_kernel(flow: &Flow) -> Result<String, String> {
    let mut s = String::from(
        "struct __align__(16) SelRow { int seq, head, pages, sinks; int recent, k, out, dense; };

// Dynamic shared memory: the row's keys, then (for a flow that stages its fields) a tile of
// `stage_pages` pages of them.
extern \"C\" __global__ void __launch_bounds__(TOPK_THREADS)
flow_index(const void* f0, const void* f1, const void* f2, const void* f3, int num_pages,
           const unsigned int* __restrict__ dense_indptr, const unsigned int* __restrict__ dense_indices,
           const unsigned int* __restrict__ last_len, const float* __restrict__ q,
           const SelRow* __restrict__ rows, int kv_heads, float tolerance, int stage_pages,
           unsigned int* __restrict__ out) {
    extern __shared__ unsigned int tk_keys[];
    __shared__ TopkShared tks;
    const SelRow row = rows[blockIdx.x];
    const unsigned int* logical = dense_indices + dense_indptr[row.seq];
    unsigned int* dst = out + row.out;
    for (int j = threadIdx.x; j < row.sinks; j += TOPK_THREADS) dst[j] = logical[j];
    for (int j = threadIdx.x; j < row.recent; j += TOPK_THREADS)
        dst[row.sinks + row.k + j] = logical[row.pages - row.recent + j];
    if (row.k <= 0) return;
    const int n = row.pages - row.sinks - row.recent;
    (void)f0; (void)f1; (void)f2; (void)f3; (void)q; (void)last_len; (void)num_pages;
    (void)stage_pages;
",
    );
    let Some(index) = &flow.index else {
        // No index phase: pages rank by recency, the latest before the recent window kept.
        s.push_str(
            "    for (int j = threadIdx.x; j < row.k; j += TOPK_THREADS) dst[row.sinks + j] = logical[row.sinks + n - row.k + j];
    (void)tolerance; (void)kv_heads;
}
",
        );
        return Ok(s);
    };
    s.push_str(
        "    const int complete = row.pages - (last_len[row.seq] < PAGE_SIZE ? 1 : 0);
    (void)complete;
    const float* qg = q + ((unsigned long long)row.seq * kv_heads + row.head) * GROUP * HEAD_DIM;
    (void)qg;
",
    );
    let g = &index.graph;
    let step_bytes: usize = g
        .nodes
        .iter()
        .filter(|n| !is_leaf(&n.op) && !n.ty.per_page)
        .map(|n| n.ty.elems() * 4)
        .sum();
    if step_bytes > STEP_SHARED_BYTES {
        return Err(format!(
            "its step values take {step_bytes} bytes of shared memory (at most {STEP_SHARED_BYTES})"
        ));
    }
    // Fields the index phase reads are copied tile by tile into shared memory with coalesced
    // loads, then each thread scores its page from there.
    let staged = staging(flow);
    let leaves = IndexLeaves {
        flow,
        staged: staged.is_some(),
    };
    for (id, n) in g.nodes.iter().enumerate() {
        if is_leaf(&n.op) || n.ty.per_page {
            continue;
        }
        let _ = writeln!(s, "    __shared__ float s{id}[{}];", n.ty.elems());
        s.push_str("    ");
        s.push_str(&compute(flow, g, &leaves, id, By::Block)?);
        s.push_str("    __syncthreads();\n");
    }
    if let Some((read, _)) = &staged {
        s.push_str("    unsigned int* stage_base = tk_keys + ((n + 3) & ~3);\n");
        let mut offset = 0;
        for &(f, words) in read {
            let _ = writeln!(
                s,
                "    unsigned int* stage{f} = stage_base + {offset} * stage_pages;"
            );
            offset += words + 1;
        }
        // The tile's page ids first, so that no field load waits on a page-id load; fields of
        // whole 16-byte vectors load 16 bytes at a time.
        let _ = writeln!(
            s,
            "    unsigned int* stage_ids = stage_base + {offset} * stage_pages;
    for (int t0 = 0; t0 < n; t0 += stage_pages) {{
        const int cnt = min(stage_pages, n - t0);
        __syncthreads();
        for (int p = threadIdx.x; p < cnt; p += TOPK_THREADS) stage_ids[p] = logical[row.sinks + t0 + p];
        __syncthreads();"
        );
        for &(f, words) in read {
            let (vec, load) = if words.is_multiple_of(4) {
                (
                    words / 4,
                    "const uint4 v = reinterpret_cast<const uint4*>(f",
                )
            } else {
                (
                    words,
                    "const unsigned int v = reinterpret_cast<const unsigned int*>(f",
                )
            };
            let store = if words.is_multiple_of(4) {
                "d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;"
            } else {
                "d[0] = v;"
            };
            let per = words / vec;
            let _ = writeln!(
                s,
                "#pragma unroll 4
        for (int w = threadIdx.x; w < cnt * {vec}; w += TOPK_THREADS) {{
            const int pg = w / {vec}, o = w % {vec};
            {load}{f})[((unsigned long long)row.head * num_pages + stage_ids[pg]) * {vec} + o];
            unsigned int* d = stage{f} + pg * {} + {per} * o;
            {store}
        }}",
                words + 1
            );
        }
        s.push_str(
            "        __syncthreads();
    for (int i = t0 + threadIdx.x; i < t0 + cnt; i += TOPK_THREADS) {
        const int slot = i - t0;
        const int lp = row.sinks + i;
        (void)slot; (void)lp;
",
        );
    } else {
        s.push_str(
            "    for (int i = threadIdx.x; i < n; i += TOPK_THREADS) {
        const int lp = row.sinks + i;
        const unsigned long long field_base = (unsigned long long)row.head * num_pages + logical[lp];
        (void)lp; (void)field_base;
",
        );
    }
    for (id, n) in g.nodes.iter().enumerate() {
        if is_leaf(&n.op) || !n.ty.per_page {
            continue;
        }
        let _ = writeln!(s, "        float n{id}[{}];", n.ty.elems());
        s.push_str("        ");
        s.push_str(&compute(flow, g, &leaves, id, By::Thread)?);
    }
    let score = at(g, &leaves, index.score, "0", "0")?;
    let _ = writeln!(s, "        tk_keys[i] = tk_key({score});\n    }}");
    if staged.is_some() {
        s.push_str("    }\n");
    }
    s.push_str(
        "    __syncthreads();
    int required = row.k;
    if (tolerance > 0.f) required = min(row.k, (int)ceil((1.0 - (double)tolerance) * row.k));
    tk_select(tks, tk_keys, n, row.k, required,
              [&](int pos, int i) { dst[row.sinks + pos] = logical[row.sinks + i]; });
}
",
    );
    Ok(s)
}

/// The CUDA source of `flow`'s kernels (without the top-k device code and the geometry
/// defines, which the caller puts in front).
pub fn generate(flow: &Flow) -> Result<String, String> {
    if let Some(why) = unsupported(flow) {
        return Err(why);
    }
    let mut s = format!("// Generated from flow '{}'.\n", flow.name);
    s.push_str(PRELUDE);
    s.push_str(&const_defines(flow));
    s.push_str(&consts(flow));
    s.push_str(&cache_kernel(flow).map_err(|e| format!("cache phase: {e}"))?);
    s.push_str(&index_kernel(flow).map_err(|e| format!("index phase: {e}"))?);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vortex_flow::Geometry;
    use vortex_flow::library::{BUILTIN, load};

    #[test]
    fn every_builtin_without_state_generates() {
        for (name, _) in BUILTIN {
            let flow = load(name, Geometry::default()).unwrap();
            match generate(&flow) {
                Ok(src) => {
                    assert!(
                        src.contains("flow_cache") && src.contains("flow_index"),
                        "{name}"
                    );
                }
                Err(e) => assert!(name == "h2o", "{name}: {e}"),
            }
        }
    }
}
