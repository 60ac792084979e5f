//! `ucrypt reencrypt --active-name NAME`: online re-keying of a volume a named instance
//! is serving, as cryptsetup's online reencryption of an active device. This side writes
//! the reencryption metadata (libcryptsetup, as offline) unless it is there already, hands
//! the passphrase to the instance, which runs the data pass while clients keep reading and
//! writing (`ucrypt::instance::server`), and draws the progress from the instance's status.
//! Ctrl-C stops the pass after its current hotzone; the instance keeps serving both keys,
//! and a later `reencrypt --active-name NAME` (or an offline `--resume-only` after `close`)
//! finishes it.

use super::Args;
use crate::cli::lifecycle::{call, live};
use crate::cli::luks::DeviceArgs;
use crate::cli::progress;
use crate::cli::secret;
use crate::cli::{CliError, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use anyhow::anyhow;
use serde_json::json;
use std::time::{Duration, Instant};
use ucrypt::instance::control::{PassState, Reencryption, Reply, Request};

fn refuse(what: &str) -> Result<(), CliError> {
    Err(anyhow!(
        "reencrypt --active-name: {what} is not run online; close the volume and run \
         `ucrypt reencrypt` offline"
    ))
    .code(EXIT_PARAMS)
}

/// Runs the online reencryption of instance `name`.
pub(super) fn run(a: &mut Args, name: &str) -> Result<(), CliError> {
    if a.encrypt || a.decrypt || a.reduce_device_size.is_some() {
        return refuse("encryption, decryption or a data shift");
    }
    if a.device_size.is_some() {
        return refuse("--device-size (a part of the data area)");
    }
    let (p, _) = live(name)?;
    let Reply::Status(st) = call(&p, &Request::Status, None, Duration::from_secs(10))? else {
        return Err(anyhow!(
            "{name} answered the status request with something else"
        ))
        .code(EXIT_DEVICE);
    };
    let st = &st.description;
    if st.kind != "LUKS2" || !st.from_header {
        return Err(anyhow!(
            "{name} is not a LUKS2 volume opened from its header (type {}); online \
             reencryption needs one",
            json!(st.kind)
        ))
        .code(EXIT_PARAMS);
    }
    let served = std::path::PathBuf::from(&st.device);
    let header = st.header.as_deref().map(std::path::PathBuf::from);
    if let Some(d) = &a.device {
        let same = |x: &std::path::Path, y: &std::path::Path| {
            std::fs::canonicalize(x).ok() == std::fs::canonicalize(y).ok()
        };
        if !same(d, &served) {
            return Err(anyhow!(
                "{name} serves {}, not {}",
                served.display(),
                d.display()
            ))
            .code(EXIT_PARAMS);
        }
    }
    if a.header.is_some() && a.header != header {
        return Err(anyhow!(
            "{name} was opened with {} as its header; --header names another",
            header
                .as_deref()
                .map_or("no detached header".into(), |h| h.display().to_string())
        ))
        .code(EXIT_PARAMS);
    }
    let dev = DeviceArgs {
        device: served.clone(),
        header,
    };
    let header_path = dev.header_path().to_path_buf();
    let f = std::fs::File::open(&header_path)
        .map_err(|e| anyhow!("opening {}: {e}", header_path.display()))
        .code(EXIT_DEVICE)?;
    let h = ucrypt_format::luks2::disk::Header::read(&f, &header_path.display().to_string())
        .map_err(anyhow::Error::from)
        .code(EXIT_DEVICE)?;
    let in_progress = ucrypt_format::luks2::reencrypt::in_reencryption(&h.json);
    let passphrase = secret::existing(&a.key, &served)?;
    if in_progress && a.init_only {
        return Err(anyhow!(
            "LUKS2 reencryption already initialized in metadata"
        ))
        .code(EXIT_PARAMS);
    }
    if !in_progress {
        if a.resume_only {
            return Err(anyhow!("{} is not in LUKS2 reencryption", served.display()))
                .code(EXIT_PARAMS);
        }
        a.dev = dev;
        super::initialise(a, &passphrase)?;
        if a.init_only {
            return Ok(());
        }
    }
    let request = Request::Reencrypt {
        hotzone: a.hotzone_size,
    };
    call(&p, &request, Some(&passphrase), Duration::from_secs(600))?;
    drop(passphrase);
    // Follow the pass through the instance's status.
    let stop_signal = progress::StopOnSignal::new();
    let device = served.display().to_string();
    let begin = Instant::now();
    let read = |p| -> Result<Reencryption, CliError> {
        match call(p, &Request::Status, None, Duration::from_secs(10))? {
            Reply::Status(st) => Ok(st.reencryption.unwrap_or_default()),
            _ => Ok(Reencryption::default()),
        }
    };
    let first = read(&p)?;
    let start = first.done;
    let size = first.size;
    let mut bar = progress::Bytes::new(&a.progress, "Reencrypting", &device, size - start);
    let mut asked_stop = false;
    let last = loop {
        let r = read(&p)?;
        bar.set(r.done.saturating_sub(start));
        if r.state != PassState::Running {
            break r;
        }
        if stop_signal.stopped() && !asked_stop {
            // The answer is an error only when the pass ended meanwhile.
            let _ = call(&p, &Request::ReencryptStop, None, Duration::from_secs(10));
            asked_stop = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let done = last.done.saturating_sub(start);
    let secs = begin.elapsed().as_secs_f64();
    let quiet_lines = a.progress.progress_json || a.progress.progress_frequency.is_some();
    match last.state {
        PassState::Finished => {
            bar.finish();
            if !quiet_lines {
                eprintln!("{}", progress::summary_line("Finished", done, secs));
            }
            if let Some(e) = &last.error {
                eprintln!("{name}: {e}");
            }
            Ok(())
        }
        PassState::Interrupted => {
            bar.abandon();
            eprintln!("{}", progress::summary_line("Interrupted", done, secs));
            eprintln!(
                "Reencryption of {device} stopped at {} of {size} bytes; {name} serves both \
                 keys meanwhile. Continue with `ucrypt reencrypt --active-name {name}`.",
                last.done
            );
            if stop_signal.stopped() {
                return Err(anyhow!("interrupted")).code(EXIT_PARAMS);
            }
            Ok(())
        }
        _ => {
            bar.abandon();
            Err(anyhow!(
                "reencryption of {device} in {name} failed: {}",
                last.error.as_deref().unwrap_or("no reason given")
            ))
            .code(EXIT_DEVICE)
        }
    }
}
