//! The flow compiler's CUDA code generator: a checked flow becomes one CUDA module with a
//! cache-phase kernel (one warp per page and KV head computes every field) and an
//! index-phase kernel (one block per sequence and KV head: the step values once in shared
//! memory, then each candidate page's score, the top-k in shared memory and the sparse page
//! table row, sinks and recent pages reserved as the CPU's selection does; where rows are few,
//! a cluster of blocks shares a row's scores, [`splits_rows`]).
//!
//! A flow whose index phase combines pages (softmax or reductions over `pages`) or keeps
//! per-request state makes one pass over the row's pages per stage instead (`passes`). The
//! built-in `h2o` has a hand-written kernel too ([`crate::h2o`]), which models use.

mod cache;
pub mod expr;
mod fold;
mod index;
mod lanes;
mod matrix;
mod passes;

use std::fmt::Write;

use vortex_flow::ir::{Axis, Flow, Graph, NodeId, Op, ReduceOp};
use vortex_kv::KvDtype;

use cache::cache_kernel;
pub use cache::pages_per_block as cache_pages_per_block;
use expr::{Leaves, PRELUDE, element};
use index::index_kernel;
pub use index::{splits_rows, stage_bytes, staging};
pub use passes::{needed as runs_in_passes, scratch_floats};

/// Page and state fields a generated kernel takes as parameters: a kernel's parameters hold
/// 4 KiB.
pub const MAX_FIELD_PARAMS: usize = 384;

/// Why a flow has no generated kernels.
pub fn unsupported(flow: &Flow) -> Option<String> {
    if flow.fields.len() + flow.states.len() > MAX_FIELD_PARAMS {
        return Some(format!(
            "more than {MAX_FIELD_PARAMS} page and state fields"
        ));
    }
    // The checker keeps page-combining operators out of the cache phase, which summarises
    // each page on its own.
    let cache = flow.cache.as_ref().map(|c| &c.graph);
    if let Some(n) = cache.and_then(|g| g.nodes.iter().find(|n| n.op.crosses_pages())) {
        return Some(format!("a cache phase with {} across pages", n.op.label()));
    }
    None
}

/// `, {ty}{prefix}0, {ty}{prefix}1, ...`: `n` kernel parameters, and the statements that mark
/// them used.
fn params(ty: &str, prefix: &str, n: usize) -> (String, String) {
    let list = (0..n).map(|i| format!(", {ty}{prefix}{i}")).collect();
    let used = (0..n).map(|i| format!(" (void){prefix}{i};")).collect();
    (list, used)
}

fn field_read(flow: &Flow, f: usize, base: &str, r: &str, c: &str) -> String {
    let spec = &flow.fields[f];
    let idx = format!("{base} * {} + ({r}) * {} + ({c})", spec.elems(), spec.cols);
    match spec.dtype {
        KvDtype::F32 => format!("((const float*)f{f})[{idx}]"),
        KvDtype::Fp8 => format!("vx_fp8(((const unsigned char*)f{f})[{idx}])"),
        KvDtype::F16 => format!("vx_f16(((const unsigned short*)f{f})[{idx}])"),
        KvDtype::Bf16 => format!("vx_bf16(((const unsigned short*)f{f})[{idx}])"),
    }
}

fn consts(flow: &Flow) -> String {
    let mut s = String::new();
    for (k, c) in flow.consts.iter().enumerate() {
        // Bit patterns: a constant's initialiser must be a constant expression. Global memory,
        // not the constant bank: the generated loops read a constant's columns across a warp's
        // lanes, which the constant cache would serve one address at a time.
        let vals: Vec<String> = c
            .data
            .iter()
            .map(|x| format!("0x{:08x}u", x.to_bits()))
            .collect();
        let _ = writeln!(
            s,
            "__device__ const unsigned int C{k}[{}] = {{{}}};",
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

/// Who computes a node's values: one thread all of them (into its own array), the block's
/// threads in turn (into shared memory), or a warp's lanes in turn (into the warp's part of it).
#[derive(Clone, Copy, PartialEq)]
enum By {
    Thread,
    Block,
    Lane,
}

/// A thread's products (`dot`, `matmul`) and reductions over rows or columns of at most this
/// many values keep one accumulator per value and run the inner loop outside: the accumulators
/// are independent chains, and an operand the values share (a page field of one row, read by
/// every query head) is read and widened once per step of the loop.
const SUMS_BY_THREAD: usize = 16;

/// Put before a per-page value a thread computes from the query or step values, where an
/// earlier one of the page read them too: it reads them from shared memory again. Without it the
/// compiler kept the earlier one's reads live for it (two reductions over three query heads at
/// head_dim 64 held 192 query values and spilled 1.3 KB a thread; the `reductions` test flow
/// 2.1 KB, 288 bytes with it).
const READ_SHARED_AGAIN: &str = "        asm volatile(\"\" ::: \"memory\");\n";

/// The declaration of the per-page value `id`'s array, a thread's own, after
/// [`READ_SHARED_AGAIN`] where the page's values before it (`read_before`) read block values
/// as it does; its statements follow on the same line.
fn per_page_array(g: &Graph, l: &dyn Leaves, id: NodeId, read_before: &mut bool) -> String {
    let reads = expr::reads_block_values(g, l, id);
    let fence = if reads && *read_before {
        READ_SHARED_AGAIN
    } else {
        ""
    };
    *read_before |= reads;
    format!(
        "{fence}        float n{id}[{}];\n        ",
        g.nodes[id].ty.elems()
    )
}

/// Statements computing node `id` into its array, element by element.
fn compute(flow: &Flow, g: &Graph, l: &dyn Leaves, id: NodeId, by: By) -> Result<String, String> {
    let n = &g.nodes[id];
    if by == By::Thread
        && let Some(s) = inner_loop_outside(g, l, id)?
    {
        return Ok(s);
    }
    let body = element(flow, g, l, id)?;
    let (from, step) = match by {
        By::Thread => ("0", "1"),
        By::Block => ("threadIdx.x", "TOPK_THREADS"),
        By::Lane => ("lane", "32"),
    };
    // A thread's small arrays stay in registers only when every index into them is a
    // constant: unroll the loop over their values.
    let unroll = by == By::Thread && expr::unrolled(g, id);
    Ok(format!(
        "{pragma}for (int el = {from}; el < {e}; el += {step}) {{ const int r = el / {c}, c = el % {c}; (void)r; (void)c; float v; {body} {arr}[el] = v; }}\n",
        pragma = if unroll { "_Pragma(\"unroll\") " } else { "" },
        e = n.ty.elems(),
        c = n.ty.cols,
        arr = l.array(id, n),
    ))
}

/// A small `dot`, `matmul` or reduction by one thread, as [`SUMS_BY_THREAD`] says; each value's
/// accumulator takes the inner dimension in order, as the element-wise loop does.
fn inner_loop_outside(g: &Graph, l: &dyn Leaves, id: NodeId) -> Result<Option<String>, String> {
    let n = &g.nodes[id];
    let e = n.ty.elems();
    if e > SUMS_BY_THREAD {
        return Ok(None);
    }
    let dims = |j: NodeId| (g.nodes[j].ty.rows, g.nodes[j].ty.cols);
    let at = |j: NodeId, r: &str, c: &str| expr::at(g, l, j, r, c);
    let (operands, len, op, x) = match n.op {
        Op::Dot(a, b) | Op::MatMul(a, b) => {
            let bv = match n.op {
                Op::Dot(..) => at(b, "c", "j")?,
                _ => at(b, "j", "c")?,
            };
            let x = format!("({}) * ({bv})", at(a, "r", "j")?);
            (vec![a, b], dims(a).1, ReduceOp::Sum, x)
        }
        Op::Reduce(op, Axis::Cols, a) => (vec![a], dims(a).1, op, at(a, "r", "j")?),
        Op::Reduce(op, Axis::Rows, a) => (vec![a], dims(a).0, op, at(a, "j", "c")?),
        _ => return Ok(None),
    };
    // The inner loop is unrolled in part where it reads leaves in memory only: a whole unrolled
    // loop over the query had it hoisted out of the page loop, into local memory. Words held in
    // registers and a computed node's array stay in registers only where every index into them
    // is a constant: the loop is unrolled whole, or left to the element-wise form where that
    // would be too long.
    let unroll = if operands
        .iter()
        .any(|&x| expr::reads_registers(g, l, x) || expr::reads_arrays(g, l, x))
    {
        if !expr::unrolled(g, id) {
            return Ok(None);
        }
        "unroll"
    } else {
        "unroll 8"
    };
    let (init, step, fin) = expr::reduction(op, "acc[el]", &x, len);
    let fin = if fin.is_empty() {
        String::new()
    } else {
        format!("_Pragma(\"unroll\") for (int el = 0; el < {e}; el++) {fin} ")
    };
    Ok(Some(format!(
        "{{ float acc[{e}]; _Pragma(\"unroll\") for (int el = 0; el < {e}; el++) acc[el] = {init}; \
         _Pragma(\"{unroll}\") for (int j = 0; j < {len}; j++) {{ _Pragma(\"unroll\") for (int el = 0; el < {e}; el++) {{ \
         const int r = el / {c}, c = el % {c}; (void)r; (void)c; {step} }} }} \
         {fin}_Pragma(\"unroll\") for (int el = 0; el < {e}; el++) {arr}[el] = acc[el]; }}\n",
        c = n.ty.cols,
        arr = l.array(id, n),
    )))
}

fn const_read(k: usize, r: &str, c: &str) -> String {
    format!("__uint_as_float(__ldg(C{k} + CONST_COLS_{k} * ({r}) + ({c})))")
}

fn const_defines(flow: &Flow) -> String {
    flow.consts
        .iter()
        .enumerate()
        .map(|(k, c)| format!("#define CONST_COLS_{k} {}\n", c.cols))
        .collect()
}

/// How `flow`'s generated index kernel scores a row's pages, in words (`vortex flow explain`).
pub fn index_form(flow: &Flow) -> String {
    if let Some(why) = unsupported(flow) {
        return format!("not generated: {why}");
    }
    if flow.index.is_none() {
        return "none, the latest pages before the recent window are kept".into();
    }
    if passes::needed(flow) {
        return "in passes, one over the row's pages per stage of the plan, a thread a page".into();
    }
    let Some(lanes) = lanes::plan(flow) else {
        return "a thread a page".into();
    };
    match matrix::plan(flow, &lanes) {
        Some(form) => form.describe(),
        None => lanes.describe(),
    }
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
    fn every_builtin_generates() {
        for (name, _) in BUILTIN {
            let flow = load(name, Geometry::default()).unwrap();
            let src = generate(&flow).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                src.contains("flow_cache") && src.contains("flow_index"),
                "{name}"
            );
            // Only h2o combines pages or keeps state.
            assert_eq!(src.contains("vx_block_fold"), name == "h2o", "{name}");
        }
    }

    /// Each page and state field is a kernel parameter, as many as the flow has, and f16
    /// fields read and store as halves.
    #[test]
    fn kernels_take_a_parameter_a_field() {
        let fields: String = (0..7)
            .map(|i| {
                format!(
                    "page f{i}x[1, 4] {}\n",
                    ["f16", "bf16", "f32", "fp8"][i % 4]
                )
            })
            .collect();
        let states: String = (0..6).map(|i| format!("state s{i}[1, 1]\n")).collect();
        let cache: String = (0..7)
            .map(|i| format!("  f{i}x = mean(slice(K, cols, 0, 4), rows)\n"))
            .collect();
        let saves: String = (0..6)
            .map(|i| format!("  save(s{i}, load(s{i}) + x)\n"))
            .collect();
        let text = format!(
            "flow many \"test\"\n{fields}{states}cache:\n{cache}index:\n  x = max(dot(slice(q, cols, 0, 4), f0x + f1x + f2x + f3x + f4x + f5x + f6x), rows)\n{saves}  topk(x)\n"
        );
        let flow = vortex_flow::compile("many.flow", &text, Geometry::default()).unwrap();
        assert_eq!(unsupported(&flow), None);
        let src = generate(&flow).unwrap();
        for p in ["void* f6)", "const void* f6,", "float* st5,"] {
            assert!(src.contains(p), "{p}");
        }
        assert!(!src.contains("f7") && !src.contains("st6"));
        assert!(src.contains("vx_to_f16(") && src.contains("vx_f16"));
    }
}
