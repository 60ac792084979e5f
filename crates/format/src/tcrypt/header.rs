//! A decrypted header: its fields, the data area it describes and the dm-crypt layers
//! cryptsetup would build from it.

use super::tables::layer_key;
use super::*;
use ChainMode::{CbcTcrypt, CbcTcw, Cbci, Lrw, Xts};

/// The devices a TCRYPT volume is opened on, as the caller probed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Geometry {
    /// Bytes of the device the header was read from (the drive for system encryption).
    pub header_device_bytes: u64,
    /// Bytes of the data device.
    pub data_device_bytes: u64,
    /// The data device is a partition starting at this sector of its drive.
    pub partition_start: Option<u64>,
    /// The header came from a separate file (`--header`).
    pub detached_header: bool,
}

/// Where a TCRYPT volume's data lies, in 512-byte sectors of the data device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataArea {
    /// First data sector.
    pub offset: u64,
    /// IV of the first data sector.
    pub iv_offset: u64,
    /// Mapped length.
    pub sectors: u64,
}

/// A decrypted header.
#[derive(Clone)]
pub struct TcryptHeader {
    /// `VERA` header (else `TRUE`).
    pub vera: bool,
    /// Header format version.
    pub version: u16,
    /// Minimum program version needed (`Driver req.`).
    pub version_tc: u16,
    /// Hidden volume size in bytes (0 without one).
    pub hidden_volume_size: u64,
    /// Volume size in bytes.
    pub volume_size: u64,
    /// Master-key (data) offset in bytes (512 when the header says 0).
    pub mk_offset: u64,
    /// Encrypted area size in bytes.
    pub mk_size: u64,
    /// Header flags.
    pub flags: u32,
    /// Sector size (512 when the header says 0).
    pub sector_size: u32,
    /// The KDF that opened it.
    pub kdf: KdfEntry,
    /// The cipher chain.
    pub chain: &'static Algs,
    /// Byte offset of the header that opened.
    pub header_offset: u64,
    pub(super) keys: Zeroizing<[u8; 256]>,
}

impl std::fmt::Debug for TcryptHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcryptHeader")
            .field("vera", &self.vera)
            .field("version", &self.version)
            .field("mk_offset", &self.mk_offset)
            .field("volume_size", &self.volume_size)
            .field("hidden_volume_size", &self.hidden_volume_size)
            .field("kdf", &self.kdf.name())
            .field("chain", &self.chain.long_name)
            .field("mode", &self.chain.mode.name())
            .finish_non_exhaustive()
    }
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(x)
}

/// Parses a decrypted 448-byte area; `None` when a CRC-32 does not match.
pub(super) fn parse(
    d: &[u8; ENC_LEN],
    kdf: KdfEntry,
    chain: &'static Algs,
    at: u64,
) -> Option<TcryptHeader> {
    let version = u16::from_be_bytes([d[4], d[5]]);
    if version > 3 && crc32fast::hash(&d[..188]) != be32(d, 188) {
        return None;
    }
    if crc32fast::hash(&d[192..448]) != be32(d, 8) {
        return None;
    }
    let mut keys = Zeroizing::new([0u8; 256]);
    keys.copy_from_slice(&d[192..448]);
    let mk_offset = match be64(d, 44) {
        0 => 512,
        n => n,
    };
    let sector_size = match be32(d, 64) {
        0 => 512,
        n => n,
    };
    Some(TcryptHeader {
        vera: &d[..4] == b"VERA",
        version,
        version_tc: u16::from_be_bytes([d[6], d[7]]),
        hidden_volume_size: be64(d, 28),
        volume_size: be64(d, 36),
        mk_offset,
        mk_size: be64(d, 52),
        flags: be32(d, 60),
        sector_size,
        kdf,
        chain,
        header_offset: at,
        keys,
    })
}

/// One dm-crypt layer of the mapping.
#[derive(Debug)]
pub struct Layer {
    /// dm-crypt cipher spec (`serpent-xts-plain64`).
    pub cipher: String,
    /// Its key.
    pub key: VolumeKey,
}

impl TcryptHeader {
    /// The volume key as cryptsetup reports it (each cipher's layer key, in chain order).
    pub fn volume_key(&self) -> VolumeKey {
        let mut k = Vec::with_capacity(self.chain.chain_key_size);
        for alg in self.chain.ciphers {
            k.extend_from_slice(&layer_key(alg, self.chain.mode, &self.keys[..]));
        }
        VolumeKey::new(k)
    }

    /// The dm-crypt layers from the device up: the first sits on the device (the last
    /// cipher of the chain, outermost on disk), each next one on the previous.
    ///
    /// The legacy CBC chains the kernel cannot map are served with ucrypt's TrueCrypt
    /// ciphers ([`ucrypt_crypto::legacy::tcrypt_cbc`]): an outer-CBC cascade
    /// (`cbci-tcrypt`) is one `a+b+c-cbc-tcw` layer, an inner-CBC chain (`cbc-tcrypt`, the
    /// Blowfish ones) one `cbc-tcw` layer per cipher; every CBC layer's key is the cipher
    /// key(s) followed by the IV seed and whitening from the start of the key area.
    ///
    /// # Errors
    /// [`FormatError::NotSupported`] for sector sizes that are not a multiple of 512.
    pub fn layers(&self) -> Result<Vec<Layer>, FormatError> {
        if self.sector_size % 512 != 0 {
            return Err(FormatError::NotSupported(format!(
                "activation of TCRYPT volumes with {}-byte sectors",
                self.sector_size
            )));
        }
        let keys = &self.keys[..];
        // cbc-tcw's extra key: the IV seed (block size) and 16 whitening bytes, both read
        // from the start of the 32-byte seed area (TrueCrypt's InitSectorIVAndWhitening).
        let tcw_key = |own: &[u8], block: usize| {
            let mut k = Zeroizing::new(own.to_vec());
            k.extend_from_slice(&keys[..block + ucrypt_crypto::legacy::tcw::WHITENING_SIZE]);
            VolumeKey::new(k.to_vec())
        };
        let own = |alg: &Alg| &keys[alg.key_offset..alg.key_offset + alg.key_size];
        let mode = match self.chain.mode {
            Xts => "xts-plain64",
            Lrw => "lrw-benbi",
            CbcTcw => "cbc-tcw",
            Cbci => {
                let ciphers = self.chain.ciphers;
                let name: Vec<&str> = ciphers.iter().map(|a| a.name).collect();
                let mut k = Zeroizing::new(Vec::new());
                for alg in ciphers {
                    k.extend_from_slice(own(alg));
                }
                let block = ciphers.first().map_or(16, |a| a.iv_size);
                return Ok(vec![Layer {
                    cipher: format!(
                        "{}-cbc-tcw",
                        name.join(&ucrypt_crypto::block::cascade::CASCADE_SEP.to_string())
                    ),
                    key: tcw_key(&k, block),
                }]);
            }
            CbcTcrypt => {
                return Ok(self
                    .chain
                    .ciphers
                    .iter()
                    .rev()
                    .map(|alg| Layer {
                        cipher: format!("{}-cbc-tcw", alg.name),
                        key: tcw_key(own(alg), alg.iv_size),
                    })
                    .collect())
            }
        };
        Ok(self
            .chain
            .ciphers
            .iter()
            .rev()
            .map(|alg| Layer {
                cipher: format!("{}-{mode}", alg.name),
                key: VolumeKey::new(layer_key(alg, self.chain.mode, keys).to_vec()),
            })
            .collect())
    }

    /// Data offset in 512-byte sectors for a non-system volume, as cryptsetup computes it
    /// (`device_bytes`: size of the header device, for old hidden volumes).
    pub fn data_offset(&self, hidden: bool, system: bool, device_bytes: u64) -> u64 {
        let old_hidden = || {
            device_bytes
                .saturating_sub(self.hidden_volume_size)
                .saturating_sub(HIDDEN_OFFSET_OLD_FROM_END)
                / 512
        };
        if system {
            return self.mk_offset / 512;
        }
        if self.chain.mode == Xts {
            if self.version < 3 {
                return 1;
            }
            if hidden {
                if self.version > 3 {
                    return self.mk_offset / 512;
                }
                return old_hidden();
            }
        } else if hidden {
            return old_hidden();
        }
        self.mk_offset / 512
    }

    /// IV offset in sectors: the data offset for XTS, 0 for LRW, the master-key offset
    /// for CBC.
    pub fn iv_offset(&self, hidden: bool, system: bool, device_bytes: u64) -> u64 {
        match self.chain.mode {
            Xts => self.data_offset(hidden, system, device_bytes),
            Lrw => 0,
            _ => self.mk_offset / 512,
        }
    }

    /// Mapped size in sectors (0: to the end of the device).
    pub fn size_sectors(&self, hidden: bool) -> u64 {
        if hidden {
            self.hidden_volume_size / 512
        } else {
            self.volume_size / 512
        }
    }

    /// What the header says about the volume over `area` (from [`TcryptHeader::data_area`]):
    /// the chain's cipher and mode, the data and IV offsets, 512-byte sectors.
    pub fn info(&self, area: &DataArea) -> crate::VolumeInfo {
        crate::VolumeInfo {
            kind: Some(crate::HeaderType::Tcrypt),
            cipher: self.chain.long_name.to_string(),
            cipher_mode: self.chain.mode.name().to_string(),
            uuid: None,
            label: None,
            data_offset: area.offset,
            iv_offset: area.iv_offset,
            key_bytes: self.chain.chain_key_size,
            sector_size: 512,
            flags: crate::luks2::ActivationFlags::default(),
        }
    }

    /// The mapping cryptsetup loads for this volume on `device` over `area` (from
    /// [`TcryptHeader::data_area`]): one crypt table per cipher of the chain, the outermost
    /// on the device at the data offset, each inner one on the table below
    /// ([`crate::DeviceRef::Layer`], offset 0), all with the same IV offset and length.
    ///
    /// # Errors
    /// As [`TcryptHeader::layers`]; a layer cipher the crypto layer does not take; a header
    /// that names no cipher.
    pub fn mapping(
        &self,
        device: &str,
        area: &DataArea,
        allow_discards: bool,
    ) -> Result<Mapping, FormatError> {
        let mut lines = Vec::new();
        for (i, layer) in self.layers()?.into_iter().enumerate() {
            let cipher: CipherSpec = layer.cipher.parse().map_err(|e| FormatError::At {
                at: format!("TCRYPT layer cipher \"{}\"", layer.cipher),
                source: Box::new(FormatError::from(e)),
            })?;
            lines.push(TableLine {
                start: 0,
                length: area.sectors,
                cipher,
                key: KeySource::Hex(layer.key),
                iv_offset: area.iv_offset,
                device: if i == 0 {
                    DeviceRef::from(device)
                } else {
                    DeviceRef::Layer(i - 1)
                },
                offset: if i == 0 { area.offset } else { 0 },
                opts: if allow_discards {
                    vec![OptParam::AllowDiscards]
                } else {
                    Vec::new()
                },
            });
        }
        if lines.is_empty() {
            return Err(FormatError::Rule(format!(
                "TCRYPT header on {device} names no cipher"
            )));
        }
        Ok(Mapping::stack(lines))
    }

    /// Where the data lies, as cryptsetup maps a TCRYPT volume, given the devices' geometry
    /// (probed by the caller: sizes, and the partition's first sector for system
    /// encryption): the data offset and IV offset in sectors and the mapped length.
    ///
    /// System encryption: on a partition the data starts at the partition's first sector
    /// with IVs counted from the drive's sector numbers; with a detached header the device
    /// is a copy of the partition (offset 0); with the header on the device itself the
    /// whole encrypted area is mapped. A header that leaves the length open (0) maps to the
    /// device end.
    ///
    /// # Errors
    /// [`FormatError::Rule`] when the data area does not fit the device or is empty.
    pub fn data_area(
        &self,
        opts: &TcryptOptions,
        geometry: &Geometry,
        device: &str,
    ) -> Result<DataArea, FormatError> {
        let (hidden, system) = (opts.hidden, opts.system);
        let mut offset = self.data_offset(hidden, system, geometry.header_device_bytes);
        let mut iv_offset = self.iv_offset(hidden, system, geometry.header_device_bytes);
        let mut sectors = if system { 0 } else { self.size_sectors(hidden) };
        if system {
            if let Some(start) = geometry.partition_start {
                (offset, iv_offset) = (0, start);
            } else if geometry.detached_header {
                offset = 0;
            } else {
                sectors = self.volume_size / 512;
            }
        }
        let total = geometry.data_device_bytes / 512;
        if sectors == 0 {
            sectors = total.saturating_sub(offset);
        }
        if sectors == 0 || offset.saturating_add(sectors) > total {
            return Err(FormatError::Rule(format!(
                "TCRYPT volume on {device}: data area (offset {offset}, {sectors} sectors) does not fit the device ({total} sectors)"
            )));
        }
        Ok(DataArea {
            offset,
            iv_offset,
            sectors,
        })
    }

    /// The header as `cryptsetup tcryptDump` prints it (without the volume key).
    pub fn dump(&self, device: &str) -> String {
        let mut s = format!(
            "{} header information for {device}\n",
            if self.vera { "VERACRYPT" } else { "TCRYPT" }
        );
        s += &format!("Version:       \t{}\n", self.version);
        s += &format!(
            "Driver req.:\t{:x}.{:x}\n",
            self.version_tc >> 8,
            self.version_tc & 0xff
        );
        s += &format!("Flags:       \t0x{:x}\n", self.flags);
        s += &format!("Sector size:\t{} [bytes]\n", self.sector_size);
        s += &format!("MK offset:\t{} [bytes]\n", self.mk_offset);
        if self.volume_size != 0 {
            s += &format!("Volume size:\t{} [bytes]\n", self.volume_size);
        }
        if self.hidden_volume_size != 0 {
            s += &format!("Hidden size:\t{} [bytes]\n", self.hidden_volume_size);
        }
        match self.kdf.hash {
            Some(h) => s += &format!("PBKDF:\t\tPBKDF2\nPBKDF2 hash:\t{}\n", h.name()),
            None => s += "PBKDF:\t\tArgon2id\n",
        }
        s += &format!("Cipher chain:\t{}\n", self.chain.long_name);
        s += &format!("Cipher mode:\t{}\n", self.chain.mode.name());
        s += &format!("MK bits:       \t{}\n", self.chain.chain_key_size * 8);
        s
    }
}
