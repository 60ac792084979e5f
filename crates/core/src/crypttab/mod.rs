//! crypttab(5): which volumes to open, from what, with which key and options, one line
//! each, as `/etc/crypttab` says it for systemd-cryptsetup (ucrypt's own file is
//! `/etc/ucrypttab`, same format, so the two never open one volume twice).
//!
//! ```text
//! # name   device                                     key             options
//! data     UUID=2f5c9a0e-7d1b-4c61-9d0e-4f0f6b6a1a11  none            luks,discard,x-ucrypt-device=ublk
//! backup   /srv/backup.img                            /etc/keys/bk    luks,nofail
//! scratch  /dev/sdc                                   /dev/urandom    plain,cipher=aes-xts-plain64,size=512
//! ```
//!
//! [`Crypttab::parse`] reads the text into typed [`Entry`]s; every option is honoured or
//! refused by name ([`options`]), never ignored. What an entry means for `ucrypt open` is
//! read off the entry ([`Options`]) and becomes its `ucrypt open` command line
//! ([`Entry::open_command`]); [`systemd`] writes the units a generator makes of it.

mod device;
pub mod open;
pub mod options;
pub mod systemd;
mod words;

pub use device::DeviceSpec;
pub use open::OpenCommand;
pub use options::{Frontend, Options, TokenDevice, TokenOptions};

use std::path::{Path, PathBuf};

/// The default file (`/etc/crypttab` is systemd-cryptsetup's).
pub const DEFAULT_PATH: &str = "/etc/ucrypttab";

/// What can go wrong reading a crypttab or resolving what it names.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line that is not a valid entry.
    #[error("{path}:{line}: {message}")]
    Line {
        /// The file.
        path: PathBuf,
        /// The line number (from 1).
        line: usize,
        /// What is wrong, naming the field or option.
        message: String,
    },
    /// A name asked for that no line has.
    #[error("{path} has no entry {name}")]
    NoEntry {
        /// The file.
        path: PathBuf,
        /// The name.
        name: String,
    },
    /// A device named by a tag that no device carries (now).
    #[error("no device with {0} (neither /dev/disk/by-* nor blkid finds it)")]
    NoDevice(String),
}

impl From<Error> for crate::Error {
    fn from(e: Error) -> Self {
        let kind = match e {
            Error::Read { .. } | Error::NoDevice(_) => crate::ErrorKind::Device,
            Error::Line { .. } | Error::NoEntry { .. } => crate::ErrorKind::Invalid,
        };
        crate::Error::Invalid(e.to_string()).with_kind(kind)
    }
}

/// The key field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// `none`, `-` or no field: asked for (or a token).
    None,
    /// A key file (`/dev/urandom` included: plain mode reads its raw key there).
    File(PathBuf),
    /// `FILE:DEVICE`: the key file is FILE on the file system of DEVICE, mounted read-only
    /// while the key is read.
    FileOnDevice {
        /// The file, relative to that file system's root.
        file: PathBuf,
        /// The device holding it.
        device: DeviceSpec,
    },
}

impl Key {
    fn parse(text: &str) -> Result<Key, String> {
        match text {
            "" | "-" | "none" => Ok(Key::None),
            _ => match text.split_once(':') {
                Some((file, dev)) => {
                    if file.is_empty() {
                        return Err(format!("key {text}: no file before the ':'"));
                    }
                    let device = DeviceSpec::parse(dev).map_err(|e| format!("key {text}: {e}"))?;
                    Ok(Key::FileOnDevice {
                        file: PathBuf::from(file),
                        device,
                    })
                }
                None => Ok(Key::File(PathBuf::from(text))),
            },
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::None => write!(f, "none"),
            Key::File(p) => write!(f, "{}", p.display()),
            Key::FileOnDevice { file, device } => write!(f, "{}:{device}", file.display()),
        }
    }
}

/// One line of a crypttab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The instance name (`ucrypt status NAME`, `ucrypt close NAME`).
    pub name: String,
    /// The device holding the volume.
    pub device: DeviceSpec,
    /// Where the key comes from.
    pub key: Key,
    /// The options, typed.
    pub options: Options,
    /// The options field as written (for `ls`).
    pub options_text: String,
    /// The line number in its file (from 1).
    pub line: usize,
}

/// A crypttab file's entries, in file order.
#[derive(Debug, Clone)]
pub struct Crypttab {
    /// The file read.
    pub path: PathBuf,
    /// Its entries.
    pub entries: Vec<Entry>,
}

impl Crypttab {
    /// Reads and parses `path`.
    ///
    /// # Errors
    /// The file cannot be read ([`Error::Read`]), or its first invalid line.
    pub fn read(path: &Path) -> Result<Crypttab, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Crypttab::parse(path, &text)
    }

    /// Parses `text` (read from `path`, which errors name). Every line is checked; the
    /// first bad one is the error, so nothing of a half-valid file is opened.
    ///
    /// # Errors
    /// [`Error::Line`]: a missing or extra field, a bad name, an option refused or
    /// unknown, the same name twice.
    pub fn parse(path: &Path, text: &str) -> Result<Crypttab, Error> {
        let (tab, mut errors) = Crypttab::parse_each(path, text);
        if errors.is_empty() {
            Ok(tab)
        } else {
            Err(errors.remove(0))
        }
    }

    /// Parses `text` line by line, keeping the valid entries and every bad line's error
    /// (a generator at boot: one bad line must not keep the other volumes from opening,
    /// as systemd-cryptsetup-generator skips a bad line).
    pub fn parse_each(path: &Path, text: &str) -> (Crypttab, Vec<Error>) {
        let mut entries: Vec<Entry> = Vec::new();
        let mut errors = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |message: String| Error::Line {
                path: path.to_path_buf(),
                line,
                message,
            };
            let trimmed = raw.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let entry = match parse_line(trimmed, line) {
                Ok(e) => e,
                Err(m) => {
                    errors.push(err(m));
                    continue;
                }
            };
            if let Some(first) = entries.iter().find(|e| e.name == entry.name) {
                errors.push(err(format!(
                    "name {} is used again (first on line {})",
                    entry.name, first.line
                )));
                continue;
            }
            entries.push(entry);
        }
        let tab = Crypttab {
            path: path.to_path_buf(),
            entries,
        };
        (tab, errors)
    }

    /// The entries `names` name, in the order given; with no names, every entry without
    /// `noauto` (what boot opens).
    ///
    /// # Errors
    /// [`Error::NoEntry`] for a name no line has.
    pub fn select(&self, names: &[String]) -> Result<Vec<&Entry>, Error> {
        if names.is_empty() {
            return Ok(self.entries.iter().filter(|e| !e.options.noauto).collect());
        }
        names
            .iter()
            .map(|n| {
                self.entries
                    .iter()
                    .find(|e| &e.name == n)
                    .ok_or_else(|| Error::NoEntry {
                        path: self.path.clone(),
                        name: n.clone(),
                    })
            })
            .collect()
    }
}

/// One non-comment line.
fn parse_line(line: &str, number: usize) -> Result<Entry, String> {
    let fields = words::fields(line)?;
    if fields.len() < 2 {
        return Err("a line needs at least a name and a device".into());
    }
    if fields.len() > 4 {
        return Err(format!(
            "too many fields ({}): name, device, key, options (quote a field with spaces)",
            fields.len()
        ));
    }
    let name = fields[0].clone();
    crate::instance::runtime::check_name(&name).map_err(|e| format!("name {name:?}: {e}"))?;
    let device = DeviceSpec::parse(&fields[1])?;
    let key = Key::parse(fields.get(2).map_or("", String::as_str))?;
    let options_text = fields.get(3).cloned().unwrap_or_default();
    let options = options::parse(&words::options(&options_text))?;
    if let (Key::None, true) = (
        &key,
        options.keyfile_offset != 0 || options.keyfile_size != 0,
    ) {
        return Err("keyfile-offset=/keyfile-size= need a key file in the third field".into());
    }
    if options.headless && key == Key::None && options.kind == Some(crate::VolumeType::Plain) {
        return Err(
            "headless plain volume without a key file: nothing could open it (plain volumes \
             have no tokens)"
                .into(),
        );
    }
    Ok(Entry {
        name,
        device,
        key,
        options,
        options_text,
        line: number,
    })
}

#[cfg(test)]
mod tests;
