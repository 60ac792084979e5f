//! What a reencryption is asked to do: [`Options`], cryptsetup's `reencrypt` options as
//! types. Which combinations are refused, and with which words, is decided where they are
//! acted on ([`super::checks`], [`super::luks1`], [`super::online`]), in cryptsetup's order.

use std::path::{Path, PathBuf};
use ucrypt_cryptsetup::{CryptDevice, HeaderType, Pbkdf};

pub use ucrypt_format::luks2::reencrypt::Mode;

/// How an interrupted hotzone is recovered (`--resilience`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResilienceMode {
    /// A checksum of every block of the hotzone (cryptsetup's default).
    Checksum,
    /// The hotzone's old data in the reencrypt keyslot area.
    Journal,
    /// Nothing: an interrupted hotzone cannot be recovered.
    None,
    /// A data shift's: each hotzone written a shift away from its old data.
    Datashift,
}

impl ResilienceMode {
    /// libcryptsetup's and the metadata's word.
    pub fn as_str(self) -> &'static str {
        match self {
            ResilienceMode::Checksum => "checksum",
            ResilienceMode::Journal => "journal",
            ResilienceMode::None => "none",
            ResilienceMode::Datashift => "datashift",
        }
    }
}

impl std::fmt::Display for ResilienceMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The header type asked for (`--type`): cryptsetup refuses a wrong one only where the
/// operation meets it, so a word it does not know is carried as it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderKind {
    /// `luks1`.
    Luks1,
    /// `luks2`.
    Luks2,
    /// Anything else (refused when a LUKS2 operation meets it).
    Other(String),
}

impl HeaderKind {
    /// The kind a `--type` word names.
    pub fn parse(word: &str) -> HeaderKind {
        match word {
            "luks1" => HeaderKind::Luks1,
            "luks2" => HeaderKind::Luks2,
            other => HeaderKind::Other(other.to_string()),
        }
    }
}

/// Which part of the work to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stage {
    /// Write the metadata if it is not there, then run the data pass.
    #[default]
    All,
    /// Only write the metadata (`--init-only`).
    InitOnly,
    /// Only resume a reencryption already in the metadata (`--resume-only`).
    ResumeOnly,
}

/// The PBKDF of the keyslots a reencryption writes (cryptsetup's `--pbkdf` and friends).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PbkdfChoice {
    /// pbkdf2, argon2i or argon2id (default: argon2id for LUKS2, pbkdf2 for LUKS1).
    pub kind: Option<String>,
    /// Fixed iterations (time cost for Argon2), no benchmark.
    pub iterations: Option<u32>,
    /// Target time in milliseconds when benchmarking.
    pub time_ms: Option<u32>,
    /// Argon2 memory cost in KiB.
    pub memory_kb: Option<u32>,
    /// Argon2 threads.
    pub parallel: Option<u32>,
    /// The hash (PBKDF2's, and a LUKS1 header's).
    pub hash: Option<String>,
}

impl PbkdfChoice {
    /// Whether anything was chosen.
    pub fn any(&self) -> bool {
        *self != PbkdfChoice::default()
    }

    /// Applies the choices, if any, to the next keyslot of `cd`.
    ///
    /// # Errors
    /// libcryptsetup refuses them.
    pub fn apply(&self, cd: &mut CryptDevice) -> crate::Result<()> {
        if self.any() {
            self.apply_always(cd)?;
        }
        Ok(())
    }

    /// Sets the PBKDF for the next keyslot of `cd`: the choices, cryptsetup's defaults
    /// for the rest (argon2id for LUKS2, pbkdf2 for LUKS1), as its `set_pbkdf_params`.
    ///
    /// # Errors
    /// libcryptsetup refuses them.
    pub fn apply_always(&self, cd: &mut CryptDevice) -> crate::Result<()> {
        let luks1 = cd.info().kind == Some(HeaderType::Luks1);
        let kind = self
            .kind
            .clone()
            .unwrap_or_else(|| if luks1 { "pbkdf2" } else { "argon2id" }.to_string());
        cd.set_pbkdf(&Pbkdf {
            kind,
            hash: self.hash.clone(),
            iterations: self.iterations,
            time_ms: self.time_ms,
            memory_kb: self.memory_kb,
            parallel: self.parallel,
        })?;
        Ok(())
    }
}

/// Options of cryptsetup's LUKS1 reencryption only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Luks1Options {
    /// `--block-size` in MiB, as given (1 to 1024; default 4).
    pub block_size: Option<String>,
    /// `--use-directio`.
    pub direct_io: bool,
    /// `--use-fsync` (the log file opened `O_SYNC`).
    pub fsync: bool,
    /// `--write-log` (ucrypt writes the log after every block anyway).
    pub write_log: bool,
}

impl Luks1Options {
    /// Whether any of them is given.
    pub fn any(&self) -> bool {
        self.block_size.is_some() || self.direct_io || self.fsync || self.write_log
    }
}

/// A reencryption, as `cryptsetup reencrypt`'s options describe it.
#[derive(Debug, Clone)]
pub struct Options {
    /// The data device (with [`Options::active_name`] possibly empty: the served one).
    pub device: PathBuf,
    /// A detached header (to be created by an encryption, or exported to by a decryption
    /// of a device whose header is attached).
    pub header: Option<PathBuf>,
    /// Re-key, encrypt a plaintext device, or decrypt.
    pub mode: Mode,
    /// `--type`.
    pub header_kind: Option<HeaderKind>,
    /// The keyslot whose passphrase is used and kept.
    pub key_slot: Option<u32>,
    /// New data cipher.
    pub cipher: Option<String>,
    /// New key size in bits.
    pub key_size: Option<u32>,
    /// New encryption sector size.
    pub sector_size: Option<u32>,
    /// `--resilience`.
    pub resilience: Option<ResilienceMode>,
    /// Hash of the checksum resilience.
    pub resilience_hash: String,
    /// Largest hotzone in bytes.
    pub hotzone_size: Option<u64>,
    /// Initialise only, resume only, or both.
    pub stage: Stage,
    /// Keep the volume key; change the cipher or sector size only.
    pub keep_key: bool,
    /// The new volume key: the first key-size bytes of this file.
    pub volume_key_file: Option<PathBuf>,
    /// UUID of the new header (encryption; a LUKS1 decryption's to resume).
    pub uuid: Option<String>,
    /// Label of the new header.
    pub label: Option<String>,
    /// Subsystem label of the new header.
    pub subsystem: Option<String>,
    /// `--reduce-device-size` in bytes: an encryption with the header at the device's head.
    pub reduce_device_size: Option<u64>,
    /// `--offset`: the new header's data offset in 512-byte sectors.
    pub offset: Option<u64>,
    /// The new header's JSON metadata area size in bytes.
    pub luks2_metadata_size: Option<u64>,
    /// The new header's keyslots area size in bytes.
    pub luks2_keyslots_size: Option<u64>,
    /// Re-encrypt only this many bytes of the data area.
    pub device_size: Option<u64>,
    /// Run online in this named instance.
    pub active_name: Option<String>,
    /// cryptsetup's LUKS1 reencryption options.
    pub luks1: Luks1Options,
    /// The PBKDF of the keyslots written.
    pub pbkdf: PbkdfChoice,
    /// Stop cleanly after this many bytes (tests: a reproducible interruption).
    pub stop_after: Option<u64>,
    /// Take ucrypt's image locks while the header changes (off: `--disable-locks`).
    pub locks: bool,
    /// LUKS2 tokens tried for the passphrase of an existing keyslot before it is asked
    /// for (`--token-only`, `--token-id`, `--token-type`, as cryptsetup reencrypt; with
    /// `key_slot`, only tokens of that keyslot).
    pub tokens: crate::unlock::Tokens,
}

impl Options {
    /// A re-key of `device` with cryptsetup's defaults (a new random key, the same
    /// cipher, resilience checksum with sha256, image locks taken).
    pub fn new(device: impl Into<PathBuf>) -> Options {
        Options {
            device: device.into(),
            header: None,
            mode: Mode::Reencrypt,
            header_kind: None,
            key_slot: None,
            cipher: None,
            key_size: None,
            sector_size: None,
            resilience: None,
            resilience_hash: "sha256".into(),
            hotzone_size: None,
            stage: Stage::All,
            keep_key: false,
            volume_key_file: None,
            uuid: None,
            label: None,
            subsystem: None,
            reduce_device_size: None,
            offset: None,
            luks2_metadata_size: None,
            luks2_keyslots_size: None,
            device_size: None,
            active_name: None,
            luks1: Luks1Options::default(),
            pbkdf: PbkdfChoice::default(),
            stop_after: None,
            locks: true,
            tokens: crate::unlock::Tokens::default(),
        }
    }

    /// Whether the user named tokens (`--token-only`, `--token-id`, `--token-type`).
    pub(crate) fn tokens_named(&self) -> bool {
        self.tokens.only || self.tokens.id.is_some() || self.tokens.kind.is_some()
    }

    /// Where the header is (the detached file or the device).
    pub fn header_path(&self) -> &Path {
        self.header.as_deref().unwrap_or(&self.device)
    }

    /// The resilience asked for (cryptsetup's default: checksum).
    pub(crate) fn resilience_word(&self) -> String {
        self.resilience
            .unwrap_or(ResilienceMode::Checksum)
            .as_str()
            .into()
    }

    pub(crate) fn encrypt(&self) -> bool {
        self.mode == Mode::Encrypt
    }

    pub(crate) fn decrypt(&self) -> bool {
        self.mode == Mode::Decrypt
    }

    pub(crate) fn init_only(&self) -> bool {
        self.stage == Stage::InitOnly
    }

    pub(crate) fn resume_only(&self) -> bool {
        self.stage == Stage::ResumeOnly
    }

    pub(crate) fn kind_is(&self, kind: &HeaderKind) -> bool {
        self.header_kind.as_ref() == Some(kind)
    }
}
