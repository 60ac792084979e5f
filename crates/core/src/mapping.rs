//! Assembling backends from a volume's mapping ([`ucrypt_format::Mapping`], the one model
//! every table input and every header format produces): each crypt target becomes its own
//! [`ucrypt_engine::Volume`], a zero target a [`ZeroBackend`], a linear target a window of
//! its device ([`LinearBackend::ranges`]), several targets of one table are joined end to
//! end by [`LinearBackend`], and a table on a lower table
//! ([`ucrypt_format::DeviceRef::Layer`]) is built on that table's backend.
//!
//! ```text
//!  Target::Crypt(0 16 crypt ... 70592) ─► Volume ┐
//!  Target::Crypt(16 68760 crypt ... 16) ─► Volume ├─► LinearBackend (one Backend, served over NBD)
//!  Target::Zero(68776 128)              ─► zeros  ┘
//!
//!  Target::Crypt(0 2048 crypt ... 0)    ─► Volume              ┐
//!  Target::Linear(2048 14336 linear disk.img 2048) ─► window of disk.img ┴─► LinearBackend
//!
//!  Table 0: crypt serpent … on disk.img ─► Volume ─► Table 1: crypt twofish … on Layer(0) ─► Volume …
//! ```
//!
//! Each distinct device is opened **once per mapping** and shared by every target on it
//! ([`Devices`]): the crypt and linear targets of a LUKS2 volume in the middle of a
//! reencryption, or any table of several lines on one device, use one handle. For an RBD
//! image that matters beyond economy: a read-write handle takes the image's exclusive lock,
//! so a second handle of the same process would be refused (or the two would take the lock
//! from each other at every write).

use crate::error::{bail, Context, Result};
use crate::open::{open_device, open_parsed_with, Device, OpenOptions};
use std::collections::HashMap;
use std::sync::Arc;
use ucrypt_backend::{Backend, LinearBackend, ZeroBackend};
use ucrypt_format::{DeviceRef, Mapping, Target, ValidateOptions};
use ucrypt_integrity::{AeadVolume, IntegrityBackend, Spread};

/// Opens every table of `mapping`, lower tables first, and returns the served one. A
/// one-line table gives its volume directly (exactly as [`crate::open::open_parsed`]).
///
/// # Errors
/// The mapping's own rules ([`Mapping::check`]), as [`crate::open::open_parsed`] for each
/// crypt target, and a stacked layer that does not fit the device below it.
pub fn open_mapping(mapping: Mapping, opts: OpenOptions) -> Result<Arc<dyn Backend>> {
    mapping.check()?;
    let mut devices = Devices::default();
    let mut opened: Vec<Arc<dyn Backend>> = Vec::with_capacity(mapping.tables.len());
    // A table that is one dm-integrity target without internal_hash: what a crypt target
    // with integrity:N:aead on it stores its tags in.
    let mut tagged: Vec<Option<Arc<IntegrityBackend>>> = Vec::new();
    let last = mapping.tables.len().saturating_sub(1);
    for (i, d) in mapping.tables.into_iter().enumerate() {
        // A dm-integrity device with external tags holds data only a crypt target with
        // integrity:N:aead reads right: anything else on it (or serving it) would skip
        // the tags.
        for t in &d.targets {
            let aead = matches!(t, Target::Crypt(l) if l.integrity_tag().is_some());
            if let Some(DeviceRef::Layer(j)) = t.device() {
                if !aead && tagged.get(*j).is_some_and(Option::is_some) {
                    bail!(
                        "table {j} is dm-integrity without internal_hash: only a crypt \
                         target with integrity:N:aead can sit on it"
                    );
                }
            }
        }
        let dev = open_table_targets(d.targets, opts, (&opened, &tagged), &mut devices);
        let (dev, tags) = match &d.name {
            Some(n) => dev.with_context(|| format!("device {n}"))?,
            None => dev?,
        };
        if i == last && tags.is_some() {
            bail!(
                "a dm-integrity device without internal_hash is not served by itself: its \
                 tags are the crypt target's above it (integrity:N:aead)"
            );
        }
        opened.push(dev);
        tagged.push(tags);
    }
    opened.pop().context("the table is empty")
}

/// The devices a mapping has opened, by name: every target on the same device gets the same
/// backend (one file descriptor, one NBD connection set, one librbd handle and so one holder
/// of the image's exclusive lock).
#[derive(Default)]
struct Devices(HashMap<String, Arc<dyn Backend>>);

impl Devices {
    /// The backend of `path`, opened on first use. Local paths are compared by their
    /// canonical form (`disk.img`, `./disk.img` and a symlink to it are one device); NBD URIs,
    /// `rbd:` and `ram:` names by their text.
    fn open(&mut self, device: &Device, opts: OpenOptions) -> Result<Arc<dyn Backend>> {
        let key = match device.local_path() {
            Some(path) => std::fs::canonicalize(path)
                .map_or_else(|_| device.to_string(), |c| c.display().to_string()),
            None => device.to_string(),
        };
        if let Some(b) = self.0.get(&key) {
            return Ok(b.clone());
        }
        let b = open_device(device, opts.read_only, opts.cache)?;
        self.0.insert(key, b.clone());
        Ok(b)
    }
}

/// Opens one table's targets: crypt targets on a lower table of the same mapping or on the
/// path they name (opened once per mapping, `devices`); one target is returned as it is,
/// several are joined by [`LinearBackend`]. A table of one dm-integrity target with
/// external tags is also returned as itself, for a crypt target with `integrity:N:aead`
/// above it.
type Lower<'a> = (&'a [Arc<dyn Backend>], &'a [Option<Arc<IntegrityBackend>>]);

/// A table's backend, and the dm-integrity device with external tags it is, if it is one.
type Opened = (Arc<dyn Backend>, Option<Arc<IntegrityBackend>>);

fn open_table_targets(
    targets: Vec<Target>,
    opts: OpenOptions,
    (lower, tagged): Lower<'_>,
    devices: &mut Devices,
) -> Result<Opened> {
    let single = targets.len() == 1;
    let mut tags_out = None;
    let mut below = |device: &DeviceRef| -> Result<Arc<dyn Backend>> {
        match device {
            DeviceRef::Layer(j) => match lower.get(*j) {
                Some(b) => Ok(b.clone()),
                None => bail!("a target sits on table {j}, which is not below it"),
            },
            DeviceRef::Device(d) => devices.open(d, opts),
        }
    };
    let mut pieces: Vec<Arc<dyn Backend>> = Vec::with_capacity(targets.len());
    for t in targets {
        pieces.push(match t {
            Target::Crypt(line) if line.integrity_tag().is_some() => {
                let at = line.start;
                open_aead(line, opts, tagged)
                    .with_context(|| format!("crypt target at sector {at}"))?
            }
            Target::Crypt(mut line) => {
                // Each target is its own volume; its place comes from the concatenation.
                line.start = 0;
                open_parsed_with(line, opts, |l| below(&l.device))?.volume
            }
            Target::Integrity(line) => {
                let dev = below(&line.device)?;
                let meta = line.meta_device.as_ref().map(&mut below).transpose()?;
                let at = line.start;
                let (b, t) = open_integrity(line, dev, meta, opts.read_only)
                    .with_context(|| format!("integrity target at sector {at}"))?;
                tags_out = t.filter(|_| single);
                b
            }
            Target::Zero { length, .. } => Arc::new(ZeroBackend::new(length * 512)),
            Target::Linear {
                start,
                length,
                device,
                offset,
            } => {
                let dev = below(&device)?;
                let (off, len) = (offset.checked_mul(512), length.checked_mul(512));
                let (Some(off), Some(len)) = (off, len) else {
                    bail!("linear target at sector {start}: offset or length overflows");
                };
                Arc::new(
                    LinearBackend::ranges(vec![(dev, off, len)])
                        .with_context(|| format!("linear target at sector {start} on {device}"))?,
                )
            }
        });
    }
    if single {
        return Ok((pieces.pop().context("no target")?, tags_out));
    }
    Ok((Arc::new(LinearBackend::new(pieces)?), None))
}

/// A crypt target with `integrity:N:aead` ([`AeadVolume`]): on a lower table that is a
/// dm-integrity device with external tags, as the kernel requires (the tags travel with
/// each request as the bio's integrity payload; a plain device has nowhere to keep them).
fn open_aead(
    line: ucrypt_format::TableLine,
    opts: OpenOptions,
    tagged: &[Option<Arc<IntegrityBackend>>],
) -> Result<Arc<dyn Backend>> {
    let dev = match &line.device {
        DeviceRef::Layer(j) => tagged.get(*j).cloned().flatten(),
        DeviceRef::Device(_) => None,
    };
    let Some(dev) = dev else {
        bail!(
            "integrity:N:aead needs a dm-integrity device without internal_hash below it \
             (a table input of two devices, \"NAME_dif: 0 LEN integrity DEV OFFSET TAG J ...\" \
             and \"NAME: 0 LEN crypt ... /dev/mapper/NAME_dif 0 ... integrity:TAG:aead\")"
        );
    };
    if line.offset != 0 {
        bail!("a crypt target with integrity:N:aead starts at offset 0 of its dm-integrity device");
    }
    let cipher = line
        .build_aead(ValidateOptions {
            allow_large_sectors: false,
        })
        .context("checking the table line")?;
    if opts.read_only && !dev.info().caps.read_only {
        bail!("a read-only crypt target over a read-write dm-integrity device");
    }
    let spread = aead_spread(&line, &opts.perf);
    Ok(Arc::new(
        AeadVolume::new(cipher, dev, line.length)?.with_spread(spread),
    ))
}

/// Where an authenticated crypt target runs a large request's AEAD work: as a plain crypt
/// target of the same table flags and `--perf-*` options would place its crypto
/// ([`crate::config::engine_options`]): `no_read_workqueue`/`no_write_workqueue` keep reads
/// or writes on the receiving thread, `same_cpu_crypt` keeps all of it there (dm-crypt's
/// bound per-CPU workqueue), `--workers` and `--split-bytes` set the threads and pieces.
fn aead_spread(line: &ucrypt_format::TableLine, perf: &crate::config::PerfOptions) -> Spread {
    let e = crate::config::engine_options(Some(line), perf);
    let d = Spread::default();
    Spread {
        threads: if e.same_cpu_crypt {
            1
        } else {
            e.workers.max(1)
        },
        min_bytes: e.auto.map_or(d.min_bytes, |a| a.split_min_bytes),
        piece_bytes: e.split_bytes,
        inline_reads: e.no_read_workqueue,
        inline_writes: e.no_write_workqueue,
    }
}

/// A standalone dm-integrity target ([`ucrypt_integrity::IntegrityBackend`]) on `dev`, as
/// the kernel's `dm_integrity_ctr` builds it: the superblock at `offset`, checked against
/// the line's tag and block size; a device whose superblock is all zeros is formatted with
/// the line's parameters first (the kernel does the same, without wiping); the mapping's
/// length may be shorter than what the device provides, not longer. With `meta_device:`
/// (`meta`), the superblock, journal and tags are on `meta` (at `offset`) and the data alone
/// on `dev`.
fn open_integrity(
    line: ucrypt_format::integrity::IntegrityLine,
    dev: Arc<dyn Backend>,
    meta: Option<Arc<dyn Backend>>,
    read_only: bool,
) -> Result<Opened> {
    use ucrypt_format::integrity::{FormatParams, Superblock, SALT_SIZE};
    use ucrypt_integrity::{Algorithm, Mode, Options};
    let (mut o, hash) = match line.internal_hash.clone() {
        Some((alg, key)) => {
            let hash = Algorithm::from_name(&alg).map_err(anyhow_msg)?;
            let mut o = Options::new(hash);
            o.hash_key = key;
            (o, Some(hash))
        }
        None => {
            // External tags: the crypt target above gives them; the size is the line's.
            let tag = line
                .tag_size
                .context("an integrity target without internal_hash needs its tag size")?;
            (Options::external(tag), None)
        }
    };
    if let Some((alg, key)) = line.journal_mac.clone() {
        o.journal_mac = Some((Algorithm::from_name(&alg).map_err(anyhow_msg)?, key));
    }
    if let Some((alg, key)) = line.journal_crypt.clone() {
        let Some(key) = key else {
            bail!("journal_crypt:{alg} needs its key (journal_crypt:{alg}:HEXKEY)");
        };
        o.journal_crypt = Some((alg, key));
    }
    o.mode = match line.mode {
        'D' => Mode::Direct,
        'B' => Mode::Bitmap,
        'R' => Mode::Recovery,
        _ => Mode::Journal,
    };
    if let Some(b) = line.buffer_sectors {
        o.buffer_sectors = b;
    }
    if let Some(w) = line.journal_watermark {
        o.journal_watermark = w;
    }
    o.sectors_per_bit = line.sectors_per_bit.unwrap_or(0);
    o.legacy_recalculate = line.legacy_recalculate;
    o.recalculate = line.recalculate;
    o.read_only = read_only;
    o.block_size = line.block_size;
    if let Some(hash) = hash {
        o.tag_size = Some(line.tag_size.unwrap_or(hash.digest_size() as u32));
    }
    // The superblock's device: the metadata device when there is one (the kernel's
    // `start` is applied there; the data device is used from its first sector).
    let (dev, data) = match meta {
        Some(m) => (m, Some(dev)),
        None => (dev, None),
    };
    let size = dev.info().size_bytes;
    let off = line.offset.checked_mul(512).filter(|&o| o < size);
    let Some(off) = off else {
        bail!("offset {} is beyond the device", line.offset);
    };
    let dev: Arc<dyn Backend> = if off == 0 {
        dev
    } else {
        Arc::new(LinearBackend::ranges(vec![(dev, off, size - off)])?)
    };
    let mut first = vec![0u8; 512];
    dev.read_at(&mut first, 0)?;
    if Superblock::is_blank(&first) && hash.is_none() {
        bail!(
            "the dm-integrity device has no superblock; one without internal_hash is \
             formatted by the layer above (luksFormat --integrity), not at activation"
        );
    }
    if Superblock::is_blank(&first) && o.mode != Mode::Recovery && !read_only {
        let mut salt = [0u8; SALT_SIZE];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut salt))
            .context("reading /dev/urandom")?;
        let params = FormatParams {
            sector_size: line.block_size.unwrap_or(512),
            tag_size: o.tag_size.unwrap_or(4),
            journal_sectors: line.journal_sectors.map_or(0, u64::from),
            interleave_sectors: line.interleave_sectors.unwrap_or(0),
            journal_mac: o.journal_mac.is_some(),
            keyed_or_hashed: true,
            fix_hmac: line.fix_hmac,
            fix_padding: line.fix_padding,
            bitmap_mode: o.mode == Mode::Bitmap,
            sectors_per_bitmap_bit: line.sectors_per_bit,
            salt,
        };
        match &data {
            Some(d) => {
                ucrypt_integrity::format_separate(
                    Arc::clone(&dev),
                    Arc::clone(d),
                    &params,
                    &o,
                    false,
                )?;
            }
            None => {
                ucrypt_integrity::format(Arc::clone(&dev), &params, &o, false)?;
            }
        }
    }
    let integrity = Arc::new(match data {
        Some(d) => IntegrityBackend::open_separate(dev, d, o)?,
        None => IntegrityBackend::open(dev, o)?,
    });
    let provided = integrity.info().size_bytes;
    let want = line.length.saturating_mul(512);
    if want > provided {
        bail!(
            "the line maps {} sectors, the device provides {}",
            line.length,
            provided / 512
        );
    }
    let tagged = integrity.external_tags().then(|| Arc::clone(&integrity));
    if want == provided {
        return Ok((integrity, tagged));
    }
    Ok((
        Arc::new(LinearBackend::ranges(vec![(
            integrity as Arc<dyn Backend>,
            0,
            want,
        )])?),
        tagged,
    ))
}

fn anyhow_msg(e: String) -> crate::error::Error {
    crate::error::Error::Invalid(e)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const K: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn crypt(start: u64, len: u64, dev: &str) -> String {
        format!("{start} {len} crypt aes-xts-plain64 {K} 0 {dev} 0")
    }

    /// A stacked input opens as layers: what the top device reads is the lower device's
    /// plaintext decrypted again, exactly as a volume opened on the lower volume.
    #[test]
    fn stacked_devices_open_on_each_other_and_targets_concatenate() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        let data: Vec<u8> = (0..16 * 512).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&img, &data).unwrap();
        let dev = img.display().to_string();
        let read = |text: &str| {
            let v = open_mapping(Mapping::parse(text).unwrap(), OpenOptions::default()).unwrap();
            let mut buf = vec![0u8; v.info().size_bytes as usize];
            v.read_at(&mut buf, 0).unwrap();
            buf
        };
        let one = read(&crypt(0, 16, &dev));
        let twice = read(&format!(
            "top: {}\nlow: {}",
            crypt(0, 16, "/dev/mapper/low"),
            crypt(0, 16, &dev)
        ));
        // Reference: the one-layer plaintext, written as a new device, decrypted again.
        let img2 = dir.path().join("img2");
        std::fs::write(&img2, &one).unwrap();
        assert_eq!(twice, read(&crypt(0, 16, &img2.display().to_string())));
        assert_ne!(twice, one);
        // Two targets of one device: the second half maps the same sectors again.
        let halves = read(&format!(
            "0 8 crypt aes-xts-plain64 {K} 0 {dev} 0\n8 8 crypt aes-xts-plain64 {K} 8 {dev} 8\n16 4 zero"
        ));
        assert_eq!(&halves[..16 * 512], &one[..]);
        assert!(halves[16 * 512..].iter().all(|&b| b == 0));
        // A linear target serves its window of the device as it is, next to a crypt target
        // (a LUKS2 volume in the middle of an encryption), and writes land there.
        let mixed = format!("0 8 crypt aes-xts-plain64 {K} 0 {dev} 0\n8 6 linear {dev} 10");
        let got = read(&mixed);
        assert_eq!(&got[..8 * 512], &one[..8 * 512]);
        assert_eq!(&got[8 * 512..], &data[10 * 512..16 * 512]);
        let v = open_mapping(Mapping::parse(&mixed).unwrap(), OpenOptions::default()).unwrap();
        v.write_at(&[0xa5; 512], 9 * 512, false).unwrap();
        v.flush().unwrap();
        let disk = std::fs::read(&img).unwrap();
        assert_eq!(&disk[11 * 512..12 * 512], &[0xa5; 512][..]);
        assert_eq!(&disk[..11 * 512], &data[..11 * 512]);
        // A window past the device's end is refused, as dm refuses the table.
        let e = open_mapping(
            Mapping::parse(&format!("0 8 linear {dev} 10")).unwrap(),
            OpenOptions::default(),
        )
        .map(|_| ())
        .unwrap_err();
        assert!(format!("{e:#}").contains("runs past the end"), "{e:#}");
    }

    /// The descriptors of this process open on `file`.
    fn fds_on(file: &std::path::Path) -> usize {
        let want = std::fs::canonicalize(file).unwrap();
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == want))
            .count()
    }

    /// Every target on one device shares one handle: a table of crypt and linear lines on
    /// one file (named three ways) holds as many descriptors on it as a one-line table, and
    /// a write through one target reads back through a stacked table on the same file.
    #[test]
    fn targets_on_one_device_share_one_handle() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        std::fs::write(&img, vec![0u8; 64 * 512]).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&img, &link).unwrap();
        let dev = img.display().to_string();
        let dotted = format!("{}/./img", dir.path().display());
        let one = open_mapping(
            Mapping::parse(&crypt(0, 16, &dev)).unwrap(),
            OpenOptions::default(),
        )
        .unwrap();
        let per_handle = fds_on(&img);
        assert!(per_handle >= 1);
        drop(one);
        assert_eq!(fds_on(&img), 0);
        let table = format!(
            "{}\n8 8 crypt aes-xts-plain64 {K} 8 {} 8\n16 16 linear {} 16",
            crypt(0, 8, &dev),
            link.display(),
            dotted
        );
        let v = open_mapping(Mapping::parse(&table).unwrap(), OpenOptions::default()).unwrap();
        assert_eq!(fds_on(&img), per_handle, "one device, one handle");
        // Across the boundary between the two crypt targets and into the linear one.
        let data: Vec<u8> = (0..20 * 512).map(|i| (i % 253) as u8).collect();
        v.write_at(&data, 2 * 512, false).unwrap();
        v.flush().unwrap();
        let mut back = vec![0u8; data.len()];
        v.read_at(&mut back, 2 * 512).unwrap();
        assert_eq!(back, data);
        let disk = std::fs::read(&img).unwrap();
        assert_eq!(&disk[16 * 512..22 * 512], &data[14 * 512..]);
        // The crypt part is what a one-line table on the file reads.
        drop(v);
        let whole = open_mapping(
            Mapping::parse(&crypt(0, 16, &dev)).unwrap(),
            OpenOptions::default(),
        )
        .unwrap();
        let mut plain = vec![0u8; 14 * 512];
        whole.read_at(&mut plain, 2 * 512).unwrap();
        assert_eq!(plain, data[..14 * 512]);
    }

    /// An authenticated target's large requests are placed as a plain one's: spread over
    /// the workers by default, inline where the table's (or the command line's) flags say.
    #[test]
    fn aead_spread_follows_the_table_flags() {
        let line = |opt: &str| -> ucrypt_format::TableLine {
            let n = if opt.is_empty() { 1 } else { 2 };
            format!(
                "0 8 crypt capi:authenc(hmac(sha256),xts(aes))-plain64 {K}{K}{K} 0 \
                 /dev/mapper/x_dif 0 {n} integrity:32:aead{opt}"
            )
            .parse()
            .unwrap()
        };
        let perf = crate::config::PerfOptions::default();
        let d = aead_spread(&line(""), &perf);
        assert!(!d.inline_reads && !d.inline_writes);
        assert_eq!(d.threads, Spread::default().threads);
        assert_eq!((d.min_bytes, d.piece_bytes), (256 << 10, 128 << 10));
        let r = aead_spread(&line(" no_read_workqueue"), &perf);
        assert!(r.inline_reads && !r.inline_writes);
        let w = aead_spread(&line(" no_write_workqueue"), &perf);
        assert!(!w.inline_reads && w.inline_writes);
        assert_eq!(aead_spread(&line(" same_cpu_crypt"), &perf).threads, 1);
        let cli = crate::config::PerfOptions {
            no_read_workqueue: true,
            workers: Some(3),
            split_bytes: Some(64 << 10),
            ..perf
        };
        let c = aead_spread(&line(""), &cli);
        assert!(c.inline_reads && !c.inline_writes);
        assert_eq!((c.threads, c.piece_bytes), (3, 64 << 10));
    }
}
