//! Passphrases and key-file contents as the unlock policy holds them ([`Secret`]), and key
//! files read the way cryptsetup reads them (`tools_get_key`): the bytes after
//! `--keyfile-offset`, at most `--keyfile-size` of them (0: all, up to 8 MiB), newlines
//! included. A key file named `-` is the caller's standard input, which the caller hands
//! over ([`crate::prompt::Prompt::standard_input`]): the library never opens it itself.

use crate::error::{Error, Result};
use std::io::Read;
use std::path::Path;
use ucrypt_crypto::secret::SecretBytes;

/// cryptsetup's largest key file (8192 kB).
pub const MAX_KEY_FILE: u64 = 8192 * 1024;

/// A secret's bytes: locked in RAM (where `RLIMIT_MEMLOCK` allows), zeroed on drop, grown
/// by moving to a bigger locked buffer (the old one is zeroed as it goes), never printed.
pub struct Secret {
    buf: SecretBytes,
    len: usize,
}

impl Default for Secret {
    fn default() -> Self {
        Secret::new()
    }
}

impl Secret {
    /// An empty secret.
    pub fn new() -> Self {
        Secret {
            buf: SecretBytes::zeroed(0),
            len: 0,
        }
    }

    /// A locked copy of `bytes` (the caller zeroizes its own copy).
    pub fn copy_of(bytes: &[u8]) -> Self {
        let mut s = Secret::new();
        s.push(bytes);
        s
    }

    /// Room for `more` bytes after the current ones, as a slice to fill.
    fn spare(&mut self, more: usize) -> &mut [u8] {
        if self.buf.len() - self.len < more {
            let cap = (self.len + more).max(self.buf.len() * 2).max(256);
            let mut bigger = SecretBytes::zeroed(cap);
            bigger[..self.len].copy_from_slice(&self.buf[..self.len]);
            self.buf = bigger;
        }
        &mut self.buf[self.len..self.len + more]
    }

    /// Appends `bytes`.
    pub fn push(&mut self, bytes: &[u8]) {
        self.spare(bytes.len()).copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// Drops the last byte (it stays in the buffer until the buffer is zeroed on drop).
    pub fn pop(&mut self) {
        self.len = self.len.saturating_sub(1);
    }
}

impl std::ops::Deref for Secret {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<redacted>, {} bytes)", self.len)
    }
}

/// Reads `size` bytes (0: up to [`MAX_KEY_FILE`]) from `r` after skipping `offset`; `what`
/// names the source in errors ("key file disk.key", "standard input").
///
/// # Errors
/// A read error, or fewer than `size` bytes after `offset`.
pub fn read_key(mut r: impl Read, what: &str, offset: u64, size: u64) -> Result<Secret> {
    std::io::copy(&mut (&mut r).take(offset), &mut std::io::sink())
        .map_err(|e| Error::Invalid(format!("reading {what}: {e}")))?;
    let limit = if size == 0 { MAX_KEY_FILE } else { size };
    let mut buf = Secret::new();
    while (buf.len as u64) < limit {
        let want = usize::try_from((limit - buf.len as u64).min(4096)).unwrap_or(4096);
        match r.read(buf.spare(want)) {
            Ok(0) => break,
            Ok(n) => buf.len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::Invalid(format!("reading {what}: {e}"))),
        }
    }
    if size != 0 && (buf.len() as u64) < size {
        return Err(Error::Invalid(format!(
            "cannot read {size} bytes from {what} (only {} available after offset {offset})",
            buf.len()
        )));
    }
    Ok(buf)
}

/// Reads the key file at `path` (a file, not `-`) as [`read_key`] does.
///
/// # Errors
/// The file cannot be opened or read, or holds fewer than `size` bytes after `offset`.
pub fn read_key_file(path: &Path, offset: u64, size: u64) -> Result<Secret> {
    let f = std::fs::File::open(path)
        .map_err(|e| Error::Invalid(format!("cannot open key file {}: {e}", path.display())))?;
    read_key(f, &format!("key file {}", path.display()), offset, size)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Offset and size select the bytes; a short file is refused with both numbers; size 0
    /// reads to the end; a secret grows across its first buffer and prints no byte.
    #[test]
    fn key_files_are_read_from_offset_and_limited_to_size() {
        let data: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let s = read_key(&data[..], "test", 10, 20).unwrap();
        assert_eq!(&*s, &data[10..30]);
        let all = read_key(&data[..], "test", 4000, 0).unwrap();
        assert_eq!(&*all, &data[4000..]);
        let e = read_key(&data[..], "key file k", 4990, 20).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot read 20 bytes from key file k (only 10 available after offset 4990)"
        );
        let mut grown = Secret::copy_of(b"pass");
        grown.push(&[b'x'; 1000]);
        grown.pop();
        assert_eq!(grown.len(), 1003);
        assert_eq!(format!("{grown:?}"), "Secret(<redacted>, 1003 bytes)");
    }
}
