//! Every complete flow in docs/FLOWS.md (a fenced block starting with a `flow` line, after
//! comments) checks for a real model geometry, as the documentation says it does.

use vortex_flow::{Geometry, compile};

#[test]
fn flows_in_the_documentation_check() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/FLOWS.md"))
        .unwrap();
    let mut blocks = Vec::new();
    let mut cur: Option<Vec<String>> = None;
    for line in doc.lines() {
        let t = line.trim_start();
        if t.starts_with("```") {
            match cur.take() {
                Some(b) => blocks.push(b),
                None => cur = Some(Vec::new()),
            }
        } else if let Some(b) = &mut cur {
            // Blocks inside numbered steps are indented: strip the step's indent.
            b.push(line.strip_prefix("   ").unwrap_or(line).to_string());
        }
    }
    let flows: Vec<String> = blocks
        .into_iter()
        .map(|b| b.join("\n"))
        .filter(|b| {
            b.lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with('#'))
                .is_some_and(|l| l.starts_with("flow "))
        })
        .collect();
    assert!(flows.len() >= 2, "the first flow and the worked example");
    let smollm2 = Geometry {
        heads_q: 9,
        heads_kv: 3,
        head_dim: 64,
        page_size: 16,
    };
    for f in &flows {
        for g in [Geometry::default(), smollm2] {
            if let Err(e) = compile("FLOWS.md", f, g) {
                panic!("{}\n{f}", e.render());
            }
        }
    }
}
