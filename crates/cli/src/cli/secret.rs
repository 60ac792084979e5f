//! Passphrases and key files, read the way cryptsetup reads them (`tools_get_key`):
//!
//! - `--key-file FILE`: the file's bytes from `--keyfile-offset`, at most `--keyfile-size`
//!   (0: all, up to 8 MiB), newlines included; `-` is standard input read the same way.
//! - no key file, standard input a terminal: a prompt on the terminal with echo off (and a
//!   second "Verify passphrase" prompt for new passphrases).
//! - no key file, standard input a pipe: one line, without its newline.
//!
//! Never from the command line itself. Secrets are read straight into [`Secret`] buffers:
//! locked in RAM (where `RLIMIT_MEMLOCK` allows) and zeroed on drop. (Standard input is read
//! through the standard library's shared buffer, which is neither; a key file is read
//! directly.)

use super::exit::lib_error;
use super::{CliError, WithCode, EXIT_PARAMS};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
pub(crate) use ucrypt::secret::Secret;

/// cryptsetup's maximum interactive passphrase length.
const MAX_PASSPHRASE: usize = 512;

/// `--key-file` and its modifiers, as cryptsetup spells them.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct KeyFileArgs {
    /// Read the passphrase from this file ('-' = standard input) instead of a prompt.
    #[arg(short = 'd', long, value_name = "FILE")]
    pub(crate) key_file: Option<PathBuf>,
    /// Skip this many bytes at the start of the key file.
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    pub(crate) keyfile_offset: u64,
    /// Read at most this many bytes from the key file (0: all).
    #[arg(short = 'l', long, default_value_t = 0, value_name = "BYTES")]
    pub(crate) keyfile_size: u64,
}

impl KeyFileArgs {
    /// The options as the library's unlock takes them.
    pub(crate) fn inputs(&self) -> ucrypt::unlock::KeyFile {
        ucrypt::unlock::KeyFile {
            path: self.key_file.clone(),
            offset: self.keyfile_offset,
            size: self.keyfile_size,
        }
    }
}

/// `--new-keyfile-offset` and `--new-keyfile-size`: where the new passphrase is in the new
/// key file (luksAddKey, luksChangeKey).
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct NewKeyFileArgs {
    /// Skip this many bytes at the start of the new key file.
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    pub(crate) new_keyfile_offset: u64,
    /// Read at most this many bytes from the new key file (0: all).
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    pub(crate) new_keyfile_size: u64,
}

impl NewKeyFileArgs {
    /// The new key file `file` with these offsets, as the library takes it.
    pub(crate) fn inputs(&self, file: Option<&Path>) -> ucrypt::unlock::KeyFile {
        ucrypt::unlock::KeyFile {
            path: file.map(Path::to_path_buf),
            offset: self.new_keyfile_offset,
            size: self.new_keyfile_size,
        }
    }
}

/// Reads a key file: a path or '-' for standard input (from `offset`, at most `size`
/// bytes, 0: all; the library's rules, [`ucrypt::unlock::read_key`]).
pub(crate) fn read_key_file(path: &Path, offset: u64, size: u64) -> Result<Secret, CliError> {
    if path.as_os_str() == "-" {
        return ucrypt::unlock::read_key(std::io::stdin().lock(), "standard input", offset, size)
            .map_err(lib_error);
    }
    ucrypt::unlock::read_key_file(path, offset, size).map_err(lib_error)
}

/// Whether standard input is a terminal (passphrases are then prompted for, echo off).
pub(crate) fn stdin_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(libc::STDIN_FILENO) == 1 }
}

/// Set by [`on_prompt_signal`] while a [`PromptSignals`] guard is alive.
static PROMPT_INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_prompt_signal(_sig: libc::c_int) {
    // Async-signal-safe: one atomic store.
    PROMPT_INTERRUPTED.store(true, Ordering::SeqCst);
}

/// While alive, SIGINT/SIGTERM/SIGHUP interrupt this thread's read of the terminal instead
/// of killing the process with echo still off, or going unseen to a server's signal
/// thread (which blocks them in every other thread before the passphrase is asked for):
/// they are unblocked on this thread and caught without `SA_RESTART`, so the read returns
/// `EINTR`, the prompt fails with "interrupted" and the terminal is restored. Dropping the
/// guard puts back the handlers and the mask.
struct PromptSignals(#[allow(dead_code)] super::signals::Guard);

impl PromptSignals {
    fn new() -> PromptSignals {
        PROMPT_INTERRUPTED.store(false, Ordering::SeqCst);
        // No SA_RESTART: the read must return EINTR.
        PromptSignals(super::signals::install(
            &super::signals::INTERRUPTS,
            on_prompt_signal,
            0,
        ))
    }
}

/// The error of a prompt ended by a signal (exit code 1, as cryptsetup's).
fn interrupted() -> CliError {
    anyhow::anyhow!("interrupted at the prompt; nothing was changed").into()
}

/// Reads one line from standard input (a pipe), without the newline.
fn read_line() -> Result<Secret, CliError> {
    let mut line = Secret::new();
    let mut stdin = std::io::stdin().lock();
    loop {
        // A signal caught before the read blocks would otherwise wait for the next one.
        if PROMPT_INTERRUPTED.load(Ordering::SeqCst) {
            return Err(interrupted());
        }
        let avail = match stdin.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                if PROMPT_INTERRUPTED.load(Ordering::SeqCst) {
                    return Err(interrupted());
                }
                continue;
            }
            Err(e) => {
                return Err(
                    anyhow::anyhow!("reading the passphrase from standard input: {e}").into(),
                )
            }
        };
        if avail.is_empty() {
            break;
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        // Without the newline.
        line.push(&avail[..take - usize::from(done)]);
        stdin.consume(take);
        if done {
            break;
        }
    }
    Ok(line)
}

/// Echo off on the terminal for the guard's lifetime.
struct NoEcho {
    fd: i32,
    saved: libc::termios,
}

impl NoEcho {
    fn new(fd: i32) -> Option<Self> {
        // SAFETY: termios is plain data; tcgetattr fills it for a terminal descriptor.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `t` is a valid out-pointer.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return None;
        }
        let saved = t;
        t.c_lflag &= !libc::ECHO;
        t.c_lflag |= libc::ICANON;
        // SAFETY: `t` is a valid termios for this descriptor.
        unsafe { libc::tcsetattr(fd, libc::TCSAFLUSH, &t) };
        Some(NoEcho { fd, saved })
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `new` on the same descriptor.
        unsafe { libc::tcsetattr(self.fd, libc::TCSAFLUSH, &self.saved) };
    }
}

/// `--timeout`: seconds a terminal prompt waits for its line (0: forever).
static TIMEOUT_SECS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Sets `--timeout` for every passphrase prompt of this process.
pub(crate) fn set_timeout(secs: u32) {
    TIMEOUT_SECS.store(secs, Ordering::Relaxed);
}

/// With `--timeout`: waits until the terminal has a line to read (canonical mode: a whole
/// line or end of input), at most the timeout; as cryptsetup's `select` before its read.
fn wait_for_line() -> Result<(), CliError> {
    let secs = TIMEOUT_SECS.load(Ordering::Relaxed);
    if secs == 0 {
        return Ok(());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs.into());
    loop {
        if PROMPT_INTERRUPTED.load(Ordering::SeqCst) {
            return Err(interrupted());
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(anyhow::anyhow!(
                "no passphrase typed within --timeout {secs} s; nothing was changed"
            ))
            .code(EXIT_PARAMS);
        }
        let mut pfd = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd for the duration of the call.
        match unsafe { libc::poll(&mut pfd, 1, ms) } {
            n if n > 0 => return Ok(()),
            0 => {}
            _ => {
                if PROMPT_INTERRUPTED.load(Ordering::SeqCst) {
                    return Err(interrupted());
                }
            }
        }
    }
}

/// Prompts on the terminal with echo off and reads one line (within `--timeout`).
fn prompt_tty(prompt: &str) -> Result<Secret, CliError> {
    use std::io::Write;
    let mut err = std::io::stderr();
    let line = {
        // Signals are caught and echo is off before the prompt shows: a Ctrl-C as soon as
        // it appears ends the prompt as one pressed later does, and nothing typed echoes.
        let _signals = PromptSignals::new();
        let _guard = NoEcho::new(libc::STDIN_FILENO);
        let _ = write!(err, "{prompt}");
        let _ = err.flush();
        wait_for_line().and_then(|()| read_line())
    };
    let _ = writeln!(err);
    let line = line?;
    if line.len() > MAX_PASSPHRASE {
        return Err(anyhow::anyhow!(
            "passphrase is longer than {MAX_PASSPHRASE} characters"
        ))
        .code(EXIT_PARAMS);
    }
    Ok(line)
}

/// cryptsetup's `-y` (ask every terminal passphrase twice: 2) and `-q` (never: 1), or
/// neither (0: new passphrases twice, existing ones once).
static VERIFY: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets the verification rule from `-y/--verify-passphrase` and `-q/--batch-mode`
/// (cryptsetup's `verify_passphrase`: `-y` wins; batch mode switches verification off).
pub(crate) fn set_verify(verify_passphrase: bool, batch_mode: bool) {
    let v = if verify_passphrase {
        2
    } else if batch_mode {
        1
    } else {
        0
    };
    VERIFY.store(v, Ordering::Relaxed);
}

/// Gets a secret: from `file` if given, else a prompt on a terminal, else one line of
/// standard input. `verify`: ask twice on a terminal (new passphrases; see [`set_verify`]).
pub(crate) fn get(
    file: Option<(&Path, u64, u64)>,
    prompt: &str,
    verify: bool,
) -> Result<Secret, CliError> {
    if let Some((path, offset, size)) = file {
        return read_key_file(path, offset, size);
    }
    let verify = match VERIFY.load(Ordering::Relaxed) {
        2 => true,
        1 => false,
        _ => verify,
    };
    if verify && VERIFY.load(Ordering::Relaxed) == 2 && !stdin_is_tty() {
        eprintln!("Can't do passphrase verification on non-tty inputs.");
    }
    if !stdin_is_tty() && ASK_PASSWORD.load(Ordering::Relaxed) {
        return ask_password(prompt);
    }
    if stdin_is_tty() {
        let first = prompt_tty(prompt)?;
        if verify {
            let second = prompt_tty("Verify passphrase: ")?;
            if *first != *second {
                return Err(anyhow::anyhow!("passphrases do not match")).code(2);
            }
        }
        return Ok(first);
    }
    read_line()
}

/// `--notify`: without a terminal, passphrases are asked through systemd-ask-password
/// (the console, Plymouth, or `systemd-tty-ask-password-agent`), as systemd-cryptsetup
/// asks.
static ASK_PASSWORD: AtomicBool = AtomicBool::new(false);

/// Asks passphrases through systemd-ask-password when standard input is not a terminal.
pub(crate) fn set_ask_password(on: bool) {
    ASK_PASSWORD.store(on, Ordering::Relaxed);
}

/// Whether a passphrase is asked of someone (a terminal, or systemd-ask-password), who
/// may be asked again after a wrong one (`--tries`).
pub(crate) fn asks_someone() -> bool {
    stdin_is_tty() || ASK_PASSWORD.load(Ordering::Relaxed)
}

/// One passphrase through `systemd-ask-password` (its output: the passphrase and a
/// newline), within `--timeout` if one is set.
fn ask_password(prompt: &str) -> Result<Secret, CliError> {
    let secs = TIMEOUT_SECS.load(Ordering::Relaxed);
    let out = std::process::Command::new("systemd-ask-password")
        .arg("--icon=drive-harddisk")
        .arg("--id=ucrypt")
        .arg(format!("--timeout={secs}"))
        .arg(prompt.trim_end())
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| anyhow::anyhow!("running systemd-ask-password: {e}"))?;
    let mut bytes = zeroize::Zeroizing::new(out.stdout);
    if !out.status.success() {
        return Err(anyhow::anyhow!(
            "no passphrase: systemd-ask-password failed ({})",
            out.status
        ))
        .code(EXIT_PARAMS);
    }
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    Ok(Secret::copy_of(&bytes))
}

/// The existing passphrase for `device`, from `--key-file` or a prompt.
pub(crate) fn existing(k: &KeyFileArgs, device: &Path) -> Result<Secret, CliError> {
    existing_asking(k, &format!("Enter passphrase for {}: ", device.display()))
}

/// [`existing`] with the prompt a command asks with (cryptsetup's own words: luksAddKey's
/// "Enter any existing passphrase: ", luksRemoveKey's "Enter passphrase to be deleted: ").
fn existing_asking(k: &KeyFileArgs, prompt: &str) -> Result<Secret, CliError> {
    get(
        k.key_file
            .as_deref()
            .map(|p| (p, k.keyfile_offset, k.keyfile_size)),
        prompt,
        false,
    )
}

/// Asks "Are you sure? (Type 'yes' in capital letters)" unless `batch`; a non-terminal
/// without `--batch-mode` is a refusal. Any answer but YES is "operation aborted", exit 1.
pub(crate) fn confirm(batch: bool, warning: &str) -> Result<(), CliError> {
    confirm_or(batch, warning, "operation aborted", EXIT_PARAMS)
}

/// [`confirm`] with the refusal's words and exit code.
pub(crate) fn confirm_or(
    batch: bool,
    warning: &str,
    aborted: &str,
    code: u8,
) -> Result<(), CliError> {
    if batch {
        return Ok(());
    }
    if !stdin_is_tty() {
        return Err(anyhow::anyhow!(
            "{warning}; not confirmed (use --batch-mode / -q to confirm without a terminal). \
             {aborted}"
        ))
        .code(code);
    }
    eprintln!("\nWARNING!\n========\n{warning}.\n");
    let mut answer = String::new();
    {
        let _signals = PromptSignals::new();
        eprint!("Are you sure? (Type 'yes' in capital letters): ");
        loop {
            if PROMPT_INTERRUPTED.load(Ordering::SeqCst) {
                eprintln!();
                return Err(interrupted());
            }
            match std::io::stdin().read_line(&mut answer) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    if PROMPT_INTERRUPTED.load(Ordering::SeqCst) {
                        eprintln!();
                        return Err(interrupted());
                    }
                }
                Err(e) => return Err(anyhow::anyhow!("reading the answer: {e}").into()),
            }
        }
    }
    if answer.trim_end_matches('\n') != "YES" {
        return Err(anyhow::anyhow!("{aborted}")).code(code);
    }
    Ok(())
}
