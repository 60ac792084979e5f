//! Mapping a LUKS1 or LUKS2 header as cryptsetup does, from what core read and unlocked:
//! the checks every header field that changes the data must pass
//! ([`check_luks2_metadata`], [`refuse_unsafe_ciphers`], [`cipher_spec`]), and the table
//! lines cryptsetup gives the kernel: one crypt segment ([`segment_mapping`]), or the
//! targets of a volume in the middle of a reencryption, one per data segment, crypt or
//! linear ([`reencrypting_mapping`]).
//! Pure functions of the parsed header, the volume key and values core passes in (the
//! device size, only where the mapping runs to the device's end); core keeps the I/O,
//! libcryptsetup and the key derivation.
//!
//! ```text
//!  VolumeInfo (libcryptsetup's view) + luks2::Metadata ─► check_luks2_metadata ─► Luks2Segment
//!  VolumeInfo + volume key + segment/device size      ─► segment_mapping      ─► Mapping (1 line)
//!  luks2::Metadata's data segments + unlocked keys    ─► reencrypting_mapping ─► Mapping (crypt | linear)
//! ```

use crate::luks2::{self, ActivationFlags, Metadata};
use crate::{DeviceRef, FormatError, KeySource, Mapping, TableLine, Target, VolumeInfo};
use ucrypt_crypto::{CipherSpec, VolumeKey};

/// LUKS2 persistent flags (`config.flags`) ucrypt knows: the first five become table
/// options ([`ActivationFlags::table_options`]); `no-journal` only concerns dm-integrity
/// (its mode D instead of J), so on a plain crypt segment it changes nothing.
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
    /// `integrity.type` of an authenticated segment (`hmac(sha256)`, `aead`, `poly1305`):
    /// dm-crypt over dm-integrity ([`integrity_mapping`]).
    pub integrity: Option<String>,
    /// The persistent flag `no-journal`: dm-integrity in direct mode (D).
    pub no_journal: bool,
}

/// The `integrity.type` values ucrypt maps (what cryptsetup's `--integrity` writes).
const INTEGRITY_TYPES: [&str; 5] = [
    "hmac(sha1)",
    "hmac(sha256)",
    "hmac(sha512)",
    "aead",
    "poly1305",
];

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
pub fn check_luks2_metadata(
    v: &Metadata,
    info: &VolumeInfo,
    device: &str,
) -> Result<Luks2Segment, FormatError> {
    use crate::luks2::metadata::quoted;
    let refuse = |what: String| -> FormatError {
        FormatError::Refused(format!(
            "LUKS2 header on {device}: {what}; ucrypt does not implement it and will not map \
             this volume (serving it as plain dm-crypt would give wrong data)"
        ))
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
    let integrity = match &seg.integrity {
        None => None,
        Some(i) => {
            let kind = i.kind.as_deref().unwrap_or("");
            if !INTEGRITY_TYPES.contains(&kind) {
                return Err(refuse(format!(
                    "segments.0.integrity.type is {} (implemented: {})",
                    i.kind.as_deref().map_or_else(|| "null".into(), quoted),
                    INTEGRITY_TYPES.join(", ")
                )));
            }
            for (field, v) in [
                ("journal_encryption", &i.journal_encryption),
                ("journal_integrity", &i.journal_integrity),
            ] {
                if let Some(other) = v.as_deref().filter(|v| *v != "none") {
                    return Err(refuse(format!(
                        "segments.0.integrity.{field} is {} (only \"none\" is implemented)",
                        quoted(other)
                    )));
                }
            }
            Some(kind.to_string())
        }
    };
    if let Some(flags) = seg.flags.as_ref().filter(|f| !f.is_empty()) {
        let names: Vec<String> = flags.iter().map(|n| quoted(n)).collect();
        return Err(refuse(format!(
            "segments.0.flags is [{}]",
            names.join(", ")
        )));
    }
    let num = |field: &str, n: Option<&luks2::Number>| -> Result<u64, FormatError> {
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
    let no_journal = v
        .config
        .flags
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == "no-journal"));
    Ok(Luks2Segment {
        size_bytes,
        digest_keyslots,
        integrity,
        no_journal,
    })
}

/// The cipher of the data segment, refused when it names a kernel crypto driver
/// (`capi:...-generic`) rather than a cipher.
///
/// # Errors
/// [`FormatError::Refused`] for a driver name; the crypto layer's error (after "header on
/// DEVICE: cipher ...") for a spec it does not implement.
pub fn cipher_spec(info: &VolumeInfo, device: &str) -> Result<CipherSpec, FormatError> {
    let spec = info.cipher_spec();
    if spec.starts_with("capi:") && spec.contains("-generic") {
        return Err(FormatError::Refused(format!(
            "header on {device} names a kernel crypto driver (\"{spec}\"), not a cipher; \
             cryptsetup refuses to activate it and so does ucrypt"
        )));
    }
    spec.parse().map_err(|e| FormatError::At {
        at: format!("header on {device}: cipher \"{spec}\""),
        source: Box::new(FormatError::Crypto(e)),
    })
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
pub fn refuse_unsafe_ciphers(
    luks2: Option<&Metadata>,
    info: &VolumeInfo,
    device: &str,
    allow_null_cipher: bool,
) -> Result<(), FormatError> {
    let null_refused = |what: String, spec: &str| -> FormatError {
        FormatError::Refused(format!(
            "LUKS header on {device}: {what} uses the null cipher \"{spec}\" (no encryption): \
             anyone who can write the header could have chosen the volume key or the data \
             (CVE-2025-59054); ucrypt refuses it as cryptsetup 2.8.1 does \
             (--insecure-allow-null-cipher opens it anyway)"
        ))
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
                )));
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

/// Checks the volume key a keyslot (`slot`) or the user gave: its size is the header's,
/// and for LUKS2 (`segment`) the keyslot is bound to a digest of segment 0.
///
/// # Errors
/// [`FormatError::Rule`] for the size, [`FormatError::Refused`] naming an unbound keyslot.
pub fn check_key(
    info: &VolumeInfo,
    key: &VolumeKey,
    segment: Option<&Luks2Segment>,
    slot: Option<u32>,
    device: &str,
) -> Result<(), FormatError> {
    if key.len() != info.key_bytes {
        return Err(FormatError::Rule(format!(
            "the volume key of {device} is {} bytes but the header says {}",
            key.len(),
            info.key_bytes
        )));
    }
    if let (Some(seg), Some(slot)) = (segment, slot) {
        if !seg.digest_keyslots.contains(&slot) {
            return Err(FormatError::Refused(format!(
                "LUKS2 header on {device}: keyslot {slot} is not bound to a digest of \
                 segment 0; its key does not decrypt the data"
            )));
        }
    }
    Ok(())
}

/// The one crypt line cryptsetup maps for a LUKS1 header or a LUKS2 header of one data
/// segment: `cipher` and `key` over `device` from the data offset, IVs from the IV offset,
/// the persistent flags (and `--allow-discards`) as options. Its length is the segment's
/// fixed size (`segment_bytes`) or, for a `dynamic` segment, the device's size
/// (`device_bytes`, which core reads only then) less the data offset.
///
/// The key is checked by [`check_key`] first.
///
/// # Errors
/// A device that ends before the data offset, a dynamic segment without the device size.
pub fn segment_mapping(
    info: &VolumeInfo,
    cipher: CipherSpec,
    key: VolumeKey,
    device: &str,
    segment_bytes: Option<u64>,
    device_bytes: Option<u64>,
    allow_discards: bool,
) -> Result<Mapping, FormatError> {
    let length = match (segment_bytes, device_bytes) {
        (Some(b), _) => b / 512,
        (None, Some(bytes)) => {
            let total = bytes / 512;
            if total < info.data_offset {
                return Err(FormatError::Rule(format!(
                    "device {device} ({total} sectors) ends before the data offset {} sectors",
                    info.data_offset
                )));
            }
            // total == data offset: a header-only device; unlocking works, opening the
            // (empty) volume is refused by the engine.
            total - info.data_offset
        }
        (None, None) => {
            return Err(FormatError::Rule(format!(
                "the data segment of {device} runs to the device's end, whose size is not known"
            )))
        }
    };
    Ok(Mapping::single(TableLine {
        start: 0,
        length,
        cipher,
        key: KeySource::Hex(key),
        iv_offset: info.iv_offset,
        device: DeviceRef::from(device),
        offset: info.data_offset,
        opts: with_discards(info.flags, allow_discards).table_options(info.sector_size),
    }))
}

/// The kernel's cipher and tag size of a LUKS2 segment with `integrity.type` `integrity`,
/// as cryptsetup builds them from the segment's `encryption` (libcryptsetup's view, `info`):
/// `aes-xts-plain64` with `hmac(sha256)` is `capi:authenc(hmac(sha256),xts(aes))-plain64`
/// with a 32-byte tag; `aes-gcm-random` with `aead` is `capi:gcm(aes)-random`,
/// `chacha20-random` with `poly1305` is `capi:rfc7539(chacha20,poly1305)-random`, both with
/// a 28-byte tag (16 of authentication tag, then the 12-byte random IV).
///
/// # Errors
/// A combination cryptsetup does not make or ucrypt does not serve.
pub fn aead_cipher_spec(
    info: &VolumeInfo,
    integrity: &str,
    device: &str,
) -> Result<(CipherSpec, u32), FormatError> {
    aead_spec_of(
        &info.cipher_spec(),
        integrity,
        &format!("LUKS2 header on {device}"),
    )
}

/// [`aead_cipher_spec`] of the segment cipher `enc` (cryptsetup's spelling,
/// `aes-xts-plain64`) with `integrity.type` `integrity`; `what` names the header in errors.
/// `luksFormat --integrity` decides with it what it may write, so that what ucrypt formats
/// is what it opens.
///
/// # Errors
/// A combination cryptsetup does not make or ucrypt does not serve, by name.
pub fn aead_spec_of(
    enc: &str,
    integrity: &str,
    what: &str,
) -> Result<(CipherSpec, u32), FormatError> {
    let refuse = |why: &str| {
        FormatError::Refused(format!(
            "{what}: the cipher \"{enc}\" with integrity \"{integrity}\": {why}"
        ))
    };
    let (cipher, rest) = enc
        .split_once('-')
        .ok_or_else(|| refuse("no cipher mode"))?;
    let (mode, iv) = rest.split_once('-').unwrap_or((rest, ""));
    let (text, iv_name) = match integrity {
        "poly1305" if cipher == "chacha20" && rest == "random" => (
            "capi:rfc7539(chacha20,poly1305)-random".to_string(),
            "random",
        ),
        "poly1305" => return Err(refuse("poly1305 goes with chacha20-random")),
        "aead" => (format!("capi:{mode}({cipher})-{iv}"), iv),
        hmac => (format!("capi:authenc({hmac},{mode}({cipher}))-{iv}"), iv),
    };
    let auth = match integrity {
        "hmac(sha1)" => 20,
        "hmac(sha256)" => 32,
        "hmac(sha512)" => 64,
        _ => 16,
    };
    let spec: CipherSpec = text.parse().map_err(|e| FormatError::At {
        at: format!("{what}: cipher \"{enc}\" with integrity \"{integrity}\""),
        source: Box::new(FormatError::Crypto(e)),
    })?;
    let stored_iv = if iv_name == "random" {
        spec.iv_size()
    } else {
        0
    };
    Ok((spec, auth + stored_iv as u32))
}

/// The two tables cryptsetup maps for a LUKS2 segment with integrity: a dm-integrity
/// table on `device` from the data offset, whose superblock is `sb` (`device_bytes` the
/// device's size), with external tags of `tag` bytes, in mode J (D with `no_journal`),
/// printed with the values the kernel prints; and the crypt table on it with
/// `integrity:TAG:aead`. The crypt target maps what dm-integrity provides (or the
/// segment's fixed size, which must fit).
///
/// # Errors
/// A superblock whose tag or block size differs from the segment's, a device too small.
#[allow(clippy::too_many_arguments)]
pub fn integrity_mapping(
    info: &VolumeInfo,
    cipher: CipherSpec,
    tag: u32,
    key: VolumeKey,
    device: &str,
    sb: &crate::integrity::Superblock,
    device_bytes: u64,
    segment: &Luks2Segment,
    allow_discards: bool,
) -> Result<Mapping, FormatError> {
    use crate::integrity::{Flags, Geometry, IntegrityLine, DEFAULT_BUFFER_SECTORS};
    let rule = |m: String| FormatError::Rule(format!("LUKS2 volume on {device}: {m}"));
    if u32::from(sb.tag_size) != tag {
        return Err(rule(format!(
            "the dm-integrity superblock's tag is {} bytes, the segment's cipher needs {tag}",
            sb.tag_size
        )));
    }
    if sb.block_bytes() != info.sector_size {
        return Err(rule(format!(
            "the dm-integrity block is {} bytes, the segment's sector {}",
            sb.block_bytes(),
            info.sector_size
        )));
    }
    let total = (device_bytes / 512)
        .checked_sub(info.data_offset)
        .ok_or_else(|| rule("the device ends before the data offset".into()))?;
    let geo = Geometry::new(sb, total, DEFAULT_BUFFER_SECTORS)?;
    let provided = sb.provided_data_sectors;
    let length = match segment.size_bytes {
        Some(b) if b / 512 > provided => {
            return Err(rule(format!(
                "the segment is {} sectors, dm-integrity provides {provided}",
                b / 512
            )))
        }
        Some(b) => b / 512,
        None => provided,
    };
    let journal = !segment.no_journal;
    let dif = IntegrityLine {
        start: 0,
        length: provided,
        device: DeviceRef::from(device),
        offset: info.data_offset,
        tag_size: Some(tag),
        mode: if journal { 'J' } else { 'D' },
        meta_device: None,
        journal_sectors: u32::try_from(geo.journal.sectors()).ok(),
        interleave_sectors: Some(1 << sb.log2_interleave_sectors),
        buffer_sectors: Some(1 << geo.log2_buffer_sectors),
        journal_watermark: journal.then_some(crate::integrity::DEFAULT_JOURNAL_WATERMARK),
        commit_time: journal.then_some(10000),
        block_size: (sb.block_bytes() != 512).then_some(sb.block_bytes()),
        sectors_per_bit: None,
        bitmap_flush_interval: None,
        internal_hash: None,
        journal_crypt: None,
        journal_mac: None,
        recalculate: false,
        fix_padding: sb.flags.has(Flags::FIXED_PADDING),
        fix_hmac: sb.flags.has(Flags::FIXED_HMAC),
        legacy_recalculate: false,
    };
    let mut opts = with_discards(info.flags, allow_discards).table_options(info.sector_size);
    opts.push(crate::OptParam::Integrity(tag));
    opts.sort();
    let crypt = TableLine {
        start: 0,
        length,
        cipher,
        key: KeySource::Hex(key),
        iv_offset: info.iv_offset,
        device: DeviceRef::Layer(0),
        offset: 0,
        opts,
    };
    Ok(Mapping {
        tables: vec![
            crate::mapping::Table::one(Target::Integrity(dif)),
            crate::mapping::Table::one(Target::Crypt(crypt)),
        ],
    })
}

/// The persistent flags, with `--allow-discards` added.
fn with_discards(flags: ActivationFlags, allow_discards: bool) -> ActivationFlags {
    ActivationFlags {
        allow_discards: flags.allow_discards || allow_discards,
        ..flags
    }
}

/// A LUKS2 volume in the middle of a reencryption, mapped as cryptsetup maps it
/// (`LUKS2_assembly_multisegment_dmd`): one target per data segment (the segments without
/// a `backup-*` flag), in segment order, end to end from sector 0, on `device`. A `crypt`
/// segment becomes a crypt target with the key of its digest (from `keys`: digest id and
/// key), its cipher, `iv_tweak`, offset and sector size; a `linear` segment (the plaintext
/// of an encryption or decryption, the moved copy of a data shift) a linear target at its
/// offset. A fixed size is the segment's own; `dynamic` (the last segment only) runs to the
/// end of the device of `device_bytes` bytes (the data area's end as cryptsetup computes
/// it, also where the data moved: a decryption with a data shift maps its part still
/// encrypted where it always was).
///
/// ```text
///  re-keying:   0: crypt new key [0, P)  1: crypt old key [P, end) dynamic
///  encryption:  0: crypt new key [0, P)  1: linear [P, end)             (forward)
///  decryption:  0: crypt old key [0, L)  1: linear [L, end)             (backward)
///  data shift:  0: linear moved copy  [1: linear rest]  2: crypt new key (fixed sizes)
/// ```
///
/// # Errors
/// A hotzone segment (a crash not recovered), segment ids that are not 0, 1, ... in
/// order, a `dynamic` segment that is not the last, a segment type other than crypt and
/// linear, a crypt segment without a key in `keys`, a cipher the crypto layer does not
/// implement.
pub fn reencrypting_mapping(
    meta: &Metadata,
    device_bytes: u64,
    keys: &[(u32, &VolumeKey)],
    device: &str,
    flags: ActivationFlags,
    allow_discards: bool,
) -> Result<Mapping, FormatError> {
    let flags = with_discards(flags, allow_discards);
    let bad = |reason: String| FormatError::Header {
        what: "LUKS2 reencryption segments".into(),
        reason,
    };
    let live: Vec<(u32, &luks2::metadata::Segment)> = meta
        .segments
        .iter()
        .filter(|(_, s)| !s.flags.iter().flatten().any(|f| f.starts_with("backup-")))
        .map(|(id, s)| (*id, s))
        .collect();
    if live.is_empty() {
        return Err(bad("no data segment".into()));
    }
    let mut targets = Vec::with_capacity(live.len());
    let mut at = 0u64; // bytes
    for (i, &(id, seg)) in live.iter().enumerate() {
        let path = format!("segments.{id}");
        if id as usize != i {
            return Err(bad(format!(
                "{path} is data segment {i}: the data segments are not numbered 0, 1, ..."
            )));
        }
        if seg.flags.iter().flatten().any(|f| f == "in-reencryption") {
            return Err(bad(format!(
                "{path} is a hotzone left by an interrupted reencryption (not recovered)"
            )));
        }
        let offset = seg.offset.get().filter(|o| o % 512 == 0).ok_or_else(|| {
            bad(format!(
                "{path}.offset {} is not a sector offset",
                seg.offset
            ))
        })?;
        let last = i + 1 == live.len();
        let size = match seg.size.get() {
            Some(n) if n % 512 == 0 => n,
            None if seg.size.is("dynamic") && last => {
                device_bytes.checked_sub(offset).ok_or_else(|| {
                    bad(format!(
                        "{path} starts at byte {offset}, past the end of the \
                         {device_bytes}-byte device"
                    ))
                })?
            }
            _ => {
                return Err(bad(format!(
                    "{path}.size {} is not a sector count{}",
                    seg.size,
                    if last {
                        ""
                    } else {
                        " (only the last segment may be dynamic)"
                    }
                )))
            }
        };
        let (start, length) = (at / 512, size / 512);
        targets.push(match seg.kind.as_str() {
            "crypt" => {
                let key = meta
                    .digests
                    .iter()
                    .filter(|(_, d)| d.segments.contains(&id))
                    .find_map(|(d, _)| keys.iter().find(|(k, _)| k == d).map(|(_, key)| *key))
                    .ok_or_else(|| bad(format!("no key unlocked for the crypt {path}")))?;
                let cipher = seg
                    .encryption
                    .as_deref()
                    .ok_or_else(|| bad(format!("{path} has no encryption")))?;
                let sector_size = seg
                    .sector_size
                    .as_ref()
                    .and_then(luks2::metadata::Number::get)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad(format!("{path} has no sector_size")))?;
                let iv_tweak = seg
                    .iv_tweak
                    .as_ref()
                    .and_then(luks2::metadata::Number::get)
                    .ok_or_else(|| bad(format!("{path} has no iv_tweak")))?;
                Target::Crypt(TableLine {
                    start,
                    length,
                    cipher: cipher.parse()?,
                    key: KeySource::Hex(VolumeKey::new(key.as_bytes().to_vec())),
                    iv_offset: iv_tweak,
                    device: DeviceRef::from(device),
                    offset: offset / 512,
                    opts: flags.table_options(sector_size),
                })
            }
            "linear" => Target::Linear {
                start,
                length,
                device: DeviceRef::from(device),
                offset: offset / 512,
            },
            other => {
                return Err(bad(format!(
                    "{path} is of type {}, neither crypt nor linear",
                    luks2::metadata::quoted(other)
                )))
            }
        });
        at = at
            .checked_add(size)
            .ok_or_else(|| bad("segment sizes overflow".into()))?;
    }
    Ok(Mapping::targets(targets))
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

    fn info() -> VolumeInfo {
        VolumeInfo {
            kind: Some(crate::HeaderType::Luks2),
            cipher: "aes".into(),
            cipher_mode: "xts-plain64".into(),
            uuid: None,
            label: None,
            data_offset: 557_056 / 512,
            iv_offset: 0,
            key_bytes: 64,
            sector_size: 512,
            flags: ActivationFlags::default(),
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
                Some(json!({"type": "cmac(aes)", "journal_encryption": "none"})),
                "segments.0.integrity.type is \"cmac(aes)\"",
            ),
            (
                "/segments/0/integrity",
                Some(json!(null)),
                "segments.0.integrity.type is null",
            ),
            (
                "/segments/0/integrity",
                Some(json!({"type": "aead", "journal_encryption": "cbc(aes)"})),
                "segments.0.integrity.journal_encryption is \"cbc(aes)\"",
            ),
            (
                "/segments/0/integrity",
                Some(json!({"type": "hmac(sha256)", "journal_integrity": "hmac(sha256)"})),
                "segments.0.integrity.journal_integrity is \"hmac(sha256)\"",
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
        // Integrity as cryptsetup writes it is honoured, with no-journal as mode D.
        let seg = check_luks2_metadata(
            &meta(&with(
                "/segments/0/integrity",
                Some(json!({"type": "hmac(sha256)", "journal_encryption": "none", "journal_integrity": "none"})),
            )),
            &info,
            "d",
        )
        .unwrap();
        assert_eq!(seg.integrity.as_deref(), Some("hmac(sha256)"));
        assert!(!seg.no_journal);
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
        let info4k = VolumeInfo {
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
        let check = |v: &Value, info: &VolumeInfo, allow: bool| {
            refuse_unsafe_ciphers(Some(&meta(&v.to_string())), info, "d", allow)
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
        let luks1 = VolumeInfo {
            kind: Some(crate::HeaderType::Luks1),
            cipher: "cipher_null".into(),
            cipher_mode: "ecb".into(),
            ..info()
        };
        let e = refuse_unsafe_ciphers(None, &luks1, "d", false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the keyslots and data uses the null cipher"),
            "{e}"
        );
        assert!(refuse_unsafe_ciphers(None, &luks1, "d", true).is_ok());
    }

    /// A volume mid-reencryption maps as cryptsetup's `LUKS2_assembly_multisegment_dmd`:
    /// one target per data segment (backups skipped), crypt with its digest's key, linear
    /// at its offset, `dynamic` to the data area's end; what it cannot map is refused.
    #[test]
    fn reencrypting_mapping_has_one_target_per_data_segment() {
        let m = 1u64 << 20;
        let crypt = |off: u64, size: Value, iv: u64, flags: Value| {
            json!({"type": "crypt", "offset": off.to_string(), "size": size,
                   "iv_tweak": iv.to_string(), "encryption": "aes-xts-plain64",
                   "sector_size": 4096, "flags": flags})
        };
        let linear = |off: u64, size: Value, flags: Value| json!({"type": "linear", "offset": off.to_string(), "size": size, "flags": flags});
        let doc = |segments: Value, digests: Value| {
            let mut v = base();
            v["segments"] = segments;
            v["digests"] = digests;
            meta(&v.to_string())
        };
        let digest = |segs: &[&str]| {
            json!({"type": "pbkdf2", "keyslots": ["0"], "segments": segs, "hash": "sha256",
                   "iterations": 1000, "salt": "AA==", "digest": "AA=="})
        };
        let (old, new) = (VolumeKey::new(vec![1; 64]), VolumeKey::new(vec![2; 64]));
        let keys = [(0, &old), (1, &new)];
        let lines = |md: &Metadata, keys: &[(u32, &VolumeKey)]| {
            reencrypting_mapping(md, 16 * m, keys, "d", ActivationFlags::default(), false)
                .map(|mp| mp.to_lines(false))
        };
        let none = json!([]);
        // Re-keying, 8 MiB done (data at 16 MiB): new key, then old key to the end.
        let rekey = doc(
            json!({"0": crypt(16 * m, json!("8388608"), 0, none.clone()),
                   "1": crypt(24 * m, json!("dynamic"), 16384, none.clone()),
                   "2": crypt(16 * m, json!("dynamic"), 0, json!(["backup-previous"])),
                   "3": crypt(16 * m, json!("dynamic"), 0, json!(["backup-final"]))}),
            json!({"0": digest(&["1", "2"]), "1": digest(&["0", "3"])}),
        );
        let mp = reencrypting_mapping(
            &rekey,
            32 * m,
            &keys,
            "d",
            ActivationFlags::default(),
            false,
        )
        .unwrap();
        assert_eq!(
            mp.to_lines(false),
            [
                "0 16384 crypt aes-xts-plain64 <key:64-bytes> 0 d 32768 1 sector_size:4096",
                "16384 16384 crypt aes-xts-plain64 <key:64-bytes> 16384 d 49152 1 sector_size:4096"
            ]
        );
        let shown = mp.to_lines(true);
        assert!(shown[0].contains(&"02".repeat(64)) && shown[1].contains(&"01".repeat(64)));
        // Encryption (forward) and decryption (backward): crypt, then linear.
        let enc = doc(
            json!({"0": crypt(0, json!("4194304"), 0, none.clone()),
                   "1": linear(4 * m, json!("dynamic"), none.clone()),
                   "2": linear(0, json!("dynamic"), json!(["backup-previous"])),
                   "3": crypt(0, json!("dynamic"), 0, json!(["backup-final"]))}),
            json!({"0": digest(&["0", "3"])}),
        );
        assert_eq!(
            lines(&enc, &[(0, &new)]).unwrap(),
            [
                "0 8192 crypt aes-xts-plain64 <key:64-bytes> 0 d 0 1 sector_size:4096",
                "8192 24576 linear d 8192"
            ]
        );
        // A data shift: all sizes fixed, linear parts first.
        let shift = doc(
            json!({"0": linear(20 * m, json!("4194304"), none.clone()),
                   "1": linear(4 * m, json!("4194304"), none.clone()),
                   "2": crypt(12 * m, json!("8388608"), 16384, none.clone()),
                   "3": linear(20 * m, json!("4194304"), json!(["backup-moved-segment"]))}),
            json!({"0": digest(&["2"])}),
        );
        assert_eq!(
            lines(&shift, &[(0, &new)]).unwrap(),
            [
                "0 8192 linear d 40960",
                "8192 8192 linear d 8192",
                "16384 16384 crypt aes-xts-plain64 <key:64-bytes> 16384 d 24576 1 sector_size:4096"
            ]
        );
        // A decryption with a data shift (attached header exported): the part still
        // encrypted is where it always was, its dynamic segment runs to the device's end.
        let unshift = doc(
            json!({"0": crypt(0, json!("8388608"), 0, none.clone()),
                   "1": linear(8 * m, json!("8388608"), none.clone()),
                   "2": crypt(24 * m, json!("dynamic"), 32768, none.clone())}),
            json!({"0": digest(&["0", "2"])}),
        );
        assert_eq!(
            reencrypting_mapping(
                &unshift,
                48 * m,
                &[(0, &old)],
                "d",
                ActivationFlags::default(),
                false
            )
            .unwrap()
            .to_lines(false)[2],
            "32768 49152 crypt aes-xts-plain64 <key:64-bytes> 32768 d 49152 1 sector_size:4096"
        );
        // Refused: a crypt segment without its key, a hotzone, a dynamic segment before
        // the last, ids with a hole, another type.
        let e = lines(&enc, &[(5, &new)]).unwrap_err().to_string();
        assert!(
            e.contains("no key unlocked for the crypt segments.0"),
            "{e}"
        );
        let bad = [
            (
                json!({"0": crypt(0, json!("4194304"), 0, json!(["in-reencryption"])),
                       "1": linear(4 * m, json!("dynamic"), none.clone())}),
                "hotzone",
            ),
            (
                json!({"0": crypt(0, json!("dynamic"), 0, none.clone()),
                       "1": linear(4 * m, json!("dynamic"), none.clone())}),
                "only the last segment may be dynamic",
            ),
            (
                json!({"0": crypt(0, json!("4194304"), 0, none.clone()),
                       "2": linear(4 * m, json!("dynamic"), none.clone())}),
                "not numbered",
            ),
            (
                json!({"0": json!({"type": "hw-opal", "offset": "0", "size": "dynamic"})}),
                "neither crypt nor linear",
            ),
        ];
        for (segs, want) in bad {
            let md = doc(segs, json!({"0": digest(&["0"])}));
            let e = lines(&md, &[(0, &new)]).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
