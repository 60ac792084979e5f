//! dm-crypt table lines, as `dmsetup` takes them:
//!
//! ```text
//! <start> <length> crypt <cipher> <key> <iv_offset> <device> <offset> [<#opt_params> <opt_params>...]
//! ```
//!
//! All positions and lengths count 512-byte sectors. [`TableLine`] parses the line to typed
//! values (`FromStr`) and prints it back in the kernel's canonical form
//! ([`TableLine::to_line`], like `dmsetup table [--showkeys]`). Cross-field rules live in one
//! place, [`TableLine::validate`]. Mirrors `crypt_ctr`, `crypt_ctr_optional` and
//! `crypt_status` in drivers/md/dm-crypt.c (6.1) and Documentation/admin-guide/device-mapper/
//! dm-crypt.rst.

use crate::device::Device;
use crate::FormatError;
use std::fmt;
use std::str::FromStr;
use ucrypt_crypto::{CipherSpec, SectorCipher, SectorParams, SectorSize, VolumeKey};

/// One optional parameter, with dm-crypt's exact spelling in `FromStr` and `Display`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OptParam {
    /// `allow_discards`: pass discards down (leaks which blocks are unused).
    AllowDiscards,
    /// `same_cpu_crypt`: encrypt on the CPU that received the request.
    SameCpuCrypt,
    /// `submit_from_crypt_cpus`: crypt workers submit writes themselves, unordered.
    SubmitFromCryptCpus,
    /// `no_read_workqueue`: decrypt inline in the receiving thread.
    NoReadWorkqueue,
    /// `no_write_workqueue`: encrypt inline in the receiving thread.
    NoWriteWorkqueue,
    /// `high_priority`: run crypt workers at high priority.
    HighPriority,
    /// `integrity:<bytes>:aead`: an authenticated mode whose per-sector tag of that many
    /// bytes lives in the dm-integrity device below (the only kind ucrypt serves).
    Integrity(u32),
    /// `sector_size:<bytes>`: the encryption unit.
    SectorSize(u32),
    /// `iv_large_sectors`: count IVs in sector_size units instead of 512 bytes.
    IvLargeSectors,
}

/// Every flag parameter, in the kernel's canonical print order (sector_size and
/// iv_large_sectors come last, in that order).
pub const FLAG_PARAMS: [OptParam; 6] = [
    OptParam::AllowDiscards,
    OptParam::SameCpuCrypt,
    OptParam::SubmitFromCryptCpus,
    OptParam::NoReadWorkqueue,
    OptParam::NoWriteWorkqueue,
    OptParam::HighPriority,
];

impl OptParam {
    /// Position in the kernel's canonical print order.
    fn rank(self) -> u8 {
        match self {
            OptParam::AllowDiscards => 0,
            OptParam::SameCpuCrypt => 1,
            OptParam::SubmitFromCryptCpus => 2,
            OptParam::NoReadWorkqueue => 3,
            OptParam::NoWriteWorkqueue => 4,
            OptParam::HighPriority => 5,
            OptParam::Integrity(_) => 6,
            OptParam::SectorSize(_) => 7,
            OptParam::IvLargeSectors => 8,
        }
    }
}

impl fmt::Display for OptParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptParam::AllowDiscards => f.write_str("allow_discards"),
            OptParam::SameCpuCrypt => f.write_str("same_cpu_crypt"),
            OptParam::SubmitFromCryptCpus => f.write_str("submit_from_crypt_cpus"),
            OptParam::NoReadWorkqueue => f.write_str("no_read_workqueue"),
            OptParam::NoWriteWorkqueue => f.write_str("no_write_workqueue"),
            OptParam::HighPriority => f.write_str("high_priority"),
            OptParam::Integrity(n) => write!(f, "integrity:{n}:aead"),
            OptParam::SectorSize(n) => write!(f, "sector_size:{n}"),
            OptParam::IvLargeSectors => f.write_str("iv_large_sectors"),
        }
    }
}

impl FromStr for OptParam {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Self, FormatError> {
        let err = |reason: &str| FormatError::OptParam {
            param: shown(s),
            reason: reason.to_string(),
        };
        if let Some(v) = s.strip_prefix("sector_size:") {
            let n: u32 = v
                .parse()
                .map_err(|_| err("sector size must be a number of bytes"))?;
            return Ok(OptParam::SectorSize(n));
        }
        if let Some(v) = s.strip_prefix("integrity:") {
            let (n, kind) = v.split_once(':').unwrap_or((v, ""));
            let n: u32 = n
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| err("the tag size must be a positive number of bytes"))?;
            if kind != "aead" {
                return Err(FormatError::NotSupported(format!(
                    "\"{s}\" (ucrypt serves integrity:N:aead, an authenticated cipher over \
                     dm-integrity)"
                )));
            }
            return Ok(OptParam::Integrity(n));
        }
        for p in FLAG_PARAMS.into_iter().chain([OptParam::IvLargeSectors]) {
            if p.to_string() == s {
                return Ok(p);
            }
        }
        Err(err(
            "unknown (expected allow_discards, same_cpu_crypt, submit_from_crypt_cpus, \
             no_read_workqueue, no_write_workqueue, high_priority, sector_size:<bytes>, \
             iv_large_sectors)",
        ))
    }
}

/// Where the key comes from.
pub enum KeySource {
    /// Given in the line as hex (or `-`: no key).
    Hex(VolumeKey),
    /// `:<size>:<type>:<description>`: a kernel keyring key.
    Keyring {
        /// Key size in bytes.
        size: usize,
        /// `user` or `logon` (or another kernel key type).
        key_type: String,
        /// The key's description.
        description: String,
    },
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Hex(k) => write!(f, "Hex({k:?})"),
            KeySource::Keyring {
                size,
                key_type,
                description,
            } => {
                write!(f, "Keyring(:{size}:{key_type}:{description})")
            }
        }
    }
}

impl KeySource {
    fn parse(text: &str) -> Result<Self, FormatError> {
        let Some(rest) = text.strip_prefix(':') else {
            return Ok(KeySource::Hex(VolumeKey::from_hex(text)?));
        };
        let bad = |why: &str| {
            FormatError::Key(format!(
                "keyring key must be :<size>:<type>:<description> ({why})"
            ))
        };
        let mut it = rest.splitn(3, ':');
        let size: usize = it
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("size is not a number"))?;
        let key_type = it
            .next()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| bad("no key type"))?;
        let description = it
            .next()
            .filter(|d| !d.is_empty())
            .ok_or_else(|| bad("no description"))?;
        Ok(KeySource::Keyring {
            size,
            key_type: key_type.to_string(),
            description: description.to_string(),
        })
    }

    /// Obtains the key bytes (reads the keyring for keyring keys).
    ///
    /// # Errors
    /// [`FormatError::Key`] for unreadable keys, with the reason (`logon` keys cannot be
    /// read from userspace).
    pub fn load(&self) -> Result<VolumeKey, FormatError> {
        match self {
            KeySource::Hex(k) => Ok(VolumeKey::new(k.as_bytes().to_vec())),
            KeySource::Keyring {
                size,
                key_type,
                description,
            } => match key_type.as_str() {
                "user" => ucrypt_crypto::keyring::read_user_key(description, *size)
                    .map_err(|e| FormatError::Key(e.to_string())),
                "logon" => Err(FormatError::Key(format!(
                    "logon key \"{description}\" cannot be read from userspace (the kernel \
                     keeps logon keys for itself); store the key as a user key \
                     (keyctl add user ...) or pass it as hex"
                ))),
                other => Err(FormatError::Key(format!(
                    "keyring key type \"{other}\" cannot be read by ucrypt (only user keys)"
                ))),
            },
        }
    }
}

/// What `validate` allows beyond the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ValidateOptions {
    /// Accept sector sizes 8 KiB..64 KiB (seed 004). The kernel cannot open such volumes.
    pub allow_large_sectors: bool,
}

/// The device a crypt target reads its ciphertext from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceRef {
    /// A file or block device, an NBD export, an RBD image or a memory device, as written
    /// in the line or as the header was found.
    Device(Device),
    /// Table `n` of the same [`crate::mapping::Mapping`], which lies below the table of
    /// this line (a TCRYPT cascade layer, a stacked table input's `/dev/mapper/NAME`).
    Layer(usize),
}

impl DeviceRef {
    /// The path or URI, `None` for a lower table.
    pub fn path(&self) -> Option<&str> {
        match self {
            DeviceRef::Device(d) => Some(d.as_str()),
            DeviceRef::Layer(_) => None,
        }
    }

    /// The device, `None` for a lower table.
    pub fn device(&self) -> Option<&Device> {
        match self {
            DeviceRef::Device(d) => Some(d),
            DeviceRef::Layer(_) => None,
        }
    }
}

impl fmt::Display for DeviceRef {
    /// The path as written; a lower table as `table N of the mapping` (only in messages: a
    /// mapping prints its lower tables by name, see [`crate::mapping::Mapping::to_lines`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRef::Device(d) => f.write_str(d.as_str()),
            DeviceRef::Layer(n) => write!(f, "table {n} of the mapping"),
        }
    }
}

impl From<String> for DeviceRef {
    fn from(p: String) -> Self {
        DeviceRef::Device(Device::parse(&p))
    }
}

impl From<&str> for DeviceRef {
    fn from(p: &str) -> Self {
        DeviceRef::Device(Device::parse(p))
    }
}

impl PartialEq<str> for DeviceRef {
    fn eq(&self, other: &str) -> bool {
        self.path() == Some(other)
    }
}

impl PartialEq<&str> for DeviceRef {
    fn eq(&self, other: &&str) -> bool {
        self.path() == Some(*other)
    }
}

/// A parsed dm-crypt table line.
#[derive(Debug)]
pub struct TableLine {
    /// First logical sector of the target (must be 0 for a one-line table).
    pub start: u64,
    /// Length of the mapping in 512-byte sectors.
    pub length: u64,
    /// The cipher spec.
    pub cipher: CipherSpec,
    /// The key.
    pub key: KeySource,
    /// Added to sector numbers before computing IVs (512-byte sectors).
    pub iv_offset: u64,
    /// The device the ciphertext is on: a path, NBD URI or RBD image, or a lower table of
    /// the same [`crate::mapping::Mapping`] (the kernel prints major:minor).
    pub device: DeviceRef,
    /// Where the encrypted data starts on the device (512-byte sectors).
    pub offset: u64,
    /// Optional parameters, deduplicated, in canonical order.
    pub opts: Vec<OptParam>,
}

/// A field as it may appear in an error message. A malformed line can shift the key into
/// any field (a space inside the key, a missing cipher), so a field holding a run of 16+
/// hex digits (8+ key bytes) is described, not echoed: errors never carry key material.
/// Public for the layers that report a table's fields later (the device, when opening it
/// fails).
pub fn shown(text: &str) -> String {
    let mut run = 0;
    let hexy = text.bytes().any(|b| {
        run = if b.is_ascii_hexdigit() { run + 1 } else { 0 };
        run >= 16
    });
    if hexy {
        format!(
            "<{} characters, not shown: may be key material>",
            text.len()
        )
    } else {
        text.to_string()
    }
}

fn number(field: &str, text: &str) -> Result<u64, FormatError> {
    text.parse().map_err(|_| {
        FormatError::Table(format!(
            "{field} \"{}\" is not a whole number of sectors",
            shown(text)
        ))
    })
}

impl FromStr for TableLine {
    type Err = FormatError;

    fn from_str(line: &str) -> Result<Self, FormatError> {
        if line.trim().contains(['\n', '\r']) {
            // Several lines are several targets (or devices); read as one line they would
            // run together into one wrong target. `crate::mapping::Mapping` parses tables.
            return Err(FormatError::Table(
                "a table line cannot contain a line break: a table of several lines is \
                 several targets, parsed as a whole table, not as one line"
                    .into(),
            ));
        }
        let args: Vec<&str> = line.split_whitespace().collect();
        if args.len() < 8 {
            return Err(FormatError::Table(format!(
                "expected <start> <length> crypt <cipher> <key> <iv_offset> <device> <offset> \
                 [<#opt_params> <opt_params>...], got {} fields",
                args.len()
            )));
        }
        if args[2] != "crypt" {
            return Err(FormatError::Table(format!(
                "target type \"{}\" is not crypt",
                shown(args[2])
            )));
        }
        let start = number("start", args[0])?;
        let length = number("length", args[1])?;
        let cipher: CipherSpec = args[3].parse().map_err(|e| {
            if shown(args[3]) == args[3] {
                FormatError::from(e)
            } else {
                FormatError::Table(format!("cipher {} is not a cipher spec", shown(args[3])))
            }
        })?;
        let key = KeySource::parse(args[4])?;
        let iv_offset = number("iv_offset", args[5])?;
        let device = DeviceRef::from(args[6]);
        let offset = number("offset", args[7])?;
        let mut opts = Vec::new();
        if let Some(count) = args.get(8) {
            let n: usize = count.parse().map_err(|_| {
                FormatError::Table(format!(
                    "number of optional parameters \"{}\" is not a number",
                    shown(count)
                ))
            })?;
            let rest = &args[9..];
            if n != rest.len() {
                return Err(FormatError::Table(format!(
                    "invalid number of feature args: the line says {n} but {} follow",
                    rest.len()
                )));
            }
            for p in rest {
                let p: OptParam = p.parse()?;
                // A repeated flag means the same as one (the kernel sets a bit); a repeated
                // sector_size keeps the last, as the kernel does.
                opts.retain(|o: &OptParam| {
                    !(o == &p
                        || matches!((o, p), (OptParam::SectorSize(_), OptParam::SectorSize(_)))
                        || matches!((o, p), (OptParam::Integrity(_), OptParam::Integrity(_))))
                });
                opts.push(p);
            }
        }
        opts.sort_by_key(|o| o.rank());
        let tagged = opts.iter().any(|o| matches!(o, OptParam::Integrity(_)));
        if tagged != cipher.aead.is_some() {
            return Err(FormatError::Table(if tagged {
                format!(
                    "integrity:N:aead needs an authenticated cipher (capi:authenc(...), \
                     capi:gcm(aes)-random, capi:rfc7539(chacha20,poly1305)-random), not {cipher}"
                )
            } else {
                format!(
                    "the authenticated cipher {cipher} needs integrity:N:aead (its tags live \
                     in a dm-integrity device below)"
                )
            }));
        }
        Ok(TableLine {
            start,
            length,
            cipher,
            key,
            iv_offset,
            device,
            offset,
            opts,
        })
    }
}

impl TableLine {
    /// Whether the flag is set.
    pub fn has(&self, p: OptParam) -> bool {
        self.opts.contains(&p)
    }

    /// The `integrity:N:aead` tag size, for an authenticated cipher.
    pub fn integrity_tag(&self) -> Option<u32> {
        self.opts.iter().find_map(|o| match o {
            OptParam::Integrity(n) => Some(*n),
            _ => None,
        })
    }

    /// The `sector_size` parameter (512 by default), unvalidated.
    pub fn sector_size_bytes(&self) -> u32 {
        self.opts
            .iter()
            .find_map(|o| match o {
                OptParam::SectorSize(n) => Some(*n),
                _ => None,
            })
            .unwrap_or(512)
    }

    /// Checks every rule across fields and returns the crypto layer's sector parameters.
    ///
    /// # Errors
    /// One error per rule, naming it: sector size range, length and offset alignment to the
    /// sector size, `iv_offset` alignment, start not 0, zero length.
    pub fn validate(&self, opts: ValidateOptions) -> Result<SectorParams, FormatError> {
        let bytes = self.sector_size_bytes();
        let sector_size = if opts.allow_large_sectors {
            SectorSize::new_extended(bytes).map_err(FormatError::from)
        } else {
            SectorSize::new(bytes).map_err(|e| {
                if bytes.is_power_of_two()
                    && bytes > SectorSize::KERNEL_MAX
                    && bytes <= SectorSize::EXTENDED_MAX
                {
                    FormatError::Rule(format!(
                        "sector_size {bytes} is larger than the kernel's limit of 4096; ucrypt \
                         can use up to 65536 with --large-sectors, but such a volume cannot be \
                         opened by the kernel's dm-crypt"
                    ))
                } else {
                    e.into()
                }
            })
        }?;
        let unit = sector_size.sectors512();
        if self.length == 0 {
            return Err(FormatError::Rule(
                "length is 0: a mapping needs at least one sector".into(),
            ));
        }
        if self.start != 0 {
            return Err(FormatError::Rule(format!(
                "start is {}: a one-line table must start at sector 0",
                self.start
            )));
        }
        if self.length % unit != 0 {
            return Err(FormatError::Rule(format!(
                "device size is not a multiple of sector_size: length {} sectors is not a \
                 multiple of {unit} (sector_size {sector_size})",
                self.length
            )));
        }
        if self.offset % unit != 0 {
            return Err(FormatError::Rule(format!(
                "offset {} is not aligned to sector_size {sector_size} ({unit} sectors); the \
                 kernel refuses it as not aligned to the logical block size",
                self.offset
            )));
        }
        if self.iv_offset % unit != 0 {
            return Err(ucrypt_crypto::CryptoError::IvOffsetAlignment {
                iv_offset: self.iv_offset,
                unit,
                sector_size: bytes,
            }
            .into());
        }
        if self
            .offset
            .checked_add(self.length)
            .is_none_or(|end| end > u64::MAX >> 9)
        {
            return Err(FormatError::Rule("offset + length overflows".into()));
        }
        Ok(SectorParams {
            sector_size,
            iv_offset: self.iv_offset,
            iv_large_sectors: self.has(OptParam::IvLargeSectors),
        })
    }

    /// Validates, loads the key and builds the sector cipher.
    ///
    /// # Errors
    /// Any rule of [`TableLine::validate`], key errors, cipher errors.
    pub fn build_cipher(
        &self,
        opts: ValidateOptions,
    ) -> Result<Box<dyn SectorCipher>, FormatError> {
        let params = self.validate(opts)?;
        let key = self.key.load()?;
        Ok(self.cipher.build(&key, params)?)
    }

    /// The authenticated sector cipher of a line with `integrity:N:aead`.
    ///
    /// # Errors
    /// As [`TableLine::build_cipher`]; a line without `integrity:N:aead`.
    pub fn build_aead(
        &self,
        opts: ValidateOptions,
    ) -> Result<ucrypt_crypto::aead::AeadCipher, FormatError> {
        let params = self.validate(opts)?;
        let tag = self.integrity_tag().ok_or_else(|| {
            FormatError::Table(format!("{} is not an authenticated cipher", self.cipher))
        })?;
        let key = self.key.load()?;
        Ok(self.cipher.build_aead(&key, params, tag)?)
    }

    /// The canonical line, like `dmsetup table` (`show_keys` = `--showkeys`; otherwise the
    /// key is replaced by a placeholder that no parser accepts as a key). A device that is
    /// a lower table is printed by [`DeviceRef`]'s `Display`; a whole
    /// [`crate::mapping::Mapping`] names its tables instead ([`TableLine::to_line_on`]).
    pub fn to_line(&self, show_keys: bool) -> String {
        self.to_line_on(show_keys, &self.device.to_string())
    }

    /// [`TableLine::to_line`] with `device` printed in the device field.
    pub fn to_line_on(&self, show_keys: bool, device: &str) -> String {
        let key = match &self.key {
            KeySource::Hex(k) if show_keys || k.is_empty() => k.to_hex().to_string(),
            KeySource::Hex(k) => format!("<key:{}-bytes>", k.len()),
            KeySource::Keyring {
                size,
                key_type,
                description,
            } => {
                format!(":{size}:{key_type}:{description}")
            }
        };
        let mut line = format!(
            "{} {} crypt {} {} {} {} {}",
            self.start, self.length, self.cipher, key, self.iv_offset, device, self.offset
        );
        // The kernel prints sector_size only when it is not 512.
        let shown: Vec<String> = self
            .opts
            .iter()
            .filter(|o| **o != OptParam::SectorSize(512))
            .map(ToString::to_string)
            .collect();
        if !shown.is_empty() {
            line.push_str(&format!(" {} {}", shown.len(), shown.join(" ")));
        }
        line
    }

    /// The plaintext size in bytes.
    pub fn length_bytes(&self) -> u64 {
        self.length << 9
    }

    /// Where the ciphertext starts on the device, in bytes.
    pub fn offset_bytes(&self) -> u64 {
        self.offset << 9
    }
}

impl fmt::Display for TableLine {
    /// The canonical line with the key hidden.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_line(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K64: &str = "8c09d102cbeb0f2f55344675453640a4a7794e0d7839a51254ac473452d6355a817b3ded7afed126739c6c5cef02803dc7e16b9337ead4a4cfae7f043b720cda";

    fn line(rest: &str) -> String {
        format!("0 2048 crypt aes-xts-plain64 {K64} 0 disk.img 0{rest}")
    }

    #[test]
    fn a_key_shifted_into_another_field_is_not_echoed() {
        let (a, b) = K64.split_at(64);
        for bad in [
            format!("0 2048 crypt aes-xts-plain64 {a} {b} disk.img 0"),
            format!("0 2048 crypt {K64} 0 disk.img 0 0"),
            format!("0 2048 {K64} aes-xts-plain64 {K64} 0 disk.img 0"),
            format!("0 {a} crypt aes-xts-plain64 {K64} 0 disk.img 0"),
            line(&format!(" {a}")),
            line(&format!(" 1 {b}")),
        ] {
            let err = bad.parse::<TableLine>().expect_err(&bad).to_string();
            assert!(
                !err.contains(&K64[..16]) && !err.contains(&b[..16]),
                "{err}"
            );
        }
    }

    #[test]
    fn every_opt_param_round_trips_through_its_spelling() {
        let all = FLAG_PARAMS
            .into_iter()
            .chain([OptParam::SectorSize(4096), OptParam::IvLargeSectors]);
        for p in all {
            assert_eq!(p.to_string().parse::<OptParam>().unwrap(), p);
        }
    }

    #[test]
    fn prints_options_in_kernel_order() {
        let t: TableLine = line(" 3 iv_large_sectors no_write_workqueue sector_size:4096")
            .parse()
            .unwrap();
        assert!(t
            .to_line(true)
            .ends_with(" 3 no_write_workqueue sector_size:4096 iv_large_sectors"));
    }

    #[test]
    fn hides_the_key_unless_asked() {
        let t: TableLine = line("").parse().unwrap();
        assert!(!t.to_string().contains(&K64[..16]));
        assert!(t.to_string().contains("<key:64-bytes>"));
        assert!(t.to_line(true).contains(K64));
        assert!(!format!("{t:?}").contains(&K64[..16]));
    }

    #[test]
    fn sector_size_512_is_not_printed() {
        let t: TableLine = line(" 1 sector_size:512").parse().unwrap();
        assert_eq!(t.to_line(true), line(""));
    }

    #[test]
    fn rejects_opt_count_mismatch() {
        let e = line(" 3 allow_discards")
            .parse::<TableLine>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("number of feature args"), "{e}");
    }

    #[test]
    fn rejects_unknown_opt_and_integrity() {
        let e = line(" 1 frobnicate")
            .parse::<TableLine>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"frobnicate\": unknown"), "{e}");
        // integrity:N:aead goes with an authenticated cipher and only with one.
        let e = line(" 1 integrity:28:aead")
            .parse::<TableLine>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs an authenticated cipher"), "{e}");
        let e = line(" 1 integrity:28:none")
            .parse::<TableLine>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not supported"), "{e}");
        let gcm = format!("0 8 crypt capi:gcm(aes)-random {K64} 0 d 0");
        let e = gcm.parse::<TableLine>().unwrap_err().to_string();
        assert!(e.contains("needs integrity:N:aead"), "{e}");
        // As the kernel printed it (testdata/luks2-integrity): options in its order.
        let t: TableLine = format!("{gcm} 2 sector_size:4096 integrity:28:aead")
            .parse()
            .unwrap();
        assert_eq!(t.integrity_tag(), Some(28));
        assert!(t
            .to_line(true)
            .ends_with(" 0 d 0 2 integrity:28:aead sector_size:4096"));
    }

    #[test]
    fn rejects_length_not_multiple_of_sector_size() {
        let t: TableLine = format!("0 12 crypt aes-xts-plain64 {K64} 0 d 0 1 sector_size:4096")
            .parse()
            .unwrap();
        let e = t
            .validate(ValidateOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a multiple of sector_size"), "{e}");
    }

    #[test]
    fn rejects_offset_not_aligned_to_sector_size() {
        let t: TableLine = format!("0 64 crypt aes-xts-plain64 {K64} 0 d 3 1 sector_size:4096")
            .parse()
            .unwrap();
        let e = t
            .validate(ValidateOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("offset 3 is not aligned"), "{e}");
    }

    #[test]
    fn rejects_iv_offset_not_aligned_with_large_sectors() {
        let t: TableLine =
            format!("0 64 crypt aes-xts-plain64 {K64} 3 d 0 2 sector_size:4096 iv_large_sectors")
                .parse()
                .unwrap();
        let e = t
            .validate(ValidateOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("iv_offset 3"), "{e}");
    }

    #[test]
    fn large_sectors_need_the_opt_in() {
        let t: TableLine = line(" 1 sector_size:65536").parse().unwrap();
        let e = t
            .validate(ValidateOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--large-sectors"), "{e}");
        let p = t
            .validate(ValidateOptions {
                allow_large_sectors: true,
            })
            .unwrap();
        assert_eq!(p.sector_size.bytes(), 65536);
        let t: TableLine = line(" 1 sector_size:1000").parse().unwrap();
        let e = t
            .validate(ValidateOptions {
                allow_large_sectors: true,
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("sector_size 1000"), "{e}");
    }

    #[test]
    fn rejects_short_lines_and_other_targets() {
        assert!("0 64 crypt aes".parse::<TableLine>().is_err());
        let e = format!("0 64 linear aes-xts-plain64 {K64} 0 d 0")
            .parse::<TableLine>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not crypt"), "{e}");
    }

    #[test]
    fn keyring_key_form_parses_and_logon_is_explained() {
        let t: TableLine = "0 64 crypt aes-xts-plain64 :64:logon:cryptsetup:abc 0 d 0"
            .parse()
            .unwrap();
        assert!(t.to_line(false).contains(":64:logon:cryptsetup:abc"));
        let e = t.key.load().unwrap_err().to_string();
        assert!(e.contains("cannot be read from userspace"), "{e}");
        assert!("0 64 crypt aes-xts-plain64 :x:user:d 0 d 0"
            .parse::<TableLine>()
            .is_err());
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC{0,200}") {
            let _ = s.parse::<TableLine>();
        }

        #[test]
        fn parser_never_panics_on_table_shaped_input(
            a in "[0-9]{1,3}", c in "[a-z0-9:()_,-]{0,30}", k in "[0-9a-fA-F:-]{0,70}",
            n in "[0-9]{0,2}", o in "[a-z_:0-9]{0,20}"
        ) {
            let _ = format!("0 {a} crypt {c} {k} 0 d 0 {n} {o}").parse::<TableLine>()
                .map(|t| t.build_cipher(ValidateOptions::default()).is_ok());
        }
    }
}
