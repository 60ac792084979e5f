//! The command's side of the library's one prompt ([`ucrypt::prompt::Prompt`], which the
//! unlock policy, the keyslot commands and reencryption ask through): passphrases from the terminal or one line
//! of a pipe (`secret.rs`: echo off, `--timeout`, `-y`), or from the command's key file
//! where it gives one; confirmations unless `--batch-mode`; standard input for
//! `--key-file -`, notices and warnings on stderr, the command's own lines on stdout, `--debug` lines, a spinner with Ctrl-C ending the
//! command while a step runs (nothing is written then), and the TCRYPT search's bar or
//! JSON lines; a header write under a copy of the header that a signal puts back.

use super::exit::{caller_error, EXIT_PERMISSION};
use super::progress::{ExitOnSignal, ProgressArgs, Search, Spinner};
use super::secret::KeyFileArgs;
use super::CliError;
use std::path::Path;
use ucrypt::prompt::{Prompt, Step};
use ucrypt::secret::Secret;

/// The terminal (or pipe) the command runs with.
#[derive(Default)]
pub(crate) struct Terminal {
    /// How a TCRYPT header search shows its progress.
    pub(crate) progress: ProgressArgs,
    /// The key file passphrases are read from instead of asked for (reencryption's
    /// `--key-file`; an unlock reads its key file itself and gives none here).
    pub(crate) key: KeyFileArgs,
    /// `--batch-mode`: confirmations are given.
    pub(crate) batch: bool,
}

impl Terminal {
    /// A prompt whose TCRYPT searches report as `progress` says.
    pub(crate) fn new(progress: &ProgressArgs) -> Terminal {
        Terminal {
            progress: progress.clone(),
            ..Terminal::default()
        }
    }

    /// A prompt whose passphrases come from `key`'s file where it names one, and whose
    /// confirmations `batch` gives.
    pub(crate) fn with_key_file(key: &KeyFileArgs, batch: bool) -> Terminal {
        Terminal {
            key: key.clone(),
            batch,
            ..Terminal::default()
        }
    }

    fn key_file(&self) -> Option<(&Path, u64, u64)> {
        self.key
            .key_file
            .as_deref()
            .map(|p| (p, self.key.keyfile_offset, self.key.keyfile_size))
    }
}

impl Prompt for Terminal {
    fn passphrase(&mut self, prompt: &str) -> ucrypt::Result<Secret> {
        super::secret::get(self.key_file(), prompt, false).map_err(caller_error)
    }

    fn new_passphrase(&mut self, prompt: &str) -> ucrypt::Result<Secret> {
        super::secret::get(self.key_file(), prompt, true).map_err(caller_error)
    }

    fn confirm(&mut self, question: &str) -> ucrypt::Result<()> {
        super::secret::confirm(self.batch, question).map_err(caller_error)
    }

    fn confirm_destroy(&mut self, question: &str, refusal: &str) -> ucrypt::Result<()> {
        super::secret::confirm_or(self.batch, question, refusal, EXIT_PERMISSION)
            .map_err(caller_error)
    }

    fn uses_key_file(&self) -> bool {
        self.key.key_file.is_some()
    }

    fn interactive(&self) -> bool {
        self.key.key_file.is_none() && super::secret::asks_someone()
    }

    fn standard_input(&mut self) -> ucrypt::Result<Box<dyn std::io::Read + '_>> {
        Ok(Box::new(std::io::stdin().lock()))
    }

    fn notice(&mut self, text: &str) {
        eprintln!("{text}");
    }

    fn info(&mut self, text: &str) {
        println!("{text}");
    }

    fn warning(&mut self, text: &str) {
        eprintln!("ucrypt: warning: {text}");
    }

    fn debug(&mut self, text: &str) {
        super::debug(text);
    }

    fn verbose(&mut self, text: &str) {
        if super::VERBOSE.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("{text}");
        }
    }

    fn busy(&mut self, step: Step) -> Box<dyn std::any::Any> {
        let exit = ExitOnSignal::new();
        match step.message() {
            // The spinner goes first, the signal handlers after it.
            Some(what) => Box::new((Spinner::new(what), exit)),
            None => Box::new(exit),
        }
    }

    fn write_header(
        &mut self,
        step: Step,
        header: Option<&Path>,
        min_len: u64,
        write: &mut dyn FnMut() -> ucrypt::Result<()>,
    ) -> ucrypt::Result<()> {
        // The library's own error passes through as it is; only an interruption after the
        // write is the command's.
        let mut failed = None;
        let run = || {
            write().map_err(|e| {
                failed = Some(e);
                CliError::from(anyhow::anyhow!("the header write failed"))
            })
        };
        let what = step.message().unwrap_or_default();
        let r = match header {
            Some(h) => super::progress::writing_header(what, h, min_len, run),
            None => super::progress::writing(what, run),
        };
        match (failed, r) {
            (Some(e), _) => Err(e),
            (None, r) => r.map_err(caller_error),
        }
    }

    fn tcrypt_progress(&mut self, device: &Path) -> ucrypt::format::SearchProgress {
        Search::callback(&self.progress, &device.display().to_string())
    }
}
