//! A small SVG line-chart writer: panels side by side, each with axes, ticks, labels and a legend.

use std::fmt::Write;

const PANEL_W: f64 = 440.0;
const PANEL_H: f64 = 346.0;
const HEADER: f64 = 34.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 18.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 52.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// One line of a panel.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

/// How the x axis is laid out.
pub enum XAxis {
    /// Values as they are, with round ticks.
    Numeric,
    /// Evenly spaced named positions; a point's x is the index of its category.
    Categories(Vec<String>),
}

pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_axis: XAxis,
    /// The y axis starts at 0 whatever the data.
    pub y_from_zero: bool,
    /// The top of the y axis (1 for a CDF); otherwise the data's maximum and some headroom.
    pub y_max: Option<f64>,
    /// Draw a dot at each point.
    pub markers: bool,
    pub series: Vec<Series>,
}

/// Text made safe for XML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Round ticks covering `[lo, hi]`: a step of 1, 2 or 5 times a power of ten giving about
/// `target` intervals. Returns the widened range and the ticks.
pub fn nice_ticks(lo: f64, hi: f64, target: usize) -> (f64, f64, f64, Vec<f64>) {
    let (mut lo, mut hi) = if lo.is_finite() && hi.is_finite() && lo <= hi {
        (lo, hi)
    } else {
        (0.0, 1.0)
    };
    if hi - lo < 1e-12 * hi.abs().max(1.0) {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        lo -= pad;
        hi += pad;
    }
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    let lo = (lo / step).floor() * step;
    let hi = (hi / step).ceil() * step;
    let n = ((hi - lo) / step).round() as usize;
    let ticks = (0..=n).map(|i| lo + i as f64 * step).collect();
    (lo, hi, step, ticks)
}

fn tick_label(v: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let s = format!("{v:.decimals$}");
    if s.starts_with('-') && s.trim_start_matches(['-', '0', '.']).is_empty() {
        s[1..].to_string()
    } else {
        s
    }
}

/// The empirical CDF of `values` as stair points, at most about `max_points` of them.
pub fn cdf_points(values: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return Vec::new();
    }
    let steps = n.min(max_points.max(1));
    let mut points = vec![(v[0], 0.0)];
    for k in 1..=steps {
        // Rank of the k-th of `steps` even steps of the CDF.
        let i = (k * n).div_ceil(steps) - 1;
        let y = (i + 1) as f64 / n as f64;
        let prev = points.last().unwrap().1;
        points.push((v[i], prev));
        points.push((v[i], y));
    }
    points
}

/// The whole picture: `title` over `panels` laid side by side.
pub fn render(title: &str, panels: &[Panel]) -> String {
    let width = PANEL_W * panels.len().max(1) as f64;
    let height = HEADER + PANEL_H;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">
<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>
<text x="{:.1}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        width / 2.0,
        escape(title)
    );
    for (i, p) in panels.iter().enumerate() {
        panel(&mut s, p, i as f64 * PANEL_W, HEADER);
    }
    s.push_str("</svg>\n");
    s
}

fn panel(s: &mut String, p: &Panel, x0: f64, y0: f64) {
    let (px, py) = (x0 + LEFT, y0 + TOP);
    let (pw, ph) = (PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM);
    let finite = |&&(x, y): &&(f64, f64)| x.is_finite() && y.is_finite();
    let all: Vec<(f64, f64)> = p
        .series
        .iter()
        .flat_map(|se| se.points.iter().filter(finite).copied())
        .collect();
    let fold = |f: fn(&(f64, f64)) -> f64| {
        all.iter()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(v), b.max(v))
            })
    };
    let (mut ylo, mut yhi) = fold(|p| p.1);
    if p.y_from_zero || all.is_empty() {
        ylo = ylo.min(0.0);
    }
    match p.y_max {
        Some(top) => yhi = top,
        None if yhi > ylo => yhi += (yhi - ylo) * 0.08,
        None => {}
    }
    let (ylo, yhi, ystep, yticks) = nice_ticks(ylo, yhi.max(ylo), 5);
    let (xlo, xhi, xticks): (f64, f64, Vec<(f64, String)>) = match &p.x_axis {
        XAxis::Numeric => {
            let (lo, hi) = fold(|p| p.0);
            let (lo, hi, step, ticks) = nice_ticks(lo, hi, 5);
            let ticks = ticks.iter().map(|&t| (t, tick_label(t, step))).collect();
            (lo, hi, ticks)
        }
        XAxis::Categories(names) => {
            let ticks = names
                .iter()
                .enumerate()
                .map(|(i, n)| (i as f64, n.clone()))
                .collect();
            (-0.5, names.len().max(1) as f64 - 0.5, ticks)
        }
    };
    let sx = |x: f64| px + (x - xlo) / (xhi - xlo) * pw;
    let sy = |y: f64| py + ph - (y - ylo) / (yhi - ylo) * ph;

    let _ = writeln!(
        s,
        r#"<g><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13" font-weight="bold">{}</text>"#,
        px + pw / 2.0,
        y0 + 16.0,
        escape(&p.title)
    );
    // Grid and ticks.
    for &t in &yticks {
        let y = sy(t);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            px + pw,
            px - 6.0,
            y + 4.0,
            escape(&tick_label(t, ystep))
        );
    }
    for (t, label) in &xticks {
        let x = sx(*t);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{py:.1}" x2="{x:.1}" y2="{:.1}" stroke="#e5e5e5"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            py + ph,
            py + ph + 17.0,
            escape(label)
        );
    }
    // Axes and their labels.
    let _ = writeln!(
        s,
        r##"<rect x="{px:.1}" y="{py:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#333"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>
<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
        px + pw / 2.0,
        py + ph + 38.0,
        escape(&p.x_label),
        x0 + 16.0,
        py + ph / 2.0,
        escape(&p.y_label)
    );
    // Lines and dots.
    let dash = |se: &Series| {
        if se.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        }
    };
    for (i, se) in p.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = se
            .points
            .iter()
            .filter(finite)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if pts.len() > 1 {
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{}/>"#,
                pts.join(" "),
                dash(se)
            );
        }
        if p.markers || pts.len() == 1 {
            for pt in &pts {
                let (x, y) = pt.split_once(',').unwrap();
                let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="3.5" fill="{color}"/>"#);
            }
        }
    }
    // The legend: one row between the title and the plot.
    let mut lx = px;
    let ly = y0 + 38.0;
    for (i, se) in p.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 22.0,
            dash(se),
            lx + 28.0,
            ly + 4.0,
            escape(&se.name)
        );
        lx += 44.0 + 6.8 * se.name.chars().count() as f64;
    }
    s.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks that every tag is closed in order, attributes are quoted, and `&` only starts an
    /// entity: enough of XML to catch a broken writer.
    fn assert_well_formed(svg: &str) {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = svg;
        let mut root_seen = false;
        while let Some(open) = rest.find('<') {
            check_text(&rest[..open]);
            let close = rest[open..].find('>').expect("unclosed tag") + open;
            let tag = &rest[open + 1..close];
            rest = &rest[close + 1..];
            if tag.starts_with('?') {
                assert!(tag.ends_with('?'));
                continue;
            }
            assert!(!tag.contains('<'), "'<' inside tag {tag}");
            assert_eq!(
                tag.matches('"').count() % 2,
                0,
                "unbalanced quotes in {tag}"
            );
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
                continue;
            }
            let name: String = tag.chars().take_while(|c| c.is_alphanumeric()).collect();
            assert!(!name.is_empty(), "empty tag name in <{tag}>");
            check_text(tag);
            if stack.is_empty() {
                assert!(!root_seen, "two root elements");
                root_seen = true;
            }
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        check_text(rest);
        assert!(rest.trim().is_empty());
        assert!(stack.is_empty(), "unclosed: {stack:?}");
        assert!(root_seen);
        for bad in ["NaN", "\"inf", "inf\"", ",inf", "inf,", "-inf"] {
            assert!(!svg.contains(bad), "non-finite number: {bad}");
        }
    }

    fn check_text(t: &str) {
        for (i, _) in t.match_indices('&') {
            let ent = &t[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| ent.starts_with(e)),
                "bare & in {t}"
            );
        }
    }

    fn line(name: &str, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            dashed: false,
        }
    }

    #[test]
    fn sweep_and_cdf_are_well_formed() {
        let sweep = Panel {
            title: "Throughput <output> & \"tokens\"".into(),
            x_label: "offered rate (req/s)".into(),
            y_label: "tokens/s".into(),
            x_axis: XAxis::Categories(vec!["0.5".into(), "1".into(), "inf".into()]),
            y_from_zero: true,
            y_max: None,
            markers: true,
            series: vec![line(
                "out tok/s",
                vec![(0.0, 10.0), (1.0, 19.5), (2.0, 31.0)],
            )],
        };
        let ttft: Vec<f64> = (0..5000).map(|i| (i as f64).sqrt()).collect();
        let cdf = Panel {
            title: "TTFT".into(),
            x_label: "ms".into(),
            y_label: "share of requests".into(),
            x_axis: XAxis::Numeric,
            y_from_zero: true,
            y_max: Some(1.0),
            markers: false,
            series: vec![
                line("TTFT", cdf_points(&ttft, 400)),
                Series {
                    dashed: true,
                    ..line(
                        "odd",
                        vec![(f64::NAN, 1.0), (2.0, f64::INFINITY), (3.0, 0.5)],
                    )
                },
                line("empty", vec![]),
            ],
        };
        let svg = render("bench <serve> & co", &[sweep, cdf]);
        assert_well_formed(&svg);
        assert!(svg.contains("&lt;output&gt; &amp; &quot;tokens&quot;"));
        assert!(svg.contains("<polyline") && svg.contains("<circle"));
        assert!(svg.contains(">inf</text>"));
    }

    #[test]
    fn empty_and_flat_panels_still_render() {
        let flat = Panel {
            title: "flat".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_axis: XAxis::Numeric,
            y_from_zero: false,
            y_max: None,
            markers: true,
            series: vec![line("one", vec![(5.0, 5.0)])],
        };
        let empty = Panel {
            title: "empty".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_axis: XAxis::Categories(vec![]),
            y_from_zero: true,
            y_max: None,
            markers: true,
            series: vec![],
        };
        assert_well_formed(&render("t", &[flat, empty]));
        assert_well_formed(&render("none", &[]));
    }

    #[test]
    fn ticks_are_round_and_cover() {
        let (lo, hi, step, t) = nice_ticks(3.0, 97.0, 5);
        assert_eq!((lo, hi, step), (0.0, 100.0, 20.0));
        assert_eq!(t.len(), 6);
        let (lo, hi, _, _) = nice_ticks(0.0, 0.0, 5);
        assert!(lo < 0.0 && hi > 0.0);
        let (_, _, step, t) = nice_ticks(0.0, 1.0, 5);
        assert_eq!(tick_label(t[1], step), "0.2");
        assert_eq!(tick_label(-0.0, 1.0), "0");
    }

    #[test]
    fn cdf_ends_at_one() {
        let p = cdf_points(&[3.0, 1.0, 2.0], 100);
        assert_eq!(p.first(), Some(&(1.0, 0.0)));
        assert_eq!(p.last(), Some(&(3.0, 1.0)));
        let many: Vec<f64> = (0..100_000).map(f64::from).collect();
        let p = cdf_points(&many, 500);
        assert!(p.len() <= 1001);
        assert_eq!(p.last(), Some(&(99_999.0, 1.0)));
        assert!(p.windows(2).all(|w| w[1].0 >= w[0].0 && w[1].1 >= w[0].1));
        assert!(cdf_points(&[], 10).is_empty());
    }
}
