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
        "{:<12} {:<24} {:<9} {:>5} {:>5} {:>6} {:<22} {:<17} {:>10} {:>10} {:>19} {:>7} {:>7}",
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
        "x raw",
        "x base"
    );
    for r in rows {
        let c = &r.cell;
        let _ = writeln!(
            out,
            "{:<12} {:<24} {:<9} {:>5} {:>5} {:>6} {:<22} {:<17} {:>10.1} {:>10.0} {:>9.1}..{:<9.1} {:>7.3} {:>7}",
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
            r.ratio_to_raw,
            r.ratio_to_base.map_or("-".into(), |b| format!("{b:.3}"))
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
            "{{\"experiment\":\"{}\",\"variant\":\"{}\",\"op\":\"{}\",\"block_size\":{},\"iodepth\":{},\"sector_size\":{},\"cipher\":\"{}\",\"backend\":\"{}\",\"mib_s\":{:.2},\"iops\":{:.1},\"spread_mib_s\":[{:.2},{:.2}],\"ratio_to_raw\":{:.4}{}}}",
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
            r.ratio_to_raw,
            r.ratio_to_base
                .map_or(String::new(), |b| format!(",\"ratio_to_base\":{b:.4}"))
        );
    }
    out
}

/// The chart ([`super::chart`]): a panel per experiment, a group per cell, a bar per
/// variant at its ratio to the raw passthrough (1.0 = raw, dashed), the spread of its
/// repeats (lowest..highest MiB/s, scaled by the same ratio) as an error bar; `params`
/// (run parameters and date) under the title.
pub fn svg(rows: &[Row], params: &str) -> String {
    use super::chart::{Bar, Group, Panel};
    let mut panels: Vec<Panel> = Vec::new();
    let mut prev: Option<&Row> = None;
    for r in rows {
        if !panels.iter().any(|p| p.title == r.cell.experiment) {
            panels.push(Panel {
                title: r.cell.experiment.to_string(),
                unit: "x".into(),
                reference: Some(1.0),
                log: false,
                groups: Vec::new(),
            });
        }
        let Some(p) = panels.iter_mut().find(|p| p.title == r.cell.experiment) else {
            continue;
        };
        let median = r.median.mib_s();
        let scale = if median > 0.0 {
            r.ratio_to_raw / median
        } else {
            0.0
        };
        let bar = Bar {
            variant: r.variant.to_string(),
            value: r.ratio_to_raw,
            lo: r.spread.0 * scale,
            hi: r.spread.1 * scale,
            note: format!(
                "; {:.1} MiB/s, repeats {:.1}..{:.1} MiB/s",
                median, r.spread.0, r.spread.1
            ),
        };
        if prev.is_some_and(|q: &Row| q.cell.same_as(&r.cell)) {
            if let Some(g) = p.groups.last_mut() {
                g.bars.push(bar);
            }
        } else {
            p.groups.push(Group {
                label: label(r),
                bars: vec![bar],
            });
        }
        prev = Some(r);
    }
    super::chart::render(
        "ucrypt bench: throughput relative to the raw backend (median of the repeats; error bars: lowest..highest)",
        params,
        &panels,
    )
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
