//! `ucrypt write`: plaintext in, ciphertext onto the table's device.

use super::{CliError, TableArg, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::io::Read;
use ucrypt::open::Backend;

/// Arguments of `ucrypt write`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    table: TableArg,
    /// Byte offset in the plaintext view to start writing at (any alignment).
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Plaintext to write (default: standard input).
    #[arg(long, value_name = "FILE")]
    input: Option<std::path::PathBuf>,
    /// Accept sector sizes above 4096 (the kernel cannot open such a volume).
    #[arg(long)]
    large_sectors: bool,
    #[command(flatten)]
    cache: super::CacheArgs,
    #[command(flatten)]
    perf: super::PerfArgs,
}

const CHUNK: usize = 1 << 20;

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let (volume, _) = super::read::open_input(
        &a.table,
        ucrypt::OpenOptions {
            read_only: false,
            cache: a.cache.cache(),
            allow_large_sectors: a.large_sectors,
            perf: a.perf.options(),
        },
    )?;
    let size = volume.info().size_bytes;
    if a.offset > size {
        return Err(anyhow::anyhow!(
            "offset {} is past the end of the mapping ({size} bytes)",
            a.offset
        ))
        .code(EXIT_PARAMS);
    }
    let mut input: Box<dyn Read> = match &a.input {
        None => Box::new(std::io::stdin().lock()),
        Some(p) => {
            let f = std::fs::File::open(p)
                .map_err(|e| anyhow::anyhow!("opening input {}: {e}", p.display()))?;
            let len = f.metadata()?.len();
            if f.metadata()?.is_file() && len > size - a.offset {
                return Err(anyhow::anyhow!(
                    "input {} is {len} bytes but only {} fit between offset {} and the end of the mapping; nothing written",
                    p.display(),
                    size - a.offset,
                    a.offset
                ))
                .code(EXIT_PARAMS);
            }
            Box::new(f)
        }
    };
    let mut buf = vec![0u8; CHUNK];
    let mut pos = a.offset;
    loop {
        let n = fill(&mut *input, &mut buf)?;
        if n == 0 {
            break;
        }
        if pos + n as u64 > size {
            return Err(anyhow::anyhow!(
                "input is longer than the mapping: {} bytes written up to its end at {size}, the rest refused",
                pos - a.offset
            ))
            .code(EXIT_PARAMS);
        }
        volume.write_at(&buf[..n], pos, false).code(EXIT_DEVICE)?;
        pos += n as u64;
    }
    volume.flush().code(EXIT_DEVICE)?;
    Ok(())
}

/// Reads until `buf` is full or input ends.
fn fill(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
