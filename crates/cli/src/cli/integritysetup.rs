//! `ucrypt integritysetup dump|format|open|status|close`: standalone dm-integrity, as
//! cryptsetup's `integritysetup` (2.6) does it, with ucrypt's userspace dm-integrity in
//! place of the kernel.
//!
//! The arguments, the confirmation and the printing; what the actions decide (option
//! checks, key files, the superblock, the table line, what `status` shows) is the
//! library's [`ucrypt::integrity`]. `open DEV NAME` serves the table the library builds
//! ([`ucrypt::integrity::open_table`], so no key is on a command line) as `ucrypt open`
//! serves a table, with the serving options given: a named instance started by the library's
//! [`ucrypt::instance::start`] like every other, so `status NAME` and `close NAME` (here
//! or `ucrypt status|close NAME`) work on it.

use super::exit::{instance_error, lib_error, Printed};
use super::lifecycle::{self, CloseArgs};
use super::open;
use super::secret::confirm;
use super::{CliError, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use anyhow::anyhow;
use clap::parser::ValueSource;
use std::path::PathBuf;
use std::time::Duration;
use ucrypt::instance::control::{Reply, Request};
use ucrypt::instance::frontend::Choice;
use ucrypt::instance::runtime::{self, Paths, Probe};
use ucrypt::integrity::{FormatRequest, KeyFile, Keys, OpenRequest};

/// Arguments of `ucrypt integritysetup`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    action: Action,
    /// Do not ask for confirmation (also before the action, as cryptsetup's global -q).
    #[arg(short = 'q', long = "batch-mode", global = true)]
    batch_mode: bool,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Print the dm-integrity superblock (integritysetup dump).
    Dump {
        /// The device or image (the metadata device of one with a data device).
        device: String,
        /// Accepted and not needed, as integritysetup does: the superblock is on DEVICE.
        #[arg(long = "data-device", value_name = "PATH")]
        data_device: Option<String>,
    },
    /// Format a device for dm-integrity (integritysetup format).
    Format(Box<FormatArgs>),
    /// Open a dm-integrity device (integritysetup open): as NAME, a named instance with
    /// `ucrypt open`'s front ends (`--device ublk|nbd|fuse|vhost-user|vduse|none`);
    /// without NAME (or with --run), served over NBD in the foreground. Other options of
    /// `ucrypt open` (TLS...) go after `--`.
    Open(Box<OpenArgs>),
    /// Show an open dm-integrity device (integritysetup status).
    Status {
        /// The instance name.
        name: String,
    },
    /// Close an open dm-integrity device (integritysetup close).
    Close {
        /// The instance name.
        name: String,
        /// Accepted and not needed, as integritysetup does.
        #[arg(long = "data-device", value_name = "PATH")]
        data_device: Option<String>,
        /// Close once the last user is gone (at once if there is none).
        #[arg(long)]
        deferred: bool,
        /// Cancel a pending --deferred close (the device stays open).
        #[arg(long, conflicts_with = "deferred")]
        cancel_deferred: bool,
    },
}

/// `ucrypt open`'s serving options that `integritysetup open` takes itself (the rest come
/// after `--`).
#[derive(clap::Args)]
struct ServeArgs {
    /// The front end of NAME: ublk, nbd, fuse, vhost-user, vduse, none or auto (as
    /// `ucrypt open --device`).
    #[arg(long = "device", value_name = "KIND",
          value_parser = super::open::frontend_parser(&Choice::NAMES))]
    frontend: Option<Choice>,
    /// Run CMD (sh -c) once serving, with $uri, $nbd, $unixsocket/$port set; stop when it
    /// exits and return its status.
    #[arg(long, value_name = "CMD")]
    run: Option<String>,
    /// Stay in the foreground (NAME otherwise goes to the background once ready).
    #[arg(long)]
    foreground: bool,
    /// For a systemd service of Type=notify (as `ucrypt open --notify`).
    #[arg(long)]
    notify: bool,
    /// Serve NBD on a unix socket at PATH.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Serve NBD on TCP ADDR:PORT (needs --tls=require after `--`, or
    /// --allow-cleartext-tcp).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<String>,
    /// Allow --listen without TLS.
    #[arg(long)]
    allow_cleartext_tcp: bool,
    /// Write the server's pid to FILE once it serves.
    #[arg(long, value_name = "FILE")]
    pid_file: Option<PathBuf>,
    /// FUSE: mount at DIR, the device is DIR/NAME.
    #[arg(long, value_name = "DIR")]
    fuse: Option<PathBuf>,
    /// vhost-user: listen for the VM at PATH.
    #[arg(long, value_name = "PATH")]
    vhost_socket: Option<PathBuf>,
    /// Queues of the device (ublk, vhost-user, vduse).
    #[arg(long, value_name = "N", value_parser = super::bounded::<1, 64>)]
    queues: Option<usize>,
    /// Share the image with other --shared mappings.
    #[arg(long)]
    shared: bool,
    /// Bypass the page cache on the device (O_DIRECT).
    #[arg(long)]
    direct: bool,
    /// Reattach to the device a dead server of NAME left (as `ucrypt open --recover`).
    #[arg(long)]
    recover: bool,
}

impl ServeArgs {
    /// Sets these options in `a`, `ucrypt open`'s arguments parsed from what followed `--`
    /// (`given`): an option given both ways, or two that exclude each other, is refused as
    /// `ucrypt open` refuses it.
    fn apply(self, a: &mut open::Args, given: &clap::ArgMatches) -> Result<(), CliError> {
        let mine = [
            ("frontend", "device", self.frontend.is_some()),
            ("run", "run", self.run.is_some()),
            ("foreground", "foreground", self.foreground),
            ("notify", "notify", self.notify),
            ("socket", "socket", self.socket.is_some()),
            ("listen", "listen", self.listen.is_some()),
            (
                "allow_cleartext_tcp",
                "allow-cleartext-tcp",
                self.allow_cleartext_tcp,
            ),
            ("pid_file", "pid-file", self.pid_file.is_some()),
            ("fuse", "fuse", self.fuse.is_some()),
            ("vhost_socket", "vhost-socket", self.vhost_socket.is_some()),
            ("queues", "queues", self.queues.is_some()),
            ("shared", "shared", self.shared),
            ("direct", "direct", self.direct),
            ("recover", "recover", self.recover),
        ];
        let typed = |id: &str| given.value_source(id) == Some(ValueSource::CommandLine);
        if let Some((_, flag, _)) = mine.iter().find(|(id, _, on)| *on && typed(id)) {
            return Err(anyhow!("the argument '--{flag}' cannot be used multiple times").into());
        }
        if let Some(f) = self.frontend {
            a.frontend = f;
        }
        a.run = self.run.or(a.run.take());
        a.foreground |= self.foreground;
        a.notify |= self.notify;
        a.socket = self.socket.or(a.socket.take());
        a.listen = self.listen.or(a.listen.take());
        a.allow_cleartext_tcp |= self.allow_cleartext_tcp;
        a.pid_file = self.pid_file.or(a.pid_file.take());
        a.fuse = self.fuse.or(a.fuse.take());
        a.vhost_socket = self.vhost_socket.or(a.vhost_socket.take());
        a.queues = self.queues.or(a.queues);
        a.shared |= self.shared;
        a.cache.direct |= self.direct;
        a.recover |= self.recover;
        if a.socket.is_some() && a.listen.is_some() {
            return Err(anyhow!(
                "the argument '--socket <PATH>' cannot be used with '--listen <ADDR:PORT>'"
            )
            .into());
        }
        if a.cache.direct && a.cache.buffered {
            return Err(anyhow!("the argument '--direct' cannot be used with '--buffered'").into());
        }
        if a.socket_group.is_some() && a.socket.is_none() {
            return Err(anyhow!(
                "the following required arguments were not provided: --socket <PATH>"
            )
            .into());
        }
        Ok(())
    }
}

/// Arguments of `ucrypt integritysetup open`.
#[derive(clap::Args)]
struct OpenArgs {
    /// The device or image (with --data-device: the metadata device).
    device: String,
    /// The data device of a device formatted with one (DEVICE then holds the superblock,
    /// journal and tags).
    #[arg(long = "data-device", value_name = "PATH")]
    data_device: Option<String>,
    /// Instance name: a named instance (`ucrypt status|close NAME`); without it, served
    /// in the foreground.
    name: Option<String>,
    #[command(flatten)]
    serve: ServeArgs,
    /// Internal hash (must be the one the device was formatted with).
    #[arg(long = "integrity", short = 'I', default_value = "crc32c")]
    integrity: String,
    /// Key of an HMAC internal hash, read from this file.
    #[arg(long = "integrity-key-file")]
    integrity_key_file: Option<String>,
    /// Bytes of that key to read (default: the hash's digest size).
    #[arg(long = "integrity-key-size")]
    integrity_key_size: Option<usize>,
    /// Journal MAC (when the device has one).
    #[arg(long = "journal-integrity")]
    journal_integrity: Option<String>,
    /// Key of the journal MAC, read from this file.
    #[arg(long = "journal-integrity-key-file")]
    journal_integrity_key_file: Option<String>,
    /// Bytes of that key to read.
    #[arg(long = "journal-integrity-key-size")]
    journal_integrity_key_size: Option<usize>,
    /// Journal encryption (the one the device was formatted with).
    #[arg(long = "journal-crypt")]
    journal_crypt: Option<String>,
    /// Key of the journal encryption, read from this file.
    #[arg(long = "journal-crypt-key-file")]
    journal_crypt_key_file: Option<String>,
    /// Bytes of that key to read.
    #[arg(long = "journal-crypt-key-size")]
    journal_crypt_key_size: Option<usize>,
    /// Inline mode (refused: tags in the drive's own metadata).
    #[arg(long = "integrity-inline")]
    inline: bool,
    /// Direct writes (mode D): no journal, a crash can leave blocks whose tag fails.
    #[arg(long = "integrity-no-journal", short = 'D')]
    no_journal: bool,
    /// Bitmap mode (B).
    #[arg(long = "integrity-bitmap-mode", short = 'B')]
    bitmap_mode: bool,
    /// Recovery mode (R): read-only, tags not checked, journal not replayed.
    #[arg(long = "integrity-recovery-mode", short = 'R')]
    recovery: bool,
    /// Recompute every tag from the data.
    #[arg(long = "integrity-recalculate")]
    recalculate: bool,
    /// Allow recalculating HMAC tags (the kernel refuses it by default).
    #[arg(long = "integrity-legacy-recalculate")]
    legacy_recalculate: bool,
    /// Tag buffer sectors (the kernel's buffer_sectors).
    #[arg(long = "buffer-sectors")]
    buffer_sectors: Option<u32>,
    /// Journal watermark in percent.
    #[arg(long = "journal-watermark")]
    journal_watermark: Option<u32>,
    /// Journal commit time in milliseconds (accepted; ucrypt commits on flush and FUA).
    #[arg(long = "journal-commit-time")]
    journal_commit_time: Option<u32>,
    /// Sectors per bitmap bit (bitmap mode).
    #[arg(long = "bitmap-sectors-per-bit")]
    sectors_per_bit: Option<u64>,
    /// Bitmap flush interval in milliseconds (accepted; ucrypt clears the bitmap on flush).
    #[arg(long = "bitmap-flush-time")]
    bitmap_flush_time: Option<u32>,
    /// Serve read-only.
    #[arg(long = "read-only", short = 'r')]
    read_only: bool,
    /// Further options for `ucrypt open` (`--tls=require --tls-psk FILE`...).
    #[arg(last = true)]
    open_args: Vec<String>,
}

/// Arguments of `ucrypt integritysetup format`.
#[derive(clap::Args)]
struct FormatArgs {
    /// The device or image (with --data-device: the metadata device, which gets the
    /// superblock, the journal and every tag).
    device: String,
    /// Put the data alone on this device (a separate metadata device: DEVICE).
    #[arg(long = "data-device", value_name = "PATH")]
    data_device: Option<String>,
    /// Internal hash: crc32c (default), crc32, sha1, sha256, sha512, hmac-sha1,
    /// hmac-sha256, hmac-sha512.
    #[arg(long = "integrity", short = 'I', default_value = "crc32c")]
    integrity: String,
    /// Key of an HMAC internal hash, read from this file.
    #[arg(long = "integrity-key-file")]
    integrity_key_file: Option<String>,
    /// Bytes of that key to read (default: the hash's digest size).
    #[arg(long = "integrity-key-size")]
    integrity_key_size: Option<usize>,
    /// Tag bytes per block (default: the hash's digest size). No `-t`: that is ucrypt's
    /// global `--timeout`.
    #[arg(long = "tag-size")]
    tag_size: Option<u32>,
    /// Bytes per block: 512, 1024, 2048 or 4096.
    #[arg(long = "sector-size", short = 's', default_value_t = 512)]
    sector_size: u32,
    /// Data sectors between tag areas (default 32768).
    #[arg(long = "interleave-sectors", default_value_t = 0)]
    interleave_sectors: u32,
    /// Journal size in bytes (default: the kernel's, 1/128 of the device up to 64 MiB).
    #[arg(long = "journal-size", short = 'j')]
    journal_size: Option<u64>,
    /// Journal MAC: hmac-sha1, hmac-sha256 or hmac-sha512.
    #[arg(long = "journal-integrity")]
    journal_integrity: Option<String>,
    /// Key of the journal MAC, read from this file.
    #[arg(long = "journal-integrity-key-file")]
    journal_integrity_key_file: Option<String>,
    /// Bytes of that key to read.
    #[arg(long = "journal-integrity-key-size")]
    journal_integrity_key_size: Option<usize>,
    /// Journal encryption: ctr-aes or chacha20 (stream), cbc-aes, xts-aes or ecb-aes
    /// (block), or the kernel's names (ctr(aes)...).
    #[arg(long = "journal-crypt")]
    journal_crypt: Option<String>,
    /// Key of the journal encryption, read from this file.
    #[arg(long = "journal-crypt-key-file")]
    journal_crypt_key_file: Option<String>,
    /// Bytes of that key to read.
    #[arg(long = "journal-crypt-key-size")]
    journal_crypt_key_size: Option<usize>,
    /// Inline mode (refused: tags in the drive's own metadata).
    #[arg(long = "integrity-inline")]
    inline: bool,
    /// Do not wipe the data area (its tags are then invalid until written).
    #[arg(long = "integrity-no-wipe")]
    no_wipe: bool,
    /// The legacy 128 KiB metadata padding (volumes made before Linux 4.19).
    #[arg(long = "integrity-legacy-padding")]
    legacy_padding: bool,
    /// Tags and journal MAC without the superblock's salt (before Linux 5.11).
    #[arg(long = "integrity-legacy-hmac")]
    legacy_hmac: bool,
    /// Format for bitmap mode (superblock version 3).
    #[arg(long = "integrity-bitmap-mode", short = 'B')]
    bitmap_mode: bool,
    /// Sectors per bitmap bit (bitmap mode; default 32768).
    #[arg(long = "bitmap-sectors-per-bit")]
    sectors_per_bit: Option<u64>,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    match a.action {
        Action::Dump { device, .. } => {
            print!("{}", ucrypt::integrity::dump(&device).map_err(lib_error)?);
            Ok(())
        }
        Action::Format(f) => format(*f, a.batch_mode),
        Action::Open(o) => open(*o),
        Action::Status { name } => status(&name),
        Action::Close {
            name,
            deferred,
            cancel_deferred,
            ..
        } => {
            lifecycle::close(CloseArgs::deferred(name.clone(), deferred, cancel_deferred))?;
            if deferred {
                // integritysetup's words when the device stays until its last user goes.
                let p = Paths::of(&name).map_err(instance_error)?;
                if matches!(runtime::probe(&p), Ok(Probe::Live { .. })) {
                    println!("Device {name} is still active and scheduled for deferred removal.");
                }
            }
            Ok(())
        }
    }
}

/// `integritysetup status NAME`: what integritysetup prints of an active device, exit 4
/// ("NAME is inactive.") when there is none, 1 for an instance that is not dm-integrity.
fn status(name: &str) -> Result<(), CliError> {
    let p = Paths::of(name).map_err(instance_error)?;
    match runtime::probe(&p).map_err(instance_error)? {
        Probe::Live { .. } => {}
        Probe::Dead(debris) => {
            eprintln!("ucrypt: {name}: {debris}");
            println!("{name} is inactive.");
            return Err(anyhow::Error::new(Printed)).code(EXIT_DEVICE);
        }
        Probe::Absent => {
            println!("{name} is inactive.");
            return Err(anyhow::Error::new(Printed)).code(EXIT_DEVICE);
        }
    }
    let Reply::Status(st) = lifecycle::call(&p, &Request::Status, None, Duration::from_secs(10))?
    else {
        return Err(anyhow!("{name}: the server did not answer with its status")).code(EXIT_DEVICE);
    };
    let d = &st.description;
    let Some(target) = &d.integrity_target else {
        return Err(anyhow!(
            "{name} is not an INTEGRITY device (type {}; see ucrypt status {name})",
            d.kind
        ))
        .code(EXIT_PARAMS);
    };
    print!(
        "{}",
        target.text(&ucrypt::integrity::Active {
            name,
            in_use: st.in_use,
            device: &d.device,
            size_sectors: d.size_sectors,
            read_only: d.read_only,
            failures: st.integrity_failures.unwrap_or(0),
            allow_discards: d.allow_discards,
        })
    );
    Ok(())
}

fn key_file(path: &Option<String>, size: Option<usize>) -> Option<KeyFile> {
    path.as_ref().map(|p| KeyFile {
        path: p.clone(),
        size,
    })
}

fn format(a: FormatArgs, batch: bool) -> Result<(), CliError> {
    let req = FormatRequest {
        device: a.device.clone(),
        data_device: a.data_device.clone(),
        keys: Keys {
            integrity: Some(a.integrity.clone()),
            integrity_key: key_file(&a.integrity_key_file, a.integrity_key_size),
            journal_integrity: a.journal_integrity,
            journal_integrity_key: key_file(
                &a.journal_integrity_key_file,
                a.journal_integrity_key_size,
            ),
            journal_crypt: a.journal_crypt,
            journal_crypt_key: key_file(&a.journal_crypt_key_file, a.journal_crypt_key_size),
            inline: a.inline,
        },
        tag_size: a.tag_size,
        sector_size: Some(a.sector_size),
        interleave_sectors: a.interleave_sectors,
        journal_size: a.journal_size,
        no_wipe: a.no_wipe,
        legacy_padding: a.legacy_padding,
        legacy_hmac: a.legacy_hmac,
        bitmap_mode: a.bitmap_mode,
        sectors_per_bit: a.sectors_per_bit,
    };
    let prepared = ucrypt::integrity::prepare_format(&req).map_err(lib_error)?;
    let question = match &a.data_device {
        Some(d) if !a.no_wipe => format!(
            "This will overwrite data on {} and {d} irrevocably.\nTo preserve data device use \
             --no-wipe option (and then activate with --integrity-recalculate)",
            a.device
        ),
        _ => format!("This will overwrite data on {} irrevocably", a.device),
    };
    confirm(batch, &question)?;
    let done = prepared.run().map_err(lib_error).map_err(|e| CliError {
        code: e.code,
        err: e.err.context(format!("formatting {}", a.device)),
    })?;
    println!(
        "Formatted with tag size {}, internal integrity {}.",
        done.superblock.tag_size, a.integrity
    );
    if let Some(n) = done.wiped_bytes {
        println!("Wiped {n} bytes of data to initialize the integrity tags.");
    }
    Ok(())
}

/// `integritysetup open`: the library's table, served as `ucrypt open` serves a table
/// (the keys never on a command line or on disk), with the serving options given here and
/// `ucrypt open`'s others from after `--`.
fn open(a: OpenArgs) -> Result<(), CliError> {
    let req = OpenRequest {
        device: a.device.clone(),
        data_device: a.data_device.clone(),
        keys: Keys {
            integrity: Some(a.integrity.clone()),
            integrity_key: key_file(&a.integrity_key_file, a.integrity_key_size),
            journal_integrity: a.journal_integrity.clone(),
            journal_integrity_key: key_file(
                &a.journal_integrity_key_file,
                a.journal_integrity_key_size,
            ),
            journal_crypt: a.journal_crypt.clone(),
            journal_crypt_key: key_file(&a.journal_crypt_key_file, a.journal_crypt_key_size),
            inline: a.inline,
        },
        no_journal: a.no_journal,
        bitmap_mode: a.bitmap_mode,
        recovery: a.recovery,
        recalculate: a.recalculate,
        legacy_recalculate: a.legacy_recalculate,
        buffer_sectors: a.buffer_sectors,
        journal_watermark: a.journal_watermark,
        journal_commit_time: a.journal_commit_time,
        sectors_per_bit: a.sectors_per_bit,
        bitmap_flush_time: a.bitmap_flush_time,
    };
    let table = ucrypt::integrity::open_table(&req).map_err(lib_error)?;
    // What follows `--` is `ucrypt open`'s to parse, with every option of its own.
    let mut cmd = super::open_definition();
    let given = cmd
        .try_get_matches_from_mut(std::iter::once("open".to_string()).chain(a.open_args))
        .map_err(|e| anyhow!("{e}"))?;
    let mut args = <open::Args as clap::FromArgMatches>::from_arg_matches(&given)
        .map_err(|e| anyhow!("{}", e.format(&mut cmd)))?;
    args.read_only |= a.read_only;
    a.serve.apply(&mut args, &given)?;
    args.built_table = Some(table);
    if let Some(n) = a.name {
        args.header.name = Some(n);
    }
    super::open_command(args)
}
