//! The generated cache phase: one thread per page and KV head computes every field the flow
//! summarises the page into, from the page's keys and values in the pool (elements `kv_t`, read
//! with `kv_get`: `kernels/kv_elem.cu` is compiled in front).

use std::fmt::Write;

use vortex_flow::ir::{Flow, Input, Node, NodeId, Op};
use vortex_kv::KvDtype;

use super::expr::{Leaves, at, is_leaf};
use super::{By, compute, const_read};

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

pub(super) fn cache_kernel(flow: &Flow) -> Result<String, String> {
    // One parameter a page field.
    let (fields, used) = super::params("void* ", "f", flow.fields.len());
    let mut s = format!(
        "extern \"C\" __global__ void flow_cache(const kv_t* __restrict__ kpool,
    const kv_t* __restrict__ vpool, const unsigned int* __restrict__ pages, int n,
    int kv_heads, int num_pages{fields}) {{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int h = blockIdx.y;
    const unsigned int page = pages[i];
    const unsigned long long kv_base = ((unsigned long long)page * kv_heads + h) * PAGE_SIZE * HEAD_DIM;
    (void)kv_base; (void)vpool;{used}
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
            KvDtype::Fp8 => format!("((unsigned char*)f{f})[{idx}] = kv_f32_to_fp8({value});"),
            KvDtype::F16 => format!("((unsigned short*)f{f})[{idx}] = vx_to_f16({value});"),
            KvDtype::Bf16 => format!("((unsigned short*)f{f})[{idx}] = vx_to_bf16({value});"),
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
