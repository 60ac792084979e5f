//! Printing results: a table for people, JSON lines for scripts, an SVG chart for a glance.
//!
//! The chart is written by hand: it is one kind of chart (grouped bars of the ratio to the
//! raw passthrough, one panel per experiment), a few dozen lines of SVG text, and it spares
//! the build the plotting crates' dependency tree.

use super::experiments::Row;
use std::fmt::Write as _;

fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1024 && b % 1024 == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// The human-readable table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<12} {:<24} {:<9} {:>5} {:>5} {:>6} {:<22} {:<17} {:>10} {:>10} {:>19} {:>7}",
        "experiment",
        "variant",
        "op",
        "bs",
        "depth",
        "sector",
        "cipher",
        "backend",
        "MiB/s",
        "IOPS",
        "spread MiB/s",
        "x raw"
    );
    for r in rows {
        let c = &r.cell;
        let _ = writeln!(
            out,
            "{:<12} {:<24} {:<9} {:>5} {:>5} {:>6} {:<22} {:<17} {:>10.1} {:>10.0} {:>9.1}..{:<9.1} {:>7.3}",
            c.experiment,
            r.variant,
            c.op.name(),
            size(c.block),
            c.depth,
            size(c.sector as usize),
            c.cipher,
            c.store.name(),
            r.median.mib_s(),
            r.median.iops(),
            r.spread.0,
            r.spread.1,
            r.ratio_to_raw
        );
    }
    out
}

/// One JSON object per row.
pub fn json(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows {
        let c = &r.cell;
        let _ = writeln!(
            out,
            "{{\"experiment\":\"{}\",\"variant\":\"{}\",\"op\":\"{}\",\"block_size\":{},\"iodepth\":{},\"sector_size\":{},\"cipher\":\"{}\",\"backend\":\"{}\",\"mib_s\":{:.2},\"iops\":{:.1},\"spread_mib_s\":[{:.2},{:.2}],\"ratio_to_raw\":{:.4}}}",
            c.experiment,
            r.variant,
            c.op.name(),
            c.block,
            c.depth,
            c.sector,
            c.cipher,
            c.store.name(),
            r.median.mib_s(),
            r.median.iops(),
            r.spread.0,
            r.spread.1,
            r.ratio_to_raw
        );
    }
    out
}

const COLORS: [&str; 8] = [
    "#888888", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
];

/// The chart: per experiment a panel of grouped bars (ratio to raw, raw = 1.0 line).
pub fn svg(rows: &[Row]) -> String {
    let bar = 9.0;
    let gap = 14.0;
    let panel_h = 230.0;
    let left = 50.0;
    let mut experiments: Vec<&str> = Vec::new();
    for r in rows {
        if !experiments.contains(&r.cell.experiment) {
            experiments.push(r.cell.experiment);
        }
    }
    // Cells per experiment, in order, and the widest panel.
    let groups = |e: &str| -> Vec<Vec<&Row>> {
        let mut g: Vec<Vec<&Row>> = Vec::new();
        for r in rows.iter().filter(|r| r.cell.experiment == e) {
            let same = g.last().is_some_and(|last| last[0].cell.same_as(&r.cell));
            if same {
                if let Some(l) = g.last_mut() {
                    l.push(r);
                }
            } else {
                g.push(vec![r]);
            }
        }
        g
    };
    let width = experiments
        .iter()
        .map(|e| {
            groups(e)
                .iter()
                .map(|g| g.len() as f64 * bar + gap)
                .sum::<f64>()
        })
        .fold(600.0, f64::max)
        + left
        + 230.0;
    let height = experiments.len() as f64 * (panel_h + 40.0) + 40.0;
    let mut s = String::new();
    let _ = writeln!(s, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" font-family=\"sans-serif\" font-size=\"10\">");
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(s, "<text x=\"10\" y=\"20\" font-size=\"14\">ucrypt bench: throughput relative to the raw backend (median; 1.0 = raw passthrough)</text>");
    for (pi, e) in experiments.iter().enumerate() {
        let top = 40.0 + pi as f64 * (panel_h + 40.0);
        let gs = groups(e);
        let max = gs
            .iter()
            .flatten()
            .map(|r| r.ratio_to_raw)
            .fold(1.2, f64::max)
            .min(4.0);
        let y = |v: f64| top + 20.0 + (panel_h - 60.0) * (1.0 - v.min(max) / max);
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{:.0}\" font-size=\"12\" font-weight=\"bold\">{e}</text>",
            top + 12.0
        );
        for t in [0.0, 0.5, 1.0, max] {
            let _ = writeln!(s, "<line x1=\"{left}\" x2=\"{:.0}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"{}\" stroke-dasharray=\"{}\"/>", width - 230.0, y(t), y(t), if t == 1.0 { "#000" } else { "#ddd" }, if t == 1.0 { "4 2" } else { "" });
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{t:.1}x</text>",
                left - 4.0,
                y(t) + 3.0
            );
        }
        let mut x = left + 4.0;
        let mut legend: Vec<&str> = Vec::new();
        for g in &gs {
            let x0 = x;
            for r in g {
                let ci = legend
                    .iter()
                    .position(|v| *v == r.variant)
                    .unwrap_or_else(|| {
                        legend.push(r.variant);
                        legend.len() - 1
                    });
                let h = y(0.0) - y(r.ratio_to_raw);
                let _ = writeln!(s, "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"><title>{} {}: {:.1} MiB/s, {:.3}x raw</title></rect>", y(r.ratio_to_raw), bar - 1.0, COLORS[ci % COLORS.len()], r.variant, label(r), r.median.mib_s(), r.ratio_to_raw);
                x += bar;
            }
            let _ = writeln!(
                s,
                "<text transform=\"translate({:.1},{:.1}) rotate(35)\" font-size=\"9\">{}</text>",
                x0,
                y(0.0) + 10.0,
                label(g[0])
            );
            x += gap;
        }
        for (i, v) in legend.iter().enumerate() {
            let ly = top + 24.0 + i as f64 * 14.0;
            let lx = width - 220.0;
            let _ = writeln!(s, "<rect x=\"{lx}\" y=\"{:.0}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{:.0}\">{v}</text>", ly - 9.0, COLORS[i % COLORS.len()], lx + 14.0, ly);
        }
    }
    s.push_str("</svg>\n");
    s
}

fn label(r: &Row) -> String {
    let c = &r.cell;
    let cipher = if c.cipher.contains("null") {
        "null"
    } else {
        "aes"
    };
    format!(
        "{} {} d{} {} s{} {}",
        c.op.name().trim_start_matches("rand"),
        size(c.block),
        c.depth,
        cipher,
        size(c.sector as usize),
        c.store.name()
    )
}
