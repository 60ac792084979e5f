//! `ucrypt read`: the plaintext view of a table's mapping, to stdout or a file.

use super::{open_error, CliError, TableArg, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::io::Write;
use ucrypt::open::Backend;

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
    /// Bypass the page cache on the device (O_DIRECT).
    #[arg(long)]
    direct: bool,
    #[command(flatten)]
    perf: super::PerfArgs,
}

const CHUNK: u64 = 1 << 20;

/// Warns once when a table uses the large-sector extension.
pub(crate) fn warn_large<'a>(lines: impl IntoIterator<Item = &'a ucrypt::format::TableLine>) {
    let sizes = lines
        .into_iter()
        .map(ucrypt::format::TableLine::sector_size_bytes);
    warn_large_size(sizes.max().unwrap_or(512));
}

/// [`warn_large`] for the largest sector size of a table.
fn warn_large_size(big: u32) {
    if big > 4096 {
        eprintln!(
            "ucrypt: warning: sector_size {big} is beyond the kernel's limit of 4096: the Linux kernel's dm-crypt cannot open this volume",
        );
    }
}

/// Opens the whole table input (every line) with `opts`; warns about large sectors.
pub(crate) fn open_input(
    table: &TableArg,
    opts: ucrypt::OpenOptions,
) -> Result<(std::sync::Arc<dyn Backend>, String), CliError> {
    let mapping = table.mapping()?;
    let big = mapping
        .crypt_lines()
        .map(ucrypt::format::TableLine::sector_size_bytes)
        .max()
        .unwrap_or(512);
    let description = mapping.describe();
    let volume = ucrypt::mapping::open_mapping(mapping, opts).map_err(open_error)?;
    // Only for a table that opened (a refused one gets its error alone).
    warn_large_size(big);
    Ok((volume, description))
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let (volume, _) = open_input(
        &a.table,
        ucrypt::OpenOptions {
            read_only: true,
            direct: a.direct,
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
