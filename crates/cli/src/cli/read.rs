//! `ucrypt read`: the plaintext view of a table's mapping, to stdout or a file.

use super::exit::lib_error;
use super::prompt::Terminal;
use super::{CliError, TableArg, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::io::Write;
use ucrypt::open::{Backend, Opened, Source};
use ucrypt::prompt::Prompt;

/// Arguments of `ucrypt read`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    table: TableArg,
    /// Byte offset in the plaintext view (any alignment).
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Bytes to read (default: to the end of the mapping).
    #[arg(long)]
    length: Option<u64>,
    /// Where to write the plaintext (default: standard output).
    #[arg(long, value_name = "FILE")]
    output: Option<std::path::PathBuf>,
    /// Accept sector sizes above 4096 (the kernel cannot open such a volume).
    #[arg(long)]
    large_sectors: bool,
    #[command(flatten)]
    cache: super::CacheArgs,
    #[command(flatten)]
    perf: super::PerfArgs,
}

const CHUNK: u64 = 1 << 20;

/// Warns once when a table uses the large-sector extension.
pub(crate) fn warn_large<'a>(lines: impl IntoIterator<Item = &'a ucrypt::format::TableLine>) {
    if let Some(big) = ucrypt::open::beyond_kernel(lines) {
        Terminal::default().warning(&ucrypt::open::large_sector_warning(big));
    }
}

/// Opens the whole table input (every line) with `opts` ([`Source::Table`], which warns
/// about large sectors).
pub(crate) fn open_input(
    table: &TableArg,
    opts: ucrypt::OpenOptions,
) -> Result<(std::sync::Arc<dyn Backend>, String), CliError> {
    let mapping = table.mapping()?;
    let opened = ucrypt::open::open_source(Source::Table(mapping), opts, &mut Terminal::default());
    match opened.map_err(lib_error)? {
        Opened::Volume {
            volume,
            description,
        } => Ok((volume, description)),
        Opened::Checked => unreachable!("a table is opened, never only checked"),
    }
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let (volume, _) = open_input(
        &a.table,
        ucrypt::OpenOptions {
            read_only: true,
            cache: a.cache.cache(),
            allow_large_sectors: a.large_sectors,
            perf: a.perf.options(),
        },
    )?;
    let size = volume.info().size_bytes;
    let length = a.length.unwrap_or(size.saturating_sub(a.offset));
    if a.offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(anyhow::anyhow!(
            "range {}+{length} is past the end of the mapping ({size} bytes)",
            a.offset
        ))
        .code(EXIT_PARAMS);
    }
    let mut out: Box<dyn Write> = match &a.output {
        None => Box::new(std::io::stdout().lock()),
        Some(p) => Box::new(
            std::fs::File::create(p)
                .map_err(|e| anyhow::anyhow!("creating output {}: {e}", p.display()))?,
        ),
    };
    let mut buf = vec![0u8; CHUNK.min(length) as usize];
    let mut pos = a.offset;
    let end = a.offset + length;
    while pos < end {
        let n = (end - pos).min(CHUNK) as usize;
        volume.read_at(&mut buf[..n], pos).code(EXIT_DEVICE)?;
        out.write_all(&buf[..n])?;
        pos += n as u64;
    }
    out.flush()?;
    Ok(())
}
