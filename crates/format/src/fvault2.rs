//! FileVault2 (Apple Core Storage) metadata in pure Rust: the geometry of the encrypted
//! logical volume and the passphrase-protection parameters, read from the on-disk
//! structures (facts from cryptsetup's `lib/fvault2/fvault2.c` and the libfvde format
//! notes). libcryptsetup still unwraps the volume key; this module says where the
//! logical volume lies, which the library only prints in its dump text.
//!
//! No crate reads Core Storage metadata, hence this module.
//!
//! ```text
//!  physical volume header (512 B at 0): crc32c, version 1, "CS" at 88, block size at 96,
//!      disk label block number at 104, key data (16 B) at 176, PV UUID at 304
//!  disk label (8 KiB at block 104*bs, type 0x0011): volume groups descriptor offset at 220
//!  volume groups descriptor (40 B): encrypted metadata block count at 8, first block at 32
//!  encrypted metadata: 8 KiB blocks, AES-XTS-128 (key = key data || PV UUID, tweak = the
//!      block's index), each with a crc32c header; the first all-zero block ends them
//!      0x0019: XML plist: PassphraseWrappedKEKStruct (PBKDF2 salt, iterations, wrapped KEK)
//!      0x001a: XML plist: com.apple.corestorage.lv.size, com.apple.corestorage.lv.familyUUID
//!      0x0305: logical volume block number at 104
//! ```
//!
//! Every offset is checked against the first GiB (where libcryptsetup looks) and the device
//! size, every block against its checksum: a damaged or crafted header is an error naming
//! the structure, never a panic or a mapping of the wrong bytes.

use crate::bytes::{le16, le32, le64};
use crate::{DeviceRef, FormatError, KeySource, Mapping, OptParam, TableLine};
use base64ct::{Base64, Encoding};
use std::path::Path;
use ucrypt_crypto::{CipherSpec, SectorParams, SectorSize, VolumeKey};

/// Bytes of the physical volume header.
pub const VOLUME_HEADER_BYTES: usize = 512;
/// Bytes of one metadata block.
pub const MD_BLOCK_BYTES: u64 = 8192;
/// libcryptsetup reads metadata only within the first GiB.
pub const MAX_METADATA_OFFSET: u64 = 1 << 30;
/// Bytes of the volume groups descriptor.
const VGD_BYTES: usize = 40;
/// Decoded `PassphraseWrappedKEKStruct`.
const PWK_BYTES: usize = 284;
/// Decoded `KEKWrappedVolumeKeyStruct`.
const KWVK_BYTES: usize = 256;

/// Where the Core Storage metadata lies, from the unencrypted structures alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Block size of the physical volume (offsets are counted in it).
    pub block_size: u64,
    /// Byte offset of the disk label block.
    pub disk_label: u64,
    /// Byte offset of the volume groups descriptor.
    pub groups_descriptor: u64,
    /// Byte offset of the first encrypted metadata block.
    pub encrypted_metadata: u64,
    /// Encrypted metadata blocks the descriptor announces.
    pub encrypted_blocks: u64,
    /// Physical volume UUID (binary, as stored).
    pub pv_uuid: [u8; 16],
    /// Key data of the volume header: the first half of the metadata XTS key.
    key_data: [u8; 16],
}

/// What the encrypted metadata says: the logical volume and how its key is protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The unencrypted layout it was read through.
    pub layout: Layout,
    /// Byte offset of the encrypted logical volume on the device.
    pub lv_offset: u64,
    /// Bytes of the encrypted logical volume.
    pub lv_size: u64,
    /// Logical volume family UUID, lower-case hyphenated.
    pub family_uuid: String,
    /// PBKDF2-HMAC-SHA256 iterations of the passphrase.
    pub pbkdf2_iterations: u32,
    /// PBKDF2 salt.
    pub pbkdf2_salt: [u8; 16],
}

fn bad(what: &str, dev: &str, reason: impl Into<String>) -> FormatError {
    FormatError::Header {
        what: format!("FileVault2 {what} on {dev}"),
        reason: reason.into(),
    }
}

/// Core Storage's block checksum: CRC-32C over everything after the 8-byte checksum
/// field, seeded with the stored seed (always 0xffffffff) and without the final
/// inversion, so the stored value is the complement of the standard CRC-32C.
fn checksum_ok(block: &[u8]) -> bool {
    le32(block, 4) == 0xffff_ffff && le32(block, 0) == !crc32c::crc32c(&block[8..])
}

/// A byte offset `blocks * block_size`, refused past the first GiB or the device end.
fn offset(
    blocks: u64,
    block_size: u64,
    len: u64,
    size: u64,
    what: &str,
    dev: &str,
) -> Result<u64, FormatError> {
    blocks
        .checked_mul(block_size)
        .filter(|o| *o <= MAX_METADATA_OFFSET && o.checked_add(len).is_some_and(|e| e <= size))
        .ok_or_else(|| {
            bad(
                what,
                dev,
                format!(
                    "block {blocks} of {block_size} bytes lies past the first GiB or the device end ({size} bytes)"
                ),
            )
        })
}

/// Reads `len` bytes at a byte offset of the device.
pub type ReadAt<'a> = dyn FnMut(u64, usize) -> Result<Vec<u8>, FormatError> + 'a;

impl Layout {
    /// Reads the volume header, the disk label and the volume groups descriptor of a device
    /// of `size` bytes through `read`; `dev` names it in errors.
    ///
    /// # Errors
    /// [`FormatError::Header`] for a wrong signature, version, checksum or key size, or an
    /// offset outside the first GiB or the device; `read`'s errors.
    pub fn read_with(read: &mut ReadAt<'_>, size: u64, dev: &str) -> Result<Self, FormatError> {
        let vh = read(0, VOLUME_HEADER_BYTES)?;
        if vh.len() < VOLUME_HEADER_BYTES || vh[88..90] != *b"CS" {
            return Err(bad(
                "volume header",
                dev,
                "no Core Storage signature \"CS\" at byte 88",
            ));
        }
        if !checksum_ok(&vh[..VOLUME_HEADER_BYTES]) {
            return Err(bad("volume header", dev, "checksum mismatch"));
        }
        if le16(&vh, 8) != 1 {
            return Err(bad(
                "volume header",
                dev,
                format!("version {} (only 1 exists)", le16(&vh, 8)),
            ));
        }
        if le32(&vh, 168) != 16 {
            return Err(bad(
                "volume header",
                dev,
                format!(
                    "key data of {} bytes (AES-128: 16 expected)",
                    le32(&vh, 168)
                ),
            ));
        }
        let block_size = u64::from(le32(&vh, 96));
        if block_size < 512 || !block_size.is_power_of_two() || block_size > MD_BLOCK_BYTES * 8 {
            return Err(bad(
                "volume header",
                dev,
                format!("block size {block_size} (a power of two from 512 to 65536 expected)"),
            ));
        }
        let disk_label = offset(
            le64(&vh, 104),
            block_size,
            MD_BLOCK_BYTES,
            size,
            "disk label",
            dev,
        )?;
        let label = read(disk_label, MD_BLOCK_BYTES as usize)?;
        if label.len() < MD_BLOCK_BYTES as usize || !checksum_ok(&label) {
            return Err(bad("disk label", dev, "checksum mismatch"));
        }
        let groups_descriptor = disk_label + u64::from(le32(&label, 220));
        if groups_descriptor > MAX_METADATA_OFFSET || groups_descriptor + VGD_BYTES as u64 > size {
            return Err(bad(
                "volume groups descriptor",
                dev,
                format!("offset {groups_descriptor} lies past the first GiB or the device end"),
            ));
        }
        let d = read(groups_descriptor, VGD_BYTES)?;
        if d.len() < VGD_BYTES {
            return Err(bad("volume groups descriptor", dev, "short read"));
        }
        let encrypted_blocks = le64(&d, 8);
        let encrypted_metadata =
            offset(le64(&d, 32), block_size, 0, size, "encrypted metadata", dev)?;
        let mut pv_uuid = [0u8; 16];
        pv_uuid.copy_from_slice(&vh[304..320]);
        let mut key_data = [0u8; 16];
        key_data.copy_from_slice(&vh[176..192]);
        Ok(Layout {
            block_size,
            disk_label,
            groups_descriptor,
            encrypted_metadata,
            encrypted_blocks,
            pv_uuid,
            key_data,
        })
    }

    /// The byte ranges holding metadata (what a copy of the header must include): the
    /// volume header, the disk label, the descriptor and the encrypted blocks, at most up
    /// to the first GiB and `max_bytes` of encrypted blocks.
    pub fn ranges(&self, max_bytes: u64) -> Vec<(u64, u64)> {
        let len = self
            .encrypted_blocks
            .saturating_mul(MD_BLOCK_BYTES)
            .min(MAX_METADATA_OFFSET + MD_BLOCK_BYTES - self.encrypted_metadata)
            .min(max_bytes);
        vec![
            (0, 4096),
            (self.disk_label, MD_BLOCK_BYTES),
            (self.groups_descriptor, VGD_BYTES as u64),
            (self.encrypted_metadata, len),
        ]
    }

    /// Decrypts the encrypted metadata blocks and takes the logical volume and the
    /// passphrase parameters from them, as libcryptsetup does (stopping at the first
    /// all-zero block; all three block types must be present).
    ///
    /// # Errors
    /// [`FormatError::Header`] for a block with a bad checksum, malformed XML or values,
    /// missing block types, or a logical volume outside the device.
    pub fn metadata_with(
        self,
        read: &mut ReadAt<'_>,
        size: u64,
        dev: &str,
    ) -> Result<Metadata, FormatError> {
        let mut key = Vec::with_capacity(32);
        key.extend_from_slice(&self.key_data);
        key.extend_from_slice(&self.pv_uuid);
        let params = SectorParams {
            sector_size: SectorSize::new_extended(MD_BLOCK_BYTES as u32)
                .map_err(|e| bad("metadata", dev, e.to_string()))?,
            iv_offset: 0,
            iv_large_sectors: true,
        };
        let xts = "aes-xts-plain64"
            .parse::<CipherSpec>()
            .and_then(|s| s.build(&VolumeKey::new(key), params))
            .map_err(|e| bad("metadata", dev, e.to_string()))?;
        let (mut kek, mut lv, mut lv_block) = (None, None, None);
        for i in 0..self.encrypted_blocks {
            let at = self.encrypted_metadata + i * MD_BLOCK_BYTES;
            if at > MAX_METADATA_OFFSET || at + MD_BLOCK_BYTES > size {
                return Err(bad(
                    "encrypted metadata",
                    dev,
                    format!("block {i} lies past the first GiB or the device end"),
                ));
            }
            let mut b = read(at, MD_BLOCK_BYTES as usize)?;
            if b.len() < MD_BLOCK_BYTES as usize {
                return Err(bad(
                    "encrypted metadata",
                    dev,
                    format!("block {i}: short read"),
                ));
            }
            if b.iter().all(|&x| x == 0) {
                break;
            }
            // The tweak is the block's index: 8 KiB units counted from the first block.
            xts.decrypt(ucrypt_crypto::Sector512(i * (MD_BLOCK_BYTES / 512)), &mut b);
            if !checksum_ok(&b) {
                return Err(bad(
                    "encrypted metadata",
                    dev,
                    format!("block {i}: checksum mismatch after decryption"),
                ));
            }
            let what = format!("metadata block {i}");
            match le16(&b, 10) {
                0x0019 => kek = Some(passphrase_params(&b, 112, &what, dev)?),
                0x001a => lv = Some(volume_params(&b, &what, dev)?),
                0x0305 => lv_block = Some(u64::from(le32(&b, 104))),
                _ => {}
            }
        }
        let (Some((pbkdf2_iterations, pbkdf2_salt)), Some((lv_size, family_uuid)), Some(lvb)) =
            (kek, lv, lv_block)
        else {
            return Err(bad(
                "encrypted metadata",
                dev,
                "blocks of type 0x0019, 0x001a and 0x0305 are all required, not all were found",
            ));
        };
        let lv_offset = lvb
            .checked_mul(self.block_size)
            .filter(|o| {
                o.checked_add(lv_size).is_some_and(|e| e <= size) && o % 512 == 0
            })
            .ok_or_else(|| {
                bad(
                    "logical volume",
                    dev,
                    format!(
                        "block {lvb} of {} bytes, {lv_size} bytes long, does not fit in whole 512-byte sectors on the device ({size} bytes)",
                        self.block_size
                    ),
                )
            })?;
        if lv_size % 512 != 0 {
            return Err(bad(
                "logical volume",
                dev,
                format!("size {lv_size} is not a multiple of 512 bytes"),
            ));
        }
        Ok(Metadata {
            layout: self,
            lv_offset,
            lv_size,
            family_uuid,
            pbkdf2_iterations,
            pbkdf2_salt,
        })
    }
}

/// The XML text of a metadata block at `off`/`len` fields.
fn xml<'b>(b: &'b [u8], at: usize, what: &str, dev: &str) -> Result<&'b str, FormatError> {
    let (off, len) = (le32(b, at) as usize, le32(b, at + 4) as usize);
    let end = off
        .checked_add(len)
        .filter(|e| *e <= b.len() && off >= 64)
        .ok_or_else(|| {
            bad(
                what,
                dev,
                format!("XML at {off}, {len} bytes, outside the block"),
            )
        })?;
    let text = &b[off..end];
    let text = &text[..text.iter().position(|&c| c == 0).unwrap_or(text.len())];
    std::str::from_utf8(text).map_err(|_| bad(what, dev, "XML is not UTF-8"))
}

/// The text of `<key>KEY</key><TYPE ...>VALUE</TYPE>` in a plist, as libcryptsetup's
/// pattern takes it (the element directly after the key, attributes allowed).
fn plist_value<'x>(xml: &'x str, key: &str, ty: &str) -> Option<&'x str> {
    let k = format!("<key>{key}</key><{ty}");
    let mut rest = xml;
    while let Some(p) = rest.find(&k) {
        let after = &rest[p + k.len()..];
        if after.starts_with('>') || after.starts_with(' ') {
            let open_end = after.find('>')?;
            let body = &after[open_end + 1..];
            let close = body.find('<')?;
            if body[close..].starts_with(&format!("</{ty}>")) && close > 0 {
                return Some(&body[..close]);
            }
        }
        rest = after;
    }
    None
}

/// Block 0x0019: PBKDF2 iterations and salt from the passphrase-wrapped KEK structure
/// (and the presence of the KEK-wrapped volume key, which libcryptsetup requires).
fn passphrase_params(
    b: &[u8],
    at: usize,
    what: &str,
    dev: &str,
) -> Result<(u32, [u8; 16]), FormatError> {
    let text = xml(b, at, what, dev)?;
    let decode = |key: &str, want: usize| -> Result<Vec<u8>, FormatError> {
        let v = plist_value(text, key, "data")
            .ok_or_else(|| bad(what, dev, format!("no {key} in the XML")))?;
        let clean: String = v.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let d = Base64::decode_vec(&clean)
            .map_err(|_| bad(what, dev, format!("{key} is not base64")))?;
        if d.len() != want {
            return Err(bad(
                what,
                dev,
                format!("{key} decodes to {} bytes ({want} expected)", d.len()),
            ));
        }
        Ok(d)
    };
    let pwk = decode("PassphraseWrappedKEKStruct", PWK_BYTES)?;
    decode("KEKWrappedVolumeKeyStruct", KWVK_BYTES)?;
    let mut salt = [0u8; 16];
    salt.copy_from_slice(&pwk[8..24]);
    Ok((le32(&pwk, 168), salt))
}

/// Block 0x001a: the logical volume's size (hexadecimal) and family UUID.
fn volume_params(b: &[u8], what: &str, dev: &str) -> Result<(u64, String), FormatError> {
    let text = xml(b, 128, what, dev)?;
    let size = plist_value(text, "com.apple.corestorage.lv.size", "integer")
        .ok_or_else(|| bad(what, dev, "no com.apple.corestorage.lv.size in the XML"))?;
    let digits = size.trim();
    let digits = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
        .unwrap_or(digits);
    let lv_size = u64::from_str_radix(digits, 16)
        .ok()
        .filter(|s| *s != 0 && *s != u64::MAX)
        .ok_or_else(|| {
            bad(
                what,
                dev,
                format!("logical volume size \"{size}\" is not a hexadecimal number above 0"),
            )
        })?;
    let uuid =
        plist_value(text, "com.apple.corestorage.lv.familyUUID", "string").ok_or_else(|| {
            bad(
                what,
                dev,
                "no com.apple.corestorage.lv.familyUUID in the XML",
            )
        })?;
    let family = normalize_uuid(uuid)
        .ok_or_else(|| bad(what, dev, format!("family UUID \"{uuid}\" is not a UUID")))?;
    Ok((lv_size, family))
}

/// A UUID in the 8-4-4-4-12 form, lower-cased (as libuuid unparses it).
fn normalize_uuid(s: &str) -> Option<String> {
    let s = s.trim();
    let groups: Vec<&str> = s.split('-').collect();
    let shape = [8, 4, 4, 4, 12];
    (groups.len() == 5
        && groups
            .iter()
            .zip(shape)
            .all(|(g, n)| g.len() == n && g.bytes().all(|c| c.is_ascii_hexdigit())))
    .then(|| s.to_ascii_lowercase())
}

/// Formats 16 bytes as a hyphenated lower-case UUID.
pub fn uuid_string(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl Metadata {
    /// The mapping cryptsetup loads for this volume on `device`: one crypt target over the
    /// logical volume, IVs counted from its start, with the volume key `key` and the
    /// `cipher` the header names.
    pub fn mapping(
        &self,
        cipher: CipherSpec,
        key: VolumeKey,
        device: &str,
        allow_discards: bool,
    ) -> Mapping {
        Mapping::single(TableLine {
            start: 0,
            length: self.lv_size / 512,
            cipher,
            key: KeySource::Hex(key),
            iv_offset: 0,
            device: DeviceRef::from(device),
            offset: self.lv_offset / 512,
            opts: if allow_discards {
                vec![OptParam::AllowDiscards]
            } else {
                Vec::new()
            },
        })
    }

    /// Reads a device's (or image file's) FileVault2 metadata.
    ///
    /// # Errors
    /// See [`Layout::read_with`] and [`Layout::metadata_with`]; the device cannot be read.
    pub fn read(device: &Path) -> Result<Self, FormatError> {
        let dev = device.display().to_string();
        let mut f = crate::luks1::open(device)?;
        // The end of a file or of a block device alike.
        let size = std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).map_err(|e| {
            FormatError::DeviceUnavailable {
                device: dev.clone(),
                errno: e.raw_os_error().unwrap_or(libc::EIO),
                detail: e.to_string(),
            }
        })?;
        let mut read = |at: u64, len: usize| -> Result<Vec<u8>, FormatError> {
            let mut b = vec![0u8; len];
            crate::luks1::read_exact_at(&f, &mut b, at, &dev, "FileVault2 metadata")?;
            Ok(b)
        };
        Layout::read_with(&mut read, size, &dev)?.metadata_with(&mut read, size, &dev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plist_values_are_found_as_libcryptsetup_finds_them() {
        let x = "<dict><key>a</key><integer size=\"64\">0x10</integer><key>b</key><string>x</string></dict>";
        assert_eq!(plist_value(x, "a", "integer"), Some("0x10"));
        assert_eq!(plist_value(x, "b", "string"), Some("x"));
        assert_eq!(plist_value(x, "b", "integer"), None);
        assert_eq!(plist_value(x, "c", "string"), None);
        assert_eq!(
            plist_value("<key>a</key><integer></integer>", "a", "integer"),
            None
        );
    }

    #[test]
    fn uuids_are_checked_and_lower_cased() {
        assert_eq!(
            normalize_uuid("33A76CAA-1481-4BC5-8D04-1AC1707C19C0").as_deref(),
            Some("33a76caa-1481-4bc5-8d04-1ac1707c19c0")
        );
        assert_eq!(normalize_uuid("33a76caa14814bc58d041ac1707c19c0"), None);
        assert_eq!(normalize_uuid("zza76caa-1481-4bc5-8d04-1ac1707c19c0"), None);
    }

    #[test]
    fn checksums_are_crc32c_complemented_with_the_fixed_seed() {
        let mut b = vec![7u8; 512];
        b[4..8].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
        let v = !crc32c::crc32c(&b[8..]);
        b[..4].copy_from_slice(&v.to_le_bytes());
        assert!(checksum_ok(&b));
        b[100] ^= 1;
        assert!(!checksum_ok(&b));
    }

    #[test]
    fn a_header_without_the_signature_is_refused_with_its_name() {
        let mut read = |_: u64, n: usize| Ok(vec![0u8; n]);
        let e = Layout::read_with(&mut read, 1 << 20, "x.img").unwrap_err();
        assert!(e.to_string().contains("\"CS\""), "{e}");
    }
}
