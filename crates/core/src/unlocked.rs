//! What unlocking a header gives: the volume's mapping as table lines (one crypt line,
//! several targets, or stacked layers) with its header facts, and the options that say how
//! to find and unlock it. Every format's unlock path ([`crate::header`] for LUKS, plain,
//! BitLocker and FileVault2, [`crate::tcrypt`] for TrueCrypt/VeraCrypt) returns this one
//! model, and the open path ([`crate::header::open_unlocked`]) consumes it.

use crate::mapping::Target;
use std::path::PathBuf;
use std::str::FromStr;
use ucrypt_crypto::VolumeKey;
use ucrypt_cryptsetup::HeaderInfo;
use ucrypt_format::plain::PlainOptions;
use ucrypt_format::{FormatError, KeySource, TableLine};

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
            _ => Err(FormatError::Rule(format!(
                "unknown device type \"{s}\" (expected luks, luks1, luks2, plain, bitlk, fvault2 or tcrypt)"
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
    /// For plain mode: the secret is a key file read as the raw key (cryptsetup does not
    /// hash key files other than stdin in plain mode).
    pub plain_raw_key: bool,
    /// `--allow-discards`, added to the header's persistent flags.
    pub allow_discards: bool,
    /// TCRYPT search and header options (used with [`VolumeType::Tcrypt`]).
    pub tcrypt: ucrypt_format::tcrypt::TcryptOptions,
    /// INSECURE: open LUKS headers whose keyslots or data segment use `cipher_null` (no
    /// encryption). Off by default, see [`crate::header::refuse_unsafe_luks_ciphers`].
    pub allow_null_cipher: bool,
    /// A LUKS2 reencryption hotzone that a crash interrupted is recovered (from its
    /// checksums or journal) before the volume is mapped, as cryptsetup's activation does.
    /// It writes the device, so only a read-write open that holds the image lock sets it;
    /// otherwise such a volume is refused until `reencrypt --resume-only`.
    pub recover_reencryption: bool,
}

/// A header unlocked: the equivalent table line (with the volume key) and header facts.
pub struct Unlocked {
    /// The dm-crypt table line cryptsetup would load for this volume.
    pub table: TableLine,
    /// What the header says (type, cipher, offsets, UUID).
    pub info: HeaderInfo,
    /// The keyslot that opened (LUKS).
    pub slot: Option<u32>,
    /// The whole table when the mapping has several targets (BitLocker: dm-crypt and
    /// dm-zero lines); empty when `table` alone is the mapping.
    pub targets: Vec<Target>,
    /// Layers stacked on `table`, from the device up (TCRYPT cipher cascades: each line's
    /// device is the layer below); empty for one layer.
    pub layers: Vec<TableLine>,
}

impl Unlocked {
    /// The mapping as `dmsetup table` prints it, one line per target, in the form
    /// [`crate::mapping::Mapping::parse`] reads back to the same volume. A cascade of layers
    /// (TCRYPT) is several devices, named as cryptsetup names them for `cryptsetup open
    /// --type tcrypt DEV NAME`: `NAME_<n-1>` on the device, each layer above on
    /// `/dev/mapper/` of the one below, `NAME` on top, every line prefixed `NAME: ` as
    /// `dmsetup table` prints several devices.
    pub fn table_lines(&self, show_keys: bool, name: &str) -> Vec<String> {
        if !self.targets.is_empty() {
            return self.targets.iter().map(|t| t.to_line(show_keys)).collect();
        }
        if self.layers.is_empty() {
            return vec![self.table.to_line(show_keys)];
        }
        let n = self.layers.len() + 1;
        let layer_name = |i: usize| {
            // i counts from the device up; cryptsetup numbers from the top down.
            match n - 1 - i {
                0 => name.to_string(),
                k => format!("{name}_{k}"),
            }
        };
        let mut out = Vec::with_capacity(n);
        for (i, t) in std::iter::once(&self.table).chain(&self.layers).enumerate() {
            let mut line = TableLine {
                start: t.start,
                length: t.length,
                cipher: t.cipher.clone(),
                key: match &t.key {
                    KeySource::Hex(k) => KeySource::Hex(VolumeKey::new(k.as_bytes().to_vec())),
                    KeySource::Keyring {
                        size,
                        key_type,
                        description,
                    } => KeySource::Keyring {
                        size: *size,
                        key_type: key_type.clone(),
                        description: description.clone(),
                    },
                },
                iv_offset: t.iv_offset,
                device: t.device.clone(),
                offset: t.offset,
                opts: t.opts.clone(),
            };
            if i > 0 {
                line.device = format!("/dev/mapper/{}", layer_name(i - 1));
            }
            out.push(format!("{}: {}", layer_name(i), line.to_line(show_keys)));
        }
        out
    }

    /// Size of the mapped device in bytes.
    pub fn size_bytes(&self) -> u64 {
        if self.targets.is_empty() {
            self.table.length * 512
        } else {
            self.targets.iter().map(|t| t.length() * 512).sum()
        }
    }
}

impl std::fmt::Debug for Unlocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unlocked")
            .field("table", &self.table.to_line(false))
            .field("info", &self.info)
            .field("slot", &self.slot)
            .finish()
    }
}
