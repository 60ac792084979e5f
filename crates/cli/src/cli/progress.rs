//! Progress and interruption for every command that can take more than a second: the one
//! place that decides how progress is shown and what Ctrl-C does meanwhile.
//!
//! **Showing progress.**
//! - [`Bytes`]: work measured in bytes over a device (wipes, reencryption). On a terminal
//!   an indicatif bar on stderr; with `--progress-json` cryptsetup 2.6's JSON lines on
//!   stdout (`{"device":"..","device_bytes":"N","device_size":"N","speed":"N",
//!   "eta_ms":"N","time_ms":"N"}`, every value a decimal string, a line every 0.5 s or
//!   `--progress-frequency` seconds and one when done, as `tools_time_progress_json`);
//!   with `--progress-frequency` alone cryptsetup's `Progress: ..` / `Finished, ..` lines
//!   on stdout. Nothing when stderr is not a terminal and neither option is given.
//! - [`Steps`]: a known number of steps (benchmark cells, bench repeats): a bar on stderr
//!   when it is a terminal, nothing otherwise.
//! - [`Search`]: a TCRYPT/VeraCrypt header search (KDF × cipher chain combinations, ETA from
//!   the KDFs' costs): a bar, or `--progress-json`/`--progress-frequency` lines as
//!   [`Bytes`] prints them.
//! - [`Spinner`]: work of unknown length (PBKDF benchmarks, header backup/restore): a
//!   spinner with elapsed time on stderr when it is a terminal, nothing otherwise.
//!
//! **Interruption.** While an [`ExitOnSignal`] guard lives (phases that write nothing: KDF
//! and TCRYPT searches, benchmarks), SIGINT/SIGTERM/SIGHUP end the process at once with
//! "interrupted; nothing was changed" and exit code 1. While a [`StopOnSignal`] guard
//! lives (phases that write: wipes), they only set a flag ([`StopOnSignal::stopped`]); the
//! loop stops at its next boundary and reports how far it got. During a keyslot write
//! ([`writing_header`]) the handler writes back the header area read before the write and
//! exits ("the header was put back as it was before", exit 1). Handlers are installed
//! through [`super::signals::install`].

use super::signals::{install, Guard, INTERRUPTS};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// `--progress-json` and `--progress-frequency`, cryptsetup's spellings.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct ProgressArgs {
    /// Print progress as JSON lines on standard output (cryptsetup's format, for scripts).
    #[arg(long)]
    pub(crate) progress_json: bool,
    /// Seconds between progress updates; progress is then printed as lines on standard
    /// output instead of a bar.
    #[arg(long, value_name = "SECS")]
    pub(crate) progress_frequency: Option<u32>,
}

/// How a [`Bytes`] progress is reported.
enum Mode {
    /// An indicatif bar (hidden by indicatif itself when stderr is not a terminal).
    Bar(indicatif::ProgressBar),
    /// cryptsetup's JSON lines on stdout.
    Json,
    /// cryptsetup's text lines on stdout every `--progress-frequency` seconds.
    Lines,
}

/// Progress over `size` bytes of `device` (see the module docs).
pub(crate) struct Bytes {
    mode: Mode,
    device: String,
    size: u64,
    start: Instant,
    /// When the last line was printed (JSON and text lines).
    last: Instant,
    frequency: Duration,
    done: u64,
    /// Where this run started (a resumed operation): speed counts from here.
    start_offset: u64,
    /// The final line was printed.
    ended: bool,
}

impl Bytes {
    /// Starts reporting `what` ("Wiping") over `size` bytes of `device`.
    pub(crate) fn new(args: &ProgressArgs, what: &str, device: &str, size: u64) -> Bytes {
        let mode = if args.progress_json {
            Mode::Json
        } else if args.progress_frequency.is_some() {
            Mode::Lines
        } else {
            let bar = indicatif::ProgressBar::new(size);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{what} {{bytes}}/{{total_bytes}} [{{bar:30}}] {{percent}}% \
                     {{bytes_per_sec}}, ETA {{eta}}"
                ))
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            Mode::Bar(bar)
        };
        let now = Instant::now();
        Bytes {
            mode,
            device: device.to_string(),
            size,
            start: now,
            last: now,
            frequency: args
                .progress_frequency
                .map_or(Duration::from_millis(500), |s| {
                    Duration::from_secs(u64::from(s.max(1)))
                }),
            done: 0,
            start_offset: 0,
            ended: false,
        }
    }

    /// The work resumes at `done` (done by an earlier run): the bar starts there and the
    /// speed counts only what this run does, as cryptsetup's `start_offset`.
    pub(crate) fn resume_at(&mut self, done: u64) {
        self.done = done.min(self.size);
        self.start_offset = self.done;
        if let Mode::Bar(b) = &self.mode {
            b.set_position(self.done);
            b.reset_eta();
        }
    }

    /// `done` of the size are done.
    pub(crate) fn set(&mut self, done: u64) {
        self.done = done.min(self.size);
        let fin = self.done == self.size;
        match &self.mode {
            Mode::Bar(b) => b.set_position(self.done),
            Mode::Json | Mode::Lines => {
                let now = Instant::now();
                if self.ended || (!fin && now.duration_since(self.last) < self.frequency) {
                    return;
                }
                self.ended = fin;
                self.last = now;
                self.print_line(now, fin);
            }
        }
    }

    fn print_line(&self, now: Instant, fin: bool) {
        let secs = now.duration_since(self.start).as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        let speed = self.done.saturating_sub(self.start_offset) as f64 / secs;
        // cryptsetup's estimate: the whole size at the average speed, minus the time spent.
        let eta = if fin || speed <= 0.0 {
            0.0
        } else {
            ((self.size - self.start_offset) as f64 / speed - secs).max(0.0)
        };
        let line = match self.mode {
            Mode::Json => json_line(
                &self.device,
                self.done,
                self.size,
                speed as u64,
                (eta * 1e3) as u64,
                (secs * 1e3) as u64,
            ),
            _ if fin => format!(
                "Finished, time {}, {}, {}\n",
                human_time(secs),
                written(self.done),
                speed_text(speed)
            ),
            _ => format!(
                "Progress: {:5.1}%, ETA {}, {}, {}\n",
                self.done as f64 / self.size.max(1) as f64 * 100.0,
                human_time(eta),
                written(self.done),
                speed_text(speed)
            ),
        };
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }

    /// The work is complete: the bar is cleared, the last line printed.
    pub(crate) fn finish(mut self) {
        self.set(self.size);
        if let Mode::Bar(b) = &self.mode {
            b.finish_and_clear();
        }
    }

    /// The work stopped early: the bar is cleared (the caller reports how far it got).
    pub(crate) fn abandon(self) {
        if let Mode::Bar(b) = &self.mode {
            b.finish_and_clear();
        }
    }
}

/// cryptsetup's closing line, `Finished, time 00m01s,   24 MiB written, speed  92.8 MiB/s`
/// (`word` replaces "Finished" for a run that stopped early), for commands that always
/// report their throughput.
pub(crate) fn summary_line(word: &str, bytes: u64, secs: f64) -> String {
    format!(
        "{word}, time {}, {}, {}",
        human_time(secs),
        written(bytes),
        speed_text(bytes as f64 / secs.max(1e-9))
    )
}

/// One `--progress-json` line, as cryptsetup 2.6 prints it (every value a string).
pub(crate) fn json_line(
    device: &str,
    bytes: u64,
    size: u64,
    speed: u64,
    eta_ms: u64,
    time_ms: u64,
) -> String {
    // The device name is the only free text: escaped as a JSON string by serde_json.
    let device = serde_json::Value::String(device.to_string()).to_string();
    format!(
        "{{\"device\":{device},\"device_bytes\":\"{bytes}\",\"device_size\":\"{size}\",\
         \"speed\":\"{speed}\",\"eta_ms\":\"{eta_ms}\",\"time_ms\":\"{time_ms}\"}}\n"
    )
}

/// cryptsetup's time format: `12m44s`, `26h12m44s` past 90 minutes, `3 days` past 36 hours.
fn human_time(secs: f64) -> String {
    let s = secs as u64;
    if s < 90 * 60 {
        format!("{:02}m{:02}s", s / 60, s % 60)
    } else if s < 36 * 3600 {
        format!("{:02}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{:02} days", s / 86400)
    }
}

/// cryptsetup's `%4 MiB written` (MiB below 4 GiB, GiB below 4 TiB, ...).
fn written(bytes: u64) -> String {
    let (n, unit) = if bytes < 1 << 32 {
        (bytes >> 20, "MiB")
    } else if bytes < 1 << 42 {
        (bytes >> 30, "GiB")
    } else if bytes < 1 << 52 {
        (bytes >> 40, "TiB")
    } else {
        (bytes >> 50, "PiB")
    };
    format!("{n:4} {unit} written")
}

/// cryptsetup's `speed %5.1f MiB/s`.
fn speed_text(per_sec: f64) -> String {
    let (v, unit) = if per_sec > 1_073_741_824.0 {
        (per_sec / 1_073_741_824.0, "GiB")
    } else if per_sec > 1_048_576.0 {
        (per_sec / 1_048_576.0, "MiB")
    } else if per_sec > 1024.0 {
        (per_sec / 1024.0, "KiB")
    } else {
        (per_sec, "B")
    };
    format!("speed {v:5.1} {unit}/s")
}

/// Progress of a TCRYPT/VeraCrypt header search (every KDF × cipher chain combination): on
/// a terminal a bar with the combinations tried and an ETA (estimated from the KDFs'
/// costs, so the cheap TrueCrypt KDFs tried first do not make it look short); with
/// `--progress-json` cryptsetup's JSON lines on stdout, `device_bytes`/`device_size`
/// counting combinations tried/total and `speed` combinations per second; with
/// `--progress-frequency` alone `Progress: ..` lines.
pub(crate) struct Search {
    mode: Mode,
    device: String,
    start: Instant,
    last: Option<Instant>,
    /// The counts of the last line printed (tried, cost done).
    printed: Option<(u64, u64)>,
    frequency: Duration,
}

impl Search {
    /// A reporter for `ucrypt::format::TcryptOptions::progress`.
    pub(crate) fn callback(args: &ProgressArgs, device: &str) -> ucrypt::format::SearchProgress {
        let mode = if args.progress_json {
            Mode::Json
        } else if args.progress_frequency.is_some() {
            Mode::Lines
        } else {
            let bar = indicatif::ProgressBar::new(1);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "Searching TCRYPT/VeraCrypt headers [{elapsed_precise}] [{bar:30}] {msg}, \
                     ETA {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            if std::io::stderr().is_terminal() {
                bar.enable_steady_tick(Duration::from_millis(200));
            } else {
                bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
            }
            Mode::Bar(bar)
        };
        let search = std::sync::Mutex::new(Search {
            mode,
            device: device.to_string(),
            start: Instant::now(),
            last: None,
            printed: None,
            frequency: args
                .progress_frequency
                .map_or(Duration::from_millis(500), |s| {
                    Duration::from_secs(u64::from(s.max(1)))
                }),
        });
        ucrypt::format::SearchProgress(Some(std::sync::Arc::new(move |step| {
            if let Ok(mut s) = search.lock() {
                s.update(step);
            }
        })))
    }

    fn update(&mut self, step: ucrypt::format::SearchStep) {
        let now = Instant::now();
        let fin = step.finished;
        let secs = now.duration_since(self.start).as_secs_f64();
        // Time left from the cost rate (the KDFs' costs differ a thousandfold).
        let eta = if step.cost_done == 0 || fin {
            0.0
        } else {
            secs * (step.cost_total - step.cost_done) as f64 / step.cost_done as f64
        };
        match &self.mode {
            Mode::Bar(b) => {
                b.set_length(step.cost_total.max(1));
                b.set_position(step.cost_done);
                b.set_message(format!(
                    "{}/{} KDF x cipher combinations",
                    step.tried, step.total
                ));
                if fin {
                    b.finish_and_clear();
                }
            }
            Mode::Json | Mode::Lines => {
                // Lines once something was tried, at most every `frequency`, the final one
                // always (unless the same counts were just printed).
                let printed = (step.tried, step.cost_done);
                let soon = self
                    .last
                    .is_some_and(|l| now.duration_since(l) < self.frequency);
                if step.tried == 0 || self.printed == Some(printed) || (!fin && soon) {
                    return;
                }
                self.last = Some(now);
                self.printed = Some(printed);
                let line = if matches!(self.mode, Mode::Json) {
                    json_line(
                        &self.device,
                        step.tried,
                        step.total,
                        (step.tried as f64 / secs.max(1e-3)) as u64,
                        (eta * 1e3) as u64,
                        (secs * 1e3) as u64,
                    )
                } else {
                    format!(
                        "Progress: {:5.1}%, ETA {}, {}/{} KDF x cipher combinations tried\n",
                        step.cost_done as f64 / step.cost_total.max(1) as f64 * 100.0,
                        human_time(eta),
                        step.tried,
                        step.total
                    )
                };
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(line.as_bytes());
                let _ = out.flush();
            }
        }
    }
}

impl Drop for Search {
    fn drop(&mut self) {
        if let Mode::Bar(b) = &self.mode {
            b.finish_and_clear();
        }
    }
}

/// A bar over a known number of steps on stderr (hidden when stderr is not a terminal).
pub(crate) struct Steps(indicatif::ProgressBar);

impl Steps {
    /// `total` steps of `what`.
    pub(crate) fn new(what: &str, total: u64) -> Steps {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{{spinner}} {what} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {{msg}}"
            ))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        if std::io::stderr().is_terminal() {
            bar.enable_steady_tick(Duration::from_millis(200));
        }
        Steps(bar)
    }

    /// What the current step is.
    pub(crate) fn message(&self, msg: impl Into<String>) {
        self.0.set_message(msg.into());
    }

    /// One more step done.
    pub(crate) fn inc(&self) {
        self.0.inc(1);
    }

    /// Clears the bar.
    pub(crate) fn finish(self) {
        self.0.finish_and_clear();
    }

    /// Runs `f` (printing to stdout) with the bar taken off the terminal meanwhile, so the
    /// lines do not mix with it.
    pub(crate) fn suspend<T>(&self, f: impl FnOnce() -> T) -> T {
        self.0.suspend(f)
    }
}

/// A spinner with elapsed time on stderr for work of unknown length (hidden when stderr
/// is not a terminal); cleared on drop.
pub(crate) struct Spinner(indicatif::ProgressBar);

impl Spinner {
    /// Spins with `what` ("Benchmarking PBKDF") until dropped.
    pub(crate) fn new(what: &str) -> Spinner {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template(&format!("{{spinner}} {what} {{elapsed}}"))
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        if std::io::stderr().is_terminal() {
            bar.enable_steady_tick(Duration::from_millis(120));
        }
        Spinner(bar)
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// Set by [`on_stop_signal`] while a [`StopOnSignal`] lives.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_sig: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP.store(true, Ordering::SeqCst);
}

/// What [`on_exit_signal`] prints: a `&'static str` set by [`ExitOnSignal::with_message`]
/// (pointer and length, each stored atomically before the handler is installed).
static EXIT_MSG: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static EXIT_MSG_LEN: AtomicUsize = AtomicUsize::new(0);

/// The default message of [`ExitOnSignal`].
const NOTHING_CHANGED: &str = "ucrypt: interrupted; nothing was changed\n";

extern "C" fn on_exit_signal(_sig: libc::c_int) {
    // Async-signal-safe only: atomic loads, write(2) and _exit(2). The bar's line is
    // cleared first on a terminal so the message starts at the left.
    const CLEAR: &[u8] = b"\r\x1b[2K";
    let (p, n) = (
        EXIT_MSG.load(Ordering::SeqCst),
        EXIT_MSG_LEN.load(Ordering::SeqCst),
    );
    // SAFETY: write(2) of static buffers (EXIT_MSG points to a `&'static str` of
    // EXIT_MSG_LEN bytes, or is null) and _exit(2) are async-signal-safe.
    unsafe {
        if libc::isatty(libc::STDERR_FILENO) == 1 {
            libc::write(libc::STDERR_FILENO, CLEAR.as_ptr().cast(), CLEAR.len());
        }
        if p.is_null() {
            libc::write(
                libc::STDERR_FILENO,
                NOTHING_CHANGED.as_ptr().cast(),
                NOTHING_CHANGED.len(),
            );
        } else {
            libc::write(libc::STDERR_FILENO, p.cast_const().cast(), n);
        }
        libc::_exit(1);
    }
}

/// While alive, SIGINT/SIGTERM/SIGHUP exit at once (code 1, "interrupted; nothing was
/// changed"): for phases that write nothing (KDF and TCRYPT searches, benchmarks).
pub(crate) struct ExitOnSignal(#[allow(dead_code)] Guard);

impl ExitOnSignal {
    /// Exits with "ucrypt: interrupted; nothing was changed".
    pub(crate) fn new() -> ExitOnSignal {
        Self::with_message(NOTHING_CHANGED)
    }

    /// Exits printing `msg` (a whole line, "ucrypt: " and newline included).
    pub(crate) fn with_message(msg: &'static str) -> ExitOnSignal {
        EXIT_MSG_LEN.store(msg.len(), Ordering::SeqCst);
        EXIT_MSG.store(msg.as_ptr().cast_mut(), Ordering::SeqCst);
        ExitOnSignal(install(&INTERRUPTS, on_exit_signal, libc::SA_RESTART))
    }
}

/// Runs `f` (a phase that writes nothing: a KDF or TCRYPT search) under a spinner saying
/// `what`, with Ctrl-C exiting at once ([`ExitOnSignal`]).
pub(crate) fn searching<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let _exit = ExitOnSignal::new();
    let _spin = Spinner::new(what);
    f()
}

/// As [`searching`], with a spinner only when `what` is given (a TCRYPT search draws its
/// own bar, [`Search`]).
pub(crate) fn searching_maybe<T>(what: Option<&str>, f: impl FnOnce() -> T) -> T {
    match what {
        Some(w) => searching(w, f),
        None => {
            let _exit = ExitOnSignal::new();
            f()
        }
    }
}

/// Runs `f` (a library call that writes a header: keyslot creation with its PBKDF
/// benchmark, header backup or restore) under a spinner saying `what`. A signal meanwhile
/// cannot cut the write short: it is held until `f` returns, then the command ends with
/// "interrupted" (exit 1, as cryptsetup's), naming what was completed first.
pub(crate) fn writing<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, super::CliError>,
) -> Result<T, super::CliError> {
    let stop = StopOnSignal::new();
    let spin = Spinner::new(what);
    let r = f();
    drop(spin);
    if stop.stopped() && r.is_ok() {
        return Err(anyhow::anyhow!(
            "interrupted while {}; it had already started and was completed first",
            what.to_lowercase()
        )
        .into());
    }
    r
}

/// The header snapshot [`on_restore_signal`] writes back: descriptor, bytes (from offset
/// 0) and their length, set by [`HeaderSnapshot::take`] before its handler is installed.
static RESTORE_FD: AtomicI32 = AtomicI32::new(-1);
static RESTORE_PTR: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static RESTORE_LEN: AtomicUsize = AtomicUsize::new(0);
/// The thread running the header write: the handler runs there, never beside it.
static WRITER_TID: AtomicI32 = AtomicI32::new(0);

const HEADER_PUT_BACK: &str = "ucrypt: interrupted; the header was put back as it was before\n";
const HEADER_NOT_PUT_BACK: &str = "ucrypt: interrupted, and putting the header back failed: \
     restore it from a header backup (luksHeaderRestore)\n";

extern "C" fn on_restore_signal(sig: libc::c_int) {
    // Async-signal-safe only: atomics, gettid/tgkill/pwrite/fdatasync/write/_exit.
    // SAFETY: every call is a plain syscall on values set before the handler was
    // installed; RESTORE_PTR points to RESTORE_LEN bytes kept alive until it is cleared,
    // which happens only after the handler is uninstalled.
    unsafe {
        let writer = WRITER_TID.load(Ordering::SeqCst);
        let me = libc::syscall(libc::SYS_gettid) as i32;
        if writer > 0 && me != writer {
            // Another thread (a spinner, an Argon2 worker) got it: the writer handles it,
            // so that no write of its own can follow the restore.
            libc::syscall(libc::SYS_tgkill, libc::getpid(), writer, sig);
            return;
        }
        const CLEAR: &[u8] = b"\r\x1b[2K";
        if libc::isatty(libc::STDERR_FILENO) == 1 {
            libc::write(libc::STDERR_FILENO, CLEAR.as_ptr().cast(), CLEAR.len());
        }
        let (fd, p, n) = (
            RESTORE_FD.load(Ordering::SeqCst),
            RESTORE_PTR.load(Ordering::SeqCst),
            RESTORE_LEN.load(Ordering::SeqCst),
        );
        let mut off = 0usize;
        while fd >= 0 && !p.is_null() && off < n {
            let w = libc::pwrite(fd, p.add(off).cast(), n - off, off as libc::off_t);
            if w > 0 {
                off += w as usize;
            } else if w < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            } else {
                break;
            }
        }
        let ok = off == n && fd >= 0 && libc::fdatasync(fd) == 0;
        let msg = if ok {
            HEADER_PUT_BACK
        } else {
            HEADER_NOT_PUT_BACK
        };
        libc::write(libc::STDERR_FILENO, msg.as_ptr().cast(), msg.len());
        libc::_exit(1);
    }
}

/// The header area as it was before a header write, and the handler that writes it back
/// and exits when SIGINT/SIGTERM/SIGHUP arrive ([`on_restore_signal`]); uninstalled and
/// forgotten on drop.
struct HeaderSnapshot {
    /// Taken first on drop: no handler may see the bytes after they are freed.
    signals: Option<Guard>,
    _bytes: Vec<u8>,
    _file: std::fs::File,
}

impl HeaderSnapshot {
    /// Reads the first `max(header area, min_bytes)` bytes of `path` (at most its size; the
    /// header area as `remote_header::header_bytes` measures it) and installs the handler.
    fn take(path: &std::path::Path, min_bytes: u64) -> std::io::Result<HeaderSnapshot> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::FileExt;
        use std::os::unix::io::AsRawFd;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let size = file.seek(SeekFrom::End(0))?;
        let read = |file: &std::fs::File, at: u64, len: usize| -> std::io::Result<Vec<u8>> {
            let mut buf = vec![0u8; len];
            let mut done = 0;
            while done < len {
                match file.read_at(&mut buf[done..], at + done as u64)? {
                    0 => break,
                    n => done += n,
                }
            }
            buf.truncate(done);
            Ok(buf)
        };
        let first = read(&file, 0, 4096.min(size as usize))?;
        let area = ucrypt::remote_header::header_bytes(&first, size, &mut |at, len| {
            Ok(read(&file, at, len)?)
        })
        .unwrap_or(4096);
        let want = area.max(min_bytes).min(size);
        let bytes = read(&file, 0, want as usize)?;
        RESTORE_LEN.store(bytes.len(), Ordering::SeqCst);
        RESTORE_PTR.store(bytes.as_ptr().cast_mut(), Ordering::SeqCst);
        RESTORE_FD.store(file.as_raw_fd(), Ordering::SeqCst);
        // SAFETY: gettid has no preconditions.
        WRITER_TID.store(
            unsafe { libc::syscall(libc::SYS_gettid) } as i32,
            Ordering::SeqCst,
        );
        let signals = install(&INTERRUPTS, on_restore_signal, libc::SA_RESTART);
        Ok(HeaderSnapshot {
            signals: Some(signals),
            _bytes: bytes,
            _file: file,
        })
    }
}

impl Drop for HeaderSnapshot {
    fn drop(&mut self) {
        drop(self.signals.take());
        RESTORE_FD.store(-1, Ordering::SeqCst);
        RESTORE_PTR.store(std::ptr::null_mut(), Ordering::SeqCst);
        RESTORE_LEN.store(0, Ordering::SeqCst);
        WRITER_TID.store(0, Ordering::SeqCst);
    }
}

/// Runs `f` (a libcryptsetup call that derives a new keyslot's key and writes the header at
/// `header`: luksFormat, luksAddKey, luksChangeKey, luksConvertKey, luksHeaderRestore)
/// under a spinner saying `what`, with Ctrl-C/SIGTERM/SIGHUP ending it at once: the header
/// area (at least `min_bytes`) read before `f` starts is written back, whatever `f` had
/// done, and the command exits 1 saying so. The key derivation (up to `--iter-time`)
/// no longer holds the signal. When the header cannot be opened for writing here, `f`
/// runs as [`writing`] runs it (its own error then says why).
pub(crate) fn writing_header<T>(
    what: &str,
    header: &std::path::Path,
    min_bytes: u64,
    f: impl FnOnce() -> Result<T, super::CliError>,
) -> Result<T, super::CliError> {
    let snapshot = match HeaderSnapshot::take(header, min_bytes) {
        Ok(s) => s,
        Err(_) => return writing(what, f),
    };
    let spin = Spinner::new(what);
    let r = f();
    drop(spin);
    drop(snapshot);
    r
}

/// While alive, SIGINT/SIGTERM/SIGHUP only set a flag that the writing loop polls
/// ([`StopOnSignal::stopped`]): it stops at a boundary and reports how far it got.
pub(crate) struct StopOnSignal(#[allow(dead_code)] Guard);

impl StopOnSignal {
    pub(crate) fn new() -> StopOnSignal {
        STOP.store(false, Ordering::SeqCst);
        StopOnSignal(install(&INTERRUPTS, on_stop_signal, libc::SA_RESTART))
    }

    /// Whether a signal asked to stop.
    pub(crate) fn stopped(&self) -> bool {
        STOP.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_are_cryptsetups() {
        assert_eq!(
            json_line("/dev/loop0", 1048576, 4194304, 52428800, 60, 20),
            "{\"device\":\"/dev/loop0\",\"device_bytes\":\"1048576\",\"device_size\":\"4194304\",\
             \"speed\":\"52428800\",\"eta_ms\":\"60\",\"time_ms\":\"20\"}\n"
        );
        // A quote in a file name stays valid JSON.
        let l = json_line("a\"b", 0, 1, 0, 0, 0);
        let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_default();
        assert_eq!(v["device"], "a\"b");
    }

    #[test]
    fn text_lines_are_cryptsetups() {
        assert_eq!(human_time(764.0), "12m44s");
        assert_eq!(human_time(26.0 * 3600.0 + 12.0 * 60.0 + 44.0), "26h12m44s");
        assert_eq!(human_time(3.5 * 86400.0), "03 days");
        assert_eq!(written(300 << 20), " 300 MiB written");
        assert_eq!(written(5 << 30), "   5 GiB written");
        assert_eq!(speed_text(52_428_800.0), "speed  50.0 MiB/s");
    }
}
