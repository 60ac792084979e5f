//! `luksFormat`'s decisions: which header a request makes ([`plan`]: the type, the volume
//! key's size, the PBKDF, authenticated encryption with `--integrity`, and what is refused
//! before anything is written), the header written through libcryptsetup
//! ([`Plan::prepare`], [`Plan::write`]) and, for `--integrity`, the dm-integrity superblock
//! below it and the volume that the initial wipe writes through ([`wipe_target`]).
//!
//! cryptsetup 2.6.1 formats a LUKS2 volume with integrity in three steps: `crypt_format`
//! writes the header (its data segment carries an `integrity` object: `type`,
//! `journal_encryption` and `journal_integrity` "none"), the kernel formats the
//! dm-integrity superblock when libcryptsetup activates a temporary device over the zeroed
//! data offset (`INTEGRITY_format`: external tags of the cipher's tag size, the crypt
//! sector size as the block, the kernel's default journal and interleave, `fix_padding`
//! unless `--integrity-legacy-padding`), and the command wipes the whole device through a
//! temporary dm-crypt with `CRYPT_ACTIVATE_NO_JOURNAL` so that every tag is valid. ucrypt
//! has no device mapper: libcryptsetup writes the header with a wrapped-key stand-in for the
//! cipher (`paes-xts-plain64`: the same keyslot choice, `aes-xts-plain64` with a 512-bit
//! key, and no kernel cipher check), the segment's `encryption` and `integrity` are then set
//! in both header copies under the same `seqid` (so the epoch is cryptsetup's), ucrypt
//! writes the superblock and journal as the kernel does (`ucrypt_integrity::format`), and
//! the wipe goes through ucrypt's own AEAD volume over dm-integrity in direct mode.
//!
//! ```text
//!   plan(Request) ─► Plan ─► prepare(cd) ─► [CLI: PBKDF benchmark] ─► write(cd, ...)
//!                                             header + keyslot (libcryptsetup)
//!                                             + integrity: segment patched, superblock
//!   wipe_target(device, key) ─► the volume in direct mode + its chunk size ─► [CLI: fill]
//! ```

use super::keyslots::KeyslotCipher;
use super::{CryptDevice, LuksFormat, Pbkdf, VolumeKey};
use crate::error::{Error, Result};
use crate::header::{HeaderOptions, Unlocked, VolumeType};
use std::path::Path;
use std::sync::Arc;
use ucrypt_backend::Backend;

/// The wrapped-key cipher libcryptsetup is given in place of an authenticated one: it
/// skips the kernel cipher check for any key size and picks the keyslot cipher cryptsetup
/// picks for integrity (`aes-xts-plain64`, 512 bits).
const STAND_IN_CIPHER: &str = "paes-xts-plain64";

/// cryptsetup's keyslot encryption for a segment with integrity
/// (`DEFAULT_LUKS2_KEYSLOT_CIPHER`, `DEFAULT_LUKS2_KEYSLOT_KEYBITS`).
const INTEGRITY_KEYSLOT_CIPHER: (&str, usize) = ("aes-xts-plain64", 64);

/// What `luksFormat` was asked for (the command's options, parsed).
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// LUKS2 (`--type luks2`, the default) or LUKS1.
    pub luks2: bool,
    /// `--cipher` (`aes-xts-plain64`, `aes-gcm-random`, `chacha20-random`).
    pub cipher: String,
    /// `--key-size` in bits: the cipher's key; with `--integrity`, the integrity key is
    /// added to it (cryptsetup's `get_adjusted_key_size`).
    pub key_bits: Option<u32>,
    /// `--pbkdf` (default argon2id for LUKS2, pbkdf2 for LUKS1).
    pub pbkdf: Option<String>,
    /// `--hash`.
    pub hash: Option<String>,
    /// `--pbkdf-force-iterations`.
    pub pbkdf_iterations: Option<u32>,
    /// `--iter-time` (ms).
    pub pbkdf_time_ms: Option<u32>,
    /// `--pbkdf-memory` (KiB).
    pub pbkdf_memory_kb: Option<u32>,
    /// `--pbkdf-parallel`.
    pub pbkdf_parallel: Option<u32>,
    /// `--label` or `--subsystem` given.
    pub labels: bool,
    /// `--luks2-metadata-size`.
    pub metadata_size: Option<u64>,
    /// `--luks2-keyslots-size`.
    pub keyslots_size: Option<u64>,
    /// `--use-random` (true) or `--use-urandom` (false); none: libcryptsetup's default.
    pub rng_random: Option<bool>,
    /// `--offset` in 512-byte sectors.
    pub offset: Option<u64>,
    /// `--integrity` as given (`hmac-sha256`, `hmac-sha512`, `hmac-sha1`, `aead`,
    /// `poly1305`, `none`).
    pub integrity: Option<String>,
    /// `--integrity-legacy-padding`: the dm-integrity superblock without `fix_padding`.
    pub integrity_legacy_padding: bool,
    /// `--integrity-no-wipe`: leave the tags invalid (every unwritten sector fails to read).
    pub integrity_no_wipe: bool,
    /// The device or header is a remote (NBD) one.
    pub remote: bool,
}

/// The decisions for one `luksFormat` ([`plan`]).
#[derive(Debug, Clone)]
pub struct Plan {
    /// LUKS2 or LUKS1.
    pub luks2: bool,
    /// The whole volume key in bytes (the integrity key included).
    pub key_bytes: usize,
    /// The PBKDF of the first keyslot.
    pub pbkdf: Pbkdf,
    /// Authenticated encryption (`--integrity`, not `none`).
    pub integrity: Option<IntegrityPlan>,
}

/// A data segment with integrity: what its header, superblock and wipe need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityPlan {
    /// The segment's `integrity.type` (`hmac(sha256)`, `aead`, `poly1305`).
    pub kind: String,
    /// The integrity key's bytes at the end of the volume key (HMAC; 0 for AEAD).
    pub key_bytes: usize,
    /// dm-integrity's tag bytes per sector (authentication tag, then a random IV).
    pub tag_size: u32,
    /// The kernel's cipher (`capi:authenc(hmac(sha256),xts(aes))-plain64`).
    pub kernel_cipher: String,
    /// `fix_padding` left out (`--integrity-legacy-padding`).
    pub legacy_padding: bool,
    /// Wipe the device afterwards (not `--integrity-no-wipe`).
    pub wipe: bool,
}

fn invalid(m: impl Into<String>) -> Error {
    Error::Invalid(m.into())
}

/// cryptsetup's `crypt_parse_integrity_mode`: the segment's `integrity.type` and the
/// integrity key's size for `--integrity NAME`; `None` for `none`.
///
/// # Errors
/// A name cryptsetup does not know, or one it knows and ucrypt does not serve (`cmac-aes`).
pub fn parse_integrity(name: &str) -> Result<Option<(&'static str, usize)>> {
    Ok(Some(match name {
        "aead" => ("aead", 0),
        "poly1305" => ("poly1305", 0),
        "none" => return Ok(None),
        "hmac-sha1" => ("hmac(sha1)", 20),
        "hmac-sha256" => ("hmac(sha256)", 32),
        "hmac-sha512" => ("hmac(sha512)", 64),
        "cmac-aes" => {
            return Err(Error::Invalid(
                "--integrity cmac-aes (cmac(aes) tags): ucrypt serves hmac-sha1, hmac-sha256 \
                 and hmac-sha512 with aes-xts-plain64, aead with aes-gcm-random and poly1305 \
                 with chacha20-random"
                    .into(),
            ))
        }
        other => {
            return Err(invalid(format!(
                "--integrity {other}: no known integrity specification pattern (aead, \
                 poly1305, hmac-sha1, hmac-sha256, hmac-sha512, cmac-aes, none)"
            )))
        }
    }))
}

/// The IV part of a cryptsetup cipher spec (`random` of `aes-gcm-random`, `plain64` of
/// `aes-xts-plain64`).
fn iv_of(cipher: &str) -> &str {
    let rest = cipher.split_once('-').map_or("", |(_, r)| r);
    rest.rsplit_once('-').map_or(rest, |(_, iv)| iv)
}

/// Decides what `luksFormat` writes for `req`, refusing (before anything is written) what
/// cryptsetup refuses and what ucrypt could format but not serve.
///
/// # Errors
/// [`Error::Invalid`] for options that do not go together, sizes out of range, and a
/// cipher or integrity mode ucrypt does not serve (by name).
pub fn plan(req: &Request) -> Result<Plan> {
    if !req.luks2 {
        if req.pbkdf.as_deref().is_some_and(|p| p != "pbkdf2") {
            return Err(invalid(format!(
                "LUKS1 keyslots use pbkdf2 only (got --pbkdf {})",
                req.pbkdf.as_deref().unwrap_or_default()
            )));
        }
        if req.labels {
            return Err(invalid("--label and --subsystem need LUKS2"));
        }
        if req.metadata_size.is_some() || req.keyslots_size.is_some() {
            return Err(invalid(
                "unsupported LUKS2 metadata size options on LUKS1 (--luks2-metadata-size, \
                 --luks2-keyslots-size)",
            ));
        }
        if req.integrity.is_some() {
            return Err(invalid(
                "--integrity can be used only for LUKS2 format (cryptsetup's rule)",
            ));
        }
    }
    if let Some(bits) = req.key_bits {
        if bits == 0 || bits % 8 != 0 {
            return Err(invalid(format!(
                "--key-size {bits} is not a positive multiple of 8 bits"
            )));
        }
    }
    let integrity = match req.integrity.as_deref() {
        Some(name) => parse_integrity(name)?,
        None => None,
    };
    // cryptsetup's get_adjusted_key_size: 512 bits for an XTS mode, else 256, plus the
    // integrity key.
    let cipher_bits = req
        .key_bits
        .unwrap_or(if req.cipher.contains("xts") { 512 } else { 256 });
    let int_key = integrity.map_or(0, |(_, k)| k);
    let key_bytes = cipher_bits as usize / 8 + int_key;
    let integrity = match integrity {
        None => {
            if iv_of(&req.cipher) == "random" {
                // cryptsetup makes integrity:N:none for this: random IVs stored in tags
                // that authenticate nothing.
                return Err(Error::Invalid(format!(
                    "--cipher {} without authenticated integrity (cryptsetup stores the \
                     random IVs in dm-integrity tags, integrity:N:none): ucrypt serves \
                     random IVs only with --integrity aead or poly1305",
                    req.cipher
                )));
            }
            // The data path is ucrypt's: refuse a cipher it cannot serve before writing.
            super::check_data_cipher(&req.cipher)
                .map_err(|e| invalid(format!("--cipher {}: {e}", req.cipher)))?;
            None
        }
        Some((kind, int_key)) => {
            if req.remote {
                return Err(invalid(
                    "--integrity on a remote (NBD) device: the dm-integrity superblock and \
                     the wipe need the device here",
                ));
            }
            let what = format!(
                "luksFormat --integrity {}",
                req.integrity.as_deref().unwrap_or(kind)
            );
            let (spec, tag) = ucrypt_format::luks::aead_spec_of(&req.cipher, kind, &what)?;
            // The sector cipher that will serve the volume, built once with a zero key of
            // the planned size: key sizes, tag sizes and modes are checked by the code that
            // opens it.
            let params = ucrypt_crypto::SectorParams {
                sector_size: ucrypt_crypto::SectorSize::new(512)?,
                iv_offset: 0,
                iv_large_sectors: false,
            };
            spec.build_aead(&VolumeKey::new(vec![0u8; key_bytes]), params, tag)
                .map_err(|e| {
                    Error::Invalid(format!(
                        "{what} with --cipher {} and a {}-bit key ({} bits of it the \
                         integrity key): {e}",
                        req.cipher,
                        key_bytes * 8,
                        int_key * 8
                    ))
                })?;
            Some(IntegrityPlan {
                kind: kind.to_string(),
                key_bytes: int_key,
                tag_size: tag,
                kernel_cipher: spec.to_string(),
                legacy_padding: req.integrity_legacy_padding,
                wipe: !req.integrity_no_wipe,
            })
        }
    };
    let kind = req
        .pbkdf
        .clone()
        .unwrap_or_else(|| if req.luks2 { "argon2id" } else { "pbkdf2" }.to_string());
    Ok(Plan {
        luks2: req.luks2,
        key_bytes,
        pbkdf: Pbkdf {
            kind,
            hash: req.hash.clone(),
            iterations: req.pbkdf_iterations,
            time_ms: req.pbkdf_time_ms,
            memory_kb: req.pbkdf_memory_kb,
            parallel: req.pbkdf_parallel,
        },
        integrity,
    })
}

/// What a format wrote.
#[derive(Debug)]
pub struct Formatted {
    /// The keyslot that holds the passphrase.
    pub slot: u32,
    /// The volume key, kept for the integrity wipe ([`wipe_target`]); `None` without
    /// integrity.
    pub volume_key: Option<VolumeKey>,
}

impl Plan {
    /// Sets what libcryptsetup needs before the PBKDF benchmark and the format: metadata
    /// sizes, the RNG, the PBKDF, the data offset.
    ///
    /// # Errors
    /// libcryptsetup's refusal (metadata sizes as cryptsetup's "unsupported LUKS2 metadata
    /// size options").
    pub fn prepare(&self, cd: &mut CryptDevice, req: &Request) -> Result<()> {
        if req.metadata_size.is_some() || req.keyslots_size.is_some() {
            cd.set_metadata_size(
                req.metadata_size.unwrap_or(0),
                req.keyslots_size.unwrap_or(0),
            )
            .map_err(|e| invalid(format!("unsupported LUKS2 metadata size options: {e}")))?;
        }
        if let Some(random) = req.rng_random {
            cd.set_rng(random);
        }
        cd.set_pbkdf(&self.pbkdf)?;
        if let Some(o) = req.offset {
            cd.set_data_offset(o)?;
        }
        Ok(())
    }

    /// Writes the header and its first keyslot on `cd` (prepared, PBKDF benchmarked), as
    /// cryptsetup does: `fmt` (whose `cipher` is the user's) formatted, the keyslot cipher
    /// set (`keyslot_cipher`, else for integrity cryptsetup's `aes-xts-plain64`/512), the
    /// keyslot `key_slot` added with `pass`. With integrity, `header` (the local header
    /// location) gets the segment's `encryption` and `integrity` in both copies, and `data`
    /// (the local data device) the dm-integrity superblock and journal at the data offset.
    ///
    /// # Errors
    /// libcryptsetup's; I/O on the header or the data device; a data area too small for
    /// dm-integrity.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        mut cd: CryptDevice,
        fmt: &LuksFormat,
        keyslot_cipher: &KeyslotCipher,
        key_slot: Option<u32>,
        volume_key: Option<&VolumeKey>,
        pass: &[u8],
        header: &Path,
        data: &Path,
        rng_random: bool,
    ) -> Result<Formatted> {
        let Some(int) = &self.integrity else {
            cd.format_luks(fmt, volume_key)?;
            // As cryptsetup: after the header is written, before its first keyslot.
            keyslot_cipher.apply(&mut cd)?;
            let slot = cd.add_keyslot_by_volume_key(key_slot, None, pass)?;
            return Ok(Formatted {
                slot,
                volume_key: None,
            });
        };
        let key = match volume_key {
            Some(k) => VolumeKey::new(k.as_bytes().to_vec()),
            None => random_key(self.key_bytes, rng_random)?,
        };
        let stand_in = LuksFormat {
            cipher: STAND_IN_CIPHER.to_string(),
            key_bytes: self.key_bytes,
            ..fmt.clone()
        };
        cd.format_luks(&stand_in, Some(&key))?;
        if keyslot_cipher.cipher.is_some() {
            keyslot_cipher.apply(&mut cd)?;
        } else {
            cd.set_keyslot_encryption(INTEGRITY_KEYSLOT_CIPHER.0, INTEGRITY_KEYSLOT_CIPHER.1)?;
        }
        let slot = cd.add_keyslot_by_volume_key(key_slot, Some(&key), pass)?;
        let info = cd.info();
        drop(cd);
        set_integrity_segment(header, &fmt.cipher, &int.kind)?;
        format_integrity(data, info.data_offset * 512, info.sector_size, int)?;
        Ok(Formatted {
            slot,
            volume_key: Some(key),
        })
    }
}

/// `n` bytes from `/dev/urandom` (`/dev/random` with `random`), as libcryptsetup draws a
/// volume key.
fn random_key(n: usize, random: bool) -> Result<VolumeKey> {
    use std::io::Read;
    let src = if random {
        "/dev/random"
    } else {
        "/dev/urandom"
    };
    let mut buf = zeroize::Zeroizing::new(vec![0u8; n]);
    std::fs::File::open(src)
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| invalid(format!("reading {src} for the volume key: {e}")))?;
    Ok(VolumeKey::new(buf.to_vec()))
}

/// Sets segment 0's `encryption` to `cipher` and adds cryptsetup's `integrity` object
/// (`type`, `journal_encryption` and `journal_integrity` "none", in that order, after the
/// segment's other fields) in both copies of the LUKS2 header at `header`, keeping the
/// `seqid` libcryptsetup's last write gave them.
fn set_integrity_segment(header: &Path, cipher: &str, kind: &str) -> Result<()> {
    use ucrypt_format::luks2::disk::Header;
    use ucrypt_format::luks2::json::Json;
    let name = header.display().to_string();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(header)
        .map_err(|e| invalid(format!("opening {name}: {e}")))?;
    let mut hdr = Header::read(&f, &name)?;
    let seg = hdr
        .json
        .get_mut("segments")
        .and_then(|s| s.get_mut("0"))
        .ok_or_else(|| {
            invalid(format!(
                "the header just written on {name} has no segment 0"
            ))
        })?;
    seg.set("encryption", Json::str(cipher));
    let mut integrity = Json::parse("{}").map_err(invalid)?;
    integrity.set("type", Json::str(kind));
    integrity.set("journal_encryption", Json::str("none"));
    integrity.set("journal_integrity", Json::str("none"));
    seg.set("integrity", integrity);
    // The same seqid as libcryptsetup's last write: cryptsetup writes this header in one go.
    hdr.seqid = hdr.seqid.saturating_sub(1);
    hdr.write(&f, &name)?;
    Ok(())
}

/// The dm-integrity superblock and journal at byte `at` of `data`, as the kernel writes
/// them when cryptsetup's `INTEGRITY_format` activates its temporary device: external tags,
/// blocks of the crypt sector size, the kernel's default journal and interleave,
/// `fix_padding` unless legacy, no `fix_hmac` (no internal hash or journal MAC).
fn format_integrity(data: &Path, at: u64, sector_size: u32, int: &IntegrityPlan) -> Result<()> {
    use ucrypt_backend::{FileBackend, FileOptions, LinearBackend};
    use ucrypt_format::integrity::{FormatParams, SALT_SIZE};
    let dev: Arc<dyn Backend> = Arc::new(FileBackend::open(
        data,
        FileOptions {
            read_only: false,
            direct: false,
        },
    )?);
    let size = dev.info().size_bytes;
    if at >= size {
        return Err(invalid(format!(
            "{}: the data offset {at} is at or past the device's end ({size} bytes)",
            data.display()
        )));
    }
    let area: Arc<dyn Backend> = Arc::new(LinearBackend::ranges(vec![(dev, at, size - at)])?);
    let params = FormatParams {
        sector_size,
        tag_size: int.tag_size,
        journal_sectors: 0,
        interleave_sectors: 0,
        journal_mac: false,
        keyed_or_hashed: false,
        fix_hmac: false,
        fix_padding: !int.legacy_padding,
        bitmap_mode: false,
        sectors_per_bitmap_bit: None,
        salt: [0u8; SALT_SIZE],
    };
    let mut opts = ucrypt_integrity::Options::external(int.tag_size);
    opts.block_size = Some(sector_size);
    ucrypt_integrity::format(area, &params, &opts, false)?;
    Ok(())
}

/// What a wipe writes through: the volume and the bytes per write.
pub struct WipeTarget {
    /// The decrypted volume (for integrity, over dm-integrity in direct mode).
    pub volume: Arc<dyn Backend>,
    /// Bytes per write: a whole dm-integrity interleave area's data (data and tags
    /// written together, each area once), else 4 MiB.
    pub chunk: usize,
}

/// The volume an unlocked header is wiped through. A segment with integrity is opened as
/// cryptsetup's wipe activates it (`CRYPT_ACTIVATE_NO_JOURNAL`: dm-integrity in direct
/// mode, each sector's data and tag written in place), in chunks of whole interleave areas.
///
/// # Errors
/// As [`crate::open_unlocked`].
pub fn wipe_volume(mut unlocked: Unlocked) -> Result<WipeTarget> {
    use ucrypt_format::mapping::Target;
    let mut chunk = 4 << 20;
    for table in &mut unlocked.mapping.tables {
        for t in &mut table.targets {
            if let Target::Integrity(line) = t {
                line.mode = 'D';
                line.journal_watermark = None;
                line.commit_time = None;
                let interleave = u64::from(line.interleave_sectors.unwrap_or(32768)) * 512;
                chunk = usize::try_from(interleave.clamp(1 << 20, 64 << 20)).unwrap_or(4 << 20);
            }
        }
    }
    let volume = crate::open_unlocked(unlocked, crate::OpenOptions::default())?;
    Ok(WipeTarget { volume, chunk })
}

/// The volume a `luksFormat --integrity` just wrote, unlocked with its volume key, to be
/// wiped ([`wipe_volume`]).
///
/// # Errors
/// As [`crate::header::unlock_by_volume_key`] and [`wipe_volume`].
pub fn wipe_target(device: &Path, header: Option<&Path>, key: &VolumeKey) -> Result<WipeTarget> {
    let opts = HeaderOptions {
        kind: VolumeType::Luks2,
        header: header.map(Path::to_path_buf),
        ..HeaderOptions::default()
    };
    let unlocked = crate::header::unlock_by_volume_key(device, key.as_bytes(), &opts)?;
    wipe_volume(unlocked)
}
