//! SVG bar charts for `ucrypt bench --chart` and `ucrypt benchmark --chart`: panels of
//! grouped bars, one colour per variant across every panel (a single legend), the spread
//! of the repeats as an error bar on each bar, the run parameters and date under the
//! title, and every label laid out from its measured extent so none is clipped or
//! overlaps the next panel.
//!
//! Written by hand: it is one kind of chart, a few hundred lines of SVG text, and it spares
//! the build a plotting crate's dependency tree. Text extents are estimated (0.6 em per
//! character, wider than the average sans-serif glyph), so labels get room to spare.

use std::fmt::Write as _;

/// One bar: a variant's value in a group, with the spread of its repeats.
#[derive(Debug, Clone)]
pub struct Bar {
    /// Variant name (picks the colour; the legend lists each once).
    pub variant: String,
    /// The bar's height (the median).
    pub value: f64,
    /// Lowest of the repeats (bottom of the error bar).
    pub lo: f64,
    /// Highest of the repeats (top of the error bar).
    pub hi: f64,
    /// Extra text for the bar's tooltip.
    pub note: String,
}

/// Bars side by side under one label (a benchmark cell).
#[derive(Debug, Clone)]
pub struct Group {
    /// Label under the group (rotated).
    pub label: String,
    /// The bars.
    pub bars: Vec<Bar>,
}

/// One panel: a title, groups of bars, a y axis.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Panel title.
    pub title: String,
    /// Unit of the y axis (e.g. "x raw", "MiB/s").
    pub unit: String,
    /// A value drawn as a dashed reference line (1.0 = raw passthrough).
    pub reference: Option<f64>,
    /// Logarithmic y axis (ticks at powers of ten): for values spanning decades, such as
    /// cipher throughputs from 50 to 10000 MiB/s.
    pub log: bool,
    /// The groups, left to right.
    pub groups: Vec<Group>,
}

/// The colours, in order of the variants' first appearance (Tableau 10 plus two; the
/// first is neutral grey for the baseline variant that usually comes first).
const COLORS: [&str; 12] = [
    "#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#bcbd22", "#17becf", "#393b79", "#637939",
];

const BAR: f64 = 11.0;
const GAP: f64 = 16.0;
const PLOT_H: f64 = 180.0;
const LABEL_FONT: f64 = 9.0;
const FONT: f64 = 10.0;
const ANGLE_DEG: f64 = 35.0;

/// Width of a group's bars: at least enough that neighbouring rotated labels (9 px type
/// at 35 degrees) stand apart.
fn slot(g: &Group) -> f64 {
    (g.bars.len() as f64 * BAR).max(2.0 * BAR)
}

/// Estimated width in pixels of `text` at `font` pixels.
fn text_w(text: &str, font: f64) -> f64 {
    text.chars().count() as f64 * font * 0.6
}

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Tick step: 1, 2 or 5 times a power of ten, about `n` ticks up to `max`.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(f64::MIN_POSITIVE);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

fn tick_label(v: f64, step: f64) -> String {
    let digits = if step >= 1.0 {
        0
    } else if step >= 0.1 {
        1
    } else {
        2
    };
    format!("{v:.digits$}")
}

/// Renders `panels` under `title`, with `params` (run parameters and date) on the line
/// below it.
pub fn render(title: &str, params: &str, panels: &[Panel]) -> String {
    // One colour per variant, across every panel.
    let mut variants: Vec<&str> = Vec::new();
    for b in panels.iter().flat_map(|p| &p.groups).flat_map(|g| &g.bars) {
        if !variants.contains(&b.variant.as_str()) {
            variants.push(&b.variant);
        }
    }
    let colour = |v: &str| {
        let i = variants.iter().position(|x| *x == v).unwrap_or(0);
        COLORS[i % COLORS.len()]
    };
    let (sin, cos) = ANGLE_DEG.to_radians().sin_cos();
    // Per panel: axis maximum, tick step, left margin (tick labels), label depth, width.
    struct Layout {
        /// Axis bottom (0, or a power of ten for a log axis) and top.
        min: f64,
        max: f64,
        step: f64,
        depth: f64,
        right: f64,
    }
    let mut left: f64 = 40.0;
    let mut layouts = Vec::new();
    for p in panels {
        let top = p
            .groups
            .iter()
            .flat_map(|g| &g.bars)
            .map(|b| b.hi.max(b.value))
            .chain(p.reference)
            .fold(0.0, f64::max);
        let (min, max, step) = if p.log {
            let bottom = p
                .groups
                .iter()
                .flat_map(|g| &g.bars)
                .map(|b| b.lo.min(b.value))
                .filter(|v| *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            let bottom = if bottom.is_finite() { bottom } else { 1.0 };
            let lo = 10f64.powf(bottom.log10().floor());
            let hi = 10f64.powf(top.max(lo * 10.0).log10().ceil());
            (lo, hi, 10.0)
        } else {
            let step = nice_step(top.max(1e-9) * 1.05, 5.0);
            (0.0, (top.max(1e-9) * 1.05 / step).ceil() * step, step)
        };
        let widest_tick = [min, max]
            .iter()
            .map(|v| {
                text_w(
                    &format!(
                        "{} {}",
                        tick_label(*v, if p.log { *v } else { step }),
                        p.unit
                    ),
                    FONT,
                )
            })
            .fold(0.0, f64::max);
        left = left.max(widest_tick + 12.0);
        layouts.push(Layout {
            min,
            max,
            step,
            depth: 0.0,
            right: 0.0,
        });
    }
    for (p, l) in panels.iter().zip(&mut layouts) {
        let mut x = left + 6.0;
        for g in &p.groups {
            let w = text_w(&g.label, LABEL_FONT);
            l.depth = l.depth.max(w * sin + LABEL_FONT * cos);
            l.right = l.right.max(x + w * cos + LABEL_FONT);
            x += slot(g) + GAP;
        }
        l.right = l.right.max(x);
    }
    // The legend: one row of swatches, wrapped to the chart's width.
    let mut width = layouts
        .iter()
        .map(|l| l.right)
        .fold(480.0, f64::max)
        .max(text_w(title, 14.0) + 20.0)
        .max(text_w(params, FONT) + 20.0)
        + 16.0;
    width = width.ceil();
    let mut legend = Vec::new();
    let (mut lx, mut ly) = (10.0, 62.0);
    for v in &variants {
        let w = 14.0 + text_w(v, FONT) + 18.0;
        if lx + w > width - 10.0 && lx > 10.0 {
            lx = 10.0;
            ly += 16.0;
        }
        legend.push((lx, ly, *v));
        lx += w;
    }
    let mut y0 = ly + 22.0;
    let mut s = String::new();
    let mut body = String::new();
    for (p, l) in panels.iter().zip(&layouts) {
        let plot_top = y0 + 22.0;
        let base = plot_top + PLOT_H;
        let y = |v: f64| {
            let f = if p.log {
                (v.max(l.min).log10() - l.min.log10()) / (l.max.log10() - l.min.log10())
            } else {
                v / l.max
            };
            base - PLOT_H * f.clamp(0.0, 1.0)
        };
        let _ = writeln!(
            body,
            "<text x=\"10\" y=\"{:.1}\" font-size=\"12\" font-weight=\"bold\">{}</text>",
            y0 + 12.0,
            esc(&p.title)
        );
        let plot_right = l.right.max(left + 100.0);
        let mut t = l.min;
        while t <= l.max * (1.0 + 1e-9) {
            // A log axis labels each power of ten with its own digits.
            let step = if p.log { t } else { l.step };
            let _ = writeln!(
                body,
                "<line x1=\"{left:.1}\" x2=\"{plot_right:.1}\" y1=\"{0:.1}\" y2=\"{0:.1}\" stroke=\"#e4e4e4\"/>\n<text x=\"{1:.1}\" y=\"{2:.1}\" text-anchor=\"end\">{3} {4}</text>",
                y(t),
                left - 4.0,
                y(t) + 3.5,
                tick_label(t, step),
                esc(&p.unit)
            );
            if p.log {
                t *= l.step;
            } else {
                t += l.step;
            }
        }
        if let Some(r) = p.reference {
            let _ = writeln!(
                body,
                "<line x1=\"{left:.1}\" x2=\"{plot_right:.1}\" y1=\"{0:.1}\" y2=\"{0:.1}\" stroke=\"#000\" stroke-dasharray=\"4 2\"/>",
                y(r)
            );
        }
        let mut x = left + 6.0;
        for g in &p.groups {
            let x0 = x;
            for b in &g.bars {
                let _ = writeln!(
                    body,
                    "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}: {}: {:.3} {} ({:.3}..{:.3}){}</title></rect>",
                    y(b.value),
                    BAR - 1.5,
                    base - y(b.value),
                    colour(&b.variant),
                    esc(&b.variant),
                    esc(&g.label),
                    b.value,
                    esc(&p.unit),
                    b.lo,
                    b.hi,
                    esc(&b.note)
                );
                if b.hi > b.lo {
                    let cx = x + (BAR - 1.5) / 2.0;
                    let _ = writeln!(
                        body,
                        "<path d=\"M{cx:.1} {0:.1}V{1:.1}M{2:.1} {0:.1}H{3:.1}M{2:.1} {1:.1}H{3:.1}\" stroke=\"#222\" stroke-width=\"1\" fill=\"none\"/>",
                        y(b.hi),
                        y(b.lo),
                        cx - 2.5,
                        cx + 2.5
                    );
                }
                x += BAR;
            }
            x = x0 + slot(g);
            let _ = writeln!(
                body,
                "<text transform=\"translate({:.1},{:.1}) rotate({ANGLE_DEG})\" font-size=\"{LABEL_FONT}\">{}</text>",
                x0 + 2.0,
                base + 10.0,
                esc(&g.label)
            );
            x += GAP;
        }
        y0 = base + 10.0 + l.depth + 20.0;
    }
    let height = (y0 + 10.0).ceil();
    let _ = writeln!(s, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\" font-size=\"{FONT}\">");
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"10\" y=\"22\" font-size=\"14\">{}</text>",
        esc(title)
    );
    let _ = writeln!(
        s,
        "<text x=\"10\" y=\"40\" fill=\"#444\">{}</text>",
        esc(params)
    );
    for (x, y, v) in legend {
        let _ = writeln!(
            s,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{y:.1}\">{}</text>",
            y - 9.0,
            colour(v),
            x + 14.0,
            esc(v)
        );
    }
    s.push_str(&body);
    s.push_str("</svg>\n");
    s
}

/// The current UTC date and time as `YYYY-MM-DD HH:MM UTC`.
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// `secs` since the epoch as `YYYY-MM-DD HH:MM UTC` (Howard Hinnant's `civil_from_days`,
/// written out rather than pulling a date crate in for one line of a chart).
fn utc(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        // `date -u -d @1795387200`: Sun Nov 22 22:40:00 UTC 2026.
        assert_eq!(utc(1_795_387_200), "2026-11-22 22:40 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00 UTC");
    }

    fn bar(v: &str, value: f64) -> Bar {
        Bar {
            variant: v.into(),
            value,
            lo: value * 0.9,
            hi: value * 1.1,
            note: String::new(),
        }
    }

    #[test]
    fn one_colour_per_variant_across_panels_with_error_bars() {
        let p1 = Panel {
            title: "one".into(),
            unit: "x".into(),
            reference: Some(1.0),
            log: false,
            groups: vec![Group {
                label: "read 4K <d1>".into(),
                bars: vec![bar("raw", 1.0), bar("auto", 0.8)],
            }],
        };
        // The second panel lists the variants in another order and adds one.
        let p2 = Panel {
            title: "two".into(),
            unit: "x".into(),
            reference: None,
            log: true,
            groups: vec![Group {
                label: "write".into(),
                bars: vec![bar("kernel", 0.5), bar("auto", 0.7), bar("raw", 1.0)],
            }],
        };
        let svg = render("t", "params & date", &[p1, p2]);
        let fill_of = |variant: &str| -> Vec<String> {
            svg.lines()
                .filter(|l| l.starts_with("<rect x") && l.contains(&format!("<title>{variant}:")))
                .map(|l| {
                    l.split("fill=\"")
                        .nth(1)
                        .unwrap()
                        .split('"')
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect()
        };
        for v in ["raw", "auto"] {
            let f = fill_of(v);
            assert_eq!(f.len(), 2, "{v}");
            assert_eq!(f[0], f[1], "{v} changes colour between panels");
        }
        assert_ne!(fill_of("raw")[0], fill_of("auto")[0]);
        assert_ne!(fill_of("kernel")[0], fill_of("auto")[0]);
        // One error bar per bar, escaped text, parameters present.
        assert_eq!(svg.matches("<path d=").count(), 5);
        assert!(svg.contains("read 4K &lt;d1&gt;") && svg.contains("params &amp; date"));
    }
}
