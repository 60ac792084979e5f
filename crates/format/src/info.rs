//! What a header says about a volume, whichever format it is: its type, cipher, offsets,
//! sector size, UUID and label, and the persistent activation flags. Every format fills it
//! from its own header (TCRYPT: [`crate::tcrypt::TcryptHeader::info`], plain mode:
//! [`crate::plain::PlainOptions::info`]); libcryptsetup's view of a loaded header (LUKS1,
//! LUKS2, BitLocker, FileVault2) is converted to it by the `ucrypt-cryptsetup` crate, at its
//! boundary (`CryptDevice::info`).

use crate::luks2::ActivationFlags;

/// A header type (libcryptsetup's `CRYPT_LUKS1`, `CRYPT_LUKS2`, ... names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderType {
    /// LUKS version 1.
    Luks1,
    /// LUKS version 2.
    Luks2,
    /// Plain dm-crypt (no header).
    Plain,
    /// TrueCrypt / VeraCrypt.
    Tcrypt,
    /// BitLocker.
    Bitlk,
    /// FileVault2.
    Fvault2,
    /// loop-AES (no header: keys from a key file).
    Loopaes,
}

impl HeaderType {
    /// Every type, in libcryptsetup's order.
    pub const ALL: [HeaderType; 7] = [
        HeaderType::Luks1,
        HeaderType::Luks2,
        HeaderType::Plain,
        HeaderType::Tcrypt,
        HeaderType::Bitlk,
        HeaderType::Fvault2,
        HeaderType::Loopaes,
    ];

    /// libcryptsetup's name (`"LUKS2"`).
    pub fn name(self) -> &'static str {
        match self {
            HeaderType::Luks1 => "LUKS1",
            HeaderType::Luks2 => "LUKS2",
            HeaderType::Plain => "PLAIN",
            HeaderType::Tcrypt => "TCRYPT",
            HeaderType::Bitlk => "BITLK",
            HeaderType::Fvault2 => "FVAULT2",
            HeaderType::Loopaes => "LOOPAES",
        }
    }

    /// The type of libcryptsetup's name `s` (`"LUKS2"`).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }
}

impl std::fmt::Display for HeaderType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a header says about its volume (the facts a mapping is built from and a status
/// shows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Header type.
    pub kind: Option<HeaderType>,
    /// Cipher name (`aes`).
    pub cipher: String,
    /// Cipher mode with IV (`xts-plain64`).
    pub cipher_mode: String,
    /// UUID, if the format has one.
    pub uuid: Option<String>,
    /// LUKS2 label.
    pub label: Option<String>,
    /// Data area start in 512-byte sectors.
    pub data_offset: u64,
    /// IV offset in 512-byte sectors.
    pub iv_offset: u64,
    /// Volume key size in bytes.
    pub key_bytes: usize,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
    /// Persistent activation flags (LUKS2 `config.flags`; none for other formats).
    pub flags: ActivationFlags,
}

impl VolumeInfo {
    /// The dm-crypt cipher spec (`aes-xts-plain64`).
    pub fn cipher_spec(&self) -> String {
        if self.cipher_mode.is_empty() {
            self.cipher.clone()
        } else {
            format!("{}-{}", self.cipher, self.cipher_mode)
        }
    }
}
