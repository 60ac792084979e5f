//! The headers and passphrases of cryptsetup's LUKS1 reencryption: the passphrases as its
//! `initialize_passphrase` asks for them (every keyslot's, or one), the `.new` header of a
//! re-key (`backup_luks_headers`), the `cipher_null` headers of an encryption's old side
//! and a decryption's new side (`backup_fake_header`), and each side's sector cipher.

use super::luks1_engine::{self as l1, Files, Side};
use super::options::Options;
use super::volume_key::{read_volume_key, servable_cipher};
use crate::error::{anyhow, Error, ErrorKind, Result};
use crate::prompt::{with_retries, Prompt};
use crate::secret::Secret;
use std::path::Path;
use ucrypt_crypto::{CipherSpec, SectorParams};
use ucrypt_cryptsetup::{CryptDevice, HeaderType, KeyslotStatus, LuksFormat, Pbkdf};

/// LUKS1's keyslot count.
pub(crate) const SLOTS: u32 = 8;

/// libcryptsetup's context on `header` (for `device`) with its LUKS1 header loaded.
pub(crate) fn load(header: &Path, device: &Path) -> Result<CryptDevice> {
    let mut cd = if header == device {
        CryptDevice::init(header)
    } else {
        CryptDevice::init_detached(header, device)
    }?;
    cd.load(Some(HeaderType::Luks1))?;
    Ok(cd)
}

/// The passphrases (slot, secret) as cryptsetup's `initialize_passphrase` asks for them:
/// a key file's one (with `--key-slot` or a single keyslot), one for `--key-slot`, a
/// resumed run or a decryption, else every active keyslot's.
pub(crate) fn passphrases(
    a: &Options,
    cd: &mut CryptDevice,
    in_progress: bool,
    prompt: &mut dyn Prompt,
) -> Result<Vec<(u32, Secret)>> {
    let from_file = prompt.uses_key_file();
    // cryptsetup's three tries, by the library's retry policy; as cryptsetup, the notice
    // also follows the last wrong one when it was typed.
    let mut ask = |cd: &mut CryptDevice, slot: Option<u32>, words: &str| {
        let r = with_retries(prompt, 3, true, |p| {
            let pass = p.passphrase(words)?;
            match cd.check_passphrase(slot, &pass) {
                Ok(s) => Ok((s, pass)),
                Err(_) => Err(anyhow!("No key available with this passphrase.")
                    .with_kind(ErrorKind::Permission)),
            }
        });
        if matches!(&r, Err(e) if e.kind() == ErrorKind::Permission) && prompt.interactive() {
            prompt.notice("No key available with this passphrase.");
        }
        r
    };
    if from_file {
        let (s, p) = ask(cd, a.key_slot, "")?;
        if a.key_slot.is_none() && !in_progress && cd.keyslot_status(s) != KeyslotStatus::ActiveLast
        {
            return Err(anyhow!(
                "Key file can be used only with --key-slot or with exactly one key slot active."
            ));
        }
        return Ok(vec![(s, p)]);
    }
    if in_progress || a.key_slot.is_some() || a.decrypt() {
        let words = match a.key_slot {
            Some(s) => format!("Enter passphrase for key slot {s}: "),
            None => "Enter any existing passphrase: ".into(),
        };
        return Ok(vec![ask(cd, a.key_slot, &words)?]);
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

/// A context on the new header file `path` with cryptsetup's `set_pbkdf_params(cd,
/// CRYPT_LUKS1)`: PBKDF2 unless asked otherwise, with `hash`.
fn new_header_context(a: &Options, path: &Path, hash: &str) -> Result<CryptDevice> {
    let mut cd = CryptDevice::init(path)?;
    cd.set_pbkdf(&Pbkdf {
        kind: a.pbkdf.kind.clone().unwrap_or_else(|| "pbkdf2".into()),
        hash: Some(hash.to_string()),
        iterations: a.pbkdf.iterations,
        time_ms: a.pbkdf.time_ms,
        memory_kb: a.pbkdf.memory_kb,
        parallel: a.pbkdf.parallel,
    })?;
    Ok(cd)
}

/// Writes the new header to `files.new` as cryptsetup's `backup_luks_headers` does: the
/// old UUID and data offset, the cipher (`--cipher`) and key size (`--key-size`) asked for
/// or the old ones, `--hash` or sha256, a new random volume key (`--keep-key`: the old
/// one), and every passphrase in its own keyslot number again.
pub(crate) fn new_header(
    a: &Options,
    old: &mut CryptDevice,
    device: &Path,
    files: &Files,
    pass: &[(u32, impl std::ops::Deref<Target = [u8]>)],
) -> Result<()> {
    let info = old.info();
    create_header_file(&files.new)?;
    let key_bytes = match (a.keep_key, a.key_size) {
        (false, Some(bits)) if bits % 8 == 0 && bits > 0 => bits as usize / 8,
        (false, Some(bits)) => {
            return Err(anyhow!(
                "key size {bits} is not a positive multiple of 8 bits"
            ))
        }
        _ => info.key_bytes,
    };
    // The new volume key: the old one (--keep-key), the first key-size bytes of
    // --volume-key-file (as cryptsetup's LUKS1 reencryption), or a random one.
    let key = if a.keep_key {
        Some(old.volume_key(Some(pass[0].0), &pass[0].1)?.1)
    } else {
        a.volume_key_file
            .as_deref()
            .map(|f| read_volume_key(f, key_bytes))
            .transpose()?
    };
    let cipher = servable_cipher(a.cipher.clone().unwrap_or_else(|| info.cipher_spec()))?;
    let hash = a.pbkdf.hash.clone().unwrap_or_else(|| "sha256".into());
    let mut cd = new_header_context(a, &files.new, &hash)?;
    cd.set_data_offset(info.data_offset)?;
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
    )?;
    for (slot, p) in pass {
        cd.add_keyslot_by_volume_key(Some(*slot), None, p)?;
    }
    Ok(())
}

/// Creates one of cryptsetup's 4096-byte header files (`.org`, `.new`): mode 0600, and only if
/// it does not exist yet (a leftover file means another run's state: never overwritten).
fn create_header_file(path: &Path) -> Result<()> {
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
pub(crate) fn encrypt_headers(
    a: &Options,
    device: &Path,
    files: &Files,
    slot: u32,
    passphrase: &[u8],
) -> Result<()> {
    for f in [&files.org, &files.new] {
        create_header_file(f)?;
    }
    let key_bytes = match a.key_size {
        Some(b) if b % 8 == 0 && b > 0 => b as usize / 8,
        Some(b) => return Err(anyhow!("key size {b} is not a positive multiple of 8 bits")),
        None => 32,
    };
    let hash = a.pbkdf.hash.clone().unwrap_or_else(|| "sha256".into());
    l1::write_null_header(
        &files.org,
        key_bytes,
        &hash,
        slot,
        a.pbkdf.iterations.unwrap_or(1000),
    )?;
    let cipher = servable_cipher(a.cipher.clone().unwrap_or_else(|| "aes-xts-plain64".into()))?;
    let key = a
        .volume_key_file
        .as_deref()
        .map(|f| read_volume_key(f, key_bytes))
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
    )?;
    cd.add_keyslot_by_volume_key(Some(slot), None, passphrase)?;
    Ok(())
}

/// The `.new` header of a decryption, as cryptsetup's `backup_fake_header`: LUKS1,
/// `cipher_null-ecb`, UUID [`l1::NO_UUID`], `--key-size` (256 bits by default), data offset
/// 0 (detached from the device), a keyslot in `slot`. The keyslot opens with the empty
/// passphrase only (libcryptsetup's rule for cipher_null, which cryptsetup's activation
/// of this header uses): its cost is moot.
pub(crate) fn fake_header(a: &Options, files: &Files, slot: u32) -> Result<()> {
    create_header_file(&files.new)?;
    l1::write_null_header(
        &files.new,
        a.key_size.map_or(32, |b| b as usize / 8),
        a.pbkdf.hash.as_deref().unwrap_or("sha256"),
        slot,
        a.pbkdf.iterations.unwrap_or(1000),
    )?;
    Ok(())
}

/// The sector cipher of `header` for `device`, unlocked with `passphrase`; and its data
/// offset in bytes.
pub(crate) fn side(
    header: &Path,
    device: &Path,
    slot: Option<u32>,
    passphrase: &[u8],
) -> Result<Side> {
    let mut cd = CryptDevice::init_detached(header, device)?;
    cd.load(Some(HeaderType::Luks1))?;
    let info = cd.info();
    let (_, key) = cd.volume_key(slot, passphrase)?;
    let spec: CipherSpec = info
        .cipher_spec()
        .parse()
        .map_err(|e| anyhow!("cipher {}: {e}", info.cipher_spec()))?;
    let cipher = spec
        .build(&key, SectorParams::default())
        .map_err(|e| anyhow!("cipher {}: {e}", info.cipher_spec()))?;
    Ok(Side {
        cipher: Some(std::sync::Arc::from(cipher)),
        base: info.data_offset * 512,
    })
}

/// A LUKS1 state file error as the library's: its message, then the cause.
impl From<l1::Error> for Error {
    fn from(e: l1::Error) -> Self {
        match e {
            l1::Error::LogFormat => anyhow!("{e}"),
            l1::Error::Io { what, source } => Error::Context {
                context: what,
                source: Box::new(Error::Io(source)),
            },
        }
    }
}
