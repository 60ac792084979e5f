//! Reading and writing the two LUKS2 header copies directly, for metadata updates
//! libcryptsetup has no call for (the reencryption hotzone moves).
//!
//! Each copy is `hdr_size` bytes: the 4096-byte binary header, then the JSON area
//! (JSON text, NUL-padded). The checksum (`csum`, 64 bytes at 448; SHA-256 in the first 32)
//! covers the whole copy with the checksum field zeroed. A write goes as cryptsetup 2.6
//! does it (seen with strace): for the primary copy, then the secondary: the binary header
//! with the new `seqid` and a zero checksum, the JSON area, the binary header with the
//! checksum, `fsync`. A copy torn by a crash fails its checksum and the other copy is read.

use super::json::Json;
use crate::FormatError;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Positioned I/O on the device holding a LUKS2 header (and, for the reencryption data
/// pass, its data): a [`File`], or a test double that models a volatile write cache.
pub trait Io: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// The device's error, or a short read.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    /// Writes all of `buf` at `offset`.
    ///
    /// # Errors
    /// The device's error.
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
    /// Makes every completed write durable (`fsync`).
    ///
    /// # Errors
    /// The device's error.
    fn sync(&self) -> std::io::Result<()>;
}

impl Io for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.write_all_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.sync_all()
    }
}

const BIN: usize = super::metadata::BINARY_HEADER_BYTES;
const CSUM_AT: usize = 448;
const CSUM_LEN: usize = 64;

/// Both header copies as read, and the metadata of the newest valid one.
#[derive(Debug, Clone)]
pub struct Header {
    /// The binary headers as read (primary, secondary), kept whole so that a rewrite keeps
    /// each copy's own salt, label, UUID and offsets.
    bins: [Vec<u8>; 2],
    /// `hdr_size` of each copy (bytes).
    pub hdr_size: u64,
    /// `seqid` of the copy the metadata came from.
    pub seqid: u64,
    /// The JSON metadata.
    pub json: Json,
}

fn bad(what: &str, reason: String) -> FormatError {
    FormatError::Header {
        what: what.to_string(),
        reason,
    }
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

fn checksum(bin: &[u8], json_area: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(&bin[..CSUM_AT]);
    h.update([0u8; CSUM_LEN]);
    h.update(&bin[CSUM_AT + CSUM_LEN..BIN]);
    h.update(json_area);
    h.finalize().into()
}

/// One copy at `offset`: (binary header, hdr_size, seqid, JSON text) if its magic, version,
/// checksum algorithm and checksum hold.
fn read_copy(f: &dyn Io, offset: u64) -> Option<(Vec<u8>, u64, u64, String)> {
    let mut bin = vec![0u8; BIN];
    f.read_at(&mut bin, offset).ok()?;
    let magic_ok = if offset == 0 {
        &bin[..6] == super::metadata::MAGIC
    } else {
        &bin[..6] == super::metadata::MAGIC_SECONDARY
    };
    if !magic_ok || u16::from_be_bytes([bin[6], bin[7]]) != 2 {
        return None;
    }
    let hdr_size = be64(&bin, 8);
    if !(16384..=4 << 20).contains(&hdr_size) || be64(&bin, 256) != offset {
        return None;
    }
    let alg_end = bin[72..104].iter().position(|&c| c == 0).unwrap_or(32);
    if &bin[72..72 + alg_end] != b"sha256" {
        return None;
    }
    let mut area = vec![0u8; hdr_size as usize - BIN];
    f.read_at(&mut area, offset + BIN as u64).ok()?;
    if checksum(&bin, &area)[..] != bin[CSUM_AT..CSUM_AT + 32] {
        return None;
    }
    let end = area.iter().position(|&c| c == 0).unwrap_or(area.len());
    let text = String::from_utf8(area[..end].to_vec()).ok()?;
    Some((bin.clone(), hdr_size, be64(&bin, 16), text))
}

impl Header {
    /// Reads both copies and takes the metadata of the valid one with the higher `seqid`.
    ///
    /// # Errors
    /// [`FormatError::Header`] when neither copy is a valid LUKS2 header with a SHA-256
    /// checksum, or the JSON does not parse.
    pub fn read(f: &dyn Io, device: &str) -> Result<Header, FormatError> {
        let what = format!("LUKS2 header on {device}");
        let primary = read_copy(f, 0);
        let second_at = primary.as_ref().map(|p| p.1).unwrap_or(16384);
        let mut secondary = read_copy(f, second_at);
        if secondary.is_none() && primary.is_none() {
            // The secondary copy of a header whose primary is lost: try the sizes
            // cryptsetup allows.
            for size in [
                32768u64,
                65536,
                131072,
                262144,
                524288,
                1 << 20,
                2 << 20,
                4 << 20,
            ] {
                secondary = read_copy(f, size);
                if secondary.is_some() {
                    break;
                }
            }
        }
        let (p, s) = match (primary, secondary) {
            (Some(p), Some(s)) => (p, s),
            (Some(p), None) => {
                let mut s = p.clone();
                s.0[..6].copy_from_slice(super::metadata::MAGIC_SECONDARY);
                s.0[256..264].copy_from_slice(&p.1.to_be_bytes());
                (p, s)
            }
            (None, Some(s)) => {
                let mut p = s.clone();
                p.0[..6].copy_from_slice(super::metadata::MAGIC);
                p.0[256..264].copy_from_slice(&0u64.to_be_bytes());
                (p, s)
            }
            (None, None) => {
                return Err(bad(
                    &what,
                    "no valid copy (magic, version 2, sha256 checksum)".into(),
                ))
            }
        };
        if p.1 != s.1 {
            return Err(bad(
                &what,
                format!("the copies disagree on hdr_size ({} / {})", p.1, s.1),
            ));
        }
        let newest = if s.2 > p.2 { &s } else { &p };
        let json = Json::parse(&newest.3)
            .map_err(|e| bad(&what, format!("JSON metadata does not parse: {e}")))?;
        Ok(Header {
            hdr_size: p.1,
            seqid: newest.2,
            json,
            bins: [p.0, s.0],
        })
    }

    /// Writes the metadata into both copies with `seqid + 1`, in cryptsetup's order, each
    /// copy synced before the next is touched.
    ///
    /// # Errors
    /// [`FormatError::Rule`] when the JSON no longer fits the JSON area; I/O errors as
    /// [`FormatError::Header`].
    pub fn write(&mut self, f: &dyn Io, device: &str) -> Result<(), FormatError> {
        let what = format!("LUKS2 header on {device}");
        let text = self.json.to_compact();
        let area_len = self.hdr_size as usize - BIN;
        if text.len() >= area_len {
            return Err(FormatError::Rule(format!(
                "{what}: JSON metadata of {} bytes does not fit its {area_len}-byte area",
                text.len()
            )));
        }
        let mut area = vec![0u8; area_len];
        area[..text.len()].copy_from_slice(text.as_bytes());
        let seqid = self.seqid + 1;
        let io = |e: std::io::Error| bad(&what, format!("write failed: {e}"));
        for (i, bin) in self.bins.iter_mut().enumerate() {
            let at = if i == 0 { 0 } else { self.hdr_size };
            bin[16..24].copy_from_slice(&seqid.to_be_bytes());
            bin[CSUM_AT..CSUM_AT + CSUM_LEN].fill(0);
            f.write_at(bin, at).map_err(io)?;
            f.write_at(&area, at + BIN as u64).map_err(io)?;
            let sum = checksum(bin, &area);
            bin[CSUM_AT..CSUM_AT + 32].copy_from_slice(&sum);
            f.write_at(bin, at).map_err(io)?;
            f.sync().map_err(io)?;
        }
        self.seqid = seqid;
        Ok(())
    }
}
