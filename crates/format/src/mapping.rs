//! The one model of an unlocked volume: a device-mapper table, or a stack of them.
//!
//! Every way of describing a volume ends here: a table input (`--table`, `--table-file`,
//! stdin, read by [`Mapping::parse`]) and every header format once unlocked (plain, LUKS1/2,
//! BitLocker, FileVault2, TCRYPT). The core crate only assembles backends from it
//! (`ucrypt::mapping::open_mapping`) and prints it ([`Mapping::to_lines`]).
//!
//! ```text
//!  Mapping { tables: [ Table 0, Table 1, … ] }      lower tables first, the last is served
//!   Table { name, targets: [Target, …] }            contiguous from sector 0, like a dm table
//!   Target::Crypt(TableLine { device: DeviceRef::Device(Device::Local("disk.img")) | DeviceRef::Layer(0), … })
//!   Target::Zero { start, length }                  reads zeros, drops writes
//!   Target::Linear { start, length, device, offset } `length` sectors of `device` from
//!                                                   `offset`, as they are (dm-linear)
//! ```
//!
//! Shapes in use:
//! - one table of one crypt target: plain, LUKS, FileVault2, a one-line table input;
//! - one table of several targets: BitLocker (crypt targets around zeroed metadata), LUKS2
//!   in the middle of a reencryption (one target per data segment, as cryptsetup maps it:
//!   new key then old key for a re-keying, crypt and linear for an encryption or
//!   decryption);
//! - a stack of one-target tables, each on the one below ([`DeviceRef::Layer`]): a TCRYPT
//!   cipher cascade (outermost cipher on the disk), a stacked table input.
//!
//! Table input rules, read the way dmsetup reads it, never truncated to its first line:
//! - plain lines are the targets of one device, in order, contiguous from sector 0 (the
//!   kernel's "Gap in table" rule);
//! - lines prefixed `NAME: ` (the form `dmsetup table` prints for several devices) define
//!   several devices; a crypt target whose device is `/dev/mapper/NAME` of a device defined
//!   in the same input is stacked on it (`vol_2` on the disk, `vol_1` on
//!   `/dev/mapper/vol_2`, `vol` on `/dev/mapper/vol_1`). Exactly one device is used by no
//!   other: that one is served; a device defined but not used, a cycle, or a reference to
//!   itself is refused.

use crate::{DeviceRef, FormatError, TableLine};

/// One target of a table (positions in 512-byte sectors).
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
    /// A dm-linear target (`<start> <length> linear <device> <offset>`): `length` sectors
    /// of `device` from sector `offset`, read and written as they are (the plaintext part
    /// of a LUKS2 volume in the middle of an encryption or decryption).
    Linear {
        /// Start in the mapped device.
        start: u64,
        /// Length.
        length: u64,
        /// The device.
        device: DeviceRef,
        /// Start on the device, in 512-byte sectors.
        offset: u64,
    },
    /// A dm-integrity target (standalone: its own internal hash).
    Integrity(crate::integrity::IntegrityLine),
}

fn rule(msg: String) -> FormatError {
    FormatError::Rule(msg)
}

impl Target {
    /// Start in 512-byte sectors.
    pub fn start(&self) -> u64 {
        match self {
            Target::Crypt(t) => t.start,
            Target::Integrity(t) => t.start,
            Target::Zero { start, .. } | Target::Linear { start, .. } => *start,
        }
    }

    /// Length in 512-byte sectors.
    pub fn length(&self) -> u64 {
        match self {
            Target::Crypt(t) => t.length,
            Target::Integrity(t) => t.length,
            Target::Zero { length, .. } | Target::Linear { length, .. } => *length,
        }
    }

    /// The device a crypt, integrity or linear target reads.
    pub fn device(&self) -> Option<&DeviceRef> {
        match self {
            Target::Crypt(t) => Some(&t.device),
            Target::Integrity(t) => Some(&t.device),
            Target::Linear { device, .. } => Some(device),
            Target::Zero { .. } => None,
        }
    }

    /// [`Target::device`], mutable.
    pub fn device_mut(&mut self) -> Option<&mut DeviceRef> {
        match self {
            Target::Crypt(t) => Some(&mut t.device),
            Target::Integrity(t) => Some(&mut t.device),
            Target::Linear { device, .. } => Some(device),
            Target::Zero { .. } => None,
        }
    }

    /// The line as `dmsetup table` prints it (key hidden unless `show_keys`); a crypt or
    /// linear target on a lower table shows `device` in its device field.
    fn to_line_on(&self, show_keys: bool, device: Option<&str>) -> String {
        match self {
            Target::Crypt(t) => match device {
                Some(d) => t.to_line_on(show_keys, d),
                None => t.to_line(show_keys),
            },
            Target::Integrity(t) => t.to_line_on(show_keys, device),
            Target::Zero { start, length } => format!("{start} {length} zero"),
            Target::Linear {
                start,
                length,
                device: dev,
                offset,
            } => match device {
                Some(d) => format!("{start} {length} linear {d} {offset}"),
                None => format!("{start} {length} linear {dev} {offset}"),
            },
        }
    }

    /// The line as `dmsetup table` prints it (key hidden unless `show_keys`).
    pub fn to_line(&self, show_keys: bool) -> String {
        self.to_line_on(show_keys, None)
    }

    /// Parses one target line: `crypt` (all of dm-crypt's syntax, see [`TableLine`]),
    /// `zero` (`<start> <length> zero`) or `linear` (`<start> <length> linear <device>
    /// <offset>`). Every other target type is refused by name: serving it as something
    /// else would give wrong data.
    ///
    /// # Errors
    /// The line's own error, or the unsupported target type.
    pub fn parse(line: &str) -> Result<Self, FormatError> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize, kind: &str, what: &str| -> Result<u64, FormatError> {
            fields[i].parse().map_err(|e| {
                rule(format!(
                    "{kind} target {what} \"{}\" is not a number of sectors: {e}",
                    crate::table::shown(fields[i])
                ))
            })
        };
        match fields.get(2).copied() {
            Some("crypt") => Ok(Target::Crypt(line.parse()?)),
            Some("integrity") => Ok(Target::Integrity(line.parse()?)),
            Some("zero") => {
                if fields.len() != 3 {
                    return Err(rule(
                        "a zero target is \"<start> <length> zero\" with no arguments".into(),
                    ));
                }
                Ok(Target::Zero {
                    start: num(0, "zero", "start")?,
                    length: num(1, "zero", "length")?,
                })
            }
            Some("linear") => {
                if fields.len() != 5 {
                    return Err(rule(
                        "a linear target is \"<start> <length> linear <device> <offset>\"".into(),
                    ));
                }
                Ok(Target::Linear {
                    start: num(0, "linear", "start")?,
                    length: num(1, "linear", "length")?,
                    device: DeviceRef::from(fields[3]),
                    offset: num(4, "linear", "offset")?,
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
                Err(rule(format!(
                    "target type {shown} is not supported: ucrypt serves crypt, \
                     integrity, linear and zero targets only (a verity, error... target \
                     would be served as something it is not)"
                )))
            }
            // Fewer than three fields: the crypt parser names what is missing.
            None => Ok(Target::Crypt(line.parse()?)),
        }
    }
}

/// One table of a [`Mapping`]: its name (`None` when the mapping does not name it) and its
/// targets in order, contiguous from sector 0.
#[derive(Debug)]
pub struct Table {
    /// `NAME` of `NAME: <line>` in a table input.
    pub name: Option<String>,
    /// The targets, contiguous from sector 0.
    pub targets: Vec<Target>,
}

impl Table {
    /// A table of one target.
    pub fn one(target: Target) -> Self {
        Table {
            name: None,
            targets: vec![target],
        }
    }

    /// Size in 512-byte sectors.
    pub fn sectors(&self) -> u64 {
        self.targets.iter().map(Target::length).sum()
    }
}

/// A volume's mapping: one table, or a stack of tables (see the module documentation).
/// `tables` is in stacking order: a crypt target may name a lower table
/// ([`DeviceRef::Layer`] with a smaller index), never its own or a higher one; the last
/// table is the device that is served.
#[derive(Debug)]
pub struct Mapping {
    /// The tables, lower layers first; the last is served.
    pub tables: Vec<Table>,
}

/// The path by which a line of a named table refers to the device `name`.
fn mapper_path(name: &str) -> String {
    format!("/dev/mapper/{name}")
}

impl Mapping {
    /// A mapping of one table of one crypt target.
    pub fn single(line: TableLine) -> Self {
        Mapping {
            tables: vec![Table::one(Target::Crypt(line))],
        }
    }

    /// A mapping of one table of several targets.
    pub fn targets(targets: Vec<Target>) -> Self {
        Mapping {
            tables: vec![Table {
                name: None,
                targets,
            }],
        }
    }

    /// A stack of crypt lines, the first on its own device, each of the others on the one
    /// below ([`DeviceRef::Layer`]: whatever device the lines name above the first is
    /// replaced).
    pub fn stack(lines: Vec<TableLine>) -> Self {
        let tables = lines
            .into_iter()
            .enumerate()
            .map(|(i, mut line)| {
                if i > 0 {
                    line.device = DeviceRef::Layer(i - 1);
                }
                Table::one(Target::Crypt(line))
            })
            .collect();
        Mapping { tables }
    }

    /// Parses a table input: blank lines and `#` comments are skipped, every other line is a
    /// target (see the module documentation). A `/dev/mapper/NAME` of a device defined in
    /// the input becomes a [`DeviceRef::Layer`].
    ///
    /// # Errors
    /// An empty input, a bad line (with its line number), named and unnamed lines mixed,
    /// targets not contiguous from 0, an unused device, a cycle.
    pub fn parse(text: &str) -> Result<Self, FormatError> {
        let mut tables: Vec<Table> = Vec::new();
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
                        return Err(rule(format!(
                            "{}: device name before ':' must be 1 to 127 characters without '/'",
                            at()
                        )));
                    }
                    (Some(n.to_string()), line[first.len()..].trim_start())
                }
                None => (None, line),
            };
            if *named.get_or_insert(name.is_some()) != name.is_some() {
                return Err(rule(format!(
                    "{}: named (\"NAME: ...\") and unnamed lines are mixed; name every line \
                     or none",
                    at()
                )));
            }
            let target = Target::parse(body).map_err(|e| FormatError::At {
                at: at(),
                source: Box::new(e),
            })?;
            match tables.iter_mut().find(|d| d.name == name) {
                Some(d) => d.targets.push(target),
                None => tables.push(Table {
                    name,
                    targets: vec![target],
                }),
            }
        }
        if tables.is_empty() {
            return Err(rule(
                "the table is empty (no line other than blanks and # comments)".into(),
            ));
        }
        for d in &tables {
            Self::check_contiguous(d)?;
        }
        let mut tables = Self::stacking_order(tables)?;
        // Name references to the input's own devices by position.
        let names: Vec<Option<String>> = tables.iter().map(|t| t.name.clone()).collect();
        for t in &mut tables {
            for target in &mut t.targets {
                if let Some(device) = target.device_mut() {
                    if let Some(j) = names
                        .iter()
                        .position(|n| n.as_deref().is_some_and(|n| *device == *mapper_path(n)))
                    {
                        *device = DeviceRef::Layer(j);
                    }
                }
            }
        }
        Ok(Mapping { tables })
    }

    /// The kernel's rule: targets follow each other from sector 0, none empty.
    fn check_contiguous(d: &Table) -> Result<(), FormatError> {
        let mut at = 0u64;
        for t in &d.targets {
            if t.start() != at {
                return Err(rule(format!(
                    "{}target at sector {} should start at {at}: a table's targets must \
                     follow each other from sector 0 without gaps or overlaps, in order \
                     (as the kernel's dm table requires)",
                    d.name
                        .as_ref()
                        .map_or(String::new(), |n| format!("device {n}: ")),
                    t.start()
                )));
            }
            if t.length() == 0 {
                return Err(rule(format!("a target of length 0 at sector {at}")));
            }
            at = at
                .checked_add(t.length())
                .ok_or_else(|| rule("target lengths overflow".into()))?;
        }
        Ok(())
    }

    /// Checks a mapping built by a format (not parsed): at least one table, every table's
    /// targets contiguous from 0, every lower-table reference pointing below its own table.
    ///
    /// # Errors
    /// [`FormatError::Rule`] naming the broken rule.
    pub fn check(&self) -> Result<(), FormatError> {
        if self.tables.is_empty() {
            return Err(rule("the mapping has no table".into()));
        }
        for (i, t) in self.tables.iter().enumerate() {
            if t.targets.is_empty() {
                return Err(rule(format!("table {i} of the mapping has no target")));
            }
            Self::check_contiguous(t)?;
            for target in &t.targets {
                if let Some(DeviceRef::Layer(j)) = target.device() {
                    if *j >= i {
                        return Err(rule(format!(
                            "table {i} of the mapping sits on table {j}, which is not below it"
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Indices of the input's devices that `d` sits on (before references are resolved).
    fn lower<'a>(d: &'a Table, names: &'a [String]) -> impl Iterator<Item = usize> + 'a {
        d.targets.iter().filter_map(move |t| {
            let device = t.device()?;
            names.iter().position(|n| *device == *mapper_path(n))
        })
    }

    /// Orders named devices lower layers first, the served device last.
    fn stacking_order(mut devices: Vec<Table>) -> Result<Vec<Table>, FormatError> {
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
                    return Err(rule(format!("device {} is stacked on itself", names[i])));
                }
                used[j] = true;
            }
        }
        let tops: Vec<usize> = (0..devices.len()).filter(|&i| !used[i]).collect();
        let [top] = tops[..] else {
            let list: Vec<&str> = tops.iter().map(|&i| names[i].as_str()).collect();
            if list.is_empty() {
                return Err(rule(
                    "the table's devices stack on each other in a cycle".into(),
                ));
            }
            return Err(rule(format!(
                "the table defines {} devices that no other device uses ({}): only one can be \
                 served; stack the others under it through /dev/mapper/NAME or remove them",
                list.len(),
                list.join(", ")
            )));
        };
        // Depth-first from the top: post-order puts every device after those below it.
        let mut order = Vec::with_capacity(devices.len());
        let mut state = vec![0u8; devices.len()]; // 0 new, 1 on the path, 2 placed
        fn visit(
            i: usize,
            devices: &[Table],
            names: &[String],
            state: &mut [u8],
            order: &mut Vec<usize>,
        ) -> Result<(), FormatError> {
            match state[i] {
                2 => return Ok(()),
                1 => {
                    return Err(rule(format!(
                        "the table's devices stack on each other in a cycle (through {})",
                        names[i]
                    )))
                }
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
            return Err(rule(format!(
                "device {} is defined but the served device {} does not use it",
                names[i], names[top]
            )));
        }
        let mut slots: Vec<Option<Table>> = devices.drain(..).map(Some).collect();
        Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
    }

    /// The mapping as `dmsetup table` prints it (key hidden unless `show_keys`), lower
    /// tables first: one line per target, prefixed `NAME: ` when the mapping has several
    /// tables, a lower table named by its `/dev/mapper/NAME`. Tables without a name of
    /// their own are named as cryptsetup names the devices of `cryptsetup open NAME` (the
    /// `name` given): `NAME` on top, `NAME_1` below it, and so on down; a dm-integrity
    /// table below a crypt table `NAME_dif`.
    pub fn to_lines_named(&self, show_keys: bool, name: &str) -> Vec<String> {
        let n = self.tables.len();
        let names: Vec<Option<String>> = self
            .tables
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.name.clone().or_else(|| {
                    (n > 1).then(|| match (n - 1 - i, &t.targets[..]) {
                        (0, _) => name.to_string(),
                        (_, [Target::Integrity(_)]) => format!("{name}_dif"),
                        (k, _) => format!("{name}_{k}"),
                    })
                })
            })
            .collect();
        self.lines(show_keys, &names)
    }

    /// [`Mapping::to_lines_named`] for a mapping whose tables carry their own names (a
    /// parsed table input), or of one table.
    pub fn to_lines(&self, show_keys: bool) -> Vec<String> {
        let names: Vec<Option<String>> = self.tables.iter().map(|t| t.name.clone()).collect();
        self.lines(show_keys, &names)
    }

    fn lines(&self, show_keys: bool, names: &[Option<String>]) -> Vec<String> {
        let mut out = Vec::new();
        for (t, name) in self.tables.iter().zip(names) {
            for target in &t.targets {
                let below = match target.device() {
                    Some(DeviceRef::Layer(j)) => {
                        names.get(*j).cloned().flatten().map(|n| mapper_path(&n))
                    }
                    _ => None,
                };
                let line = target.to_line_on(show_keys, below.as_deref());
                out.push(match name {
                    Some(n) => format!("{n}: {line}"),
                    None => line,
                });
            }
        }
        out
    }

    /// Every crypt line of every table.
    pub fn crypt_lines(&self) -> impl Iterator<Item = &TableLine> {
        self.tables
            .iter()
            .flat_map(|d| &d.targets)
            .filter_map(|t| match t {
                Target::Crypt(l) => Some(l),
                Target::Zero { .. } | Target::Linear { .. } | Target::Integrity(_) => None,
            })
    }

    /// The first crypt line of the lowest table: the one on the real device (the whole
    /// mapping for one-line volumes; the outermost layer of a cascade; BitLocker's first
    /// target).
    pub fn first_crypt(&self) -> Option<&TableLine> {
        // The lowest table holding one (a crypt table over dm-integrity is the second).
        self.tables
            .iter()
            .flat_map(|d| &d.targets)
            .find_map(|t| match t {
                Target::Crypt(l) => Some(l),
                Target::Zero { .. } | Target::Linear { .. } | Target::Integrity(_) => None,
            })
    }

    /// Whether the mapping is one table of one crypt target (the common one-line table).
    pub fn single_line(&self) -> Option<&TableLine> {
        match &self.tables[..] {
            [d] => match &d.targets[..] {
                [Target::Crypt(l)] => Some(l),
                _ => None,
            },
            _ => None,
        }
    }

    /// [`Mapping::single_line`], mutable.
    pub fn single_line_mut(&mut self) -> Option<&mut TableLine> {
        match &mut self.tables[..] {
            [d] => match &mut d.targets[..] {
                [Target::Crypt(l)] => Some(l),
                _ => None,
            },
            _ => None,
        }
    }

    /// [`Mapping::single_line`], taken out.
    pub fn into_single_line(self) -> Result<TableLine, Self> {
        if self.single_line().is_none() {
            return Err(self);
        }
        let mut tables = self.tables;
        match tables.pop().and_then(|t| t.targets.into_iter().next()) {
            Some(Target::Crypt(l)) => Ok(l),
            _ => unreachable!("checked by single_line"),
        }
    }

    /// Size of the served device in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.tables.last().map_or(0, |d| d.sectors() * 512)
    }

    /// One line describing the mapping (no key): for the NBD export description.
    pub fn describe(&self) -> String {
        let targets: usize = self.tables.iter().map(|d| d.targets.len()).sum();
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
                    self.tables.len(),
                    ciphers.join(" + ")
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const K: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn crypt(start: u64, len: u64, dev: &str) -> String {
        format!("{start} {len} crypt aes-xts-plain64 {K} 0 {dev} 0")
    }

    /// Every shape a table input can take: honoured (tables in stacking order, served
    /// last, lower tables referenced by position) or refused with the rule named.
    #[test]
    fn table_inputs_are_honoured_whole_or_refused() {
        // (input, expected tables in stacking order: name and number of targets)
        type Shape<'a> = Vec<(Option<&'a str>, usize)>;
        let ok: Vec<(String, Shape)> = vec![
            (crypt(0, 8, "/d"), vec![(None, 1)]),
            (format!("# c\n\n{}\n", crypt(0, 8, "/d")), vec![(None, 1)]),
            (
                format!("{}\n{}\n8 8 zero", crypt(0, 4, "/d"), crypt(4, 4, "/d")),
                vec![(None, 3)],
            ),
            (
                format!("{}\n8 8 linear /d 16", crypt(0, 8, "/d")),
                vec![(None, 2)],
            ),
            (
                format!(
                    "v: {}\nv: 8 8 linear /dev/mapper/low 0\nlow: {}",
                    crypt(0, 8, "/dev/mapper/low"),
                    crypt(0, 8, "/d")
                ),
                vec![(Some("low"), 1), (Some("v"), 2)],
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
            let m = Mapping::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let got: Shape = m
                .tables
                .iter()
                .map(|d| (d.name.as_deref(), d.targets.len()))
                .collect();
            assert_eq!(got, want, "{text}");
            m.check().unwrap();
            // What it prints reads back to the same shape (the key hidden or not).
            let again = Mapping::parse(&m.to_lines(true).join("\n")).unwrap();
            assert_eq!(again.to_lines(true), m.to_lines(true));
        }
        // The stack's references are positions, printed back as the names they were.
        let m = Mapping::parse(&format!(
            "top: {}\nlow: {}",
            crypt(0, 8, "/dev/mapper/low"),
            crypt(0, 8, "/d")
        ))
        .unwrap();
        assert_eq!(m.first_crypt().unwrap().device, DeviceRef::from("/d"));
        assert_eq!(m.tables[1].targets.len(), 1);
        let Target::Crypt(top) = &m.tables[1].targets[0] else {
            panic!("crypt")
        };
        assert_eq!(top.device, DeviceRef::Layer(0));
        assert_eq!(
            m.to_lines(false)[1],
            format!("top: 0 8 crypt aes-xts-plain64 <key:32-bytes> 0 /dev/mapper/low 0")
        );
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
                format!("{}\n8 8 striped 2 8 /d 0 /e 0", crypt(0, 8, "/d")),
                "target type \"striped\" is not supported",
            ),
            (format!("{}\n8 8 linear /d", crypt(0, 8, "/d")), "<offset>"),
            (
                format!("{}\n8 8 linear /d x", crypt(0, 8, "/d")),
                "linear target offset \"x\" is not a number",
            ),
            (
                "0 8 integrity /d 0 - J 0".into(),
                "without internal_hash: the tag size is the crypt target's",
            ),
            (
                "0 8 verity /d /h 4096 4096 1 1 sha256 - -".into(),
                "target type \"verity\" is not supported",
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
                "integrity:N:aead needs an authenticated cipher",
            ),
        ];
        for (text, want) in bad {
            let err = Mapping::parse(&text).unwrap_err();
            // The whole chain, as the command prints it.
            let mut e = err.to_string();
            let mut src = std::error::Error::source(&err);
            while let Some(s) = src {
                e.push_str(&format!(": {s}"));
                src = s.source();
            }
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains(K), "the key leaked into: {e}");
        }
    }

    /// A linear target prints as dm prints it (`START LEN linear DEV OFFSET`), on a path
    /// or on a lower table (by its `/dev/mapper/` name), and reads back as itself.
    #[test]
    fn linear_targets_print_as_dm_prints_them() {
        let text = format!("{}\n8 24 linear /d 2048", crypt(0, 8, "/d"));
        let m = Mapping::parse(&text).unwrap();
        let Target::Linear {
            start,
            length,
            device,
            offset,
        } = &m.tables[0].targets[1]
        else {
            panic!("linear")
        };
        assert_eq!((*start, *length, *offset), (8, 24, 2048));
        assert_eq!(*device, DeviceRef::from("/d"));
        assert_eq!(m.size_bytes(), 32 * 512);
        assert_eq!(
            m.to_lines(false),
            vec![
                "0 8 crypt aes-xts-plain64 <key:32-bytes> 0 /d 0".to_string(),
                "8 24 linear /d 2048".to_string()
            ]
        );
        assert_eq!(m.to_lines(true).join("\n"), text);
        let m = Mapping::parse(&format!(
            "top: 0 8 linear /dev/mapper/low 8\nlow: {}",
            crypt(0, 16, "/d")
        ))
        .unwrap();
        assert_eq!(m.tables[1].targets[0].device(), Some(&DeviceRef::Layer(0)));
        assert_eq!(m.to_lines(false)[1], "top: 0 8 linear /dev/mapper/low 8");
    }

    /// A stack built by a format (TCRYPT) prints as cryptsetup names its devices, the
    /// lower ones by `/dev/mapper/` of the name, never by an invented device string.
    #[test]
    fn a_stack_prints_with_cryptsetup_names() {
        let line = |dev: &str| crypt(0, 8, dev).parse::<TableLine>().unwrap();
        let m = Mapping::stack(vec![line("/d"), line("ignored"), line("ignored")]);
        m.check().unwrap();
        let got = m.to_lines_named(false, "vol");
        let want: Vec<String> = [
            ("vol_2", "/d"),
            ("vol_1", "/dev/mapper/vol_2"),
            ("vol", "/dev/mapper/vol_1"),
        ]
        .iter()
        .map(|(n, d)| format!("{n}: 0 8 crypt aes-xts-plain64 <key:32-bytes> 0 {d} 0"))
        .collect();
        assert_eq!(got, want);
        assert!(got.iter().all(|l| !l.contains("ignored")));
        // One table prints without names.
        assert_eq!(
            Mapping::single(line("/d")).to_lines_named(false, "vol"),
            vec!["0 8 crypt aes-xts-plain64 <key:32-bytes> 0 /d 0".to_string()]
        );
        // A reference to a table not below is refused.
        let mut bad = Mapping::stack(vec![line("/d"), line("x")]);
        if let Target::Crypt(l) = &mut bad.tables[1].targets[0] {
            l.device = DeviceRef::Layer(1);
        }
        assert!(bad.check().unwrap_err().to_string().contains("not below"));
    }
}
