//! What a crypttab entry asks of `ucrypt open`: the command line it stands for
//! ([`Entry::open_command`]), with the key a `FILE:DEVICE` key field names read into a
//! memory file the command reads as `/dev/fd/N` (key material is never on the line: key
//! files are paths).

use super::{DeviceSpec, Entry, Key};
use crate::{Error, ErrorKind, Result};
use std::ffi::OsString;
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The `ucrypt open` an entry stands for.
pub struct OpenCommand {
    /// The arguments, from `ucrypt` on.
    pub argv: Vec<OsString>,
    /// The in-memory key `argv` refers to (`--key-file=/dev/fd/N`, inherited by a child
    /// process); it must live until that open has read it, and is closed when dropped.
    pub key: Option<OwnedFd>,
}

impl OpenCommand {
    /// The command line as a shell would take it back (each argument quoted when it holds
    /// white space or a quote, or is empty).
    pub fn shown(&self) -> String {
        self.argv
            .iter()
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
}

impl Entry {
    /// The `ucrypt open` this entry stands for (`notify`: as the server of a Type=notify
    /// unit, `--notify`). Resolves the device (and header) tags now, and reads a
    /// `FILE:DEVICE` key off its device, mounted read-only for as long as that takes.
    ///
    /// # Errors
    /// A device, header or key device that cannot be found or mounted (device errors), or
    /// the key file's error.
    pub fn open_command(&self, notify: bool) -> Result<OpenCommand> {
        let o = &self.options;
        let device = self.device.resolve()?;
        let mut v: Vec<OsString> = vec!["ucrypt".into(), "open".into()];
        let mut arg = |s: &str| v.push(s.into());
        if let Some(k) = o.kind {
            arg("--type");
            arg(super::options::type_name(k));
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
            ("--ublk-poll", o.ublk_poll.map(|us| us.to_string())),
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
            let mut s = OsString::from("--header=");
            s.push(h.resolve()?);
            v.push(s);
        }
        let mut key = None;
        let key_path: Option<PathBuf> = match &self.key {
            Key::None => None,
            Key::File(p) => Some(p.clone()),
            Key::FileOnDevice { file, device } => {
                let m = key_from_device(file, device)?;
                let path = PathBuf::from(format!("/dev/fd/{}", m.as_raw_fd()));
                key = Some(m);
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
        v.push(self.name.clone().into());
        Ok(OpenCommand { argv: v, key })
    }
}

/// Reads `file` from the file system on `device`, mounted read-only at a private
/// directory for as long as that takes, into a memory file (no close-on-exec: a child
/// `ucrypt open` inherits it).
fn key_from_device(file: &Path, device: &DeviceSpec) -> Result<OwnedFd> {
    let dev = device.resolve()?;
    let dir = tempfile::Builder::new()
        .prefix("ucrypt-keydev-")
        .tempdir()
        .map_err(|e| Error::Invalid(format!("creating a mount point for the key device: {e}")))?;
    let mounted = std::process::Command::new("mount")
        .args(["-o", "ro,nosuid,nodev,noexec"])
        .arg(&dev)
        .arg(dir.path())
        .status()
        .map_err(|e| Error::Invalid(format!("running mount: {e}")))?;
    if !mounted.success() {
        return Err(Error::Invalid(format!(
            "cannot mount the key device {} ({device}) read-only",
            dev.display()
        ))
        .with_kind(ErrorKind::Device));
    }
    let rel = file.strip_prefix("/").unwrap_or(file);
    let key = crate::unlock::read_key_file(&dir.path().join(rel), 0, 0);
    let _ = std::process::Command::new("umount")
        .arg(dir.path())
        .status();
    let key = key?;
    // SAFETY: memfd_create takes a NUL-terminated name and flags; no CLOEXEC, so the
    // `ucrypt open` child inherits it.
    let fd = unsafe { libc::memfd_create(c"ucrypt-key".as_ptr(), 0) };
    if fd < 0 {
        return Err(Error::Invalid(format!(
            "memfd_create: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: a descriptor we just created and own.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.write_all(&key)
        .map_err(|e| Error::Invalid(format!("writing the key to a memory file: {e}")))?;
    Ok(f.into())
}

#[cfg(test)]
mod tests {
    use super::super::Crypttab;
    use std::path::Path;

    fn argv(line: &str) -> String {
        let tab = Crypttab::parse(Path::new("/t"), line).unwrap();
        tab.entries[0].open_command(false).unwrap().shown()
    }

    #[test]
    fn entries_become_open_command_lines() {
        assert_eq!(
            argv("data /dev/null none luks,discard,x-ucrypt-device=ublk,tries=5,timeout=30s\n"),
            "ucrypt open --type luks --timeout=30 --tries=5 --allow-discards --device=ublk -- \
             /dev/null data"
        );
        assert_eq!(
            argv("fast /dev/null none luks,x-ucrypt-device=ublk,x-ucrypt-ublk-poll=200\n"),
            "ucrypt open --type luks --device=ublk --ublk-poll=200 -- /dev/null fast"
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
        assert_eq!(
            Crypttab::parse(Path::new("/t"), "n /dev/null none luks\n")
                .unwrap()
                .entries[0]
                .open_command(true)
                .unwrap()
                .shown(),
            "ucrypt open --type luks --notify -- /dev/null n"
        );
    }

    #[test]
    fn a_device_no_one_carries_is_a_device_error() {
        let tab = Crypttab::parse(
            Path::new("/t"),
            "x UUID=00000000-dead-beef-0000-ucrypt-nowhere none luks\n",
        )
        .unwrap();
        let e = tab.entries[0].open_command(false).err().unwrap();
        assert_eq!(e.kind(), crate::ErrorKind::Device);
        assert!(e.to_string().contains("no device with UUID="), "{e}");
    }
}
