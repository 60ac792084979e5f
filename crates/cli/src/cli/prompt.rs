//! The command's side of the library's unlock policy ([`ucrypt::unlock::Prompt`]):
//! passphrases from the terminal or one line of a pipe (`secret.rs`: echo off,
//! `--timeout`, `-y`), standard input for `--key-file -`, notices on stderr, `--debug`
//! lines, a spinner with Ctrl-C ending the command while a step runs (nothing is written
//! then), and the TCRYPT search's bar or JSON lines.

use super::exit::caller_error;
use super::progress::{ExitOnSignal, ProgressArgs, Search, Spinner};
use std::path::Path;
use ucrypt::unlock::{Prompt, Secret, Step};

/// The terminal (or pipe) the command runs with.
#[derive(Default)]
pub(crate) struct Terminal {
    /// How a TCRYPT header search shows its progress.
    pub(crate) progress: ProgressArgs,
}

impl Terminal {
    /// A prompt whose TCRYPT searches report as `progress` says.
    pub(crate) fn new(progress: &ProgressArgs) -> Terminal {
        Terminal {
            progress: progress.clone(),
        }
    }
}

impl Prompt for Terminal {
    fn passphrase(&mut self, prompt: &str) -> ucrypt::Result<Secret> {
        super::secret::get(None, prompt, false).map_err(caller_error)
    }

    fn interactive(&self) -> bool {
        super::secret::asks_someone()
    }

    fn standard_input(&mut self) -> ucrypt::Result<Box<dyn std::io::Read + '_>> {
        Ok(Box::new(std::io::stdin().lock()))
    }

    fn notice(&mut self, text: &str) {
        eprintln!("{text}");
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

    fn tcrypt_progress(&mut self, device: &Path) -> ucrypt::format::SearchProgress {
        Search::callback(&self.progress, &device.display().to_string())
    }
}
