use vortex_flow::Geometry;
use vortex_flow::library::{BUILTIN, load};

#[test]
fn every_builtin_checks_for_common_geometries() {
    for (heads_q, heads_kv, head_dim, page_size) in [
        (32, 8, 128, 16),
        (9, 3, 64, 16),
        (14, 2, 64, 1),
        (8, 8, 64, 64),
        (40, 8, 128, 256),
    ] {
        let g = Geometry {
            heads_q,
            heads_kv,
            head_dim,
            page_size,
        };
        for (name, _) in BUILTIN {
            if let Err(e) = load(name, g) {
                panic!("{name} for {g:?}:\n{e}");
            }
        }
    }
}
