//! Command-line front end: parse (clap), call the library, print. One file per command.
//!
//! Exit codes follow cryptsetup's: 1 wrong parameters, 2 no permission or bad passphrase,
//! 3 out of memory, 4 wrong device, 5 device busy.

mod bench;
mod benchmark;
mod crypttab;
mod daemon;
mod demo;
mod docs;
mod exit;
mod format_dump;
mod instance;
mod integritysetup;
mod is_luks;
mod lifecycle;
mod luks;
mod luks_add_key;
mod luks_change_key;
mod luks_convert_key;
mod luks_dump;
mod luks_format;
mod luks_header_backup;
mod luks_header_restore;
mod luks_kill_slot;
mod luks_open;
mod luks_remove_key;
mod luks_uuid;
mod metadata;
mod open;
mod open_header;
mod plain_args;
mod progress;
mod prompt;
mod read;
mod reencrypt;
mod secret;
mod signals;
mod table;
mod tcrypt;
mod token;
mod udev_name;
mod unlock_opts;
mod wipe;
mod write;

use anyhow::Context;
use clap::{Parser, Subcommand};
pub(crate) use exit::{error_line, CliError, Printed, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::process::ExitCode;

/// dm-crypt rebuilt in userspace.
#[derive(Parser)]
#[command(
    name = "ucrypt",
    version,
    long_version = long_version(),
    about,
    long_about = None,
    after_help = "New here? `ucrypt demo` shows ucrypt at work on a small volume. `ucrypt \
                  COMMAND --help` describes a command; `ucrypt man DIR` writes the man pages."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Ceph configuration for rbd:POOL/IMAGE devices (default: $CEPH_CONF, then
    /// /etc/ceph/ceph.conf), like rbd's -c.
    #[arg(long, global = true, value_name = "PATH")]
    ceph_conf: Option<std::path::PathBuf>,
    /// Ceph client id for rbd: devices, without "client." (default admin), like rbd's --id.
    #[arg(long, global = true, value_name = "NAME")]
    ceph_id: Option<String>,
    /// Ceph keyring for rbd: devices (default: from the configuration), like rbd's --keyring.
    #[arg(long, global = true, value_name = "PATH")]
    keyring: Option<std::path::PathBuf>,
    /// Seconds to wait for a passphrase typed at a terminal before giving up (exit 1);
    /// 0 waits forever. Key files and pipes are not timed. As cryptsetup's -t.
    #[arg(
        short = 't',
        long,
        global = true,
        value_name = "SECS",
        default_value_t = 0
    )]
    timeout: u32,
    /// Debug lines on stderr, each starting with '# ' (libcryptsetup's and ucrypt's; never
    /// a passphrase or key); implies --verbose. As cryptsetup's --debug.
    #[arg(long, global = true)]
    debug: bool,
    /// --debug plus the LUKS2 JSON metadata libcryptsetup reads.
    #[arg(long, global = true)]
    debug_json: bool,
    /// Keep volume keys out of the kernel keyring (libcryptsetup set as cryptsetup sets it;
    /// ucrypt never puts a volume key there, so nothing else changes).
    #[arg(long, global = true)]
    disable_keyring: bool,
    /// Take no metadata locks (a private image nobody else opens), as cryptsetup's: neither
    /// libcryptsetup's in /run/cryptsetup nor ucrypt's image locks of header-changing
    /// commands. A served instance's own exclusive lock on its device stays.
    #[arg(long, global = true)]
    disable_locks: bool,
    /// Load no LUKS2 token plugins (only built-in token types, such as luks2-keyring, work).
    #[arg(long, global = true)]
    disable_external_tokens: bool,
    /// Load LUKS2 token plugins from DIR (needs libcryptsetup 2.7 or later; refused with
    /// the reason on an older library).
    #[arg(long, global = true, value_name = "DIR")]
    external_tokens_path: Option<std::path::PathBuf>,
    /// Check the command line only: parse it, run nothing (exit 0), as cryptsetup's.
    #[arg(long, global = true)]
    test_args: bool,
    /// Ask every passphrase typed at a terminal twice (existing ones too); without it,
    /// new passphrases are asked twice unless --batch-mode. As cryptsetup's -y.
    #[arg(short = 'y', long, global = true)]
    verify_passphrase: bool,
}

/// Whether `--disable-locks` is on: header-changing commands take no image locks.
pub(crate) static DISABLE_LOCKS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether `-v`/`--verbose` (or `--debug`) was given anywhere on the command line: the
/// library's verbose lines (tokens passed over) are printed.
pub(crate) static VERBOSE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether `--debug`/`--debug-json` is on (ucrypt's own `# ` lines).
static DEBUG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Prints one `--debug` line (`# ` and `msg`) when debugging is on. Never pass a secret.
pub(crate) fn debug(msg: impl std::fmt::Display) {
    if DEBUG.load(std::sync::atomic::Ordering::Relaxed) {
        eprintln!("# {msg}");
    }
}

/// The command line as `--debug` shows it: the value of `--table` (a key) replaced.
fn shown_command_line(args: &[std::ffi::OsString]) -> String {
    let mut out = Vec::new();
    let mut hide_next = false;
    for a in args {
        let a = a.to_string_lossy();
        if hide_next {
            out.push("<hidden>".to_string());
            hide_next = false;
        } else if a == "--table" {
            hide_next = true;
            out.push(a.into_owned());
        } else if a.starts_with("--table=") {
            out.push("--table=<hidden>".to_string());
        } else {
            out.push(a.into_owned());
        }
    }
    out.join(" ")
}

/// `ucrypt --version`: the version, the commit, the libcryptsetup it was built against and
/// which code paths this CPU gets (as `cryptsetup --version` names its crypto backend).
fn long_version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "{} (commit {})\nlibcryptsetup {} (headers and keyslots), AWS-LC (AES-256-XTS), \
             RustCrypto (other ciphers, hashes and KDFs)\ncrypto paths on this CPU: {}",
            env!("CARGO_PKG_VERSION"),
            env!("UCRYPT_GIT_COMMIT"),
            env!("UCRYPT_LIBCRYPTSETUP_VERSION"),
            ucrypt::bench::cipher::crypto_paths()
        )
    })
}

#[derive(Subcommand)]
enum Command {
    /// Show ucrypt at work: make a small LUKS2 image, open it, write and read a file through it,
    /// close it, and print what to try next.
    Demo(demo::Args),
    /// Write plaintext through a table's mapping into its device (offline access).
    Write(write::Args),
    /// Read the plaintext view of a table's mapping (offline access).
    Read(read::Args),
    /// Check a table line and print it in the kernel's canonical form.
    Table(table::Args),
    /// Reproduce the seeds' I/O-engine experiments against a raw passthrough.
    Bench(bench::Args),
    /// Set a LUKS2 header's label, subsystem or keyslot priority.
    Config(metadata::ConfigArgs),
    /// Convert a LUKS header between LUKS1 and LUKS2 in place.
    #[command(name = "luksConvert", visible_alias = "convert")]
    LuksConvert(metadata::ConvertArgs),
    /// Destroy every keyslot of a LUKS header (the volume can no longer be opened).
    #[command(visible_alias = "luksErase")]
    Erase(metadata::ConfirmArgs),
    /// Repair what libcryptsetup can of a damaged LUKS header.
    Repair(metadata::ConfirmArgs),
    /// Overwrite a volume's data area with encrypted zeros (from --offset: finishes an
    /// interrupted luksFormat --wipe).
    Wipe(wipe::Args),
    /// Manage LUKS2 tokens: add (luks2-keyring), remove, import, export, unassign.
    Token(token::Args),
    /// Open, close and list the volumes of a crypttab(5) file (default /etc/ucrypttab),
    /// and write their systemd units (the ucrypt-generator).
    #[command(long_about = crypttab::LONG_ABOUT)]
    Crypttab(crypttab::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(docs::CompletionsArgs),
    /// Write man pages (ucrypt.1 and ucrypt-COMMAND.1) into a directory.
    Man(docs::ManArgs),
    /// Measure cipher throughput per cipher spec and sector size, like cryptsetup benchmark.
    Benchmark(benchmark::Args),
    /// Create a LUKS2 (or --type luks1) header on a device, like cryptsetup luksFormat.
    #[command(name = "luksFormat")]
    LuksFormat(luks_format::Args),
    /// Print a LUKS header (text, --dump-json-metadata, or --dump-volume-key).
    #[command(name = "luksDump")]
    LuksDump(luks_dump::Args),
    /// Print a BitLocker header (or --dump-volume-key), like cryptsetup bitlkDump.
    #[command(name = "bitlkDump")]
    BitlkDump(format_dump::Args),
    /// Print a FileVault2 header (or --dump-volume-key), like cryptsetup fvault2Dump.
    #[command(name = "fvault2Dump")]
    Fvault2Dump(format_dump::Args),
    /// Print a TrueCrypt/VeraCrypt header (or --dump-volume-key), like cryptsetup tcryptDump.
    #[command(name = "tcryptDump")]
    TcryptDump(tcrypt::DumpArgs),
    /// Add a passphrase in a new keyslot, unlocked by an existing one.
    #[command(name = "luksAddKey")]
    LuksAddKey(luks_add_key::Args),
    /// Remove the keyslot a passphrase opens.
    #[command(name = "luksRemoveKey")]
    LuksRemoveKey(luks_remove_key::Args),
    /// Change the passphrase of a keyslot.
    #[command(name = "luksChangeKey")]
    LuksChangeKey(luks_change_key::Args),
    /// Rewrite a LUKS2 keyslot with new PBKDF parameters (same passphrase).
    #[command(name = "luksConvertKey")]
    LuksConvertKey(luks_convert_key::Args),
    /// Destroy a keyslot by number.
    #[command(name = "luksKillSlot")]
    LuksKillSlot(luks_kill_slot::Args),
    /// Exit 0 if the device holds a valid LUKS header.
    #[command(name = "isLuks")]
    IsLuks(is_luks::Args),
    /// Standalone dm-integrity (integritysetup): dump, format, open.
    Integritysetup(integritysetup::Args),
    /// Print or set the LUKS header UUID.
    #[command(name = "luksUUID")]
    LuksUuid(luks_uuid::Args),
    /// Save the LUKS header area to a file.
    #[command(name = "luksHeaderBackup")]
    LuksHeaderBackup(luks_header_backup::Args),
    /// Write a saved LUKS header area back to the device.
    #[command(name = "luksHeaderRestore")]
    LuksHeaderRestore(luks_header_restore::Args),
    /// Re-encrypt a LUKS2 or LUKS1 volume with a new key (cipher, key size, sector size),
    /// or encrypt or decrypt a device (LUKS2 or LUKS1), resumable and interchangeable with
    /// cryptsetup reencrypt.
    Reencrypt(reencrypt::Args),
    /// Check a passphrase (--test-passphrase) or print the volume's table line (--print-table).
    #[command(name = "luksOpen")]
    LuksOpen(luks_open::Args),
    /// Open a volume: with a NAME, a named instance in the background (a device, a FUSE
    /// file or an NBD socket); without, serve over NBD in the foreground.
    Open(Box<open::Args>),
    /// Show a named instance (cryptsetup status, plus its front end and node); all
    /// instances without NAME.
    Status(lifecycle::StatusArgs),
    /// List the named instances.
    Ls(lifecycle::LsArgs),
    /// Print the name of root's instance serving a ublk or NBD device (for udev's rule
    /// udev/99-ucrypt.rules, which names it /dev/ucrypt/NAME); exit 1 if none.
    UdevName(udev_name::Args),
    /// Flush, detach and stop a named instance (refused while in use unless --force or
    /// --deferred).
    Close(lifecycle::CloseArgs),
    /// Hold a named instance's I/O and wipe its volume key from the server's memory.
    #[command(name = "luksSuspend")]
    LuksSuspend(lifecycle::SuspendArgs),
    /// Give a suspended instance its key again (asks for the passphrase); I/O continues.
    #[command(name = "luksResume")]
    LuksResume(lifecycle::ResumeArgs),
    /// Resize a named instance (after its device grew, or to --size sectors).
    Resize(lifecycle::ResizeArgs),
    /// Apply changed options (--perf-*, --allow-discards) to a named instance.
    Refresh(lifecycle::RefreshArgs),
}

/// The commands in `ucrypt --help`, grouped and ordered as cryptsetup(8) groups its
/// actions (basic actions first: open, close, status), then ucrypt's own. A command missing
/// here is listed at the end of the last group.
pub(crate) const GROUPS: &[(&str, &[&str])] = &[
    (
        "Basic actions",
        &[
            "open",
            "close",
            "status",
            "ls",
            "resize",
            "refresh",
            "reencrypt",
        ],
    ),
    (
        "LUKS actions",
        &[
            "luksFormat",
            "luksOpen",
            "luksSuspend",
            "luksResume",
            "luksAddKey",
            "luksRemoveKey",
            "luksChangeKey",
            "luksConvertKey",
            "luksKillSlot",
            "erase",
            "luksUUID",
            "isLuks",
            "luksDump",
            "luksHeaderBackup",
            "luksHeaderRestore",
            "token",
            "luksConvert",
            "config",
        ],
    ),
    (
        "TCRYPT, BITLK and FVAULT2 actions",
        &["tcryptDump", "bitlkDump", "fvault2Dump"],
    ),
    ("Miscellaneous actions", &["repair", "benchmark", "wipe"]),
    (
        "ucrypt's own",
        &[
            "demo",
            "crypttab",
            "udev-name",
            "integritysetup",
            "read",
            "write",
            "table",
            "bench",
            "man",
            "completions",
            "help",
        ],
    ),
];

/// Width of `ucrypt --help`'s command list (clap's own default).
const HELP_WIDTH: usize = 100;

/// The command-line definition with the commands in [`GROUPS`]' order and `--help` listing
/// them under the groups' headings (clap lists subcommands under one heading only).
pub(crate) fn cli_command() -> clap::Command {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    cmd.build();
    let mut groups: Vec<(&str, Vec<String>)> = GROUPS
        .iter()
        .map(|(h, names)| {
            let present = names
                .iter()
                .filter(|n| cmd.find_subcommand(n).is_some())
                .map(|n| (*n).to_string());
            (*h, present.collect())
        })
        .collect();
    let unlisted: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .filter(|n| !GROUPS.iter().any(|(_, names)| names.contains(&n.as_str())))
        .collect();
    if let Some((_, last)) = groups.last_mut() {
        last.extend(unlisted);
    }
    let width = groups
        .iter()
        .flat_map(|(_, names)| names.iter().map(String::len))
        .max()
        .unwrap_or(0);
    let mut listing = String::new();
    let mut order = 0;
    for (heading, names) in &groups {
        listing.push_str(heading);
        listing.push_str(":\n");
        for name in names {
            order += 1;
            cmd = cmd.mut_subcommand(name.as_str(), |s| s.display_order(order));
            let about = cmd
                .find_subcommand(name)
                .and_then(|s| s.get_about())
                .map(|a| a.to_string())
                .unwrap_or_default();
            listing.push_str(&help_line(name, width, &about));
        }
        listing.push('\n');
    }
    cmd.help_template(format!(
        "{{before-help}}{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{listing}\
         Options:\n{{options}}{{after-help}}"
    ))
}

/// One command of the list: `  NAME  ABOUT`, the text wrapped under itself.
fn help_line(name: &str, width: usize, about: &str) -> String {
    let indent = width + 4;
    let mut out = format!("  {name:<width$}  ");
    let mut col = indent;
    for (i, word) in about.split_whitespace().enumerate() {
        if i > 0 && col + 1 + word.len() > HELP_WIDTH {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            col = indent;
        } else if i > 0 {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += word.len();
    }
    out.push('\n');
    out
}

/// `ucrypt open`'s definition, built (with the global options), for options another
/// command passes on to it (`integritysetup open ... -- OPTIONS`). There `--socket` may be
/// the other command's own, so `--socket-group`'s need of it is checked after the merge.
pub(crate) fn open_definition() -> clap::Command {
    use clap::CommandFactory;
    // Changed before the build: a built command keeps its index of option names, which
    // `mut_arg` afterwards would leave pointing at the wrong options.
    let mut cmd = Cli::command().mut_subcommand("open", |o| {
        o.mut_arg("socket_group", |g| {
            g.requires(clap::builder::Resettable::Reset)
        })
    });
    cmd.build();
    cmd.find_subcommand("open")
        .expect("BUG: ucrypt has an open command")
        .clone()
}

/// Parses `args` with [`cli_command`]'s definition.
fn parse_cli(args: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    let mut cmd = cli_command();
    let matches = cmd.try_get_matches_from_mut(args)?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
}

/// Shared table-line input: `--table LINE` or `--table-file PATH` (keeps the key out of
/// the process's command line).
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub(crate) struct TableArg {
    /// The dm-crypt table line: '<start> <length> crypt <cipher> <key> <iv_offset> <device> <offset> [<#opts> <opts>...]'.
    #[arg(long)]
    table: Option<String>,
    /// Read the table from a file ('-' for standard input): one line, several targets of one
    /// device, or several devices as `NAME: <line>` stacked through /dev/mapper/NAME.
    #[arg(long, value_name = "PATH")]
    table_file: Option<std::path::PathBuf>,
}

impl TableArg {
    /// The whole table input (every line: a table of several lines is several targets or
    /// stacked devices, see `ucrypt::format::Mapping`, never cut to its first line).
    pub(crate) fn text(&self) -> Result<zeroize::Zeroizing<String>, CliError> {
        if let Some(t) = &self.table {
            warn_key_on_command_line();
            return Ok(zeroize::Zeroizing::new(t.clone()));
        }
        let path = self
            .table_file
            .as_ref()
            .expect("clap requires one of the two");
        if path.as_os_str() == "-" {
            return read_table_text(std::io::stdin().lock(), "standard input");
        }
        let file = std::fs::File::open(path)
            .map_err(|e| anyhow::anyhow!("reading table file {}: {e}", path.display()))?;
        read_table_text(file, &path.display().to_string())
    }

    /// The table input parsed (every line; see [`TableArg::text`]).
    pub(crate) fn mapping(&self) -> Result<ucrypt::format::Mapping, CliError> {
        let text = self.text()?;
        Ok(ucrypt::format::Mapping::parse(&text).context("parsing the table")?)
    }
}

/// Largest table input read: a table of thousands of lines fits many times over; a disk
/// image or `/dev/zero` given by mistake is refused after this much, not read whole.
const MAX_TABLE_BYTES: usize = 1 << 20;

/// Reads a table input of at most [`MAX_TABLE_BYTES`] (the text holds keys: the buffer is
/// allocated once, at full size, so no reallocation leaves a copy behind, and zeroized).
fn read_table_text(
    input: impl std::io::Read,
    name: &str,
) -> Result<zeroize::Zeroizing<String>, CliError> {
    let mut buf = zeroize::Zeroizing::new(Vec::with_capacity(MAX_TABLE_BYTES + 1));
    std::io::Read::read_to_end(
        &mut std::io::Read::take(input, MAX_TABLE_BYTES as u64 + 1),
        &mut buf,
    )
    .map_err(|e| anyhow::anyhow!("reading table file {name}: {e}"))?;
    if buf.len() > MAX_TABLE_BYTES {
        return Err(anyhow::anyhow!(
            "table file {name} is larger than {} KiB: not a table (a disk image?)",
            MAX_TABLE_BYTES >> 10
        ))
        .code(EXIT_PARAMS);
    }
    // Moves the bytes (no copy) when they are UTF-8.
    match String::from_utf8(std::mem::take(&mut *buf)) {
        Ok(s) => Ok(zeroize::Zeroizing::new(s)),
        Err(e) => {
            // Hand the bytes back so they are zeroized with `buf`.
            *buf = e.into_bytes();
            Err(anyhow::anyhow!("table file {name} is not text (UTF-8)")).code(EXIT_PARAMS)
        }
    }
}

/// `--table LINE` puts the key in the process's command line, which every local user can
/// read (`ps`, `/proc/PID/cmdline`) for as long as the process runs.
fn warn_key_on_command_line() {
    eprintln!(
        "ucrypt: warning: --table puts the key on the command line, readable by every local \
         user (ps); use --table-file FILE or --table-file - (standard input)"
    );
}

/// Overwrites the value of every `--table` in this process's command line with `x`s once
/// the arguments are parsed, so the key is not readable in `/proc/PID/cmdline` (and `ps`)
/// for as long as a server runs: the kernel reads the command line from the memory that
/// holds the argument strings, which glibc's `program_invocation_name` (argv\[0\]) points
/// at. Written by hand: no crate does this (the setproctitle crates rewrite argv\[0\] only).
/// Nothing is written unless that memory holds exactly what `/proc/self/cmdline` says.
fn scrub_table_from_argv() {
    extern "C" {
        static program_invocation_name: *mut libc::c_char;
    }
    let Ok(cmdline) = std::fs::read("/proc/self/cmdline") else {
        return;
    };
    // SAFETY: reading a pointer glibc sets once at start-up and never changes.
    let base = unsafe { program_invocation_name }.cast::<u8>();
    if base.is_null() || cmdline.is_empty() {
        return;
    }
    // SAFETY: the argument strings are one contiguous, writable stretch of the initial
    // stack, `cmdline.len()` bytes from argv[0] (what the kernel reads for
    // /proc/self/cmdline), live for the whole process; no Rust reference points into it
    // (std copies the arguments out when asked), and only this thread runs yet.
    let area = unsafe { std::slice::from_raw_parts_mut(base, cmdline.len()) };
    if *area != cmdline[..] {
        return;
    }
    let mut pos = 0;
    let mut after_flag = false;
    for arg in cmdline.split(|&b| b == 0) {
        let start = pos;
        pos += arg.len() + 1;
        let value = if after_flag {
            Some(start..start + arg.len())
        } else {
            arg.strip_prefix(b"--table=")
                .map(|v| start + arg.len() - v.len()..start + arg.len())
        };
        after_flag = arg == b"--table";
        if let Some(r) = value {
            area[r].fill(b'x');
        }
    }
}

/// A clap parser for a number in `LO..=HI`: an absurd value is refused with its range
/// rather than exhausting threads or memory, or overflowing, later.
fn bounded<const LO: usize, const HI: usize>(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if (LO..=HI).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} is outside {LO}..={HI}"))
    }
}

/// Whether the device's page cache sits under the volume. Default: block devices with
/// 512-byte logical blocks bypass it (O_DIRECT, as dm-crypt has no page cache under it),
/// files and other block devices keep it.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub(crate) struct CacheArgs {
    /// Bypass the page cache on the device (O_DIRECT), regular files included. Default:
    /// only block devices with 512-byte logical blocks bypass it.
    #[arg(long, conflicts_with = "buffered")]
    pub(crate) direct: bool,
    /// Read and write the device through the page cache, block devices included.
    #[arg(long)]
    pub(crate) buffered: bool,
}

impl CacheArgs {
    /// The library's setting for these flags.
    pub(crate) fn cache(self) -> ucrypt::open::Cache {
        match (self.direct, self.buffered) {
            (true, _) => ucrypt::open::Cache::Direct,
            (false, true) => ucrypt::open::Cache::Buffered,
            (false, false) => ucrypt::open::Cache::Auto,
        }
    }
}

/// Engine flags: cryptsetup's `--perf-*` (dm-crypt's names) and ucrypt's own.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct PerfArgs {
    /// Decrypt reads in the receiving thread (dm-crypt no_read_workqueue).
    #[arg(long = "perf-no_read_workqueue")]
    no_read_workqueue: bool,
    /// Encrypt writes in the receiving thread (dm-crypt no_write_workqueue).
    #[arg(long = "perf-no_write_workqueue")]
    no_write_workqueue: bool,
    /// Keep a request's crypto on the receiving CPU's worker (dm-crypt same_cpu_crypt).
    #[arg(long = "perf-same_cpu_crypt")]
    same_cpu_crypt: bool,
    /// Crypt workers submit writes themselves, unordered (dm-crypt submit_from_crypt_cpus).
    #[arg(long = "perf-submit_from_crypt_cpus")]
    submit_from_crypt_cpus: bool,
    /// Order of the write submitter: issue (requests in arrival order) or sorted (by sector).
    #[arg(long, value_parser = ["issue", "sorted"], default_value = "issue")]
    write_order: String,
    /// Chunk size in bytes for splitting large requests across workers (kernel: 131072;
    /// at most 64 MiB, twice the largest request).
    #[arg(long, value_parser = bounded::<0, { 64 << 20 }>)]
    split_bytes: Option<usize>,
    /// Crypt worker threads (default: one per CPU; at most 1024).
    #[arg(long, value_parser = bounded::<0, 1024>)]
    workers: Option<usize>,
    /// auto (ucrypt's measured policy) or kernel (dm-crypt's fixed workqueue placement).
    #[arg(long, value_parser = ["auto", "kernel"], default_value = "auto")]
    placement: String,
}

impl PerfArgs {
    pub(crate) fn options(&self) -> ucrypt::config::PerfOptions {
        use ucrypt::config::{PerfOptions, PlacementPolicy};
        PerfOptions {
            no_read_workqueue: self.no_read_workqueue,
            no_write_workqueue: self.no_write_workqueue,
            same_cpu_crypt: self.same_cpu_crypt,
            submit_from_crypt_cpus: self.submit_from_crypt_cpus,
            write_order: if self.write_order == "sorted" {
                ucrypt::config::WriteOrder::Sorted
            } else {
                ucrypt::config::WriteOrder::Issue
            },
            split_bytes: self.split_bytes,
            workers: self.workers,
            placement: if self.placement == "kernel" {
                PlacementPolicy::Kernel
            } else {
                PlacementPolicy::Auto
            },
        }
    }
}

/// `ucrypt open`: a named instance, or an export in the foreground.
pub(crate) fn open_command(mut a: open::Args) -> Result<(), CliError> {
    match open::instance_name(&mut a)? {
        Some(name) => instance::run(a, name),
        None => open::run(a),
    }
}

/// Runs `ucrypt open` with `argv` (from `ucrypt`): `crypttab open --notify`, whose
/// library-built command line (`ucrypt::crypttab::Entry::open_command`) is also what its
/// `--dry-run` prints and what it runs as a child for each entry otherwise; `keep` (the
/// pipe the key is read from) lives until `open` returns.
pub(crate) fn run_open_args<K>(argv: Vec<String>, keep: K) -> Result<(), CliError> {
    let cli = parse_cli(argv.into_iter().map(Into::into).collect())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let r = match cli.command {
        Command::Open(a) => open_command(*a),
        _ => Err(anyhow::anyhow!("not an open command").into()),
    };
    drop(keep);
    r
}

/// cryptsetup's old action names that are another action here: every `*Close` and
/// `remove` are `close`, `luksConfig` is `config` (cryptsetup 2.6-2.8's alias list).
const RENAMED: &[(&str, &str)] = &[
    ("remove", "close"),
    ("plainClose", "close"),
    ("luksClose", "close"),
    ("loopaesClose", "close"),
    ("tcryptClose", "close"),
    ("bitlkClose", "close"),
    ("fvault2Close", "close"),
    ("luksConfig", "config"),
];

/// cryptsetup actions and options that cannot make sense for ucrypt, each with its one-line
/// reason: (action or option as typed, reason).
pub(crate) const REFUSED: &[(&str, &str)] = &[
    (
        "--hw-opal",
        "OPAL self-encrypting drives are locked and unlocked by the drive through the \
         kernel's sed-opal ioctls; ucrypt encrypts in userspace and cannot set them up \
         (use cryptsetup luksFormat --hw-opal)",
    ),
    (
        "--hw-opal-only",
        "OPAL self-encrypting drives are locked and unlocked by the drive through the \
         kernel's sed-opal ioctls; ucrypt encrypts in userspace and cannot set them up \
         (use cryptsetup luksFormat --hw-opal-only)",
    ),
    (
        "--integrity",
        "--integrity is taken by luksFormat (LUKS2 with authenticated encryption) and \
         integritysetup; reencrypt does not take it (cryptsetup 2.6 refuses to reencrypt a \
         device with integrity, and so does ucrypt)",
    ),
];

/// The reason this command line asks for something ucrypt refuses ([`REFUSED`]).
fn refused(args: &[std::ffi::OsString]) -> Option<&'static str> {
    // `integritysetup` takes `--integrity` (the internal hash) as integritysetup does, and
    // `luksFormat` (authenticated encryption) as cryptsetup's.
    let integritysetup = action_pos(args)
        .is_some_and(|i| matches!(args[i].to_str(), Some("integritysetup" | "luksFormat")));
    let mut prev = "";
    for a in args.iter().skip(1) {
        let a = a.to_str().unwrap_or("");
        let typed = if prev == "--type" || prev == "-M" {
            format!("--type={a}")
        } else {
            a.split('=').next().unwrap_or(a).to_string()
        };
        let typed = if a.starts_with("--type=") {
            a.to_string()
        } else {
            typed
        };
        if let Some((_, why)) = REFUSED
            .iter()
            .find(|(what, _)| *what == typed && !(integritysetup && typed == "--integrity"))
        {
            return Some(why);
        }
        prev = a;
    }
    None
}

/// Global options that take a value as the next argument (`-t 10 open ...`).
const GLOBAL_WITH_VALUE: &[&str] = &[
    "-t",
    "--timeout",
    "--ceph-conf",
    "--ceph-id",
    "--keyring",
    "--external-tokens-path",
];

/// Where the action is in `args`: the first argument after the program that is neither
/// an option nor the value of a global option in front of the action.
fn action_pos(args: &[std::ffi::OsString]) -> Option<usize> {
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if !a.starts_with('-') {
            return Some(i);
        }
        i += if GLOBAL_WITH_VALUE.contains(&a.as_ref()) {
            2
        } else {
            1
        };
    }
    None
}

/// cryptsetup's global flags: `-q`/`--batch-mode` (ask nothing) and `-v`/`--verbose`
/// (extra lines) are accepted before the action (`cryptsetup -q luksFormat ...`) and on
/// every action. Here they are moved after the action; on a command that has no such
/// flag (it asks nothing, or has nothing more to say) they are dropped.
fn place_global_flags(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    const FLAGS: [(&str, &str); 4] = [
        ("-q", "batch_mode"),
        ("--batch-mode", "batch_mode"),
        ("-v", "verbose"),
        ("--verbose", "verbose"),
    ];
    let flag_id = |a: &std::ffi::OsString| FLAGS.iter().find(|(f, _)| a == *f).map(|(_, id)| *id);
    // The flags in front of the action move behind it.
    let mut front = Vec::new();
    let mut i = 1;
    while i < args.len() && args[i].to_string_lossy().starts_with('-') {
        if flag_id(&args[i]).is_some() {
            front.push(args.remove(i));
        } else if GLOBAL_WITH_VALUE.contains(&args[i].to_string_lossy().as_ref()) {
            i += 2;
        } else {
            i += 1;
        }
    }
    let Some(pos) = action_pos(&args) else {
        return args;
    };
    for (k, f) in front.into_iter().enumerate() {
        args.insert(pos + 1 + k, f);
    }
    let cmd = Cli::command();
    let Some(sub) = args[pos]
        .to_str()
        .and_then(|name| cmd.find_subcommand(name))
    else {
        return args;
    };
    let has = |id: &str| sub.get_arguments().any(|a| a.get_id() == id);
    let keep: Vec<bool> = args
        .iter()
        .enumerate()
        .map(|(i, a)| i <= pos || flag_id(a).is_none_or(&has))
        .collect();
    let mut k = keep.into_iter();
    args.retain(|_| k.next().unwrap_or(true));
    args
}

/// Parses the command line, runs the command, prints any error as one line on stderr.
/// cryptsetup's per-type open commands: `luksOpen`, `tcryptOpen`, `bitlkOpen`,
/// `plainOpen`, `loopaesOpen` and `fvault2Open DEV NAME` are `open --type T DEV NAME`. With
/// `--test-passphrase` or `--print-table` they stay (or become) `luksOpen --type T`, which
/// checks or prints without serving. `create NAME DEV` is `plainOpen DEV NAME`; the
/// [`RENAMED`] actions are renamed.
fn expand_open_aliases(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let Some(pos) = action_pos(&args) else {
        return args;
    };
    if let Some((_, to)) = RENAMED.iter().find(|(from, _)| args[pos] == **from) {
        args[pos] = (*to).into();
        return args;
    }
    // cryptsetup's `open --refresh DEV NAME` (or `--refresh NAME`) is `refresh NAME`: the
    // named instance already knows its device.
    let opens = [
        "open",
        "luksOpen",
        "tcryptOpen",
        "bitlkOpen",
        "plainOpen",
        "loopaesOpen",
        "fvault2Open",
    ];
    if opens.iter().any(|o| args[pos] == *o) && args[pos + 1..].iter().any(|a| a == "--refresh") {
        args.retain(|a| a != "--refresh");
        args[pos] = "refresh".into();
        // Options of refresh (and globals) whose value is the next argument.
        const WITH_VALUE: &[&str] = &[
            "-d",
            "--key-file",
            "--keyfile-offset",
            "-l",
            "--keyfile-size",
            "--table-file",
            "--token-id",
            "--token-type",
            "--token-timeout",
            "--split-bytes",
            "--workers",
            "--write-order",
            "--placement",
            "--header",
            "--type",
            "-M",
        ];
        let positional: Vec<usize> = (pos + 1..args.len())
            .filter(|&i| {
                let prev = args[i - 1].to_string_lossy();
                !args[i].to_string_lossy().starts_with('-')
                    && !WITH_VALUE.contains(&prev.as_ref())
                    && !GLOBAL_WITH_VALUE.contains(&prev.as_ref())
            })
            .collect();
        if positional.len() >= 2 {
            args.remove(positional[0]);
        }
        return args;
    }
    // cryptsetup's historical `create NAME DEV`: the two arguments swapped.
    if args[pos] == "create" {
        args[pos] = "plainOpen".into();
        let plain = |i: usize| {
            args.get(i)
                .is_some_and(|a| !a.to_string_lossy().starts_with('-'))
        };
        if plain(pos + 1) && plain(pos + 2) {
            args.swap(pos + 1, pos + 2);
        }
    }
    let kind = match args[pos].to_str() {
        Some("luksOpen") => "luks",
        Some("tcryptOpen") => "tcrypt",
        Some("bitlkOpen") => "bitlk",
        Some("plainOpen") => "plain",
        Some("loopaesOpen") => "loopaes",
        Some("fvault2Open") => "fvault2",
        _ => return args,
    };
    let rest = &args[pos + 1..];
    let checks_only = rest
        .iter()
        .any(|a| a == "--test-passphrase" || a == "--print-table");
    // `luksOpen --type luks2`: the user's type wins.
    let typed = rest.iter().any(|a| {
        let a = a.to_string_lossy();
        a == "--type" || a == "-M" || a.starts_with("--type=")
    });
    let command = if checks_only { "luksOpen" } else { "open" };
    if checks_only && kind == "luks" {
        return args;
    }
    if typed {
        args[pos] = command.into();
    } else {
        args.splice(pos..=pos, [command.into(), "--type".into(), kind.into()]);
    }
    args
}

/// cryptsetup's `--debug` implies `--verbose`: `-v` is added in front of the action (and
/// placed or dropped by [`place_global_flags`] as a typed one).
fn debug_implies_verbose(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    if args
        .iter()
        .skip(1)
        .any(|a| a == "--debug" || a == "--debug-json")
        && !args.iter().skip(1).any(|a| a == "-v" || a == "--verbose")
    {
        args.insert(1, "-v".into());
    }
    args
}

pub fn run() -> ExitCode {
    signals::die_of_sigpipe_when_stdout_is_closed();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(why) = refused(&args) {
        eprintln!("ucrypt: {why}");
        return ExitCode::from(EXIT_PARAMS);
    }
    // cryptsetup's --usage: the short usage line, then exit 0 (before the action is parsed,
    // so it works alone as in `cryptsetup --usage`).
    if args.iter().skip(1).any(|a| a == "--usage") {
        let mut cmd = cli_command();
        println!("{}", cmd.render_usage());
        println!("Try `ucrypt --help` for the actions and their options.");
        return ExitCode::SUCCESS;
    }
    let command_line = shown_command_line(&args);
    if args
        .iter()
        .skip(1)
        .any(|a| a == "-v" || a == "--verbose" || a == "--debug" || a == "--debug-json")
    {
        VERBOSE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    // cryptsetup: batch mode switches off the second "Verify passphrase" prompt.
    let batch_mode = args
        .iter()
        .skip(1)
        .any(|a| a == "-q" || a == "--batch-mode");
    let cli = match parse_cli(place_global_flags(expand_open_aliases(
        debug_implies_verbose(args),
    ))) {
        Ok(cli) => cli,
        // --help and --version print and succeed; usage errors exit 1 as cryptsetup's do
        // (clap's own 2 means "wrong passphrase" to cryptsetup's users).
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_PARAMS)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if cli.test_args {
        println!("No action taken. Invoked with --test-args option.");
        return ExitCode::SUCCESS;
    }
    // Before any key or passphrase is read: no core dump may ever hold one.
    if let Err(e) = ucrypt::secure::disable_core_dumps() {
        eprintln!("ucrypt: warning: cannot disable core dumps: {e}");
    }
    // The parsed arguments hold their own copy of a --table line: the command line that
    // every local user can read need not keep it.
    scrub_table_from_argv();
    // No mlockall: only secrets are locked, where they are allocated (see secure.rs).
    // Mapped reads of image files survive the file being truncated under them only with
    // this handler; without it files are read with pread (ucrypt::settings).
    if let Err(e) = ucrypt::settings::install_sigbus_handler() {
        eprintln!("ucrypt: warning: cannot install the SIGBUS handler, not mapping files: {e}");
    }
    if cli.debug || cli.debug_json {
        DEBUG.store(true, std::sync::atomic::Ordering::Relaxed);
        ucrypt::settings::set_cryptsetup_debug(cli.debug_json);
        debug(format_args!(
            "ucrypt {} (commit {}) processing \"{command_line}\"",
            env!("CARGO_PKG_VERSION"),
            env!("UCRYPT_GIT_COMMIT")
        ));
        debug(format_args!(
            "libcryptsetup {}, token plugins from {}",
            env!("UCRYPT_LIBCRYPTSETUP_VERSION"),
            ucrypt::settings::external_tokens_dir()
        ));
    }
    secret::set_timeout(cli.timeout);
    secret::set_verify(cli.verify_passphrase, batch_mode);
    if cli.disable_keyring {
        ucrypt::settings::disable_volume_key_keyring();
    }
    if cli.disable_locks {
        DISABLE_LOCKS.store(true, std::sync::atomic::Ordering::Relaxed);
        ucrypt::settings::disable_metadata_locking();
    }
    if cli.disable_external_tokens {
        ucrypt::settings::disable_external_tokens();
    }
    if let Some(dir) = &cli.external_tokens_path {
        if let Err(e) = ucrypt::settings::set_external_tokens_path(dir) {
            eprintln!("ucrypt: {e}");
            return ExitCode::from(EXIT_PARAMS);
        }
    }
    if cli.ceph_conf.is_some() || cli.ceph_id.is_some() || cli.keyring.is_some() {
        ucrypt::settings::set_ceph_client(ucrypt::settings::CephClient {
            conf: cli.ceph_conf,
            id: cli.ceph_id,
            keyring: cli.keyring,
        });
    }
    let result = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Write(a) => write::run(a),
        Command::Read(a) => read::run(a),
        Command::Table(a) => table::run(a),
        Command::Benchmark(a) => benchmark::run(a),
        Command::LuksFormat(a) => luks_format::run(a),
        Command::LuksDump(a) => luks_dump::run(a),
        Command::BitlkDump(a) => format_dump::run(ucrypt::VolumeType::Bitlk, a),
        Command::Fvault2Dump(a) => format_dump::run(ucrypt::VolumeType::Fvault2, a),
        Command::TcryptDump(a) => tcrypt::run_dump(a),
        Command::LuksAddKey(a) => luks_add_key::run(a),
        Command::LuksRemoveKey(a) => luks_remove_key::run(a),
        Command::LuksChangeKey(a) => luks_change_key::run(a),
        Command::LuksKillSlot(a) => luks_kill_slot::run(a),
        Command::LuksConvertKey(a) => luks_convert_key::run(a),
        Command::Reencrypt(a) => reencrypt::run(a),
        Command::IsLuks(a) => is_luks::run(a),
        Command::Integritysetup(a) => integritysetup::run(a),
        Command::LuksUuid(a) => luks_uuid::run(a),
        Command::LuksHeaderBackup(a) => luks_header_backup::run(a),
        Command::LuksHeaderRestore(a) => luks_header_restore::run(a),
        Command::LuksOpen(a) => luks_open::run(a),
        Command::Open(a) => open_command(*a),
        Command::Status(a) => lifecycle::status(a),
        Command::Ls(a) => lifecycle::ls(a),
        Command::UdevName(a) => udev_name::run(a),
        Command::Close(a) => lifecycle::close(a),
        Command::LuksSuspend(a) => lifecycle::suspend(a),
        Command::LuksResume(a) => lifecycle::resume(a),
        Command::Resize(a) => lifecycle::resize(a),
        Command::Refresh(a) => lifecycle::refresh(a),
        Command::Bench(a) => bench::run(a),
        Command::Config(a) => metadata::config(a),
        Command::LuksConvert(a) => metadata::convert(a),
        Command::Erase(a) => metadata::erase(a),
        Command::Repair(a) => metadata::repair(a),
        Command::Token(a) => token::run(a),
        Command::Crypttab(a) => crypttab::run(a),
        Command::Wipe(a) => wipe::run(a),
        Command::Completions(a) => docs::completions(a),
        Command::Man(a) => docs::man(a),
    };
    // Header commands on NBD URIs worked on a staged copy: the bytes they changed go back
    // to the server now (also after a failure, as they would be on a local device).
    let result = match (result, luks::write_back_remote()) {
        (Ok(()), wb) => wb,
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(wb)) => {
            eprintln!("ucrypt: {}", error_line(&wb.err));
            Err(e)
        }
    };
    match result {
        Ok(()) => {
            debug("Command successful (exit code 0).");
            ExitCode::SUCCESS
        }
        Err(CliError { code, err }) => {
            // One line: the context chain, outermost first.
            if err.downcast_ref::<Printed>().is_none() {
                eprintln!("ucrypt: {}", error_line(&err));
            }
            debug(format_args!("Command failed with exit code {code}."));
            ExitCode::from(code)
        }
    }
}
