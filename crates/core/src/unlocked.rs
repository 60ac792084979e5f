//! What unlocking a header gives: the volume's mapping ([`ucrypt_format::Mapping`]: one
//! crypt line, several targets, or stacked tables) with its header facts, and the options that say how
//! to find and unlock it. Every format's unlock path ([`crate::header`] for LUKS, plain,
//! BitLocker and FileVault2, [`crate::tcrypt`] for TrueCrypt/VeraCrypt) returns this one
//! model, and the open path ([`crate::header::open_unlocked`]) consumes it.

use std::path::PathBuf;
use std::str::FromStr;
use ucrypt_format::plain::PlainOptions;
use ucrypt_format::{FormatError, Mapping, TableLine, VolumeInfo};

/// Which kind of volume to expect (cryptsetup's `--type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VolumeType {
    /// Any LUKS version, detected from the header (the default).
    #[default]
    Luks,
    /// LUKS1 only.
    Luks1,
    /// LUKS2 only.
    Luks2,
    /// Plain dm-crypt: no header.
    Plain,
    /// BitLocker (`--type bitlk`): volume key through libcryptsetup, cryptsetup's
    /// multi-target mapping (zeros over the metadata).
    Bitlk,
    /// FileVault2 / CoreStorage (`--type fvault2`).
    Fvault2,
    /// TrueCrypt / VeraCrypt (`--type tcrypt`): header decrypted in Rust, cascades served
    /// as stacked volumes (see [`crate::tcrypt`]).
    Tcrypt,
    /// loop-AES (`--type loopaes`): no header, the keys from a key file
    /// ([`ucrypt_format::loopaes`]).
    Loopaes,
}

impl FromStr for VolumeType {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Self, FormatError> {
        match s {
            "luks" => Ok(VolumeType::Luks),
            "luks1" => Ok(VolumeType::Luks1),
            "luks2" => Ok(VolumeType::Luks2),
            "plain" => Ok(VolumeType::Plain),
            "bitlk" => Ok(VolumeType::Bitlk),
            "fvault2" => Ok(VolumeType::Fvault2),
            "tcrypt" => Ok(VolumeType::Tcrypt),
            "loopaes" => Ok(VolumeType::Loopaes),
            _ => Err(FormatError::Rule(format!(
                "unknown device type \"{s}\" (expected luks, luks1, luks2, plain, loopaes, bitlk, fvault2 or tcrypt)"
            ))),
        }
    }
}

/// How to find and unlock the header.
#[derive(Debug, Clone, Default)]
pub struct HeaderOptions {
    /// The expected type.
    pub kind: VolumeType,
    /// A detached header file (cryptsetup `--header`); the data stays on the device.
    pub header: Option<PathBuf>,
    /// Only try this keyslot (`--key-slot`).
    pub key_slot: Option<u32>,
    /// Plain-mode parameters (used with [`VolumeType::Plain`]).
    pub plain: PlainOptions,
    /// loop-AES parameters (used with [`VolumeType::Loopaes`]; the secret is the key file).
    pub loopaes: ucrypt_format::loopaes::LoopaesOptions,
    /// For plain mode: the secret is a key file read as the raw key (cryptsetup does not
    /// hash key files other than stdin in plain mode).
    pub plain_raw_key: bool,
    /// `--allow-discards`, added to the header's persistent flags.
    pub allow_discards: bool,
    /// TCRYPT search and header options (used with [`VolumeType::Tcrypt`]).
    pub tcrypt: ucrypt_format::tcrypt::TcryptOptions,
    /// INSECURE: open LUKS headers whose keyslots or data segment use `cipher_null` (no
    /// encryption). Off by default, see [`ucrypt_format::luks::refuse_unsafe_ciphers`].
    pub allow_null_cipher: bool,
    /// A LUKS2 reencryption hotzone that a crash interrupted is recovered (from its
    /// checksums or journal) before the volume is mapped, as cryptsetup's activation does.
    /// It writes the device, so only a read-write open that holds the image lock sets it;
    /// otherwise such a volume is refused until `reencrypt --resume-only`.
    pub recover_reencryption: bool,
}

/// A header unlocked: the volume's mapping (with the volume keys) and header facts.
pub struct Unlocked {
    /// The tables cryptsetup would load for this volume: one crypt line (plain, LUKS,
    /// FileVault2), one table of several targets (BitLocker, LUKS2 mid-reencryption), or a
    /// stack of tables (TCRYPT cascades).
    pub mapping: Mapping,
    /// What the header says (type, cipher, offsets, UUID).
    pub info: VolumeInfo,
    /// The keyslot that opened (LUKS).
    pub slot: Option<u32>,
}

impl Unlocked {
    /// The mapping as `dmsetup table` prints it, one line per target, in the form
    /// [`Mapping::parse`] reads back to the same volume. A stack of tables (TCRYPT) is
    /// several devices, named as cryptsetup names them for `cryptsetup open --type tcrypt
    /// DEV NAME`: `NAME_<n-1>` on the device, each layer above on `/dev/mapper/` of the one
    /// below, `NAME` on top, every line prefixed `NAME: ` as `dmsetup table` prints several
    /// devices.
    pub fn table_lines(&self, show_keys: bool, name: &str) -> Vec<String> {
        self.mapping.to_lines_named(show_keys, name)
    }

    /// The crypt line on the real device: the whole mapping of a one-line volume, the
    /// outermost layer of a cascade, BitLocker's first target.
    ///
    /// # Panics
    /// Never for a mapping a format built: each has a crypt target on the device.
    #[allow(clippy::expect_used)]
    pub fn first_line(&self) -> &TableLine {
        self.mapping
            .first_crypt()
            .expect("every unlocked mapping has a crypt target on its device")
    }

    /// Size of the mapped device in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.mapping.size_bytes()
    }

    /// The NBD export description of the volume (`ucrypt LUKS2 aes-xts-plain64 (...)`).
    pub fn export_description(&self) -> String {
        let kind_name = self
            .info
            .kind
            .map_or_else(|| "volume".to_string(), |k| k.to_string());
        let first = self.first_line();
        // Targets of the served table (a cascade's top layer is one).
        let targets = self.mapping.tables.last().map_or(1, |t| t.targets.len());
        format!(
            "ucrypt {kind_name} {} ({}-byte sectors, {targets} target(s)) on {}",
            first.cipher,
            first.sector_size_bytes(),
            first.device
        )
    }
}

impl std::fmt::Debug for Unlocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unlocked")
            .field("mapping", &self.mapping.to_lines(false))
            .field("info", &self.info)
            .field("slot", &self.slot)
            .finish()
    }
}
