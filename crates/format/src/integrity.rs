//! dm-integrity's on-disk format, as Linux writes and reads it (`drivers/md/dm-integrity.c`,
//! target version 1.13; `integritysetup` of cryptsetup 2.6): the superblock, the geometry
//! that follows from it (journal sections, interleaved tag and data areas), the journal's
//! entries and commit ids, and the replay decision the kernel makes when it opens a device
//! whose journal was left behind. Pure data: the I/O is `ucrypt-integrity`'s.
//!
//! ```text
//!  sector 0        8                          initial_sectors
//!  │ superblock    │ journal: sections × section_sectors │ area 0: tags (metadata_run) │ data (interleave) │ area 1: tags │ data │ …
//!  └ 8 sectors     └ section: 8 entry sectors, then the entries' data blocks
//! ```
//!
//! Every sector of a section ends with an 8-byte commit id (`COMMIT_IDS[seq] ^ (section << 32
//! ^ sector)`); a journal data sector's own last 8 bytes live in its entry (`last_bytes`).
//! An entry is `sector: le64` (high half `0xffffffff` unused, `0xfffffffe` being written),
//! `last_bytes: le64 × sectors_per_block`, then the tag, rounded up to 8 bytes.
//!
//! With a separate metadata device (`meta_device:`, `integritysetup --data-device`) the
//! superblock, the journal and every tag live on the metadata device, one tag after the
//! other after the journal (`log2_interleave_sectors` 0, no padding), and the data device
//! holds the data alone, block for block ([`Geometry::new_separate`]).
//!
//! Every superblock field is honoured or refused with the reason: the inline mode (tags in the
//! drive's own metadata, Linux 6.11+) is refused; unknown flag bits and versions are refused.

use crate::bytes::{le16, le32, le64};
use crate::FormatError;

/// The superblock's size on disk (`SB_SECTORS`): 8 sectors, the first holds the fields.
pub const SB_SECTORS: u64 = 8;
/// `"integrt\0"`.
pub const MAGIC: &[u8; 8] = b"integrt\0";
/// Bytes of salt (`SALT_SIZE`), used when [`Flags::FIXED_HMAC`] is set.
pub const SALT_SIZE: usize = 16;
/// The newest superblock version (6: inline mode).
pub const MAX_VERSION: u8 = 6;
/// Entry sectors at the start of each journal section (`JOURNAL_BLOCK_SECTORS`).
pub const JOURNAL_BLOCK_SECTORS: u32 = 8;
/// Bytes of a journal sector before its commit id (`JOURNAL_SECTOR_DATA`).
pub const JOURNAL_SECTOR_DATA: u32 = 512 - 8;
/// Bytes of section MAC stored in each entry sector (`JOURNAL_MAC_PER_SECTOR`).
pub const JOURNAL_MAC_PER_SECTOR: u32 = 8;
/// A section's MAC: 8 bytes in each of its 8 entry sectors.
pub const JOURNAL_MAC_SIZE: usize = (JOURNAL_MAC_PER_SECTOR * JOURNAL_BLOCK_SECTORS) as usize;
/// At most 8 sectors (4096 bytes) per block.
pub const MAX_SECTORS_PER_BLOCK: u32 = 8;
/// The largest tag the kernel accepts (`MAX_TAG_SIZE`): one entry of a 4096-byte block must
/// fit a journal sector with its MAC.
pub const MAX_TAG_SIZE: u32 = JOURNAL_SECTOR_DATA - JOURNAL_MAC_PER_SECTOR - (8 + 8 * 8);
/// Journal entries are rounded up to this (`JOURNAL_ENTRY_ROUNDUP`).
const JOURNAL_ENTRY_ROUNDUP: u32 = 8;
/// `log2(interleave_sectors)` bounds.
pub const MIN_LOG2_INTERLEAVE_SECTORS: u8 = 3;
/// See [`MIN_LOG2_INTERLEAVE_SECTORS`].
pub const MAX_LOG2_INTERLEAVE_SECTORS: u8 = 31;
/// Table defaults (`DEFAULT_*` of the kernel).
pub const DEFAULT_INTERLEAVE_SECTORS: u32 = 32768;
/// See [`DEFAULT_INTERLEAVE_SECTORS`].
pub const DEFAULT_BUFFER_SECTORS: u32 = 128;
/// See [`DEFAULT_INTERLEAVE_SECTORS`].
pub const DEFAULT_JOURNAL_WATERMARK: u32 = 50;
/// See [`DEFAULT_INTERLEAVE_SECTORS`] (milliseconds).
pub const DEFAULT_COMMIT_TIME_MS: u32 = 10_000;
/// See [`DEFAULT_INTERLEAVE_SECTORS`].
pub const DEFAULT_SECTORS_PER_BITMAP_BIT: u64 = 32768;
/// See [`DEFAULT_INTERLEAVE_SECTORS`] (64-bit kernels).
pub const DEFAULT_MAX_JOURNAL_SECTORS: u64 = 131_072;
/// The default journal is the device's size shifted right by this, up to
/// [`DEFAULT_MAX_JOURNAL_SECTORS`].
pub const DEFAULT_JOURNAL_SIZE_FACTOR: u32 = 7;
/// Bitmap mode keeps its bitmap in the journal area in blocks of this many bytes.
pub const BITMAP_BLOCK_SIZE: u64 = 4096;
/// The byte a discarded block's tag is filled with (`DISCARD_FILLER`).
pub const DISCARD_FILLER: u8 = 0xf6;
/// Journal commit sequences (`N_COMMIT_IDS`).
pub const N_COMMIT_IDS: u8 = 4;
/// The commit ids the kernel uses when the journal is not encrypted (`create_journal`).
pub const COMMIT_IDS: [u64; 4] = [
    0x1111_1111_1111_1111,
    0x2222_2222_2222_2222,
    0x3333_3333_3333_3333,
    0x4444_4444_4444_4444,
];
/// An unused journal entry's sector high half.
const ENTRY_UNUSED_HI: u32 = 0xffff_ffff;
/// A journal entry being copied (`journal_entry_set_inprogress`).
const ENTRY_IN_PROGRESS_HI: u32 = 0xffff_fffe;
/// Metadata padding of superblocks without [`Flags::FIXED_PADDING`] (128 KiB, kept for old
/// volumes) and with it (4 KiB).
const LEGACY_PADDING_BYTES: u64 = 512 << 8;
const FIXED_PADDING_BYTES: u64 = 8 << 9;

/// The superblock's flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags(pub u32);

impl Flags {
    /// The journal has a MAC (`journal_mac`).
    pub const HAVE_JOURNAL_MAC: u32 = 0x1;
    /// Tags from `recalc_sector` on are being recalculated (version 2+).
    pub const RECALCULATING: u32 = 0x2;
    /// Bitmap mode: the bitmap in the journal area marks blocks whose tags may be stale
    /// (version 3+).
    pub const DIRTY_BITMAP: u32 = 0x4;
    /// 4 KiB metadata padding instead of the legacy 128 KiB (version 4+).
    pub const FIXED_PADDING: u32 = 0x8;
    /// Tags and the journal MAC cover the salt (and the superblock has a MAC when there is
    /// a journal MAC) (version 5+).
    pub const FIXED_HMAC: u32 = 0x10;
    /// Tags in the drive's own metadata (version 6).
    pub const INLINE: u32 = 0x20;
    /// Every flag the kernel defines.
    pub const KNOWN: u32 = 0x3f;

    /// Whether `flag` is set.
    pub fn has(self, flag: u32) -> bool {
        self.0 & flag != 0
    }
}

/// The dm-integrity superblock (first 512 bytes of the device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// 1-6.
    pub version: u8,
    /// Data sectors per area, log2 (0 with a separate metadata device).
    pub log2_interleave_sectors: u8,
    /// Tag bytes per block.
    pub tag_size: u16,
    /// Journal sections (0 only in inline mode).
    pub journal_sections: u32,
    /// The data the device provides, in 512-byte sectors.
    pub provided_data_sectors: u64,
    /// Flags.
    pub flags: Flags,
    /// Sectors per block, log2 (0-3: 512-4096-byte blocks).
    pub log2_sectors_per_block: u8,
    /// Blocks per bitmap bit, log2 (bitmap mode).
    pub log2_blocks_per_bitmap_bit: u8,
    /// Where recalculation stands ([`Flags::RECALCULATING`]), in 512-byte sectors.
    pub recalc_sector: u64,
    /// Salt ([`Flags::FIXED_HMAC`]).
    pub salt: [u8; SALT_SIZE],
    /// The sector as read: bytes outside the fields (padding, the superblock MAC) are
    /// written back as they were, as the kernel does.
    raw: Vec<u8>,
}

fn bad(reason: impl Into<String>) -> FormatError {
    FormatError::Header {
        what: "dm-integrity superblock".into(),
        reason: reason.into(),
    }
}

impl Superblock {
    /// Whether `sector` (the device's first 512 bytes) is all zeros: a device the kernel
    /// would format on first activation.
    pub fn is_blank(sector: &[u8]) -> bool {
        sector.iter().all(|&b| b == 0)
    }

    /// Parses the first sector of a device.
    ///
    /// # Errors
    /// [`FormatError::Header`] when it is not a dm-integrity superblock or a field is out of
    /// what the kernel accepts; [`FormatError::NotSupported`] for the inline mode.
    pub fn parse(sector: &[u8]) -> Result<Superblock, FormatError> {
        if sector.len() < 512 {
            return Err(bad(format!(
                "{} bytes, a superblock needs 512",
                sector.len()
            )));
        }
        if &sector[..8] != MAGIC {
            return Err(bad(if Self::is_blank(&sector[..512]) {
                "the device is not formatted (its superblock is all zeros)".to_string()
            } else {
                "no dm-integrity magic \"integrt\" at offset 0".to_string()
            }));
        }
        let sb = Superblock {
            version: sector[8],
            log2_interleave_sectors: sector[9],
            tag_size: le16(sector, 10),
            journal_sections: le32(sector, 12),
            provided_data_sectors: le64(sector, 16),
            flags: Flags(le32(sector, 24)),
            log2_sectors_per_block: sector[28],
            log2_blocks_per_bitmap_bit: sector[29],
            recalc_sector: le64(sector, 32),
            salt: {
                let mut s = [0u8; SALT_SIZE];
                s.copy_from_slice(&sector[48..64]);
                s
            },
            raw: sector[..512].to_vec(),
        };
        sb.validate()?;
        Ok(sb)
    }

    /// The checks the kernel makes on a superblock it reads (`dm_integrity_ctr`), and the
    /// refusals of what ucrypt does not serve.
    fn validate(&self) -> Result<(), FormatError> {
        if self.version == 0 || self.version > MAX_VERSION {
            return Err(bad(format!(
                "unknown version {} (the kernel reads 1 to {MAX_VERSION})",
                self.version
            )));
        }
        let unknown = self.flags.0 & !Flags::KNOWN;
        if unknown != 0 {
            return Err(bad(format!("unknown flags {unknown:#x}")));
        }
        if self.flags.has(Flags::INLINE) {
            return Err(FormatError::NotSupported(
                "the dm-integrity inline mode (tags in the drive's own metadata, Linux 6.11+: \
                 not reachable from userspace)"
                    .into(),
            ));
        }
        if self.tag_size == 0 || u32::from(self.tag_size) > MAX_TAG_SIZE {
            return Err(bad(format!(
                "tag size {} (1 to {MAX_TAG_SIZE} bytes)",
                self.tag_size
            )));
        }
        if u32::from(self.log2_sectors_per_block) > MAX_SECTORS_PER_BLOCK.trailing_zeros() {
            return Err(bad(format!(
                "log2 sectors per block {} (512 to 4096-byte blocks: 0 to 3)",
                self.log2_sectors_per_block
            )));
        }
        if self.journal_sections == 0 {
            return Err(bad("journal_sections is 0"));
        }
        if !self.separate_metadata()
            && !(MIN_LOG2_INTERLEAVE_SECTORS..=MAX_LOG2_INTERLEAVE_SECTORS)
                .contains(&self.log2_interleave_sectors)
        {
            return Err(bad(format!(
                "log2 interleave sectors {} ({MIN_LOG2_INTERLEAVE_SECTORS} to \
                 {MAX_LOG2_INTERLEAVE_SECTORS})",
                self.log2_interleave_sectors
            )));
        }
        if self.log2_blocks_per_bitmap_bit > 63 {
            return Err(bad(format!(
                "log2 blocks per bitmap bit {}",
                self.log2_blocks_per_bitmap_bit
            )));
        }
        if self.provided_data_sectors == 0
            || self.provided_data_sectors % (1 << self.log2_sectors_per_block) != 0
        {
            return Err(bad(format!(
                "provided data sectors {} (not a positive number of blocks)",
                self.provided_data_sectors
            )));
        }
        Ok(())
    }

    /// A new superblock as the kernel's `initialize_superblock` makes it for a data device
    /// of `device_sectors` (the device's first sector being the superblock's), with
    /// `journal_sectors` of journal asked for (0: the kernel's default for that size),
    /// `interleave_sectors` (0: the default) and the version the flags call for. `salt` is
    /// used when `fix_hmac` is set (the kernel draws it at random).
    ///
    /// # Errors
    /// [`FormatError::Rule`] when the parameters are out of range or the device is too
    /// small.
    pub fn new_for_format(
        p: &FormatParams,
        device_sectors: u64,
    ) -> Result<Superblock, FormatError> {
        let spb = p.sector_size / 512;
        if !(512..=4096).contains(&p.sector_size) || !p.sector_size.is_power_of_two() {
            return Err(FormatError::Rule(format!(
                "sector size {} (512, 1024, 2048 or 4096)",
                p.sector_size
            )));
        }
        if p.tag_size == 0 || p.tag_size > MAX_TAG_SIZE {
            return Err(FormatError::Rule(format!(
                "tag size {} (1 to {MAX_TAG_SIZE} bytes)",
                p.tag_size
            )));
        }
        let mut flags = 0;
        if p.journal_mac {
            flags |= Flags::HAVE_JOURNAL_MAC;
        }
        if p.fix_hmac && p.keyed_or_hashed {
            flags |= Flags::FIXED_HMAC;
        }
        if p.fix_padding {
            flags |= Flags::FIXED_PADDING;
        }
        let journal_sectors = if p.journal_sectors == 0 {
            (device_sectors >> DEFAULT_JOURNAL_SIZE_FACTOR).min(DEFAULT_MAX_JOURNAL_SECTORS)
        } else {
            p.journal_sectors
        };
        let interleave = if p.interleave_sectors == 0 {
            DEFAULT_INTERLEAVE_SECTORS
        } else {
            p.interleave_sectors
        };
        let log2_interleave = (31 - interleave.leading_zeros()) as u8;
        let log2_interleave =
            log2_interleave.clamp(MIN_LOG2_INTERLEAVE_SECTORS, MAX_LOG2_INTERLEAVE_SECTORS);
        let mut sb = Superblock {
            version: 1,
            log2_interleave_sectors: log2_interleave,
            tag_size: p.tag_size as u16,
            journal_sections: 0,
            provided_data_sectors: 0,
            flags: Flags(flags),
            log2_sectors_per_block: spb.trailing_zeros() as u8,
            log2_blocks_per_bitmap_bit: 0,
            recalc_sector: 0,
            salt: if flags & Flags::FIXED_HMAC != 0 {
                p.salt
            } else {
                [0; SALT_SIZE]
            },
            raw: vec![0; 512],
        };
        let journal = JournalShape::of(&sb);
        sb.journal_sections = u32::try_from(journal_sectors / u64::from(journal.section_sectors))
            .unwrap_or(u32::MAX)
            .max(1);
        sb.provided_data_sectors = max_provided_data_sectors(&sb, device_sectors);
        if sb.provided_data_sectors == 0 {
            return Err(FormatError::Rule(format!(
                "the device ({device_sectors} sectors) is too small for dm-integrity with \
                 this journal and tag size"
            )));
        }
        sb.log2_blocks_per_bitmap_bit =
            log2_blocks_per_bitmap_bit(&sb, p.sectors_per_bitmap_bit.unwrap_or(0));
        sb.version = sb.version_for(p.bitmap_mode);
        Ok(sb)
    }

    /// Whether the superblock is of a device with a separate metadata device (the kernel
    /// writes `log2_interleave_sectors` 0 then, and only then).
    pub fn separate_metadata(&self) -> bool {
        self.log2_interleave_sectors == 0
    }

    /// A new superblock as the kernel's `initialize_superblock` makes it with a separate
    /// metadata device of `meta_sectors` and a data device of `data_sectors`: the data
    /// device's whole blocks provided, no metadata padding (`fix_padding` is not recorded),
    /// interleave 0, and the most journal sections up to the ones asked for (`journal_sectors`,
    /// 0: the kernel's default from the data device's size) that fit the metadata device
    /// beside every tag, with tag buffers of `buffer_sectors` shrunk (down to 8) until one
    /// section fits.
    ///
    /// # Errors
    /// [`FormatError::Rule`] when the parameters are out of range or a device is too small.
    pub fn new_for_format_separate(
        p: &FormatParams,
        meta_sectors: u64,
        data_sectors: u64,
        buffer_sectors: u32,
    ) -> Result<Superblock, FormatError> {
        let mut q = p.clone();
        q.fix_padding = false;
        q.interleave_sectors = 1 << MIN_LOG2_INTERLEAVE_SECTORS;
        // The checks and flags of the interleaved format, on a device big enough for them.
        let mut sb = Superblock::new_for_format(&q, u64::MAX >> 16)?;
        sb.log2_interleave_sectors = 0;
        let spb = u64::from(p.sector_size / 512);
        sb.provided_data_sectors = data_sectors & !(spb - 1);
        if sb.provided_data_sectors == 0 {
            return Err(FormatError::Rule(format!(
                "the data device ({} bytes) is smaller than one {}-byte block",
                data_sectors * 512,
                p.sector_size
            )));
        }
        let journal_sectors = if p.journal_sectors == 0 {
            (data_sectors >> DEFAULT_JOURNAL_SIZE_FACTOR).min(DEFAULT_MAX_JOURNAL_SECTORS)
        } else {
            p.journal_sectors
        };
        sb.journal_sections = 1;
        let section = u64::from(JournalShape::of(&sb).section_sectors);
        let wanted = u32::try_from(journal_sectors / section)
            .unwrap_or(u32::MAX)
            .max(1);
        let mut log2_buffer = log2_buffer_sectors(buffer_sectors);
        loop {
            let mut sections = 0u32;
            for bit in (0..32 - wanted.leading_zeros()).rev() {
                let test = sections | (1 << bit);
                if test > wanted {
                    continue;
                }
                sb.journal_sections = test;
                if separate_limits(&sb, meta_sectors, log2_buffer).is_some() {
                    sections = test;
                }
            }
            if sections > 0 {
                sb.journal_sections = sections;
                break;
            }
            if log2_buffer > 3 {
                log2_buffer -= 1;
                continue;
            }
            return Err(FormatError::Rule(format!(
                "the metadata device ({} bytes) is too small for the superblock, one journal \
                 section and the tags of {} bytes of data",
                meta_sectors * 512,
                sb.provided_data_sectors * 512
            )));
        }
        sb.log2_blocks_per_bitmap_bit =
            log2_blocks_per_bitmap_bit(&sb, p.sectors_per_bitmap_bit.unwrap_or(0));
        sb.version = sb.version_for(p.bitmap_mode);
        Ok(sb)
    }

    /// The version the kernel writes for these flags (`sb_set_version`): 5 with a fixed
    /// HMAC, 4 with fixed padding, 3 in bitmap mode or with a dirty bitmap, 2 when
    /// recalculating or with a separate metadata device, else 1.
    pub fn version_for(&self, bitmap_mode: bool) -> u8 {
        let f = self.flags;
        if f.has(Flags::INLINE) {
            6
        } else if f.has(Flags::FIXED_HMAC) {
            5
        } else if f.has(Flags::FIXED_PADDING) {
            4
        } else if bitmap_mode || f.has(Flags::DIRTY_BITMAP) {
            3
        } else if f.has(Flags::RECALCULATING) || self.separate_metadata() {
            2
        } else {
            1
        }
    }

    /// The first sector as the kernel writes it back: the fields over the sector as read
    /// (padding and the superblock MAC area kept).
    pub fn to_sector(&self) -> [u8; 512] {
        let mut s = [0u8; 512];
        s.copy_from_slice(&self.raw[..512]);
        s[..8].copy_from_slice(MAGIC);
        s[8] = self.version;
        s[9] = self.log2_interleave_sectors;
        s[10..12].copy_from_slice(&self.tag_size.to_le_bytes());
        s[12..16].copy_from_slice(&self.journal_sections.to_le_bytes());
        s[16..24].copy_from_slice(&self.provided_data_sectors.to_le_bytes());
        s[24..28].copy_from_slice(&self.flags.0.to_le_bytes());
        s[28] = self.log2_sectors_per_block;
        s[29] = self.log2_blocks_per_bitmap_bit;
        s[32..40].copy_from_slice(&self.recalc_sector.to_le_bytes());
        s[48..64].copy_from_slice(&self.salt);
        s
    }

    /// Bytes of a block (512 to 4096).
    pub fn block_bytes(&self) -> u32 {
        512 << self.log2_sectors_per_block
    }

    /// `integritysetup dump`'s text (cryptsetup 2.6), for the device named `device`.
    pub fn dump(&self, device: &str) -> String {
        let f = self.flags;
        let mut s = format!(
            "Info for integrity device {device}.\nsuperblock_version {}\n\
             log2_interleave_sectors {}\nintegrity_tag_size {}\njournal_sections {}\n\
             provided_data_sectors {}\nsector_size {}\n",
            self.version,
            self.log2_interleave_sectors,
            self.tag_size,
            self.journal_sections,
            self.provided_data_sectors,
            self.block_bytes()
        );
        if self.version >= 2 && f.has(Flags::RECALCULATING) {
            s += &format!("recalc_sector {}\n", self.recalc_sector);
        }
        s += &format!(
            "log2_blocks_per_bitmap {}\n",
            self.log2_blocks_per_bitmap_bit
        );
        s += "flags ";
        for (flag, name) in [
            (Flags::HAVE_JOURNAL_MAC, "have_journal_mac "),
            (Flags::RECALCULATING, "recalculating "),
            (Flags::DIRTY_BITMAP, "dirty_bitmap "),
            (Flags::FIXED_PADDING, "fix_padding "),
            (Flags::FIXED_HMAC, "fix_hmac "),
        ] {
            if f.has(flag) {
                s += name;
            }
        }
        s += "\n";
        s
    }
}

/// What `integritysetup format` decides (the kernel's table arguments at format time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatParams {
    /// Bytes per block (`--sector-size`, `block_size:`).
    pub sector_size: u32,
    /// Tag bytes (`--tag-size`; the hash's digest size by default).
    pub tag_size: u32,
    /// Journal sectors (`--journal-size` / 512; 0: the kernel's default).
    pub journal_sectors: u64,
    /// `--interleave-sectors` (0: 32768).
    pub interleave_sectors: u32,
    /// The journal has a MAC (`--journal-integrity`).
    pub journal_mac: bool,
    /// An internal hash or a journal MAC is set: with `fix_hmac` the salt is used.
    pub keyed_or_hashed: bool,
    /// `fix_hmac` (integritysetup passes it unless `--integrity-legacy-hmac`).
    pub fix_hmac: bool,
    /// `fix_padding` (integritysetup passes it unless `--integrity-legacy-padding`).
    pub fix_padding: bool,
    /// Formatted for bitmap mode (version 3 without the later flags).
    pub bitmap_mode: bool,
    /// `--bitmap-sectors-per-bit` (`None`: 32768).
    pub sectors_per_bitmap_bit: Option<u64>,
    /// The salt, with `fix_hmac` (random in the kernel).
    pub salt: [u8; SALT_SIZE],
}

impl Default for FormatParams {
    fn default() -> Self {
        FormatParams {
            sector_size: 512,
            tag_size: 4,
            journal_sectors: 0,
            interleave_sectors: 0,
            journal_mac: false,
            keyed_or_hashed: true,
            fix_hmac: true,
            fix_padding: true,
            bitmap_mode: false,
            sectors_per_bitmap_bit: None,
            salt: [0; SALT_SIZE],
        }
    }
}

/// The journal's shape for a superblock (`calculate_journal_section_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalShape {
    /// Bytes per entry (rounded up to 8).
    pub entry_size: u32,
    /// Entries per entry sector.
    pub entries_per_sector: u32,
    /// Entries per section (8 entry sectors).
    pub section_entries: u32,
    /// Sectors per section: 8 entry sectors and the entries' data.
    pub section_sectors: u32,
    /// Sections.
    pub sections: u32,
    /// Entries in the whole journal.
    pub entries: u64,
    /// Sectors per block.
    pub sectors_per_block: u32,
    /// Tag bytes.
    pub tag_size: u32,
    /// The journal has a MAC (entry sectors keep 8 bytes for it).
    pub mac: bool,
}

impl JournalShape {
    /// The journal of `sb`.
    pub fn of(sb: &Superblock) -> JournalShape {
        let spb = 1u32 << sb.log2_sectors_per_block;
        let tag = u32::from(sb.tag_size);
        let entry_size =
            (8 + 8 * spb + tag).div_ceil(JOURNAL_ENTRY_ROUNDUP) * JOURNAL_ENTRY_ROUNDUP;
        let mac = sb.flags.has(Flags::HAVE_JOURNAL_MAC);
        let space = JOURNAL_SECTOR_DATA - if mac { JOURNAL_MAC_PER_SECTOR } else { 0 };
        let entries_per_sector = space / entry_size;
        let section_entries = entries_per_sector * JOURNAL_BLOCK_SECTORS;
        JournalShape {
            entry_size,
            entries_per_sector,
            section_entries,
            section_sectors: section_entries * spb + JOURNAL_BLOCK_SECTORS,
            sections: sb.journal_sections,
            entries: u64::from(section_entries) * u64::from(sb.journal_sections),
            sectors_per_block: spb,
            tag_size: tag,
            mac,
        }
    }

    /// Sectors of the whole journal.
    pub fn sectors(&self) -> u64 {
        u64::from(self.section_sectors) * u64::from(self.sections)
    }

    /// Entry `n` of a section: the entry sector holding it and its byte offset there
    /// (entries go round the 8 entry sectors: `n % 8`, slot `n / 8`).
    pub fn entry_location(&self, n: u32) -> (u32, usize) {
        (
            n % JOURNAL_BLOCK_SECTORS,
            ((n / JOURNAL_BLOCK_SECTORS) * self.entry_size) as usize,
        )
    }

    /// The byte offset of entry `n` within its section's bytes.
    pub fn entry_offset(&self, n: u32) -> usize {
        let (sector, at) = self.entry_location(n);
        sector as usize * 512 + at
    }

    /// The section-relative sector of data sector `s` of entry `n`.
    pub fn data_sector(&self, n: u32, s: u32) -> u32 {
        JOURNAL_BLOCK_SECTORS + n * self.sectors_per_block + s
    }

    /// The byte offset of the tag within an entry.
    pub fn tag_offset(&self) -> usize {
        (8 + 8 * self.sectors_per_block) as usize
    }
}

/// The four commit ids of a journal (the kernel's `ic->commit_ids`): [`COMMIT_IDS`], or,
/// with a stream cipher as `journal_crypt`, those encrypted (see [`encrypted_commit_ids`]).
pub type CommitIds = [u64; N_COMMIT_IDS as usize];

/// The commit ids of a journal encrypted with a stream cipher: the kernel encrypts
/// [`COMMIT_IDS`] (as little-endian bytes) with the keystream that follows the journal's
/// pages, `keystream_tail` (32 bytes), then makes equal ids distinct by adding 1 to the
/// later one until none repeats (`create_journal`).
pub fn encrypted_commit_ids(keystream_tail: &[u8; 32]) -> CommitIds {
    let mut ids = COMMIT_IDS;
    for (k, id) in ids.iter_mut().enumerate() {
        *id ^= le64(keystream_tail, 8 * k);
    }
    for i in 0..ids.len() {
        while ids[..i].contains(&ids[i]) {
            ids[i] = ids[i].wrapping_add(1);
        }
    }
    ids
}

/// The commit id of sector `j` of section `i` in commit sequence `seq` (as the `le64` read
/// from disk), with the kernel's default ids.
pub fn commit_id(section: u32, sector: u32, seq: u8) -> u64 {
    commit_id_in(&COMMIT_IDS, section, sector, seq)
}

/// The commit id of sector `j` of section `i` in commit sequence `seq` with the ids `ids`.
pub fn commit_id_in(ids: &CommitIds, section: u32, sector: u32, seq: u8) -> u64 {
    ids[usize::from(seq % N_COMMIT_IDS)] ^ ((u64::from(section) << 32) ^ u64::from(sector))
}

/// The sequence whose commit id sector `j` of section `i` carries, if any.
pub fn find_commit_seq(section: u32, sector: u32, id: u64) -> Option<u8> {
    find_commit_seq_in(&COMMIT_IDS, section, sector, id)
}

/// [`find_commit_seq`] with the ids `ids`.
pub fn find_commit_seq_in(ids: &CommitIds, section: u32, sector: u32, id: u64) -> Option<u8> {
    (0..N_COMMIT_IDS).find(|&k| commit_id_in(ids, section, sector, k) == id)
}

/// The next commit sequence.
pub fn next_commit_seq(seq: u8) -> u8 {
    (seq + 1) % N_COMMIT_IDS
}

/// The previous commit sequence.
pub fn prev_commit_seq(seq: u8) -> u8 {
    (seq + N_COMMIT_IDS - 1) % N_COMMIT_IDS
}

/// A journal entry's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Free.
    Unused,
    /// Being copied into the journal when the journal was written (the kernel skips it).
    InProgress,
    /// Holds the block of this logical sector.
    Sector(u64),
}

/// The state of the entry whose bytes start at `entry[0]`.
pub fn entry_state(entry: &[u8]) -> EntryState {
    match le32(entry, 4) {
        ENTRY_UNUSED_HI => EntryState::Unused,
        ENTRY_IN_PROGRESS_HI => EntryState::InProgress,
        _ => EntryState::Sector(le64(entry, 0)),
    }
}

/// Marks the entry at `entry[0]` unused (the kernel writes only the high half).
pub fn set_entry_unused(entry: &mut [u8]) {
    entry[4..8].copy_from_slice(&ENTRY_UNUSED_HI.to_le_bytes());
}

/// The geometry of a device: where each block's data and tag live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// The journal.
    pub journal: JournalShape,
    /// Superblock and journal sectors before the first area (`initial_sectors`).
    pub initial_sectors: u64,
    /// Tag sectors at the start of each area (`metadata_run`).
    pub metadata_run: u64,
    /// Data sectors per area, log2.
    pub log2_interleave_sectors: u8,
    /// Tag buffer sectors, log2 (`log2_buffer_sectors`, from the table's `buffer_sectors`
    /// bounded by the metadata run): tags are addressed in buffers of this size.
    pub log2_buffer_sectors: u8,
    /// The data the device provides, in 512-byte sectors.
    pub provided_data_sectors: u64,
    /// Sectors per block, log2.
    pub log2_sectors_per_block: u8,
    /// Tag bytes.
    pub tag_size: u32,
    /// The tags and the journal are on a separate metadata device, the data alone on the
    /// data device ([`Geometry::new_separate`]).
    pub separate: bool,
}

/// The kernel's `calculate_device_limits` for a device without a metadata device: the
/// metadata run, and whether `provided` data sectors fit `device_sectors`.
fn device_limits(sb: &Superblock, provided: u64, device_sectors: u64) -> Option<(u64, u64)> {
    if sb.log2_interleave_sectors < sb.log2_sectors_per_block {
        // A separate metadata device's superblock (interleave 0): see `separate_limits`.
        return None;
    }
    let journal = JournalShape::of(sb);
    let initial = SB_SECTORS + journal.sectors();
    if initial + 8 >= device_sectors || initial > u64::from(u32::MAX) {
        return None;
    }
    let padding = if sb.flags.has(Flags::FIXED_PADDING) {
        FIXED_PADDING_BYTES
    } else {
        LEGACY_PADDING_BYTES
    };
    let tags_per_area = u64::from(sb.tag_size).checked_shl(u32::from(
        sb.log2_interleave_sectors - sb.log2_sectors_per_block,
    ))?;
    let metadata_run = tags_per_area.checked_next_multiple_of(padding)? >> 9;
    if provided == 0 {
        return None;
    }
    let last = provided - 1;
    let area = last >> sb.log2_interleave_sectors;
    let offset = last & ((1u64 << sb.log2_interleave_sectors) - 1);
    let last_sector = (area << sb.log2_interleave_sectors)
        .checked_add(area.checked_add(1)?.checked_mul(metadata_run)?)?
        .checked_add(initial)?
        .checked_add(offset)?;
    (last_sector < device_sectors).then_some((initial, metadata_run))
}

/// The table's `buffer_sectors` as the kernel takes it (`log2_buffer_sectors`: a power of
/// two, at least 1, at most 2^22).
fn log2_buffer_sectors(buffer_sectors: u32) -> u8 {
    (31 - buffer_sectors.max(1).leading_zeros()).min(31 - 9) as u8
}

/// The kernel's `calculate_device_limits` with a separate metadata device of
/// `meta_sectors`: the sectors before the tags (superblock and journal) when the superblock,
/// the journal and the tags of every provided block (in whole tag buffers of
/// 2^`log2_buffer` sectors) fit it.
fn separate_limits(sb: &Superblock, meta_sectors: u64, log2_buffer: u8) -> Option<u64> {
    let journal = JournalShape::of(sb);
    let initial = SB_SECTORS + journal.sectors();
    if initial + 8 >= meta_sectors || initial > u64::from(u32::MAX) {
        return None;
    }
    let blocks = sb.provided_data_sectors >> sb.log2_sectors_per_block;
    let bytes = blocks.checked_mul(u64::from(sb.tag_size))?;
    let buffer_bytes = 1u64 << (9 + u32::from(log2_buffer));
    let meta = bytes.div_ceil(buffer_bytes) << log2_buffer;
    (initial.checked_add(meta)? <= meta_sectors).then_some(initial)
}

/// The most data a device of `device_sectors` provides with this superblock's journal and
/// tags (`get_provided_data_sectors`: the kernel sets bits from the top while it fits).
pub fn max_provided_data_sectors(sb: &Superblock, device_sectors: u64) -> u64 {
    let mut provided = 0u64;
    if device_sectors == 0 {
        return 0;
    }
    let top = 63 - device_sectors.leading_zeros();
    for bit in (3..=top).rev() {
        let test = provided | (1u64 << bit);
        if device_limits(sb, test, device_sectors).is_some() {
            provided = test;
        }
    }
    provided
}

/// The kernel's choice of `log2_blocks_per_bitmap_bit` for a table's `sectors_per_bit`
/// (0: the default, 32768): at least a block, and grown until the bitmap fits the journal
/// area.
pub fn log2_blocks_per_bitmap_bit(sb: &Superblock, sectors_per_bit: u64) -> u8 {
    let mut log2 = if sectors_per_bit == 0 {
        DEFAULT_SECTORS_PER_BITMAP_BIT.trailing_zeros()
    } else {
        63 - sectors_per_bit.leading_zeros()
    };
    log2 = log2.max(u32::from(sb.log2_sectors_per_block));
    let journal = JournalShape::of(sb);
    let bits_in_journal = (journal.sectors() << 12).min(u64::from(u32::MAX));
    if bits_in_journal > 0 {
        while log2 < 63 && bits_in_journal < (sb.provided_data_sectors + (1u64 << log2) - 1) >> log2
        {
            log2 += 1;
        }
    }
    (log2 - u32::from(sb.log2_sectors_per_block)) as u8
}

impl Geometry {
    /// The geometry of `sb` on a device of `device_sectors`, with the table's
    /// `buffer_sectors` (the kernel's default: [`DEFAULT_BUFFER_SECTORS`]).
    ///
    /// # Errors
    /// [`FormatError::Header`] when the superblock's data does not fit the device.
    pub fn new(
        sb: &Superblock,
        device_sectors: u64,
        buffer_sectors: u32,
    ) -> Result<Geometry, FormatError> {
        if sb.separate_metadata() {
            return Err(FormatError::NotSupported(
                "this dm-integrity superblock is of a device with a separate metadata device \
                 (interleave 0): it holds the journal and tags only, the data is on another \
                 device (integritysetup open META NAME --data-device DATA, or meta_device: in \
                 the table)"
                    .into(),
            ));
        }
        let (initial, metadata_run) = device_limits(sb, sb.provided_data_sectors, device_sectors)
            .ok_or_else(|| {
            bad(format!(
                "{} provided data sectors do not fit the device ({device_sectors} sectors) \
                     with {} journal sections",
                sb.provided_data_sectors, sb.journal_sections
            ))
        })?;
        let log2_buffer = log2_buffer_sectors(buffer_sectors);
        let log2_buffer = log2_buffer.min(metadata_run.trailing_zeros() as u8);
        Ok(Geometry {
            journal: JournalShape::of(sb),
            initial_sectors: initial,
            metadata_run,
            log2_interleave_sectors: sb.log2_interleave_sectors,
            log2_buffer_sectors: log2_buffer,
            provided_data_sectors: sb.provided_data_sectors,
            log2_sectors_per_block: sb.log2_sectors_per_block,
            tag_size: u32::from(sb.tag_size),
            separate: false,
        })
    }

    /// The geometry of `sb` with a separate metadata device of `meta_sectors` (superblock,
    /// journal, then the tags of blocks 0, 1, ... one after the other) and a data device
    /// of `data_sectors` (block n at block n), as the kernel's `dm_integrity_ctr` sets it up
    /// for `meta_device:`: the data device's whole blocks are provided (the superblock's
    /// `provided_data_sectors` is brought to that on open), and tag buffers of
    /// `buffer_sectors` shrink (down to 8 sectors) until the tags fit.
    ///
    /// # Errors
    /// [`FormatError::Header`] when the superblock is not of a separate metadata device;
    /// [`FormatError::Rule`] when the data device holds no block, or the metadata device is
    /// too small for the journal and the tags of the data device's blocks.
    pub fn new_separate(
        sb: &Superblock,
        meta_sectors: u64,
        data_sectors: u64,
        buffer_sectors: u32,
    ) -> Result<Geometry, FormatError> {
        if !sb.separate_metadata() {
            return Err(bad(format!(
                "interleave sectors 2^{}: the superblock is of a device that keeps its data \
                 beside its tags, not of a separate metadata device (open it without a data \
                 device)",
                sb.log2_interleave_sectors
            )));
        }
        let mut sized = sb.clone();
        sized.provided_data_sectors = data_sectors & !((1u64 << sb.log2_sectors_per_block) - 1);
        if sized.provided_data_sectors == 0 {
            return Err(FormatError::Rule(format!(
                "the data device ({} bytes) is too small: it holds no whole {}-byte block",
                data_sectors * 512,
                sb.block_bytes()
            )));
        }
        let mut log2_buffer = log2_buffer_sectors(buffer_sectors);
        let initial = loop {
            if let Some(i) = separate_limits(&sized, meta_sectors, log2_buffer) {
                break i;
            }
            if log2_buffer > 3 {
                log2_buffer -= 1;
                continue;
            }
            return Err(FormatError::Rule(format!(
                "the metadata device ({} bytes) is too small for the superblock, {} journal \
                 sections and the tags of the data device's {} bytes",
                meta_sectors * 512,
                sb.journal_sections,
                sized.provided_data_sectors * 512
            )));
        };
        Ok(Geometry {
            journal: JournalShape::of(sb),
            initial_sectors: initial,
            metadata_run: 1,
            log2_interleave_sectors: 0,
            log2_buffer_sectors: log2_buffer,
            provided_data_sectors: sized.provided_data_sectors,
            log2_sectors_per_block: sb.log2_sectors_per_block,
            tag_size: u32::from(sb.tag_size),
            separate: true,
        })
    }

    /// Bytes per block.
    pub fn block_bytes(&self) -> u64 {
        512 << self.log2_sectors_per_block
    }

    /// Data sectors per area.
    pub fn interleave_sectors(&self) -> u64 {
        1 << self.log2_interleave_sectors
    }

    /// Sectors from logical `sector` to the end of its area (with a separate metadata
    /// device the data is one area: to the end of the device).
    pub fn area_room(&self, sector: u64) -> u64 {
        if self.separate {
            return self.provided_data_sectors.saturating_sub(sector).max(1);
        }
        self.interleave_sectors() - self.area_offset(sector).1
    }

    /// The area of a logical sector and the sector's offset in it.
    pub fn area_offset(&self, sector: u64) -> (u64, u64) {
        if self.separate {
            return (0, sector);
        }
        (
            sector >> self.log2_interleave_sectors,
            sector & (self.interleave_sectors() - 1),
        )
    }

    /// The device sector holding logical `sector`'s data (`get_data_sector`; on the data
    /// device, the same sector, with a separate metadata device).
    pub fn data_sector(&self, sector: u64) -> u64 {
        if self.separate {
            return sector;
        }
        let (area, offset) = self.area_offset(sector);
        (area << self.log2_interleave_sectors)
            + (area + 1) * self.metadata_run
            + self.initial_sectors
            + offset
    }

    /// The device byte holding the first byte of logical `sector`'s tag
    /// (`get_metadata_sector_and_offset`, with its addressing by tag buffers; the tags of
    /// an area's blocks follow each other).
    pub fn tag_byte(&self, sector: u64) -> u64 {
        if self.separate {
            return (self.initial_sectors << 9)
                + (sector >> self.log2_sectors_per_block) * u64::from(self.tag_size);
        }
        let (area, offset) = self.area_offset(sector);
        let buffer = ((area << self.log2_interleave_sectors) + area * self.metadata_run)
            >> self.log2_buffer_sectors;
        let block = offset >> self.log2_sectors_per_block;
        ((self.initial_sectors + (buffer << self.log2_buffer_sectors)) << 9)
            + block * u64::from(self.tag_size)
    }

    /// The device byte of sector `j` of journal section `section`.
    pub fn journal_byte(&self, section: u32, j: u32) -> u64 {
        (SB_SECTORS + u64::from(section) * u64::from(self.journal.section_sectors) + u64::from(j))
            << 9
    }

    /// Bitmap blocks (4 KiB each, from the journal's first sector) for `log2_blocks_per_bit`.
    pub fn bitmap_blocks(&self, log2_blocks_per_bit: u8) -> u64 {
        let blocks = self.provided_data_sectors >> self.log2_sectors_per_block;
        let bits = (blocks + (1u64 << log2_blocks_per_bit) - 1) >> log2_blocks_per_bit;
        bits.div_ceil(BITMAP_BLOCK_SIZE * 8)
    }
}

/// What the kernel does with the journal it finds when it opens a device
/// (`replay_journal`), decided from the commit ids and entries of every section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayPlan {
    /// Sections to copy to their places, oldest first: (first section, count), wrapping
    /// round the journal; `None` when the journal holds nothing.
    pub replay: Option<(u32, u32)>,
    /// After the replay: `Continue` the journal where it stands, or `Clear` it.
    pub then: AfterReplay,
}

/// The journal's state after a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterReplay {
    /// The journal is consistent: new commits go on from `section` with sequence `seq`.
    Continue {
        /// The next section to fill.
        section: u32,
        /// Its commit sequence.
        seq: u8,
    },
    /// Part of the journal was torn: every section is rewritten empty with sequence
    /// `erase_seq`, in the order `from`, `from + 1`, ... (wrapping), and commits restart
    /// at section 0 with the next sequence.
    Clear {
        /// The first section rewritten.
        from: u32,
        /// The sequence of the rewritten sections.
        erase_seq: u8,
    },
}

impl ReplayPlan {
    /// Decides the replay from the whole journal's bytes (`journal.sections ×
    /// section_sectors × 512`) as the kernel does; `journal_mode` is whether the device is
    /// opened in journal mode (a consistent journal is only continued in that mode).
    ///
    /// # Errors
    /// [`FormatError::Header`] when a sector carries no valid commit id, or every sequence
    /// is in use: the kernel fails the device then ("journal commit id").
    pub fn decide(
        shape: &JournalShape,
        journal: &[u8],
        journal_mode: bool,
    ) -> Result<ReplayPlan, FormatError> {
        Self::decide_with(shape, journal, journal_mode, &COMMIT_IDS)
    }

    /// [`ReplayPlan::decide`] for a journal whose commit ids are `ids` (a journal
    /// encrypted with a stream cipher; `journal` is the decrypted journal).
    ///
    /// # Errors
    /// As [`ReplayPlan::decide`].
    pub fn decide_with(
        shape: &JournalShape,
        journal: &[u8],
        journal_mode: bool,
        ids: &CommitIds,
    ) -> Result<ReplayPlan, FormatError> {
        let sections = shape.sections;
        let section_bytes = shape.section_sectors as usize * 512;
        if journal.len() < sections as usize * section_bytes {
            return Err(bad("the journal is shorter than its sections"));
        }
        let id_at =
            |i: u32, j: u32| le64(journal, i as usize * section_bytes + j as usize * 512 + 504);
        let mut used = [false; N_COMMIT_IDS as usize];
        let mut max_section = [0u32; N_COMMIT_IDS as usize];
        let mut empty = true;
        for i in 0..sections {
            for j in 0..shape.section_sectors {
                let k = find_commit_seq_in(ids, i, j, id_at(i, j)).ok_or_else(|| {
                    bad(format!(
                        "journal section {i} sector {j} has no valid commit id (the kernel \
                         fails such a device; a journal encrypted with journal_crypt reads \
                         so without its cipher and key)"
                    ))
                })?;
                used[usize::from(k)] = true;
                max_section[usize::from(k)] = i;
            }
            if empty {
                let base = i as usize * section_bytes;
                empty = (0..shape.section_entries).all(|n| {
                    entry_state(&journal[base + shape.entry_offset(n)..]) == EntryState::Unused
                });
            }
        }
        let last = usize::from(N_COMMIT_IDS - 1);
        let unused: u8 = if !used[last] {
            let mut u = N_COMMIT_IDS - 1;
            while u > 0 && !used[usize::from(u - 1)] {
                u -= 1;
            }
            u
        } else {
            match (0..N_COMMIT_IDS).find(|&k| !used[usize::from(k)]) {
                Some(u) => u,
                None => return Err(bad("every journal commit sequence is in use")),
            }
        };
        let last_used = prev_commit_seq(unused);
        let mut want = prev_commit_seq(last_used);
        if !used[usize::from(want)] && used[usize::from(prev_commit_seq(want))] {
            empty = true;
        }
        let mut write_start = max_section[usize::from(last_used)] + 1;
        if write_start >= sections {
            want = next_commit_seq(want);
            write_start -= sections;
        }
        let mut i = write_start;
        let mut write_sections = 0u32;
        'count: while write_sections < sections {
            for j in 0..shape.section_sectors {
                if id_at(i, j) != commit_id_in(ids, i, j, want) {
                    break 'count;
                }
            }
            write_sections += 1;
            i += 1;
            if i >= sections {
                want = next_commit_seq(want);
                i -= sections;
            }
        }
        let replay = (!empty && write_sections > 0).then_some((write_start, write_sections));
        let then = if write_sections == sections && (journal_mode || empty) {
            AfterReplay::Continue {
                section: write_start,
                seq: want,
            }
        } else {
            AfterReplay::Clear {
                from: write_start,
                erase_seq: prev_commit_seq(prev_commit_seq(last_used)),
            }
        };
        Ok(ReplayPlan { replay, then })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The superblock `integritysetup format` (cryptsetup 2.6.1, Linux 6.12) wrote on a
    /// 4 MiB file with the defaults (crc32c, 512-byte sectors): the first 64 bytes of
    /// testdata/integrity/crc32c-512-J.img.
    fn kernel_sb_crc32c_512() -> Vec<u8> {
        let mut s = vec![0u8; 512];
        s[..8].copy_from_slice(b"integrt\0");
        s[8] = 5;
        s[9] = 15;
        s[10..12].copy_from_slice(&4u16.to_le_bytes());
        s[12..16].copy_from_slice(&1u32.to_le_bytes());
        s[16..24].copy_from_slice(&7752u64.to_le_bytes());
        s[24..28].copy_from_slice(&0x18u32.to_le_bytes());
        s[29] = 15;
        s
    }

    #[test]
    fn the_kernels_defaults_give_its_geometry() {
        let sb = Superblock::parse(&kernel_sb_crc32c_512()).unwrap();
        let shape = JournalShape::of(&sb);
        // entry: 8 (sector) + 8 (last bytes) + 4 (tag) -> 24; 504 / 24 = 21 per sector.
        assert_eq!(shape.entry_size, 24);
        assert_eq!(shape.section_entries, 168);
        // The table the kernel showed: journal_sectors:176.
        assert_eq!(shape.section_sectors, 176);
        let geo = Geometry::new(&sb, 8192, DEFAULT_BUFFER_SECTORS).unwrap();
        assert_eq!(geo.initial_sectors, 184);
        // 4 bytes x 32768 blocks = 128 KiB, a multiple of the 4 KiB padding: 256 sectors.
        assert_eq!(geo.metadata_run, 256);
        assert_eq!(geo.data_sector(0), 184 + 256);
        assert_eq!(geo.tag_byte(0), 184 * 512);
        assert_eq!(geo.tag_byte(7751), 184 * 512 + 7751 * 4);
        // The kernel chose 7752 for this device: the largest that fits.
        assert_eq!(max_provided_data_sectors(&sb, 8192), 7752);
    }

    #[test]
    fn refusals_name_the_field() {
        let mut s = kernel_sb_crc32c_512();
        s[8] = 7;
        assert!(Superblock::parse(&s)
            .unwrap_err()
            .to_string()
            .contains("version 7"));
        let mut s = kernel_sb_crc32c_512();
        s[24] = 0x58;
        assert!(Superblock::parse(&s)
            .unwrap_err()
            .to_string()
            .contains("0x40"));
        let mut s = kernel_sb_crc32c_512();
        s[24] = 0x38;
        assert!(Superblock::parse(&s)
            .unwrap_err()
            .to_string()
            .contains("inline"));
        let mut s = kernel_sb_crc32c_512();
        s[0] = b'X';
        assert!(Superblock::parse(&s)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let s = vec![0u8; 512];
        assert!(Superblock::parse(&s)
            .unwrap_err()
            .to_string()
            .contains("not formatted"));
        let mut s = kernel_sb_crc32c_512();
        s[10..12].copy_from_slice(&425u16.to_le_bytes());
        assert!(Superblock::parse(&s)
            .unwrap_err()
            .to_string()
            .contains("tag size 425"));
    }

    #[test]
    fn sector_round_trips() {
        let raw = kernel_sb_crc32c_512();
        let sb = Superblock::parse(&raw).unwrap();
        assert_eq!(sb.to_sector().to_vec(), raw);
    }

    /// A fresh journal (every sector with sequence 0, every entry unused): the kernel
    /// replays nothing and continues at section 0 with the next pass's sequence, 1.
    #[test]
    fn a_fresh_journal_is_continued_from_the_start() {
        let sb = Superblock::parse(&kernel_sb_crc32c_512()).unwrap();
        let mut shape = JournalShape::of(&sb);
        shape.sections = 3;
        let mut j = vec![0u8; shape.sectors() as usize * 512];
        fill(&shape, &mut j, |_| 0);
        let plan = ReplayPlan::decide(&shape, &j, true).unwrap();
        assert_eq!(plan.replay, None);
        assert_eq!(plan.then, AfterReplay::Continue { section: 0, seq: 1 });
        // Section 0 of the second pass committed (sequence 1) with an entry: replay from
        // section 1 (the oldest, sequence 0) round to section 0, continue at section 1.
        fill(&shape, &mut j, |i| if i == 0 { 1 } else { 0 });
        let e = shape.entry_offset(0);
        j[e..e + 8].copy_from_slice(&16u64.to_le_bytes());
        let plan = ReplayPlan::decide(&shape, &j, true).unwrap();
        assert_eq!(plan.replay, Some((1, 3)));
        assert_eq!(plan.then, AfterReplay::Continue { section: 1, seq: 1 });
        // Not in journal mode, a consistent journal with entries is replayed and cleared.
        let plan = ReplayPlan::decide(&shape, &j, false).unwrap();
        assert_eq!(plan.replay, Some((1, 3)));
        assert!(matches!(plan.then, AfterReplay::Clear { from: 1, .. }));
        // Section 1 torn while the second pass wrote it (its sector 5 still from the first
        // pass): replay sections 2 and 0, then clear the journal.
        fill(&shape, &mut j, |i| if i == 2 { 0 } else { 1 });
        j[e..e + 8].copy_from_slice(&16u64.to_le_bytes());
        let s = (shape.section_sectors as usize + 5) * 512 + 504;
        j[s..s + 8].copy_from_slice(&commit_id(1, 5, 0).to_le_bytes());
        let plan = ReplayPlan::decide(&shape, &j, true).unwrap();
        assert_eq!(plan.replay, Some((2, 2)));
        assert_eq!(
            plan.then,
            AfterReplay::Clear {
                from: 2,
                erase_seq: 3
            }
        );
        // A sector with no valid commit id fails the device, as in the kernel.
        j[s] ^= 1;
        assert!(ReplayPlan::decide(&shape, &j, true).is_err());
    }

    fn fill(shape: &JournalShape, j: &mut [u8], seq: impl Fn(u32) -> u8) {
        for i in 0..shape.sections {
            let base = i as usize * shape.section_sectors as usize * 512;
            for s in 0..shape.section_sectors {
                let at = base + s as usize * 512 + 504;
                j[at..at + 8].copy_from_slice(&commit_id(i, s, seq(i)).to_le_bytes());
            }
            for n in 0..shape.section_entries {
                set_entry_unused(&mut j[base + shape.entry_offset(n)..]);
            }
        }
    }
}

/// A dm-integrity table line (`<start> <length> integrity <device> <offset> <tag_size|->
/// <mode> <#args> <args>...`), as `dmsetup table` prints it and the kernel's
/// `dm_integrity_ctr` reads it. With `meta_device:META` the superblock, journal and tags are
/// on META (at `offset`) and the data alone on the line's device. Refused with the reason:
/// the inline mode `I`, `allow_discards`, `reset_recalculate`; a line without
/// `internal_hash` needs its tag size (tags from dm-crypt above).
#[derive(Clone, PartialEq, Eq)]
pub struct IntegrityLine {
    /// Start in the mapped device (512-byte sectors).
    pub start: u64,
    /// Length.
    pub length: u64,
    /// The device.
    pub device: crate::DeviceRef,
    /// Where the superblock is on the device (on the metadata device with `meta_device`), in
    /// 512-byte sectors.
    pub offset: u64,
    /// `meta_device:` (a separate metadata device: superblock, journal and tags).
    pub meta_device: Option<crate::DeviceRef>,
    /// Tag bytes (`-`: the hash's digest size).
    pub tag_size: Option<u32>,
    /// `J`, `D`, `B` or `R`.
    pub mode: char,
    /// `journal_sectors:` (format only).
    pub journal_sectors: Option<u32>,
    /// `interleave_sectors:` (format only).
    pub interleave_sectors: Option<u32>,
    /// `buffer_sectors:`.
    pub buffer_sectors: Option<u32>,
    /// `journal_watermark:` (percent).
    pub journal_watermark: Option<u32>,
    /// `commit_time:` (milliseconds).
    pub commit_time: Option<u32>,
    /// `block_size:` (bytes).
    pub block_size: Option<u32>,
    /// `sectors_per_bit:`.
    pub sectors_per_bit: Option<u64>,
    /// `bitmap_flush_interval:` (milliseconds).
    pub bitmap_flush_interval: Option<u32>,
    /// `internal_hash:ALG[:HEXKEY]` (the kernel's name, the key's bytes).
    pub internal_hash: Option<AlgKey>,
    /// `journal_crypt:ALG[:HEXKEY]` (the kernel's cipher name, e.g. `ctr(aes)`).
    pub journal_crypt: Option<AlgKey>,
    /// `journal_mac:ALG[:HEXKEY]`.
    pub journal_mac: Option<AlgKey>,
    /// `recalculate`.
    pub recalculate: bool,
    /// `fix_padding` (format only).
    pub fix_padding: bool,
    /// `fix_hmac` (format only).
    pub fix_hmac: bool,
    /// `legacy_recalculate`.
    pub legacy_recalculate: bool,
}

/// A table's algorithm and its key (`internal_hash:hmac(sha256):00...`).
pub type AlgKey = (String, Option<zeroize::Zeroizing<Vec<u8>>>);

fn table_err(msg: impl Into<String>) -> FormatError {
    FormatError::Table(msg.into())
}

fn alg_and_key(what: &str, v: &str) -> Result<AlgKey, FormatError> {
    let (alg, key) = match v.split_once(':') {
        Some((a, k)) => (a, Some(k)),
        None => (v, None),
    };
    let key = match key {
        None => None,
        Some(k) => {
            if k.len() % 2 != 0 || !k.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(table_err(format!("{what}: the key is not hex")));
            }
            let bytes: Vec<u8> = (0..k.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&k[i..i + 2], 16).unwrap_or(0))
                .collect();
            Some(zeroize::Zeroizing::new(bytes))
        }
    };
    Ok((alg.to_string(), key))
}

impl std::str::FromStr for IntegrityLine {
    type Err = FormatError;

    fn from_str(line: &str) -> Result<Self, FormatError> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 7 || f[2] != "integrity" {
            return Err(table_err(
                "an integrity target is \"<start> <length> integrity <device> <offset> \
                 <tag_size> <mode> <#args> [<args>...]\"",
            ));
        }
        let num = |i: usize, what: &str| -> Result<u64, FormatError> {
            f[i].parse().map_err(|_| {
                table_err(format!(
                    "integrity target: {what} \"{}\" is not a number",
                    f[i]
                ))
            })
        };
        let mode = match f[6] {
            "J" | "D" | "B" | "R" => f[6].chars().next().unwrap_or('J'),
            "I" => {
                return Err(FormatError::NotSupported(
                    "the dm-integrity inline mode I (tags in the drive's own metadata)".into(),
                ))
            }
            other => {
                return Err(table_err(format!(
                    "integrity target: mode \"{other}\" (J, D, B or R)"
                )))
            }
        };
        let mut l = IntegrityLine {
            start: num(0, "start")?,
            length: num(1, "length")?,
            device: crate::DeviceRef::from(f[3]),
            offset: num(4, "offset")?,
            tag_size: if f[5] == "-" {
                None
            } else {
                Some(num(5, "tag size")? as u32)
            },
            mode,
            meta_device: None,
            journal_sectors: None,
            interleave_sectors: None,
            buffer_sectors: None,
            journal_watermark: None,
            commit_time: None,
            block_size: None,
            sectors_per_bit: None,
            bitmap_flush_interval: None,
            internal_hash: None,
            journal_crypt: None,
            journal_mac: None,
            recalculate: false,
            fix_padding: false,
            fix_hmac: false,
            legacy_recalculate: false,
        };
        let n = match f.get(7) {
            Some(_) => num(7, "argument count")? as usize,
            None => 0,
        };
        if f.len() != 8 + n && !(n == 0 && f.len() == 7) {
            return Err(table_err(format!(
                "integrity target: {n} arguments announced, {} given",
                f.len().saturating_sub(8)
            )));
        }
        let u32_of = |k: &str, v: &str| -> Result<u32, FormatError> {
            v.parse()
                .map_err(|_| table_err(format!("integrity target: {k}:{v} is not a number")))
        };
        for a in f.iter().skip(8) {
            let (k, v) = a.split_once(':').unwrap_or((a, ""));
            match k {
                "journal_sectors" => l.journal_sectors = Some(u32_of(k, v)?),
                "interleave_sectors" => l.interleave_sectors = Some(u32_of(k, v)?),
                "buffer_sectors" => l.buffer_sectors = Some(u32_of(k, v)?),
                "journal_watermark" => {
                    let w = u32_of(k, v)?;
                    if w > 100 {
                        return Err(table_err("integrity target: journal_watermark above 100"));
                    }
                    l.journal_watermark = Some(w);
                }
                "commit_time" => l.commit_time = Some(u32_of(k, v)?),
                "block_size" => {
                    let b = u32_of(k, v)?;
                    if !(512..=4096).contains(&b) || !b.is_power_of_two() {
                        return Err(table_err(format!("integrity target: block_size:{b}")));
                    }
                    l.block_size = Some(b);
                }
                "sectors_per_bit" => {
                    l.sectors_per_bit =
                        Some(v.parse().map_err(|_| {
                            table_err(format!("integrity target: sectors_per_bit:{v}"))
                        })?)
                }
                "bitmap_flush_interval" => l.bitmap_flush_interval = Some(u32_of(k, v)?),
                "internal_hash" => l.internal_hash = Some(alg_and_key(k, v)?),
                "journal_mac" => l.journal_mac = Some(alg_and_key(k, v)?),
                "journal_crypt" => l.journal_crypt = Some(alg_and_key(k, v)?),
                "recalculate" if v.is_empty() => l.recalculate = true,
                "fix_padding" if v.is_empty() => l.fix_padding = true,
                "fix_hmac" if v.is_empty() => l.fix_hmac = true,
                "legacy_recalculate" if v.is_empty() => l.legacy_recalculate = true,
                "meta_device" if !v.is_empty() => {
                    l.meta_device = Some(crate::DeviceRef::from(v));
                }
                "allow_discards" | "reset_recalculate" => {
                    return Err(FormatError::NotSupported(format!(
                        "the integrity target's {k} argument"
                    )))
                }
                _ => {
                    return Err(table_err(format!(
                        "integrity target: unknown argument \"{}\"",
                        crate::table::shown(a)
                    )))
                }
            }
        }
        if l.internal_hash.is_none() && l.tag_size.is_none() {
            return Err(table_err(
                "integrity target without internal_hash: the tag size is the crypt target's \
                 (a number, not -)",
            ));
        }
        Ok(l)
    }
}

/// Keys never appear in debug output.
impl std::fmt::Debug for IntegrityLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IntegrityLine({})", self.to_line_on(false, None))
    }
}

impl IntegrityLine {
    /// The line as `dmsetup table` prints it (keys shown only with `show_keys`), on
    /// `device` (a lower table's path) instead of its own when given.
    pub fn to_line_on(&self, show_keys: bool, device: Option<&str>) -> String {
        // The kernel's order (dm_integrity_status): meta_device, block_size and
        // recalculate first.
        let mut args: Vec<String> = Vec::new();
        if let Some(m) = &self.meta_device {
            args.push(format!("meta_device:{m}"));
        }
        if let Some(b) = self.block_size {
            args.push(format!("block_size:{b}"));
        }
        if self.recalculate {
            args.push("recalculate".into());
        }
        let mut opt = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                args.push(format!("{k}:{v}"));
            }
        };
        opt(
            "journal_sectors",
            self.journal_sectors.map(|v| v.to_string()),
        );
        opt(
            "interleave_sectors",
            self.interleave_sectors.map(|v| v.to_string()),
        );
        opt("buffer_sectors", self.buffer_sectors.map(|v| v.to_string()));
        opt(
            "journal_watermark",
            self.journal_watermark.map(|v| v.to_string()),
        );
        opt("commit_time", self.commit_time.map(|v| v.to_string()));
        opt(
            "sectors_per_bit",
            self.sectors_per_bit.map(|v| v.to_string()),
        );
        opt(
            "bitmap_flush_interval",
            self.bitmap_flush_interval.map(|v| v.to_string()),
        );
        for (flag, name) in [
            (self.fix_padding, "fix_padding"),
            (self.fix_hmac, "fix_hmac"),
            (self.legacy_recalculate, "legacy_recalculate"),
        ] {
            if flag {
                args.push(name.to_string());
            }
        }
        for (k, v) in [
            ("internal_hash", &self.internal_hash),
            ("journal_crypt", &self.journal_crypt),
            ("journal_mac", &self.journal_mac),
        ] {
            if let Some((alg, key)) = v {
                match key {
                    Some(key) if show_keys => {
                        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
                        args.push(format!("{k}:{alg}:{hex}"));
                    }
                    Some(_) => args.push(format!("{k}:{alg}:<key>")),
                    None => args.push(format!("{k}:{alg}")),
                }
            }
        }
        let dev = device.map_or_else(|| self.device.to_string(), str::to_string);
        let tag = self
            .tag_size
            .map_or_else(|| "-".to_string(), |t| t.to_string());
        let mut s = format!(
            "{} {} integrity {dev} {} {tag} {} {}",
            self.start,
            self.length,
            self.offset,
            self.mode,
            args.len()
        );
        for a in args {
            s.push(' ');
            s.push_str(&a);
        }
        s
    }
}

#[cfg(test)]
mod line_tests {
    use super::*;

    #[test]
    fn the_kernels_table_lines_parse_and_print_back() {
        // As `dmsetup table` printed them in the lab (testdata/integrity/*.table).
        for line in [
            "0 7752 integrity 7:0 0 4 J 8 journal_sectors:176 interleave_sectors:32768 \
             buffer_sectors:128 journal_watermark:50 commit_time:10000 fix_padding fix_hmac \
             internal_hash:crc32c",
            "0 7760 integrity 7:0 0 4 B 9 block_size:4096 journal_sectors:392 \
             interleave_sectors:32768 buffer_sectors:32 sectors_per_bit:32768 \
             bitmap_flush_interval:10000 fix_padding fix_hmac internal_hash:crc32c",
            "0 6048 integrity 7:0 0 32 J 9 journal_sectors:88 interleave_sectors:32768 \
             buffer_sectors:128 journal_watermark:50 commit_time:10000 fix_padding fix_hmac \
             internal_hash:hmac(sha256):000102 journal_mac:hmac(sha256):808182",
            // testdata/integrity/crc32c-4096-datadev-J.table
            "0 8192 integrity 7:0 0 4 J 9 meta_device:7:1 block_size:4096 journal_sectors:392 \
             interleave_sectors:1 buffer_sectors:128 journal_watermark:50 commit_time:10000 \
             fix_hmac internal_hash:crc32c",
        ] {
            let l: IntegrityLine = line.parse().unwrap();
            let printed = l.to_line_on(true, None);
            // The same words in the kernel's order.
            let want: Vec<&str> = line.split_whitespace().collect();
            let got: Vec<&str> = printed.split_whitespace().collect();
            assert_eq!(got, want, "{line}");
            assert!(!format!("{l:?}").contains("808182"), "no key in Debug");
        }
        let l: IntegrityLine = "0 8 integrity d 0 - J 1 internal_hash:hmac(sha256):0001"
            .parse()
            .unwrap();
        assert_eq!(
            l.internal_hash.as_ref().unwrap().1.as_deref().unwrap()[..],
            [0, 1]
        );
        assert!(!l.to_line_on(false, None).contains("0001"));
        for bad in [
            "0 8 integrity d 0 4 I 1 internal_hash:crc32c",
            "0 8 integrity d 0 4 J 1 meta_device:",
            "0 8 integrity d 0 4 J 1 allow_discards",
            "0 8 integrity d 0 - J 0",
            "0 8 integrity d 0 4 J 2 internal_hash:crc32c",
            "0 8 integrity d 0 4 X 1 internal_hash:crc32c",
            "0 8 integrity d 0 4 J 1 internal_hash:hmac(sha256):0g",
        ] {
            assert!(bad.parse::<IntegrityLine>().is_err(), "{bad}");
        }
    }
}
