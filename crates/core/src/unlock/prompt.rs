//! What the unlock policy asks of its caller: a passphrase, the caller's standard input
//! for a key file named `-`, and somewhere to say things (a notice, a debug line, that a
//! long step runs, how a TCRYPT search goes). The command implements it with a terminal;
//! a test or a program embedding the library with a script.

use super::secret::Secret;
use crate::error::{Error, Result};
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
        }
    }
}

/// The caller's side of an unlock: the library asks for secrets and tells what happens
/// only through this.
pub trait Prompt {
    /// Asks for a secret with `prompt` ("Enter passphrase for disk.img: ", "Enter
    /// VeraCrypt PIM: ") and returns what was given, without a line end.
    ///
    /// # Errors
    /// The caller could not get one (interrupted, timed out, no input); the unlock ends
    /// with this error.
    fn passphrase(&mut self, prompt: &str) -> Result<Secret>;

    /// Whether someone types the passphrases, so that a wrong one is asked for again
    /// (`--tries`); a key file or a script is tried once.
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

    /// The reporter of a TCRYPT header search on `device`, asked for once the passphrase
    /// has been read (none by default).
    fn tcrypt_progress(&mut self, _device: &Path) -> SearchProgress {
        SearchProgress::default()
    }
}
