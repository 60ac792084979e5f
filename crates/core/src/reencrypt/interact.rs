//! What a reencryption tells its caller: messages, progress and stop requests
//! ([`Progress`]). Its passphrases and confirmations it asks for through the library's one
//! [`crate::prompt::Prompt`]. The command line implements both with terminal prompts, key
//! files, progress bars and signal handlers; a program embedding the library passes its
//! secrets and watches the byte counts.

/// How loud a [`Notice`] is: cryptsetup prints `Info` on standard output, the others on
/// standard error (`Error` as an error line of its own, the operation going on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// What is being done ("Log file ... exists, resuming reencryption.").
    Info,
    /// An option that is ignored or adjusted, something left behind and cleaned up.
    Warning,
    /// A failure beside the operation (a dead instance's debris).
    Error,
}

/// A message for the user, in cryptsetup's words where cryptsetup has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// How loud.
    pub level: Level,
    /// The message, one or more whole lines without the final newline.
    pub text: String,
}

impl Notice {
    pub(crate) fn info(text: impl Into<String>) -> Notice {
        Notice {
            level: Level::Info,
            text: text.into(),
        }
    }

    pub(crate) fn warning(text: impl Into<String>) -> Notice {
        Notice {
            level: Level::Warning,
            text: text.into(),
        }
    }
}

/// Which kind of data pass a [`Summary`] closes (a caller names the way to resume it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassKind {
    /// LUKS2, offline: resumed with `--resume-only`.
    Luks2,
    /// cryptsetup's LUKS1 reencryption: resumed from the directory of its files.
    Luks1,
    /// LUKS2 inside the running instance `name`.
    Online {
        /// The instance.
        name: String,
    },
}

/// How a data pass ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Which pass.
    pub kind: PassKind,
    /// The pass is done (else it stopped, resumable).
    pub finished: bool,
    /// Bytes this run re-encrypted.
    pub bytes: u64,
    /// Where the pass stands now, in bytes done of `size`.
    pub at: u64,
    /// Bytes of the data area the pass covers.
    pub size: u64,
    /// The data device, as named to the user.
    pub device: String,
}

/// What a reencryption reports while it runs, and where it learns that it should stop.
pub trait Progress {
    /// A message for the user.
    fn notice(&mut self, notice: Notice);

    /// From now until the operation returns, a stop request ([`Progress::stop_requested`])
    /// is honoured at the next safe boundary (the command line catches its signals here).
    fn watch(&mut self);

    /// Whether the caller asks the pass to stop (polled between hotzones or blocks).
    fn stop_requested(&mut self) -> bool;

    /// The data pass starts over `total` bytes of `device`; `resume_at`: the work before
    /// it was done by an earlier run and counts towards `total` (else `total` is what is
    /// left, counted from 0).
    fn begin(&mut self, device: &str, total: u64, resume_at: Option<u64>);

    /// `done` bytes of the total of [`Progress::begin`].
    fn advance(&mut self, done: u64);

    /// The data pass ended: `finished`, or stopped or failed.
    fn end(&mut self, finished: bool);

    /// The closing report of a pass that finished or stopped.
    fn summary(&mut self, summary: &Summary);
}
