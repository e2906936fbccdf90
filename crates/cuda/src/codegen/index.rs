//! The generated index phase: one block per sequence and KV head computes the step values once
//! in shared memory, then each candidate page's score (its fields staged tile by tile in shared
//! memory when they are large), the top-k in shared memory and the sparse page table row.

use std::fmt::Write;

use vortex_flow::ir::{Flow, Graph, Input, Node, NodeId, Op};
use vortex_kv::KvDtype;

use super::expr::{Leaves, at, is_leaf};
use super::{By, compute, const_read, field_read, per_page_array};

/// Shared memory the index kernel's step values may take.
pub(super) const STEP_SHARED_BYTES: usize = 32 << 10;
/// Static shared memory a kernel may take.
pub(super) const STATIC_SHARED_BYTES: usize = 48 << 10;
/// Static shared memory of the top-k (`TopkShared`, 8540 bytes), at most.
const TOPK_SHARED_BYTES: usize = 9 << 10;
/// Pages whose fields the index phase reads are staged from this many bytes each...
const MIN_STAGED_PAGE_BYTES: usize = 256;
/// ...to this many (a tile takes at least one page, in each of its two buffers).
const MAX_STAGED_PAGE_BYTES: usize = 32 << 10;
/// Unstaged fields of at most this many 32-bit words are copied per page into the thread's own
/// array with vector loads before it scores the page.
const MAX_HELD_WORDS: usize = 64;

pub(super) struct IndexLeaves<'a> {
    pub(super) flow: &'a Flow,
    /// The fields read by the index phase are staged tile by tile in shared memory.
    pub(super) staged: bool,
    /// Fields each thread holds for its page (`held`).
    pub(super) held: Vec<(usize, usize)>,
    /// Nodes read in place by their consumer ([`expr::inlinable`]); empty for none.
    pub(super) inline: Vec<bool>,
}

/// 32-bit words of one page's (and KV head's) value of field `f`, when it is a whole number.
fn field_words(flow: &Flow, f: usize) -> Option<usize> {
    let spec = &flow.fields[f];
    match spec.dtype {
        KvDtype::F32 => Some(spec.elems()),
        KvDtype::Fp8 => spec.elems().is_multiple_of(4).then_some(spec.elems() / 4),
        KvDtype::Bf16 | KvDtype::F16 => spec.elems().is_multiple_of(2).then_some(spec.elems() / 2),
    }
}

/// Element `(r, c)` of a field a thread holds for its page as 32-bit words in `pf{f}`.
fn held_read(flow: &Flow, f: usize, r: &str, c: &str) -> String {
    let spec = &flow.fields[f];
    let idx = format!("(({r}) * {} + ({c}))", spec.cols);
    match spec.dtype {
        KvDtype::F32 => format!("__uint_as_float(pf{f}[{idx}])"),
        KvDtype::Fp8 => {
            format!("vx_fp8_of_pair(pf{f}[{idx} >> 2] >> (16 * (({idx} >> 1) & 1)), {idx} & 1)")
        }
        KvDtype::F16 => format!("vx_f16_of(pf{f}[{idx} >> 1], {idx} & 1)"),
        KvDtype::Bf16 => format!("vx_bf16_of(pf{f}[{idx} >> 1], {idx} & 1)"),
    }
}

/// The unstaged fields the index phase reads that a thread holds for its page, with their
/// words: whole words, at most [`MAX_HELD_WORDS`]. A warp's element-wise reads of 32 pages
/// would each touch 32 lines; vector loads of a page's words touch them once.
pub(super) fn held(flow: &Flow) -> Vec<(usize, usize)> {
    let Some(index) = &flow.index else {
        return Vec::new();
    };
    (0..flow.fields.len())
        .filter(|&f| index.graph.nodes.iter().any(|n| n.op == Op::Field(f)))
        .filter_map(|f| field_words(flow, f).map(|w| (f, w)))
        .filter(|&(_, w)| w <= MAX_HELD_WORDS)
        .collect()
}

/// The widest vector of `words` 32-bit words (16, 8 or 4 bytes): its words, its type, and the
/// statements storing one, `x`, the `v`th, into `array` from word `offset`.
pub(super) fn vector_words(
    words: usize,
    array: &str,
    offset: &str,
) -> (usize, &'static str, String) {
    let (vec, ty, parts): (usize, &str, &[&str]) = if words.is_multiple_of(4) {
        (4, "uint4", &["x", "y", "z", "w"])
    } else if words.is_multiple_of(2) {
        (2, "uint2", &["x", "y"])
    } else {
        (1, "unsigned int", &[])
    };
    let store = if parts.is_empty() {
        format!("{array}[{offset}v] = x;")
    } else {
        parts
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{array}[{offset}{vec} * v + {i}] = x.{p};"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    (vec, ty, store)
}

/// Loads field `f`'s `words` for the page at `field_base` into `pf{f}`, 16, 8 or 4 bytes at a
/// time.
pub(super) fn held_load(f: usize, words: usize) -> String {
    let (vec, ty, store) = vector_words(words, &format!("pf{f}"), "");
    let vecs = words / vec;
    format!(
        "        unsigned int pf{f}[{words}];
#pragma unroll
        for (int v = 0; v < {vecs}; v++) {{
            const {ty} x = __ldg(reinterpret_cast<const {ty}*>(f{f}) + field_base * {vecs} + v);
            {store}
        }}
"
    )
}

/// A staged field's element `(r, c)` of the tile's page `slot`; pages are one word apart more
/// than their size, so that the lanes' pages fall in different banks.
fn staged_read(flow: &Flow, f: usize, r: &str, c: &str) -> String {
    let spec = &flow.fields[f];
    let words = field_words(flow, f).expect("staged fields have whole words");
    let idx = format!("({r}) * {} + ({c})", spec.cols);
    match spec.dtype {
        KvDtype::F32 => format!(
            "__uint_as_float(stage{f}[at + slot * {} + {idx}])",
            words + 1
        ),
        KvDtype::Fp8 => format!(
            "vx_fp8_of_pair(reinterpret_cast<const unsigned short*>(stage{f} + at + slot * {})[({idx}) >> 1], ({idx}) & 1)",
            words + 1
        ),
        KvDtype::F16 => format!(
            "vx_f16(reinterpret_cast<const unsigned short*>(stage{f} + at + slot * {})[{idx}])",
            words + 1
        ),
        KvDtype::Bf16 => format!(
            "vx_bf16(reinterpret_cast<const unsigned short*>(stage{f} + at + slot * {})[{idx}])",
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
            Op::Field(f) if self.held.iter().any(|&(h, _)| h == *f) => {
                Some(held_read(self.flow, *f, r, c))
            }
            Op::Field(f) => Some(field_read(self.flow, *f, "field_base", r, c)),
            Op::Const(k) => Some(const_read(*k, r, c)),
            Op::LoadState(k) => {
                let spec = &self.flow.states[*k];
                Some(format!(
                    "sv{k}[lp * {} + ({r}) * {} + ({c})]",
                    spec.rows * spec.cols,
                    spec.cols
                ))
            }
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
    fn in_registers(&self, op: &Op) -> bool {
        matches!(op, Op::Field(f) if !self.staged && self.held.iter().any(|&(h, _)| h == *f))
    }
    fn inlined(&self, id: NodeId) -> bool {
        self.inline.get(id).copied().unwrap_or(false)
    }
}

/// Whether the index kernel may score a row over a cluster of blocks, each its share of the
/// pages into the first one's keys: an index phase of one pass (no state, no page-combining
/// operators).
pub fn splits_rows(flow: &Flow) -> bool {
    flow.index.is_some() && !super::passes::needed(flow)
}

/// The fields the index phase reads, when it stages them in shared memory: `(field, words)`
/// for each, and the shared bytes a page of a tile takes (its fields in each of the two tile
/// buffers, each field one word more than its size, and its id once). Small fields (LSH's
/// 64-byte signature) read well enough in place; staging pays from a few hundred bytes per page
/// (measured: double_sparse's 512 bytes 1.5x faster, LSH 15% slower staged).
pub fn staging(flow: &Flow) -> Option<(Vec<(usize, usize)>, usize)> {
    let g = &flow.index.as_ref()?.graph;
    let read: Vec<(usize, usize)> = (0..flow.fields.len())
        .filter(|&f| g.nodes.iter().any(|n| n.op == Op::Field(f)))
        .map(|f| field_words(flow, f).map(|w| (f, w)))
        .collect::<Option<_>>()?;
    let words = buffer_words(&read);
    (MIN_STAGED_PAGE_BYTES..=MAX_STAGED_PAGE_BYTES)
        .contains(&(words * 4))
        .then_some((read, (2 * words + 1) * 4))
}

/// The shared bytes a page of a staged tile takes in the index kernel ([`staging`]), for a flow
/// whose kernel stages its fields: not one of the lane form, which reads its columns in place.
pub fn stage_bytes(flow: &Flow) -> Option<usize> {
    if super::lanes::plan(flow).is_some() {
        return None;
    }
    staging(flow).map(|(_, bytes)| bytes)
}

/// Shared words a page's staged fields take in one tile buffer: each field one word more than
/// its size, so that a warp's lanes, a page each, read different banks.
fn buffer_words(read: &[(usize, usize)]) -> usize {
    read.iter().map(|&(_, w)| w + 1).sum()
}

/// The staging tile of fields `read` in shared memory, after the row's `n` keys (none for a row
/// that keeps no candidate: the launch sizes the keys for the rows that keep some): the tile's
/// page ids, then two buffers of `stage_pages` pages' fields, `stage_buffer` words apart.
pub(super) fn stage_decls(read: &[(usize, usize)]) -> String {
    let mut s =
        String::from("    unsigned int* stage_ids = tk_keys + (((row.k > 0 ? n : 0) + 3) & ~3);\n");
    let mut offset = 1;
    for &(f, words) in read {
        let _ = writeln!(
            s,
            "    unsigned int* stage{f} = stage_ids + {offset} * stage_pages;"
        );
        offset += words + 1;
    }
    let _ = writeln!(
        s,
        "    const int stage_buffer = {} * stage_pages;",
        buffer_words(read)
    );
    s
}

/// Opens a loop over the row's pages `first + from..first + to`, tile by tile, each thread
/// taking page `i` of the tile (`slot` in it, `lp` in the sequence) with the tile's fields
/// `load` (of those [`stage_decls`] placed) in the shared buffer at `at`. The page loop is
/// closed by a brace, then [`STAGE_CLOSE`].
///
/// The next tile's fields are copied while this one is scored (asynchronous copies from compute
/// capability 8.0), and the page ids of the tile after it load meanwhile: a tile's loads no
/// longer wait, in turn, on its page ids, then on the scoring of the tile before.
pub(super) fn stage_tiles(load: &[(usize, usize)], first: &str, from: &str, to: &str) -> String {
    // Lanes a page: a warp's copies of a page's words are adjacent.
    let widest = load.iter().map(|&(_, w)| w).max().unwrap_or(1);
    let lanes = widest.next_power_of_two().min(32);
    let per_warp = 32 / lanes;
    let mut copies = String::new();
    for &(f, words) in load {
        let _ = writeln!(
            copies,
            "            {{ const unsigned int* src = reinterpret_cast<const unsigned int*>(f{f}) + page * {words}; \
             unsigned int* d = stage{f} + at + pg * {}; \
             for (int w = sub; w < {words}; w += {lanes}) vx_copy_word(d + w, src + w); }}",
            words + 1
        );
    }
    format!(
        "    {{
    const auto stage_copy = [&](int cnt, int at) {{
        const int sub = threadIdx.x % {lanes};
        for (int pg = (threadIdx.x / 32) * {per_warp} + (threadIdx.x % 32) / {lanes}; pg < cnt; pg += TK_WARPS * {per_warp}) {{
            const unsigned long long page = (unsigned long long)row.head * num_pages + stage_ids[pg];
{copies}        }}
        vx_copies_commit();
    }};
    const int tiles_from = {from}, tiles_to = {to};
    const int cnt0 = min(stage_pages, tiles_to - tiles_from);
    if ((int)threadIdx.x < cnt0) stage_ids[threadIdx.x] = logical[{first} + tiles_from + threadIdx.x];
    unsigned int next_id = (int)threadIdx.x < min(stage_pages, tiles_to - tiles_from - stage_pages)
        ? logical[{first} + tiles_from + stage_pages + threadIdx.x] : 0u;
    __syncthreads();
    if (cnt0 > 0) stage_copy(cnt0, 0);
    __syncthreads();
    for (int t0 = tiles_from, b = 0; t0 < tiles_to; t0 += stage_pages, b ^= 1) {{
        const int cnt = min(stage_pages, tiles_to - t0);
        const int cnt1 = min(stage_pages, tiles_to - t0 - stage_pages);
        const int cnt2 = min(stage_pages, tiles_to - t0 - 2 * stage_pages);
        // Every thread's copies read the last tile's ids before the last barrier.
        if ((int)threadIdx.x < cnt1) stage_ids[threadIdx.x] = next_id;
        if ((int)threadIdx.x < cnt2) next_id = logical[{first} + t0 + 2 * stage_pages + threadIdx.x];
        __syncthreads();
        if (cnt1 > 0) stage_copy(cnt1, b ? 0 : stage_buffer);
        else vx_copies_commit();
        vx_copies_wait_one();
        __syncthreads();
        const int at = b ? stage_buffer : 0;
        for (int i = t0 + threadIdx.x; i < t0 + cnt; i += TOPK_THREADS) {{
        const int slot = i - t0;
        const int lp = {first} + i;
        (void)slot; (void)lp; (void)at;
"
    )
}

/// Closes the tile loop [`stage_tiles`] opens, and its scope.
pub(super) const STAGE_CLOSE: &str = "    }\n    }\n";

/// The row's query heads as `qg`: in shared memory when a page's score reads them (every page
/// reads all of them, and shared memory serves them faster than the L1) and they fit beside the
/// kernel's `step_bytes` of step values, else in place.
pub(super) fn query(flow: &Flow, g: &Graph, step_bytes: usize) -> String {
    let src = "q + ((unsigned long long)row.seq * kv_heads + row.head) * GROUP * HEAD_DIM";
    if query_bytes(flow, g, step_bytes) > 0 {
        format!(
            "    __shared__ __align__(16) float qs[GROUP * HEAD_DIM];
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += TOPK_THREADS) qs[i] = ({src})[i];
    __syncthreads();
    const float* qg = qs;
"
        )
    } else {
        format!("    const float* qg = {src};\n    (void)qg;\n")
    }
}

/// Bytes of shared memory [`query`] takes for the row's query heads (none where it reads them in
/// place).
fn query_bytes(flow: &Flow, g: &Graph, step_bytes: usize) -> usize {
    let bytes = flow.geometry.group() * flow.geometry.head_dim * 4;
    let per_page = g
        .nodes
        .iter()
        .filter(|n| n.ty.per_page)
        .flat_map(|n| n.op.inputs())
        .any(|j| g.nodes[j].op == Op::Input(Input::Q));
    if per_page && step_bytes + bytes <= STEP_SHARED_BYTES {
        bytes
    } else {
        0
    }
}

/// Bytes of shared memory a one-pass index kernel's step values take.
fn step_bytes(g: &Graph) -> usize {
    g.nodes
        .iter()
        .filter(|n| !is_leaf(&n.op) && !n.ty.per_page)
        .map(|n| n.ty.elems() * 4)
        .sum()
}

/// Static shared memory a one-pass index kernel takes before its page loop's own, at most: the
/// top-k's, the step values' and the query's.
pub(super) fn shared_before_pages(flow: &Flow, g: &Graph) -> usize {
    let step = step_bytes(g);
    TOPK_SHARED_BYTES + step + query_bytes(flow, g, step)
}

/// The index kernel's signature and the work every row does first: its sink and recent pages.
/// `f0..` are the flow's page fields; `slots` and `st0..` the step's state slots and one
/// layer's state fields ([`crate::flow_state`]; null for a flow without state); `scratch`
/// holds `scratch_pages` pages' values per row for a flow run in passes that keeps some (null
/// otherwise).
pub(super) fn header(flow: &Flow) -> String {
    let (fields, fields_used) = super::params("const void* ", "f", flow.fields.len());
    let (states, states_used) = super::params("float* ", "st", flow.states.len());
    format!(
        "// Dynamic shared memory: the row's keys, then (for a flow that stages its fields) a tile of
// `stage_pages` pages of them.
extern \"C\" __global__ void __launch_bounds__(TOPK_THREADS)
flow_index(int num_pages{fields},
           const unsigned int* __restrict__ dense_indptr, const unsigned int* __restrict__ dense_indices,
           const unsigned int* __restrict__ last_len, const float* __restrict__ q,
           const SelRow* __restrict__ rows, int kv_heads, float tolerance, int stage_pages,
           unsigned int* __restrict__ out, unsigned int* ready, int ready_at_block,
           const int* __restrict__ slots,
           int state_pages{states}, float* scratch, int scratch_pages) {{
    extern __shared__ unsigned int tk_keys[];
    __shared__ TopkShared tks;
    // The blocks of a cluster share a row (a cluster of one but for an index phase of one
    // pass, splits_rows): each scores a share of its pages into the first block's keys.
    const unsigned int parts = cluster_ranks(), rank = cluster_rank();
    if (parts > 1) cluster_arrive();
    const int row_id = blockIdx.x / parts;
    const RowReady signal(ready, rows, kv_heads, ready_at_block, row_id, rank == 0);
    const SelRow row = rows[row_id];
    const unsigned int* logical = dense_indices + dense_indptr[row.seq];
    unsigned int* dst = out + row.out;
    if (rank == 0) write_edges(row, logical, dst);
    // Every block of the cluster has started: the first one's keys may be written.
    if (parts > 1) cluster_wait();
   {fields_used} (void)q; (void)last_len; (void)num_pages;
    (void)stage_pages; (void)slots; (void)state_pages;{states_used}
    (void)scratch; (void)scratch_pages;
"
    )
}

/// The end of an index kernel of one pass: the row's keys complete (in the first block of its
/// cluster), the top-k and the sparse table row.
const SELECT: &str = "    if (parts > 1) {
        cluster_sync();
        if (rank != 0) return;
    } else {
        __syncthreads();
    }
    tk_select(tks, tk_keys, n, row.k, required_of(row.k, tolerance),
              [&](int pos, int i) { dst[row.sinks + pos] = logical[row.sinks + i]; });
}
";

/// Statements storing page `i`'s key from its `score` into the row's keys (the first block's,
/// where a cluster shares the row), only where `only_if` holds when given.
pub(super) fn store_key(score: &str, only_if: Option<&str>) -> String {
    let store = |indent: &str| {
        format!(
            "{indent}if (parts > 1)
{indent}    store_at(first_keys + 4u * (unsigned int)i, key);
{indent}else
{indent}    tk_keys[i] = key;
"
        )
    };
    let key = format!("        const unsigned int key = tk_key({score});\n");
    match only_if {
        None => key + &store("        "),
        Some(c) => format!(
            "{key}        if ({c}) {{\n{}        }}\n",
            store("            ")
        ),
    }
}

pub(super) fn index_kernel(flow: &Flow) -> Result<String, String> {
    index_kernel_in(flow, super::lanes::plan(flow))
}

/// The index kernel, in the lane form where `lanes` is given, else a thread a page.
fn index_kernel_in(flow: &Flow, lanes: Option<super::lanes::LaneForm>) -> Result<String, String> {
    if let Some(index) = flow.index.as_ref().filter(|_| super::passes::needed(flow)) {
        return super::passes::index_kernel(flow, index);
    }
    let mut s = header(flow);
    s.push_str(
        "    if (row.k <= 0) return;
    const int n = row.pages - row.sinks - row.recent;
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
",
    );
    let g = &index.graph;
    let step_bytes = step_bytes(g);
    if step_bytes > STEP_SHARED_BYTES {
        return Err(format!(
            "its step values take {step_bytes} bytes of shared memory (at most {STEP_SHARED_BYTES})"
        ));
    }
    s.push_str(&query(flow, g, step_bytes));
    // Fields the index phase reads are copied tile by tile into shared memory with coalesced
    // loads, then each thread scores its page from there.
    let staged = staging(flow);
    let mut leaves = IndexLeaves {
        flow,
        staged: staged.is_some(),
        held: if staged.is_some() {
            Vec::new()
        } else {
            held(flow)
        },
        inline: Vec::new(),
    };
    leaves.inline = super::expr::inlinable(g, &|op| leaves.in_registers(op));
    for (id, n) in g.nodes.iter().enumerate() {
        if is_leaf(&n.op) || n.ty.per_page {
            continue;
        }
        let _ = writeln!(s, "    __shared__ float s{id}[{}];", n.ty.elems());
        s.push_str("    ");
        s.push_str(&compute(flow, g, &leaves, id, By::Block)?);
        s.push_str("    __syncthreads();\n");
    }
    s.push_str(
        "    // This block's candidates [lo, hi), in whole tiles of 16.
    const int share = ((n + (int)parts - 1) / (int)parts + 15) & ~15;
    const int lo = min(n, (int)rank * share), hi = min(n, lo + share);
    const unsigned int first_keys = parts > 1 ? remote(tk_keys, 0) : 0u;
",
    );
    if let Some(form) = lanes {
        let lane_loop = super::lanes::page_loop(flow, &form)?;
        match super::matrix::plan(flow, &form) {
            Some(matrix) => {
                s.insert_str(0, super::matrix::helpers());
                s.push_str(&super::matrix::page_loop(flow, &matrix, &lane_loop)?);
            }
            None => s.push_str(&lane_loop),
        }
        s.push_str(SELECT);
        return Ok(s);
    }
    if let Some((read, _)) = &staged {
        s.push_str(&stage_decls(read));
        s.push_str(&stage_tiles(read, "row.sinks", "lo", "hi"));
    } else {
        // Two pages a thread in flight, so that one page's loads wait behind the other's, where
        // the held words leave the registers for it.
        let held_words: usize = leaves.held.iter().map(|&(_, w)| w).sum();
        if held_words <= MAX_HELD_WORDS / 2 {
            s.push_str("#pragma unroll 2\n");
        }
        s.push_str(
            "    for (int i = lo + threadIdx.x; i < hi; i += TOPK_THREADS) {
        const int lp = row.sinks + i;
        const unsigned long long field_base = (unsigned long long)row.head * num_pages + logical[lp];
        (void)lp; (void)field_base;
",
        );
        for &(f, words) in &leaves.held {
            s.push_str(&held_load(f, words));
        }
    }
    let mut read_before = false;
    for (id, n) in g.nodes.iter().enumerate() {
        if is_leaf(&n.op) || !n.ty.per_page || leaves.inlined(id) {
            continue;
        }
        s.push_str(&per_page_array(g, &leaves, id, &mut read_before));
        s.push_str(&compute(flow, g, &leaves, id, By::Thread)?);
    }
    s.push_str(&store_key(&at(g, &leaves, index.score, "0", "0")?, None));
    s.push_str("    }\n");
    if staged.is_some() {
        s.push_str(STAGE_CLOSE);
    }
    s.push_str(SELECT);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vortex_flow::library::load;
    use vortex_flow::{Geometry, compile};

    /// The index kernel a thread a page, which flows without the lane form take.
    fn thread_form(flow: &Flow) -> Result<String, String> {
        index_kernel_in(flow, None)
    }

    /// A flow whose index phase reads one field `s` of `cols` columns of `dtype`.
    fn one_field(cols: usize, dtype: &str) -> Flow {
        let src = format!(
            "flow f \"test\"\npage s[1, {cols}] {dtype}\ncache:\n  s = mean(slice(K, cols, 0, {cols}), rows)\nindex:\n  score = max(dot(slice(q, cols, 0, {cols}), s), rows)\n  topk(score)\n"
        );
        compile("f.flow", &src, Geometry::default()).unwrap()
    }

    /// Small whole-word fields are loaded per page in the widest vectors their words allow; a
    /// field of odd bf16 elements, or one that is staged, keeps element-wise reads.
    #[test]
    fn small_fields_are_held_in_vector_loads() {
        let lsh = load("lsh", Geometry::default()).unwrap();
        assert_eq!(held(&lsh), vec![(0, 16)]);
        let src = thread_form(&lsh).unwrap();
        assert!(src.contains("reinterpret_cast<const uint4*>(f0) + field_base * 4 + v"));
        assert!(src.contains("vx_bf16_of(pf0["));
        for (cols, dtype, load) in [
            (6, "f32", Some("uint2")),
            (3, "f32", Some("unsigned int")),
            (2, "bf16", Some("unsigned int")),
            (3, "bf16", None),
            (16, "fp8", Some("uint4")),
            (4, "fp8", Some("unsigned int")),
            (6, "fp8", None),
        ] {
            let src = thread_form(&one_field(cols, dtype)).unwrap();
            match load {
                Some(ty) => assert!(
                    src.contains(&format!(
                        "const {ty} x = __ldg(reinterpret_cast<const {ty}*>(f0)"
                    )),
                    "{cols} {dtype}"
                ),
                None => {
                    assert!(!src.contains("pf0"), "{cols} {dtype}");
                    let ty = if dtype == "fp8" { "char" } else { "short" };
                    assert!(
                        src.contains(&format!("((const unsigned {ty}*)f0)")),
                        "{cols} {dtype}"
                    );
                }
            }
        }
        let double_sparse = load("double_sparse", Geometry::default()).unwrap();
        assert!(staging(&double_sparse).is_some());
        assert!(!thread_form(&double_sparse).unwrap().contains("pf0"));
    }

    /// Fields of a few hundred bytes a page are staged in two tile buffers: one is copied into
    /// (asynchronously, a warp's lanes over a page's words) while the other is scored. A page
    /// takes its fields twice and its id once; small fields are not staged.
    #[test]
    fn staged_fields_are_copied_while_the_tile_before_is_scored() {
        let flow = one_field(128, "f32");
        let (read, bytes) = staging(&flow).expect("512 bytes a page are staged");
        assert_eq!(read, vec![(0, 128)]);
        assert_eq!(bytes, (2 * 129 + 1) * 4);
        let src = thread_form(&flow).unwrap();
        assert!(src.contains("vx_copy_word(d + w, src + w)"));
        assert!(src.contains("for (int w = sub; w < 128; w += 32)"));
        assert!(src.contains("stage_copy(cnt1, b ? 0 : stage_buffer);"));
        assert!(src.contains("vx_copies_wait_one();"));
        assert!(src.contains("stage0[at + slot * 129 + "));
        // Fields of 16 words take 16 lanes a page, two pages a warp.
        let wide_enough = compile(
            "t.flow",
            "flow t \"test\"\npage a[1, 32] bf16\npage b[1, 32] bf16\npage c[1, 32] bf16\npage d[1, 32] bf16\ncache:\n  a = mean(slice(K, cols, 0, 32), rows)\n  b = max(slice(K, cols, 0, 32), rows)\n  c = min(slice(K, cols, 0, 32), rows)\n  d = mean(slice(K, cols, 32, 32), rows)\nindex:\n  topk(max(dot(slice(q, cols, 0, 32), a + b + c + d), rows))\n",
            Geometry::default(),
        )
        .unwrap();
        assert!(staging(&wide_enough).is_some());
        let src = thread_form(&wide_enough).unwrap();
        assert!(src.contains("for (int w = sub; w < 16; w += 16)"));
        assert!(src.contains("pg += TK_WARPS * 2"));
        assert!(
            staging(&one_field(64, "bf16")).is_none(),
            "128 bytes a page"
        );
    }

    /// The query heads go to shared memory where pages' scores read them (block_topk's dot
    /// with each centroid), not where only step values do (LSH's query bits).
    #[test]
    fn the_query_is_staged_where_pages_read_it() {
        let staged = |name: &str| {
            let src = thread_form(&load(name, Geometry::default()).unwrap()).unwrap();
            src.contains("const float* qg = qs;")
        };
        assert!(staged("block_topk"));
        assert!(staged("h2o"));
        assert!(!staged("lsh"));
    }

    /// Constants are read across a warp's lanes: global memory, not the constant bank.
    #[test]
    fn constants_live_in_global_memory() {
        let src = super::super::generate(&load("lsh", Geometry::default()).unwrap()).unwrap();
        assert!(src.contains("__device__ const unsigned int C0["));
        assert!(!src.contains("__constant__"));
        assert!(src.contains("__ldg(C0 + "));
    }

    /// Quest's score (two products of the query and an envelope, their maximum, its sum over
    /// the head's dims, the best head) keeps no per-page array of GROUP x HEAD_DIM: the
    /// products and their maximum are read in place by the sum. A flow whose elements feed two
    /// nodes, or a matrix product, keeps its arrays.
    #[test]
    fn single_use_elementwise_nodes_are_read_in_place() {
        let quest = load("quest", Geometry::default()).unwrap();
        let src = thread_form(&quest).unwrap();
        let g = Geometry::default();
        let wide = format!("[{}];", g.heads_q / g.heads_kv * g.head_dim);
        assert!(!src.contains(&wide), "a per-page array of {wide}");
        assert!(
            src.contains("fmaxf(((qg["),
            "the maximum of the products in place"
        );
        let index = &quest.index.as_ref().unwrap().graph;
        let inline = super::super::expr::inlinable(index, &|_| false);
        assert_eq!(inline.iter().filter(|&&x| x).count(), 3);
        let twice = compile(
            "t.flow",
            "flow t \"test\"\npage s[1, D] bf16\ncache:\n  s = mean(K, rows)\nindex:\n  p = q * s\n  score = max(sum(p, cols) + max(p, cols), rows)\n  topk(score)\n",
            g,
        )
        .unwrap();
        let src = thread_form(&twice).unwrap();
        assert!(src.contains(&wide), "p, read by two sums, keeps its array");
    }

    /// At head_dim 64 quest_fp8's envelopes (16 words each) are held in registers: the
    /// products and their maximum are still read in place, by a sum over the head's dims that
    /// keeps one accumulator a query head, its loop unrolled whole so that every index into the
    /// held words is a constant.
    #[test]
    fn register_held_fields_are_read_in_place_by_unrolled_sums() {
        let g = Geometry {
            heads_q: 14,
            heads_kv: 2,
            head_dim: 64,
            page_size: 16,
        };
        let flow = load("quest_fp8", g).unwrap();
        assert!(!held(&flow).is_empty(), "the envelopes are held");
        let src = thread_form(&flow).unwrap();
        let wide = format!("[{}];", g.group() * g.head_dim);
        assert!(!src.contains(&wide), "a per-page array of {wide}");
        assert!(src.contains(
            "_Pragma(\"unroll\") for (int j = 0; j < 64; j++) { _Pragma(\"unroll\") for (int el = 0; el < 7; el++)"
        ));
        assert!(src.contains("acc[el] += fmaxf(((qg["));
        // Staged fields (head_dim 128) are read from shared memory: the loop is unrolled in part.
        let flow = load("quest_fp8", Geometry { head_dim: 128, ..g }).unwrap();
        let src = thread_form(&flow).unwrap();
        assert!(!src.contains("_Pragma(\"unroll\") for (int j = 0; j < 128;"));
        assert!(src.contains("_Pragma(\"unroll 8\") for (int j = 0; j < 128; j++)"));
    }

    /// Where two of a page's values read the query, the later one reads it from shared memory
    /// again (the compiler kept the first's reads live for it and spilled); where one does, and
    /// the others read the page's fields or values alone, there is no such read.
    #[test]
    fn a_second_read_of_the_query_reads_shared_memory_again() {
        let g = Geometry {
            heads_q: 9,
            heads_kv: 3,
            head_dim: 64,
            page_size: 16,
        };
        let fences = |src: &str| {
            compile("t.flow", src, g)
                .map(|flow| thread_form(&flow).unwrap())
                .unwrap()
                .matches(super::super::READ_SHARED_AGAIN)
                .count()
        };
        let two = "flow t \"test\"\npage c[1, D] bf16\npage m[1, D] fp8\ncache:\n  c = mean(K, rows)\n  m = max(K, rows)\nindex:\n  a = mean(q * c, cols)\n  b = min(q * m, cols)\n  topk(max(a - b, rows))\n";
        assert_eq!(fences(two), 1);
        let one = "flow t \"test\"\npage c[1, D] bf16\npage m[1, D] fp8\ncache:\n  c = mean(K, rows)\n  m = max(K, rows)\nindex:\n  a = mean(q * c, cols)\n  topk(max(a + max(m, cols), rows))\n";
        assert_eq!(fences(one), 0);
        for name in ["block_topk", "block_topk_fp8", "quest", "quest_fp8", "lsh"] {
            let flow = load(name, g).unwrap();
            let src = thread_form(&flow).unwrap();
            assert!(!src.contains(super::super::READ_SHARED_AGAIN), "{name}");
        }
    }

    /// An fp8 field is widened two values at a time (the hardware's conversion where it has
    /// one) once a step of the sum over the head's dims, which the query heads' accumulators
    /// share.
    #[test]
    fn fp8_fields_are_widened_once_for_every_query_head() {
        let flow = load("block_topk_fp8", Geometry::default()).unwrap();
        let src = thread_form(&flow).unwrap();
        assert!(!src.contains("kv_fp8_to_f32"));
        let sum = src
            .lines()
            .find(|l| l.contains("vx_fp8_of_pair("))
            .expect("the centroid is read");
        let group = Geometry::default().group();
        assert!(
            sum.contains(&format!(
                "for (int j = 0; j < {}; j++) {{ _Pragma(\"unroll\") for (int el = 0; el < {group}; el++)",
                Geometry::default().head_dim
            )),
            "{sum}"
        );
        assert_eq!(sum.matches("vx_fp8_of_pair(").count(), 1, "{sum}");
    }
}
