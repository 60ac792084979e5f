//! Online reencryption inside a named instance (`ucrypt reencrypt --active-name NAME`):
//! the control requests `reencrypt` (start, with the passphrase), `reencrypt_stop`, and
//! the `reencryption` object of `status`, which the command polls for its progress bar.
//!
//! The client side has already written the reencryption metadata (as offline:
//! libcryptsetup's `crypt_reencrypt_init`); this side opens the run on the instance's own
//! device, serves [`Reencrypting`] (new key below the boundary, old key above, each hotzone
//! held while it is rewritten) and runs the data pass on a thread of its own, so the
//! control socket keeps answering. When the pass finishes the instance serves a plain
//! volume under the new key; when it is stopped (or `close` stops it) the two-segment view
//! stays, matching the header, until a later run finishes it.

use super::{lock_ignoring_poison, Server, Source, EXIT_BUSY};
use crate::cli::{EXIT_DEVICE, EXIT_PARAMS};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use ucrypt::instance::control::{self, Request};
use ucrypt::instance::reencrypting::Reencrypting;
use ucrypt::reencrypt::{Outcome, Run, RunOptions, DEFAULT_MAX_HOTZONE};
use ucrypt_backend::Backend;
use ucrypt_format::TableLine;

/// A data pass running (or ended) in this instance.
pub(super) struct Job {
    stop: Arc<AtomicBool>,
    progress: Arc<Mutex<Progress>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Clone, Default)]
struct Progress {
    /// running, finished, interrupted or failed.
    state: &'static str,
    done: u64,
    size: u64,
    error: Option<String>,
}

impl Job {
    fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

/// The refusal of suspend, resume, resize and refresh while a data pass runs.
pub(super) fn busy(s: &Server) -> Option<Value> {
    let job = lock_ignoring_poison(&s.online);
    job.as_ref().filter(|j| j.running()).map(|_| {
        control::error(
            EXIT_BUSY,
            format!(
                "{} is being re-encrypted; wait for it to finish, or stop it with Ctrl-C in \
                 its `ucrypt reencrypt` (`ucrypt close {}` stops it too)",
                s.name, s.name
            ),
        )
    })
}

/// The `reencryption` object of `status`, if a pass ran in this instance.
pub(super) fn status(s: &Server) -> Option<Value> {
    let job = lock_ignoring_poison(&s.online);
    job.as_ref().map(|j| {
        let p = lock_ignoring_poison(&j.progress).clone();
        let mut v = json!({"state": p.state, "done": p.done, "size": p.size});
        if let Some(e) = p.error {
            v["error"] = json!(e);
        }
        v
    })
}

/// Stops a running pass between hotzones and waits for it (metadata consistent).
pub(super) fn stop(s: &Server) {
    let mut job = lock_ignoring_poison(&s.online);
    if let Some(j) = job.as_mut() {
        j.stop.store(true, Ordering::SeqCst);
        if let Some(t) = j.thread.take() {
            let _ = t.join();
        }
    }
}

/// `reencrypt_stop`: asks a running pass to stop after its hotzone; the answer comes at once.
pub(super) fn request_stop(s: &Server) -> Value {
    match lock_ignoring_poison(&s.online).as_ref() {
        Some(j) if j.running() => {
            j.stop.store(true, Ordering::SeqCst);
            json!({"ok": true})
        }
        _ => control::error(
            EXIT_PARAMS,
            format!("no reencryption is running in {}", s.name),
        ),
    }
}

/// One side's volume over the instance's device.
fn side(line: TableLine, opts: ucrypt::OpenOptions) -> Result<Arc<dyn Backend>, String> {
    ucrypt::open::open_parsed(line, opts)
        .map(|o| o.volume as Arc<dyn Backend>)
        .map_err(|e| format!("{e:#}"))
}

/// `reencrypt`: opens the run on the instance's device with the passphrase that came
/// with the request, puts the two-sided view in place and starts the pass.
pub(super) fn start(s: &Arc<Server>, req: &Request) -> Value {
    if let Some(b) = busy(s) {
        return b;
    }
    if s.switch.is_suspended() {
        return control::error(
            EXIT_PARAMS,
            format!("{} is suspended; luksResume it first", s.name),
        );
    }
    if lock_ignoring_poison(&s.desc).read_only {
        // A read-only instance holds its image with a shared lock: other read-only
        // instances may serve it too, and would read new-key data with the old key.
        return control::error(
            EXIT_PARAMS,
            format!(
                "{} is served read-only; online reencryption writes the device (close it and \
                 open it read-write first)",
                s.name
            ),
        );
    }
    let Source::Header { device, hopts } = &s.source else {
        return control::error(
            EXIT_PARAMS,
            "online reencryption needs an instance opened from a LUKS2 header",
        );
    };
    let Some(secret) = req.secret.as_ref() else {
        return control::error(EXIT_PARAMS, "reencrypt needs the passphrase");
    };
    let opened = match &hopts.header {
        Some(h) => Run::open_detached(h, device, secret),
        None => Run::open(device, secret),
    };
    let mut run = match opened {
        Ok(r) => r,
        Err(e) => {
            let e = crate::cli::luks::cs_error(e);
            return control::error(e.code(), crate::cli::error_line(&e.err));
        }
    };
    if !run.forward_rekey() {
        return control::error(
            EXIT_PARAMS,
            "online reencryption runs re-keying only (not --encrypt, --decrypt or a data \
             shift); close the volume and run `ucrypt reencrypt` offline",
        );
    }
    let opts = *lock_ignoring_poison(&s.opts);
    let extra = if lock_ignoring_poison(&s.desc).allow_discards {
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
        Err(e) => return control::error(EXIT_DEVICE, e),
    };
    if view.info().size_bytes / 512 != lock_ignoring_poison(&s.desc).size_sectors {
        return control::error(
            EXIT_PARAMS,
            "the instance serves a different size than the header's data area (resized?); \
             re-encrypt it offline",
        );
    }
    if let Err(e) = s.switch.replace(Arc::clone(&view) as Arc<dyn Backend>) {
        return control::error(EXIT_DEVICE, format!("flushing the previous volume: {e}"));
    }
    let max_hotzone = req
        .body
        .get("hotzone")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_MAX_HOTZONE)
        .max(4096);
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Mutex::new(Progress {
        state: "running",
        done: run.done(),
        size: run.device_size(),
        error: None,
    }));
    let thread = {
        let (stop, progress, s) = (Arc::clone(&stop), Arc::clone(&progress), Arc::clone(s));
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
                        match plain.and_then(|v| s.switch.replace(v).map_err(|e| e.to_string())) {
                            Ok(()) => p.state = "finished",
                            // The two-sided view (boundary at the end) stays: correct,
                            // only slower.
                            Err(e) => {
                                p.state = "finished";
                                p.error = Some(format!("still serving the two-sided view: {e}"));
                            }
                        }
                    }
                    Ok(Outcome::Interrupted) => p.state = "interrupted",
                    Err(e) => {
                        view.fail_held();
                        p.state = "failed";
                        p.error = Some(crate::cli::error_line(&anyhow::Error::from(e)));
                    }
                }
            })
    };
    match thread {
        Ok(t) => {
            *lock_ignoring_poison(&s.online) = Some(Job {
                stop,
                progress,
                thread: Some(t),
            });
            json!({"ok": true})
        }
        Err(e) => control::error(EXIT_DEVICE, format!("starting the reencryption: {e}")),
    }
}
