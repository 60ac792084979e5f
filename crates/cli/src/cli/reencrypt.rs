//! `ucrypt reencrypt DEV`: LUKS2 re-keying (new volume key, optionally a new cipher, key
//! size or sector size), `--encrypt` (a plaintext device gets a LUKS2 header, detached or
//! at its head, and is encrypted in place) and `--decrypt` (the reverse), offline or
//! online in a named instance (`--active-name`); a LUKS1 volume as cryptsetup's legacy
//! LUKS1 reencryption. What is done and refused is the library's
//! ([`ucrypt::reencrypt::run`]); this file turns the arguments into its options, asks for
//! passphrases and confirmations ([`Asker`]), shows progress and messages ([`Shown`]) and
//! turns its errors into exit codes.

use super::exit::lib_error;
use super::luks_add_key::PbkdfArgs;
use super::progress;
use super::prompt::Terminal;
use super::secret::KeyFileArgs;
use super::CliError;
use std::time::Instant;
use ucrypt::format::parse_size;
use ucrypt::reencrypt::{
    HeaderKind, Level, Luks1Options, Mode, Notice, Options, PassKind, Stage, Summary,
};

/// Arguments of `ucrypt reencrypt`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The LUKS2 or LUKS1 device: a block device or an image file (with --active-name, the
    /// one the instance serves unless given). A LUKS1 volume is re-keyed, decrypted (or a
    /// device encrypted with --type luks1) as cryptsetup's legacy LUKS1 reencryption does,
    /// its state files in the current directory.
    #[arg(required_unless_present = "active_name")]
    device: Option<std::path::PathBuf>,
    /// Use a detached header file instead of the device's own.
    #[arg(long, value_name = "FILE")]
    header: Option<std::path::PathBuf>,
    #[command(flatten)]
    key: KeyFileArgs,
    /// The keyslot whose passphrase is kept (the volume's other keyslots are removed at
    /// the end, as cryptsetup does); needed when the volume has several.
    #[arg(short = 'S', long)]
    key_slot: Option<u32>,
    /// LUKS2 tokens give the existing keyslot's passphrase before any is asked for, as
    /// with cryptsetup reencrypt (with --key-slot, only that keyslot's tokens);
    /// `--token-only` asks for none (a key file then holds a token PIN).
    #[command(flatten)]
    token: super::token::UnlockArgs,
    /// New cipher (default: the current one).
    #[arg(short = 'c', long)]
    cipher: Option<String>,
    /// New key size in bits (default: the current one).
    #[arg(short = 's', long)]
    key_size: Option<u32>,
    /// New encryption sector size (default: the current one).
    #[arg(long)]
    sector_size: Option<u32>,
    /// How an interrupted hotzone is recovered: checksum (the default), journal or none;
    /// datashift (the only one) with --reduce-device-size.
    #[arg(long, value_enum)]
    resilience: Option<ResilienceArg>,
    /// Hash of the checksum resilience.
    #[arg(long, default_value = "sha256")]
    resilience_hash: String,
    /// Largest hotzone (bytes; K, M, G suffixes are binary units).
    #[arg(long, value_parser = parse_size)]
    hotzone_size: Option<u64>,
    /// Only write the reencryption metadata; do not touch data.
    #[arg(long, conflicts_with = "resume_only")]
    init_only: bool,
    /// Only resume a reencryption already in the metadata.
    #[arg(long)]
    resume_only: bool,
    #[command(flatten)]
    progress: progress::ProgressArgs,
    /// Accepted for cryptsetup compatibility (ucrypt's reencryption is offline).
    #[arg(long, hide = true)]
    force_offline_reencrypt: bool,
    /// Encrypt a plaintext device in place; its new LUKS2 header goes to --header
    /// (`-N`/`--new`: cryptsetup's older spellings).
    #[arg(long, short = 'N', visible_alias = "new", conflicts_with = "decrypt")]
    encrypt: bool,
    /// Decrypt a LUKS2 device whose header is detached (--header) in place.
    #[arg(long)]
    decrypt: bool,
    /// Header type for --encrypt: luks2 (the default) or luks1 (cryptsetup's legacy LUKS1
    /// encryption).
    #[arg(long = "type", short = 'M', value_name = "TYPE")]
    kind: Option<String>,
    /// UUID of the new header (--encrypt); with --decrypt of LUKS1, the UUID of the
    /// decryption to resume once its header is overwritten.
    #[arg(long)]
    uuid: Option<String>,
    /// Label of the new header (--encrypt).
    #[arg(long)]
    label: Option<String>,
    /// Subsystem label of the new header (--encrypt).
    #[arg(long)]
    subsystem: Option<String>,
    /// With --encrypt: put the LUKS2 header at the head of the device, shifting the data
    /// by half of SIZE (cryptsetup's; at most 1 GiB, 512-byte units, K/M/G suffixes).
    /// The filesystem must have been shrunk by SIZE first: the device's last SIZE bytes
    /// are overwritten.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    reduce_device_size: Option<u64>,
    /// With --encrypt: the new header's data offset in 512-byte sectors (cryptsetup's
    /// `-o`). With --header the data segment starts there on the device (the header file
    /// is sized to it); with --reduce-device-size at most half the reduction, which is
    /// then adjusted to twice the offset.
    #[arg(short = 'o', long, value_name = "SECTORS")]
    offset: Option<u64>,
    /// With --encrypt: the new header's JSON metadata area size (bytes; K/M suffixes),
    /// 16K..4M, a power of two, as luksFormat's.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    luks2_metadata_size: Option<u64>,
    /// With --encrypt: the new header's keyslots area size (bytes; K/M suffixes), as
    /// luksFormat's; with --reduce-device-size shrunk to what fits below the data offset
    /// (with cryptsetup's warning).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    luks2_keyslots_size: Option<u64>,
    /// Keep the volume key (and keyslots); change the cipher or sector size only.
    #[arg(long)]
    keep_key: bool,
    /// The new volume key: the first --key-size bits of FILE instead of a random key (a
    /// re-key, or --encrypt's new header; cryptsetup's). The volume's own key in FILE
    /// means --keep-key. `--master-key-file` is its older spelling.
    #[arg(long, alias = "master-key-file", value_name = "FILE")]
    volume_key_file: Option<std::path::PathBuf>,
    /// Online reencryption of the volume the named instance serves (`ucrypt open DEV NAME`):
    /// its clients keep reading and writing meanwhile; DEVICE may then be left out.
    #[arg(long, value_name = "NAME")]
    active_name: Option<String>,
    /// Re-encrypt only this much of the data area (bytes; K, M, G suffixes), as
    /// cryptsetup's: the rest is left as it is, yet the finished header's segment covers
    /// the whole device. DANGEROUS (for a device whose filesystem was shrunk first).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    device_size: Option<u64>,
    /// LUKS1 reencryption block size in MiB, 1 to 1024 (default 4; LUKS1 only).
    #[arg(short = 'B', long, value_name = "MIB")]
    block_size: Option<String>,
    /// LUKS1 reencryption with O_DIRECT (LUKS1 only).
    #[arg(long)]
    use_directio: bool,
    /// LUKS1 reencryption with fsync after every block (LUKS1 only; ucrypt syncs every
    /// block anyway).
    #[arg(long)]
    use_fsync: bool,
    /// LUKS1 reencryption log updated after every block (LUKS1 only; ucrypt always
    /// does).
    #[arg(long)]
    write_log: bool,
    /// Stop cleanly after this many bytes (tests: a reproducible interruption).
    #[arg(long, hide = true, value_parser = parse_size)]
    debug_stop_after: Option<u64>,
    #[command(flatten)]
    pbkdf: PbkdfArgs,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long = "batch-mode")]
    batch_mode: bool,
}

/// `--resilience`: how an interrupted hotzone is recovered (checksum, journal, none, or a
/// data shift's datashift). The variants carry no doc comments: clap would print them as a
/// list in `--help` instead of cryptsetup's one line of possible values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ResilienceArg {
    Checksum,
    Journal,
    None,
    Datashift,
}

impl ResilienceArg {
    /// The library's resilience.
    fn mode(self) -> ucrypt::reencrypt::ResilienceMode {
        use ucrypt::reencrypt::ResilienceMode as R;
        match self {
            ResilienceArg::Checksum => R::Checksum,
            ResilienceArg::Journal => R::Journal,
            ResilienceArg::None => R::None,
            ResilienceArg::Datashift => R::Datashift,
        }
    }
}

impl Args {
    /// The library's options for these arguments.
    fn options(&self) -> Options {
        let mut o = Options::new(self.device.clone().unwrap_or_default());
        o.header = self.header.clone();
        o.mode = if self.encrypt {
            Mode::Encrypt
        } else if self.decrypt {
            Mode::Decrypt
        } else {
            Mode::Reencrypt
        };
        o.header_kind = self.kind.as_deref().map(HeaderKind::parse);
        o.key_slot = self.key_slot;
        o.cipher = self.cipher.clone();
        o.key_size = self.key_size;
        o.sector_size = self.sector_size;
        o.resilience = self.resilience.map(ResilienceArg::mode);
        o.resilience_hash = self.resilience_hash.clone();
        o.hotzone_size = self.hotzone_size;
        o.stage = if self.init_only {
            Stage::InitOnly
        } else if self.resume_only {
            Stage::ResumeOnly
        } else {
            Stage::All
        };
        o.keep_key = self.keep_key;
        o.volume_key_file = self.volume_key_file.clone();
        o.uuid = self.uuid.clone();
        o.label = self.label.clone();
        o.subsystem = self.subsystem.clone();
        o.reduce_device_size = self.reduce_device_size;
        o.offset = self.offset;
        o.luks2_metadata_size = self.luks2_metadata_size;
        o.luks2_keyslots_size = self.luks2_keyslots_size;
        o.device_size = self.device_size;
        o.active_name = self.active_name.clone();
        o.luks1 = Luks1Options {
            block_size: self.block_size.clone(),
            direct_io: self.use_directio,
            fsync: self.use_fsync,
            write_log: self.write_log,
        };
        o.pbkdf = self.pbkdf.choice();
        o.stop_after = self.debug_stop_after;
        o.locks = !super::DISABLE_LOCKS.load(std::sync::atomic::Ordering::Relaxed);
        o.tokens = self.token.tokens();
        // Under --token-only the key file has no passphrase to give: it holds the PIN.
        if o.tokens.only && self.key.key_file.is_some() {
            o.tokens.pin_file = Some(self.key.inputs());
        }
        o
    }
}

/// Messages on stdout (cryptsetup's normal log) or stderr, the progress bar or lines of
/// `--progress-json`/`--progress-frequency`, the closing line, and Ctrl-C as a stop
/// request once the pass may be stopped.
struct Shown<'a> {
    args: &'a progress::ProgressArgs,
    stop: Option<progress::StopOnSignal>,
    bar: Option<progress::Bytes>,
    start: Instant,
}

impl ucrypt::reencrypt::Progress for Shown<'_> {
    fn notice(&mut self, notice: Notice) {
        match notice.level {
            Level::Info => println!("{}", notice.text),
            Level::Warning => eprintln!("{}", notice.text),
            Level::Error => eprintln!("ucrypt: {}", notice.text),
        }
    }

    fn watch(&mut self) {
        if self.stop.is_none() {
            self.stop = Some(progress::StopOnSignal::new());
        }
    }

    fn stop_requested(&mut self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(progress::StopOnSignal::stopped)
    }

    fn begin(&mut self, device: &str, total: u64, resume_at: Option<u64>) {
        self.start = Instant::now();
        let mut bar = progress::Bytes::new(self.args, "Reencrypting", device, total);
        if let Some(done) = resume_at {
            bar.resume_at(done);
        }
        self.bar = Some(bar);
    }

    fn advance(&mut self, done: u64) {
        if let Some(bar) = &mut self.bar {
            bar.set(done);
        }
    }

    fn end(&mut self, finished: bool) {
        match self.bar.take() {
            Some(bar) if finished => bar.finish(),
            Some(bar) => bar.abandon(),
            None => {}
        }
    }

    fn summary(&mut self, s: &Summary) {
        let secs = self.start.elapsed().as_secs_f64();
        if s.finished {
            if !(self.args.progress_json || self.args.progress_frequency.is_some()) {
                eprintln!("{}", progress::summary_line("Finished", s.bytes, secs));
            }
            return;
        }
        eprintln!("{}", progress::summary_line("Interrupted", s.bytes, secs));
        let (device, at, size) = (&s.device, s.at, s.size);
        match &s.kind {
            PassKind::Luks2 => eprintln!(
                "Reencryption of {device} stopped at {at} of {size} bytes; resume with `ucrypt \
                 reencrypt --resume-only` (or cryptsetup's)."
            ),
            PassKind::Luks1 => eprintln!(
                "Reencryption interrupted at {at} of {size} bytes; resume with `ucrypt \
                 reencrypt {device}` (or cryptsetup's) from this directory."
            ),
            PassKind::Online { name } => eprintln!(
                "Reencryption of {device} stopped at {at} of {size} bytes; {name} serves both \
                 keys meanwhile. Continue with `ucrypt reencrypt --active-name {name}`."
            ),
        }
    }
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let opts = a.options();
    let mut prompt = Terminal::with_key_file(&a.key, a.batch_mode);
    let mut shown = Shown {
        args: &a.progress,
        stop: None,
        bar: None,
        start: Instant::now(),
    };
    ucrypt::reencrypt::run(&opts, &mut prompt, &mut shown).map_err(lib_error)
}
