//! `ucrypt wipe DEV [--offset BYTES]`: writes encrypted zeros over a volume's data area
//! through ucrypt's data path, from `--offset` to the end, so no old plaintext stays
//! readable. `luksFormat --wipe` does the same right after formatting; an interrupted wipe
//! (Ctrl-C, a write error) says how far it got and the `ucrypt wipe` command that
//! finishes it. (cryptsetup has no such action: its wipes are part of luksFormat
//! --integrity or reencrypt.)

use super::luks::{CsResult, DeviceArgs};
use super::progress::{self, ProgressArgs};
use super::secret::{self, KeyFileArgs};
use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::header::VolumeType;
use ucrypt::open::Backend;

/// Arguments of `ucrypt wipe`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    dev: DeviceArgs,
    #[command(flatten)]
    key: KeyFileArgs,
    /// Only try this keyslot's passphrase.
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    /// Start at this byte of the data area (what an interrupted wipe reported); a
    /// multiple of 4096.
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    offset: u64,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long)]
    batch_mode: bool,
    #[command(flatten)]
    progress: ProgressArgs,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    if a.offset % 4096 != 0 {
        return Err(anyhow::anyhow!(
            "--offset {} is not a multiple of 4096 (interrupted wipes report one)",
            a.offset
        ))
        .code(EXIT_PARAMS);
    }
    let _claimed = super::luks::claim_for_header_change(&a.dev)?;
    secret::confirm(
        a.batch_mode,
        &format!(
            "This will overwrite the data on {} irrevocably (from byte {} of its data area)",
            a.dev.device.display(),
            a.offset
        ),
    )?;
    let kind = VolumeType::Luks;
    let hopts = ucrypt::HeaderOptions {
        kind,
        header: a.dev.header.clone(),
        key_slot: a.key_slot,
        ..ucrypt::HeaderOptions::default()
    };
    let pass = secret::existing(&a.key, &a.dev.device)?;
    let unlocked =
        progress::searching_maybe(ucrypt::unlock::Step::unlocking(kind).message(), || {
            ucrypt::unlock(&a.dev.device, &pass, &hopts)
        })
        .cs()?;
    drop(pass);
    // A segment with integrity is wiped in dm-integrity's direct mode, whole interleave
    // areas at a time, as luksFormat --integrity wipes it.
    let target = ucrypt::luks::format::wipe_volume(unlocked).cs()?;
    fill(&*target.volume, &a.dev, a.offset, target.chunk, &a.progress)
}

/// Writes encrypted zeros over `volume` from byte `from` to its end, `chunk` bytes at a
/// time (each write ending on a multiple of `chunk`), with progress. A signal stops it at
/// the next chunk; a write error stops it at once; either way the error names how far it
/// got and the command that finishes it.
pub(crate) fn fill(
    volume: &dyn Backend,
    dev: &DeviceArgs,
    from: u64,
    chunk: usize,
    args: &ProgressArgs,
) -> Result<(), CliError> {
    let size = volume.info().size_bytes;
    if from > size {
        return Err(anyhow::anyhow!(
            "--offset {from} is past the end of the data area ({size} bytes)"
        ))
        .code(EXIT_PARAMS);
    }
    let device = dev.device.display().to_string();
    let finish = |at: u64| {
        let header = dev
            .header
            .as_ref()
            .map_or_else(String::new, |h| format!(" --header {}", h.display()));
        format!("finish with: ucrypt wipe {device}{header} --offset {at}")
    };
    let stop = progress::StopOnSignal::new();
    let mut bar = progress::Bytes::new(args, "Wiping", &device, size);
    bar.resume_at(from);
    let chunk = chunk.max(4096) as u64;
    let zeros = vec![0u8; chunk as usize];
    let mut at = from;
    while at < size {
        if stop.stopped() {
            break;
        }
        let n = (size - at).min(chunk - at % chunk) as usize;
        if let Err(e) = volume.write_at(&zeros[..n], at, false) {
            bar.abandon();
            let _ = volume.flush();
            return Err(anyhow::anyhow!(
                "wiping {device} at byte {at} of {size} of the data area: {e}; {}",
                finish(at)
            ))
            .cs();
        }
        at += n as u64;
        bar.set(at);
    }
    volume
        .flush()
        .map_err(|e| anyhow::anyhow!("flushing {device}: {e}"))
        .cs()?;
    if at < size {
        bar.abandon();
        return Err(anyhow::anyhow!(
            "wipe interrupted after {at} of {size} bytes ({:.1}%) of the data area: the volume \
             opens, the bytes from {at} on still hold what was there before; {}",
            at as f64 * 100.0 / size as f64,
            finish(at)
        ))
        .code(EXIT_PARAMS);
    }
    bar.finish();
    Ok(())
}
