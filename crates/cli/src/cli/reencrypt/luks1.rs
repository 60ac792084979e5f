//! `ucrypt reencrypt` of a LUKS1 volume: cryptsetup 2.6's legacy LUKS1 reencryption
//! (`utils_reencrypt_luks1.c`), with its state files in the current directory, its
//! unusable header mark and its log ([`ucrypt::reencrypt_luks1`]), so that either tool
//! resumes what the other started. The headers are libcryptsetup's (backup, a new LUKS1
//! header with the same UUID and the keyslots re-added, restore); the data pass is
//! ucrypt's (cryptsetup maps both headers with dm-crypt).
//!
//! Landed: re-key in place (new volume key, optionally `--cipher`, `--key-size`, `--hash`,
//! PBKDF options; `--keep-key` for the header only; `--key-slot`; `--block-size`,
//! `--use-directio`, `--use-fsync`, `--write-log`, `--device-size`, `--resume-only`), and
//! `--decrypt` (forward, the plaintext from the device's first byte; `--uuid` to resume once
//! the header is overwritten), and `--encrypt --type luks1` (with `--reduce-device-size`:
//! backward, the data moved up by the reduction; or with a new `--header` file: forward).
//! A re-key with `--reduce-device-size` is refused by name.

use super::super::luks::CsResult;
use super::super::progress;
use super::super::secret::{self, Secret};
use super::super::{CliError, WithCode, EXIT_PARAMS};
use super::Args;
use anyhow::anyhow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use ucrypt::reencrypt_luks1::{self as l1, Direction, Files, Log, Mode, Pass, Side};
use ucrypt_crypto::{CipherSpec, SectorParams};
use ucrypt_cryptsetup::{CryptDevice, HeaderType, KeyslotStatus, LuksFormat, Pbkdf};

/// LUKS1's keyslot count.
const SLOTS: u32 = 8;

/// Whether `hdr` is a LUKS1 header, usable or marked by a LUKS1 reencryption, or `--decrypt
/// --uuid U` names a LUKS1 decryption whose log is in the current directory (its header is
/// overwritten by plaintext once the first block is done).
pub(super) fn applies(hdr: &Path, a: &Args) -> bool {
    l1::is_luks1(hdr)
        || l1::unusable_uuid(hdr).is_some()
        || (a.decrypt
            && a.uuid.as_deref().is_some_and(|u| {
                std::env::current_dir().is_ok_and(|d| Files::new(&d, u).log.exists())
            }))
}

fn load(header: &Path, device: &Path) -> Result<CryptDevice, CliError> {
    let mut cd = if header == device {
        CryptDevice::init(header)
    } else {
        CryptDevice::init_detached(header, device)
    }
    .cs()?;
    cd.load(Some(HeaderType::Luks1)).cs()?;
    Ok(cd)
}

/// For `--decrypt` of a device that is no LUKS (any more) without `--uuid`: cryptsetup's
/// message, and the resume hint when a LUKS1 decryption log is in the current directory.
pub(super) fn decrypt_hint(a: &Args) -> Result<(), CliError> {
    if !a.decrypt || a.uuid.is_some() || crate::cli::reencrypt::is_luks(a.dev.header_path()) {
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
        (log.mode == Mode::Decrypt).then_some(u)
    }) else {
        return Ok(());
    };
    Err(anyhow!(
        "Device {} is not a valid LUKS device. A LUKS1 decryption is in progress in this \
         directory (LUKS-{log}.log): resume it with --decrypt --uuid {log}",
        a.dev.header_path().display()
    ))
    .code(EXIT_PARAMS)
}

/// The passphrases (slot, secret) as cryptsetup's `initialize_passphrase` asks for them.
fn passphrases(
    a: &Args,
    cd: &mut CryptDevice,
    in_progress: bool,
) -> Result<Vec<(u32, Secret)>, CliError> {
    let file = a
        .key
        .key_file
        .as_deref()
        .map(|p| (p, a.key.keyfile_offset, a.key.keyfile_size));
    let tries = if secret::prompts(&a.key) { 3 } else { 1 };
    let ask = |cd: &mut CryptDevice, slot: Option<u32>, prompt: &str| {
        for _ in 0..tries {
            let p = secret::get(file, prompt, false)?;
            if let Ok(s) = cd.check_passphrase(slot, &p) {
                return Ok((s, p));
            }
            if tries > 1 {
                eprintln!("No key available with this passphrase.");
            }
        }
        Err(anyhow!("No key available with this passphrase.")).code(2)
    };
    if file.is_some() {
        let (s, p) = ask(cd, a.key_slot, "")?;
        if a.key_slot.is_none() && !in_progress && cd.keyslot_status(s) != KeyslotStatus::ActiveLast
        {
            return Err(anyhow!(
                "Key file can be used only with --key-slot or with exactly one key slot active."
            ))
            .code(EXIT_PARAMS);
        }
        return Ok(vec![(s, p)]);
    }
    if in_progress || a.key_slot.is_some() || a.decrypt {
        let prompt = match a.key_slot {
            Some(s) => format!("Enter passphrase for key slot {s}: "),
            None => "Enter any existing passphrase: ".into(),
        };
        return Ok(vec![ask(cd, a.key_slot, &prompt)?]);
    }
    let mut out = Vec::new();
    for s in 0..SLOTS {
        if !matches!(
            cd.keyslot_status(s),
            KeyslotStatus::Active | KeyslotStatus::ActiveLast
        ) {
            continue;
        }
        out.push(ask(
            cd,
            Some(s),
            &format!("Enter passphrase for key slot {s}: "),
        )?);
    }
    Ok(out)
}

/// Writes the new header to `files.new` as cryptsetup's `backup_luks_headers` does: the
/// old UUID and data offset, the cipher (`--cipher`) and key size (`--key-size`) asked for
/// or the old ones, `--hash` or sha256, a new random volume key (`--keep-key`: the old
/// one), and every passphrase in its own keyslot number again.
/// `cipher` if ucrypt's data path can serve it (the pass is ucrypt's), else refused.
fn servable_cipher(cipher: String) -> Result<String, CliError> {
    cipher
        .parse::<CipherSpec>()
        .map_err(|e| anyhow!("--cipher {cipher}: {e}"))
        .code(EXIT_PARAMS)?;
    Ok(cipher)
}

/// A context on the new header file `path` with cryptsetup's `set_pbkdf_params(cd,
/// CRYPT_LUKS1)`: PBKDF2 unless asked otherwise, with `hash`.
fn new_header_context(a: &Args, path: &Path, hash: &str) -> Result<CryptDevice, CliError> {
    let mut cd = CryptDevice::init(path).cs()?;
    cd.set_pbkdf(&Pbkdf {
        kind: a.pbkdf.pbkdf.clone().unwrap_or_else(|| "pbkdf2".into()),
        hash: Some(hash.to_string()),
        iterations: a.pbkdf.pbkdf_force_iterations,
        time_ms: a.pbkdf.iter_time,
        memory_kb: a.pbkdf.pbkdf_memory,
        parallel: a.pbkdf.pbkdf_parallel,
    })
    .cs()?;
    Ok(cd)
}

fn new_header(
    a: &Args,
    old: &mut CryptDevice,
    device: &Path,
    files: &Files,
    pass: &[(u32, Secret)],
) -> Result<(), CliError> {
    let info = old.info();
    create_header_file(&files.new)?;
    let key_bytes = match (a.keep_key, a.key_size) {
        (false, Some(bits)) if bits % 8 == 0 && bits > 0 => bits as usize / 8,
        (false, Some(bits)) => {
            return Err(anyhow!(
                "key size {bits} is not a positive multiple of 8 bits"
            ))
            .code(EXIT_PARAMS)
        }
        _ => info.key_bytes,
    };
    // The new volume key: the old one (--keep-key), the first key-size bytes of
    // --volume-key-file (as cryptsetup's LUKS1 reencryption), or a random one.
    let key = if a.keep_key {
        Some(old.volume_key(Some(pass[0].0), &pass[0].1).cs()?.1)
    } else {
        a.volume_key_file
            .as_deref()
            .map(|f| super::read_volume_key(f, key_bytes))
            .transpose()?
    };
    let cipher = servable_cipher(a.cipher.clone().unwrap_or_else(|| info.cipher_spec()))?;
    let hash = a.pbkdf.hash.clone().unwrap_or_else(|| "sha256".into());
    let mut cd = new_header_context(a, &files.new, &hash)?;
    cd.set_data_offset(info.data_offset).cs()?;
    cd.format_luks(
        &LuksFormat {
            luks2: false,
            cipher,
            key_bytes,
            uuid: info.uuid.clone(),
            hash: Some(hash),
            sector_size: None,
            label: None,
            subsystem: None,
            data_device: Some(device.to_path_buf()),
            align_sectors: None,
        },
        key.as_ref(),
    )
    .cs()?;
    for (slot, p) in pass {
        cd.add_keyslot_by_volume_key(Some(*slot), None, p).cs()?;
    }
    Ok(())
}

/// Creates one of cryptsetup's 4096-byte header files (`.org`, `.new`): mode 0600, and only if
/// it does not exist yet (a leftover file means another run's state: never overwritten).
fn create_header_file(path: &Path) -> Result<(), CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow!("creating {}: {e}", path.display()))?;
    f.set_len(4096)
        .map_err(|e| anyhow!("sizing {}: {e}", path.display()))?;
    Ok(())
}

/// The headers of `--encrypt --type luks1`, as cryptsetup's `backup_fake_header` in
/// ENCRYPT mode: `.org` a `cipher_null` header (data offset 0) for the plaintext, `.new`
/// the LUKS1 header to be (`--cipher`, default aes-xts-plain64; `--key-size`, default
/// cryptsetup's LUKS1 256 bits; a random UUID and volume key; data offset
/// `--reduce-device-size`, 0 with `--header`), the passphrase in `--key-slot` (0).
fn encrypt_headers(
    a: &Args,
    device: &Path,
    files: &Files,
    pass: &[(u32, Secret)],
) -> Result<(), CliError> {
    for f in [&files.org, &files.new] {
        create_header_file(f)?;
    }
    let key_bytes = match a.key_size {
        Some(b) if b % 8 == 0 && b > 0 => b as usize / 8,
        Some(b) => {
            return Err(anyhow!("key size {b} is not a positive multiple of 8 bits"))
                .code(EXIT_PARAMS)
        }
        None => 32,
    };
    let hash = a.pbkdf.hash.clone().unwrap_or_else(|| "sha256".into());
    l1::write_null_header(
        &files.org,
        key_bytes,
        &hash,
        pass[0].0,
        a.pbkdf.pbkdf_force_iterations.unwrap_or(1000),
    )
    .code(EXIT_PARAMS)?;
    let cipher = servable_cipher(a.cipher.clone().unwrap_or_else(|| "aes-xts-plain64".into()))?;
    let key = a
        .volume_key_file
        .as_deref()
        .map(|f| super::read_volume_key(f, key_bytes))
        .transpose()?;
    let mut cd = new_header_context(a, &files.new, &hash)?;
    cd.format_luks(
        &LuksFormat {
            luks2: false,
            cipher,
            key_bytes,
            uuid: None,
            hash: Some(hash),
            sector_size: None,
            label: None,
            subsystem: None,
            data_device: Some(device.to_path_buf()),
            align_sectors: a.reduce_device_size.map(|r| r / 512),
        },
        key.as_ref(),
    )
    .cs()?;
    cd.add_keyslot_by_volume_key(Some(pass[0].0), None, &pass[0].1)
        .cs()?;
    Ok(())
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

/// The `.new` header of a decryption, as cryptsetup's `backup_fake_header`: LUKS1,
/// `cipher_null-ecb`, UUID [`l1::NO_UUID`], `--key-size` (256 bits by default), data offset
/// 0 (detached from the device), the passphrase in its keyslot.
fn fake_header(
    a: &Args,
    device: &Path,
    files: &Files,
    pass: &[(u32, Secret)],
) -> Result<(), CliError> {
    create_header_file(&files.new)?;
    // The keyslot opens with the empty passphrase only (libcryptsetup's rule for
    // cipher_null, which cryptsetup's activation of this header uses): its cost is moot.
    let _ = (device, &pass[0].1);
    l1::write_null_header(
        &files.new,
        a.key_size.map_or(32, |b| b as usize / 8),
        a.pbkdf.hash.as_deref().unwrap_or("sha256"),
        pass[0].0,
        a.pbkdf.pbkdf_force_iterations.unwrap_or(1000),
    )
    .code(EXIT_PARAMS)?;
    Ok(())
}

/// The sector cipher of `header` for `device`, unlocked with `passphrase`; and its data
/// offset in bytes.
fn side(
    header: &Path,
    device: &Path,
    slot: Option<u32>,
    passphrase: &[u8],
) -> Result<Side, CliError> {
    let mut cd = CryptDevice::init_detached(header, device).cs()?;
    cd.load(Some(HeaderType::Luks1)).cs()?;
    let info = cd.info();
    let (_, key) = cd.volume_key(slot, passphrase).cs()?;
    let spec: CipherSpec = info
        .cipher_spec()
        .parse()
        .map_err(|e| anyhow!("cipher {}: {e}", info.cipher_spec()))
        .code(EXIT_PARAMS)?;
    let cipher = spec
        .build(&key, SectorParams::default())
        .map_err(|e| anyhow!("cipher {}: {e}", info.cipher_spec()))
        .code(EXIT_PARAMS)?;
    Ok(Side {
        cipher: Some(cipher),
        base: info.data_offset * 512,
    })
}

fn device_size(f: &std::fs::File) -> std::io::Result<u64> {
    use std::io::Seek;
    let mut f = f;
    f.seek(std::io::SeekFrom::End(0))
}

/// Removes the state files (the run finished or never started); the log last, so that a
/// run stopped in between leaves a log that says what is left.
fn clean(files: &Files) {
    for p in [&files.journal, &files.org, &files.new, &files.log] {
        let _ = std::fs::remove_file(p);
    }
}

pub(super) fn run(a: &Args) -> Result<(), CliError> {
    let device = a.dev.local_device()?;
    let hdr: PathBuf = a.dev.header_path().to_path_buf();
    let stained = l1::unusable_uuid(&hdr);
    if a.kind.as_deref() == Some("luks2") {
        return Err(anyhow!(
            "Conflicting versions. Device {} is {}.",
            hdr.display(),
            if stained.is_some() {
                "in LUKS1 reencryption"
            } else {
                "LUKS1"
            }
        ))
        .code(EXIT_PARAMS);
    }
    if a.active_name.is_some() {
        return Err(anyhow!(
            "Option --active-name can be set only for LUKS2 device."
        ))
        .code(EXIT_PARAMS);
    }
    if a.encrypt && l1::is_luks1(&hdr) {
        // An encryption stopped in its clean-up (its header on the device, its files
        // left): finished if its .new header is this one.
        let cwd = std::env::current_dir().map_err(|e| anyhow!("current directory: {e}"))?;
        let files = Files::new(&cwd, l1::NO_UUID);
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
            eprintln!(
                "{} is LUKS1 and {} is the only file left of a finished LUKS1 encryption: \
                 removed.",
                hdr.display(),
                files.log.display()
            );
            clean(&files);
            return Ok(());
        }
        if files.log.exists()
            && files.new.exists()
            && uuid_of(&files.new).is_some_and(|u| Some(u) == uuid_of(&hdr))
        {
            // Its pass was done (the header is restored only then); the restore itself may
            // have been cut short: done again, then the files go.
            eprintln!(
                "The LUKS1 encryption of {} had finished; its header is written again and \
                 what is left of its files removed.",
                device.display()
            );
            let cd = CryptDevice::init(&hdr).cs()?;
            return restore_new_header(cd, &files, &hdr);
        }
    }
    if a.encrypt && (stained.is_some() || super::is_luks(&hdr) || super::is_luks(&device)) {
        return Err(anyhow!(
            "Device {} is already LUKS device. Aborting operation.",
            hdr.display()
        ))
        .code(EXIT_PARAMS);
    }
    if a.encrypt && a.reduce_device_size.is_none() && a.dev.header.is_none() {
        return Err(anyhow!(
            "Encryption without detached header (--header) is not possible without data \
             device size reduction (--reduce-device-size)."
        ))
        .code(EXIT_PARAMS);
    }
    if a.reduce_device_size.is_some() && !a.encrypt {
        return Err(anyhow!(
            "reencrypt --reduce-device-size of a LUKS1 volume (re-key with a data shift) is not \
             supported by ucrypt yet"
        ))
        .code(EXIT_PARAMS);
    }
    if a.key_slot.is_some_and(|s| s >= SLOTS) {
        return Err(anyhow!("Key slot is invalid.")).code(EXIT_PARAMS);
    }
    let block_mib: u64 = match a.block_size.as_deref() {
        None => u64::from(l1::DEFAULT_BLOCK_MIB),
        Some(s) => match s.parse::<u64>() {
            // cryptsetup 2.6 takes any number; 0 cannot work and a block is held in RAM.
            Ok(n) if (1..=1024).contains(&n) => n,
            _ => {
                return Err(anyhow!(
                    "--block-size {s}: the LUKS1 reencryption block size is 1 to 1024 (MiB)"
                ))
                .code(EXIT_PARAMS)
            }
        },
    };
    for (set, name) in [
        (a.resilience.is_some(), "--resilience"),
        (a.hotzone_size.is_some(), "--hotzone-size"),
        (a.sector_size.is_some(), "--sector-size"),
        (a.init_only, "--init-only"),
        (a.offset.is_some(), "--offset"),
    ] {
        if set {
            eprintln!("{name} does not apply to LUKS1 reencryption; ignored, as by cryptsetup.");
        }
    }
    let usable = l1::is_luks1(&hdr);
    let uuid = match (&stained, usable, &a.uuid) {
        _ if a.encrypt => l1::NO_UUID.to_string(),
        (Some(u), _, _) => u.clone(),
        (None, true, _) => {
            let mut cd = load(&hdr, &device)?;
            cd.info()
                .uuid
                .ok_or_else(|| anyhow!("{} has no UUID", hdr.display()))?
        }
        // A decryption past its first block: the header is gone, the UUID names the files.
        (None, false, Some(u)) if a.decrypt => {
            if !is_uuid(u) {
                return Err(anyhow!("Provided UUID is invalid.")).code(EXIT_PARAMS);
            }
            u.clone()
        }
        _ => {
            return Err(anyhow!(
                "Device {} is not a valid LUKS device.",
                hdr.display()
            ))
            .code(EXIT_PARAMS)
        }
    };
    let cwd = std::env::current_dir().map_err(|e| anyhow!("current directory: {e}"))?;
    let files = Files::new(&cwd, &uuid);
    let mut in_progress = files.log.exists();
    if in_progress && usable {
        // The header was never marked (a run stopped while writing the new header, before
        // any data moved) or is already the new one, restored (stopped before removing
        // its files): nothing to resume either way.
        eprintln!(
            "{} is a usable LUKS1 header: the reencryption files left in this directory by a \
             run that moved no data or had finished ({}) are removed.",
            hdr.display(),
            files.log.display()
        );
        clean(&files);
        in_progress = false;
    }
    if a.resume_only && !in_progress {
        return Err(anyhow!("Device reencryption not in progress.")).code(EXIT_PARAMS);
    }
    if stained.is_some() && !in_progress {
        return Err(anyhow!(
            "{} is in LUKS1 reencryption but {} is not in the current directory: run from \
             the directory the reencryption was started in",
            hdr.display(),
            files.log.display()
        ))
        .code(EXIT_PARAMS);
    }
    if a.uuid.is_some() && !in_progress {
        return Err(anyhow!(
            "No decryption in progress, provided UUID can be used only to resume suspended \
             decryption process."
        ))
        .code(EXIT_PARAMS);
    }
    if !in_progress && [&files.org, &files.new].iter().any(|p| p.exists()) {
        // No log: no pass is under way (a run stopped while removing its files at the end,
        // or before it had begun); cryptsetup would fail on them ("already exists").
        eprintln!(
            "Removing {} and {} left without a log by an earlier run.",
            files.org.display(),
            files.new.display()
        );
        clean(&files);
    }
    let _claimed = super::super::luks::claim_for_header_change(&a.dev)?;
    let log_file = {
        use std::os::unix::fs::OpenOptionsExt;
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(true).mode(0o600);
        if a.use_fsync {
            o.custom_flags(libc::O_SYNC);
        }
        if in_progress {
            println!(
                "Log file {} exists, resuming reencryption.",
                files.log.file_name().unwrap_or_default().to_string_lossy()
            );
            o.open(&files.log)
        } else {
            o.create_new(true).open(&files.log)
        }
        .map_err(|e| anyhow!("Cannot open reencryption log file ({e})."))?
    };
    let mut log = if in_progress {
        let mut buf = vec![0u8; l1::LOG_SIZE];
        let n = {
            use std::io::Read;
            (&log_file)
                .read(&mut buf)
                .map_err(|e| anyhow!("Cannot read reencryption log file ({e})."))?
        };
        Log::parse(&buf[..n], &uuid).code(EXIT_PARAMS)?
    } else {
        let backward = a.encrypt && a.reduce_device_size.is_some();
        let log = Log {
            uuid: uuid.clone(),
            direction: if backward {
                Direction::Backward
            } else {
                Direction::Forward
            },
            mode: if a.encrypt {
                Mode::Encrypt
            } else if a.decrypt {
                Mode::Decrypt
            } else {
                Mode::Reencrypt
            },
            // cryptsetup's start of a backward pass (~0): the end.
            offset: if backward { u64::MAX } else { 0 },
            shift: 0,
        };
        l1::write_log(&log_file, &log).code(EXIT_PARAMS)?;
        log
    };
    let decrypting = log.mode == Mode::Decrypt;
    if a.decrypt && !decrypting {
        return Err(anyhow!(
            "{} records a LUKS1 re-key, not a decryption: resume it without --decrypt",
            files.log.display()
        ))
        .code(EXIT_PARAMS);
    }
    let encrypting = log.mode == Mode::Encrypt;
    if encrypting != a.encrypt {
        return Err(anyhow!(
            "{} records a LUKS1 {}: resume it {} --encrypt --type luks1",
            files.log.display(),
            if encrypting {
                "encryption"
            } else {
                "re-key or decryption"
            },
            if encrypting { "with" } else { "without" }
        ))
        .code(EXIT_PARAMS);
    }
    if !encrypting && log.direction != Direction::Forward {
        return Err(anyhow!(
            "{} records a LUKS1 {} pass ({}); ucrypt resumes LUKS1 re-keys and decryptions \
             (forward) only",
            files.log.display(),
            match log.mode {
                Mode::Reencrypt => "re-key",
                Mode::Encrypt => "encryption",
                Mode::Decrypt => "decryption",
            },
            if log.direction == Direction::Forward {
                "forward"
            } else {
                "backward"
            }
        ))
        .code(EXIT_PARAMS);
    }
    // Before the header is marked, a failure leaves the volume as it was and no files.
    if in_progress && decrypting && !files.org.exists() {
        // The old header is removed only by the clean-up of a finished decryption (a run
        // stopped before it goes back to a usable header and starts afresh): this one was
        // stopped while removing its files.
        eprintln!(
            "The LUKS1 decryption of {} had finished; removing what is left of its files.",
            device.display()
        );
        drop(log_file);
        clean(&files);
        return Ok(());
    }
    let pass = if in_progress {
        let mut cd = load(if decrypting { &files.org } else { &files.new }, &device)?;
        passphrases(a, &mut cd, true)?
    } else if encrypting {
        let _ = std::fs::remove_file(&files.journal);
        let started = (|| {
            let p = secret::get(
                a.key
                    .key_file
                    .as_deref()
                    .map(|p| (p, a.key.keyfile_offset, a.key.keyfile_size)),
                "Enter new passphrase: ",
                true,
            )?;
            let pass = vec![(a.key_slot.unwrap_or(0), p)];
            encrypt_headers(a, &device, &files, &pass)?;
            Ok::<_, CliError>(pass)
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
            let pass = passphrases(a, &mut cd, false)?;
            cd.header_backup(&files.org).cs()?;
            if decrypting {
                fake_header(a, &device, &files, &pass)?;
            } else {
                new_header(a, &mut cd, &device, &files, &pass)?;
            }
            drop(cd);
            l1::set_unusable(&hdr, true).code(EXIT_PARAMS)?;
            Ok::<_, CliError>(pass)
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
    let (slot, passphrase) = (&pass[0].0, &pass[0].1);
    let stop = AtomicBool::new(false);
    if !a.keep_key || decrypting || encrypting {
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
            side(&files.new, &device, Some(*slot), passphrase)?
        };
        let old_base = old.base;
        drop(pass);
        let dev = {
            use std::os::unix::fs::OpenOptionsExt;
            let mut o = std::fs::OpenOptions::new();
            o.read(true).write(true);
            let direct = a.use_directio;
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            match o.open(&device) {
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    eprintln!(
                        "{} does not take direct I/O; reencrypting through the page cache \
                         (every block is synced anyway).",
                        device.display()
                    );
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&device)
                }
                other => other,
            }
            .map_err(|e| anyhow!("Cannot open device {} ({e}).", device.display()))
            .code(super::super::EXIT_DEVICE)?
        };
        let real = device_size(&dev).map_err(|e| anyhow!("Cannot get device size ({e})."))?;
        // cryptsetup: the new mapping's size; decrypting, the old one's (the shorter).
        let total = real.saturating_sub(if decrypting { old_base } else { new.base });
        let size = match a.device_size {
            Some(n) if n > total => {
                return Err(anyhow!(
                    "--device-size {n} is beyond the data area ({total} bytes)"
                ))
                .code(EXIT_PARAMS)
            }
            Some(n) => n,
            None => total,
        };
        let p = Pass {
            old,
            new,
            size,
            block: block_mib << 20,
            direction: log.direction,
            journal: files.journal.clone(),
        };
        if p.recover(&dev, &log).code(EXIT_PARAMS)? {
            eprintln!(
                "Put back the block at {} that an interrupted run was writing (from {}).",
                log.offset,
                files.journal.display()
            );
        }
        let stop_signal = progress::StopOnSignal::new();
        // Bytes done when this run starts (a backward log counts what is left).
        let first = match log.direction {
            Direction::Forward => log.offset.min(size),
            Direction::Backward => size - log.offset.min(size),
        };
        let name = device.display().to_string();
        let mut bar = progress::Bytes::new(&a.progress, "Reencrypting", &name, size);
        bar.resume_at(first);
        let start = Instant::now();
        let mut last = first;
        let outcome = p.run(&dev, &log_file, &mut log, &stop, &mut |done, _| {
            last = done;
            if stop_signal.stopped() || a.debug_stop_after.is_some_and(|n| done - first >= n) {
                stop.store(true, Ordering::Relaxed);
            }
            bar.set(done);
        });
        match &outcome {
            Ok(l1::Outcome::Finished) => bar.finish(),
            _ => bar.abandon(),
        }
        let outcome = outcome
            .map_err(|e| anyhow!("IO error during reencryption: {e}"))
            .code(EXIT_PARAMS)?;
        let secs = start.elapsed().as_secs_f64();
        if outcome == l1::Outcome::Interrupted {
            eprintln!(
                "{}",
                progress::summary_line("Interrupted", last - first, secs)
            );
            eprintln!(
                "Reencryption interrupted at {last} of {size} bytes; resume with `ucrypt \
                 reencrypt {}` (or cryptsetup's) from this directory.",
                device.display()
            );
            return Err(anyhow!("Reencryption interrupted.")).code(EXIT_PARAMS);
        }
        if decrypting {
            // cryptsetup wipes what lies beyond the plaintext (the old data area was
            // shorter than the device by its header), leaving no sign of encryption.
            l1::zero_range(&dev, real - old_base, real).code(EXIT_PARAMS)?;
        }
        if !(a.progress.progress_json || a.progress.progress_frequency.is_some()) {
            eprintln!("{}", progress::summary_line("Finished", last - first, secs));
        }
    }
    if decrypting {
        // No header to put back: the device is the plaintext.
        drop(log_file);
        clean(&files);
        return Ok(());
    }
    drop(log_file);
    if encrypting {
        if let Some(h) = a.dev.header.as_deref().filter(|h| !h.exists()) {
            // cryptsetup: a new detached header file is the .new file, moved.
            std::fs::rename(&files.new, h)
                .map_err(|e| anyhow!("Cannot restore LUKS1 header on device {}: {e}", h.display()))
                .code(EXIT_PARAMS)?;
            clean(&files);
            return Ok(());
        }
    }
    let cd = if hdr == device {
        CryptDevice::init(&hdr)
    } else {
        CryptDevice::init_detached(&hdr, &device)
    }
    .cs()?;
    restore_new_header(cd, &files, &hdr)
}

/// The new header (`.new`) onto `hdr` through `cd` (its magic is usable again), then the
/// state files go.
fn restore_new_header(mut cd: CryptDevice, files: &Files, hdr: &Path) -> Result<(), CliError> {
    cd.header_restore(&files.new)
        .map_err(|e| {
            anyhow!(
                "Cannot restore LUKS1 header on device {}: {e}",
                hdr.display()
            )
        })
        .code(EXIT_PARAMS)?;
    clean(files);
    Ok(())
}
