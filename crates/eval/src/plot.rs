//! An SVG plot of accuracy against context length: one panel per task, one line per flow.

use std::fmt::Write;

use crate::report::{Cell, short_len};

const COLORS: [&str; 10] = [
    "#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#17becf", "#7f7f7f",
];

/// The plot of `cells` (see [`crate::report::cells`]); `flows` in legend order, dense first.
pub fn svg(title: &str, cells: &[Cell], lengths: &[usize], flows: &[String]) -> String {
    let mut tasks: Vec<&str> = Vec::new();
    for c in cells {
        if !tasks.contains(&c.task.as_str()) {
            tasks.push(&c.task);
        }
    }
    let (pw, ph, m) = (260.0, 220.0, 45.0);
    let legend_w = 190.0;
    let width = m + tasks.len() as f64 * (pw + m) + legend_w;
    let height = ph + 2.0 * m + 30.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{m}" y="20" font-size="14">{}</text>"#,
        escape(title)
    );
    // Each base flow gets a colour; its budgets get dash patterns.
    let base = |f: &str| f.split(' ').next().unwrap_or(f).to_string();
    let mut bases: Vec<String> = Vec::new();
    let mut styles: Vec<(&str, &str)> = Vec::new();
    for f in flows {
        let b = base(f);
        let i = bases.iter().position(|x| *x == b).unwrap_or_else(|| {
            bases.push(b.clone());
            bases.len() - 1
        });
        let nth = flows
            .iter()
            .filter(|g| base(g) == b)
            .position(|g| g == f)
            .unwrap_or(0);
        styles.push((
            COLORS[i % COLORS.len()],
            ["", "6,3", "2,2", "8,2,2,2"][nth.min(3)],
        ));
    }
    let x_of = |i: usize| {
        if lengths.len() == 1 {
            pw / 2.0
        } else {
            10.0 + i as f64 * (pw - 20.0) / (lengths.len() - 1) as f64
        }
    };
    for (ti, task) in tasks.iter().enumerate() {
        let ox = m + ti as f64 * (pw + m);
        let oy = m + 20.0;
        let _ = writeln!(s, r#"<g transform="translate({ox},{oy})">"#);
        let _ = writeln!(
            s,
            r##"<rect width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="-6" text-anchor="middle" font-size="12">{}</text>"#,
            pw / 2.0,
            escape(task)
        );
        for k in 0..=4 {
            let y = ph - ph * k as f64 / 4.0;
            let _ = writeln!(
                s,
                r##"<line x1="0" x2="{pw}" y1="{y}" y2="{y}" stroke="#eee"/><text x="-4" y="{}" text-anchor="end">{}%</text>"##,
                y + 4.0,
                k * 25
            );
        }
        for (i, &l) in lengths.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
                x_of(i),
                ph + 14.0,
                short_len(l)
            );
        }
        for (f, (color, dash)) in flows.iter().zip(&styles) {
            let pts: Vec<String> = lengths
                .iter()
                .enumerate()
                .filter_map(|(i, &l)| {
                    let c = cells
                        .iter()
                        .find(|c| c.task == *task && &c.flow == f && c.length == l)?;
                    Some(format!("{:.1},{:.1}", x_of(i), ph - ph * c.accuracy))
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            let w = if f == &flows[0] { 2.5 } else { 1.5 };
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="{w}" stroke-dasharray="{dash}"/>"#,
                pts.join(" ")
            );
            for p in &pts {
                let (x, y) = p.split_once(',').unwrap();
                let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>"#);
            }
        }
        let _ = writeln!(s, "</g>");
    }
    let lx = m + tasks.len() as f64 * (pw + m);
    for (i, (f, (color, dash))) in flows.iter().zip(&styles).enumerate() {
        let y = m + 30.0 + i as f64 * 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" x2="{}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            y + 4.0,
            escape(f)
        );
    }
    let _ = writeln!(s, "</svg>");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
