//! Opening a volume from its on-disk header (LUKS1, LUKS2) or by cryptsetup's plain-mode
//! rules, instead of from a table line.
//!
//! ```text
//!  device + secret ──► format::cryptsetup (libcryptsetup: header, keyslot, volume key)
//!                             │ HeaderInfo: cipher, data offset, sector size, IV offset,
//!                             │ persistent flags, requirements
//!                             ▼
//!                      TableLine (the line cryptsetup would give the kernel)
//!                             │ open::open_parsed
//!                             ▼
//!                      engine::Volume
//! ```
//!
//! The same table line is what `ucrypt table` prints, so a header-opened volume can be
//! shown (key hidden) and compared with `dmsetup table` output of the kernel mapping.

use crate::open::{open_parsed, OpenOptions, OpenedTable};
use anyhow::{bail, Context, Result};
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use ucrypt_crypto::VolumeKey;
use ucrypt_format::cryptsetup::{self as cs, CryptDevice, HeaderInfo, HeaderType};
use ucrypt_format::plain::PlainOptions;
use ucrypt_format::{FormatError, KeySource, OptParam, TableLine};

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
}

impl FromStr for VolumeType {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Self, FormatError> {
        match s {
            "luks" => Ok(VolumeType::Luks),
            "luks1" => Ok(VolumeType::Luks1),
            "luks2" => Ok(VolumeType::Luks2),
            "plain" => Ok(VolumeType::Plain),
            _ => Err(FormatError::Rule(format!(
                "unknown device type \"{s}\" (expected luks, luks1, luks2 or plain)"
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
}

/// A header unlocked: the equivalent table line (with the volume key) and header facts.
pub struct Unlocked {
    /// The dm-crypt table line cryptsetup would load for this volume.
    pub table: TableLine,
    /// What the header says (type, cipher, offsets, UUID).
    pub info: HeaderInfo,
    /// The keyslot that opened (LUKS).
    pub slot: Option<u32>,
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

/// Size of a file or block device in bytes.
fn device_bytes(path: &Path) -> Result<u64> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| FormatError::Cryptsetup {
            op: "opening device".into(),
            device: path.display().to_string(),
            errno: e.raw_os_error().unwrap_or(libc::ENODEV),
            detail: e.to_string(),
        })
        .with_context(|| format!("device {}", path.display()))?;
    Ok(f.seek(SeekFrom::End(0))?)
}

/// Opens a libcryptsetup context on `device` (or on the detached header).
///
/// # Errors
/// The device or header cannot be opened.
pub fn crypt_device(device: &Path, header: Option<&Path>) -> Result<CryptDevice> {
    Ok(match header {
        None => CryptDevice::init(device)?,
        Some(h) => CryptDevice::init_detached(h, device)?,
    })
}

/// Loads the LUKS header of the expected version.
///
/// # Errors
/// No valid header of that type ("not a valid LUKS device").
pub fn load_luks(cd: &mut CryptDevice, kind: VolumeType) -> Result<()> {
    let want = match kind {
        VolumeType::Luks1 => Some(HeaderType::Luks1),
        VolumeType::Luks2 => Some(HeaderType::Luks2),
        VolumeType::Luks => None,
        VolumeType::Plain => bail!("plain mode has no header to load"),
    };
    let name = cd.device_name().to_string();
    cd.load(want).with_context(|| match want {
        Some(t) => format!("{name} is not a valid {t} device"),
        None => format!("{name} is not a valid LUKS device"),
    })
}

/// Refuses headers whose requirements forbid activation (an unfinished reencryption,
/// requirements unknown to libcryptsetup).
///
/// # Errors
/// [`FormatError::Refused`] naming the requirement.
pub fn check_requirements(cd: &mut CryptDevice) -> Result<(u32, u32)> {
    let (act, req) = cd.persistent_flags()?;
    if req != 0 {
        let mut what = Vec::new();
        if req & cs::REQUIREMENT_OFFLINE_REENCRYPT != 0 {
            what.push("an unfinished offline reencryption");
        }
        if req & cs::REQUIREMENT_ONLINE_REENCRYPT != 0 {
            what.push("an unfinished online reencryption");
        }
        if req & cs::REQUIREMENT_UNKNOWN != 0 || what.is_empty() {
            what.push("requirements unknown to this libcryptsetup");
        }
        return Err(FormatError::Refused(format!(
            "LUKS2 header on {} has {} (requirement flags {req:#x}); ucrypt will not open it \
             (finish it with `cryptsetup reencrypt` first)",
            cd.device_name(),
            what.join(" and ")
        ))
        .into());
    }
    Ok((act, req))
}

/// Table-line options from LUKS2 persistent activation flags and the sector size.
fn opts_from(act: u32, sector_size: u32, extra_discards: bool, iv_large: bool) -> Vec<OptParam> {
    let mut opts = Vec::new();
    if act & cs::ACTIVATE_ALLOW_DISCARDS != 0 || extra_discards {
        opts.push(OptParam::AllowDiscards);
    }
    if act & cs::ACTIVATE_SAME_CPU_CRYPT != 0 {
        opts.push(OptParam::SameCpuCrypt);
    }
    if act & cs::ACTIVATE_SUBMIT_FROM_CRYPT_CPUS != 0 {
        opts.push(OptParam::SubmitFromCryptCpus);
    }
    if act & cs::ACTIVATE_NO_READ_WORKQUEUE != 0 {
        opts.push(OptParam::NoReadWorkqueue);
    }
    if act & cs::ACTIVATE_NO_WRITE_WORKQUEUE != 0 {
        opts.push(OptParam::NoWriteWorkqueue);
    }
    if sector_size != 512 {
        opts.push(OptParam::SectorSize(sector_size));
    }
    if iv_large {
        opts.push(OptParam::IvLargeSectors);
    }
    opts
}

/// The fixed size of LUKS2 segment 0 in bytes, None for `dynamic` (to the device end).
fn luks2_segment_bytes(cd: &mut CryptDevice) -> Result<Option<u64>> {
    let json = cd.dump_json()?;
    let v: serde_json::Value =
        serde_json::from_str(&json).context("parsing the LUKS2 JSON metadata")?;
    let seg = &v["segments"]["0"];
    match seg["size"].as_str() {
        None | Some("dynamic") => Ok(None),
        Some(n) => Ok(Some(n.parse().with_context(|| {
            format!("LUKS2 segment 0 size \"{n}\" is not a number of bytes")
        })?)),
    }
}

fn cipher_spec(info: &HeaderInfo, device: &str) -> Result<ucrypt_crypto::CipherSpec> {
    let spec = info.cipher_spec();
    if spec.starts_with("capi:") && spec.contains("-generic") {
        return Err(FormatError::Refused(format!(
            "header on {device} names a kernel crypto driver (\"{spec}\"), not a cipher; \
             cryptsetup refuses to activate it and so does ucrypt"
        ))
        .into());
    }
    spec.parse()
        .with_context(|| format!("header on {device}: cipher \"{spec}\""))
}

/// Reads the header on `device` (or `opts.header`), unlocks the volume key with `secret`
/// and assembles the table line cryptsetup would give the kernel.
///
/// # Errors
/// No valid header, a wrong passphrase ([`FormatError::Cryptsetup`] with `EPERM`),
/// requirements that forbid activation, an unbound keyslot, an unusable cipher, or a
/// device smaller than the data offset.
pub fn unlock(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    let device_str = device.display().to_string();
    if opts.kind == VolumeType::Plain {
        return unlock_plain(device, secret, opts);
    }
    let mut cd = crypt_device(device, opts.header.as_deref())?;
    load_luks(&mut cd, opts.kind)?;
    let (act, _) = check_requirements(&mut cd)?;
    let info = cd.info();
    let cipher = cipher_spec(&info, &device_str)?;
    let fixed = if info.kind == Some(HeaderType::Luks2) {
        luks2_segment_bytes(&mut cd)?
    } else {
        None
    };
    let (slot, key) = cd
        .volume_key(opts.key_slot, secret)
        .with_context(|| format!("unlocking {device_str}"))?;
    drop(cd);
    let length = match fixed {
        Some(b) => b / 512,
        None => {
            let total = device_bytes(device)? / 512;
            if total < info.data_offset {
                bail!(
                    "device {device_str} ({total} sectors) ends before the data offset {} sectors",
                    info.data_offset
                );
            }
            // total == data offset: a header-only device; unlocking works, opening the
            // (empty) volume is refused by the engine.
            total - info.data_offset
        }
    };
    let table = TableLine {
        start: 0,
        length,
        cipher,
        key: KeySource::Hex(key),
        iv_offset: info.iv_offset,
        device: device_str,
        offset: info.data_offset,
        opts: opts_from(act, info.sector_size, opts.allow_discards, false),
    };
    Ok(Unlocked {
        table,
        info,
        slot: Some(slot),
    })
}

fn unlock_plain(device: &Path, secret: &[u8], opts: &HeaderOptions) -> Result<Unlocked> {
    let device_str = device.display().to_string();
    let p = &opts.plain;
    let cipher: ucrypt_crypto::CipherSpec = p
        .cipher
        .parse()
        .with_context(|| format!("plain-mode cipher \"{}\"", p.cipher))?;
    let key: VolumeKey = if opts.plain_raw_key {
        let raw = PlainOptions {
            hash: None,
            ..p.clone()
        };
        ucrypt_format::plain::volume_key(device, &raw, secret)?
    } else {
        ucrypt_format::plain::volume_key(device, p, secret)?
    };
    let length = if p.size != 0 {
        p.size
    } else {
        let total = device_bytes(device)? / 512;
        if total <= p.offset {
            bail!(
                "device {device_str} ({total} sectors) ends before --offset {} sectors",
                p.offset
            );
        }
        total - p.offset
    };
    let info = HeaderInfo {
        kind: Some(HeaderType::Plain),
        cipher: p.cipher.clone(),
        cipher_mode: String::new(),
        uuid: None,
        label: None,
        data_offset: p.offset,
        iv_offset: p.skip,
        key_bytes: key.len(),
        sector_size: p.sector_size,
    };
    let table = TableLine {
        start: 0,
        length,
        cipher,
        key: KeySource::Hex(key),
        iv_offset: p.skip,
        device: device_str,
        offset: p.offset,
        opts: opts_from(0, p.sector_size, opts.allow_discards, p.iv_large_sectors),
    };
    Ok(Unlocked {
        table,
        info,
        slot: None,
    })
}

/// [`unlock`], then opens the device and builds the volume, exactly as a table line.
///
/// # Errors
/// As [`unlock`] and [`crate::open::open_table`].
pub fn open_header(
    device: &Path,
    secret: &[u8],
    hopts: &HeaderOptions,
    opts: OpenOptions,
) -> Result<OpenedTable> {
    let unlocked = unlock(device, secret, hopts)?;
    open_parsed(unlocked.table, opts)
}
