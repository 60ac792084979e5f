//! Units and the [`SectorCipher`] trait.
//!
//! dm-crypt mixes three units silently: positions in the table and in the IV count 512-byte
//! sectors, while encryption happens in units of `sector_size` bytes. Here the units are types.

use crate::CryptoError;

/// A position counted in 512-byte sectors (table lines, LUKS offsets, dm-crypt IV numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Sector512(pub u64);

impl Sector512 {
    /// The position in bytes.
    pub fn bytes(self) -> u64 {
        self.0 << 9
    }
    /// The sector holding byte `offset` (rounded down).
    pub fn from_bytes_floor(offset: u64) -> Self {
        Sector512(offset >> 9)
    }
}

/// The encryption unit: a power of two in 512..=65536 bytes.
///
/// dm-crypt (6.1) accepts 512..=4096; larger sizes are ucrypt's opt-in extension (seed 004)
/// and produce volumes the kernel cannot open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SectorSize(u32);

impl SectorSize {
    /// 512 bytes, dm-crypt's default.
    pub const DEFAULT: SectorSize = SectorSize(512);
    /// The largest size the Linux kernel's dm-crypt accepts.
    pub const KERNEL_MAX: u32 = 4096;
    /// The largest size ucrypt accepts with the large-sector extension.
    pub const EXTENDED_MAX: u32 = 65536;

    /// A sector size the kernel accepts (512..=4096, a power of two).
    ///
    /// # Errors
    /// [`CryptoError::SectorSize`] otherwise.
    pub fn new(bytes: u32) -> Result<Self, CryptoError> {
        Self::with_limit(bytes, Self::KERNEL_MAX)
    }

    /// A sector size up to 64 KiB (the large-sector extension, not readable by the kernel).
    ///
    /// # Errors
    /// [`CryptoError::SectorSize`] if not a power of two in 512..=65536.
    pub fn new_extended(bytes: u32) -> Result<Self, CryptoError> {
        Self::with_limit(bytes, Self::EXTENDED_MAX)
    }

    fn with_limit(bytes: u32, max: u32) -> Result<Self, CryptoError> {
        if bytes.is_power_of_two() && (512..=max).contains(&bytes) {
            Ok(SectorSize(bytes))
        } else {
            Err(CryptoError::SectorSize(bytes))
        }
    }

    /// Size in bytes.
    pub fn bytes(self) -> u32 {
        self.0
    }
    /// Size in bytes, as `usize`.
    #[allow(clippy::len_without_is_empty)] // a sector size is never empty
    pub fn len(self) -> usize {
        self.0 as usize
    }
    /// Size in 512-byte sectors.
    pub fn sectors512(self) -> u64 {
        u64::from(self.0 >> 9)
    }
    /// log2 of the size in 512-byte sectors (dm-crypt's `sector_shift`).
    pub fn shift(self) -> u32 {
        (self.0 >> 9).trailing_zeros()
    }
    /// Whether the kernel's dm-crypt can open a volume with this sector size.
    pub fn kernel_compatible(self) -> bool {
        self.0 <= Self::KERNEL_MAX
    }
}

impl Default for SectorSize {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl std::fmt::Display for SectorSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How sector positions become IV numbers (dm-crypt's `iv_offset` and `iv_large_sectors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SectorParams {
    /// Encryption unit.
    pub sector_size: SectorSize,
    /// Added to every position before the IV is computed, in 512-byte sectors.
    pub iv_offset: u64,
    /// Count IVs in units of `sector_size` instead of 512 bytes.
    pub iv_large_sectors: bool,
}

/// Encrypts whole sectors, byte-compatible with dm-crypt.
pub trait SectorCipher: Send + Sync {
    /// The encryption unit.
    fn sector_size(&self) -> SectorSize;

    /// Encrypts `data` in place. `data` holds whole sectors; the first starts at `first`,
    /// counted from the start of the mapping's data area.
    ///
    /// # Panics
    /// If `data.len()` is not a multiple of the sector size or `first` is not aligned to it:
    /// a caller bug, the engine validates requests before they get here.
    fn encrypt(&self, first: Sector512, data: &mut [u8]);

    /// Decrypts `data` in place; same contract as [`SectorCipher::encrypt`].
    ///
    /// # Panics
    /// As [`SectorCipher::encrypt`].
    fn decrypt(&self, first: Sector512, data: &mut [u8]);

    /// Whether encryption and decryption leave the data as it is (`cipher_null-ecb`): there
    /// is no crypto work to spread, so the engine's automatic placement runs such a
    /// volume's requests on the thread that took them instead of splitting them across
    /// crypt workers.
    fn is_identity(&self) -> bool {
        false
    }

    /// Decrypts ciphertext `src` into `dst` (same length), leaving `src` untouched; same
    /// contract as [`SectorCipher::decrypt`]. Lets a reader decrypt straight out of a
    /// memory-mapped file: one pass over the data instead of a copy and a pass. The
    /// default copies, then decrypts in place; AES-XTS through AWS-LC works out of place.
    ///
    /// # Panics
    /// As [`SectorCipher::decrypt`], and if the lengths differ.
    fn decrypt_from(&self, first: Sector512, src: &[u8], dst: &mut [u8]) {
        dst.copy_from_slice(src);
        self.decrypt(first, dst);
    }
}
