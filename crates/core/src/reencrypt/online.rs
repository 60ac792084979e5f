//! Online re-keying of a volume a named instance serves (`--active-name NAME`), as
//! cryptsetup's online reencryption of an active device. This side writes the
//! reencryption metadata (libcryptsetup, as offline) unless it is there already, hands the
//! passphrase to the instance, which runs the data pass while its clients keep reading and
//! writing (`crate::instance`'s `online` module), and follows the pass through the
//! instance's status. A stop request stops the pass after its current hotzone; the
//! instance keeps serving both keys, and a later run (or an offline `--resume-only` after
//! `close`) finishes it.

use super::init;
use super::interact::{Level, Notice, PassKind, Progress, Summary};
use super::options::Options;
use crate::error::{anyhow, Error, ErrorKind, Result};
use crate::instance::control::{self, PassState, Reencryption, Reply, Request};
use crate::instance::runtime::{self, InstanceError, Paths, Probe};
use crate::prompt::Prompt;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn refuse(what: &str) -> Error {
    anyhow!(
        "reencrypt --active-name: {what} is not run online; close the volume and run \
         `ucrypt reencrypt` offline"
    )
}

/// The live instance `name` (a dead one's leftovers are reported and taken away).
fn live(name: &str, progress: &mut dyn Progress) -> Result<Paths> {
    let p = Paths::of(name)?;
    match runtime::probe(&p)? {
        Probe::Live { .. } => Ok(p),
        Probe::Dead(debris) => {
            progress.notice(Notice {
                level: Level::Error,
                text: format!("{name}: {debris}"),
            });
            Err(InstanceError::NotActive(name.to_string()).into())
        }
        Probe::Absent => Err(InstanceError::NotActive(name.to_string()).into()),
    }
}

/// Sends a request; a refusal becomes an error of its kind.
fn call(p: &Paths, request: &Request, secret: Option<&[u8]>, timeout: Duration) -> Result<Reply> {
    let reply = control::call(&p.control(), request, secret, timeout).map_err(|e| {
        Error::Context {
            context: e.to_string(),
            source: Box::new(Error::Io(e.source)),
        }
        .with_kind(ErrorKind::Device)
    })?;
    match reply {
        Reply::Refused { kind, message } => Err(Error::Refused { kind, message }),
        other => Ok(other),
    }
}

/// Runs the online reencryption of instance `name`.
///
/// # Errors
/// What is not run online, an instance that is not active or not a LUKS2 volume opened
/// from its header, another device or header than it serves, the refusals and errors of
/// an offline initialisation, the instance's refusal or failure.
pub(crate) fn run(
    a: &Options,
    name: &str,
    prompt: &mut dyn Prompt,
    progress: &mut dyn Progress,
) -> Result<()> {
    if a.encrypt() || a.decrypt() || a.reduce_device_size.is_some() {
        return Err(refuse("encryption, decryption or a data shift"));
    }
    if a.device_size.is_some() {
        return Err(refuse("--device-size (a part of the data area)"));
    }
    let p = live(name, progress)?;
    let Reply::Status(st) = call(&p, &Request::Status, None, Duration::from_secs(10))? else {
        return Err(
            anyhow!("{name} answered the status request with something else")
                .with_kind(ErrorKind::Device),
        );
    };
    let st = &st.description;
    if st.kind != "LUKS2" || !st.from_header {
        return Err(anyhow!(
            "{name} is not a LUKS2 volume opened from its header (type {}); online \
             reencryption needs one",
            serde_json::json!(st.kind)
        ));
    }
    let served = PathBuf::from(&st.device);
    let header = st.header.as_deref().map(PathBuf::from);
    if !a.device.as_os_str().is_empty() {
        let same =
            |x: &Path, y: &Path| std::fs::canonicalize(x).ok() == std::fs::canonicalize(y).ok();
        if !same(&a.device, &served) {
            return Err(anyhow!(
                "{name} serves {}, not {}",
                served.display(),
                a.device.display()
            ));
        }
    }
    if a.header.is_some() && a.header != header {
        return Err(anyhow!(
            "{name} was opened with {} as its header; --header names another",
            header
                .as_deref()
                .map_or("no detached header".into(), |h| h.display().to_string())
        ));
    }
    let mut served_opts = a.clone();
    served_opts.device = served.clone();
    served_opts.header = header;
    let header_path = served_opts.header_path().to_path_buf();
    let f = std::fs::File::open(&header_path).map_err(|e| {
        anyhow!("opening {}: {e}", header_path.display()).with_kind(ErrorKind::Device)
    })?;
    let h = ucrypt_format::luks2::disk::Header::read(&f, &header_path.display().to_string())
        .map_err(|e| Error::from(e).with_kind(ErrorKind::Device))?;
    let in_progress = ucrypt_format::luks2::reencrypt::in_reencryption(&h.json);
    let question = format!("Enter passphrase for {}: ", served.display());
    let passphrase = super::luks2::existing_passphrase(
        a,
        &served,
        served_opts.header.as_deref(),
        &question,
        prompt,
    )?;
    if in_progress && a.init_only() {
        return Err(anyhow!(
            "LUKS2 reencryption already initialized in metadata"
        ));
    }
    if !in_progress {
        if a.resume_only() {
            return Err(anyhow!("{} is not in LUKS2 reencryption", served.display()));
        }
        init::rekey(&served_opts, &passphrase, progress)?;
        if a.init_only() {
            return Ok(());
        }
    }
    let request = Request::Reencrypt {
        hotzone: a.hotzone_size,
    };
    // Stop requests are caught from before the pass starts: a Ctrl-C between the
    // instance's answer and `follow` must stop the pass, not end this process with the
    // pass running on in the instance.
    progress.watch();
    call(&p, &request, Some(&passphrase), Duration::from_secs(600))?;
    drop(passphrase);
    follow(&p, name, &served, progress)
}

/// Follows the pass through the instance's status until it ends, asking it to stop once
/// the caller asks (the caller has called [`Progress::watch`]).
fn follow(p: &Paths, name: &str, served: &Path, progress: &mut dyn Progress) -> Result<()> {
    let device = served.display().to_string();
    let read = |p| -> Result<Reencryption> {
        match call(p, &Request::Status, None, Duration::from_secs(10))? {
            Reply::Status(st) => Ok(st.reencryption.unwrap_or_default()),
            _ => Ok(Reencryption::default()),
        }
    };
    let first = read(p)?;
    let start = first.done;
    let size = first.size;
    progress.begin(&device, size - start, None);
    let mut asked_stop = false;
    let last = loop {
        let r = read(p)?;
        progress.advance(r.done.saturating_sub(start));
        if r.state != PassState::Running {
            break r;
        }
        if progress.stop_requested() && !asked_stop {
            // The answer is an error only when the pass ended meanwhile.
            let _ = call(p, &Request::ReencryptStop, None, Duration::from_secs(10));
            asked_stop = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let summary = Summary {
        kind: PassKind::Online {
            name: name.to_string(),
        },
        finished: last.state == PassState::Finished,
        bytes: last.done.saturating_sub(start),
        at: last.done,
        size,
        device: device.clone(),
    };
    match last.state {
        PassState::Finished => {
            progress.end(true);
            progress.summary(&summary);
            if let Some(e) = &last.error {
                progress.notice(Notice::warning(format!("{name}: {e}")));
            }
            Ok(())
        }
        PassState::Interrupted => {
            progress.end(false);
            progress.summary(&summary);
            if progress.stop_requested() {
                return Err(anyhow!("interrupted"));
            }
            Ok(())
        }
        _ => {
            progress.end(false);
            Err(anyhow!(
                "reencryption of {device} in {name} failed: {}",
                last.error.as_deref().unwrap_or("no reason given")
            )
            .with_kind(ErrorKind::Device))
        }
    }
}
