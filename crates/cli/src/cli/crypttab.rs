//! `ucrypt crypttab open|close|ls|generate`: the volumes a crypttab(5) file lists
//! (default `/etc/ucrypttab`). The file's meaning is the library's
//! ([`ucrypt::crypttab`]: every option honoured or refused by name); this command turns an
//! entry into the `ucrypt open` it stands for and runs it: one child `ucrypt open` per
//! entry (each goes to the background once its device is ready, as a typed `open` does),
//! or, with `--notify` (a systemd unit), the one entry's `open --notify` in this process,
//! which stays its server.

use super::exit::lib_error;
use super::{CliError, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use ucrypt::crypttab::{self, Crypttab, Entry};
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
x-systemd.device-timeout=, x-ucrypt-device=ublk|nbd|fuse|vhost-user|vduse|none. Any other option is \
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
        let cmd = entry.open_command(true).map_err(lib_error)?;
        if a.dry_run {
            println!("{}", cmd.shown());
            return Ok(());
        }
        // This process becomes the server: systemd's main process, as Type=notify wants.
        return super::run_open_args(
            cmd.argv
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect(),
            cmd.key,
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
        let result = e.open_command(false).map_err(lib_error).and_then(|cmd| {
            if a.dry_run {
                println!("{}", cmd.shown());
                return Ok(());
            }
            let status = std::process::Command::new(&exe)
                .args(&cmd.argv[1..])
                .status()
                .map_err(|err| anyhow::anyhow!("running {}: {err}", exe.display()))?;
            drop(cmd);
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

    /// The library's command lines ([`Entry::open_command`]) are ones `ucrypt open` takes.
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
                let cmd = tab.entries[0]
                    .open_command(notify)
                    .unwrap_or_else(|e| panic!("{e}"));
                if let Err(e) = super::super::Cli::try_parse_from(&cmd.argv) {
                    panic!("{line}: {e}");
                }
            }
        }
    }
}
