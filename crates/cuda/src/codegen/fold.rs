//! A page-combining node (a reduction or a softmax over `pages`) in a generated index phase in
//! passes: each thread's part, declared before a pass ([`open`]) and updated for each of its
//! pages ([`update`]), then combined over the block into shared memory ([`close`]). A softmax's
//! part is its running maximum and the sum of exponentials after it, rescaled when the maximum
//! grows.

use vortex_flow::ir::{Graph, NodeId, Op, ReduceOp};

use super::expr::{Leaves, at};

/// The device code the parts are combined with.
pub(super) const BLOCK_FOLD: &str = "
// The block's sum (op 0), maximum (1) or minimum (2) of each thread's `x`, given to every thread.
__device__ __forceinline__ float vx_fold(int op, float a, float b) {
    return op == 0 ? a + b : (op == 1 ? fmaxf(a, b) : fminf(a, b));
}
__device__ float vx_block_fold(int op, float x) {
    __shared__ float part[TK_WARPS];
    for (int o = 16; o > 0; o >>= 1) x = vx_fold(op, x, __shfl_xor_sync(0xffffffffu, x, o));
    __syncthreads();  // the last call's parts are read
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = x;
    __syncthreads();
    x = part[0];
    for (int w = 1; w < TK_WARPS; w++) x = vx_fold(op, x, part[w]);
    return x;
}
";

/// `(init, fold op)` of a part of a reduction over pages.
fn part_of(op: ReduceOp) -> (&'static str, usize) {
    match op {
        ReduceOp::Sum | ReduceOp::Mean | ReduceOp::L2Norm => ("0.0f", 0),
        ReduceOp::Max => ("NEG_INF", 1),
        ReduceOp::Min => ("POS_INF", 2),
    }
}

/// A loop over the `elems` elements of a node with `r` and `c` in scope, unrolled when short
/// (the parts then stay in registers).
pub(super) fn each_elem(elems: usize, cols: usize, body: &str) -> String {
    let pragma = if elems <= 64 {
        "_Pragma(\"unroll\") "
    } else {
        ""
    };
    format!(
        "{pragma}for (int el = 0; el < {elems}; el++) {{ const int r = el / {cols}, c = el % {cols}; (void)r; (void)c; {body} }}\n"
    )
}

/// Elements of node `id`'s input: one part each.
fn parts(g: &Graph, id: NodeId) -> usize {
    g.nodes[g.nodes[id].op.inputs()[0]].ty.elems()
}

/// The thread's parts of node `id`, before the pass that folds its pages in.
pub(super) fn open(g: &Graph, id: NodeId) -> String {
    let e = parts(g, id);
    match g.nodes[id].op {
        Op::Reduce(op, _, _) => format!(
            "    float a{id}[{e}]; {}",
            each_elem(e, 1, &format!("a{id}[el] = {};", part_of(op).0))
        ),
        _ => format!(
            "    float a{id}[{e}], z{id}[{e}]; {}",
            each_elem(e, 1, &format!("a{id}[el] = NEG_INF; z{id}[el] = 0.0f;"))
        ),
    }
}

/// Folds the page's value of node `id`'s input into the thread's parts.
pub(super) fn update(g: &Graph, leaves: &dyn Leaves, id: NodeId) -> Result<String, String> {
    let x = g.nodes[id].op.inputs()[0];
    let xt = g.nodes[x].ty;
    let xe = at(g, leaves, x, "r", "c")?;
    let body = match g.nodes[id].op {
        Op::Reduce(ReduceOp::L2Norm, _, _) => {
            format!("const float t = {xe}; a{id}[el] += t * t;")
        }
        Op::Reduce(op, _, _) => {
            format!("a{id}[el] = vx_fold({}, a{id}[el], {xe});", part_of(op).1)
        }
        // Online: the running sum is rescaled when the maximum grows.
        _ => format!(
            "const float t = {xe}; \
             if (t > a{id}[el]) {{ z{id}[el] = z{id}[el] * expf(a{id}[el] - t) + 1.0f; a{id}[el] = t; }} \
             else z{id}[el] += expf(t - a{id}[el]);"
        ),
    };
    Ok(format!("        {}", each_elem(xt.elems(), xt.cols, &body)))
}

/// The block's parts of node `id` combined: a reduction into `s{id}`, a softmax's maximum and
/// sum into `sm{id}` and `sz{id}`. The caller synchronises before they are read.
pub(super) fn close(g: &Graph, id: NodeId) -> String {
    let n = &g.nodes[id];
    let body = match n.op {
        Op::Reduce(op, _, _) => {
            let fin = match op {
                ReduceOp::Mean => "__fdiv_rn(t, (float)complete)",
                ReduceOp::L2Norm => "__fsqrt_rn(t)",
                _ => "t",
            };
            format!(
                "const float t = vx_block_fold({}, a{id}[el]); if (threadIdx.x == 0) s{id}[el] = {fin};",
                part_of(op).1
            )
        }
        _ => format!(
            "const float m = vx_block_fold(1, a{id}[el]); \
             const float z = vx_block_fold(0, a{id}[el] == NEG_INF ? 0.0f : z{id}[el] * expf(a{id}[el] - m)); \
             if (threadIdx.x == 0) {{ sm{id}[el] = m; sz{id}[el] = z; }}"
        ),
    };
    format!("    {}", each_elem(parts(g, id), n.ty.cols, &body))
}
