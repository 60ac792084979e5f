//! `ucrypt bench`: the seeds' experiments with progress, table, JSON and chart output.

use super::CliError;
use ucrypt::bench::{self, report, Settings, EXPERIMENTS};

/// Arguments of `ucrypt bench`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Experiments to run (default: all): cloudflare, parallel, alloc, sector-size.
    #[arg(value_parser = EXPERIMENTS)]
    experiments: Vec<String>,
    /// Fewer cells, shorter measurements: finishes in under a minute.
    #[arg(long)]
    quick: bool,
    /// Seconds per measurement (default 0.5, quick 0.1).
    #[arg(long)]
    seconds: Option<f64>,
    /// Repeats per variant, interleaved (default 5, quick 3).
    #[arg(long)]
    repeat: Option<usize>,
    /// Memory backend size in MiB (default 256, quick 32).
    #[arg(long)]
    region_mib: Option<u64>,
    /// Print JSON lines (one object per row) instead of the table.
    #[arg(long)]
    json: bool,
    /// Only cells with these request sizes in bytes (comma-separated, e.g. 65536,1048576).
    #[arg(long, value_delimiter = ',', value_name = "BYTES")]
    block: Vec<usize>,
    /// Only cells with these queue depths (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "N")]
    depth: Vec<usize>,
    /// Only reads or only writes.
    #[arg(long, value_parser = ["read", "write"])]
    op: Option<String>,
    /// Write an SVG chart of the ratios to raw here.
    #[arg(long, value_name = "FILE")]
    chart: Option<std::path::PathBuf>,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let s = Settings {
        secs: a.seconds.unwrap_or(if a.quick { 0.1 } else { 0.5 }),
        repeats: a.repeat.unwrap_or(if a.quick { 3 } else { 5 }).max(1),
        region: a.region_mib.unwrap_or(if a.quick { 32 } else { 256 }) << 20,
        quick: a.quick,
    };
    let names: Vec<&str> = if a.experiments.is_empty() {
        EXPERIMENTS.to_vec()
    } else {
        a.experiments.iter().map(String::as_str).collect()
    };
    let cells: Vec<_> = names
        .iter()
        .flat_map(|e| bench::cells(e, s.quick))
        .filter(|c| a.block.is_empty() || a.block.contains(&c.block))
        .filter(|c| a.depth.is_empty() || a.depth.contains(&c.depth))
        .filter(|c| match a.op.as_deref() {
            Some("read") => c.op == bench::load::Op::Read,
            Some("write") => c.op == bench::load::Op::Write,
            _ => true,
        })
        .collect();
    if cells.is_empty() {
        return Err(anyhow::anyhow!(
            "no cell of the chosen experiments matches --block/--depth/--op"
        )
        .into());
    }
    let total: u64 = cells
        .iter()
        .map(|c| ((c.variants.len() + 1) * s.repeats) as u64)
        .sum();
    // Measuring writes nothing that outlives the process: Ctrl-C ends it at once.
    let _exit = super::progress::ExitOnSignal::new();
    let bar = super::progress::Steps::new("bench", total);
    let mut rows = Vec::new();
    for cell in &cells {
        bar.message(format!(
            "{} {} bs={} depth={}",
            cell.experiment,
            cell.op.name(),
            cell.block,
            cell.depth
        ));
        rows.extend(bench::measure(cell, &s, &mut || bar.inc()).map_err(anyhow::Error::msg)?);
    }
    bar.finish();
    if a.json {
        print!("{}", report::json(&rows));
    } else {
        print!("{}", report::table(&rows));
        let misses = bench::auto_misses(&rows, 0.05);
        println!(
            "\nauto vs best fixed placement: within 5% in {} of {} cells",
            rows.iter().filter(|r| r.variant == "auto").count() - misses.len(),
            rows.iter().filter(|r| r.variant == "auto").count()
        );
        for (cell, auto, best, best_mib) in misses {
            println!("  {cell}: auto {auto:.1} MiB/s, {best} {best_mib:.1} MiB/s");
        }
    }
    if let Some(path) = &a.chart {
        let params = format!(
            "{} | {} s per measurement, {} repeats interleaved, {} MiB memory backend{} | {} CPUs | ucrypt {}",
            ucrypt::bench::chart::now_utc(),
            s.secs,
            s.repeats,
            s.region >> 20,
            if s.quick { ", --quick" } else { "" },
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            env!("CARGO_PKG_VERSION")
        );
        std::fs::write(path, report::svg(&rows, &params))
            .map_err(|e| anyhow::anyhow!("writing chart {}: {e}", path.display()))?;
        eprintln!("chart written to {}", path.display());
    }
    Ok(())
}
