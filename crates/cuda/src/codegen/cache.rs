//! The generated cache phase: every field the flow summarises a page into, for each page and KV
//! head, from the page's keys and values in the pool (elements `kv_t`, read with `kv_get`:
//! `kernels/kv_elem.cu` is compiled in front).
//!
//! A warp takes a page and KV head (up to [`WARPS`] of them a block): each value of the
//! cache phase goes to the warp's shared memory, its lanes taking every 32nd element, so a
//! warp's reads of the page's keys are adjacent columns. A flow whose values would not fit
//! shared memory has one thread a page and KV head compute them in its own arrays instead.

use std::fmt::Write;

use vortex_flow::ir::{Flow, Input, Node, NodeId, Op};
use vortex_kv::KvDtype;

use super::expr::{Leaves, at, is_leaf};
use super::{By, compute, const_read};

/// Pages (warps) a block of the warp form, at most.
const WARPS: usize = 4;
/// Pages a block of the thread form.
const THREAD_PAGES: usize = 64;
/// Static shared memory a block may take.
const BLOCK_SHARED_BYTES: usize = 48 << 10;

struct CacheLeaves;

impl Leaves for CacheLeaves {
    fn leaf(&self, op: &Op, r: &str, c: &str) -> Option<String> {
        match op {
            Op::Input(Input::K) => {
                Some(format!("kv_get(kpool[kv_base + ({r}) * HEAD_DIM + ({c})])"))
            }
            Op::Input(Input::V) => {
                Some(format!("kv_get(vpool[kv_base + ({r}) * HEAD_DIM + ({c})])"))
            }
            Op::Const(k) => Some(const_read(*k, r, c)),
            _ => None,
        }
    }
    fn array(&self, id: NodeId, _: &Node) -> String {
        format!("n{id}")
    }
}

/// Warps a block of the warp form, a page each, where a page's values fit a block's shared
/// memory (at most [`WARPS`]); `None` where they do not, for the thread form.
fn warps(flow: &Flow) -> Option<usize> {
    let floats: usize = flow.cache.as_ref().map_or(0, |cache| {
        (cache.graph.nodes.iter())
            .filter(|n| !is_leaf(&n.op))
            .map(|n| n.ty.elems())
            .sum()
    });
    match BLOCK_SHARED_BYTES / (floats * 4).max(1) {
        0 => None,
        warps => Some(warps.min(WARPS)),
    }
}

/// The cache kernel's launch: pages a block and threads a block. A warp a page where its values
/// fit a block's shared memory (four of them where they fit), else a thread a page.
pub fn pages_per_block(flow: &Flow) -> (usize, usize) {
    match warps(flow) {
        Some(w) => (w, 32 * w),
        None => (THREAD_PAGES, THREAD_PAGES),
    }
}

pub(super) fn cache_kernel(flow: &Flow) -> Result<String, String> {
    let (pages, threads) = pages_per_block(flow);
    let warp = warps(flow).is_some();
    // One parameter a page field.
    let (fields, used) = super::params("void* ", "f", flow.fields.len());
    let (page, lane) = if warp {
        ("threadIdx.x / 32", "threadIdx.x % 32")
    } else {
        ("threadIdx.x", "0")
    };
    let mut s = format!(
        "extern \"C\" __global__ void __launch_bounds__({threads}) flow_cache(const kv_t* __restrict__ kpool,
    const kv_t* __restrict__ vpool, const unsigned int* __restrict__ pages, int n,
    int kv_heads, int num_pages{fields}) {{
    const int slot = {page}, lane = {lane};
    const int i = blockIdx.x * {pages} + slot;
    if (i >= n) return;
    const int h = blockIdx.y;
    const unsigned int page = pages[i];
    const unsigned long long kv_base = ((unsigned long long)page * kv_heads + h) * PAGE_SIZE * HEAD_DIM;
    (void)kv_base; (void)vpool; (void)lane;{used}
"
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
        let e = n.ty.elems();
        if warp {
            // The whole warp takes part or returns together, so __syncwarp sees every lane.
            let _ = writeln!(
                s,
                "    __shared__ float n{id}_w[{pages} * {e}];\n    float* n{id} = n{id}_w + slot * {e};"
            );
            s.push_str("    ");
            s.push_str(&compute(flow, g, &CacheLeaves, id, By::Lane)?);
            s.push_str("    __syncwarp();\n");
        } else {
            let _ = writeln!(s, "    float n{id}[{e}];");
            s.push_str("    ");
            s.push_str(&compute(flow, g, &CacheLeaves, id, By::Thread)?);
        }
    }
    let (from, step) = if warp { ("lane", "32") } else { ("0", "1") };
    for &(f, id) in &cache.outputs {
        let spec = &flow.fields[f];
        let value = at(g, &CacheLeaves, id, "r", "c")?;
        let idx = format!(
            "((unsigned long long)h * num_pages + page) * {} + el",
            spec.elems(),
        );
        let store = match spec.dtype {
            KvDtype::F32 => format!("((float*)f{f})[{idx}] = {value};"),
            KvDtype::Fp8 => format!("((unsigned char*)f{f})[{idx}] = kv_f32_to_fp8({value});"),
            KvDtype::F16 => format!("((unsigned short*)f{f})[{idx}] = vx_to_f16({value});"),
            KvDtype::Bf16 => format!("((unsigned short*)f{f})[{idx}] = vx_to_bf16({value});"),
        };
        let _ = writeln!(
            s,
            "    for (int el = {from}; el < {}; el += {step}) {{ const int r = el / {c}, c = el % {c}; (void)r; (void)c; {store} }}",
            spec.elems(),
            c = spec.cols
        );
    }
    s.push_str("}\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vortex_flow::library::load;
    use vortex_flow::{Geometry, compile};

    /// A page's values go to its warp's shared memory, the lanes over their elements; values
    /// past a block's shared memory stay in a thread's own arrays.
    #[test]
    fn a_warp_summarises_a_page_where_its_values_fit_shared_memory() {
        let lsh = load("lsh", Geometry::default()).unwrap();
        assert_eq!(pages_per_block(&lsh), (WARPS, 32 * WARPS));
        let src = cache_kernel(&lsh).unwrap();
        assert!(src.contains("for (int el = lane; el < "));
        assert!(src.contains("__syncwarp();"));
        let g = Geometry {
            head_dim: 256,
            ..Geometry::default()
        };
        let cubes = "flow t \"test\"\npage s[1, D] f32\ncache:\n  a = K * K\n  b = a * K\n  c = b * a\n  s = mean(c, rows)\nindex:\n  topk(max(dot(q, s), rows))\n";
        let flow = compile("t.flow", cubes, g).unwrap();
        assert_eq!(pages_per_block(&flow), (THREAD_PAGES, THREAD_PAGES));
        let src = cache_kernel(&flow).unwrap();
        assert!(!src.contains("__syncwarp();"));
        assert!(src.contains("for (int el = 0; el < "));
        let two = compile(
            "t.flow",
            &cubes.replace("  c = b * a\n  s = mean(c", "  s = mean(b"),
            g,
        )
        .unwrap();
        assert_eq!(
            pages_per_block(&two),
            (1, 32),
            "two values of 16 KiB and one of 1 KiB"
        );
    }
}
