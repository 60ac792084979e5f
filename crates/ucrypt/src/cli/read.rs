//! `ucrypt read`: the plaintext view of a table's mapping, to stdout or a file.

use super::{open_error, CliError, TableArg, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::io::Write;
use ucrypt_backend::Backend;

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
pub(crate) fn warn_large(table: &ucrypt_format::TableLine) {
    if table.sector_size_bytes() > 4096 {
        eprintln!(
            "ucrypt: warning: sector_size {} is beyond the kernel's limit of 4096: the Linux kernel's dm-crypt cannot open this volume",
            table.sector_size_bytes()
        );
    }
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let line = a.table.line()?;
    let opened = ucrypt::open_table(
        &line,
        ucrypt::OpenOptions {
            read_only: true,
            direct: a.direct,
            allow_large_sectors: a.large_sectors,
            perf: a.perf.options(),
        },
    )
    .map_err(open_error)?;
    warn_large(&opened.table);
    let volume = &opened.volume;
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
