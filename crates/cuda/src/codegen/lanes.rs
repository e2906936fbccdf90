//! The lane form of a generated index phase of one pass: a few adjacent lanes of a warp score a
//! page together, each over its own columns of the values that reduce over a head's dims (or a
//! field's columns). A lane holds its columns of the query in registers for every page it
//! scores and loads its columns of a page's fields with one or two vector loads; the sums over
//! the columns end in a butterfly of shuffles. A thread scoring a whole page instead reads every
//! query value from shared memory for each page, which bounds it at batch 16 (Quest's bound:
//! GROUP x HEAD_DIM loads a page).
//!
//! A flow takes this form where its per-page values split by columns: each value the page's
//! score needs is element-wise over `cols` of one width (split: a lane computes its columns),
//! a sum, mean, norm, maximum or minimum over those columns or a `dot` along them (reducing:
//! every lane ends with the whole value), or a value of the reduced ones alone (whole: every
//! lane computes it).

use std::fmt::Write;

use vortex_flow::ir::{Axis, Flow, Graph, Input, Node, NodeId, Op, ReduceOp};
use vortex_kv::KvDtype;

use super::expr::{self, Leaves, at, is_leaf, reduction};
use super::index::{IndexLeaves, store_key, vector_words};
use super::{By, compute, const_read, field_read};

/// Columns a lane takes: 16 bytes of a bf16 field.
const LANE_COLS: usize = 8;
/// Query values a lane may hold in registers (GROUP x its columns).
const MAX_HELD_QUERY: usize = 64;
/// Registers a lane may give to held query values and pages' fields; the rest hold its sums and
/// addresses (ptxas 12.9 gives these kernels at most 128 a thread, and spilled beyond).
const HELD_REGISTERS: usize = 96;
/// Pages a lane group scores a trip, at most.
const MAX_IN_FLIGHT: usize = 8;
/// Values of one reduction over the split columns (each lane computes all of them).
const MAX_REDUCED: usize = 16;
/// 32-bit words of a page's fields a lane may hold in registers.
const MAX_HELD_WORDS: usize = 64;
/// Query heads a KV head from which products by the query are read by its sign: the heads share
/// a page's comparison of the two factors (at 4, Quest's index phase took 4-8% less time; at 2,
/// up to 2% more).
const MIN_SIGN_ROWS: usize = 4;

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Kind {
    /// A leaf, read where it lives.
    Leaf,
    /// A step value (the same for every page).
    Step,
    /// Each lane computes its columns.
    Split,
    /// Each lane computes its columns' part, then the lanes of the page combine them.
    Reducing,
    /// Every lane computes all of it (from reduced values and leaves).
    Whole,
}

/// How a flow's index phase splits over the lanes of a page.
pub(super) struct LaneForm {
    /// The columns the split values have.
    cols: usize,
    /// Lanes a page (a power of two dividing 32 and `cols`).
    lanes: usize,
    kinds: Vec<Kind>,
}

impl LaneForm {
    fn width(&self) -> usize {
        self.cols / self.lanes
    }
    /// The columns the split values have.
    pub(super) fn cols(&self) -> usize {
        self.cols
    }
    /// Each node's kind, by id.
    pub(super) fn kinds(&self) -> &[Kind] {
        &self.kinds
    }
    /// The form, in words.
    pub(super) fn describe(&self) -> String {
        format!(
            "the lane form: {} lanes a page, each over {} of its {} columns, sums by shuffles",
            self.lanes,
            self.width(),
            self.cols
        )
    }
}

/// The lane form of `flow`'s index phase, where it has one and it has an index phase of one
/// pass whose values split by columns.
pub(super) fn plan(flow: &Flow) -> Option<LaneForm> {
    let index = flow.index.as_ref()?;
    if super::passes::needed(flow) {
        return None;
    }
    let g = &index.graph;
    // The columns the first reduction over columns (or dot product) of a page reduces.
    let cols = g
        .nodes
        .iter()
        .filter(|n| n.ty.per_page)
        .find_map(|n| match n.op {
            Op::Reduce(_, Axis::Cols, a) | Op::Dot(a, _) => Some(g.nodes[a].ty.cols),
            _ => None,
        })?;
    let lanes = (cols / LANE_COLS).min(32);
    if lanes < 2 || !lanes.is_power_of_two() || !cols.is_multiple_of(lanes) {
        return None;
    }
    let mut kinds = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        let kind = if is_leaf(&n.op) {
            Kind::Leaf
        } else if !n.ty.per_page {
            Kind::Step
        } else {
            classify(g, &kinds, n, cols)?
        };
        kinds.push(kind);
    }
    // A lane computes every value of a reduction, a butterfly of shuffles each: a few only
    // (double_sparse's product of 16 kept channels with a page's 16 keys, 64 values a query
    // head group, spilled).
    let reduced =
        |(id, n): (usize, &Node)| kinds[id] == Kind::Reducing && n.ty.elems() > MAX_REDUCED;
    if g.nodes.iter().enumerate().any(reduced) {
        return None;
    }
    // What the form saves is the query's loads, its columns held in a lane's registers: where no
    // split value reads the query (lsh's agreement of a page's signature with the query's bits,
    // a step value), it was 9% slower.
    let query_by_columns = g.nodes.iter().enumerate().any(|(id, n)| {
        matches!(kinds[id], Kind::Split | Kind::Reducing)
            && n.op
                .inputs()
                .iter()
                .any(|&j| g.nodes[j].op == Op::Input(Input::Q))
    });
    let score = kinds[index.score];
    let query_fits = flow.geometry.group() * (cols / lanes) <= MAX_HELD_QUERY;
    (query_by_columns
        && query_fits
        && cols == flow.geometry.head_dim
        && matches!(score, Kind::Whole | Kind::Reducing))
    .then_some(LaneForm { cols, lanes, kinds })
}

/// The kind of per-page node `n`, its inputs' kinds known; `None` where it cannot take the lane
/// form.
fn classify(g: &Graph, kinds: &[Kind], n: &Node, cols: usize) -> Option<Kind> {
    let inputs = n.op.inputs();
    // An input a lane reads at its own columns: the split columns, or one column broadcast.
    let by_columns = |j: NodeId| {
        let t = &g.nodes[j].ty;
        match kinds[j] {
            Kind::Split => true,
            Kind::Leaf | Kind::Step => t.cols == cols || t.cols == 1,
            // Every lane holds all of these: only one column broadcasts.
            Kind::Reducing | Kind::Whole => t.cols == 1,
        }
    };
    let any_split = inputs.iter().any(|&j| kinds[j] == Kind::Split);
    match n.op {
        Op::Reduce(_, Axis::Cols, a) if g.nodes[a].ty.cols == cols && by_columns(a) => {
            Some(Kind::Reducing)
        }
        Op::Dot(a, b)
            if g.nodes[a].ty.cols == cols
                && g.nodes[b].ty.cols == cols
                && by_columns(a)
                && by_columns(b) =>
        {
            Some(Kind::Reducing)
        }
        Op::Unary(..) | Op::Binary(..) | Op::Where(..) | Op::Reduce(_, Axis::Rows, _)
            if n.ty.cols == cols
                && inputs.iter().all(|&j| by_columns(j))
                && inputs.iter().any(|&j| g.nodes[j].ty.cols == cols) =>
        {
            Some(Kind::Split)
        }
        _ if any_split => None,
        _ => Some(Kind::Whole),
    }
}

/// Where the lane form finds a value: its own columns (`c` is the lane's column, from 0, of a
/// value of `cols` columns; one column broadcasts) of the query in registers, of the page's
/// fields in registers or in place, and of step values and constants in place.
struct LaneLeaves<'a> {
    flow: &'a Flow,
    cols: usize,
    width: usize,
    /// Fields whose columns the lane holds in `pc{f}_{page}`, with their words a row.
    held: Vec<(usize, usize)>,
    /// The trip's page being scored.
    page: usize,
    inline: Vec<bool>,
    /// Whether products by the query are read by its sign (`expr::by_sign`): where a lane's
    /// registers hold the signs of its query values beside them.
    by_sign: bool,
}

impl LaneLeaves<'_> {
    /// The lane's column `c` of a value of `value_cols` columns.
    fn col(&self, value_cols: usize, c: &str) -> String {
        if value_cols == self.cols {
            format!("c0 + ({c})")
        } else {
            c.to_string()
        }
    }
}

impl Leaves for LaneLeaves<'_> {
    fn leaf(&self, op: &Op, r: &str, c: &str) -> Option<String> {
        match op {
            Op::Input(Input::Q) => Some(format!("qr[({r}) * {} + ({c})]", self.width)),
            Op::Input(Input::Pos) => Some("((float)lp)".into()),
            Op::Input(Input::NPages) => Some("((float)complete)".into()),
            Op::Field(f) => {
                let spec = &self.flow.fields[*f];
                if let Some(&(_, words)) = self.held.iter().find(|&&(h, _)| h == *f) {
                    return Some(chunk_read(spec.dtype, *f, self.page, words, r, c));
                }
                Some(field_read(
                    self.flow,
                    *f,
                    "field_base",
                    r,
                    &self.col(spec.cols, c),
                ))
            }
            Op::Const(k) => Some(const_read(*k, r, &self.col(self.flow.consts[*k].cols, c))),
            _ => None,
        }
    }
    fn array(&self, id: NodeId, node: &Node) -> String {
        match (node.ty.per_page, node.ty.cols == self.cols) {
            (true, _) => format!("n{id}"),
            // A step value's columns from the lane's first.
            (false, true) => format!("(s{id} + c0)"),
            (false, false) => format!("s{id}"),
        }
    }
    fn in_registers(&self, op: &Op) -> bool {
        match op {
            Op::Input(Input::Q) => true,
            Op::Field(f) => self.held.iter().any(|&(h, _)| h == *f),
            _ => false,
        }
    }
    fn inlined(&self, id: NodeId) -> bool {
        self.inline.get(id).copied().unwrap_or(false)
    }
    fn products_by_sign(&self) -> bool {
        self.by_sign
    }
}

/// Element `(r, c)` of the lane's columns of field `f` held as `words` 32-bit words a row in
/// `pc{f}_{u}` (the trip's page `u`).
fn chunk_read(dtype: KvDtype, f: usize, u: usize, words: usize, r: &str, c: &str) -> String {
    let w = format!("(({r}) * {words})");
    let f = format!("{f}_{u}");
    match dtype {
        KvDtype::F32 => format!("__uint_as_float(pc{f}[{w} + ({c})])"),
        KvDtype::Fp8 => format!(
            "vx_fp8_of_pair(pc{f}[{w} + (({c}) >> 2)] >> (16 * ((({c}) >> 1) & 1)), ({c}) & 1)"
        ),
        KvDtype::F16 => format!("vx_f16_of(pc{f}[{w} + (({c}) >> 1)], ({c}) & 1)"),
        KvDtype::Bf16 => format!("vx_bf16_of(pc{f}[{w} + (({c}) >> 1)], ({c}) & 1)"),
    }
}

/// The fields a lane holds its columns of, with their words a row: those split values read at
/// the split columns, whose columns a lane takes whole words of, up to [`MAX_HELD_WORDS`].
fn held_fields(flow: &Flow, g: &Graph, form: &LaneForm) -> Vec<(usize, usize)> {
    let width = form.width();
    let mut held = Vec::new();
    let mut total = 0;
    for f in 0..flow.fields.len() {
        let spec = &flow.fields[f];
        let read_by_columns = g.nodes.iter().enumerate().any(|(id, n)| {
            matches!(form.kinds[id], Kind::Split | Kind::Reducing)
                && n.op.inputs().iter().any(|&j| g.nodes[j].op == Op::Field(f))
        });
        let bytes = width * spec.dtype.size();
        if !read_by_columns || spec.cols != form.cols || !bytes.is_multiple_of(4) {
            continue;
        }
        let words = bytes / 4;
        if total + words * spec.rows > MAX_HELD_WORDS {
            continue;
        }
        total += words * spec.rows;
        held.push((f, words));
    }
    held
}

/// Loads the lane's columns of field `f` (`words` a row) for the trip's page `u`, at
/// `field_base{u}`, into `pc{f}_{u}`.
fn chunk_load(flow: &Flow, f: usize, words: usize, u: usize) -> String {
    let spec = &flow.fields[f];
    let (vec, ty, store) = vector_words(words, &format!("pc{f}_{u}"), &format!("r * {words} + "));
    let row_words = spec.cols * spec.dtype.size() / 4;
    format!(
        "        unsigned int pc{f}_{u}[{rows} * {words}];
        _Pragma(\"unroll\") for (int r = 0; r < {rows}; r++) _Pragma(\"unroll\") for (int v = 0; v < {vecs}; v++) {{
            const {ty} x = __ldg(reinterpret_cast<const {ty}*>(reinterpret_cast<const unsigned int*>(f{f}) + field_base{u} * {page_words} + r * {row_words} + sub * {words}) + v);
            {store}
        }}
",
        rows = spec.rows,
        vecs = words / vec,
        page_words = spec.rows * row_words,
    )
}

/// The shuffle combining the lanes' parts of a reduction `op` in `v`.
fn combine(op: ReduceOp, lanes: usize) -> String {
    let fold = match op {
        ReduceOp::Max => "v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));",
        ReduceOp::Min => "v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));",
        ReduceOp::Sum | ReduceOp::Mean | ReduceOp::L2Norm => {
            "v += __shfl_xor_sync(0xffffffffu, v, o);"
        }
    };
    format!(
        "_Pragma(\"unroll\") for (int o = {}; o > 0; o >>= 1) {fold}",
        lanes / 2
    )
}

/// Statements computing split or reducing node `id` into `n{id}`: a split value's array has the
/// value's shape, of which the lane fills its columns (every index a constant, so only those
/// take registers).
fn lane_compute(
    g: &Graph,
    l: &LaneLeaves,
    form: &LaneForm,
    id: NodeId,
    flow: &Flow,
) -> Result<String, String> {
    let n = &g.nodes[id];
    let width = form.width();
    let (rows, cols) = (n.ty.rows, n.ty.cols);
    match (form.kinds[id], &n.op) {
        (Kind::Split, _) => {
            let body = expr::element(flow, g, l, id)?;
            Ok(format!(
                "float n{id}[{e}]; _Pragma(\"unroll\") for (int r = 0; r < {rows}; r++) _Pragma(\"unroll\") for (int c = 0; c < {width}; c++) {{ float v; {body} n{id}[r * {cols} + c] = v; }}\n",
                e = n.ty.elems(),
            ))
        }
        (Kind::Reducing, &Op::Reduce(op, _, a)) => {
            let (init, step, fin) = reduction(op, "v", &at(g, l, a, "r", "j")?, form.cols);
            Ok(format!(
                "float n{id}[{rows}]; _Pragma(\"unroll\") for (int r = 0; r < {rows}; r++) {{ float v = {init}; \
                 _Pragma(\"unroll\") for (int j = 0; j < {width}; j++) {step} {} {fin} n{id}[r] = v; }}\n",
                combine(op, form.lanes)
            ))
        }
        (Kind::Reducing, &Op::Dot(a, b)) => {
            let x = format!(
                "({}) * ({})",
                at(g, l, a, "r", "j")?,
                at(g, l, b, "c", "j")?
            );
            Ok(format!(
                "float n{id}[{e}]; _Pragma(\"unroll\") for (int r = 0; r < {rows}; r++) _Pragma(\"unroll\") for (int c = 0; c < {cols}; c++) {{ float v = 0.0f; \
                 _Pragma(\"unroll\") for (int j = 0; j < {width}; j++) v += {x}; {} n{id}[r * {cols} + c] = v; }}\n",
                combine(ReduceOp::Sum, form.lanes),
                e = n.ty.elems(),
            ))
        }
        _ => Err(format!("{} has no lane form", n.op.label())),
    }
}

/// Pages a lane group has in flight: its fields' loads for all of them go out before it scores
/// the first, their words and the query values a lane holds within [`HELD_REGISTERS`].
fn pages_in_flight(held_words: usize, query_values: usize) -> usize {
    (HELD_REGISTERS.saturating_sub(query_values) / held_words.max(1)).clamp(1, MAX_IN_FLIGHT)
}

/// The page loop of the lane form, after the step values (`qg` the row's query heads): each page
/// to `lanes` adjacent lanes, which store its key (the first of them) into the row's keys. A
/// lane group takes [`pages_in_flight`] pages a trip: their page ids were loaded on the trip
/// before, their fields' loads all go out, then it scores them in turn.
pub(super) fn page_loop(flow: &Flow, form: &LaneForm) -> Result<String, String> {
    let index = flow.index.as_ref().expect("an index phase");
    let g = &index.graph;
    let geometry = flow.geometry;
    let width = form.width();
    let lanes = form.lanes;
    let per_warp = 32 / lanes;
    let held = held_fields(flow, g, form);
    let inline = expr::inlinable(g, &|op| match op {
        Op::Input(Input::Q) => true,
        Op::Field(f) => held.iter().any(|&(h, _)| h == *f),
        _ => false,
    });
    let mut leaves = LaneLeaves {
        flow,
        cols: form.cols,
        width,
        held,
        page: 0,
        inline: (0..g.nodes.len())
            .map(|id| inline[id] && form.kinds[id] == Kind::Split)
            .collect(),
        by_sign: geometry.group() >= MIN_SIGN_ROWS
            && 2 * geometry.group() * width <= MAX_HELD_QUERY,
    };
    // The plan holds the query's columns in registers (`plan` took the form only where they
    // fit), and their signs where products by them are read by sign.
    let signs = (0..g.nodes.len()).any(|id| expr::by_sign(g, &leaves, id).is_some());
    let query_values = geometry.group() * width * if signs { 2 } else { 1 };
    let flight = pages_in_flight(
        (leaves.held.iter())
            .map(|&(f, words)| words * flow.fields[f].rows)
            .sum(),
        query_values,
    );
    let whole = IndexLeaves {
        flow,
        staged: false,
        held: Vec::new(),
        inline: (0..g.nodes.len())
            .map(|id| inline[id] && form.kinds[id] == Kind::Whole)
            .collect(),
    };
    let stride = format!("TK_WARPS * {}", per_warp * flight);
    let mut s = format!(
        "    const int sub = threadIdx.x % {lanes}, c0 = sub * {width};
    (void)c0;
    // The lane group's first page of a trip, and its pages' ids for the next trip.
    const int group_page = (int)(threadIdx.x / 32) * {per_warp} * {flight} + (int)(threadIdx.x % 32) / {lanes};
    unsigned int ids[{flight}];
    _Pragma(\"unroll\") for (int u = 0; u < {flight}; u++) {{
        const int i = lo + group_page + u * {per_warp};
        ids[u] = i < hi ? logical[row.sinks + i] : 0u;
    }}
"
    );
    let _ = writeln!(
        s,
        "    float qr[GROUP * {width}];
    _Pragma(\"unroll\") for (int r = 0; r < GROUP; r++) _Pragma(\"unroll\") for (int c = 0; c < {width}; c++) qr[r * {width} + c] = qg[r * HEAD_DIM + c0 + c];"
    );
    // The loop's trips are the same for every lane of a warp: all take part in the shuffles.
    let _ = writeln!(
        s,
        "    for (int base = lo + (int)(threadIdx.x / 32) * {per_warp} * {flight}; base < hi; base += {stride}) {{"
    );
    for u in 0..flight {
        let _ = writeln!(
            s,
            "        const unsigned long long field_base{u} = (unsigned long long)row.head * num_pages + ids[{u}];"
        );
        for &(f, words) in &leaves.held {
            s.push_str(&chunk_load(flow, f, words, u));
        }
    }
    // The trip's first page of the block, from the warp's.
    let trip = format!("base - (int)(threadIdx.x / 32) * {per_warp} * {flight}");
    let _ = writeln!(
        s,
        "        _Pragma(\"unroll\") for (int u = 0; u < {flight}; u++) {{
            const int i = {trip} + {stride} + group_page + u * {per_warp};
            ids[u] = i < hi ? logical[row.sinks + i] : 0u;
        }}"
    );
    for u in 0..flight {
        leaves.page = u;
        let _ = writeln!(
            s,
            "        {{
        const int i = {trip} + group_page + {u} * {per_warp};
        const bool valid = i < hi;
        const int lp = row.sinks + i;
        const unsigned long long field_base = field_base{u};
        (void)lp; (void)field_base;"
        );
        for (id, n) in g.nodes.iter().enumerate() {
            if is_leaf(&n.op) || !n.ty.per_page {
                continue;
            }
            match form.kinds[id] {
                Kind::Split if leaves.inlined(id) => {}
                Kind::Split | Kind::Reducing => {
                    s.push_str("        ");
                    s.push_str(&lane_compute(g, &leaves, form, id, flow)?);
                }
                Kind::Whole if whole.inlined(id) => {}
                Kind::Whole => {
                    let _ = write!(s, "        float n{id}[{}];\n        ", n.ty.elems());
                    s.push_str(&compute(flow, g, &whole, id, By::Thread)?);
                }
                Kind::Leaf | Kind::Step => {}
            }
        }
        let score = at(g, &whole, index.score, "0", "0")?;
        s.push_str(&store_key(&score, Some("valid && sub == 0")));
        s.push_str("        }\n");
    }
    s.push_str("    }\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vortex_flow::library::load;
    use vortex_flow::{Geometry, compile};

    /// Quest's bound and block_topk's dot product (bf16 or fp8) split by columns; double_sparse's
    /// product of the kept channels (64 values a lane), lsh's agreement (no split value reads
    /// the query), a query too large for a lane's registers, a value of all of a split value's
    /// columns, and flows in passes do not.
    #[test]
    fn flows_whose_values_split_by_columns_take_the_lane_form() {
        let g = Geometry::default();
        for (name, cols, lanes) in [
            ("quest", 128, 16),
            ("quest_fp8", 128, 16),
            ("block_topk", 128, 16),
            ("block_topk_fp8", 128, 16),
        ] {
            let form = plan(&load(name, g).unwrap()).unwrap_or_else(|| panic!("{name}"));
            assert_eq!((form.cols, form.lanes), (cols, lanes), "{name}");
        }
        // 16 query heads a KV head: 128 query values a lane, past its registers.
        let wide_group = Geometry {
            heads_q: 32,
            heads_kv: 2,
            ..g
        };
        assert!(plan(&load("quest", wide_group).unwrap()).is_none());
        for name in [
            "h2o",
            "streaming",
            "global_local",
            "dense",
            "double_sparse",
            "lsh",
        ] {
            assert!(plan(&load(name, g).unwrap()).is_none(), "{name}");
        }
        let flow = |index: &str| {
            let src = format!(
                "flow t \"test\"\npage c[1, D] bf16\ncache:\n  c = mean(K, rows)\nindex:\n{index}"
            );
            compile("t.flow", &src, g).unwrap()
        };
        // The sum of a transposed product needs every column of it.
        assert!(
            plan(&flow(
                "  p = q * c\n  topk(max(sum(transpose(p), rows), cols))\n"
            ))
            .is_none()
        );
        assert!(
            plan(&flow(
                "  p = q * c\n  topk(max(sum(p, cols) + max(p, cols), rows))\n"
            ))
            .is_some()
        );
    }

    /// The larger or smaller of two products by the query, its factors in either order, is one
    /// product by the larger or smaller factor where a lane holds the query's signs beside its
    /// values (GROUP x 8 x 2 at most 64) for at least 4 query heads, and two products where it
    /// does not (7 query heads a KV head) or they are fewer (2).
    #[test]
    fn products_by_the_query_are_read_by_its_sign_where_the_signs_fit() {
        let text = |name: &str, g: Geometry| {
            let flow = match name {
                "products" => compile(
                    "products.flow",
                    include_str!("../../tests/flows/products.flow"),
                    g,
                )
                .unwrap(),
                _ => load(name, g).unwrap(),
            };
            page_loop(&flow, &plan(&flow).unwrap()).unwrap()
        };
        let g = Geometry::default();
        assert!(text("quest", g).contains("v += vx_max_products(qr[(r) * 8 + (j)], "));
        let both = text("products", g);
        assert!(both.contains("vx_max_products(qr[") && both.contains("vx_min_products(qr["));
        let seven = Geometry {
            heads_q: 14,
            heads_kv: 2,
            head_dim: 64,
            ..g
        };
        let pair = Geometry { heads_q: 16, ..g };
        for g in [seven, pair] {
            let two = text("products", g);
            assert!(!two.contains("_products(") && two.contains("fmaxf(((qr["));
        }
    }

    /// A lane holds its 8 columns of the query for every query head and loads its 16 bytes of
    /// a bf16 centroid in one vector load; the sum over the head's dims ends in four shuffles.
    #[test]
    fn a_lane_holds_its_columns_of_the_query_and_the_fields() {
        let flow = load("block_topk", Geometry::default()).unwrap();
        let src = page_loop(&flow, &plan(&flow).unwrap()).unwrap();
        assert!(src.contains("float qr[GROUP * 8];"));
        assert!(src.contains("const uint4 x = __ldg("));
        assert!(src.contains("for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync("));
        assert!(src.contains("if (valid && sub == 0)"));
    }
}
