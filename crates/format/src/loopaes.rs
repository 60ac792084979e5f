//! loop-AES volumes (`cryptsetup loopaesOpen`, `open --type loopaes`): no header; the keys
//! come from a key file of text lines, as loop-AES's `losetup -K` reads them and
//! libcryptsetup's `lib/loopaes/loopaes.c` maps them onto dm-crypt.
//!
//! - The key file holds 1 key line (loop-AES "v1": `CIPHER-cbc-plain64`), 64 lines ("v2",
//!   multi-key: `CIPHER:64-cbc-lmk`, the key of sector n is line n mod 64) or 65 lines ("v3":
//!   the 65th is the LMK IV seed). Lines end in LF or CR LF; empty lines between and after
//!   them are skipped; every key line has the same length, at least one character.
//! - Each line is hashed on its own (without its line end): SHA-256 for a 128-bit key,
//!   SHA-384 for 192, SHA-512 for 256, or `--hash`; the first key-size bytes of the digest
//!   are that line's key. The first byte of every key is XORed with 0x55 for 64 lines and
//!   0xF4 for 65 (loop-AES's own tweak).
//! - The volume key is the keys concatenated in line order (65 keys: the seed last, as
//!   dm-crypt's LMK IV takes it). Data start and IV offset are `--offset` and `--skip`;
//!   cryptsetup takes the IV offset from `--offset` when `--skip` is not given.
//! - A key file encrypted with GPG (as loop-AES keeps them) is refused with the pipe that
//!   decrypts it (`gpg --decrypt KEYFILE | ucrypt loopaesOpen --key-file - ...`).

use crate::kdf::Hash;
use crate::{DeviceRef, FormatError, KeySource, Mapping, TableLine};
use ucrypt_crypto::{CipherSpec, VolumeKey};
use zeroize::Zeroizing;

/// cryptsetup's default loop-AES cipher (`DEFAULT_LOOPAES_CIPHER`).
pub const DEFAULT_CIPHER: &str = "aes";
/// cryptsetup's default loop-AES key size in bits (`DEFAULT_LOOPAES_KEYBITS`, 256 in
/// cryptsetup 2.6's configure defaults: so the default hash is SHA-512).
pub const DEFAULT_KEY_BITS: u32 = 256;
/// The most key lines a key file may hold (64 keys and the LMK seed).
pub const MAX_KEYS: usize = 65;

/// loop-AES parameters (cryptsetup's options of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopaesOptions {
    /// `--cipher`: the block cipher alone (`aes`, `twofish`, `serpent`); the mode follows
    /// from the number of keys.
    pub cipher: String,
    /// `--key-size` in bits: of each key.
    pub key_bits: u32,
    /// `--hash`: overrides the hash chosen by key size.
    pub hash: Option<String>,
    /// `--offset`: data start on the device in 512-byte sectors.
    pub offset: u64,
    /// `--skip`: IV offset in 512-byte sectors (cryptsetup: `--offset` when not given).
    pub skip: u64,
}

impl Default for LoopaesOptions {
    fn default() -> Self {
        LoopaesOptions {
            cipher: DEFAULT_CIPHER.to_string(),
            key_bits: DEFAULT_KEY_BITS,
            hash: None,
            offset: 0,
            skip: 0,
        }
    }
}

/// The keys of a loop-AES key file, hashed.
pub struct LoopaesKey {
    /// Key lines in the file: 1, 64 or 65.
    pub keys: usize,
    /// The keys concatenated, each of the key size.
    pub key: VolumeKey,
}

fn incompatible(why: &str) -> FormatError {
    FormatError::Rule(format!("incompatible loop-AES key file: {why}"))
}

impl LoopaesOptions {
    /// Key size in bytes (of each key).
    ///
    /// # Errors
    /// Zero, not whole bytes, or above libcryptsetup's 1024-byte limit.
    pub fn key_bytes(&self) -> Result<usize, FormatError> {
        let bits = self.key_bits;
        if bits == 0 || bits % 8 != 0 || bits / 8 > 1024 {
            return Err(FormatError::Rule(format!(
                "key size {bits} bits is not a positive multiple of 8 up to 8192"
            )));
        }
        Ok(bits as usize / 8)
    }

    /// The hash that turns each key line into its key.
    fn hash(&self, key_bytes: usize) -> Result<Hash, FormatError> {
        let name = match (&self.hash, key_bytes) {
            (Some(h), _) => h.as_str(),
            (None, 16) => "sha256",
            (None, 24) => "sha384",
            (None, 32) => "sha512",
            (None, n) => {
                return Err(FormatError::Rule(format!(
                    "loop-AES has no default hash for {}-bit keys: give --hash",
                    n * 8
                )))
            }
        };
        let hash = Hash::from_name(name)?;
        if hash.size() < key_bytes {
            return Err(FormatError::Rule(format!(
                "hash {name} gives {} bytes, fewer than the {key_bytes}-byte key",
                hash.size()
            )));
        }
        Ok(hash)
    }

    /// Reads the keys of `file` (the key file's bytes, after `--keyfile-offset` and
    /// `--keyfile-size`), as libcryptsetup's `LOOPAES_parse_keyfile`.
    ///
    /// # Errors
    /// A GPG-encrypted file, lines of different lengths, an unterminated last line, a count
    /// other than 1, 64 or 65, or a hash that cannot give the key size. Messages never
    /// quote the file.
    pub fn volume_key(&self, file: &[u8]) -> Result<LoopaesKey, FormatError> {
        let key_bytes = self.key_bytes()?;
        if file.is_empty() {
            return Err(incompatible("it is empty"));
        }
        let head = &file[..file.len().min(100)];
        if head.windows(17).any(|w| w == b"BEGIN PGP MESSAGE") {
            return Err(FormatError::Rule(
                "the loop-AES key file is GPG-encrypted: decrypt it into the pipe, \
                 `gpg --decrypt KEYFILE | ucrypt loopaesOpen --key-file - DEVICE NAME`"
                    .to_string(),
            ));
        }
        let eol = |b: &u8| *b == b'\n' || *b == b'\r';
        if file.first().is_some_and(eol) {
            return Err(incompatible("it starts with an empty line"));
        }
        if !file.last().is_some_and(eol) {
            return Err(incompatible("its last key line has no line end"));
        }
        let lines: Vec<&[u8]> = file.split(eol).filter(|l| !l.is_empty()).collect();
        if !matches!(lines.len(), 1 | 64 | 65) {
            return Err(incompatible(&format!(
                "{} key lines (1, 64 or 65 expected)",
                lines.len()
            )));
        }
        if lines.iter().any(|l| l.len() != lines[0].len()) {
            return Err(incompatible("its key lines differ in length"));
        }
        let hash = self.hash(key_bytes)?;
        let tweak = match lines.len() {
            64 => 0x55,
            65 => 0xf4,
            _ => 0,
        };
        let mut key = Zeroizing::new(Vec::with_capacity(key_bytes * lines.len()));
        for line in &lines {
            let digest = hash.digest(&[line]);
            let at = key.len();
            key.extend_from_slice(&digest[..key_bytes]);
            key[at] ^= tweak;
        }
        Ok(LoopaesKey {
            keys: lines.len(),
            key: VolumeKey::new(std::mem::take(&mut *key)),
        })
    }

    /// The cipher spec libcryptsetup's `LOOPAES_activate` loads for `keys` key lines.
    ///
    /// # Errors
    /// A cipher name ucrypt does not know.
    pub fn cipher_spec(&self, keys: usize) -> Result<CipherSpec, FormatError> {
        let spec = if keys == 1 {
            format!("{}-cbc-plain64", self.cipher)
        } else {
            format!("{}:64-cbc-lmk", self.cipher)
        };
        Ok(spec.parse()?)
    }

    /// What the options say about the volume (it has no header).
    pub fn info(&self, spec: &CipherSpec, key_bytes: usize) -> crate::VolumeInfo {
        let text = spec.to_string();
        let (cipher, mode) = text.split_once('-').unwrap_or((&text, ""));
        crate::VolumeInfo {
            kind: Some(crate::HeaderType::Loopaes),
            cipher: cipher.to_string(),
            cipher_mode: mode.to_string(),
            uuid: None,
            label: None,
            data_offset: self.offset,
            iv_offset: self.skip,
            key_bytes,
            sector_size: 512,
            flags: crate::luks2::ActivationFlags::default(),
        }
    }

    /// The mapping cryptsetup loads: one crypt target from `--offset` to the device's end
    /// (`device_bytes` long), 512-byte sectors.
    ///
    /// # Errors
    /// A device that ends at or before `--offset`; an unknown cipher.
    pub fn mapping(
        &self,
        key: LoopaesKey,
        device: &str,
        device_bytes: u64,
        allow_discards: bool,
    ) -> Result<Mapping, FormatError> {
        let total = device_bytes / 512;
        if total <= self.offset {
            return Err(FormatError::Rule(format!(
                "device {device} ({total} sectors) ends before --offset {} sectors",
                self.offset
            )));
        }
        let opts = if allow_discards {
            vec![crate::OptParam::AllowDiscards]
        } else {
            Vec::new()
        };
        Ok(Mapping::single(TableLine {
            start: 0,
            length: total - self.offset,
            cipher: self.cipher_spec(key.keys)?,
            key: KeySource::Hex(key.key),
            iv_offset: self.skip,
            device: DeviceRef::from(device),
            offset: self.offset,
            opts,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(lines: usize, len: usize, eol: &str) -> Vec<u8> {
        (0..lines)
            .flat_map(|i| format!("{:0len$}{eol}", i, len = len).into_bytes())
            .collect()
    }

    #[test]
    fn keys_are_line_hashes_with_the_tweak_in_their_first_byte() {
        let o = LoopaesOptions {
            key_bits: 128,
            ..Default::default()
        };
        for (n, tweak) in [(1, 0u8), (64, 0x55), (65, 0xf4)] {
            let k = o.volume_key(&file(n, 20, "\n")).unwrap();
            assert_eq!(k.keys, n);
            let key = k.key.as_bytes();
            assert_eq!(key.len(), 16 * n);
            for i in 0..n {
                let line = format!("{i:020}");
                let mut want = Hash::Sha256.digest(&[line.as_bytes()])[..16].to_vec();
                want[0] ^= tweak;
                assert_eq!(&key[16 * i..16 * (i + 1)], &want[..], "{n} keys, key {i}");
            }
        }
    }

    #[test]
    fn crlf_and_blank_lines_read_as_lf() {
        let o = LoopaesOptions::default();
        let mut crlf = file(64, 30, "\r\n");
        crlf.extend_from_slice(b"\r\n\n");
        let a = o.volume_key(&crlf).unwrap();
        let b = o.volume_key(&file(64, 30, "\n")).unwrap();
        assert_eq!(a.key.as_bytes(), b.key.as_bytes());
    }

    #[test]
    fn the_hash_follows_the_key_size_unless_given() {
        for (bits, hash) in [
            (128, Hash::Sha256),
            (192, Hash::Sha384),
            (256, Hash::Sha512),
        ] {
            let o = LoopaesOptions {
                key_bits: bits,
                ..Default::default()
            };
            let k = o.volume_key(b"abcdefghijklmnopqrst\n").unwrap();
            let n = bits as usize / 8;
            assert_eq!(
                k.key.as_bytes(),
                &hash.digest(&[b"abcdefghijklmnopqrst"])[..n]
            );
        }
        let o = LoopaesOptions {
            key_bits: 128,
            hash: Some("sha1".into()),
            ..Default::default()
        };
        let k = o.volume_key(b"abc\n").unwrap();
        assert_eq!(k.key.as_bytes(), &Hash::Sha1.digest(&[b"abc"])[..16]);
    }

    #[test]
    fn malformed_key_files_are_refused_without_quoting_them() {
        let o = LoopaesOptions::default();
        let mut uneven = file(64, 20, "\n");
        uneven.splice(0..0, b"x".iter().copied());
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "empty"),
            (b"\nsecretkeyline\n".to_vec(), "starts with an empty line"),
            (b"secretkeyline".to_vec(), "no line end"),
            (file(2, 20, "\n"), "2 key lines"),
            (file(66, 20, "\n"), "66 key lines"),
            (uneven, "differ in length"),
            (
                b"-----BEGIN PGP MESSAGE-----\nabc\n".to_vec(),
                "gpg --decrypt",
            ),
        ];
        for (f, why) in cases {
            let e = o.volume_key(&f).err().unwrap().to_string();
            assert!(e.contains(why), "{why}: {e}");
            assert!(!e.contains("secretkeyline") && !e.contains("0000"), "{e}");
        }
        let o = LoopaesOptions {
            hash: Some("sha1".into()),
            ..Default::default()
        };
        let e = o.volume_key(b"abc\n").err().unwrap().to_string();
        assert!(e.contains("fewer than the 32-byte key"), "{e}");
    }

    #[test]
    fn the_mapping_is_cryptsetups() {
        let o = LoopaesOptions {
            offset: 8,
            skip: 16,
            ..Default::default()
        };
        let k = o.volume_key(&file(65, 20, "\n")).unwrap();
        let m = o.mapping(k, "disk.img", 1 << 20, false).unwrap();
        let line = m.single_line().unwrap();
        assert_eq!(line.cipher.to_string(), "aes:64-cbc-lmk");
        assert_eq!((line.length, line.offset, line.iv_offset), (2040, 8, 16));
        let k = o.volume_key(&file(1, 20, "\n")).unwrap();
        let m = o.mapping(k, "disk.img", 1 << 20, false).unwrap();
        assert_eq!(
            m.single_line().unwrap().cipher.to_string(),
            "aes-cbc-plain64"
        );
        let k = o.volume_key(&file(1, 20, "\n")).unwrap();
        assert!(o.mapping(k, "disk.img", 4096, false).is_err());
    }
}
