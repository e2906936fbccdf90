//! CUDA C for one node of a flow graph: the expression of element `(r, c)` of its value.
//!
//! Leaves (K, V, q, page fields, constants, positions, scalars) are read where they live;
//! computed nodes are arrays, in registers or local memory for per-page values and in shared
//! memory for step values. A value of one row or column broadcasts along it, as on the CPU.

use vortex_flow::ir::{Axis, BinaryOp, Flow, Graph, Input, Node, NodeId, Op, ReduceOp, UnaryOp};

/// Where the kernel being generated finds the phase's leaves and computed values.
pub trait Leaves {
    /// Element `(r, c)` of a leaf node, or `None` when the phase cannot read it.
    fn leaf(&self, op: &Op, r: &str, c: &str) -> Option<String>;
    /// The array holding computed node `id`.
    fn array(&self, id: NodeId, node: &Node) -> String;
    /// Whether a leaf is read from the thread's registers (constant indices only).
    fn in_registers(&self, _op: &Op) -> bool {
        false
    }
    /// Whether computed node `id` is no array of its own: its consumer reads its element
    /// expression in place ([`inlinable`]).
    fn inlined(&self, _id: NodeId) -> bool {
        false
    }
    /// Whether the maximum (or minimum) of two products by one query value is read as that
    /// value times the larger or the smaller factor by its sign ([`by_sign`]): worth it where
    /// the query sits in registers, so that its sign is at hand, and its rows share the
    /// factors' comparison.
    fn products_by_sign(&self) -> bool {
        false
    }
}

/// A thread's arrays whose values take at most this many steps in all (values times inner
/// loop length) are computed with unrolled loops.
pub const UNROLL_WORK: usize = 1024;

/// Which nodes of `g` may be read in place by their one consumer instead of kept in an array of
/// their own: element-wise per-page nodes whose one consumer reads each of their elements once
/// in the same page loop (an element-wise node of the same shape, not one that broadcasts
/// them, or a reduction over rows or columns). An array of GROUP x
/// HEAD_DIM per thread would otherwise stay in local memory (Quest's score: two products and
/// their maximum before the sum). A node reading a value held in registers is read in place
/// only by a consumer whose loops are unrolled whole ([`unrolled`]): a loop that is not would
/// index the registers with a variable.
pub fn inlinable(g: &Graph, in_registers: &dyn Fn(&Op) -> bool) -> Vec<bool> {
    let mut consumers = vec![Vec::new(); g.nodes.len()];
    for (id, n) in g.nodes.iter().enumerate() {
        for i in n.op.inputs() {
            consumers[i].push(id);
        }
    }
    let elementwise = |op: &Op| matches!(op, Op::Unary(..) | Op::Binary(..) | Op::Where(..));
    let mut reads_registers = vec![false; g.nodes.len()];
    for (id, n) in g.nodes.iter().enumerate() {
        reads_registers[id] =
            in_registers(&n.op) || n.op.inputs().iter().any(|&i| reads_registers[i]);
    }
    g.nodes
        .iter()
        .enumerate()
        .map(|(id, n)| {
            let [user] = consumers[id][..] else {
                return false;
            };
            let u = &g.nodes[user];
            let same_shape = (n.ty.rows, n.ty.cols) == (u.ty.rows, u.ty.cols);
            n.ty.per_page
                && u.ty.per_page
                && elementwise(&n.op)
                && (!reads_registers[id] || unrolled(g, user))
                && ((elementwise(&u.op) && same_shape)
                    || matches!(u.op, Op::Reduce(_, Axis::Rows | Axis::Cols, _)))
        })
        .collect()
}

/// Whether a thread computes node `id` with its loops unrolled whole, so that every index into
/// its operands is a constant: the loop over its values (`UNROLL_WORK`) and, where its
/// operand reads registers, the inner loop of a reduction.
pub fn unrolled(g: &Graph, id: NodeId) -> bool {
    g.nodes[id].ty.elems() * inner_len(g, id) <= UNROLL_WORK
}

/// Whether element expressions of node `id` read a value held in registers: the node is such a
/// leaf, or is read in place and one of its inputs does.
pub fn reads_registers(g: &Graph, leaves: &dyn Leaves, id: NodeId) -> bool {
    let op = &g.nodes[id].op;
    leaves.in_registers(op)
        || (leaves.inlined(id) && op.inputs().iter().any(|&i| reads_registers(g, leaves, i)))
}

/// Whether element expressions of node `id` read a computed node's array: it is one, or is read
/// in place and one of its inputs does.
pub fn reads_arrays(g: &Graph, leaves: &dyn Leaves, id: NodeId) -> bool {
    let op = &g.nodes[id].op;
    !is_leaf(op) && (!leaves.inlined(id) || op.inputs().iter().any(|&i| reads_arrays(g, leaves, i)))
}

/// Whether element expressions of node `id` read the query or a step value of more than
/// `BLOCK_VALUES_READ_AGAIN` values (block values, in shared memory): one of its inputs is one,
/// or is read in place and reads one.
pub fn reads_block_values(g: &Graph, leaves: &dyn Leaves, id: NodeId) -> bool {
    g.nodes[id].op.inputs().iter().any(|&i| {
        let n = &g.nodes[i];
        n.op == Op::Input(Input::Q)
            || (!is_leaf(&n.op) && !n.ty.per_page && n.ty.elems() > BLOCK_VALUES_READ_AGAIN)
            || (leaves.inlined(i) && reads_block_values(g, leaves, i))
    })
}

/// Step values of at most this many values a thread may keep in registers for all of a page's
/// values that read them.
const BLOCK_VALUES_READ_AGAIN: usize = 16;

/// The pragma unrolling node `id`'s inner loop in the element-wise form where one of its
/// `operands` reads registers: constant indices keep them there (the loop over its values is
/// unrolled too: `inlinable` reads such a node in place only where `unrolled` holds).
fn held_unroll(g: &Graph, leaves: &dyn Leaves, id: NodeId, operands: &[NodeId]) -> &'static str {
    let held = operands.iter().any(|&x| reads_registers(g, leaves, x));
    if held && unrolled(g, id) {
        "_Pragma(\"unroll\") "
    } else {
        ""
    }
}

/// An exact float literal.
pub fn lit(x: f32) -> String {
    if x.is_finite() && x == x.trunc() && x.abs() < 1e7 {
        format!("{x:.1}f")
    } else {
        format!("__int_as_float(0x{:08x})", x.to_bits())
    }
}

/// The expression of element `(r, c)` of node `id` (broadcast where it has one row or column).
pub fn at(g: &Graph, leaves: &dyn Leaves, id: NodeId, r: &str, c: &str) -> Result<String, String> {
    let n = &g.nodes[id];
    let r = if n.ty.rows == 1 { "0" } else { r };
    let c = if n.ty.cols == 1 { "0" } else { c };
    if let Some((helper, [q, a, b])) = by_sign(g, leaves, id) {
        return Ok(format!(
            "{helper}({}, {}, {})",
            at(g, leaves, q, r, c)?,
            at(g, leaves, a, r, c)?,
            at(g, leaves, b, r, c)?
        ));
    }
    match &n.op {
        Op::Input(_) | Op::Field(_) | Op::LoadState(_) | Op::Const(_) => leaves
            .leaf(&n.op, r, c)
            .ok_or_else(|| format!("{} cannot be read here", n.op.label())),
        Op::Scalar(x) => Ok(lit(*x)),
        Op::Unary(u, a) if leaves.inlined(id) => Ok(unary(*u, &at(g, leaves, *a, r, c)?)),
        Op::Binary(b, x, y) if leaves.inlined(id) => Ok(binary(
            *b,
            &at(g, leaves, *x, r, c)?,
            &at(g, leaves, *y, r, c)?,
        )),
        Op::Where(k, x, y) if leaves.inlined(id) => Ok(format!(
            "(({}) != 0.0f ? ({}) : ({}))",
            at(g, leaves, *k, r, c)?,
            at(g, leaves, *x, r, c)?,
            at(g, leaves, *y, r, c)?
        )),
        _ => Ok(format!(
            "{}[({r}) * {} + ({c})]",
            leaves.array(id, n),
            n.ty.cols
        )),
    }
}

/// Node `id` as `max(q * a, q * b)` or `min(q * a, q * b)` for the query `q`, both products read
/// in place, where `leaves` reads such values by the query's sign: the helper computing it
/// (`vx_max_products` or `vx_min_products`) and `[q, a, b]`. Rounding keeps products by one
/// factor in the order of the other factors, so `max(q * a, q * b)` is `q * max(a, b)` for
/// `q >= 0` and `q * min(a, b)` for `q < 0`, NaN factors skipped as `fmaxf` skips them; only a
/// zero or infinite query value times an infinite or zero factor can differ (NaN against the
/// other product).
pub fn by_sign(g: &Graph, leaves: &dyn Leaves, id: NodeId) -> Option<(&'static str, [NodeId; 3])> {
    let helper = match g.nodes[id].op {
        Op::Binary(BinaryOp::Max, ..) => "vx_max_products",
        Op::Binary(BinaryOp::Min, ..) => "vx_min_products",
        _ => return None,
    };
    let Op::Binary(_, x, y) = g.nodes[id].op else {
        return None;
    };
    let product = |p: NodeId| match g.nodes[p].op {
        Op::Binary(BinaryOp::Mul, u, v) if leaves.inlined(p) => Some([u, v]),
        _ => None,
    };
    if !(leaves.products_by_sign() && leaves.inlined(id)) {
        return None;
    }
    let (px, py) = (product(x)?, product(y)?);
    let is_query = |j: NodeId| g.nodes[j].op == Op::Input(Input::Q);
    let q = px.into_iter().find(|&j| is_query(j) && py.contains(&j))?;
    let other = |p: [NodeId; 2]| if p[0] == q { p[1] } else { p[0] };
    Some((helper, [q, other(px), other(py)]))
}

/// Whether a node is a leaf read in place (no array of its own).
pub fn is_leaf(op: &Op) -> bool {
    matches!(
        op,
        Op::Input(_) | Op::Field(_) | Op::LoadState(_) | Op::Const(_) | Op::Scalar(_)
    )
}

fn unary(op: UnaryOp, x: &str) -> String {
    match op {
        UnaryOp::Neg => format!("(-({x}))"),
        UnaryOp::Abs => format!("fabsf({x})"),
        UnaryOp::Exp => format!("expf({x})"),
        UnaryOp::Log => format!("logf({x})"),
        UnaryOp::Sqrt => format!("__fsqrt_rn({x})"),
        UnaryOp::Relu => format!("fmaxf({x}, 0.0f)"),
        UnaryOp::Sigmoid => format!("(1.0f / (1.0f + expf(-({x}))))"),
        UnaryOp::Silu => format!("vx_silu({x})"),
        UnaryOp::Sign => format!("vx_sign({x})"),
        UnaryOp::Floor => format!("floorf({x})"),
    }
}

fn binary(op: BinaryOp, a: &str, b: &str) -> String {
    let flag = |cmp: &str| format!("((({a}) {cmp} ({b})) ? 1.0f : 0.0f)");
    match op {
        BinaryOp::Add => format!("(({a}) + ({b}))"),
        BinaryOp::Sub => format!("(({a}) - ({b}))"),
        BinaryOp::Mul => format!("(({a}) * ({b}))"),
        BinaryOp::Div => format!("__fdiv_rn({a}, {b})"),
        BinaryOp::Max => format!("fmaxf({a}, {b})"),
        BinaryOp::Min => format!("fminf({a}, {b})"),
        BinaryOp::Gt => flag(">"),
        BinaryOp::Ge => flag(">="),
        BinaryOp::Lt => flag("<"),
        BinaryOp::Le => flag("<="),
        BinaryOp::Eq => flag("=="),
        BinaryOp::Ne => flag("!="),
        BinaryOp::Mod => format!("vx_mod({a}, {b})"),
    }
}

/// Multiply-adds (or their like) one element of node `id` takes: the length of its inner loop.
pub fn inner_len(g: &Graph, id: NodeId) -> usize {
    let dims = |j: NodeId| (g.nodes[j].ty.rows, g.nodes[j].ty.cols);
    match g.nodes[id].op {
        Op::Reduce(_, Axis::Rows, a) | Op::Softmax(Axis::Rows, a) => dims(a).0,
        Op::Reduce(_, _, a) | Op::Softmax(_, a) | Op::Dot(a, _) => dims(a).1,
        Op::MatMul(a, _) => dims(a).1,
        _ => 1,
    }
}

/// A reduction `op` of `len` terms `x` into `acc`: its initial value, the statement adding a
/// term, and the statement that finishes it.
pub fn reduction(op: ReduceOp, acc: &str, x: &str, len: usize) -> (&'static str, String, String) {
    match op {
        ReduceOp::Sum => ("0.0f", format!("{acc} += {x};"), String::new()),
        ReduceOp::Mean => (
            "0.0f",
            format!("{acc} += {x};"),
            format!("{acc} = __fdiv_rn({acc}, {});", lit(len as f32)),
        ),
        ReduceOp::Max => (
            "NEG_INF",
            format!("{acc} = fmaxf({acc}, {x});"),
            String::new(),
        ),
        ReduceOp::Min => (
            "POS_INF",
            format!("{acc} = fminf({acc}, {x});"),
            String::new(),
        ),
        ReduceOp::L2Norm => (
            "0.0f",
            format!("{{ const float t = {x}; {acc} += t * t; }}"),
            format!("{acc} = __fsqrt_rn({acc});"),
        ),
    }
}

/// Statements that set `v` to element `(r, c)` of node `id` (the variables `r` and `c` are in
/// scope). `consts` are the flow's constant tensors (indices for `keep`).
pub fn element(flow: &Flow, g: &Graph, leaves: &dyn Leaves, id: NodeId) -> Result<String, String> {
    let n: &Node = &g.nodes[id];
    let a_at = |j: NodeId, r: &str, c: &str| at(g, leaves, j, r, c);
    let dims = |j: NodeId| (g.nodes[j].ty.rows, g.nodes[j].ty.cols);
    Ok(match n.op {
        Op::Unary(u, a) => format!("v = {};", unary(u, &a_at(a, "r", "c")?)),
        Op::Binary(b, x, y) => format!(
            "v = {};",
            binary(b, &a_at(x, "r", "c")?, &a_at(y, "r", "c")?)
        ),
        Op::Where(k, x, y) => format!(
            "v = ({}) != 0.0f ? ({}) : ({});",
            a_at(k, "r", "c")?,
            a_at(x, "r", "c")?,
            a_at(y, "r", "c")?
        ),
        Op::Reduce(op, axis, a) => {
            let (rows, cols) = dims(a);
            let (len, x) = match axis {
                Axis::Rows => (rows, a_at(a, "j", "c")?),
                Axis::Cols => (cols, a_at(a, "r", "j")?),
                Axis::Pages => return Err("a reduction over pages".into()),
            };
            let (init, step, fin) = reduction(op, "v", &x, len);
            let pragma = held_unroll(g, leaves, id, &[a]);
            format!("v = {init}; {pragma}for (int j = 0; j < {len}; j++) {step} {fin}")
        }
        Op::Softmax(axis, a) => {
            let (rows, cols) = dims(a);
            let (len, xj, x) = match axis {
                Axis::Rows => (rows, a_at(a, "j", "c")?, a_at(a, "r", "c")?),
                Axis::Cols => (cols, a_at(a, "r", "j")?, a_at(a, "r", "c")?),
                Axis::Pages => return Err("a softmax over pages".into()),
            };
            format!(
                "{{ float m = NEG_INF, s = 0.0f; for (int j = 0; j < {len}; j++) m = fmaxf(m, {xj}); \
                 for (int j = 0; j < {len}; j++) s += expf(({xj}) - m); v = expf(({x}) - m) / s; }}"
            )
        }
        Op::Dot(a, b) | Op::MatMul(a, b) => {
            let k = dims(a).1;
            let bv = match n.op {
                Op::Dot(..) => a_at(b, "c", "j")?,
                _ => a_at(b, "j", "c")?,
            };
            let pragma = held_unroll(g, leaves, id, &[a, b]);
            format!(
                "v = 0.0f; {pragma}for (int j = 0; j < {k}; j++) v += ({}) * ({bv});",
                a_at(a, "r", "j")?,
            )
        }
        Op::Transpose(a) => format!("v = {};", a_at(a, "c", "r")?),
        Op::Reshape(a) => {
            let ac = dims(a).1;
            let cols = n.ty.cols;
            format!(
                "{{ const int e = r * {cols} + c; v = {}; }}",
                a_at(a, &format!("e / {ac}"), &format!("e % {ac}"))?
            )
        }
        Op::KeepCols(a, k) => {
            let picks = &flow.consts[k].data;
            let list: Vec<String> = picks.iter().map(|&x| (x as usize).to_string()).collect();
            format!(
                "{{ const int pick[{}] = {{{}}}; v = {}; }}",
                list.len(),
                list.join(", "),
                a_at(a, "r", "pick[c]")?
            )
        }
        Op::Slice(a, axis, start, _) => match axis {
            Axis::Rows => format!("v = {};", a_at(a, &format!("r + {start}"), "c")?),
            Axis::Cols => format!("v = {};", a_at(a, "r", &format!("c + {start}"))?),
            Axis::Pages => return Err("a slice over pages".into()),
        },
        Op::Input(_) | Op::Field(_) | Op::LoadState(_) | Op::Const(_) | Op::Scalar(_) => {
            format!("v = {};", a_at(id, "r", "c")?)
        }
    })
}

/// Device helpers the generated expressions use. Modules compile with fast math, whose division
/// and square root are approximate: a flow's own `/`, `mod` and `sqrt` round as the CPU's do, so
/// that `floor` and comparisons of their results take the same side.
pub const PRELUDE: &str = r#"
#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)
__device__ __forceinline__ float vx_bf16(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ float vx_bf16_of(unsigned int w, int high) { return __uint_as_float(high ? w & 0xffff0000u : w << 16); }
__device__ __forceinline__ unsigned short vx_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
__device__ __forceinline__ float vx_f16(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ float vx_f16_of(unsigned int w, int high) { return vx_f16((unsigned short)(high ? w >> 16 : w & 0xffffu)); }
// Value `i` (0 or 1) of the e4m3 pair in the low 16 bits of `p` -> f32 (0x7f and 0xff are NaN):
// from compute capability 8.9 the hardware widens the pair to f16 (exact) at once, so reads of
// both values (constant `i`) share one conversion, against kv_fp8_to_f32's dozen instructions
// and branch a value.
__device__ __forceinline__ float vx_fp8_of_pair(unsigned int p, int i) {
#if __CUDA_ARCH__ >= 890
    unsigned int h;
    asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;}" : "=r"(h) : "r"(p));
    return vx_f16_of(h, i);
#else
    return kv_fp8_to_f32(i ? (p >> 8) & 0xffu : p & 0xffu);
#endif
}
// An e4m3 byte -> f32.
__device__ __forceinline__ float vx_fp8(unsigned int b) { return vx_fp8_of_pair(b, 0); }
// Finite values past the largest half store as it (the CPU's f16 fields saturate).
__device__ __forceinline__ unsigned short vx_to_f16(float f) {
    if ((__float_as_uint(f) & 0x7f800000u) != 0x7f800000u) f = fminf(fmaxf(f, -65504.0f), 65504.0f);
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// A word copied from global to shared memory, asynchronously from compute capability 8.0: it
// lands by the vx_copies_wait_one after the next vx_copies_commit but one.
__device__ __forceinline__ void vx_copy_word(unsigned int* dst, const unsigned int* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"((unsigned int)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
#else
    *dst = __ldg(src);
#endif
}
__device__ __forceinline__ void vx_copies_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void vx_copies_wait_one() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}
// q times `pos` where q >= 0 (its sign bit clear) and times `neg` where it is set: one select of
// bits, no comparison.
__device__ __forceinline__ float vx_by_sign(float q, float pos, float neg) {
    const unsigned int m = (unsigned int)((int)__float_as_uint(q) >> 31);
    return q * __uint_as_float((__float_as_uint(pos) & ~m) | (__float_as_uint(neg) & m));
}
// max(q * a, q * b) and min(q * a, q * b) with one product (see by_sign in the generator).
__device__ __forceinline__ float vx_max_products(float q, float a, float b) { return vx_by_sign(q, fmaxf(a, b), fminf(a, b)); }
__device__ __forceinline__ float vx_min_products(float q, float a, float b) { return vx_by_sign(q, fminf(a, b), fmaxf(a, b)); }
__device__ __forceinline__ float vx_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float vx_sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }
__device__ __forceinline__ float vx_mod(float a, float b) { return a - b * floorf(__fdiv_rn(a, b)); }
"#;
