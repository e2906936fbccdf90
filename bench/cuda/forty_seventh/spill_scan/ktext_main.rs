use vortex_cuda::attention::{Variant, module_spec_with};
use vortex_cuda::block_topk::{self, Summary};
use vortex_cuda::{PoolDtype, h2o, kv_pool, layer_kernels, page_mass, prefill, prefill_shape};
use vortex_kv::KvGeometry;

fn main() {
    let dir = std::env::args().nth(1).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let mut specs = vec![];
    // (kv heads, head_dim, page, group): model geometries
    for (kvh, hd, page, group) in [
        (8, 128, 16, 4), (8, 128, 16, 2), (1, 256, 16, 4), (4, 256, 16, 2), (8, 256, 16, 2),
        (3, 64, 16, 3), (2, 64, 16, 7), (8, 128, 16, 1), (8, 64, 16, 4), (16, 128, 16, 2),
        (2, 128, 16, 7), (1, 256, 16, 8),
    ] {
        let g = KvGeometry::new(kvh, hd, page).unwrap();
        for d in [PoolDtype::Bf16, PoolDtype::Fp8] {
            let tag = format!("{kvh}x{hd}p{page}g{group}_{d}");
            for (w, mb, pf) in [(4, 3, false), (8, 1, true)] {
                for skips in [false, true] {
                    specs.push((format!("{tag}_attn_{w}_{skips}"), module_spec_with(g, d, group, Variant { warps: w, min_blocks: mb, prefetch: pf }, skips).text()));
                }
            }
            specs.push((format!("{tag}_kv_pool"), kv_pool::module_spec(g, d).text()));
            if let Ok(s) = page_mass::module_spec(g, d, group, (9, 0)) { specs.push((format!("{tag}_page_mass"), s.text())); }
            specs.push((format!("{tag}_layer"), layer_kernels::module_spec(hd, page, d).text()));
            let shape = prefill::on_tensor_cores(hd, group, (9, 0)).then(|| prefill_shape::MmaShape::choose(hd, d, 227 << 10, 228 << 10)).flatten();
            if prefill::fits(hd, group) || shape.is_some() {
                specs.push((format!("{tag}_prefill"), prefill::module_spec(g, d, group, shape).text()));
            }
        }
        if 32 % (hd / 8) == 0 {
            for (n, s) in [("c", Summary::Centroid), ("cf", Summary::CentroidFp8), ("mm", Summary::MinMax), ("mmf", Summary::MinMaxFp8)] {
                specs.push((format!("{kvh}x{hd}g{group}_btk_{n}"), block_topk::module_spec(g, kvh * group, s).text()));
            }
            specs.push((format!("{kvh}x{hd}g{group}_h2o"), h2o::module_spec(g, kvh * group).text()));
        }
    }
    for (n, t) in specs {
        std::fs::write(format!("{dir}/{n}.cu"), t).unwrap();
    }
}
