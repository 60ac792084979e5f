//! BitLocker (BITLK) layout, read from the volume itself as libcryptsetup reads it (boot
//! sector, superblock, the first FVE metadata block whose CRC-32 validates, its volume
//! header entry), and the device-mapper table cryptsetup builds from it
//! (`lib/bitlk/bitlk.c`, facts only).
//!
//! ```text
//!  boot sector: boot code (EB 58 90: version 2), "-FVE-FS-" (or "MSWIN4.1": To Go) at 3,
//!               sector size at 11; superblock at 160 (To Go: 424): GUID, 3 FVE offsets
//!  FVE block:   "-FVE-FS-", size/16 at 8, version 2 at 10, states at 12/14, volume size
//!               at 16, FVE offsets at 32, metadata size at 64, encryption at 100,
//!               entries from 112; validation (size, version, CRC-32) right after it
//!  entry 0x000f: volume header offset and size
//! ```
//!
//! ```text
//!  device:  [vol. header copy][data..][FVE 1][data..][FVE 2][data..][FVE 3][data..]
//!  mapping: 0..vhs  = crypt at the volume-header location (IV = that location)
//!           FVE blocks and the volume-header location = zeros
//!           everything else = crypt in place (IV = its own sector)
//! ```
//! With 4096-byte sectors the crypt targets add `sector_size:4096 iv_large_sectors`.

pub mod keys;

use crate::bytes::{le16, le32, le64};
use crate::{DeviceRef, FormatError, KeySource, Mapping, OptParam, TableLine, Target};
use std::os::unix::fs::FileExt;
use std::path::Path;
use ucrypt_crypto::{CipherSpec, VolumeKey};

/// Size of each FVE metadata block (zeros in the mapping).
pub const FVE_METADATA_BYTES: u64 = 64 * 1024;
const GUID_EOW: [u8; 16] = [
    0x3b, 0x4d, 0xa8, 0x92, 0x80, 0xdd, 0x0e, 0x4d, 0x9e, 0x4e, 0xb1, 0xe3, 0x28, 0x4e, 0xae, 0xd8,
];
const STATE_NORMAL: u16 = 4;

/// The facts of a BitLocker volume the mapping needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Encryption sector size (512 or 4096).
    pub sector_size: u32,
    /// Volume size the metadata states, in bytes.
    pub volume_size: u64,
    /// dm-crypt cipher spec (`aes-xts-plain64`, `aes-cbc-eboiv`, `aes-cbc-elephant`).
    pub cipher: String,
    /// Byte offsets of the three FVE metadata blocks.
    pub fve_offsets: [u64; 3],
    /// Where the original volume header (boot sector) was moved, in bytes.
    pub volume_header_offset: u64,
    /// Its size in bytes.
    pub volume_header_size: u64,
    /// A key protector is a clear key (suspended protection, or a partially decrypted
    /// volume when the state is not normal).
    pub clear_key: bool,
    /// Encrypt-on-write (used-space-only) volume.
    pub eow: bool,
    /// Both states in the FVE metadata are "normal" (encryption finished).
    pub state_normal: bool,
}

/// One target of the mapping, in 512-byte sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Start in the mapped device.
    pub start: u64,
    /// Length.
    pub length: u64,
    /// `None`: zeros (dm-zero); `Some(s)`: dm-crypt reading device sector `s` onwards
    /// with IV offset `s`.
    pub crypt_at: Option<u64>,
}

/// Entry type of the volume header's location and size.
const ENTRY_VOLUME_HEADER: u16 = 0x000f;
/// Entry type of a key protector (VMK).
const ENTRY_VMK: u16 = 0x0002;
/// FVE block header plus FVE metadata header, where the entries start.
const FVE_HEADERS: usize = 112;

fn bad(dev: &str, reason: impl Into<String>) -> FormatError {
    FormatError::Header {
        what: format!("BITLK metadata on {dev}"),
        reason: reason.into(),
    }
}

/// The FVE block at `offset` when it is one libcryptsetup accepts: signature, version 2,
/// a size within 64 KiB, and a validation record right after it whose CRC-32 matches.
fn valid_fve_block(f: &std::fs::File, offset: u64) -> Option<Vec<u8>> {
    let mut head = [0u8; FVE_HEADERS];
    f.read_exact_at(&mut head, offset).ok()?;
    let size = usize::from(le16(&head, 8)) << 4;
    if &head[..8] != b"-FVE-FS-" || le16(&head, 10) != 2 || size > FVE_METADATA_BYTES as usize {
        return None;
    }
    let mut validation = [0u8; 8];
    f.read_exact_at(&mut validation, offset + size as u64)
        .ok()?;
    if le16(&validation, 0) < 8 || le16(&validation, 2) > 2 {
        return None;
    }
    let mut block = vec![0u8; size.max(FVE_HEADERS)];
    f.read_exact_at(&mut block[..size], offset).ok()?;
    (size >= FVE_HEADERS
        && crc32fast::hash(&block[..size]) == le32(&validation, 4)
        && block[..FVE_HEADERS] == head)
        .then_some(block)
}

/// The dm-crypt cipher of a BitLocker encryption method.
fn cipher_of(method: u16) -> Option<&'static str> {
    Some(match method {
        0x8000 | 0x8001 => "aes-cbc-elephant",
        0x8002 | 0x8003 => "aes-cbc-eboiv",
        0x8004 | 0x8005 => "aes-xts-plain64",
        _ => return None,
    })
}

impl Layout {
    /// Reads the layout from the device's own metadata, as libcryptsetup's `BITLK_read_sb`
    /// does: boot sector and superblock, then the first of the three FVE metadata blocks
    /// that validates (which must sit where the superblock says), its states, size,
    /// encryption method and entries (volume header location, clear-key protectors).
    ///
    /// # Errors
    /// [`FormatError::Header`] naming what is wrong (signature, boot code, sector size, no
    /// valid FVE block, unknown encryption method, malformed entries, misaligned offsets);
    /// [`FormatError::DeviceUnavailable`] when the device cannot be opened.
    pub fn read(device: &Path) -> Result<Self, FormatError> {
        let dev = device.display().to_string();
        let f = crate::luks1::open(device)?;
        let mut boot = [0u8; 13];
        crate::luks1::read_exact_at(&f, &mut boot, 0, &dev, "the BITLK boot sector")?;
        let sb_offset = match &boot[3..11] {
            b"-FVE-FS-" => 160,
            b"MSWIN4.1" => 424,
            _ => return Err(bad(&dev, "no -FVE-FS- or MSWIN4.1 signature at byte 3")),
        };
        match boot[..3] {
            [0xeb, 0x58, 0x90] => {}
            [0xeb, 0x52, 0x90] => {
                return Err(FormatError::NotSupported(format!(
                    "BITLK version 1 ({dev})"
                )))
            }
            _ => return Err(bad(&dev, "unknown boot code (EB 58 90 expected)")),
        }
        let sector_size = match le16(&boot, 11) {
            0 => 512,
            s @ (512 | 4096) => u32::from(s),
            s => return Err(bad(&dev, format!("sector size {s} (512 or 4096 expected)"))),
        };
        let mut sb = [0u8; 40];
        crate::luks1::read_exact_at(&f, &mut sb, sb_offset, &dev, "the BITLK superblock")?;
        let eow = sb[..16] == GUID_EOW;
        let listed = [le64(&sb, 16), le64(&sb, 24), le64(&sb, 32)];
        let (i, block) = listed
            .iter()
            .enumerate()
            .find_map(|(i, &o)| valid_fve_block(&f, o).map(|b| (i, b)))
            .ok_or_else(|| {
                bad(
                    &dev,
                    "none of the three FVE metadata blocks reads and validates (signature, version 2, CRC-32)",
                )
            })?;
        let fve_offsets = [le64(&block, 32), le64(&block, 40), le64(&block, 48)];
        if fve_offsets[i] != listed[i] {
            return Err(bad(
                &dev,
                format!(
                    "FVE metadata block {i} found at {} says it belongs at {}",
                    listed[i], fve_offsets[i]
                ),
            ));
        }
        let state_normal = le16(&block, 12) == STATE_NORMAL && le16(&block, 14) == STATE_NORMAL;
        let volume_size = le64(&block, 16);
        let method = le16(&block, 100);
        let cipher = cipher_of(method)
            .ok_or_else(|| {
                FormatError::NotSupported(format!(
                    "BitLocker encryption method {method:#06x} ({dev})"
                ))
            })?
            .to_string();
        let md_size = le32(&block, 64) as usize;
        if md_size < 48 + 4 || FVE_HEADERS - 48 + md_size > block.len() {
            return Err(bad(
                &dev,
                format!(
                    "metadata size {md_size} does not fit the {}-byte FVE block",
                    block.len()
                ),
            ));
        }
        let (mut vh, mut clear_key) = ((0, 0), false);
        for e in keys::entries(&block[FVE_HEADERS..FVE_HEADERS - 48 + md_size], "entries")? {
            match e.entry_type {
                ENTRY_VOLUME_HEADER if e.value.len() >= 16 => {
                    vh = (le64(e.value, 0), le64(e.value, 8));
                }
                ENTRY_VOLUME_HEADER => {
                    return Err(bad(
                        &dev,
                        "the volume header entry is shorter than 16 bytes",
                    ))
                }
                // The protection type follows the VMK's GUID (16), time (8) and 2 bytes.
                ENTRY_VMK if e.value.len() >= 28 => clear_key |= le16(e.value, 26) == 0,
                _ => {}
            }
        }
        let l = Layout {
            sector_size,
            volume_size,
            cipher,
            fve_offsets,
            volume_header_offset: vh.0,
            volume_header_size: vh.1,
            clear_key,
            eow,
            state_normal,
        };
        for (what, v) in [
            ("FVE metadata offset", l.fve_offsets[0]),
            ("FVE metadata offset", l.fve_offsets[1]),
            ("FVE metadata offset", l.fve_offsets[2]),
            ("volume header offset", l.volume_header_offset),
            ("volume header size", l.volume_header_size),
        ] {
            if v % u64::from(sector_size) != 0 {
                return Err(bad(
                    &dev,
                    format!("{what} {v} is not a multiple of the sector size {sector_size}"),
                ));
            }
        }
        Ok(l)
    }

    /// Why cryptsetup refuses to activate this volume, if it does (the passphrase may still
    /// unlock the volume key).
    pub fn activation_refusal(&self) -> Option<&'static str> {
        if self.clear_key && !self.state_normal {
            Some("activation of partially decrypted BitLocker devices (clear key protector) is not supported")
        } else if self.eow {
            Some("BitLocker devices with type 'encrypt-on-write' (used space only) cannot be activated")
        } else if !self.state_normal {
            Some("this BitLocker device is in an unsupported state (encryption or decryption unfinished) and cannot be activated")
        } else {
            None
        }
    }

    /// The mapping cryptsetup loads for this volume on `device` (`device_sectors` long),
    /// with the volume key `key`: one table of crypt targets (IVs counted from the device
    /// sector each reads) around dm-zero targets over the metadata, the moved volume header
    /// mapped back to the front ([`Layout::segments`]).
    ///
    /// # Errors
    /// As [`Layout::segments`]; a cipher the crypto layer does not take; a layout that does
    /// not start with the volume header.
    pub fn mapping(
        &self,
        key: &VolumeKey,
        device: &str,
        device_sectors: u64,
        allow_discards: bool,
    ) -> Result<Mapping, FormatError> {
        let cipher: CipherSpec = self.cipher.parse().map_err(|e| FormatError::At {
            at: format!("BitLocker cipher \"{}\" on {device}", self.cipher),
            source: Box::new(FormatError::from(e)),
        })?;
        let large = self.sector_size != 512;
        let mut opts = Vec::new();
        if allow_discards {
            opts.push(OptParam::AllowDiscards);
        }
        if large {
            opts.extend([
                OptParam::SectorSize(self.sector_size),
                OptParam::IvLargeSectors,
            ]);
        }
        let mut targets = Vec::new();
        for s in self.segments(device_sectors)? {
            targets.push(match s.crypt_at {
                None => Target::Zero {
                    start: s.start,
                    length: s.length,
                },
                Some(at) => Target::Crypt(TableLine {
                    start: s.start,
                    length: s.length,
                    cipher: cipher.clone(),
                    key: KeySource::Hex(VolumeKey::new(key.as_bytes().to_vec())),
                    iv_offset: at,
                    device: DeviceRef::from(device),
                    offset: at,
                    opts: opts.clone(),
                }),
            });
        }
        if !matches!(targets.first(), Some(Target::Crypt(_))) {
            return Err(FormatError::Rule(format!(
                "BitLocker mapping of {device} does not start with the volume header"
            )));
        }
        Ok(Mapping::targets(targets))
    }

    /// The targets of cryptsetup's mapping over a data device of `device_sectors`.
    ///
    /// # Errors
    /// [`FormatError::Header`] when metadata regions overlap or lie outside the device.
    pub fn segments(&self, device_sectors: u64) -> Result<Vec<Segment>, FormatError> {
        let vhs = self.volume_header_size / 512;
        let mut used: Vec<Segment> = self
            .fve_offsets
            .iter()
            .map(|&o| Segment {
                start: o / 512,
                length: FVE_METADATA_BYTES / 512,
                crypt_at: None,
            })
            .chain([
                Segment {
                    start: self.volume_header_offset / 512,
                    length: vhs,
                    crypt_at: None,
                },
                Segment {
                    start: 0,
                    length: vhs,
                    crypt_at: Some(self.volume_header_offset / 512),
                },
            ])
            .filter(|s| s.length > 0)
            .collect();
        used.sort_by_key(|s| s.start);
        let mut out = Vec::new();
        let mut pos = 0;
        for s in used {
            if s.start < pos || s.start + s.length > device_sectors {
                return Err(FormatError::Header {
                    what: "BITLK metadata".into(),
                    reason: format!(
                        "region at sector {} ({} sectors) overlaps another or ends past the device ({device_sectors} sectors)",
                        s.start, s.length
                    ),
                });
            }
            if s.start > pos {
                out.push(Segment {
                    start: pos,
                    length: s.start - pos,
                    crypt_at: Some(pos),
                });
            }
            pos = s.start + s.length;
            out.push(s);
        }
        if device_sectors > pos {
            out.push(Segment {
                start: pos,
                length: device_sectors - pos,
                crypt_at: Some(pos),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_fill_the_gaps_between_metadata_like_cryptsetup() {
        let l = Layout {
            sector_size: 512,
            volume_size: 100 << 20,
            cipher: "aes-xts-plain64".into(),
            fve_offsets: [1 << 20, 3 << 20, 2 << 20],
            volume_header_offset: (1 << 20) + FVE_METADATA_BYTES,
            volume_header_size: 8192,
            clear_key: false,
            eow: false,
            state_normal: true,
        };
        let s = l.segments(8192).unwrap();
        assert_eq!(
            s[0],
            Segment {
                start: 0,
                length: 16,
                crypt_at: Some(2176)
            }
        );
        assert_eq!(s[1].crypt_at, Some(16));
        assert_eq!(s.iter().map(|x| x.length).sum::<u64>(), 8192);
        for w in s.windows(2) {
            assert_eq!(w[0].start + w[0].length, w[1].start);
        }
        assert_eq!(s.iter().filter(|x| x.crypt_at.is_none()).count(), 4);
        assert!(l.segments(100).is_err());
    }
}
