//! Opening a volume from its on-disk header (LUKS1, LUKS2) or by cryptsetup's plain-mode
//! rules, instead of from a table line.
//!
//! ```text
//!  device + secret ──► ucrypt_cryptsetup (libcryptsetup: header, keyslot, volume key)
//!                             │ format::VolumeInfo: cipher, data offset, sector size,
//!                             │ IV offset, persistent flags; requirements checked here
//!                             ▼
//!                      format::luks (checks, then the Mapping cryptsetup would load)
//!                             │ mapping::open_mapping
//!                             ▼
//!                      engine::Volume
//! ```
//!
//! This module does the I/O, the libcryptsetup calls and the key derivation and passes
//! values to the format layer, which builds the mapping ([`ucrypt_format::luks`] for LUKS,
//! each format's own module for the others). The same mapping is what `--print-table`
//! prints, so a header-opened volume can be shown (key hidden) and compared with `dmsetup
//! table` output of the kernel mapping.

use crate::error::{bail, Context, Result};
use crate::mapping::open_mapping;
use crate::open::{open_parsed, OpenOptions, OpenedTable};
use std::io::{Seek, SeekFrom};
use std::path::Path;
use ucrypt_crypto::VolumeKey;
use ucrypt_cryptsetup::{self as cs, CryptDevice, HeaderType, VolumeInfo};
use ucrypt_format::luks2::{self, Metadata};
use ucrypt_format::plain::PlainOptions;
use ucrypt_format::{luks, DeviceRef, FormatError};

pub use crate::unlocked::{HeaderOptions, Unlocked, VolumeType};

/// Size of a file or block device in bytes.
fn device_bytes(path: &Path) -> Result<u64> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| FormatError::DeviceUnavailable {
            device: path.display().to_string(),
            errno: e.raw_os_error().unwrap_or(libc::ENODEV),
            detail: e.to_string(),
        })
        .with_context(|| format!("device {}", path.display()))?;
    Ok(f.seek(SeekFrom::End(0))?)
}

/// The dm-integrity superblock at byte `at` of `path` (a LUKS2 segment with integrity).
fn integrity_superblock(path: &Path, at: u64) -> Result<ucrypt_format::integrity::Superblock> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).with_context(|| format!("device {}", path.display()))?;
    let mut first = vec![0u8; 512];
    f.read_exact_at(&mut first, at)
        .with_context(|| format!("reading the dm-integrity superblock of {}", path.display()))?;
    ucrypt_format::integrity::Superblock::parse(&first)
        .with_context(|| format!("the dm-integrity superblock of {}", path.display()))
}

/// Opens a libcryptsetup context on `device` (or on the detached header).
///
/// # Errors
/// The device or header cannot be opened.
pub fn crypt_device(device: &Path, header: Option<&Path>) -> Result<CryptDevice> {
    Ok(match header {
        None => CryptDevice::init(device)?,
        Some(h) => CryptDevice::init_detached(h, device)?,
    })
}

/// The type `open` takes when none is given: cryptsetup assumes LUKS; ucrypt also
/// recognises the BitLocker and FileVault2 signatures (through libcryptsetup's loaders).
/// TrueCrypt/VeraCrypt and plain volumes have no signature and always need `--type`.
pub fn detect_type(device: &Path) -> VolumeType {
    if crate::remote_header::is_remote(device) {
        return VolumeType::Luks;
    }
    for (header, kind) in [
        (HeaderType::Bitlk, VolumeType::Bitlk),
        (HeaderType::Fvault2, VolumeType::Fvault2),
    ] {
        if let Ok(mut cd) = CryptDevice::init(device) {
            if cd.load(Some(header)).is_ok() {
                return kind;
            }
        }
    }
    VolumeType::Luks
}

/// Loads the LUKS header of the expected version.
///
/// # Errors
/// No valid header of that type ("not a valid LUKS device").
pub fn load_luks(cd: &mut CryptDevice, kind: VolumeType) -> Result<()> {
    let want = match kind {
        VolumeType::Luks1 => Some(HeaderType::Luks1),
        VolumeType::Luks2 => Some(HeaderType::Luks2),
        VolumeType::Bitlk => Some(HeaderType::Bitlk),
        VolumeType::Fvault2 => Some(HeaderType::Fvault2),
        VolumeType::Luks => None,
        VolumeType::Plain => bail!("plain mode has no header to load"),
        VolumeType::Loopaes => bail!("loop-AES volumes have no header to load"),
        VolumeType::Tcrypt => bail!(
            "TCRYPT headers are decrypted by ucrypt itself (ucrypt_format::tcrypt), not loaded \
             through libcryptsetup"
        ),
    };
    let name = cd.device_name().to_string();
    cd.load(want).with_context(|| match want {
        Some(t) => format!("{name} is not a valid {t} device"),
        None => format!("{name} is not a valid LUKS device"),
    })
}

/// Refuses headers whose requirements forbid activation (an unfinished reencryption,
/// requirements unknown to libcryptsetup).
///
/// # Errors
/// [`FormatError::Refused`] naming the requirement.
pub fn check_requirements(cd: &mut CryptDevice) -> Result<(u32, u32)> {
    let (act, req) = cd.persistent_flags()?;
    if req != 0 {
        let mut what = Vec::new();
        if req & cs::REQUIREMENT_OFFLINE_REENCRYPT != 0 {
            what.push("an unfinished offline reencryption");
        }
        if req & cs::REQUIREMENT_ONLINE_REENCRYPT != 0 {
            what.push("an unfinished online reencryption");
        }
        let reencrypt = !what.is_empty();
        let unknown;
        if req & cs::REQUIREMENT_UNKNOWN != 0 || what.is_empty() {
            // Name them: config.requirements.mandatory of the JSON metadata.
            let names = cd
                .luks2_metadata()
                .ok()
                .and_then(|m| m.config.requirements)
                .map(|r| {
                    r.mandatory
                        .iter()
                        .map(|n| luks2::metadata::quoted(n))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            unknown = format!(
                "mandatory requirements unknown to libcryptsetup and ucrypt \
                 (config.requirements.mandatory: [{}])",
                names.join(", ")
            );
            what.push(&unknown);
        }
        let hint = if reencrypt {
            " (finish it with `cryptsetup reencrypt` first)"
        } else {
            ""
        };
        return Err(FormatError::Refused(format!(
            "LUKS2 header on {} has {} (requirement flags {req:#x}); ucrypt will not open \
             it{hint}",
            cd.device_name(),
            what.join(" and ")
        ))
        .into());
    }
    Ok((act, req))
}

/// [`luks::refuse_unsafe_ciphers`] on the LUKS header loaded in `cd` (any passphrase
/// check or unlock must come after it).
///
/// # Errors
/// As [`luks::refuse_unsafe_ciphers`]; the metadata cannot be read.
pub fn check_luks_ciphers(
    cd: &mut CryptDevice,
    info: &VolumeInfo,
    allow_null_cipher: bool,
) -> Result<()> {
    let meta = match info.kind {
        Some(HeaderType::Luks2) => Some(cd.luks2_metadata()?),
        _ => None,
    };
    let device = cd.device_name().to_string();
    Ok(luks::refuse_unsafe_ciphers(
        meta.as_ref(),
        info,
        &device,
        allow_null_cipher,
    )?)
}

/// Reads the header on `device` (or `opts.header`), unlocks the volume key with `secret`
/// and assembles the table line cryptsetup would give the kernel.
///
/// # Errors
/// No valid header, a wrong passphrase ([`FormatError::Cryptsetup`] with `EPERM`),
/// requirements that forbid activation, an unbound keyslot, an unusable cipher, or a
/// device smaller than the data offset.
pub fn unlock(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    unlock_with(device, Unlock::Passphrase(secret), opts)
}

/// What opens a LUKS volume: a passphrase (through a keyslot) or the volume key itself.
enum Unlock<'a> {
    Passphrase(&'a [u8]),
    VolumeKey(&'a [u8]),
}

/// Like [`unlock`], with the volume key itself instead of a passphrase (cryptsetup's
/// `--volume-key-file`, for forensics and recovery): no keyslot is used; the key must
/// match the header's digest (of the data segment for LUKS2). LUKS1 and LUKS2 only.
///
/// # Errors
/// As [`unlock`]; a key of the wrong size or one that does not match the digest is refused.
pub fn unlock_by_volume_key(device: &Path, key: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    if !matches!(
        opts.kind,
        VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2
    ) || crate::remote_header::is_remote(device)
    {
        bail!("--volume-key-file opens local LUKS1 and LUKS2 volumes only");
    }
    unlock_with(device, Unlock::VolumeKey(key), opts)
}

fn unlock_with(device: &Path, how: Unlock<'_>, opts: &HeaderOptions) -> Result<Unlocked> {
    let secret = match how {
        Unlock::Passphrase(p) => p,
        Unlock::VolumeKey(_) => &[][..],
    };
    if crate::remote_header::is_remote(device) {
        return unlock_remote(device, secret, opts);
    }
    let device_str = device.display().to_string();
    match opts.kind {
        VolumeType::Plain => return unlock_plain(device, secret, opts),
        VolumeType::Loopaes => return unlock_loopaes(device, secret, opts),
        VolumeType::Bitlk => return unlock_bitlk(device, secret, opts),
        VolumeType::Fvault2 => return unlock_fvault2(device, secret, opts),
        VolumeType::Tcrypt => return crate::tcrypt::unlock_tcrypt(device, secret, opts),
        _ => {}
    }
    let mut cd = crypt_device(device, opts.header.as_deref())?;
    load_luks(&mut cd, opts.kind)?;
    if let (Unlock::Passphrase(pass), Some(HeaderType::Luks2)) = (&how, cd.info().kind) {
        let (_, req) = cd.persistent_flags()?;
        if req == cs::REQUIREMENT_ONLINE_REENCRYPT {
            return unlock_reencrypting(cd, device, pass, opts);
        }
    }
    check_requirements(&mut cd)?;
    let info = cd.info();
    // The metadata first: an integrity or reencryption header is named as such, not as
    // whatever its cipher string fails on.
    // The JSON metadata is read and parsed once, for both checks.
    let meta = match info.kind {
        Some(HeaderType::Luks2) => Some(cd.luks2_metadata()?),
        _ => None,
    };
    let luks2 = match &meta {
        Some(m) => Some(luks::check_luks2_metadata(m, &info, cd.device_name())?),
        None => None,
    };
    luks::refuse_unsafe_ciphers(
        meta.as_ref(),
        &info,
        cd.device_name(),
        opts.allow_null_cipher,
    )?;
    // An authenticated segment: the kernel's cipher (capi:authenc(...), gcm, rfc7539) and
    // tag size, as cryptsetup builds them from the segment's cipher and integrity type.
    let aead = match luks2.as_ref().and_then(|s| s.integrity.as_deref()) {
        Some(kind) => Some(luks::aead_cipher_spec(&info, kind, &device_str)?),
        None => None,
    };
    let cipher = match &aead {
        Some((spec, _)) => spec.clone(),
        None => luks::cipher_spec(&info, &device_str)?,
    };
    let (slot, key) = match how {
        Unlock::Passphrase(secret) => {
            let (slot, key) = cd
                .volume_key(opts.key_slot, secret)
                .with_context(|| format!("unlocking {device_str}"))?;
            (Some(slot), key)
        }
        Unlock::VolumeKey(vk) => {
            if vk.len() != info.key_bytes {
                bail!(
                    "the volume key file holds {} bytes; the header of {device_str} says {}",
                    vk.len(),
                    info.key_bytes
                );
            }
            cd.verify_volume_key(vk)?;
            (None, VolumeKey::new(vk.to_vec()))
        }
    };
    drop(cd);
    luks::check_key(&info, &key, luks2.as_ref(), slot, &device_str)?;
    if let (Some((_, tag)), Some(seg)) = (aead, luks2.as_ref()) {
        let bytes = device_bytes(device)?;
        let sb = integrity_superblock(device, info.data_offset * 512)?;
        let mapping = luks::integrity_mapping(
            &info,
            cipher,
            tag,
            key,
            &device_str,
            &sb,
            bytes,
            seg,
            opts.allow_discards,
        )?;
        return Ok(Unlocked {
            mapping,
            info,
            slot,
        });
    }
    let segment_bytes = luks2.and_then(|s| s.size_bytes);
    // The device's size only where the segment runs to its end.
    let real = match segment_bytes {
        Some(_) => None,
        None => Some(device_bytes(device)?),
    };
    let mapping = luks::segment_mapping(
        &info,
        cipher,
        key,
        &device_str,
        segment_bytes,
        real,
        opts.allow_discards,
    )?;
    Ok(Unlocked {
        mapping,
        info,
        slot,
    })
}

/// A LUKS2 volume in the middle of a reencryption (cryptsetup's or ucrypt's): mapped as
/// cryptsetup maps it, one target per data segment ([`luks::reencrypting_mapping`]): a
/// re-keying's parts under the new and the old key, an encryption's or decryption's
/// encrypted part (crypt) and plaintext part (linear). The reencryption metadata is read
/// and checked by [`ucrypt_format::luks2::reencrypt`] (the keys of the sides that have one
/// unlocked with the passphrase, the reencryption digest verified); a hotzone left by a
/// crash is recovered first on a read-write open (`recover_reencryption`), else refused
/// until `ucrypt reencrypt --resume-only` (or `cryptsetup repair`) has recovered it.
fn unlock_reencrypting(
    mut cd: CryptDevice,
    device: &Path,
    passphrase: &[u8],
    opts: &HeaderOptions,
) -> Result<Unlocked> {
    use ucrypt_format::luks2::reencrypt::{Progress, Reencrypt};
    let device_str = device.display().to_string();
    cd.persistent_flags()?;
    let info = cd.info();
    drop(cd);
    // The header (and its keyslots) on the device, or in the detached `--header` file.
    let hdr_path = opts.header.as_deref().unwrap_or(device);
    let hdr_str = hdr_path.display().to_string();
    let file = std::fs::File::open(hdr_path).with_context(|| format!("opening {hdr_str}"))?;
    let mut header = luks2::disk::Header::read(&file, &hdr_str)?;
    let probe = Reencrypt::load(&header.json, u64::MAX)?;
    let total = device_bytes(device)?;
    let size = total.checked_sub(probe.new.offset).ok_or_else(|| {
        crate::error::anyhow!(
            "device {device_str} ends before its data offset {}",
            probe.new.offset
        )
    })?;
    let mut st = Reencrypt::load(&header.json, size)?;
    if let Progress::Crashed { .. } = st.progress {
        if opts.recover_reencryption {
            match &opts.header {
                Some(h) => crate::reencrypt::Run::open_detached(h, device, passphrase),
                None => crate::reencrypt::Run::open(device, passphrase),
            }
            .and_then(|mut run| run.recover_crash())
            .with_context(|| {
                format!("recovering the interrupted reencryption hotzone of {device_str}")
            })?;
            header = luks2::disk::Header::read(&file, &hdr_str)?;
            st = Reencrypt::load(&header.json, size)?;
        }
    }
    let done = match st.progress {
        Progress::Clean { done } => done,
        Progress::Crashed { offset, length } => {
            return Err(FormatError::Refused(format!(
                "LUKS2 header on {device_str}: a reencryption hotzone [{offset}, +{length}) \
                 was interrupted by a crash; a read-write `ucrypt open` recovers it, or run \
                 `ucrypt reencrypt --resume-only` (or cryptsetup repair)"
            ))
            .into())
        }
    };
    let meta = Metadata::parse(&header.json.to_compact())?;
    let key_of = |digest: u32| -> Result<(u32, VolumeKey)> {
        let slots = meta
            .digests
            .get(&digest)
            .map(|d| d.keyslots.clone())
            .unwrap_or_default();
        let mut last = None;
        for slot in slots
            .into_iter()
            .filter(|s| opts.key_slot.is_none_or(|k| k == *s))
        {
            match luks2::unlock(hdr_path, &meta, Some(slot), passphrase, true) {
                Ok(found) => return Ok(found),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .unwrap_or(FormatError::BadPassphrase {
                device: device_str.clone(),
                tried: "no keyslot holds the key".into(),
            })
            .into())
    };
    // The keys of the sides that have one (an encryption's old side and a decryption's new
    // side are plaintext: linear segments, no digest).
    let unlock_side = |digest: Option<u32>| -> Result<Option<(u32, VolumeKey)>> {
        digest.map(key_of).transpose()
    };
    let (slot, keys) = match unlock_side(st.old.digest) {
        Ok(old) => {
            let new = unlock_side(st.new.digest)?;
            let none = VolumeKey::new(Vec::new());
            st.verify(
                &header.json,
                old.as_ref().map_or(&none, |(_, k)| k).as_bytes(),
                new.as_ref().map_or(&none, |(_, k)| k).as_bytes(),
            )?;
            let slot = old.as_ref().or(new.as_ref()).map(|(s, _)| *s);
            let keys: Vec<(u32, VolumeKey)> = [(st.old.digest, old), (st.new.digest, new)]
                .into_iter()
                .filter_map(|(d, k)| Some((d?, k?.1)))
                .collect();
            (slot, keys)
        }
        // All data is under the new key and the clean-up has begun: the old key's keyslot
        // may be wiped already (a crash, or kill -9, inside the clean-up). The old side
        // maps nothing, so the new key alone serves the volume, as cryptsetup activates it
        // (by the data segments' digests); the reencryption digest needs both keys and is
        // not checked. `reencrypt --resume-only` finishes the clean-up the same way.
        Err(_) if done == size && st.new.digest.is_some() => {
            let Some((slot, new_key)) = unlock_side(st.new.digest)? else {
                unreachable!("the new side has a digest")
            };
            (
                Some(slot),
                st.new.digest.map(|d| (d, new_key)).into_iter().collect(),
            )
        }
        Err(e) => return Err(e),
    };
    let keys: Vec<(u32, &VolumeKey)> = keys.iter().map(|(d, k)| (*d, k)).collect();
    let mapping = luks::reencrypting_mapping(
        &meta,
        total,
        &keys,
        &device_str,
        info.flags,
        opts.allow_discards,
    )?;
    Ok(Unlocked {
        mapping,
        info,
        slot,
    })
}

/// A device that is an NBD URI: the header area is copied into a memfd of the device's size
/// ([`crate::remote_header`]) for libcryptsetup, and the table maps the URI itself.
fn unlock_remote(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    let uri = device.display().to_string();
    let headerless = matches!(opts.kind, VolumeType::Plain | VolumeType::Loopaes);
    if crate::open::is_ram(&uri) && !headerless && opts.header.is_none() {
        bail!("{}", ram_holds_no_header(&uri));
    }
    let kind = match opts.kind {
        VolumeType::Bitlk => Some("bitlk"),
        VolumeType::Fvault2 => Some("fvault2"),
        VolumeType::Tcrypt => Some("tcrypt"),
        _ => None,
    };
    if let Some(kind) = kind {
        bail!(
            "--type {kind} on a remote NBD device ({uri}) is not supported: its metadata is \
             spread over the device; open it where the device is local"
        );
    }
    // Plain mode and a detached header need only the device's size from the remote.
    let copy = opts.header.is_none() && !headerless;
    let staged = crate::remote_header::stage(&uri, copy)?;
    // The staged copy holds the metadata only: a crashed reencryption hotzone cannot be
    // recovered there (its data is on the remote), so it is refused as on a read-only open.
    let local = HeaderOptions {
        recover_reencryption: false,
        ..opts.clone()
    };
    let mut u = unlock(staged.path(), secret, &local)
        .with_context(|| format!("remote device {uri} (header read into a memfd)"))?;
    // Every target names the remote device, not the staged copy (a volume mid-reencryption
    // maps as two targets, crypt or linear).
    for t in u.mapping.tables.iter_mut().flat_map(|t| &mut t.targets) {
        if let Some(device @ DeviceRef::Device(_)) = t.device_mut() {
            *device = DeviceRef::from(uri.as_str());
        }
    }
    Ok(u)
}

/// Why a memory device (`ram:SIZE`) cannot be unlocked from its own header.
pub fn ram_holds_no_header(device: &str) -> String {
    format!(
        "{device} is a memory device: it starts empty in every process, so it holds no \
         header; open it with --type plain, a table line, or a detached --header"
    )
}

/// Loads a non-LUKS header of `kind` through libcryptsetup (which unwraps its key).
fn load_other(device: &Path, kind: HeaderType) -> Result<CryptDevice> {
    let mut cd = crypt_device(device, None)?;
    cd.load(Some(kind))
        .with_context(|| format!("{} is not a valid {kind} device", device.display()))?;
    Ok(cd)
}

/// BitLocker: the volume key (FVEK) from libcryptsetup, or from ucrypt's own protector code
/// where the library cannot (`ucrypt_format::bitlk::keys`: clear-key-only volumes, non-ASCII
/// passphrases in 2.6.1); the mapping from the layout as cryptsetup builds it (crypt targets
/// around zeroed metadata, the moved volume header at the front).
fn unlock_bitlk(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    let device_str = device.display().to_string();
    let mut cd = load_other(device, HeaderType::Bitlk)?;
    let layout = ucrypt_format::bitlk::Layout::read(device)?;
    let key = match cd.volume_key(None, secret) {
        Ok((_, key)) => key,
        Err(library) => ucrypt_format::bitlk::keys::Metadata::read(device, &layout.fve_offsets)
            .and_then(|m| m.volume_key(secret))
            .map_err(|_| library)
            .with_context(|| format!("unlocking {device_str}"))?,
    };
    let info = cd.info();
    drop(cd);
    if let Some(why) = layout.activation_refusal() {
        return Err(FormatError::Refused(format!("{device_str}: {why}")).into());
    }
    let total = device_bytes(device)? / 512;
    let mapping = layout.mapping(&key, &device_str, total, opts.allow_discards)?;
    Ok(Unlocked {
        mapping,
        info,
        slot: None,
    })
}

/// FileVault2: one crypt target over the logical volume, IVs counted from its start. The
/// key comes from libcryptsetup, the geometry from the Core Storage metadata itself
/// ([`ucrypt_format::fvault2`]).
fn unlock_fvault2(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    let device_str = device.display().to_string();
    let mut cd = load_other(device, HeaderType::Fvault2)?;
    let (_, key) = cd
        .volume_key(None, secret)
        .with_context(|| format!("unlocking {device_str}"))?;
    let info = cd.info();
    drop(cd);
    let md = ucrypt_format::fvault2::Metadata::read(device)?;
    let cipher = luks::cipher_spec(&info, &device_str)?;
    let mapping = md.mapping(cipher, key, &device_str, opts.allow_discards);
    Ok(Unlocked {
        mapping,
        info,
        slot: None,
    })
}

fn unlock_plain(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    let device_str = device.display().to_string();
    let p = &opts.plain;
    let cipher: ucrypt_crypto::CipherSpec = p
        .cipher
        .parse()
        .with_context(|| format!("plain-mode cipher \"{}\"", p.cipher))?;
    let key: VolumeKey = if opts.plain_raw_key {
        let raw = PlainOptions {
            hash: None,
            ..p.clone()
        };
        ucrypt_cryptsetup::plain::volume_key(device, &raw, secret)?
    } else {
        ucrypt_cryptsetup::plain::volume_key(device, p, secret)?
    };
    // The device's real size only where the mapping runs to its end.
    let real = if p.size == 0 && p.device_size.is_none() {
        Some(device_bytes(device)?)
    } else {
        None
    };
    let info = p.info(key.len());
    let mapping = p.mapping(cipher, key, &device_str, real, opts.allow_discards)?;
    Ok(Unlocked {
        mapping,
        info,
        slot: None,
    })
}

/// loop-AES: the keys from the key file `secret`, one crypt target from `--offset` to the
/// device's end ([`ucrypt_format::loopaes`]).
fn unlock_loopaes(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    if opts.header.is_some() {
        bail!("loop-AES volumes have no header: --header does not apply");
    }
    let o = &opts.loopaes;
    let key = o.volume_key(secret)?;
    let spec = o.cipher_spec(key.keys)?;
    let info = o.info(&spec, key.key.as_bytes().len());
    let mapping = o.mapping(
        key,
        &device.display().to_string(),
        device_bytes(device)?,
        opts.allow_discards,
    )?;
    Ok(Unlocked {
        mapping,
        info,
        slot: None,
    })
}

/// [`unlock`], then opens the device and builds the volume, exactly as a table line.
///
/// # Errors
/// As [`unlock`] and [`crate::open::open_table`]; volumes of several targets or layers
/// (BitLocker, TCRYPT cascades) are refused: use [`open_unlocked`].
pub fn open_header(
    device: &Path,
    secret: &[u8],
    hopts: &HeaderOptions,
    opts: OpenOptions,
) -> Result<OpenedTable> {
    let unlocked = unlock(device, secret, hopts)?;
    match unlocked.mapping.into_single_line() {
        Ok(line) => open_parsed(line, opts),
        Err(_) => bail!(
            "{} maps to several dm-crypt layers or targets; open it with open_unlocked",
            device.display()
        ),
    }
}

/// Builds the decrypted view of an unlocked volume from its mapping
/// ([`crate::mapping::open_mapping`]): the one table line's volume, or, for a multi-target
/// table (BitLocker), the targets joined end to end, or for a stack (TCRYPT cascade), the
/// tables stacked.
///
/// # Errors
/// As [`crate::mapping::open_mapping`].
pub fn open_unlocked(
    unlocked: Unlocked,
    opts: OpenOptions,
) -> Result<std::sync::Arc<dyn ucrypt_backend::Backend>> {
    open_mapping(unlocked.mapping, opts)
}
