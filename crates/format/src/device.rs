//! What a device string names. Wherever ucrypt takes a device (a table line's device field,
//! `open DEVICE`, `--header`), it takes a local path (a file or block device), a remote NBD
//! export, a Ceph RBD image or a memory device; the kind is decided here, once, from the
//! string's form, and carried as a [`Device`] from then on.
//!
//! ```text
//!  "disk.img", "/dev/sdb"                       Device::Local
//!  "nbd://HOST[:PORT]/EXPORT", "nbd+unix:///EXPORT?socket=PATH",
//!  "nbds://…", "nbds+unix://…"                  Device::Nbd
//!  "rbd:POOL/IMAGE[@SNAP][:conf=…]"             Device::Rbd
//!  "ram:SIZE"                                   Device::Ram
//! ```

use std::fmt;
use std::path::Path;

/// URI schemes of remote NBD exports (the NBD URI specification's, with TLS variants).
pub const NBD_SCHEMES: [&str; 4] = ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"];
/// The prefix of a Ceph RBD image, `rbd:POOL/IMAGE`.
pub const RBD_PREFIX: &str = "rbd:";
/// The prefix of ucrypt's memory device, `ram:SIZE` (`ram:64M`, `ram:1G`; sizes as
/// cryptsetup's size arguments, [`crate::size::parse_size`]).
pub const RAM_PREFIX: &str = "ram:";

/// Which kind of device a [`Device`] is, without its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A file or block device.
    Local,
    /// A remote NBD export.
    Nbd,
    /// A Ceph RBD image.
    Rbd,
    /// Memory.
    Ram,
}

impl DeviceKind {
    /// The kind `device` names.
    pub fn of(device: &str) -> DeviceKind {
        if device.starts_with(RAM_PREFIX) {
            DeviceKind::Ram
        } else if device.starts_with(RBD_PREFIX) {
            DeviceKind::Rbd
        } else if NBD_SCHEMES.iter().any(|s| device.starts_with(s)) {
            DeviceKind::Nbd
        } else {
            DeviceKind::Local
        }
    }

    /// The kind a path names (a path that is not UTF-8 is a local one).
    pub fn of_path(device: &Path) -> DeviceKind {
        device.to_str().map_or(DeviceKind::Local, DeviceKind::of)
    }

    /// Whether it is anything but a local path (no file to stat, lock or canonicalize).
    pub fn is_remote(self) -> bool {
        self != DeviceKind::Local
    }
}

/// A device as written, with its kind decided once. The text is kept as written: it is
/// what table lines print and what error messages name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Device {
    /// A file or block device path.
    Local(String),
    /// A remote NBD export's URI.
    Nbd(String),
    /// A Ceph RBD image (`rbd:POOL/IMAGE…`).
    Rbd(String),
    /// A memory device (`ram:SIZE`).
    Ram(String),
}

impl Device {
    /// The device `text` names.
    pub fn parse(text: &str) -> Device {
        let s = text.to_string();
        match DeviceKind::of(text) {
            DeviceKind::Local => Device::Local(s),
            DeviceKind::Nbd => Device::Nbd(s),
            DeviceKind::Rbd => Device::Rbd(s),
            DeviceKind::Ram => Device::Ram(s),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> DeviceKind {
        match self {
            Device::Local(_) => DeviceKind::Local,
            Device::Nbd(_) => DeviceKind::Nbd,
            Device::Rbd(_) => DeviceKind::Rbd,
            Device::Ram(_) => DeviceKind::Ram,
        }
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        match self {
            Device::Local(s) | Device::Nbd(s) | Device::Rbd(s) | Device::Ram(s) => s,
        }
    }

    /// The local path, `None` for a remote or memory device.
    pub fn local_path(&self) -> Option<&Path> {
        match self {
            Device::Local(p) => Some(Path::new(p)),
            _ => None,
        }
    }

    /// Whether it is anything but a local path.
    pub fn is_remote(&self) -> bool {
        self.kind().is_remote()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for Device {
    fn from(text: &str) -> Self {
        Device::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_is_told_apart_and_kept_as_written() {
        for (text, kind) in [
            ("disk.img", DeviceKind::Local),
            ("/dev/sdb", DeviceKind::Local),
            ("./rbd:x", DeviceKind::Local),
            ("/tmp/nbd", DeviceKind::Local),
            ("nbd://h:10809/e", DeviceKind::Nbd),
            ("nbd+unix:///e?socket=/s", DeviceKind::Nbd),
            ("nbds://h/", DeviceKind::Nbd),
            ("nbds+unix:///?socket=x", DeviceKind::Nbd),
            ("rbd:pool/img", DeviceKind::Rbd),
            ("ram:1G", DeviceKind::Ram),
        ] {
            let d = Device::parse(text);
            assert_eq!(d.kind(), kind, "{text}");
            assert_eq!(d.as_str(), text);
            assert_eq!(d.to_string(), text);
            assert_eq!(d.is_remote(), kind != DeviceKind::Local, "{text}");
            assert_eq!(d.local_path().is_some(), kind == DeviceKind::Local);
        }
    }
}
