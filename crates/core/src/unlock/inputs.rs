//! The inputs of an unlock as cryptsetup spells them: the key file and its modifiers,
//! plain-mode and loop-AES options (with the checks that refuse the ones a type has no use
//! for), TCRYPT options, and how the secret is read for each type.

use crate::error::{Error, Result};
use crate::prompt::Prompt;
use crate::secret::{self, Secret};
use crate::VolumeType;
use std::path::{Path, PathBuf};
use ucrypt_format::loopaes::LoopaesOptions;
use ucrypt_format::plain::PlainOptions;

/// `--key-file` and its modifiers.
#[derive(Debug, Clone, Default)]
pub struct KeyFile {
    /// The file (`-`: the caller's standard input); none: a passphrase is asked for.
    pub path: Option<PathBuf>,
    /// Bytes skipped at its start (`--keyfile-offset`).
    pub offset: u64,
    /// Bytes read at most (`--keyfile-size`; 0: all, up to [`secret::MAX_KEY_FILE`]).
    pub size: u64,
}

/// Reads the key file `path` (`-`: the caller's standard input) from `offset`, at most
/// `size` bytes (0: all).
///
/// # Errors
/// As [`secret::read_key`]; the caller has no standard input to give.
pub fn read_key_input(
    path: &Path,
    offset: u64,
    size: u64,
    prompt: &mut dyn Prompt,
) -> Result<Secret> {
    if path.as_os_str() == "-" {
        return secret::read_key(prompt.standard_input()?, "standard input", offset, size);
    }
    secret::read_key_file(path, offset, size)
}

/// The passphrase of an existing keyslot: from the key file if one is given, else asked
/// for with `question` ("Enter passphrase for disk.img: ").
///
/// # Errors
/// As [`read_key_input`] and [`Prompt::passphrase`].
pub fn existing(key: &KeyFile, question: &str, prompt: &mut dyn Prompt) -> Result<Secret> {
    match &key.path {
        Some(p) => read_key_input(p, key.offset, key.size, prompt),
        None => prompt.passphrase(question),
    }
}

/// cryptsetup's question for the passphrase of `device`.
pub fn question(device: &Path) -> String {
    format!("Enter passphrase for {}: ", device.display())
}

/// Plain-mode options (`--type plain`), which loop-AES (`--type loopaes`) takes with its
/// own defaults, and TCRYPT as search hints (`hash`, `cipher`). `None`: not given.
#[derive(Debug, Clone, Default)]
pub struct PlainInputs {
    /// Cipher (plain default aes-cbc-essiv:sha256; loop-AES: the block cipher, default aes).
    pub cipher: Option<String>,
    /// Key size in bits.
    pub key_size: Option<u32>,
    /// Passphrase hash (plain default ripemd160, `plain` for none).
    pub hash: Option<String>,
    /// Data start in 512-byte sectors.
    pub offset: u64,
    /// IV offset in 512-byte sectors.
    pub skip: Option<u64>,
    /// Mapping size in 512-byte sectors (plain mode).
    pub size: Option<u64>,
    /// Encryption sector size in bytes (plain mode).
    pub sector_size: Option<u32>,
    /// IVs counted in sector-size units (plain mode).
    pub iv_large_sectors: bool,
    /// The device's size taken as this many bytes (plain mode).
    pub device_size: Option<u64>,
}

impl PlainInputs {
    /// Refuses the options that `kind` has no use for, with cryptsetup 2.6's messages,
    /// instead of ignoring them. Where cryptsetup itself accepts an option and ignores it
    /// (`--size` and `--device-size` for anything but plain mode), they are refused too: a
    /// size the mapping would silently not have is wrong data waiting to happen. TCRYPT is
    /// left to its own checks (its system and hidden-volume paths use these names).
    ///
    /// # Errors
    /// The first option `kind` has no use for.
    pub fn check_kind(&self, kind: VolumeType, test_passphrase: bool) -> Result<()> {
        let refuse = |msg: &str| Err(Error::Invalid(msg.to_string()));
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

    /// The plain-mode options, cryptsetup 2.6's defaults for what is not given.
    pub fn options(&self) -> PlainOptions {
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

    /// The loop-AES options: loop-AES's defaults (`skip` defaults to `offset`, as
    /// cryptsetup's `loopaesOpen`).
    pub fn loopaes_options(&self) -> LoopaesOptions {
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

/// TrueCrypt/VeraCrypt options, cryptsetup's names. As in cryptsetup, the key file of
/// [`KeyFile`] is a TrueCrypt key file (mixed into the password), unless it is `-`: then
/// the passphrase is standard input's contents.
#[derive(Debug, Clone)]
pub struct TcryptInputs {
    /// Accept VeraCrypt headers and KDFs (off: `--disable-veracrypt`).
    pub veracrypt: bool,
    /// VeraCrypt PIM (`--veracrypt-pim`; 0 is none).
    pub pim: Option<u32>,
    /// Ask for the PIM after the passphrase (`--veracrypt-query-pim`).
    pub query_pim: bool,
    /// The hidden-volume header.
    pub hidden: bool,
    /// The system-encryption header.
    pub system: bool,
    /// The backup header at the device's end.
    pub backup: bool,
    /// More TrueCrypt key files (`--tcrypt-keyfile`).
    pub key_files: Vec<PathBuf>,
}

impl Default for TcryptInputs {
    fn default() -> Self {
        TcryptInputs {
            veracrypt: true,
            pim: None,
            query_pim: false,
            hidden: false,
            system: false,
            backup: false,
            key_files: Vec::new(),
        }
    }
}

/// `--veracrypt-query-pim`: the PIM asked for after the passphrase, with cryptsetup's
/// checks (a decimal number, not 0, at most 2^32-1).
///
/// # Errors
/// Anything else ("invalid PIM value: ..."), or no answer.
pub fn query_pim(prompt: &mut dyn Prompt) -> Result<u32> {
    let answer = prompt.passphrase("Enter VeraCrypt PIM: ")?;
    let text = std::str::from_utf8(&answer).unwrap_or("");
    let why = if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        "parse error"
    } else {
        match text.parse::<u64>() {
            Ok(0) => "0",
            Ok(n) => match u32::try_from(n) {
                Ok(p) => return Ok(p),
                Err(_) => "outside of range",
            },
            Err(_) => "outside of range",
        }
    };
    Err(Error::Invalid(format!("invalid PIM value: {why}")))
}
