//! Opening a volume from its on-disk header (LUKS1, LUKS2) or by cryptsetup's plain-mode
//! rules, instead of from a table line.
//!
//! ```text
//!  device + secret ──► ucrypt_cryptsetup (libcryptsetup: header, keyslot, volume key)
//!                             │ HeaderInfo: cipher, data offset, sector size, IV offset,
//!                             │ persistent flags, requirements
//!                             ▼
//!                      TableLine (the line cryptsetup would give the kernel)
//!                             │ open::open_parsed
//!                             ▼
//!                      engine::Volume
//! ```
//!
//! The same table line is what `ucrypt table` prints, so a header-opened volume can be
//! shown (key hidden) and compared with `dmsetup table` output of the kernel mapping.

use crate::mapping::open_mapping;
use crate::open::{open_parsed, OpenOptions, OpenedTable};
use anyhow::{bail, Context, Result};
use std::io::{Seek, SeekFrom};
use std::path::Path;
use std::str::FromStr;
use ucrypt_crypto::VolumeKey;
use ucrypt_cryptsetup::{self as cs, CryptDevice, HeaderInfo, HeaderType};
use ucrypt_format::luks2::{self, Metadata};
use ucrypt_format::plain::PlainOptions;
use ucrypt_format::{DeviceRef, FormatError, KeySource, Mapping, OptParam, TableLine, Target};

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

/// Table-line options from libcryptsetup's persistent activation flag bits (`act`), the
/// command line's `--allow-discards` and the sector size
/// ([`luks2::ActivationFlags::table_options`]).
fn opts_from(act: u32, sector_size: u32, extra_discards: bool) -> Vec<OptParam> {
    luks2::ActivationFlags {
        allow_discards: act & cs::ACTIVATE_ALLOW_DISCARDS != 0 || extra_discards,
        same_cpu_crypt: act & cs::ACTIVATE_SAME_CPU_CRYPT != 0,
        submit_from_crypt_cpus: act & cs::ACTIVATE_SUBMIT_FROM_CRYPT_CPUS != 0,
        no_read_workqueue: act & cs::ACTIVATE_NO_READ_WORKQUEUE != 0,
        no_write_workqueue: act & cs::ACTIVATE_NO_WRITE_WORKQUEUE != 0,
    }
    .table_options(sector_size)
}

/// LUKS2 persistent flags (`config.flags`) ucrypt knows: the first five become table
/// options ([`opts_from`]); `no-journal` only concerns dm-integrity, whose segments are
/// refused anyway, so on a plain crypt segment it changes nothing.
const LUKS2_KNOWN_FLAGS: [&str; 6] = [
    "allow-discards",
    "same-cpu-crypt",
    "submit-from-crypt-cpus",
    "no-read-workqueue",
    "no-write-workqueue",
    "no-journal",
];

/// What the LUKS2 JSON metadata says about the one data segment ucrypt maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Luks2Segment {
    /// Fixed size in bytes, `None` for `dynamic` (to the device end).
    pub size_bytes: Option<u64>,
    /// Digests that cover segment 0 (a keyslot must be bound to one of them).
    pub digest_keyslots: Vec<u32>,
}

/// Refuses a LUKS2 header whose metadata asks for anything ucrypt does not implement, before
/// any data is served, naming the JSON field. Every field of the data segment that changes
/// what a sector decrypts to is checked against the table ucrypt builds from `info`
/// (libcryptsetup's view): the segment type, `integrity` (dm-integrity / AEAD: tags
/// interleaved with the data), `flags` (reencryption bookkeeping), `encryption`,
/// `sector_size`, `offset`, `iv_tweak`, `size`; more than one segment; mandatory
/// requirements; persistent flags ucrypt does not know; keyslots bound to segment 0 that
/// are not `luks2` keyslots of the segment's key size.
///
/// # Errors
/// [`FormatError::Refused`] naming the field and its value.
pub fn check_luks2_metadata(v: &Metadata, info: &HeaderInfo, device: &str) -> Result<Luks2Segment> {
    use luks2::metadata::quoted;
    let refuse = |what: String| -> anyhow::Error {
        FormatError::Refused(format!(
            "LUKS2 header on {device}: {what}; ucrypt does not implement it and will not map \
             this volume (serving it as plain dm-crypt would give wrong data)"
        ))
        .into()
    };
    if let Some(req) = &v.config.requirements {
        if !req.mandatory.is_empty() {
            let names: Vec<String> = req.mandatory.iter().map(|n| quoted(n)).collect();
            return Err(refuse(format!(
                "config.requirements.mandatory lists {}",
                names.join(", ")
            )));
        }
    }
    if let Some(flags) = &v.config.flags {
        for f in flags {
            if !LUKS2_KNOWN_FLAGS.contains(&f.as_str()) {
                return Err(refuse(format!(
                    "config.flags has the unknown flag {}",
                    quoted(f)
                )));
            }
        }
    }
    let segments = &v.segments;
    let seg = match segments.get(&0) {
        Some(seg) if segments.len() == 1 => seg,
        _ => {
            let keys: Vec<String> = segments.keys().map(ToString::to_string).collect();
            return Err(refuse(format!(
                "{} segments ({}) where ucrypt maps exactly one, segment 0 (several segments \
                 mean a reencryption or a layout ucrypt does not build)",
                segments.len(),
                keys.join(", ")
            )));
        }
    };
    let ty = seg.kind.as_str();
    if ty != "crypt" {
        return Err(refuse(format!(
            "segments.0.type is \"{ty}\" (only \"crypt\" is implemented)"
        )));
    }
    if let Some(integrity) = &seg.integrity {
        let kind = integrity.kind.as_deref().unwrap_or("?");
        return Err(refuse(format!(
            "segments.0.integrity is {{\"type\": \"{kind}\"}}: authenticated encryption \
             (dm-integrity tags interleaved with the data, cryptsetup --integrity)"
        )));
    }
    if let Some(flags) = seg.flags.as_ref().filter(|f| !f.is_empty()) {
        let names: Vec<String> = flags.iter().map(|n| quoted(n)).collect();
        return Err(refuse(format!(
            "segments.0.flags is [{}]",
            names.join(", ")
        )));
    }
    let num = |field: &str, n: Option<&luks2::Number>| -> Result<u64> {
        n.and_then(luks2::Number::get).ok_or_else(|| {
            let shown = n.map_or_else(|| "null".to_string(), ToString::to_string);
            refuse(format!("segments.0.{field} is {shown}, not a number"))
        })
    };
    let enc = seg.encryption.as_deref().unwrap_or("");
    if enc != info.cipher_spec() {
        return Err(refuse(format!(
            "segments.0.encryption \"{enc}\" differs from the cipher libcryptsetup reports \
             (\"{}\")",
            info.cipher_spec()
        )));
    }
    let sector = num("sector_size", seg.sector_size.as_ref())?;
    if ![512, 1024, 2048, 4096].contains(&sector) || sector != u64::from(info.sector_size) {
        return Err(refuse(format!(
            "segments.0.sector_size is {sector} (dm-crypt takes 512, 1024, 2048 or 4096)"
        )));
    }
    let offset = num("offset", Some(&seg.offset))?;
    if offset % sector != 0 || offset != info.data_offset * 512 {
        return Err(refuse(format!(
            "segments.0.offset {offset} is not the data offset {} sectors or not aligned to \
             the sector size {sector}",
            info.data_offset
        )));
    }
    let tweak = num("iv_tweak", seg.iv_tweak.as_ref())?;
    if tweak != info.iv_offset {
        return Err(refuse(format!(
            "segments.0.iv_tweak {tweak} differs from the IV offset libcryptsetup reports ({})",
            info.iv_offset
        )));
    }
    let size_bytes = if seg.size.is("dynamic") {
        None
    } else {
        let n = num("size", Some(&seg.size))?;
        if n == 0 || n % sector != 0 {
            return Err(refuse(format!(
                "segments.0.size {n} is not a positive multiple of the sector size {sector}"
            )));
        }
        Some(n)
    };
    let digest_keyslots = v.keyslots_of_segment(0);
    if digest_keyslots.is_empty() {
        return Err(refuse(
            "no digest covers segment 0 (no keyslot can hold its volume key)".into(),
        ));
    }
    // Every keyslot that can open segment 0 must hold a key of the segment's size, in the
    // keyslot format libcryptsetup decrypts for ucrypt.
    for k in &digest_keyslots {
        let Some(slot) = v.keyslots.get(k) else {
            continue; // a digest may name a keyslot since removed; libcryptsetup skips it
        };
        if slot.kind != "luks2" {
            return Err(refuse(format!(
                "keyslots.{k}.type is {} (only \"luks2\" keyslots hold the volume key)",
                quoted(&slot.kind)
            )));
        }
        let size = slot.key_size.as_ref().and_then(luks2::Number::get);
        if size != Some(info.key_bytes as u64) {
            let shown = slot
                .key_size
                .as_ref()
                .map_or_else(|| "null".to_string(), ToString::to_string);
            return Err(refuse(format!(
                "keyslots.{k}.key_size is {shown} but segment 0's key is {} bytes",
                info.key_bytes
            )));
        }
    }
    Ok(Luks2Segment {
        size_bytes,
        digest_keyslots,
    })
}

fn cipher_spec(info: &HeaderInfo, device: &str) -> Result<ucrypt_crypto::CipherSpec> {
    let spec = info.cipher_spec();
    if spec.starts_with("capi:") && spec.contains("-generic") {
        return Err(FormatError::Refused(format!(
            "header on {device} names a kernel crypto driver (\"{spec}\"), not a cipher; \
             cryptsetup refuses to activate it and so does ucrypt"
        ))
        .into());
    }
    spec.parse()
        .with_context(|| format!("header on {device}: cipher \"{spec}\""))
}

/// Whether a cryptsetup cipher string means "no encryption" (libcryptsetup's
/// `crypt_is_cipher_null`: `cipher_null` or `null` as the cipher, any mode).
fn is_cipher_null(spec: &str) -> bool {
    let cipher = spec.split('-').next().unwrap_or_default();
    cipher == "cipher_null" || cipher == "null" || spec.contains("(cipher_null)")
}

/// Refuses LUKS headers whose ciphers let whoever can write the header decide what the
/// volume holds, before any keyslot is tried:
///
/// * a keyslot or data segment with `cipher_null` (CVE-2025-59054, refused by cryptsetup
///   2.8.1): a crafted header with a null-cipher keyslot "unlocks" with any passphrase
///   (or a known one) to a volume key the attacker chose, or maps the data unencrypted,
///   so a confidential VM that trusts "the disk unlocked" runs the attacker's data.
///   `allow_null_cipher` (`--insecure-allow-null-cipher`) opens them anyway;
/// * a LUKS2 keyslot whose cipher is in the kernel crypto API form (`capi:...`), which
///   cryptsetup never writes and refuses (`LUKS2_keyslot_cipher_incompatible`): such a
///   string can name a kernel driver instead of a cipher. No option opens these.
///
/// `luks2` is the LUKS2 metadata, `None` for LUKS1.
///
/// # Errors
/// [`FormatError::Refused`] naming the keyslot or segment and the cipher.
pub fn refuse_unsafe_luks_ciphers(
    luks2: Option<&Metadata>,
    info: &HeaderInfo,
    device: &str,
    allow_null_cipher: bool,
) -> Result<()> {
    let null_refused = |what: String, spec: &str| -> anyhow::Error {
        FormatError::Refused(format!(
            "LUKS header on {device}: {what} uses the null cipher \"{spec}\" (no encryption): \
             anyone who can write the header could have chosen the volume key or the data \
             (CVE-2025-59054); ucrypt refuses it as cryptsetup 2.8.1 does \
             (--insecure-allow-null-cipher opens it anyway)"
        ))
        .into()
    };
    let mut used: Vec<(String, String)> = Vec::new();
    if let Some(v) = luks2 {
        for (id, slot) in &v.keyslots {
            let Some(spec) = slot.area.as_ref().and_then(|a| a.encryption.as_deref()) else {
                continue;
            };
            if spec.starts_with("capi:") {
                return Err(FormatError::Refused(format!(
                    "LUKS2 header on {device}: keyslot {id} is encrypted with \"{spec}\", \
                     a kernel crypto API string that cryptsetup never writes for a keyslot \
                     and refuses (it can name a kernel driver rather than a cipher)"
                ))
                .into());
            }
            used.push((format!("keyslot {id}"), spec.to_string()));
        }
        for (id, seg) in &v.segments {
            if let Some(spec) = &seg.encryption {
                used.push((format!("data segment {id}"), spec.clone()));
            }
        }
    } else {
        // LUKS1: one cipher for the keyslots and the data.
        used.push(("the keyslots and data".to_string(), info.cipher_spec()));
    }
    if !allow_null_cipher {
        if let Some((what, spec)) = used.into_iter().find(|(_, s)| is_cipher_null(s)) {
            return Err(null_refused(what, &spec));
        }
    }
    Ok(())
}

/// [`refuse_unsafe_luks_ciphers`] on the LUKS header loaded in `cd` (any passphrase
/// check or unlock must come after it).
///
/// # Errors
/// As [`refuse_unsafe_luks_ciphers`]; the metadata cannot be read.
pub fn check_luks_ciphers(
    cd: &mut CryptDevice,
    info: &HeaderInfo,
    allow_null_cipher: bool,
) -> Result<()> {
    let meta = match info.kind {
        Some(HeaderType::Luks2) => Some(cd.luks2_metadata()?),
        _ => None,
    };
    let device = cd.device_name().to_string();
    refuse_unsafe_luks_ciphers(meta.as_ref(), info, &device, allow_null_cipher)
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
    let (act, _) = check_requirements(&mut cd)?;
    let info = cd.info();
    // The metadata first: an integrity or reencryption header is named as such, not as
    // whatever its cipher string fails on.
    // The JSON metadata is read and parsed once, for both checks.
    let meta = match info.kind {
        Some(HeaderType::Luks2) => Some(cd.luks2_metadata()?),
        _ => None,
    };
    let luks2 = match &meta {
        Some(m) => Some(check_luks2_metadata(m, &info, cd.device_name())?),
        None => None,
    };
    refuse_unsafe_luks_ciphers(
        meta.as_ref(),
        &info,
        cd.device_name(),
        opts.allow_null_cipher,
    )?;
    let cipher = cipher_spec(&info, &device_str)?;
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
    if key.len() != info.key_bytes {
        bail!(
            "the volume key of {device_str} is {} bytes but the header says {}",
            key.len(),
            info.key_bytes
        );
    }
    if let (Some(seg), Some(slot)) = (&luks2, slot) {
        if !seg.digest_keyslots.contains(&slot) {
            return Err(FormatError::Refused(format!(
                "LUKS2 header on {device_str}: keyslot {slot} is not bound to a digest of \
                 segment 0; its key does not decrypt the data"
            ))
            .into());
        }
    }
    let fixed = luks2.and_then(|s| s.size_bytes);
    let length = match fixed {
        Some(b) => b / 512,
        None => {
            let total = device_bytes(device)? / 512;
            if total < info.data_offset {
                bail!(
                    "device {device_str} ({total} sectors) ends before the data offset {} sectors",
                    info.data_offset
                );
            }
            // total == data offset: a header-only device; unlocking works, opening the
            // (empty) volume is refused by the engine.
            total - info.data_offset
        }
    };
    let table = TableLine {
        start: 0,
        length,
        cipher,
        key: KeySource::Hex(key),
        iv_offset: info.iv_offset,
        device: DeviceRef::Path(device_str),
        offset: info.data_offset,
        opts: opts_from(act, info.sector_size, opts.allow_discards),
    };
    Ok(Unlocked {
        mapping: Mapping::single(table),
        info,
        slot,
    })
}

/// A LUKS2 volume in the middle of a reencryption (cryptsetup's or ucrypt's): mapped as
/// cryptsetup maps it, the part already done under the new key and the rest under the old
/// one, one crypt target each. The reencryption metadata is read and checked by
/// [`ucrypt_format::luks2::reencrypt`] (both keys unlocked with the passphrase, the
/// reencryption digest verified); a hotzone left by a crash is refused until
/// `ucrypt reencrypt --resume-only` (or `cryptsetup repair`) has recovered it.
fn unlock_reencrypting(
    mut cd: CryptDevice,
    device: &Path,
    passphrase: &[u8],
    opts: &HeaderOptions,
) -> Result<Unlocked> {
    use ucrypt_format::luks2::reencrypt::{Progress, Reencrypt};
    let device_str = device.display().to_string();
    let (act, _) = cd.persistent_flags()?;
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
        anyhow::anyhow!(
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
    let (Some(old_digest), Some(new_digest)) = (st.old.digest, st.new.digest) else {
        return Err(FormatError::NotSupported(format!(
            "opening {device_str} in the middle of a LUKS2 {} (part of it plaintext); finish \
             it first with `ucrypt reencrypt --resume-only`",
            if st.old.linear {
                "encryption"
            } else {
                "decryption"
            }
        ))
        .into());
    };
    let (slot, old_key) = key_of(old_digest)?;
    let (_, new_key) = key_of(new_digest)?;
    st.verify(&header.json, old_key.as_bytes(), new_key.as_bytes())?;
    let line =
        |side: &luks2::reencrypt::Side, key: &VolumeKey, from: u64, to: u64| -> Result<TableLine> {
            Ok(TableLine {
                start: from / 512,
                length: (to - from) / 512,
                cipher: ucrypt_crypto::CipherSpec::from_str(&side.encryption)?,
                key: KeySource::Hex(VolumeKey::new(key.as_bytes().to_vec())),
                iv_offset: side.iv_tweak + from / 512,
                device: DeviceRef::Path(device_str.clone()),
                offset: (side.offset + from) / 512,
                opts: opts_from(act, side.sector_size, opts.allow_discards),
            })
        };
    let mut parts = Vec::new();
    if done > 0 {
        parts.push((&st.new, &new_key, 0, done));
    }
    if done < size {
        parts.push((&st.old, &old_key, done, size));
    }
    // A header-only device (no data area) still unlocks, as in the one-segment case; the
    // engine refuses to serve the empty volume.
    if parts.is_empty() {
        parts.push((&st.old, &old_key, 0, 0));
    }
    let targets = parts
        .iter()
        .map(|&(side, key, from, to)| line(side, key, from, to).map(Target::Crypt))
        .collect::<Result<Vec<_>>>()?;
    Ok(Unlocked {
        mapping: Mapping::targets(targets),
        info,
        slot: Some(slot),
    })
}

/// A device that is an NBD URI: the header area is copied into a memfd of the device's size
/// ([`crate::remote_header`]) for libcryptsetup, and the table maps the URI itself.
fn unlock_remote(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    let uri = device.display().to_string();
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
    let copy = opts.header.is_none() && opts.kind != VolumeType::Plain;
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
    // maps as two crypt targets).
    for t in u.mapping.tables.iter_mut().flat_map(|t| &mut t.targets) {
        if let Target::Crypt(line) = t {
            if let DeviceRef::Path(_) = line.device {
                line.device = DeviceRef::Path(uri.clone());
            }
        }
    }
    Ok(u)
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
    let cipher = cipher_spec(&info, &device_str)?;
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
    let info = HeaderInfo {
        kind: Some(HeaderType::Plain),
        cipher: p.cipher.clone(),
        cipher_mode: String::new(),
        uuid: None,
        label: None,
        data_offset: p.offset,
        iv_offset: p.skip,
        key_bytes: key.len(),
        sector_size: p.sector_size,
    };
    let mapping = p.mapping(cipher, key, &device_str, real, opts.allow_discards)?;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{json, Value};

    /// The metadata `cryptsetup luksFormat --type luks2 -c aes-xts-plain64 -s 512` writes
    /// (keyslot area and KDF details trimmed: libcryptsetup owns them).
    fn base() -> Value {
        json!({
            "keyslots": {"0": {"type": "luks2", "key_size": 64,
                "af": {"type": "luks1", "stripes": 4000, "hash": "sha256"},
                "area": {"type": "raw", "offset": "32768", "size": "258048",
                         "encryption": "aes-xts-plain64", "key_size": 64},
                "kdf": {"type": "pbkdf2", "hash": "sha256", "iterations": 1000, "salt": "AA=="}}},
            "tokens": {},
            "segments": {"0": {"type": "crypt", "offset": "557056", "size": "dynamic",
                "iv_tweak": "0", "encryption": "aes-xts-plain64", "sector_size": 512}},
            "digests": {"0": {"type": "pbkdf2", "keyslots": ["0"], "segments": ["0"],
                "hash": "sha256", "iterations": 1000, "salt": "AA==", "digest": "AA=="}},
            "config": {"json_size": "12288", "keyslots_size": "524288"}
        })
    }

    fn info() -> HeaderInfo {
        HeaderInfo {
            kind: Some(HeaderType::Luks2),
            cipher: "aes".into(),
            cipher_mode: "xts-plain64".into(),
            uuid: None,
            label: None,
            data_offset: 557_056 / 512,
            iv_offset: 0,
            key_bytes: 64,
            sector_size: 512,
        }
    }

    /// The typed metadata of `text` (every row below parses; the checks refuse).
    fn meta(text: &str) -> Metadata {
        Metadata::parse(text).unwrap()
    }

    /// Sets `value` at the JSON pointer `path` (creating the last member), or removes it.
    fn with(path: &str, value: Option<Value>) -> String {
        let mut v = base();
        let (parent, last) = path.rsplit_once('/').unwrap();
        let obj = v.pointer_mut(parent).unwrap().as_object_mut().unwrap();
        match value {
            Some(x) => obj.insert(last.to_string(), x),
            None => obj.remove(last),
        };
        v.to_string()
    }

    /// One row per LUKS2 field that changes what a sector decrypts to: set it to something
    /// ucrypt does not implement, and the header must be refused naming the field.
    #[test]
    fn luks2_fields_ucrypt_does_not_implement_are_refused_by_name() {
        let info = info();
        let base_info = self::info();
        let ok = check_luks2_metadata(&meta(&base().to_string()), &info, "d").unwrap();
        assert_eq!(ok.size_bytes, None);
        assert_eq!(ok.digest_keyslots, vec![0]);
        let rows: Vec<(&str, Option<Value>, &str)> = vec![
            (
                "/segments/0/integrity",
                Some(
                    json!({"type": "hmac(sha256)", "journal_encryption": "none", "journal_integrity": "none"}),
                ),
                "segments.0.integrity is {\"type\": \"hmac(sha256)\"}",
            ),
            (
                "/segments/0/integrity",
                Some(json!({"type": "aead"})),
                "authenticated encryption",
            ),
            (
                "/segments/0/type",
                Some(json!("linear")),
                "segments.0.type is \"linear\"",
            ),
            (
                "/segments/0/type",
                Some(json!("hw-opal-crypt")),
                "segments.0.type is \"hw-opal-crypt\"",
            ),
            (
                "/segments/0/flags",
                Some(json!(["backup-previous"])),
                "segments.0.flags",
            ),
            (
                "/segments/0/flags",
                Some(json!(["in-reencryption"])),
                "in-reencryption",
            ),
            (
                "/segments/0/encryption",
                Some(json!("aes-cbc-essiv:sha256")),
                "segments.0.encryption \"aes-cbc-essiv:sha256\"",
            ),
            (
                "/segments/0/sector_size",
                Some(json!(8192)),
                "segments.0.sector_size is 8192",
            ),
            (
                "/segments/0/sector_size",
                Some(json!(4096)),
                "segments.0.sector_size is 4096",
            ),
            (
                "/segments/0/sector_size",
                Some(json!(520)),
                "segments.0.sector_size is 520",
            ),
            (
                "/segments/0/offset",
                Some(json!("557057")),
                "segments.0.offset 557057",
            ),
            (
                "/segments/0/offset",
                Some(json!("x")),
                "segments.0.offset is \"x\"",
            ),
            (
                "/segments/0/iv_tweak",
                Some(json!("8")),
                "segments.0.iv_tweak 8",
            ),
            (
                "/segments/0/size",
                Some(json!("1000")),
                "segments.0.size 1000",
            ),
            ("/segments/0/size", Some(json!("0")), "segments.0.size 0"),
            (
                "/segments/1",
                Some(
                    json!({"type": "crypt", "offset": "0", "size": "dynamic", "iv_tweak": "0", "encryption": "aes-xts-plain64", "sector_size": 512}),
                ),
                "2 segments (0, 1)",
            ),
            ("/segments/0", None, "0 segments"),
            (
                "/config/requirements",
                Some(json!({"mandatory": ["online-reencrypt-v2"]})),
                "config.requirements.mandatory lists \"online-reencrypt-v2\"",
            ),
            (
                "/config/requirements",
                Some(json!({"mandatory": ["opal"]})),
                "\"opal\"",
            ),
            (
                "/config/flags",
                Some(json!(["allow-discards", "high-priority-future"])),
                "unknown flag \"high-priority-future\"",
            ),
            (
                "/digests/0/segments",
                Some(json!([])),
                "no digest covers segment 0",
            ),
            (
                "/keyslots/0/key_size",
                Some(json!(32)),
                "keyslots.0.key_size is 32",
            ),
            (
                "/keyslots/0/type",
                Some(json!("reencrypt")),
                "keyslots.0.type is \"reencrypt\"",
            ),
        ];
        for (path, value, want) in rows {
            let text = with(path, value.clone());
            let e = check_luks2_metadata(&meta(&text), &info, "d")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{path} = {value:?}: {e}");
            assert!(e.contains("ucrypt does not implement it"), "{e}");
        }
        // Fields that are honoured: a fixed size, known flags, unbound extra digests.
        let sized = check_luks2_metadata(
            &meta(&with("/segments/0/size", Some(json!("1048576")))),
            &info,
            "d",
        );
        assert_eq!(sized.unwrap().size_bytes, Some(1 << 20));
        let flags = with(
            "/config/flags",
            Some(json!(["allow-discards", "no-read-workqueue"])),
        );
        check_luks2_metadata(&meta(&flags), &info, "d").unwrap();
        // A sector size libcryptsetup also reports is honoured (it becomes the table's).
        let info4k = HeaderInfo {
            sector_size: 4096,
            ..base_info
        };
        check_luks2_metadata(
            &meta(&with("/segments/0/sector_size", Some(json!(4096)))),
            &info4k,
            "d",
        )
        .unwrap();
    }

    #[test]
    fn null_ciphers_are_refused_unless_allowed_and_capi_keyslots_always() {
        let check = |v: &Value, info: &HeaderInfo, allow: bool| {
            refuse_unsafe_luks_ciphers(Some(&meta(&v.to_string())), info, "d", allow)
                .map_err(|e| e.to_string())
        };
        assert!(check(&base(), &info(), false).is_ok());
        for null in ["cipher_null-ecb", "null"] {
            let mut v = base();
            v["keyslots"]["0"]["area"]["encryption"] = null.into();
            let e = check(&v, &info(), false).unwrap_err();
            assert!(e.contains("keyslot 0 uses the null cipher"), "{e}");
            assert!(check(&v, &info(), true).is_ok());
        }
        let mut v = base();
        v["segments"]["0"]["encryption"] = "capi:ecb(cipher_null)".into();
        let e = check(&v, &info(), false).unwrap_err();
        assert!(e.contains("data segment 0 uses the null cipher"), "{e}");
        let mut v = base();
        v["segments"]["0"]["encryption"] = "cipher_null-ecb".into();
        let e = check(&v, &info(), false).unwrap_err();
        assert!(e.contains("data segment 0 uses the null cipher"), "{e}");
        assert!(check(&v, &info(), true).is_ok());
        let mut v = base();
        v["keyslots"]["0"]["area"]["encryption"] = "capi:xts(aes)-plain64".into();
        assert!(check(&v, &info(), true)
            .unwrap_err()
            .contains("kernel crypto API"));
        // LUKS1: one cipher for keyslots and data, from the binary header.
        let luks1 = HeaderInfo {
            kind: Some(HeaderType::Luks1),
            cipher: "cipher_null".into(),
            cipher_mode: "ecb".into(),
            ..info()
        };
        let e = refuse_unsafe_luks_ciphers(None, &luks1, "d", false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the keyslots and data uses the null cipher"),
            "{e}"
        );
        assert!(refuse_unsafe_luks_ciphers(None, &luks1, "d", true).is_ok());
    }
}
