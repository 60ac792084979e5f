//! `ucrypt bench`: the seeds' experiments, in process, against a raw passthrough of the
//! same backend measured in the same run (see BENCHMARKING.md for how to read it).
//!
//! ```text
//! experiments.rs  cells × variants (placements, write orders, pools, sector sizes)
//!      │ measure(): raw and every variant, interleaved, repeated → medians, spread, ratio
//! load.rs         iodepth threads of synchronous random I/O over a memory backend; or one
//!                 thread keeping a queue full (asynchronous where the device allows)
//! report.rs       table │ JSON lines │ SVG chart
//! device.rs       --table LINE: the line's volume against its own device (e.g. librbd),
//!                 in process, one load generator for both
//! ```

pub mod chart;
pub mod cipher;
pub mod device;
pub mod experiments;
pub mod load;
pub mod report;

pub use experiments::{cells, measure, Cell, Row, Settings, Variant, EXPERIMENTS};

/// Whether the automatic policy is within `tolerance` (e.g. 0.05) of the best fixed
/// placement in a cell; returns (cell label, auto MiB/s, best variant, best MiB/s) for
/// every cell where it is not.
pub fn auto_misses(rows: &[Row], tolerance: f64) -> Vec<(String, f64, &'static str, f64)> {
    let mut misses = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let c = &rows[i].cell;
        let group: Vec<&Row> = rows[i..].iter().take_while(|r| r.cell.same_as(c)).collect();
        i += group.len();
        let Some(auto) = group.iter().find(|r| r.variant == "auto") else {
            continue;
        };
        let best = group
            .iter()
            .filter(|r| r.variant != "auto" && r.variant != "raw")
            .max_by(|a, b| a.median.mib_s().total_cmp(&b.median.mib_s()));
        if let Some(best) = best {
            if auto.median.mib_s() < best.median.mib_s() * (1.0 - tolerance) {
                misses.push((
                    format!(
                        "{} {} bs={} depth={}",
                        c.experiment,
                        c.op.name(),
                        c.block,
                        c.depth
                    ),
                    auto.median.mib_s(),
                    best.variant,
                    best.median.mib_s(),
                ));
            }
        }
    }
    misses
}
