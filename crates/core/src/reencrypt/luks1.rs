//! A LUKS1 reencryption from start to end, as cryptsetup 2.6's legacy LUKS1 reencryption
//! (`utils_reencrypt_luks1.c`) runs it, with its state files in the current directory,
//! its unusable header mark and its log ([`super::luks1_engine`]), so that either tool
//! resumes what the other started. The headers are libcryptsetup's (backup, a new LUKS1
//! header with the same UUID and the keyslots re-added, restore); the data pass is
//! ucrypt's (cryptsetup maps both headers with dm-crypt).
//!
//! Re-key in place (new volume key, optionally `--cipher`, `--key-size`, `--hash`, PBKDF
//! options; `--keep-key` for the header only; `--key-slot`; `--block-size`,
//! `--use-directio`, `--use-fsync`, `--write-log`, `--device-size`, `--resume-only`),
//! `--decrypt` (forward, the plaintext from the device's first byte; `--uuid` to resume
//! once the header is overwritten), and `--encrypt --type luks1` (with
//! `--reduce-device-size`: backward, the data moved up by the reduction; or with a new
//! `--header` file: forward). A re-key with `--reduce-device-size` is refused by name.

use super::checks::remote_refused;
use super::claim;
use super::interact::{Notice, PassKind, Progress, Summary};
use super::luks1_engine::{self as l1, Direction, Files, Log, Mode as LogMode, Pass, Side};
use super::luks1_headers::{
    encrypt_headers, fake_header, load, new_header, passphrases, side, SLOTS,
};
use super::options::{HeaderKind, Options};
use super::probe::is_luks;
use crate::error::{anyhow, ErrorKind, Result};
use crate::prompt::Prompt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use ucrypt_backend::{Backend, FileBackend, FileOptions};
use ucrypt_cryptsetup::{CryptDevice, HeaderType};

/// Whether the header is a LUKS1 header, usable or marked by a LUKS1 reencryption, or
/// `--decrypt --uuid U` names a LUKS1 decryption whose log is in the current directory
/// (its header is overwritten by plaintext once the first block is done).
pub(crate) fn applies(a: &Options) -> bool {
    let hdr = a.header_path();
    l1::is_luks1(hdr)
        || l1::unusable_uuid(hdr).is_some()
        || (a.decrypt()
            && a.uuid.as_deref().is_some_and(|u| {
                std::env::current_dir().is_ok_and(|d| Files::new(&d, u).log.exists())
            }))
}

/// For `--decrypt` of a device that is no LUKS (any more) without `--uuid`: cryptsetup's
/// message, and the resume hint when a LUKS1 decryption log is in the current directory.
///
/// # Errors
/// That refusal.
pub(crate) fn decrypt_hint(a: &Options) -> Result<()> {
    if !a.decrypt() || a.uuid.is_some() || is_luks(a.header_path()) {
        return Ok(());
    }
    let Ok(dir) = std::env::current_dir() else {
        return Ok(());
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    let Some(log) = entries.flatten().find_map(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        let u = n.strip_prefix("LUKS-")?.strip_suffix(".log")?.to_string();
        let text = std::fs::read(e.path()).ok()?;
        let log = Log::parse(&text, &u).ok()?;
        (log.mode == LogMode::Decrypt).then_some(u)
    }) else {
        return Ok(());
    };
    Err(anyhow!(
        "Device {} is not a valid LUKS device. A LUKS1 decryption is in progress in this \
         directory (LUKS-{log}.log): resume it with --decrypt --uuid {log}",
        a.header_path().display()
    ))
}

/// Whether `u` is a UUID in its text form.
fn is_uuid(u: &str) -> bool {
    let b = u.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                *c == b'-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// Removes the state files (the run finished or never started); the log last, so that a
/// run stopped in between leaves a log that says what is left.
fn clean(files: &Files) {
    for p in [&files.journal, &files.org, &files.new, &files.log] {
        let _ = std::fs::remove_file(p);
    }
}

fn current_dir() -> Result<std::path::PathBuf> {
    std::env::current_dir().map_err(|e| anyhow!("current directory: {e}"))
}

/// An encryption stopped in its clean-up (its header on the device, its files left):
/// finished if its `.new` header is this one. `Some(result)` if that was the case.
fn finish_stopped_encryption(
    hdr: &Path,
    device: &Path,
    progress: &mut dyn Progress,
) -> Result<Option<()>> {
    let files = Files::new(&current_dir()?, l1::NO_UUID);
    let uuid_of = |p: &Path| {
        CryptDevice::init(p)
            .ok()
            .and_then(|mut cd| {
                cd.load(Some(HeaderType::Luks1))
                    .ok()
                    .map(|()| cd.info().uuid)
            })
            .flatten()
    };
    if files.log.exists() && !files.new.exists() && !files.org.exists() {
        // Only the log: .org and .new go in the clean-up of a finished run alone (a run
        // that failed before moving data left no header on a device).
        progress.notice(Notice::warning(format!(
            "{} is LUKS1 and {} is the only file left of a finished LUKS1 encryption: \
             removed.",
            hdr.display(),
            files.log.display()
        )));
        clean(&files);
        return Ok(Some(()));
    }
    if files.log.exists()
        && files.new.exists()
        && uuid_of(&files.new).is_some_and(|u| Some(u) == uuid_of(hdr))
    {
        // Its pass was done (the header is restored only then); the restore itself may
        // have been cut short: done again, then the files go.
        progress.notice(Notice::warning(format!(
            "The LUKS1 encryption of {} had finished; its header is written again and \
             what is left of its files removed.",
            device.display()
        )));
        let cd = CryptDevice::init(hdr)?;
        restore_new_header(cd, &files, hdr)?;
        return Ok(Some(()));
    }
    Ok(None)
}

/// `--block-size` in MiB (cryptsetup's default 4).
fn block_mib(a: &Options) -> Result<u64> {
    match a.luks1.block_size.as_deref() {
        None => Ok(u64::from(l1::DEFAULT_BLOCK_MIB)),
        Some(s) => match s.parse::<u64>() {
            // cryptsetup 2.6 takes any number; 0 cannot work and a block is held in RAM.
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => Err(anyhow!(
                "--block-size {s}: the LUKS1 reencryption block size is 1 to 1024 (MiB)"
            )),
        },
    }
}

/// The refusals before any state is looked at.
fn refusals(a: &Options, hdr: &Path, stained: bool) -> Result<()> {
    if a.kind_is(&HeaderKind::Luks2) {
        return Err(anyhow!(
            "Conflicting versions. Device {} is {}.",
            hdr.display(),
            if stained {
                "in LUKS1 reencryption"
            } else {
                "LUKS1"
            }
        ));
    }
    if a.active_name.is_some() {
        return Err(anyhow!(
            "Option --active-name can be set only for LUKS2 device."
        ));
    }
    Ok(())
}

/// Runs the LUKS1 reencryption `a` describes.
///
/// # Errors
/// A refusal, a wrong passphrase, the prompt's, libcryptsetup's, I/O; a stopped pass is
/// the error "Reencryption interrupted.".
pub(crate) fn run(a: &Options, prompt: &mut dyn Prompt, progress: &mut dyn Progress) -> Result<()> {
    if crate::remote_header::is_remote(&a.device) {
        return Err(remote_refused());
    }
    let device = a.device.clone();
    let hdr = a.header_path().to_path_buf();
    let stained = l1::unusable_uuid(&hdr);
    refusals(a, &hdr, stained.is_some())?;
    if a.encrypt() && l1::is_luks1(&hdr) {
        if let Some(()) = finish_stopped_encryption(&hdr, &device, progress)? {
            return Ok(());
        }
    }
    if a.encrypt() && (stained.is_some() || is_luks(&hdr) || is_luks(&device)) {
        return Err(anyhow!(
            "Device {} is already LUKS device. Aborting operation.",
            hdr.display()
        ));
    }
    if a.encrypt() && a.reduce_device_size.is_none() && a.header.is_none() {
        return Err(anyhow!(
            "Encryption without detached header (--header) is not possible without data \
             device size reduction (--reduce-device-size)."
        ));
    }
    if a.reduce_device_size.is_some() && !a.encrypt() {
        return Err(anyhow!(
            "reencrypt --reduce-device-size of a LUKS1 volume (re-key with a data shift) is not \
             supported by ucrypt yet"
        ));
    }
    if a.key_slot.is_some_and(|s| s >= SLOTS) {
        return Err(anyhow!("Key slot is invalid."));
    }
    let block_mib = block_mib(a)?;
    for (set, name) in [
        (a.resilience.is_some(), "--resilience"),
        (a.hotzone_size.is_some(), "--hotzone-size"),
        (a.sector_size.is_some(), "--sector-size"),
        (a.init_only(), "--init-only"),
        (a.offset.is_some(), "--offset"),
    ] {
        if set {
            progress.notice(Notice::warning(format!(
                "{name} does not apply to LUKS1 reencryption; ignored, as by cryptsetup."
            )));
        }
    }
    let usable = l1::is_luks1(&hdr);
    let uuid = match (&stained, usable, &a.uuid) {
        _ if a.encrypt() => l1::NO_UUID.to_string(),
        (Some(u), _, _) => u.clone(),
        (None, true, _) => {
            let mut cd = load(&hdr, &device)?;
            cd.info()
                .uuid
                .ok_or_else(|| anyhow!("{} has no UUID", hdr.display()))?
        }
        // A decryption past its first block: the header is gone, the UUID names the files.
        (None, false, Some(u)) if a.decrypt() => {
            if !is_uuid(u) {
                return Err(anyhow!("Provided UUID is invalid."));
            }
            u.clone()
        }
        _ => {
            return Err(anyhow!(
                "Device {} is not a valid LUKS device.",
                hdr.display()
            ))
        }
    };
    let files = Files::new(&current_dir()?, &uuid);
    let mut in_progress = files.log.exists();
    if in_progress && usable {
        // The header was never marked (a run stopped while writing the new header, before
        // any data moved) or is already the new one, restored (stopped before removing
        // its files): nothing to resume either way.
        progress.notice(Notice::warning(format!(
            "{} is a usable LUKS1 header: the reencryption files left in this directory by a \
             run that moved no data or had finished ({}) are removed.",
            hdr.display(),
            files.log.display()
        )));
        clean(&files);
        in_progress = false;
    }
    if a.resume_only() && !in_progress {
        return Err(anyhow!("Device reencryption not in progress."));
    }
    if stained.is_some() && !in_progress {
        return Err(anyhow!(
            "{} is in LUKS1 reencryption but {} is not in the current directory: run from \
             the directory the reencryption was started in",
            hdr.display(),
            files.log.display()
        ));
    }
    if a.uuid.is_some() && !in_progress {
        return Err(anyhow!(
            "No decryption in progress, provided UUID can be used only to resume suspended \
             decryption process."
        ));
    }
    if !in_progress && [&files.org, &files.new].iter().any(|p| p.exists()) {
        // No log: no pass is under way (a run stopped while removing its files at the end,
        // or before it had begun); cryptsetup would fail on them ("already exists").
        progress.notice(Notice::warning(format!(
            "Removing {} and {} left without a log by an earlier run.",
            files.org.display(),
            files.new.display()
        )));
        clean(&files);
    }
    let _claimed = claim(a)?;
    let log_file = open_log(a, &files, in_progress, progress)?;
    let mut log = if in_progress {
        let mut buf = vec![0u8; l1::LOG_SIZE];
        let n = {
            use std::io::Read;
            (&log_file)
                .read(&mut buf)
                .map_err(|e| anyhow!("Cannot read reencryption log file ({e})."))?
        };
        Log::parse(&buf[..n], &uuid)?
    } else {
        let backward = a.encrypt() && a.reduce_device_size.is_some();
        let log = Log {
            uuid: uuid.clone(),
            direction: if backward {
                Direction::Backward
            } else {
                Direction::Forward
            },
            mode: if a.encrypt() {
                LogMode::Encrypt
            } else if a.decrypt() {
                LogMode::Decrypt
            } else {
                LogMode::Reencrypt
            },
            // cryptsetup's start of a backward pass (~0): the end.
            offset: if backward { u64::MAX } else { 0 },
            shift: 0,
        };
        l1::write_log(&log_file, &log)?;
        log
    };
    check_log(a, &files, &log)?;
    let decrypting = log.mode == LogMode::Decrypt;
    let encrypting = log.mode == LogMode::Encrypt;
    // Before the header is marked, a failure leaves the volume as it was and no files.
    if in_progress && decrypting && !files.org.exists() {
        // The old header is removed only by the clean-up of a finished decryption (a run
        // stopped before it goes back to a usable header and starts afresh): this one was
        // stopped while removing its files.
        progress.notice(Notice::warning(format!(
            "The LUKS1 decryption of {} had finished; removing what is left of its files.",
            device.display()
        )));
        drop(log_file);
        clean(&files);
        return Ok(());
    }
    let pass = if in_progress {
        let mut cd = load(if decrypting { &files.org } else { &files.new }, &device)?;
        passphrases(a, &mut cd, true, prompt)?
    } else if encrypting {
        let _ = std::fs::remove_file(&files.journal);
        let started = (|| {
            let p = prompt.new_passphrase("Enter new passphrase: ")?;
            let slot = a.key_slot.unwrap_or(0);
            encrypt_headers(a, &device, &files, slot, &p)?;
            Ok::<_, crate::Error>(vec![(slot, p)])
        })();
        match started {
            Ok(p) => p,
            Err(e) => {
                drop(log_file);
                clean(&files);
                return Err(e);
            }
        }
    } else {
        // A journal left by an earlier reencryption of this UUID finished by cryptsetup
        // is stale.
        let _ = std::fs::remove_file(&files.journal);
        let started = (|| {
            let mut cd = load(&hdr, &device)?;
            let pass = passphrases(a, &mut cd, false, prompt)?;
            cd.header_backup(&files.org)?;
            if decrypting {
                fake_header(a, &files, pass[0].0)?;
            } else {
                new_header(a, &mut cd, &device, &files, &pass)?;
            }
            drop(cd);
            l1::set_unusable(&hdr, true)?;
            Ok::<_, crate::Error>(pass)
        })();
        match started {
            Ok(p) => p,
            Err(e) => {
                drop(log_file);
                clean(&files);
                return Err(e);
            }
        }
    };
    if !a.keep_key || decrypting || encrypting {
        let (slot, passphrase) = (pass[0].0, &pass[0].1);
        let old = if encrypting {
            // cryptsetup's old side: a cipher_null header with data offset 0.
            Side {
                cipher: None,
                base: 0,
            }
        } else {
            side(&files.org, &device, None, passphrase)?
        };
        let new = if decrypting {
            // cryptsetup's new side: a cipher_null header with data offset 0.
            Side {
                cipher: None,
                base: 0,
            }
        } else {
            side(&files.new, &device, Some(slot), passphrase)?
        };
        drop(pass);
        let p = DataPass {
            device: &device,
            old,
            new,
            block: block_mib << 20,
            files: &files,
        };
        p.run(a, &log_file, &mut log, progress)?;
    }
    drop(log_file);
    if decrypting {
        // No header to put back: the device is the plaintext.
        clean(&files);
        return Ok(());
    }
    if encrypting {
        if let Some(h) = a.header.as_deref().filter(|h| !h.exists()) {
            // cryptsetup: a new detached header file is the .new file, moved.
            std::fs::rename(&files.new, h).map_err(|e| {
                anyhow!("Cannot restore LUKS1 header on device {}: {e}", h.display())
            })?;
            clean(&files);
            return Ok(());
        }
    }
    let cd = if hdr == device {
        CryptDevice::init(&hdr)
    } else {
        CryptDevice::init_detached(&hdr, &device)
    }?;
    restore_new_header(cd, &files, &hdr)
}

/// The log file: opened to resume, or created (`O_SYNC` with `--use-fsync`).
fn open_log(
    a: &Options,
    files: &Files,
    in_progress: bool,
    progress: &mut dyn Progress,
) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true).mode(0o600);
    if a.luks1.fsync {
        o.custom_flags(libc::O_SYNC);
    }
    if in_progress {
        progress.notice(Notice::info(format!(
            "Log file {} exists, resuming reencryption.",
            files.log.file_name().unwrap_or_default().to_string_lossy()
        )));
        o.open(&files.log)
    } else {
        o.create_new(true).open(&files.log)
    }
    .map_err(|e| anyhow!("Cannot open reencryption log file ({e})."))
}

/// Refuses a log that records another operation than the one asked for, or a pass
/// ucrypt does not resume.
fn check_log(a: &Options, files: &Files, log: &Log) -> Result<()> {
    let decrypting = log.mode == LogMode::Decrypt;
    if a.decrypt() && !decrypting {
        return Err(anyhow!(
            "{} records a LUKS1 re-key, not a decryption: resume it without --decrypt",
            files.log.display()
        ));
    }
    let encrypting = log.mode == LogMode::Encrypt;
    if encrypting != a.encrypt() {
        return Err(anyhow!(
            "{} records a LUKS1 {}: resume it {} --encrypt --type luks1",
            files.log.display(),
            if encrypting {
                "encryption"
            } else {
                "re-key or decryption"
            },
            if encrypting { "with" } else { "without" }
        ));
    }
    if !encrypting && log.direction != Direction::Forward {
        return Err(anyhow!(
            "{} records a LUKS1 {} pass ({}); ucrypt resumes LUKS1 re-keys and decryptions \
             (forward) only",
            files.log.display(),
            match log.mode {
                LogMode::Reencrypt => "re-key",
                LogMode::Encrypt => "encryption",
                LogMode::Decrypt => "decryption",
            },
            if log.direction == Direction::Forward {
                "forward"
            } else {
                "backward"
            }
        ));
    }
    Ok(())
}

/// The data pass of a LUKS1 reencryption and what it needs.
struct DataPass<'a> {
    device: &'a Path,
    old: Side,
    new: Side,
    block: u64,
    files: &'a Files,
}

impl DataPass<'_> {
    /// Opens the device, recovers a block an interrupted run was writing, and runs the
    /// pass from where the log says; a decryption's tail beyond the plaintext is zeroed.
    fn run(
        self,
        a: &Options,
        log_file: &std::fs::File,
        log: &mut Log,
        progress: &mut dyn Progress,
    ) -> Result<()> {
        let device = self.device;
        let decrypting = log.mode == LogMode::Decrypt;
        let old_base = self.old.base;
        let dev = open_device(device, a.luks1.direct_io, progress)?;
        let real = dev.info().size_bytes;
        // cryptsetup: the new mapping's size; decrypting, the old one's (the shorter).
        let total = real.saturating_sub(if decrypting { old_base } else { self.new.base });
        let size = match a.device_size {
            Some(n) if n > total => {
                return Err(anyhow!(
                    "--device-size {n} is beyond the data area ({total} bytes)"
                ))
            }
            Some(n) => n,
            None => total,
        };
        let p = Pass {
            old: self.old,
            new: self.new,
            size,
            block: self.block,
            direction: log.direction,
            journal: self.files.journal.clone(),
        };
        if p.recover(&*dev, log)? {
            progress.notice(Notice::warning(format!(
                "Put back the block at {} that an interrupted run was writing (from {}).",
                log.offset,
                self.files.journal.display()
            )));
        }
        progress.watch();
        // Bytes done when this run starts (a backward log counts what is left).
        let first = match log.direction {
            Direction::Forward => log.offset.min(size),
            Direction::Backward => size - log.offset.min(size),
        };
        let name = device.display().to_string();
        progress.begin(&name, size, Some(first));
        let stop = AtomicBool::new(false);
        let mut last = first;
        let outcome = p.run(&dev, log_file, log, &stop, &mut |done, _| {
            last = done;
            if progress.stop_requested() || a.stop_after.is_some_and(|n| done - first >= n) {
                stop.store(true, Ordering::Relaxed);
            }
            progress.advance(done);
        });
        progress.end(matches!(outcome, Ok(l1::Outcome::Finished)));
        let outcome = outcome.map_err(|e| anyhow!("IO error during reencryption: {e}"))?;
        let mut summary = Summary {
            kind: PassKind::Luks1,
            finished: false,
            bytes: last - first,
            at: last,
            size,
            device: name,
        };
        if outcome == l1::Outcome::Interrupted {
            progress.summary(&summary);
            return Err(anyhow!("Reencryption interrupted."));
        }
        if decrypting {
            // cryptsetup wipes what lies beyond the plaintext (the old data area was
            // shorter than the device by its header), leaving no sign of encryption.
            l1::zero_range(&*dev, real - old_base, real)?;
        }
        summary.finished = true;
        progress.summary(&summary);
        Ok(())
    }
}

/// The device as a [`Backend`], read-write (`O_DIRECT` with `--use-directio` where it
/// takes it; the backend aligns the blocks' buffers for it).
fn open_device(
    device: &Path,
    direct: bool,
    progress: &mut dyn Progress,
) -> Result<Arc<dyn Backend>> {
    let open = |direct| {
        FileBackend::open(
            device,
            FileOptions {
                direct,
                ..FileOptions::default()
            },
        )
    };
    match open(direct) {
        Err(e) if direct && e.errno() == libc::EINVAL => {
            progress.notice(Notice::warning(format!(
                "{} does not take direct I/O; reencrypting through the page cache \
                 (every block is synced anyway).",
                device.display()
            )));
            open(false)
        }
        other => other,
    }
    .map(|mut b| {
        // Each block is read once: `pread`, no mapping.
        b.use_mmap(false);
        Arc::new(b) as Arc<dyn Backend>
    })
    .map_err(|e| {
        anyhow!("Cannot open device {} ({e}).", device.display()).with_kind(ErrorKind::Device)
    })
}

/// The new header (`.new`) onto `hdr` through `cd` (its magic is usable again), then the
/// state files go.
fn restore_new_header(mut cd: CryptDevice, files: &Files, hdr: &Path) -> Result<()> {
    cd.header_restore(&files.new).map_err(|e| {
        anyhow!(
            "Cannot restore LUKS1 header on device {}: {e}",
            hdr.display()
        )
    })?;
    clean(files);
    Ok(())
}
