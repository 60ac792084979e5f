//! Plain dm-crypt mode: no header, the key comes from the passphrase by cryptsetup's rules
//! (`cryptsetup open --type plain`, `lib/setup.c: process_key`, `lib/crypt_plain.c`).
//!
//! - With a hash (default `ripemd160` in cryptsetup 2.6): the key is the hash of the
//!   passphrase, extended by re-hashing with an `A` prefix per round (libcryptsetup does
//!   this; ucrypt calls it: `ucrypt_cryptsetup::plain::volume_key`). `hash:len` hashes only `len` bytes
//!   and pads the rest with zeros.
//! - Without a hash (`--hash plain`, or a key file that is not stdin): the first key-size
//!   bytes of the secret are the key, zero-padded when shorter.

use crate::{DeviceRef, FormatError, KeySource, Mapping, OptParam, TableLine};
use ucrypt_crypto::{CipherSpec, VolumeKey};

/// cryptsetup 2.6's default plain-mode cipher.
pub const DEFAULT_CIPHER: &str = "aes-cbc-essiv:sha256";
/// cryptsetup 2.6's default plain-mode key size in bits.
pub const DEFAULT_KEY_BITS: u32 = 256;
/// cryptsetup 2.6's default plain-mode passphrase hash.
pub const DEFAULT_HASH: &str = "ripemd160";

/// Plain-mode parameters (cryptsetup's options of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainOptions {
    /// `--cipher`.
    pub cipher: String,
    /// `--key-size` in bits.
    pub key_bits: u32,
    /// `--hash`; `None` or `"plain"`: the secret is the key.
    pub hash: Option<String>,
    /// `--offset`: data start on the device in 512-byte sectors.
    pub offset: u64,
    /// `--skip`: IV offset in 512-byte sectors.
    pub skip: u64,
    /// `--size` in 512-byte sectors (0: to the end of the device).
    pub size: u64,
    /// `--sector-size` in bytes.
    pub sector_size: u32,
    /// `--iv-large-sectors`.
    pub iv_large_sectors: bool,
    /// `--device-size` in bytes: taken as the device's size instead of its real one (the
    /// mapping then ends there when `size` is 0).
    pub device_size: Option<u64>,
}

impl Default for PlainOptions {
    fn default() -> Self {
        PlainOptions {
            cipher: DEFAULT_CIPHER.to_string(),
            key_bits: DEFAULT_KEY_BITS,
            hash: Some(DEFAULT_HASH.to_string()),
            offset: 0,
            skip: 0,
            size: 0,
            sector_size: 512,
            iv_large_sectors: false,
            device_size: None,
        }
    }
}

impl PlainOptions {
    /// What plain mode says about the volume (it has no header: the options are its
    /// facts), for a volume key of `key_bytes` bytes.
    pub fn info(&self, key_bytes: usize) -> crate::VolumeInfo {
        crate::VolumeInfo {
            kind: Some(crate::HeaderType::Plain),
            cipher: self.cipher.clone(),
            cipher_mode: String::new(),
            uuid: None,
            label: None,
            data_offset: self.offset,
            iv_offset: self.skip,
            key_bytes,
            sector_size: self.sector_size,
            flags: crate::luks2::ActivationFlags::default(),
        }
    }

    /// The mapping cryptsetup loads in plain mode on `device`: one crypt target from
    /// `--offset` for `--size` sectors, or to the device's end (`--device-size` standing in
    /// for the device's size when given, else `device_bytes`, which the caller reads only
    /// when `size` is 0 and no `--device-size` is given).
    ///
    /// # Errors
    /// [`FormatError::Rule`]: a `--device-size` not a positive multiple of the sector size,
    /// a device that ends before `--offset`, no device size where one is needed.
    pub fn mapping(
        &self,
        cipher: CipherSpec,
        key: VolumeKey,
        device: &str,
        device_bytes: Option<u64>,
        allow_discards: bool,
    ) -> Result<Mapping, FormatError> {
        if let Some(ds) = self.device_size {
            let unit = u64::from(self.sector_size.max(512));
            if ds == 0 || ds % unit != 0 {
                return Err(FormatError::Rule(format!(
                    "--device-size {ds} is not a positive multiple of the {unit}-byte sector size"
                )));
            }
        }
        let length = if self.size != 0 {
            self.size
        } else {
            let total = match self.device_size.or(device_bytes) {
                Some(b) => b / 512,
                None => {
                    return Err(FormatError::Rule(format!(
                        "the size of device {device} is needed to map it to its end"
                    )))
                }
            };
            if total <= self.offset {
                return Err(FormatError::Rule(format!(
                    "device {device} ({total} sectors) ends before --offset {} sectors",
                    self.offset
                )));
            }
            total - self.offset
        };
        let mut opts = Vec::new();
        if allow_discards {
            opts.push(OptParam::AllowDiscards);
        }
        if self.sector_size != 512 {
            opts.push(OptParam::SectorSize(self.sector_size));
        }
        if self.iv_large_sectors {
            opts.push(OptParam::IvLargeSectors);
        }
        Ok(Mapping::single(TableLine {
            start: 0,
            length,
            cipher,
            key: KeySource::Hex(key),
            iv_offset: self.skip,
            device: DeviceRef::from(device),
            offset: self.offset,
            opts,
        }))
    }

    /// Key size in bytes.
    ///
    /// # Errors
    /// A key size that is zero or not a multiple of 8 bits.
    pub fn key_bytes(&self) -> Result<usize, FormatError> {
        if self.key_bits == 0 || self.key_bits % 8 != 0 {
            return Err(FormatError::Rule(format!(
                "key size {} bits is not a positive multiple of 8",
                self.key_bits
            )));
        }
        Ok(self.key_bits as usize / 8)
    }

    /// The hash to apply, None for none (`plain` means none).
    pub fn effective_hash(&self) -> Option<&str> {
        self.hash.as_deref().filter(|h| *h != "plain")
    }
}
