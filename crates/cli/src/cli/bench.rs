//! `ucrypt bench`: the seeds' experiments with progress, table, JSON and chart output; or,
//! with `--table LINE`, a table line's volume against its own device, in process.

use super::CliError;
use ucrypt::bench::{self, report, Settings, EXPERIMENTS};

/// Arguments of `ucrypt bench`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Experiments to run (default: all): cloudflare, parallel, alloc, sector-size, uring,
    /// integrity (each authenticated mode against plain aes-xts-plain64: column `x base`).
    #[arg(value_parser = EXPERIMENTS)]
    experiments: Vec<String>,
    /// Instead of the experiments: measure this dm-crypt table line's volume (on any device:
    /// a file, an NBD export, rbd:POOL/IMAGE) against its device without the crypt layer
    /// over the same data area, in this process, one load generator for both (no NBD hop).
    /// Requests it writes land in the data area; the key is never printed.
    #[arg(long, value_name = "LINE", conflicts_with_all = ["experiments", "quick", "region_mib", "op", "chart"])]
    table: Option<String>,
    /// With --table: fio's rw names (comma-separated: randread, randwrite, read, write;
    /// default all four); random ones default to 4096-byte requests, sequential ones to 1 MiB.
    #[arg(long, requires = "table", value_delimiter = ',', value_parser = ["randread", "randwrite", "read", "write"])]
    rw: Vec<String>,
    /// With --table: measure only this side (default both, interleaved).
    #[arg(long, requires = "table", value_parser = ["raw", "ucrypt"])]
    side: Option<String>,
    /// Fewer cells, shorter measurements: finishes in under a minute.
    #[arg(long)]
    quick: bool,
    /// Seconds per measurement (default 0.5, quick 0.1; 5 with --table).
    #[arg(long)]
    seconds: Option<f64>,
    /// Repeats per variant, interleaved (default 5, quick 3; 3 with --table).
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
    if let Some(line) = &a.table {
        return run_table(line, &a);
    }
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
        let autos = rows.iter().filter(|r| r.variant == "auto").count();
        if autos > 0 {
            println!(
                "\nauto vs best fixed placement: within 5% in {} of {autos} cells",
                autos - misses.len()
            );
        }
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

/// `ucrypt bench --table LINE`: every workload on each side, interleaved and repeated;
/// medians, the ratio, and the process's CPU time per request.
fn run_table(line: &str, a: &Args) -> Result<(), CliError> {
    use bench::device::{self, Side, Workload};
    let secs = a.seconds.unwrap_or(5.0);
    let repeats = a.repeat.unwrap_or(3).max(1);
    let rws: Vec<&str> = if a.rw.is_empty() {
        vec!["randread", "randwrite", "read", "write"]
    } else {
        a.rw.iter().map(String::as_str).collect()
    };
    let depths = if a.depth.is_empty() {
        vec![32]
    } else {
        a.depth.clone()
    };
    let mut workloads = Vec::new();
    for rw in rws {
        let blocks = match (a.block.is_empty(), rw.starts_with("rand")) {
            (false, _) => a.block.clone(),
            (true, true) => vec![4096],
            (true, false) => vec![1 << 20],
        };
        for &b in &blocks {
            for &d in &depths {
                workloads.extend(Workload::new(rw, b, d));
            }
        }
    }
    let sides = match a.side.as_deref() {
        Some("raw") => vec![Side::Raw],
        Some(_) => vec![Side::Ucrypt],
        None => vec![Side::Raw, Side::Ucrypt],
    };
    let opened = device::open_sides(line, ucrypt::open::OpenOptions::default())?;
    let _exit = super::progress::ExitOnSignal::new();
    let mut samples: Vec<(usize, Side, bench::load::QueuedSample)> = Vec::new();
    for rep in 0..repeats {
        for (i, w) in workloads.iter().enumerate() {
            for &side in &sides {
                let q = device::measure(&opened, side, w, secs)?;
                if a.json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "workload": w.name(),
                            "side": side.name(),
                            "repeat": rep + 1,
                            "ops": q.sample.ops,
                            "secs": q.sample.secs,
                            "iops": q.sample.iops(),
                            "mib_s": q.sample.mib_s(),
                            "cpu_us_per_op": q.cpu_us_per_op(),
                        })
                    );
                } else {
                    eprintln!(
                        "  rep {} {} {}: {:.0} IOPS {:.1} MiB/s, CPU {:.0} us per request",
                        rep + 1,
                        side.name(),
                        w.name(),
                        q.sample.iops(),
                        q.sample.mib_s(),
                        q.cpu_us_per_op()
                    );
                }
                samples.push((i, side, q));
            }
        }
    }
    if a.json {
        return Ok(());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "in process, one load generator; {secs} s per cell, median of {repeats}; \
         CPU = this process's time per request (librbd's threads included)"
    );
    println!();
    let names: Vec<&str> = sides.iter().map(|s| s.name()).collect();
    let mut head = format!("| workload | {} |", names.join(" | "));
    if sides.len() == 2 {
        head.push_str(" ucrypt / raw | CPU us per request raw / ucrypt |");
    }
    println!("{head}");
    println!("{}", "|---".repeat(head.matches(" |").count()) + "|");
    for (i, w) in workloads.iter().enumerate() {
        let mut cells = Vec::new();
        let mut rates = Vec::new();
        let mut cpus = Vec::new();
        for &side in &sides {
            let of = |f: &dyn Fn(&bench::load::QueuedSample) -> f64| {
                samples
                    .iter()
                    .filter(|(j, s, _)| *j == i && *s == side)
                    .map(|(_, _, q)| f(q))
                    .collect::<Vec<f64>>()
            };
            let iops = median(&mut of(&|q| q.sample.iops()));
            let mib = median(&mut of(&|q| q.sample.mib_s()));
            cpus.push(median(&mut of(&|q| q.cpu_us_per_op())));
            rates.push(mib);
            cells.push(if w.block < 1 << 20 {
                format!("{iops:.0} IOPS")
            } else {
                format!("{mib:.0} MiB/s")
            });
        }
        let mut row = format!("| {} | {} |", w.name(), cells.join(" | "));
        if sides.len() == 2 {
            row.push_str(&format!(
                " {:.2}x | {:.0} / {:.0} |",
                rates[1] / rates[0].max(f64::MIN_POSITIVE),
                cpus[0],
                cpus[1]
            ));
        }
        println!("{row}");
    }
    Ok(())
}
