//! Online reencryption inside a named instance (`ucrypt reencrypt --active-name NAME`):
//! the control requests `reencrypt` (start, with the passphrase), `reencrypt_stop`, and
//! the `reencryption` object of `status`, which the client ([`crate::reencrypt::run`] with
//! an instance name) polls for its progress.
//!
//! The client side has already written the reencryption metadata (as offline:
//! libcryptsetup's `crypt_reencrypt_init`); this side opens the run on the instance's own
//! device, serves [`Reencrypting`] (new key below the boundary, old key above, each hotzone
//! held while it is rewritten) and runs the data pass on a thread of its own, so the
//! control socket keeps answering. When the pass finishes the instance serves a plain
//! volume under the new key; when it is stopped (or `close` stops it) the two-segment view
//! stays, matching the header, until a later run finishes it.

use super::control::{refuse, PassState, Reencryption, Reply};
use super::reencrypting::Reencrypting;
use super::runtime::Description;
use super::switch::Switch;
use crate::error::ErrorKind;
use crate::reencrypt::{Outcome, Run, RunOptions, DEFAULT_MAX_HOTZONE};
use crate::OpenOptions;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use ucrypt_backend::Backend;
use ucrypt_format::TableLine;

/// A data pass running (or ended) in this instance.
pub(super) struct Job {
    stop: Arc<AtomicBool>,
    progress: Arc<Mutex<Reencryption>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Job {
    fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

/// An instance's slot for its data pass.
pub(super) type Slot = Mutex<Option<Job>>;

/// What of the instance a pass uses.
pub(super) struct Instance<'a> {
    /// Its name (for messages).
    pub(super) name: &'a str,
    /// What it serves.
    pub(super) switch: &'a Arc<Switch>,
    /// Its description (read-only, size, discards).
    pub(super) desc: &'a Mutex<Description>,
    /// The engine options its volume was built with.
    pub(super) opts: OpenOptions,
    /// The device and detached header of an instance opened from a header.
    pub(super) header: Option<(&'a Path, Option<&'a Path>)>,
    /// Its pass.
    pub(super) slot: &'a Slot,
}

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The refusal of suspend, resume, resize and refresh while a data pass runs.
pub(super) fn busy(slot: &Slot, name: &str) -> Option<Reply> {
    let job = lock_ignoring_poison(slot);
    job.as_ref().filter(|j| j.running()).map(|_| {
        refuse(
            ErrorKind::Busy,
            format!(
                "{} is being re-encrypted; wait for it to finish, or stop it with Ctrl-C in \
                 its `ucrypt reencrypt` (`ucrypt close {}` stops it too)",
                name, name
            ),
        )
    })
}

/// The `reencryption` object of `status`, if a pass ran in this instance.
pub(super) fn status(slot: &Slot) -> Option<Reencryption> {
    let job = lock_ignoring_poison(slot);
    job.as_ref()
        .map(|j| lock_ignoring_poison(&j.progress).clone())
}

/// Stops a running pass between hotzones and waits for it (metadata consistent).
pub(super) fn stop(slot: &Slot) {
    let mut job = lock_ignoring_poison(slot);
    if let Some(j) = job.as_mut() {
        j.stop.store(true, Ordering::SeqCst);
        if let Some(t) = j.thread.take() {
            let _ = t.join();
        }
    }
}

/// `reencrypt_stop`: asks a running pass to stop after its hotzone; the answer comes at once.
pub(super) fn request_stop(slot: &Slot, name: &str) -> Reply {
    match lock_ignoring_poison(slot).as_ref() {
        Some(j) if j.running() => {
            j.stop.store(true, Ordering::SeqCst);
            Reply::Done
        }
        _ => refuse(
            ErrorKind::Invalid,
            format!("no reencryption is running in {name}"),
        ),
    }
}

/// One side's volume over the instance's device.
fn side(line: TableLine, opts: OpenOptions) -> Result<Arc<dyn Backend>, String> {
    crate::open::open_parsed(line, opts)
        .map(|o| o.volume as Arc<dyn Backend>)
        .map_err(|e| format!("{e:#}"))
}

/// `reencrypt`: opens the run on the instance's device with the passphrase that came
/// with the request, puts the two-sided view in place and starts the pass.
pub(super) fn start(s: &Instance<'_>, secret: Option<&[u8]>, hotzone: Option<u64>) -> Reply {
    if let Some(b) = busy(s.slot, s.name) {
        return b;
    }
    if s.switch.is_suspended() {
        return refuse(
            ErrorKind::Invalid,
            format!("{} is suspended; luksResume it first", s.name),
        );
    }
    if lock_ignoring_poison(s.desc).read_only {
        // A read-only instance holds its image with a shared lock: other read-only
        // instances may serve it too, and would read new-key data with the old key.
        return refuse(
            ErrorKind::Invalid,
            format!(
                "{} is served read-only; online reencryption writes the device (close it and \
                 open it read-write first)",
                s.name
            ),
        );
    }
    let Some((device, header)) = s.header else {
        return refuse(
            ErrorKind::Invalid,
            "online reencryption needs an instance opened from a LUKS2 header",
        );
    };
    let Some(secret) = secret else {
        return refuse(ErrorKind::Invalid, "reencrypt needs the passphrase");
    };
    let opened = match header {
        Some(h) => Run::open_detached(h, device, secret),
        None => Run::open(device, secret),
    };
    let mut run = match opened {
        Ok(r) => r,
        Err(e) => return refuse(e.kind(), format!("{e:#}")),
    };
    if !run.forward_rekey() {
        return refuse(
            ErrorKind::Invalid,
            "online reencryption runs re-keying only (not --encrypt, --decrypt or a data \
             shift); close the volume and run `ucrypt reencrypt` offline",
        );
    }
    let opts = s.opts;
    let extra = if lock_ignoring_poison(s.desc).allow_discards {
        vec![ucrypt_format::OptParam::AllowDiscards]
    } else {
        Vec::new()
    };
    let device_name = device.display().to_string();
    let view = run
        .side_lines(&device_name, &extra)
        .map_err(|e| format!("{e:#}"))
        .and_then(|(old, new)| {
            Reencrypting::new(side(old, opts)?, side(new, opts)?, run.done()).map(Arc::new)
        });
    let view = match view {
        Ok(v) => v,
        Err(e) => return refuse(ErrorKind::Device, e),
    };
    if view.info().size_bytes / 512 != lock_ignoring_poison(s.desc).size_sectors {
        return refuse(
            ErrorKind::Invalid,
            "the instance serves a different size than the header's data area (resized?); \
             re-encrypt it offline",
        );
    }
    if let Err(e) = s.switch.replace(Arc::clone(&view) as Arc<dyn Backend>) {
        return refuse(
            ErrorKind::Device,
            format!("flushing the previous volume: {e}"),
        );
    }
    let max_hotzone = hotzone.unwrap_or(DEFAULT_MAX_HOTZONE).max(4096);
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Mutex::new(Reencryption {
        state: PassState::Running,
        done: run.done(),
        size: run.device_size(),
        error: None,
    }));
    let thread = {
        let (stop, progress, switch) = (
            Arc::clone(&stop),
            Arc::clone(&progress),
            Arc::clone(s.switch),
        );
        std::thread::Builder::new()
            .name("reencrypt".into())
            .spawn(move || {
                let run_opts = RunOptions {
                    max_hotzone,
                    stop_after: None,
                };
                let mut report = |done: u64, _size: u64| {
                    lock_ignoring_poison(&progress).done = done;
                };
                let outcome = run.run_gated(&run_opts, &stop, &mut report, Some(view.as_ref()));
                let mut p = lock_ignoring_poison(&progress);
                match outcome {
                    Ok(Outcome::Finished) => {
                        // The header now has the new key only: serve it plainly.
                        let plain = run
                            .side_lines(&device_name, &extra)
                            .map_err(|e| format!("{e:#}"))
                            .and_then(|(_, new)| side(new, opts));
                        p.state = PassState::Finished;
                        if let Err(e) =
                            plain.and_then(|v| switch.replace(v).map_err(|e| e.to_string()))
                        {
                            // The two-sided view (boundary at the end) stays: correct, only
                            // slower.
                            p.error = Some(format!("still serving the two-sided view: {e}"));
                        }
                    }
                    Ok(Outcome::Interrupted) => p.state = PassState::Interrupted,
                    Err(e) => {
                        view.fail_held();
                        p.state = PassState::Failed;
                        p.error = Some(format!("{e:#}"));
                    }
                }
            })
    };
    match thread {
        Ok(t) => {
            *lock_ignoring_poison(s.slot) = Some(Job {
                stop,
                progress,
                thread: Some(t),
            });
            Reply::Done
        }
        Err(e) => refuse(ErrorKind::Device, format!("starting the reencryption: {e}")),
    }
}
