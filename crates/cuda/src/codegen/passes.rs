//! The index phase of a flow that combines pages (a softmax or a reduction over `pages`) or
//! keeps per-request state: one block per row makes a pass over the row's complete pages for
//! each stage of the flow's plan ([`vortex_flow::plan`]), as the CPU runner does.
//!
//! A pass recomputes from the page's fields the per-page values it needs, rather than keeping
//! any for every page, and folds each thread's pages into its part of the next stage's
//! page-combining nodes; the block then reduces the parts into shared memory (a softmax over
//! pages keeps its maximum and the sum of exponentials after it, merged online). The last pass
//! saves the state of every complete page and writes the candidates' keys for the top-k.

use std::collections::BTreeSet;
use std::fmt::Write;

use vortex_flow::ir::{Axis, Flow, Graph, IndexPhase, NodeId, Op, ReduceOp};
use vortex_flow::plan::Plan;

use super::expr::{at, is_leaf};
use super::index::{
    HEADER, IndexLeaves, STEP_SHARED_BYTES, held, held_load, stage_decls, stage_tiles, staging,
};
use super::{By, compute};

/// Whether `flow`'s index phase runs in passes: it combines pages or keeps state.
pub fn needed(flow: &Flow) -> bool {
    flow.index.as_ref().is_some_and(|ix| {
        !flow.states.is_empty() || ix.graph.nodes.iter().any(|n| n.op.crosses_pages())
    })
}

/// The block-wide fold each pass's parts go through.
const BLOCK_FOLD: &str = "
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

/// Computed nodes a pass needs to evaluate `targets` per page, in graph order, and the fields
/// it reads. A softmax over pages is evaluated in the pass from its input and the block's
/// maximum and sum; values the same for every page are already in shared memory.
fn pass_nodes(g: &Graph, targets: &[NodeId]) -> (Vec<NodeId>, BTreeSet<usize>) {
    let (mut seen, mut fields) = (BTreeSet::new(), BTreeSet::new());
    let mut todo: Vec<NodeId> = targets.to_vec();
    while let Some(id) = todo.pop() {
        let n = &g.nodes[id];
        if let Op::Field(f) = n.op {
            fields.insert(f);
        }
        if is_leaf(&n.op) || !n.ty.per_page || !seen.insert(id) {
            continue;
        }
        todo.extend(n.op.inputs());
    }
    (seen.into_iter().collect(), fields)
}

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
fn each_elem(elems: usize, cols: usize, body: &str) -> String {
    let pragma = if elems <= 64 {
        "_Pragma(\"unroll\") "
    } else {
        ""
    };
    format!(
        "{pragma}for (int el = 0; el < {elems}; el++) {{ const int r = el / {cols}, c = el % {cols}; (void)r; (void)c; {body} }}\n"
    )
}

pub(super) fn index_kernel(flow: &Flow, index: &IndexPhase) -> Result<String, String> {
    let g = &index.graph;
    let mut outputs: Vec<NodeId> = index.saves.iter().map(|&(_, id)| id).collect();
    outputs.push(index.score);
    let plan = Plan::new(g, &outputs);
    let last = plan.stages.len() - 1;
    if let Some(n) = g
        .nodes
        .iter()
        .find(|n| n.op.crosses_pages() && !g.nodes[n.op.inputs()[0]].ty.per_page)
    {
        return Err(format!(
            "{} of a value the same for every page",
            n.op.label()
        ));
    }
    let softmaxes: Vec<NodeId> = (0..g.nodes.len())
        .filter(|&i| matches!(g.nodes[i].op, Op::Softmax(Axis::Pages, _)))
        .collect();
    let step_bytes: usize = g
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| !is_leaf(&n.op) && !n.ty.per_page)
        .map(|(_, n)| n.ty.elems() * 4)
        .chain(softmaxes.iter().map(|&i| g.nodes[i].ty.elems() * 8))
        .sum();
    if step_bytes > STEP_SHARED_BYTES {
        return Err(format!(
            "its step values take {step_bytes} bytes of shared memory (at most {STEP_SHARED_BYTES})"
        ));
    }

    let mut s = String::from(BLOCK_FOLD);
    s.push_str(HEADER);
    // State is read and saved even for a row that keeps no candidate, as on the CPU.
    s.push_str(
        "    if (row.dense) return;
    const int n = row.pages - row.sinks - row.recent;
    const int complete = row.pages - (last_len[row.seq] < PAGE_SIZE ? 1 : 0);
    const float* qg = q + ((unsigned long long)row.seq * kv_heads + row.head) * GROUP * HEAD_DIM;
    (void)qg;
",
    );
    // Large fields are staged tile by tile in shared memory, as in one pass.
    let staged = staging(flow).map(|(read, _)| read);
    if let Some(read) = &staged {
        s.push_str(&stage_decls(read));
    }
    for (k, st) in flow.states.iter().enumerate() {
        let _ = writeln!(
            s,
            "    float* sv{k} = st{k} + ((unsigned long long)slots[row.seq] * kv_heads + row.head) * state_pages * {};",
            st.rows * st.cols
        );
    }
    for (id, n) in g.nodes.iter().enumerate() {
        if !is_leaf(&n.op) && !n.ty.per_page {
            let _ = writeln!(s, "    __shared__ float s{id}[{}];", n.ty.elems());
        }
    }
    for &id in &softmaxes {
        let e = g.nodes[id].ty.elems();
        let _ = writeln!(s, "    __shared__ float sm{id}[{e}], sz{id}[{e}];");
    }

    for (si, stage) in plan.stages.iter().enumerate() {
        // Page-combining nodes that open this stage: the parts of the last pass, reduced.
        for &id in &stage.cross {
            let n = &g.nodes[id];
            let e = g.nodes[n.op.inputs()[0]].ty.elems();
            let cols = n.ty.cols;
            let body = match n.op {
                Op::Reduce(op, _, _) => {
                    let fin = match op {
                        ReduceOp::Mean => "t / (float)complete",
                        ReduceOp::L2Norm => "sqrtf(t)",
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
            s.push_str("    ");
            s.push_str(&each_elem(e, cols, &body));
        }
        if !stage.cross.is_empty() {
            s.push_str("    __syncthreads();\n");
        }
        // Values the same for every page, once the nodes they read are known.
        let all = IndexLeaves {
            flow,
            staged: false,
            held: Vec::new(),
        };
        for &id in &stage.step {
            if is_leaf(&g.nodes[id].op) {
                continue;
            }
            s.push_str("    ");
            s.push_str(&compute(flow, g, &all, id, By::Block)?);
            s.push_str("    __syncthreads();\n");
        }

        // The pass: the next stage's parts, or (the last) the state and the keys.
        let next: Vec<NodeId> = plan
            .stages
            .get(si + 1)
            .map_or(Vec::new(), |st| st.cross.clone());
        let targets: Vec<NodeId> = if si == last {
            outputs.clone()
        } else {
            next.iter().map(|&c| g.nodes[c].op.inputs()[0]).collect()
        };
        let (nodes, fields) = pass_nodes(g, &targets);
        let leaves = IndexLeaves {
            flow,
            staged: staged.is_some(),
            held: held(flow)
                .into_iter()
                .filter(|(f, _)| staged.is_none() && fields.contains(f))
                .collect(),
        };
        for &id in &next {
            let n = &g.nodes[id];
            let e = g.nodes[n.op.inputs()[0]].ty.elems();
            match n.op {
                Op::Reduce(op, _, _) => {
                    let init = part_of(op).0;
                    let _ = write!(s, "    float a{id}[{e}]; ");
                    s.push_str(&each_elem(e, 1, &format!("a{id}[el] = {init};")));
                }
                _ => {
                    let _ = write!(s, "    float a{id}[{e}], z{id}[{e}]; ");
                    s.push_str(&each_elem(
                        e,
                        1,
                        &format!("a{id}[el] = NEG_INF; z{id}[el] = 0.0f;"),
                    ));
                }
            }
        }
        match &staged {
            Some(read) => {
                let load: Vec<(usize, usize)> = read
                    .iter()
                    .copied()
                    .filter(|(f, _)| fields.contains(f))
                    .collect();
                s.push_str(&stage_tiles(&load, "0", "complete"));
            }
            None => {
                s.push_str(
                    "    for (int lp = threadIdx.x; lp < complete; lp += TOPK_THREADS) {
        const unsigned long long field_base = (unsigned long long)row.head * num_pages + logical[lp];
        (void)field_base;
",
                );
                for &(f, words) in &leaves.held {
                    s.push_str(&held_load(f, words));
                }
            }
        }
        for &id in &nodes {
            let n = &g.nodes[id];
            let _ = writeln!(s, "        float n{id}[{}];", n.ty.elems());
            s.push_str("        ");
            match n.op {
                Op::Softmax(Axis::Pages, x) => {
                    let xe = at(g, &leaves, x, "r", "c")?;
                    s.push_str(&each_elem(
                        n.ty.elems(),
                        n.ty.cols,
                        &format!("n{id}[el] = expf(({xe}) - sm{id}[el]) / sz{id}[el];"),
                    ));
                }
                _ => s.push_str(&compute(flow, g, &leaves, id, By::Thread)?),
            }
        }
        for &id in &next {
            let n = &g.nodes[id];
            let x = n.op.inputs()[0];
            let xt = g.nodes[x].ty;
            let xe = at(g, &leaves, x, "r", "c")?;
            let body = match n.op {
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
            s.push_str("        ");
            s.push_str(&each_elem(xt.elems(), xt.cols, &body));
        }
        if si == last {
            // Every saved value is taken before any is stored: a save may read a state that
            // another one writes, and must see it as it was before the step.
            for (j, &(k, id)) in index.saves.iter().enumerate() {
                let st = &flow.states[k];
                let v = at(g, &leaves, id, "r", "c")?;
                let _ = write!(s, "        float w{j}[{}]; ", st.rows * st.cols);
                s.push_str(&each_elem(
                    st.rows * st.cols,
                    st.cols,
                    &format!("w{j}[el] = {v};"),
                ));
            }
            for (j, &(k, _)) in index.saves.iter().enumerate() {
                let e = flow.states[k].rows * flow.states[k].cols;
                let _ = writeln!(
                    s,
                    "        for (int el = 0; el < {e}; el++) sv{k}[lp * {e} + el] = w{j}[el];"
                );
            }
            let score = at(g, &leaves, index.score, "0", "0")?;
            let _ = writeln!(
                s,
                "        if (lp >= row.sinks && lp - row.sinks < n) tk_keys[lp - row.sinks] = tk_key({score});"
            );
        }
        s.push_str(if staged.is_some() {
            "    }\n    }\n"
        } else {
            "    }\n"
        });
    }
    s.push_str(
        "    __syncthreads();
    if (row.k <= 0) return;
    tk_select(tks, tk_keys, n, row.k, required_of(row.k, tolerance),
              [&](int pos, int i) { dst[row.sinks + pos] = logical[row.sinks + i]; });
}
",
    );
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vortex_flow::library::load;
    use vortex_flow::{Geometry, compile};

    fn passes_of(src: &str) -> usize {
        src.matches("for (int lp = threadIdx.x; lp < complete;")
            .count()
    }

    /// One pass per stage of the plan: a page-combining node on another's result adds one.
    #[test]
    fn one_pass_per_stage() {
        let h2o = load("h2o", Geometry::default()).unwrap();
        assert!(needed(&h2o));
        let src = super::super::generate(&h2o).unwrap();
        assert_eq!(passes_of(&src), 2);
        assert!(src.contains("vx_block_fold(1, a"));
        let chained = "flow c \"t\"
page c[1, D] bf16
cache:
  c = mean(K, rows)
index:
  s = max(dot(q, c), rows)
  t = s - mean(s, pages)
  topk(softmax(t / (norm(t, pages) + 1), pages))
";
        let flow = compile("c.flow", chained, Geometry::default()).unwrap();
        assert_eq!(passes_of(&super::super::generate(&flow).unwrap()), 4);
        let block_topk = load("block_topk", Geometry::default()).unwrap();
        assert!(!needed(&block_topk));
    }

    /// Every saved value is computed before any state is stored: a save may read a state that
    /// an earlier save writes.
    #[test]
    fn saves_read_the_state_before_the_step() {
        let src = "flow s \"t\"
state a[1, 1]
state b[1, 1]
index:
  save(a, load(b) + 1)
  save(b, load(a))
  topk(load(a))
";
        let flow = compile("s.flow", src, Geometry::default()).unwrap();
        let k = index_kernel(&flow, flow.index.as_ref().unwrap()).unwrap();
        let first_store = k.find("sv0[lp * 1 + el] = w").unwrap();
        assert!(k.rfind("w1[el] = ").unwrap() < first_store);
        assert!(k.contains("sv1[lp * 1 + (0) * 1 + (0)]"));
    }
}
