//! What the library asks of its caller whenever it needs a person (or a script standing in
//! for one): a passphrase, a new passphrase, a confirmation, the caller's standard input
//! for a key file named `-`, and somewhere to say things (a notice, a debug line, that a
//! long step runs, how a TCRYPT search goes). The unlock policy and reencryption both ask
//! through this one trait; the command implements it once, with a terminal
//! (`cli/prompt.rs`); a test or a program embedding the library with a script.

use crate::error::{Error, ErrorKind, Result};
use crate::secret::Secret;
use std::path::Path;
use ucrypt_format::tcrypt::SearchProgress;

/// A step of an unlock that may take long (a key derivation, a token, a TCRYPT search),
/// shown by the caller while it runs ([`Prompt::busy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The volume key of `--volume-key-file` is checked against the header's digest.
    VolumeKey,
    /// LUKS2 tokens are tried.
    Token,
    /// A passphrase is checked against the keyslots (`--test-passphrase`).
    Passphrase,
    /// The volume is unlocked: the passphrase's key derivation.
    KeyDerivation,
    /// A TCRYPT header search (every KDF and cipher chain); it reports its own progress
    /// through [`Prompt::tcrypt_progress`].
    TcryptSearch,
    /// The PBKDF of a new keyslot is benchmarked (nothing is written yet).
    Benchmark,
    /// A keyslot is added ([`Prompt::write_header`]).
    AddKeyslot,
    /// An unbound keyslot is added ([`Prompt::write_header`]).
    AddUnboundKeyslot,
    /// A keyslot's passphrase is changed ([`Prompt::write_header`]).
    ChangeKeyslot,
    /// A keyslot is rewritten with new PBKDF parameters ([`Prompt::write_header`]).
    ConvertKeyslot,
    /// The header is copied to a backup file ([`Prompt::write_header`]).
    BackupHeader,
    /// A header backup is written back ([`Prompt::write_header`]).
    RestoreHeader,
    /// The volume key is unlocked for a dump.
    DumpVolumeKey,
    /// An unbound keyslot's key is unlocked for a dump.
    UnboundKey,
}

impl Step {
    /// The step that unlocks a volume of `kind`.
    pub fn unlocking(kind: crate::VolumeType) -> Step {
        if kind == crate::VolumeType::Tcrypt {
            Step::TcryptSearch
        } else {
            Step::KeyDerivation
        }
    }

    /// What a spinner says meanwhile; none for a TCRYPT search, which has its own progress.
    pub fn message(self) -> Option<&'static str> {
        match self {
            Step::VolumeKey => Some("Checking the volume key"),
            Step::Token => Some("Unlocking by token"),
            Step::Passphrase => Some("Checking the passphrase"),
            Step::KeyDerivation => Some("Unlocking (key derivation)"),
            Step::TcryptSearch => None,
            Step::Benchmark => Some("Benchmarking the PBKDF"),
            Step::AddKeyslot => Some("Adding the keyslot"),
            Step::AddUnboundKeyslot => Some("Adding the unbound keyslot"),
            Step::ChangeKeyslot => Some("Changing the keyslot"),
            Step::ConvertKeyslot => Some("Converting the keyslot"),
            Step::BackupHeader => Some("Backing up the header"),
            Step::RestoreHeader => Some("Restoring the header"),
            Step::DumpVolumeKey => Some("Unlocking the volume key"),
            Step::UnboundKey => Some("Unlocking the unbound key"),
        }
    }
}

/// The caller's side of the library's interactive operations (unlock, reencryption): the
/// library asks for secrets and confirmations and tells what happens only through this.
pub trait Prompt {
    /// Asks for a secret with `prompt` ("Enter passphrase for disk.img: ", "Enter
    /// VeraCrypt PIM: ") and returns what was given, without a line end.
    ///
    /// # Errors
    /// The caller could not get one (interrupted, timed out, no input); the unlock ends
    /// with this error.
    fn passphrase(&mut self, prompt: &str) -> Result<Secret>;

    /// Asks for a passphrase being set (a new keyslot's), which a terminal may ask twice
    /// to catch a typo; the default asks once, as [`Prompt::passphrase`].
    ///
    /// # Errors
    /// As [`Prompt::passphrase`].
    fn new_passphrase(&mut self, prompt: &str) -> Result<Secret> {
        self.passphrase(prompt)
    }

    /// Confirmation of `question` before something is overwritten.
    ///
    /// # Errors
    /// Not confirmed: the operation stops there, nothing written. The default confirms
    /// nothing.
    fn confirm(&mut self, question: &str) -> Result<()> {
        Err(Error::Invalid(format!("not confirmed: {question}")))
    }

    /// Confirmation of `question` before something that cannot be undone (the last keyslot
    /// destroyed); `refusal` is cryptsetup's word for not going on ("Operation aborted, the
    /// keyslot was NOT wiped.").
    ///
    /// # Errors
    /// Not confirmed: nothing is written. The default confirms nothing: `refusal`, as a
    /// permission error (cryptsetup's `EPERM`).
    fn confirm_destroy(&mut self, _question: &str, refusal: &str) -> Result<()> {
        Err(Error::Invalid(refusal.to_string()).with_kind(ErrorKind::Permission))
    }

    /// Whether [`Prompt::passphrase`] reads the caller's key file rather than asking
    /// (cryptsetup's LUKS1 reencryption then reads one passphrase only).
    fn uses_key_file(&self) -> bool {
        false
    }

    /// Whether someone types the passphrases, so that a wrong one is asked for again
    /// ([`with_retries`]); a key file or a script is tried once.
    fn interactive(&self) -> bool {
        false
    }

    /// The caller's standard input, for a key file named `-`.
    ///
    /// # Errors
    /// The caller has none to give (the default).
    fn standard_input(&mut self) -> Result<Box<dyn std::io::Read + '_>> {
        Err(Error::Invalid(
            "no standard input to read the key file '-' from".into(),
        ))
    }

    /// Something the user should read ("No key available with this passphrase.").
    fn notice(&mut self, _text: &str) {}

    /// A line of the command's own output (cryptsetup prints it on standard output): which
    /// keyslot a passphrase unlocked under `-v`, a warning about what an option means.
    fn info(&mut self, _text: &str) {}

    /// A warning about what the caller asked for (a volume served without
    /// authentication, a sector size the kernel cannot open), shown however the caller
    /// shows warnings.
    fn warning(&mut self, _text: &str) {}

    /// A debug line (never a secret).
    fn debug(&mut self, _text: &str) {}

    /// A line for `-v` (never a secret): what was tried and why it did not work (one per
    /// LUKS2 token that could not unlock).
    fn verbose(&mut self, _text: &str) {}

    /// `step` begins; it ends when the returned value is dropped (a spinner, a signal
    /// handler: whatever the caller shows or holds meanwhile).
    fn busy(&mut self, _step: Step) -> Box<dyn std::any::Any> {
        Box::new(())
    }

    /// Runs `write`, a header write that `step` names: of the header at `header` (a local
    /// path), at least its first `min_len` bytes (0: the header's own size), or with
    /// `header` none, of a file beside it (a backup). The caller may hold a copy of the
    /// header meanwhile to put it back if the process is interrupted in the middle, or
    /// hold its signals until the write is done (the default runs it as it is).
    ///
    /// # Errors
    /// What `write` returned, or the caller's own (interrupted once the write was done).
    fn write_header(
        &mut self,
        _step: Step,
        _header: Option<&Path>,
        _min_len: u64,
        write: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        write()
    }

    /// The reporter of a TCRYPT header search on `device`, asked for once the passphrase
    /// has been read (none by default).
    fn tcrypt_progress(&mut self, _device: &Path) -> SearchProgress {
        SearchProgress::default()
    }
}

/// The library's retry policy for a passphrase: `attempt` runs once, or, for a passphrase
/// someone types (`typed`: no key file, and [`Prompt::interactive`]), up to `tries` times
/// in all while it fails with [`ErrorKind::Permission`] (a wrong passphrase), each retry
/// after the notice "No key available with this passphrase.". Every passphrase check of the
/// library and its callers (unlock, `luksResume`, LUKS1 reencryption) goes through it.
///
/// # Errors
/// The last attempt's error.
pub fn with_retries<T>(
    prompt: &mut dyn Prompt,
    tries: u32,
    typed: bool,
    mut attempt: impl FnMut(&mut dyn Prompt) -> Result<T>,
) -> Result<T> {
    let tries = if typed && prompt.interactive() {
        tries.max(1)
    } else {
        1
    };
    let mut n = 1;
    loop {
        match attempt(prompt) {
            Err(e) if e.kind() == ErrorKind::Permission && n < tries => {
                prompt.notice("No key available with this passphrase.");
                n += 1;
            }
            r => return r,
        }
    }
}
