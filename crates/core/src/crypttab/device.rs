//! The device field (and `header=`, and the device of a `file:device` key): a path, or a
//! tag that names a file system or partition, resolved as udev names them under
//! `/dev/disk/by-*/` and, if that link is missing, by asking `blkid`.

use super::Error;
use std::fmt;
use std::path::{Path, PathBuf};

/// A device as a crypttab line names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A path: a block device, or an image file.
    Path(PathBuf),
    /// `UUID=`: the file system or LUKS UUID (`/dev/disk/by-uuid/`).
    Uuid(String),
    /// `PARTUUID=`: the GPT/MBR partition UUID (`/dev/disk/by-partuuid/`).
    PartUuid(String),
    /// `LABEL=`: the file system or LUKS2 label (`/dev/disk/by-label/`).
    Label(String),
    /// `PARTLABEL=`: the GPT partition name (`/dev/disk/by-partlabel/`).
    PartLabel(String),
}

impl DeviceSpec {
    /// Reads a device field. `Err`: an empty tag value, or an empty field.
    pub fn parse(text: &str) -> Result<DeviceSpec, String> {
        let tagged = [
            ("UUID=", DeviceSpec::Uuid as fn(String) -> DeviceSpec),
            ("PARTUUID=", DeviceSpec::PartUuid),
            ("LABEL=", DeviceSpec::Label),
            ("PARTLABEL=", DeviceSpec::PartLabel),
        ];
        for (prefix, make) in tagged {
            if let Some(v) = text.strip_prefix(prefix) {
                if v.is_empty() {
                    return Err(format!("{prefix} names no device"));
                }
                return Ok(make(v.to_string()));
            }
        }
        if text.is_empty() {
            return Err("the device field is empty".into());
        }
        Ok(DeviceSpec::Path(PathBuf::from(text)))
    }

    /// The tag and value as blkid and udev name them (`None` for a path).
    fn tag(&self) -> Option<(&'static str, &'static str, &str)> {
        match self {
            DeviceSpec::Path(_) => None,
            DeviceSpec::Uuid(v) => Some(("UUID", "by-uuid", v)),
            DeviceSpec::PartUuid(v) => Some(("PARTUUID", "by-partuuid", v)),
            DeviceSpec::Label(v) => Some(("LABEL", "by-label", v)),
            DeviceSpec::PartLabel(v) => Some(("PARTLABEL", "by-partlabel", v)),
        }
    }

    /// The path the device will have: the path itself, or udev's `/dev/disk/by-*/` link
    /// (what systemd waits for at boot).
    pub fn node(&self) -> PathBuf {
        match (self, self.tag()) {
            (DeviceSpec::Path(p), _) => p.clone(),
            (_, Some((_, dir, value))) => Path::new("/dev/disk")
                .join(dir)
                .join(encode_devnode_name(value)),
            (_, None) => unreachable!("every tag has a directory"),
        }
    }

    /// Whether the device is a node under `/dev` (a unit then waits for its `.device`), not
    /// an image file on a file system (a unit then needs that file system mounted).
    pub fn is_dev_node(&self) -> bool {
        self.node().starts_with("/dev/")
    }

    /// The device to open now: the path, the `/dev/disk/by-*/` link if udev made it, else
    /// the device `blkid -l -o device -t TAG=VALUE` finds.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when neither finds it.
    pub fn resolve(&self) -> Result<PathBuf, Error> {
        let Some((tag, _, value)) = self.tag() else {
            return Ok(self.node());
        };
        let link = self.node();
        if let Ok(real) = std::fs::canonicalize(&link) {
            return Ok(real);
        }
        let found = std::process::Command::new("blkid")
            .args(["-l", "-o", "device", "-t"])
            .arg(format!("{tag}={value}"))
            .stderr(std::process::Stdio::null())
            .output();
        if let Ok(out) = found {
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(dev) = text.lines().next().filter(|l| !l.is_empty()) {
                return Ok(PathBuf::from(dev));
            }
        }
        Err(Error::NoDevice(self.to_string()))
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.tag()) {
            (DeviceSpec::Path(p), _) => write!(f, "{}", p.display()),
            (_, Some((tag, _, v))) => write!(f, "{tag}={v}"),
            (_, None) => unreachable!("every tag has a name"),
        }
    }
}

/// udev's encoding of a name in `/dev/disk/by-label/` and the like (`encode_devnode_name`):
/// bytes other than ASCII letters, digits and `#+-.:=@_` become `\xHH`; valid UTF-8
/// multi-byte characters stay.
pub(crate) fn encode_devnode_name(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || "#+-.:=@_".contains(c) || !c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\x{:02x}", c as u32));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_nodes() {
        let u = DeviceSpec::parse("UUID=0a1b-2c").unwrap();
        assert_eq!(u, DeviceSpec::Uuid("0a1b-2c".into()));
        assert_eq!(u.node(), Path::new("/dev/disk/by-uuid/0a1b-2c"));
        assert_eq!(u.to_string(), "UUID=0a1b-2c");
        let l = DeviceSpec::parse("LABEL=My Disk/1").unwrap();
        assert_eq!(l.node(), Path::new(r"/dev/disk/by-label/My\x20Disk\x2f1"));
        let p = DeviceSpec::parse("PARTUUID=abc").unwrap();
        assert_eq!(p.node(), Path::new("/dev/disk/by-partuuid/abc"));
        assert_eq!(
            DeviceSpec::parse("PARTLABEL=root").unwrap().node(),
            Path::new("/dev/disk/by-partlabel/root")
        );
        let f = DeviceSpec::parse("/srv/disk.img").unwrap();
        assert!(!f.is_dev_node());
        assert!(DeviceSpec::parse("/dev/sdb1").unwrap().is_dev_node());
        assert!(DeviceSpec::parse("UUID=").is_err());
        assert!(DeviceSpec::parse("").is_err());
    }

    #[test]
    fn an_unknown_tag_is_not_found() {
        let e = DeviceSpec::parse("UUID=ffffffff-0000-4000-8000-ucrypt-none")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.to_string().contains("UUID=ffffffff"), "{e}");
    }
}
