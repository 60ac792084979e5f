//! Plain-mode options (`--type plain`) shared by `open`, `luksOpen` and the TCRYPT commands
//! (whose system-encryption and hidden-volume paths fall back to them), and by loop-AES
//! (`--type loopaes`), which takes the same names with its own defaults.

use ucrypt_format::loopaes::LoopaesOptions;
use ucrypt_format::plain::PlainOptions;

/// Plain-mode options (`--type plain`), cryptsetup's names and 2.6 defaults.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct PlainArgs {
    /// Cipher (plain default aes-cbc-essiv:sha256; loop-AES: the block cipher, default aes).
    #[arg(short, long)]
    pub(crate) cipher: Option<String>,
    /// Key size in bits (plain default 256; loop-AES: of each key, default 256).
    #[arg(short = 's', long)]
    pub(crate) key_size: Option<u32>,
    /// Passphrase hash (plain default ripemd160, "plain" for none; loop-AES: the hash of
    /// each key line, default by key size: sha256, sha384, sha512).
    #[arg(long)]
    pub(crate) hash: Option<String>,
    /// Data start on the device in 512-byte sectors.
    #[arg(short = 'o', long, default_value_t = 0)]
    pub(crate) offset: u64,
    /// IV offset in 512-byte sectors (plain default 0; loop-AES default --offset).
    #[arg(short = 'p', long)]
    pub(crate) skip: Option<u64>,
    /// Mapping size in 512-byte sectors (0: to the end).
    #[arg(short = 'b', long, default_value_t = 0)]
    pub(crate) size: u64,
    /// Encryption sector size in bytes.
    #[arg(long, default_value_t = 512)]
    pub(crate) sector_size: u32,
    /// Count IVs in sector-size units (plain mode).
    #[arg(long)]
    pub(crate) iv_large_sectors: bool,
    /// Plain mode: take SIZE as the device's size instead of its real one (bytes, or with
    /// a unit: S = 512-byte sectors, K/M/G/T binary), as cryptsetup's --device-size.
    #[arg(long, value_name = "SIZE", value_parser = ucrypt_format::size::parse_size)]
    pub(crate) device_size: Option<u64>,
}

impl PlainArgs {
    pub(crate) fn options(&self) -> PlainOptions {
        let d = PlainOptions::default();
        PlainOptions {
            cipher: self.cipher.clone().unwrap_or(d.cipher),
            key_bits: self.key_size.unwrap_or(d.key_bits),
            hash: Some(
                self.hash
                    .clone()
                    .unwrap_or_else(|| d.hash.unwrap_or_default()),
            ),
            offset: self.offset,
            skip: self.skip.unwrap_or(0),
            size: self.size,
            sector_size: self.sector_size,
            iv_large_sectors: self.iv_large_sectors,
            device_size: self.device_size,
        }
    }

    /// The loop-AES options: cryptsetup's names, loop-AES's defaults (`--skip` defaults to
    /// `--offset`, as cryptsetup's `loopaesOpen`).
    pub(crate) fn loopaes_options(&self) -> LoopaesOptions {
        let d = LoopaesOptions::default();
        LoopaesOptions {
            cipher: self.cipher.clone().unwrap_or(d.cipher),
            key_bits: self.key_size.unwrap_or(d.key_bits),
            hash: self.hash.clone(),
            offset: self.offset,
            skip: self.skip.unwrap_or(self.offset),
        }
    }
}
