//! Multi-target mappings: a device-mapper table of several lines (dm-crypt and dm-zero
//! targets side by side), as cryptsetup builds for BitLocker. Each crypt target becomes its
//! own [`ucrypt_engine::Volume`]; [`LinearBackend`] (in the backend crate) puts them end to end like dm's table.
//!
//! ```text
//!  Target::Crypt(0 16 crypt ... 70592) ─► Volume ┐
//!  Target::Crypt(16 68760 crypt ... 16) ─► Volume ├─► LinearBackend (one Backend, served over NBD)
//!  Target::Zero(68776 128)              ─► zeros  ┘
//! ```
//!
//! [`Mapping`] is a whole table input (`--table`, `--table-file`, stdin) read the way
//! dmsetup reads it, never truncated to its first line:
//! - plain lines are the targets of one device, in order, contiguous from sector 0 (the
//!   kernel's "Gap in table" rule);
//! - lines prefixed `NAME: ` (the form `dmsetup table` prints for several devices) define
//!   several devices; a crypt target whose device is `/dev/mapper/NAME` of a device defined
//!   in the same input is stacked on it (a TCRYPT cascade: `vol_2` on the disk, `vol_1` on
//!   `/dev/mapper/vol_2`, `vol` on `/dev/mapper/vol_1`). Exactly one device is used by no
//!   other: that one is served; a device defined but not used, a cycle, or a reference to
//!   itself is refused.

use crate::open::{open_device, open_parsed, open_parsed_with, OpenOptions};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::sync::Arc;
use ucrypt_backend::{Backend, LinearBackend, ZeroBackend};
use ucrypt_format::TableLine;

/// One line of a multi-target table (positions in 512-byte sectors).
#[derive(Debug)]
pub enum Target {
    /// A dm-crypt target (its own `start` and `length`).
    Crypt(TableLine),
    /// A dm-zero target: reads zeros, writes are dropped.
    Zero {
        /// Start in the mapped device.
        start: u64,
        /// Length.
        length: u64,
    },
}

impl Target {
    /// Start in 512-byte sectors.
    pub fn start(&self) -> u64 {
        match self {
            Target::Crypt(t) => t.start,
            Target::Zero { start, .. } => *start,
        }
    }

    /// Length in 512-byte sectors.
    pub fn length(&self) -> u64 {
        match self {
            Target::Crypt(t) => t.length,
            Target::Zero { length, .. } => *length,
        }
    }

    /// The line as `dmsetup table` prints it (key hidden unless `show_keys`).
    pub fn to_line(&self, show_keys: bool) -> String {
        match self {
            Target::Crypt(t) => t.to_line(show_keys),
            Target::Zero { start, length } => format!("{start} {length} zero"),
        }
    }

    /// Parses one target line: `crypt` (all of dm-crypt's syntax, see
    /// [`ucrypt_format::TableLine`]) or `zero` (`<start> <length> zero`). Every other target
    /// type is refused by name: serving it as something else would give wrong data.
    ///
    /// # Errors
    /// The line's own error, or the unsupported target type.
    pub fn parse(line: &str) -> Result<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.get(2).copied() {
            Some("crypt") => Ok(Target::Crypt(line.parse()?)),
            Some("zero") => {
                if fields.len() != 3 {
                    bail!("a zero target is \"<start> <length> zero\" with no arguments");
                }
                let num = |i: usize, what: &str| -> Result<u64> {
                    fields[i].parse().with_context(|| {
                        format!(
                            "zero target {what} \"{}\" is not a number of sectors",
                            fields[i]
                        )
                    })
                };
                Ok(Target::Zero {
                    start: num(0, "start")?,
                    length: num(1, "length")?,
                })
            }
            Some(other) => {
                // A target type is a short word; anything else may be a shifted key.
                let shown = if other.len() <= 24
                    && other
                        .bytes()
                        .all(|b| b.is_ascii_alphabetic() || b == b'-' || b == b'_')
                {
                    format!("\"{other}\"")
                } else {
                    "(not shown)".to_string()
                };
                bail!(
                    "target type {shown} is not supported: ucrypt serves crypt and zero \
                     targets only (a linear, integrity, verity, error... target would be \
                     served as something it is not)"
                )
            }
            // Fewer than three fields: the crypt parser names what is missing.
            None => Ok(Target::Crypt(line.parse()?)),
        }
    }
}

/// One device of a [`Mapping`]: its name (`None` for an unnamed one-device table) and its
/// targets in order.
#[derive(Debug)]
pub struct MappedDevice {
    /// `NAME` of `NAME: <line>`.
    pub name: Option<String>,
    /// The targets, contiguous from sector 0.
    pub targets: Vec<Target>,
}

/// A whole table input: one or more devices of one or more targets (see the module
/// documentation for the rules). `devices` is in stacking order: every device comes after
/// the devices it sits on, and the last one is the device that is served.
#[derive(Debug)]
pub struct Mapping {
    /// The devices, lower layers first; the last is served.
    pub devices: Vec<MappedDevice>,
}

/// The path by which a line of a named table refers to the device `name`.
fn mapper_path(name: &str) -> String {
    format!("/dev/mapper/{name}")
}

impl Mapping {
    /// Parses a table input: blank lines and `#` comments are skipped, every other line is a
    /// target (see the module documentation).
    ///
    /// # Errors
    /// An empty input, a bad line (with its line number), named and unnamed lines mixed,
    /// targets not contiguous from 0, an unused device, a cycle.
    pub fn parse(text: &str) -> Result<Self> {
        let mut devices: Vec<MappedDevice> = Vec::new();
        let mut named = None;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = || format!("table line {}", i + 1);
            let first = line.split_whitespace().next().unwrap_or("");
            let (name, body) = match first.strip_suffix(':') {
                Some(n) => {
                    if n.is_empty() || n.contains('/') || n.len() > 127 {
                        bail!(
                            "{}: device name before ':' must be 1 to 127 characters without '/'",
                            at()
                        );
                    }
                    (Some(n.to_string()), line[first.len()..].trim_start())
                }
                None => (None, line),
            };
            if *named.get_or_insert(name.is_some()) != name.is_some() {
                bail!(
                    "{}: named (\"NAME: ...\") and unnamed lines are mixed; name every line \
                     or none",
                    at()
                );
            }
            let target = Target::parse(body).with_context(at)?;
            match devices.iter_mut().find(|d| d.name == name) {
                Some(d) => d.targets.push(target),
                None => devices.push(MappedDevice {
                    name,
                    targets: vec![target],
                }),
            }
        }
        if devices.is_empty() {
            bail!("the table is empty (no line other than blanks and # comments)");
        }
        for d in &devices {
            let mut at = 0;
            for t in &d.targets {
                if t.start() != at {
                    bail!(
                        "{}target at sector {} should start at {at}: a table's targets must \
                         follow each other from sector 0 without gaps or overlaps, in order \
                         (as the kernel's dm table requires)",
                        d.name
                            .as_ref()
                            .map_or(String::new(), |n| format!("device {n}: ")),
                        t.start()
                    );
                }
                if t.length() == 0 {
                    bail!("a target of length 0 at sector {at}");
                }
                at = at
                    .checked_add(t.length())
                    .context("target lengths overflow")?;
            }
        }
        let mapping = Mapping {
            devices: Self::stacking_order(devices)?,
        };
        Ok(mapping)
    }

    /// Names of the input's devices that `d` sits on.
    fn lower<'a>(d: &'a MappedDevice, names: &'a [String]) -> impl Iterator<Item = usize> + 'a {
        d.targets.iter().filter_map(move |t| match t {
            Target::Crypt(l) => names.iter().position(|n| mapper_path(n) == l.device),
            Target::Zero { .. } => None,
        })
    }

    /// Orders named devices lower layers first, the served device last.
    fn stacking_order(mut devices: Vec<MappedDevice>) -> Result<Vec<MappedDevice>> {
        if devices.len() == 1 && devices[0].name.is_none() {
            return Ok(devices);
        }
        let names: Vec<String> = devices
            .iter()
            .map(|d| d.name.clone().unwrap_or_default())
            .collect();
        let mut used = vec![false; devices.len()];
        for (i, d) in devices.iter().enumerate() {
            for j in Self::lower(d, &names) {
                if j == i {
                    bail!("device {} is stacked on itself", names[i]);
                }
                used[j] = true;
            }
        }
        let tops: Vec<usize> = (0..devices.len()).filter(|&i| !used[i]).collect();
        let [top] = tops[..] else {
            let list: Vec<&str> = tops.iter().map(|&i| names[i].as_str()).collect();
            if list.is_empty() {
                bail!("the table's devices stack on each other in a cycle");
            }
            bail!(
                "the table defines {} devices that no other device uses ({}): only one can be \
                 served; stack the others under it through /dev/mapper/NAME or remove them",
                list.len(),
                list.join(", ")
            );
        };
        // Depth-first from the top: post-order puts every device after those below it.
        let mut order = Vec::with_capacity(devices.len());
        let mut state = vec![0u8; devices.len()]; // 0 new, 1 on the path, 2 placed
        fn visit(
            i: usize,
            devices: &[MappedDevice],
            names: &[String],
            state: &mut [u8],
            order: &mut Vec<usize>,
        ) -> Result<()> {
            match state[i] {
                2 => return Ok(()),
                1 => bail!(
                    "the table's devices stack on each other in a cycle (through {})",
                    names[i]
                ),
                _ => {}
            }
            state[i] = 1;
            for j in Mapping::lower(&devices[i], names) {
                visit(j, devices, names, state, order)?;
            }
            state[i] = 2;
            order.push(i);
            Ok(())
        }
        visit(top, &devices, &names, &mut state, &mut order)?;
        if let Some(i) = (0..devices.len()).find(|&i| state[i] != 2) {
            bail!(
                "device {} is defined but the served device {} does not use it",
                names[i],
                names[top]
            );
        }
        let mut slots: Vec<Option<MappedDevice>> = devices.drain(..).map(Some).collect();
        Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
    }

    /// The input as `dmsetup table` prints it (key hidden unless `show_keys`), lower layers
    /// first.
    pub fn to_lines(&self, show_keys: bool) -> Vec<String> {
        let mut out = Vec::new();
        for d in &self.devices {
            for t in &d.targets {
                let line = t.to_line(show_keys);
                out.push(match &d.name {
                    Some(n) => format!("{n}: {line}"),
                    None => line,
                });
            }
        }
        out
    }

    /// Every crypt line of every device.
    pub fn crypt_lines(&self) -> impl Iterator<Item = &TableLine> {
        self.devices
            .iter()
            .flat_map(|d| &d.targets)
            .filter_map(|t| match t {
                Target::Crypt(l) => Some(l),
                Target::Zero { .. } => None,
            })
    }

    /// Whether the input is one device of one crypt target (the common one-line table).
    pub fn single_line(&self) -> Option<&TableLine> {
        match &self.devices[..] {
            [d] => match &d.targets[..] {
                [Target::Crypt(l)] => Some(l),
                _ => None,
            },
            _ => None,
        }
    }

    /// Size of the served device in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.devices
            .last()
            .map_or(0, |d| d.targets.iter().map(|t| t.length() * 512).sum())
    }

    /// One line describing the mapping (no key): for the NBD export description.
    pub fn describe(&self) -> String {
        let targets: usize = self.devices.iter().map(|d| d.targets.len()).sum();
        match self.single_line() {
            Some(l) => format!(
                "ucrypt {} ({}-byte sectors) on {}",
                l.cipher,
                l.sector_size_bytes(),
                l.device
            ),
            None => {
                let ciphers: Vec<String> =
                    self.crypt_lines().map(|l| l.cipher.to_string()).collect();
                format!(
                    "ucrypt mapping of {} device(s), {targets} target(s): {}",
                    self.devices.len(),
                    ciphers.join(" + ")
                )
            }
        }
    }
}

/// Opens every device of `mapping`, lower layers first, and returns the served one. A
/// one-line table gives its volume directly (exactly as [`open_parsed`]).
///
/// # Errors
/// As [`open_parsed`] for each crypt target, and a stacked layer that does not fit the
/// device below it.
pub fn open_mapping(mapping: Mapping, opts: OpenOptions) -> Result<Arc<dyn Backend>> {
    let mut opened: HashMap<String, Arc<dyn Backend>> = HashMap::new();
    let mut last = None;
    for d in mapping.devices {
        let dev = open_device_targets(d.targets, opts, &opened);
        let dev = match &d.name {
            Some(n) => dev.with_context(|| format!("device {n}"))?,
            None => dev?,
        };
        if let Some(n) = d.name {
            opened.insert(mapper_path(&n), dev.clone());
        }
        last = Some(dev);
    }
    last.context("the table is empty")
}

/// Opens one device's targets: crypt targets on a lower device of the same input (by its
/// `/dev/mapper/NAME`) or on the path they name; one target is returned as it is, several
/// are joined by [`Linear`].
fn open_device_targets(
    targets: Vec<Target>,
    opts: OpenOptions,
    lower: &HashMap<String, Arc<dyn Backend>>,
) -> Result<Arc<dyn Backend>> {
    let single = targets.len() == 1;
    let mut pieces: Vec<Arc<dyn Backend>> = Vec::with_capacity(targets.len());
    for t in targets {
        pieces.push(match t {
            Target::Crypt(mut line) => {
                line.start = 0;
                open_parsed_with(line, opts, |l| match lower.get(&l.device) {
                    Some(b) => Ok(b.clone()),
                    None => open_device(&l.device, opts.read_only, opts.direct),
                })?
                .volume
            }
            Target::Zero { length, .. } => Arc::new(ZeroBackend::new(length * 512)),
        });
    }
    if single {
        return pieces.pop().context("no target");
    }
    Ok(Arc::new(LinearBackend::new(pieces)?))
}

/// Opens every target of `targets` (sorted, contiguous from 0) and joins them.
///
/// # Errors
/// Gaps or overlaps between targets, and any error of opening a crypt target.
pub fn open_targets(targets: Vec<Target>, opts: OpenOptions) -> Result<Arc<dyn Backend>> {
    let mut at = 0;
    let mut pieces: Vec<Arc<dyn Backend>> = Vec::with_capacity(targets.len());
    for t in targets {
        if t.start() != at {
            bail!(
                "target \"{}\" starts at sector {}, expected {at} (targets must be contiguous)",
                t.to_line(false),
                t.start()
            );
        }
        at += t.length();
        pieces.push(match t {
            Target::Crypt(mut line) => {
                // Each target is its own volume; its place comes from the concatenation.
                line.start = 0;
                open_parsed(line, opts)?.volume
            }
            Target::Zero { length, .. } => Arc::new(ZeroBackend::new(length * 512)),
        });
    }
    Ok(Arc::new(LinearBackend::new(pieces)?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const K: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn crypt(start: u64, len: u64, dev: &str) -> String {
        format!("{start} {len} crypt aes-xts-plain64 {K} 0 {dev} 0")
    }

    /// Every shape a table input can take: honoured (devices in stacking order, served
    /// last) or refused with the rule named.
    #[test]
    fn table_inputs_are_honoured_whole_or_refused() {
        // (input, expected devices in stacking order: name and number of targets)
        type Shape<'a> = Vec<(Option<&'a str>, usize)>;
        let ok: Vec<(String, Shape)> = vec![
            (crypt(0, 8, "/d"), vec![(None, 1)]),
            (format!("# c\n\n{}\n", crypt(0, 8, "/d")), vec![(None, 1)]),
            (
                format!("{}\n{}\n8 8 zero", crypt(0, 4, "/d"), crypt(4, 4, "/d")),
                vec![(None, 3)],
            ),
            (
                format!(
                    "v: {}\nv_1: {}\nv_2: {}",
                    crypt(0, 8, "/dev/mapper/v_1"),
                    crypt(0, 8, "/dev/mapper/v_2"),
                    crypt(0, 8, "/d")
                ),
                vec![(Some("v_2"), 1), (Some("v_1"), 1), (Some("v"), 1)],
            ),
        ];
        for (text, want) in ok {
            let m = Mapping::parse(&text).unwrap_or_else(|e| panic!("{text}: {e:#}"));
            let got: Shape = m
                .devices
                .iter()
                .map(|d| (d.name.as_deref(), d.targets.len()))
                .collect();
            assert_eq!(got, want, "{text}");
            // What it prints reads back to the same shape (the key hidden or not).
            let again = Mapping::parse(&m.to_lines(true).join("\n")).unwrap();
            assert_eq!(again.to_lines(true), m.to_lines(true));
        }
        let bad: Vec<(String, &str)> = vec![
            (String::new(), "empty"),
            ("# only a comment\n".into(), "empty"),
            (
                format!("{}\n{}", crypt(0, 8, "/d"), crypt(0, 8, "/d")),
                "without gaps or overlaps",
            ),
            (
                format!("{}\n{}", crypt(0, 8, "/d"), crypt(9, 8, "/d")),
                "without gaps or overlaps",
            ),
            (crypt(1, 8, "/d"), "should start at 0"),
            (
                format!("{}\n8 8 linear /d 0", crypt(0, 8, "/d")),
                "target type \"linear\" is not supported",
            ),
            (
                "0 8 integrity /d 0 32 J 0".into(),
                "target type \"integrity\" is not supported",
            ),
            ("0 8 zero 1".into(), "no arguments"),
            (
                format!("a: {}\n{}", crypt(0, 8, "/d"), crypt(0, 8, "/d")),
                "mixed",
            ),
            (
                format!("a: {}\nb: {}", crypt(0, 8, "/d"), crypt(0, 8, "/d")),
                "no other device uses (a, b)",
            ),
            (
                format!(
                    "a: {}\nb: {}",
                    crypt(0, 8, "/dev/mapper/b"),
                    crypt(0, 8, "/dev/mapper/a")
                ),
                "cycle",
            ),
            (
                format!("a: {}", crypt(0, 8, "/dev/mapper/a")),
                "stacked on itself",
            ),
            (
                format!(
                    "a: {}\nb: {}\nc: {}",
                    crypt(0, 8, "/d"),
                    crypt(0, 8, "/dev/mapper/c"),
                    crypt(0, 8, "/dev/mapper/b")
                ),
                "defined but the served device a does not use it",
            ),
            (
                format!("{} 1 integrity:32:aead", crypt(0, 8, "/d")),
                "authenticated encryption",
            ),
        ];
        for (text, want) in bad {
            let e = format!("{:#}", Mapping::parse(&text).unwrap_err());
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains(K), "the key leaked into: {e}");
        }
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
    }
}
