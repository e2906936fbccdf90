//! The index phase of a flow that combines pages (a softmax or a reduction over `pages`) or
//! keeps per-request state: one block per row makes a pass over the row's complete pages for
//! each stage of the flow's plan ([`vortex_flow::plan`]), as the CPU runner does.
//!
//! A pass computes the per-page values of its stage that later stages read and keeps them in
//! a scratch row in global memory (a few floats a page, in L2), reading those of earlier stages
//! back; it folds each thread's pages into its part of the next stage's page-combining nodes,
//! and the block then reduces the parts into shared memory (a softmax over pages keeps its
//! maximum and the sum of exponentials after it, merged online, and is evaluated per page from
//! its kept input). The last pass saves the state of every complete page and writes the
//! candidates' keys for the top-k.

use std::collections::BTreeSet;
use std::fmt::Write;

use vortex_flow::ir::{Axis, Flow, Graph, IndexPhase, NodeId, Op};
use vortex_flow::plan::{NodeKind, Plan};

use super::expr::{at, is_leaf};
use super::fold::{self, each_elem};
use super::index::{
    IndexLeaves, STAGE_CLOSE, STEP_SHARED_BYTES, header, held, held_load, query, stage_decls,
    stage_tiles, staging,
};
use super::{By, compute, per_page_array};

/// Whether `flow`'s index phase runs in passes: it combines pages or keeps state.
pub fn needed(flow: &Flow) -> bool {
    flow.index.as_ref().is_some_and(|ix| {
        !flow.states.is_empty() || ix.graph.nodes.iter().any(|n| n.op.crosses_pages())
    })
}

/// What a pass evaluates per page to get `targets`: the computed nodes in graph order, the
/// kept nodes it reads back instead (`kept_before`), and the fields it reads. A softmax over
/// pages is evaluated in the pass from its input and the block's maximum and sum; values the
/// same for every page are already in shared memory.
struct PassNodes {
    computed: Vec<NodeId>,
    read_back: Vec<NodeId>,
    fields: BTreeSet<usize>,
}

fn pass_nodes(g: &Graph, targets: &[NodeId], kept_before: impl Fn(NodeId) -> bool) -> PassNodes {
    let (mut seen, mut back, mut fields) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let mut todo: Vec<NodeId> = targets.to_vec();
    while let Some(id) = todo.pop() {
        let n = &g.nodes[id];
        if let Op::Field(f) = n.op {
            fields.insert(f);
        }
        if is_leaf(&n.op) || !n.ty.per_page {
            continue;
        }
        if kept_before(id) {
            back.insert(id);
        } else if seen.insert(id) {
            todo.extend(n.op.inputs());
        }
    }
    PassNodes {
        computed: seen.into_iter().collect(),
        read_back: back.into_iter().collect(),
        fields,
    }
}

/// The per-page values a pass keeps for later stages, with their offsets in a page's scratch
/// record, and the record's floats: computed per-page nodes read by a page-combining node or by
/// a later stage, and the outputs (score, saves) of stages before the last.
fn kept(g: &Graph, plan: &Plan, outputs: &[NodeId]) -> (Vec<Option<usize>>, usize) {
    let last = plan.stages.len() - 1;
    let mut offsets = vec![None; g.nodes.len()];
    let mut floats = 0;
    for (j, n) in g.nodes.iter().enumerate() {
        if is_leaf(&n.op) || plan.kinds[j] != NodeKind::Page || plan.stage_of[j] == last {
            continue;
        }
        let read_later = g.nodes.iter().enumerate().any(|(i, m)| {
            m.op.inputs().contains(&j)
                && (plan.kinds[i] == NodeKind::Cross || plan.stage_of[i] != plan.stage_of[j])
        });
        if read_later || outputs.contains(&j) {
            offsets[j] = Some(floats);
            floats += n.ty.elems();
        }
    }
    (offsets, floats)
}

/// Floats a row's page takes in the scratch of `flow`'s index phase (0: none).
pub fn scratch_floats(flow: &Flow) -> usize {
    match &flow.index {
        Some(ix) if needed(flow) => {
            let outputs = outputs(ix);
            kept(&ix.graph, &Plan::new(&ix.graph, &outputs), &outputs).1
        }
        _ => 0,
    }
}

fn outputs(index: &IndexPhase) -> Vec<NodeId> {
    let mut o: Vec<NodeId> = index.saves.iter().map(|&(_, id)| id).collect();
    o.push(index.score);
    o
}

pub(super) fn index_kernel(flow: &Flow, index: &IndexPhase) -> Result<String, String> {
    let g = &index.graph;
    let outputs = outputs(index);
    let plan = Plan::new(g, &outputs);
    let (offsets, record) = kept(g, &plan, &outputs);
    let last = plan.stages.len() - 1;
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

    let mut s = String::from(fold::BLOCK_FOLD);
    s.push_str(&header(flow));
    // State is read and saved even for a row that keeps no candidate, as on the CPU; such a
    // row writes no keys (the launch sizes them for the rows that keep some).
    s.push_str(
        "    if (row.dense) return;
    const int n = row.pages - row.sinks - row.recent;
    const int complete = row.pages - (last_len[row.seq] < PAGE_SIZE ? 1 : 0);
",
    );
    s.push_str(&query(flow, g, step_bytes));
    // Large fields are staged tile by tile in shared memory, as in one pass.
    let staged = staging(flow).map(|(read, _)| read);
    if let Some(read) = &staged {
        s.push_str(&stage_decls(read));
    }
    if record > 0 {
        let _ = writeln!(
            s,
            "    float* kept = scratch + (unsigned long long)row_id * scratch_pages * {record};"
        );
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
            s.push_str(&fold::close(g, id));
        }
        if !stage.cross.is_empty() {
            s.push_str("    __syncthreads();\n");
        }
        // Values the same for every page, once the nodes they read are known.
        let all = IndexLeaves {
            flow,
            staged: false,
            held: Vec::new(),
            inline: Vec::new(),
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
        let keep_here: Vec<NodeId> = (0..g.nodes.len())
            .filter(|&j| offsets[j].is_some() && plan.stage_of[j] == si)
            .collect();
        let targets: Vec<NodeId> = if si == last {
            outputs.clone()
        } else {
            next.iter()
                .map(|&c| g.nodes[c].op.inputs()[0])
                .chain(keep_here.iter().copied())
                .collect()
        };
        let PassNodes {
            computed: nodes,
            read_back,
            fields,
        } = pass_nodes(g, &targets, |j| {
            offsets[j].is_some() && plan.stage_of[j] < si
        });
        let leaves = IndexLeaves {
            flow,
            staged: staged.is_some(),
            held: held(flow)
                .into_iter()
                .filter(|(f, _)| staged.is_none() && fields.contains(f))
                .collect(),
            inline: Vec::new(),
        };
        for &id in &next {
            s.push_str(&fold::open(g, id));
        }
        // Fields this pass reads that are staged, tile by tile; a pass reading none loops over
        // the pages directly.
        let load: Vec<(usize, usize)> = staged
            .iter()
            .flatten()
            .copied()
            .filter(|(f, _)| fields.contains(f))
            .collect();
        if !load.is_empty() {
            s.push_str(&stage_tiles(&load, "0", "0", "complete"));
        } else {
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
        for &id in &read_back {
            let (e, off) = (g.nodes[id].ty.elems(), offsets[id].expect("kept"));
            let _ = write!(s, "        float n{id}[{e}]; ");
            s.push_str(&each_elem(
                e,
                1,
                &format!("n{id}[el] = kept[lp * {record} + {off} + el];"),
            ));
        }
        let mut read_before = false;
        for &id in &nodes {
            let n = &g.nodes[id];
            s.push_str(&per_page_array(g, &leaves, id, &mut read_before));
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
        for &id in &keep_here {
            let (e, off) = (g.nodes[id].ty.elems(), offsets[id].expect("kept"));
            s.push_str("        ");
            s.push_str(&each_elem(
                e,
                1,
                &format!("kept[lp * {record} + {off} + el] = n{id}[el];"),
            ));
        }
        for &id in &next {
            s.push_str(&fold::update(g, &leaves, id)?);
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
            // So is the score, which may be a loaded state.
            let score = at(g, &leaves, index.score, "0", "0")?;
            let _ = writeln!(s, "        const float key = {score};");
            for (j, &(k, _)) in index.saves.iter().enumerate() {
                let e = flow.states[k].rows * flow.states[k].cols;
                let _ = writeln!(
                    s,
                    "        for (int el = 0; el < {e}; el++) sv{k}[lp * {e} + el] = w{j}[el];"
                );
            }
            let _ = writeln!(
                s,
                "        if (row.k > 0 && lp >= row.sinks && lp - row.sinks < n) tk_keys[lp - row.sinks] = tk_key(key);"
            );
        }
        s.push_str("    }\n");
        if !load.is_empty() {
            s.push_str(STAGE_CLOSE);
        }
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

    /// Passes over the pages: tiles staged in shared memory, or pages directly.
    fn passes_of(src: &str) -> usize {
        src.matches("const int tiles_from = 0, tiles_to = complete;")
            .count()
            + src
                .matches("for (int lp = threadIdx.x; lp < complete;")
                .count()
    }

    /// One pass per stage of the plan: a page-combining node on another's result adds one.
    #[test]
    fn one_pass_per_stage() {
        let h2o = load("h2o", Geometry::default()).unwrap();
        assert!(needed(&h2o));
        let src = super::super::generate(&h2o).unwrap();
        assert_eq!(passes_of(&src), 2);
        // The group's scores are kept for the second pass, and read back there.
        assert_eq!(scratch_floats(&h2o), 4);
        assert!(src.contains("kept[lp * 4 + 0 + el] = n5[el]"));
        assert!(src.contains("n5[el] = kept[lp * 4 + 0 + el]"));
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
        assert_eq!(scratch_floats(&block_topk), 0);
    }

    /// Every saved value, and the score, is computed before any state is stored: a save or the
    /// score may read a state that a save writes.
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
        let key = k
            .find("const float key = sv0[lp * 1 + (0) * 1 + (0)];")
            .unwrap();
        assert!(key < first_store);
    }
}
