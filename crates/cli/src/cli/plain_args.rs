//! Plain-mode options (`--type plain`) shared by `open`, `luksOpen` and the TCRYPT commands
//! (whose system-encryption and hidden-volume paths fall back to them), and by loop-AES
//! (`--type loopaes`), which takes the same names with its own defaults.

use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::header::VolumeType;
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
    /// Plain mode: mapping size in 512-byte sectors (default 0: to the end).
    #[arg(short = 'b', long)]
    pub(crate) size: Option<u64>,
    /// Plain mode: encryption sector size in bytes (default 512).
    #[arg(long)]
    pub(crate) sector_size: Option<u32>,
    /// Count IVs in sector-size units (plain mode).
    #[arg(long)]
    pub(crate) iv_large_sectors: bool,
    /// Plain mode: take SIZE as the device's size instead of its real one (bytes, or with
    /// a unit: S = 512-byte sectors, K/M/G/T binary), as cryptsetup's --device-size.
    #[arg(long, value_name = "SIZE", value_parser = ucrypt_format::size::parse_size)]
    pub(crate) device_size: Option<u64>,
}

impl PlainArgs {
    /// Refuses the options that `kind` has no use for, with cryptsetup 2.6's messages (its
    /// exit code 1), instead of ignoring them. Where cryptsetup itself accepts an option and
    /// ignores it (`--size` and `--device-size` for anything but plain mode), ucrypt refuses
    /// it too: a size the mapping would silently not have is wrong data waiting to happen.
    /// TCRYPT is left to its own checks (its system and hidden-volume paths use these names).
    pub(crate) fn check_kind(
        &self,
        kind: VolumeType,
        test_passphrase: bool,
    ) -> Result<(), CliError> {
        let refuse = |msg: &str| Err(anyhow::anyhow!("{msg}")).code(EXIT_PARAMS);
        if kind == VolumeType::Tcrypt {
            return Ok(());
        }
        let plain = kind == VolumeType::Plain;
        let loopaes = kind == VolumeType::Loopaes;
        if test_passphrase && (plain || loopaes) {
            return refuse(
                "option --test-passphrase is allowed only for open of LUKS, TCRYPT, BITLK and \
                 FVAULT2 devices (plain and loop-AES volumes have nothing to check a key against)",
            );
        }
        if self.offset != 0 && !plain && !loopaes {
            return refuse(
                "option --offset with open action is only supported for plain and loopaes devices",
            );
        }
        if self.skip.is_some() && !plain && !loopaes {
            return refuse("option --skip is supported only for open of plain and loopaes devices");
        }
        if self.sector_size.is_some() && !plain {
            return refuse(
                "sector size option with open action is supported only for plain devices",
            );
        }
        if self.iv_large_sectors && (!plain || self.sector_size.unwrap_or(512) <= 512) {
            return refuse(
                "large IV sectors option is supported only for opening plain type device with \
                 sector size larger than 512 bytes",
            );
        }
        if !plain && (self.size.is_some() || self.device_size.is_some()) {
            let what = if self.size.is_some() {
                "--size"
            } else {
                "--device-size"
            };
            return refuse(&format!(
                "option {what} is supported only for open of plain devices (the volume's size \
                 comes from the device and its metadata; cryptsetup ignores the option)"
            ));
        }
        Ok(())
    }

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
            size: self.size.unwrap_or(0),
            sector_size: self.sector_size.unwrap_or(512),
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
