//! `ucrypt crypttab open|close|ls|generate`: the volumes a crypttab(5) file lists
//! (default `/etc/ucrypttab`). The file's meaning is the library's
//! ([`ucrypt::crypttab`]: every option honoured or refused by name); this command turns an
//! entry into the `ucrypt open` it stands for and runs it: one child `ucrypt open` per
//! entry (each goes to the background once its device is ready, as a typed `open` does),
//! or, with `--notify` (a systemd unit), the one entry's `open --notify` in this process,
//! which stays its server.

use super::exit::lib_error;
use super::{CliError, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use ucrypt::crypttab::{self, Crypttab, Entry, Key};
use ucrypt::instance::runtime::{self, Paths, Probe};

/// What `ucrypt crypttab --help` and its man page say about the file.
pub(crate) const LONG_ABOUT: &str = "\
Open, close and list the volumes of a crypttab(5) file (default /etc/ucrypttab; \
--file /etc/crypttab reads the system's), and write their systemd units.

One volume per line: NAME DEVICE [KEY [OPTIONS]], fields separated by white space, \
quotes or a backslash for white space inside a field, '#' starts a comment. DEVICE: a \
path, UUID=, PARTUUID=, LABEL= or PARTLABEL= (through /dev/disk/by-*, else blkid). KEY: \
none or - (tokens, then a passphrase), a key file, or FILE:DEVICE (FILE on DEVICE's file \
system, mounted read-only while it is read). OPTIONS, comma-separated (\\, for a comma): \
luks, plain, tcrypt, bitlk, fvault2, header=, keyfile-offset=, keyfile-size=, key-slot=, \
tries= (0: until right), timeout=, readonly, discard, sector-size=, cipher=, size= (key \
bits), hash=, offset=, skip=, tcrypt-hidden, tcrypt-system, tcrypt-veracrypt, \
veracrypt-pim=, tcrypt-keyfile=, same-cpu-crypt, submit-from-crypt-cpus, \
no-read-workqueue, no-write-workqueue, tpm2-device=auto, fido2-device=auto, \
pkcs11-uri=auto, token-timeout= (default 30s with a device named), headless, nofail, noauto, _netdev, \
x-systemd.device-timeout=, x-ucrypt-device=ublk|nbd|fuse|vhost-user|none. Any other option is \
refused by name with the reason (swap, tmp, a tpm2-device path...), never ignored.

Boot: the ucrypt-generator script (systemd/ in the sources) runs `ucrypt crypttab \
generate`, which writes one ucrypt@NAME.service (Type=notify) per line; each runs \
`ucrypt crypttab open --notify NAME` and stops with `ucrypt close NAME`.";

/// Arguments of `ucrypt crypttab`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Open the named entries (default: every entry without noauto); entries already open
    /// are left as they are.
    Open(OpenArgs),
    /// Close the named entries (default: every entry that is open).
    Close(NamesArgs),
    /// List the entries: name, device, key, options, and whether each is open.
    Ls(NamesArgs),
    /// Write one systemd unit per entry into DIR (what the ucrypt-generator script runs;
    /// systemd passes three directories, the first is used).
    Generate(GenerateArgs),
}

#[derive(clap::Args)]
struct NamesArgs {
    /// The crypttab file (/etc/crypttab is systemd-cryptsetup's; same format).
    #[arg(long, default_value = crypttab::DEFAULT_PATH, value_name = "FILE")]
    file: PathBuf,
    /// Entries by name.
    #[arg(value_name = "NAME")]
    names: Vec<String>,
}

#[derive(clap::Args)]
struct OpenArgs {
    #[command(flatten)]
    names: NamesArgs,
    /// For a Type=notify systemd unit: open exactly one NAME in this process, which stays
    /// its server, and tell systemd (READY=1 on $NOTIFY_SOCKET) once the device is up; a
    /// passphrase is asked through systemd-ask-password when there is no terminal.
    #[arg(long)]
    notify: bool,
    /// Print the `ucrypt open` command line each entry stands for, and open nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// The crypttab file.
    #[arg(long, default_value = crypttab::DEFAULT_PATH, value_name = "FILE")]
    file: PathBuf,
    /// The generator's output directory (systemd's "normal" directory).
    dir: PathBuf,
    /// systemd's early and late directories (unused).
    #[arg(hide = true)]
    rest: Vec<PathBuf>,
}

pub(crate) fn run(a: Args) -> Result<(), CliError> {
    match a.action {
        Action::Open(o) => open(o),
        Action::Close(c) => close(c),
        Action::Ls(l) => ls(l),
        Action::Generate(g) => generate(g),
    }
}

fn read(file: &Path) -> Result<Crypttab, CliError> {
    Crypttab::read(file).map_err(|e| {
        let code = match e {
            crypttab::Error::Read { .. } => EXIT_DEVICE,
            _ => EXIT_PARAMS,
        };
        CliError {
            code,
            err: e.into(),
        }
    })
}

fn select<'a>(tab: &'a Crypttab, names: &[String]) -> Result<Vec<&'a Entry>, CliError> {
    tab.select(names).map_err(|e| CliError {
        code: EXIT_DEVICE,
        err: e.into(),
    })
}

/// Whether the instance NAME is running (a dead one's debris is cleaned up by the probe).
fn is_open(name: &str) -> bool {
    Paths::of(name)
        .ok()
        .and_then(|p| runtime::probe(&p).ok())
        .is_some_and(|p| matches!(p, Probe::Live { .. }))
}

fn open(a: OpenArgs) -> Result<(), CliError> {
    let tab = read(&a.names.file)?;
    let entries = select(&tab, &a.names.names)?;
    if a.notify {
        let [entry] = entries.as_slice() else {
            return Err(anyhow::anyhow!(
                "--notify opens exactly one NAME (the unit's), not {}",
                entries.len()
            ))
            .code(EXIT_PARAMS);
        };
        let (argv, key) = open_argv(entry, true)?;
        if a.dry_run {
            println!("{}", shown(&argv));
            return Ok(());
        }
        // This process becomes the server: systemd's main process, as Type=notify wants.
        return super::run_open_args(
            argv.iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect(),
            key,
        );
    }
    let exe =
        std::env::current_exe().map_err(|e| anyhow::anyhow!("finding the ucrypt binary: {e}"))?;
    // nofail is about the whole set (boot goes on): a volume named on the command line
    // that fails is this command's failure.
    let all = a.names.names.is_empty();
    let mut failed: Option<CliError> = None;
    for e in entries {
        if !a.dry_run && is_open(&e.name) {
            eprintln!("ucrypt: {} is already open", e.name);
            continue;
        }
        let result = open_argv(e, false).and_then(|(argv, key)| {
            if a.dry_run {
                println!("{}", shown(&argv));
                return Ok(());
            }
            let status = std::process::Command::new(&exe)
                .args(&argv[1..])
                .status()
                .map_err(|err| anyhow::anyhow!("running {}: {err}", exe.display()))?;
            drop(key);
            match status.code() {
                Some(0) => Ok(()),
                code => Err(anyhow::anyhow!(
                    "{}: ucrypt open failed (exit {})",
                    e.name,
                    code.unwrap_or(1)
                ))
                .code(code.and_then(|c| u8::try_from(c).ok()).unwrap_or(1)),
            }
        });
        if let Err(err) = result {
            if e.options.nofail && all {
                eprintln!("ucrypt: {} (nofail: going on)", super::error_line(&err.err));
            } else {
                eprintln!("ucrypt: {}", super::error_line(&err.err));
                failed.get_or_insert(err);
            }
        }
    }
    match failed {
        None => Ok(()),
        Some(e) => Err(CliError {
            code: e.code,
            err: anyhow::Error::new(super::Printed),
        }),
    }
}

/// The command line, shown (key material never is on it: key files are paths).
fn shown(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| {
            let s = a.to_string_lossy();
            if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '\'') {
                format!("'{}'", s.replace('\'', "'\\''"))
            } else {
                s.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A key read from a device's file system, in an anonymous memory file the `open` reads
/// as `/dev/fd/N` (inherited by a child; closed when dropped).
struct MemKey(std::os::fd::OwnedFd);

/// The `ucrypt open` arguments (from `ucrypt` on) an entry stands for, and the in-memory
/// key it refers to, which must live until that open has read it.
fn open_argv(e: &Entry, notify: bool) -> Result<(Vec<OsString>, Option<MemKey>), CliError> {
    let o = &e.options;
    let device = e.device.resolve().map_err(|err| CliError {
        code: EXIT_DEVICE,
        err: err.into(),
    })?;
    let mut v: Vec<OsString> = vec!["ucrypt".into(), "open".into()];
    let mut arg = |s: &str| v.push(s.into());
    if let Some(k) = o.kind {
        arg("--type");
        arg(crypttab::options::type_name(k));
    }
    if let Some(secs) = o.timeout_secs {
        arg(&format!("--timeout={secs}"));
    }
    if o.tries != 3 {
        arg(&format!("--tries={}", o.tries));
    }
    if let Some(s) = o.key_slot {
        arg(&format!("--key-slot={s}"));
    }
    if o.read_only {
        arg("--read-only");
    }
    if o.discard {
        arg("--allow-discards");
    }
    for (flag, on) in [
        ("--perf-same_cpu_crypt", o.same_cpu_crypt),
        ("--perf-submit_from_crypt_cpus", o.submit_from_crypt_cpus),
        ("--perf-no_read_workqueue", o.no_read_workqueue),
        ("--perf-no_write_workqueue", o.no_write_workqueue),
        ("--tcrypt-hidden", o.tcrypt_hidden),
        ("--tcrypt-system", o.tcrypt_system),
        ("--veracrypt", o.tcrypt_veracrypt),
    ] {
        if on {
            arg(flag);
        }
    }
    let valued = [
        ("--cipher", o.cipher.clone()),
        ("--key-size", o.key_size.map(|n| n.to_string())),
        ("--hash", o.hash.clone()),
        ("--offset", o.offset.map(|n| n.to_string())),
        ("--skip", o.skip.map(|n| n.to_string())),
        ("--sector-size", o.sector_size.map(|n| n.to_string())),
        ("--veracrypt-pim", o.veracrypt_pim.map(|n| n.to_string())),
        ("--token-type", o.tokens.only_type().map(str::to_string)),
        (
            "--token-timeout",
            o.tokens
                .wait()
                .map(|t| t.as_millis().div_ceil(1000).to_string()),
        ),
        ("--device", o.frontend.map(|f| f.as_str().to_string())),
    ];
    for (flag, value) in valued {
        if let Some(value) = value {
            arg(&format!("{flag}={value}"));
        }
    }
    for k in &o.tcrypt_keyfiles {
        let mut s = OsString::from("--tcrypt-keyfile=");
        s.push(k);
        v.push(s);
    }
    if let Some(h) = &o.header {
        let path = h.resolve().map_err(|err| CliError {
            code: EXIT_DEVICE,
            err: err.into(),
        })?;
        let mut s = OsString::from("--header=");
        s.push(path);
        v.push(s);
    }
    let mut mem = None;
    let key_path: Option<PathBuf> = match &e.key {
        Key::None => None,
        Key::File(p) => Some(p.clone()),
        Key::FileOnDevice { file, device } => {
            let m = key_from_device(file, device)?;
            let path = PathBuf::from(format!("/dev/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&m.0)));
            mem = Some(m);
            Some(path)
        }
    };
    match key_path {
        Some(p) => {
            let mut s = OsString::from("--key-file=");
            s.push(p);
            v.push(s);
            if o.keyfile_offset != 0 {
                v.push(format!("--keyfile-offset={}", o.keyfile_offset).into());
            }
            if o.keyfile_size != 0 {
                v.push(format!("--keyfile-size={}", o.keyfile_size).into());
            }
        }
        // Never a passphrase prompt: tokens only.
        None if o.headless => v.push("--token-only".into()),
        None => {}
    }
    if notify {
        v.push("--notify".into());
    }
    v.push("--".into());
    v.push(device.into_os_string());
    v.push(e.name.clone().into());
    Ok((v, mem))
}

/// Reads `file` from the file system on `device`, mounted read-only at a private
/// directory for as long as that takes, into a memory file.
fn key_from_device(file: &Path, device: &crypttab::DeviceSpec) -> Result<MemKey, CliError> {
    let dev = device.resolve().map_err(|err| CliError {
        code: EXIT_DEVICE,
        err: err.into(),
    })?;
    let dir = tempfile::Builder::new()
        .prefix("ucrypt-keydev-")
        .tempdir()
        .map_err(|e| anyhow::anyhow!("creating a mount point for the key device: {e}"))?;
    let mounted = std::process::Command::new("mount")
        .args(["-o", "ro,nosuid,nodev,noexec"])
        .arg(&dev)
        .arg(dir.path())
        .status()
        .map_err(|e| anyhow::anyhow!("running mount: {e}"))?;
    if !mounted.success() {
        return Err(anyhow::anyhow!(
            "cannot mount the key device {} ({device}) read-only",
            dev.display()
        ))
        .code(EXIT_DEVICE);
    }
    let rel = file.strip_prefix("/").unwrap_or(file);
    let key = ucrypt::unlock::read_key_file(&dir.path().join(rel), 0, 0).map_err(lib_error);
    let _ = std::process::Command::new("umount")
        .arg(dir.path())
        .status();
    let key = key?;
    // SAFETY: memfd_create takes a NUL-terminated name and flags; no CLOEXEC, so the
    // `ucrypt open` child inherits it.
    let fd = unsafe { libc::memfd_create(c"ucrypt-key".as_ptr(), 0) };
    if fd < 0 {
        return Err(anyhow::anyhow!("memfd_create: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: a descriptor we just created and own.
    let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut f = std::fs::File::from(owned);
    f.write_all(&key)
        .map_err(|e| anyhow::anyhow!("writing the key to a memory file: {e}"))?;
    Ok(MemKey(f.into()))
}

fn close(a: NamesArgs) -> Result<(), CliError> {
    let tab = read(&a.file)?;
    let all = a.names.is_empty();
    let entries: Vec<&Entry> = if all {
        tab.entries.iter().filter(|e| is_open(&e.name)).collect()
    } else {
        select(&tab, &a.names)?
    };
    let mut failed: Option<CliError> = None;
    // Last opened, first closed.
    for e in entries.iter().rev() {
        if let Err(err) = super::lifecycle::close(super::lifecycle::CloseArgs::of(e.name.clone())) {
            eprintln!("ucrypt: {}: {}", e.name, super::error_line(&err.err));
            failed.get_or_insert(err);
        }
    }
    match failed {
        None => Ok(()),
        Some(e) => Err(CliError {
            code: e.code,
            err: anyhow::Error::new(super::Printed),
        }),
    }
}

fn ls(a: NamesArgs) -> Result<(), CliError> {
    let tab = read(&a.file)?;
    let entries: Vec<&Entry> = if a.names.is_empty() {
        tab.entries.iter().collect()
    } else {
        select(&tab, &a.names)?
    };
    let rows: Vec<[String; 5]> = entries
        .iter()
        .map(|e| {
            let state = if is_open(&e.name) { "open" } else { "closed" };
            [
                e.name.clone(),
                e.device.to_string(),
                e.key.to_string(),
                if e.options_text.is_empty() {
                    "-".into()
                } else {
                    e.options_text.clone()
                },
                state.into(),
            ]
        })
        .collect();
    let header = ["NAME", "DEVICE", "KEY", "OPTIONS", "STATE"].map(String::from);
    let mut widths = [0usize; 5];
    for r in std::iter::once(&header).chain(&rows) {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = std::io::stdout().lock();
    for r in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 4 {
                    c.clone()
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        writeln!(out, "{}", line.join("  "))?;
    }
    Ok(())
}

fn generate(a: GenerateArgs) -> Result<(), CliError> {
    // No file: nothing to open at boot, and nothing wrong.
    if !a.file.exists() {
        return Ok(());
    }
    // Units name the file absolutely: they run from /.
    let file =
        std::path::absolute(&a.file).map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    let text = std::fs::read_to_string(&file)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))
        .code(EXIT_DEVICE)?;
    // A bad line gets no unit and is reported (systemd logs it); the others still open.
    let (tab, errors) = Crypttab::parse_each(&file, &text);
    let exe =
        std::env::current_exe().map_err(|e| anyhow::anyhow!("finding the ucrypt binary: {e}"))?;
    crypttab::systemd::generate(&tab, &exe)
        .write(&a.dir)
        .map_err(|e| anyhow::anyhow!("writing units into {}: {e}", a.dir.display()))?;
    if errors.is_empty() {
        return Ok(());
    }
    for e in &errors {
        eprintln!("ucrypt-generator: {e} (no unit for this line)");
    }
    Err(CliError {
        code: EXIT_PARAMS,
        err: anyhow::Error::new(super::Printed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(line: &str) -> String {
        let tab = Crypttab::parse(Path::new("/t"), line).unwrap();
        shown(
            &open_argv(&tab.entries[0], false)
                .unwrap_or_else(|e| panic!("{}", e.err))
                .0,
        )
    }

    #[test]
    fn entries_become_open_command_lines() {
        assert_eq!(
            argv("data /dev/null none luks,discard,x-ucrypt-device=ublk,tries=5,timeout=30s\n"),
            "ucrypt open --type luks --timeout=30 --tries=5 --allow-discards --device=ublk -- \
             /dev/null data"
        );
        assert_eq!(
            argv(
                "s /dev/null /dev/urandom plain,cipher=aes-xts-plain64,size=512,hash=sha512,\
                  offset=8,skip=2,sector-size=4096,readonly,same-cpu-crypt,no-read-workqueue,\
                  no-write-workqueue,submit-from-crypt-cpus\n"
            ),
            "ucrypt open --type plain --read-only --perf-same_cpu_crypt \
             --perf-submit_from_crypt_cpus --perf-no_read_workqueue --perf-no_write_workqueue \
             --cipher=aes-xts-plain64 --key-size=512 --hash=sha512 --offset=8 --skip=2 \
             --sector-size=4096 --key-file=/dev/urandom -- /dev/null s"
        );
        assert_eq!(
            argv(
                "k /dev/null '/etc/my key' keyfile-offset=4,keyfile-size=32,key-slot=2,\
                  tpm2-device=auto,headless\n"
            ),
            "ucrypt open --key-slot=2 --token-type=systemd-tpm2 --token-timeout=30 \
             '--key-file=/etc/my key' \
             --keyfile-offset=4 --keyfile-size=32 -- /dev/null k"
        );
        assert_eq!(
            argv("h /dev/null none headless,tries=0\n"),
            format!(
                "ucrypt open --tries={} --token-only -- /dev/null h",
                u32::MAX
            )
        );
        assert_eq!(
            argv(
                "t /dev/null none tcrypt,tcrypt-hidden,tcrypt-system,tcrypt-veracrypt,\
                  veracrypt-pim=3,tcrypt-keyfile=/k\n"
            ),
            "ucrypt open --type tcrypt --tcrypt-hidden --tcrypt-system --veracrypt \
             --veracrypt-pim=3 --tcrypt-keyfile=/k -- /dev/null t"
        );
        assert_eq!(
            argv("b /dev/null - luks,header=/dev/zero\n"),
            "ucrypt open --type luks --header=/dev/zero -- /dev/null b"
        );
    }

    #[test]
    fn the_open_command_accepts_every_line() {
        use clap::Parser;
        for line in [
            "a /dev/null none luks,discard,x-ucrypt-device=fuse,tries=5,timeout=30s,key-slot=1\n",
            "b /dev/null /k plain,cipher=aes-xts-plain64,size=512,hash=sha512,offset=8,skip=2,\
             sector-size=4096,readonly,same-cpu-crypt,no-read-workqueue,no-write-workqueue,\
             submit-from-crypt-cpus,keyfile-offset=1,keyfile-size=2\n",
            "c /dev/null none tcrypt,tcrypt-hidden,tcrypt-system,veracrypt-pim=3,\
             tcrypt-keyfile=/k\n",
            "d /dev/null none luks,header=/dev/zero,headless,pkcs11-uri=auto\n",
            "e /dev/null none luks,x-ucrypt-device=vhost-user\n",
        ] {
            let tab = Crypttab::parse(Path::new("/t"), line).unwrap();
            for notify in [false, true] {
                let (v, _) =
                    open_argv(&tab.entries[0], notify).unwrap_or_else(|e| panic!("{}", e.err));
                if let Err(e) = super::super::Cli::try_parse_from(&v) {
                    panic!("{line}: {e}");
                }
            }
        }
    }
}
