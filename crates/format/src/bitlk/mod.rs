//! BitLocker (BITLK) layout: what libcryptsetup reports (`crypt_dump`) plus the few fields
//! it does not (encryption type and state), and the device-mapper table cryptsetup builds
//! from them (`lib/bitlk/bitlk.c`, facts only).
//!
//! ```text
//!  device:  [vol. header copy][data..][FVE 1][data..][FVE 2][data..][FVE 3][data..]
//!  mapping: 0..vhs  = crypt at the volume-header location (IV = that location)
//!           FVE blocks and the volume-header location = zeros
//!           everything else = crypt in place (IV = its own sector)
//! ```
//! With 4096-byte sectors the crypt targets add `sector_size:4096 iv_large_sectors`.

pub mod keys;

use crate::FormatError;
use std::os::unix::fs::FileExt;
use std::path::Path;

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

fn field<'a>(dump: &'a str, label: &str) -> Option<&'a str> {
    dump.lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .map(|v| v.trim_start_matches(':').trim())
}

fn number(text: &str, what: &str, device: &str) -> Result<u64, FormatError> {
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| FormatError::Header {
            what: format!("BITLK metadata on {device}"),
            reason: format!("{what} \"{text}\" is not a number"),
        })
}

impl Layout {
    /// Reads the layout from libcryptsetup's `bitlkDump` text of `device` and from the
    /// device itself (type GUID, state).
    ///
    /// # Errors
    /// [`FormatError::Header`] when a field is missing or malformed.
    pub fn from_dump(dump: &str, device: &Path) -> Result<Self, FormatError> {
        let dev = device.display().to_string();
        let missing = |what: &str| FormatError::Header {
            what: format!("BITLK metadata on {dev}"),
            reason: format!("libcryptsetup's dump has no \"{what}\""),
        };
        let get = |label: &str| field(dump, label).ok_or_else(|| missing(label));
        let sector_size = number(get("Sector size")?, "sector size", &dev)? as u32;
        let volume_size = number(get("Volume size")?, "volume size", &dev)?;
        let cipher = format!("{}-{}", get("Cipher name")?, get("Cipher mode")?);
        // "Metadata segments": three "FVE metadata area" entries and one "Volume header",
        // each followed by "Offset:" and "Size:" lines.
        let mut fve = Vec::new();
        let mut vh = None;
        let mut lines = dump
            .lines()
            .skip_while(|l| !l.starts_with("Metadata segments"));
        while let Some(l) = lines.next() {
            let is_fve = l.contains("FVE metadata area");
            let is_vh = l.contains("Volume header");
            if !is_fve && !is_vh {
                continue;
            }
            let off = lines.next().and_then(|l| field(l, "Offset"));
            let size = lines.next().and_then(|l| field(l, "Size"));
            let (Some(off), Some(size)) = (off, size) else {
                return Err(missing("Offset/Size of a metadata segment"));
            };
            let (off, size) = (
                number(off, "segment offset", &dev)?,
                number(size, "segment size", &dev)?,
            );
            if is_fve {
                fve.push(off);
            } else {
                vh = Some((off, size));
            }
        }
        let fve_offsets: [u64; 3] = fve
            .try_into()
            .map_err(|_| missing("three FVE metadata areas"))?;
        let (volume_header_offset, volume_header_size) =
            vh.ok_or_else(|| missing("Volume header"))?;
        let clear_key = dump.contains("protected with clear key");
        let (eow, state_normal) = read_type_and_state(device, &fve_offsets)?;
        let l = Layout {
            sector_size,
            volume_size,
            cipher,
            fve_offsets,
            volume_header_offset,
            volume_header_size,
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
            if v % u64::from(sector_size.max(512)) != 0 {
                return Err(FormatError::Header {
                    what: format!("BITLK metadata on {dev}"),
                    reason: format!(
                        "{what} {v} is not a multiple of the sector size {sector_size}"
                    ),
                });
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

/// The superblock GUID (encrypt-on-write or normal) and the FVE state of the first FVE
/// block with a valid signature.
fn read_type_and_state(device: &Path, fve_offsets: &[u64; 3]) -> Result<(bool, bool), FormatError> {
    let dev = device.display().to_string();
    let f = crate::luks1::open(device)?;
    let mut sig = [0u8; 11];
    crate::luks1::read_exact_at(&f, &mut sig, 0, &dev, "the BITLK signature")?;
    let sb_offset = match &sig[3..11] {
        b"-FVE-FS-" => 160,
        b"MSWIN4.1" => 424,
        _ => {
            return Err(FormatError::Header {
                what: format!("BITLK signature on {dev}"),
                reason: "expected -FVE-FS- or MSWIN4.1 at byte 3".into(),
            })
        }
    };
    let mut guid = [0u8; 16];
    crate::luks1::read_exact_at(&f, &mut guid, sb_offset, &dev, "the BITLK superblock")?;
    let mut state_normal = false;
    for &o in fve_offsets {
        let mut b = [0u8; 16];
        if f.read_exact_at(&mut b, o).is_ok() && &b[..8] == b"-FVE-FS-" {
            let cur = u16::from_le_bytes([b[12], b[13]]);
            let next = u16::from_le_bytes([b[14], b[15]]);
            state_normal = cur == STATE_NORMAL && next == STATE_NORMAL;
            break;
        }
    }
    Ok((guid == GUID_EOW, state_normal))
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
