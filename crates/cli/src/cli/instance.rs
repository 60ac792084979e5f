//! `ucrypt open DEV NAME` / `ucrypt open --table LINE NAME`: a named instance, started by
//! the library's [`ucrypt::instance::start`] (name, front end, image locks, description,
//! `--persistent`, serving); this command turns the arguments into its inputs, reads the
//! table input, unlocks through the terminal, goes to the background (unless
//! `--foreground`/`--notify`) and reports readiness.
//!
//! A taken name or image fails at once with exit code 5, before any passphrase is asked
//! for. `ucrypt open` returns 0 only once the volume is served, the front end attached and
//! the description published (printing the node, or the NBD URI without one); every
//! failure before that is the command's exit status.
//!
//! The server then runs until `ucrypt close NAME` or SIGTERM/SIGINT, which mean the same
//! (`close` without `--force`: while the device is in use the signal is logged and
//! ignored; a suspended instance stops too): the front end is detached (flushed), the NBD
//! server stops (in-flight requests finish, the volume is flushed), and the runtime
//! directory is removed.

use super::daemon::{self, Ready};
use super::exit::lib_error;
use super::open::{self, Args};
use super::prompt::Terminal;
use super::CliError;
use ucrypt::instance::start::{Persist, Serving, Start, What};

/// `ucrypt open ... NAME` without `--run`.
pub(crate) fn run(mut a: Args, name: String) -> Result<(), CliError> {
    if a.notify {
        super::secret::set_ask_password(true);
    }
    let start = Start {
        name,
        exposure: open::exposure(&a),
        frontend: a.frontend,
        recover: a.recover,
        fuse_dir: a.fuse.clone(),
        vhost_socket: a.vhost_socket.clone(),
        ublk_poll: a
            .ublk_poll
            .map(|us| std::time::Duration::from_micros(us as u64)),
    };
    let claimed = start
        .claim(&mut Terminal::new(&a.header.tcrypt.progress))
        .map_err(lib_error)?;
    // The table input is read once: it may be standard input.
    let what = match a.header.device.clone() {
        None => What::Table {
            mapping: open::table(&mut a)?,
            raw: a.raw,
        },
        Some(device) => What::Header {
            device,
            header: a.header.header.clone(),
        },
    };
    let mut locked = claimed
        .lock(what, a.read_only, a.shared)
        .map_err(lib_error)?;
    if locked.needs_unlock() {
        // Unlock in the foreground: the prompt and a wrong passphrase stay with the user.
        let Some((u, hopts)) = super::open_header::unlock(&a.header, !a.read_only)? else {
            return Ok(()); // --test-passphrase is handled by open::run; not reached
        };
        let persist = a.persistent.then(|| Persist {
            perf: a.perf.options(),
            allow_discards: a.header.allow_discards,
        });
        locked
            .unlocked(u, hopts, persist, &super::luks::STAGED)
            .map_err(lib_error)?;
    }

    let mut ready = if a.notify {
        Ready::Notify
    } else if a.foreground {
        Ready::Foreground
    } else {
        daemon::detach(&locked.claimed.dir.paths.log())?
    };
    let serving = Serving {
        read_only: a.read_only,
        cache: a.cache.cache(),
        allow_large_sectors: a.large_sectors,
        perf: a.perf.options(),
        max_connections: a.max_connections,
        workers: a.nbd_workers(),
        log_errors: a.verbose,
        queues: a.queues.map(|q| q as u16),
        pid_file: a.pid_file.clone(),
        take_signals: true,
    };
    let result = locked
        .serve(serving, |shown, link| {
            if let Some(link) = link {
                ready.note(&format!("stable path: {}", link.display()));
            }
            ready.ok(shown);
        })
        .map_err(lib_error);
    if let Err(e) = &result {
        if ready.pending() && ready.fail(e) {
            // The parent prints it; the child exits quietly (locks and directory dropped).
            drop(locked);
            std::process::exit(i32::from(e.code));
        }
    }
    result
}
