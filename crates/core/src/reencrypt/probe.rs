//! What a device or header file already is, read without libcryptsetup: a LUKS magic, a
//! LUKS signature blkid would find, and the mode and data-shift resilience of a LUKS2
//! reencryption in progress. These decide which operation a `reencrypt` is and what it
//! refuses before anything is written.

use std::os::unix::fs::FileExt;
use std::path::Path;
use ucrypt_format::luks2::json::Json;
use ucrypt_format::luks2::reencrypt::Mode;

/// Whether `path` starts with a LUKS header (either version).
pub fn is_luks(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 6];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && (magic == *b"LUKS\xba\xbe" || magic == *b"SKUL\xba\xbe")
}

/// Whether blkid's LUKS probe (libblkid `superblocks/luks.c`) finds a signature on `path`:
/// the LUKS magic at 0, or a LUKS2 secondary header's magic (`SKUL\xba\xbe`, version 2) at
/// one of the offsets a LUKS2 header may have its second copy at. Hand-written: the probe
/// is a few fixed reads, and libblkid's bindings are not in the workspace.
pub(crate) fn luks_signature(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let at = |o: u64| {
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, o).ok().map(|()| b)
    };
    if at(0).is_some_and(|b| b[..6] == *b"LUKS\xba\xbe") {
        return true;
    }
    (14..=22).any(|shift| {
        at(1 << shift).is_some_and(|b| b[..6] == *b"SKUL\xba\xbe" && b[6..8] == [0, 2])
    })
}

/// The `mode` of the header's reencrypt keyslot.
pub(crate) fn reencrypt_mode(json: &Json) -> Option<Mode> {
    json.get("keyslots")?
        .members()
        .iter()
        .find(|(_, k)| k.get("type").and_then(|t| t.as_str()) == Some("reencrypt"))
        .and_then(|(_, k)| k.get("mode")?.as_str().and_then(Mode::parse))
}

/// The resilience (`datashift`, `datashift-checksum`, `datashift-journal`) of the
/// reencryption in `header`'s metadata when it has a data shift.
pub(crate) fn header_shift_type(header: &Path) -> Option<String> {
    let f = std::fs::File::open(header).ok()?;
    let h = ucrypt_format::luks2::disk::Header::read(&f, "header").ok()?;
    let keyslots = h.json.get("keyslots")?;
    keyslots.members().iter().find_map(|(_, ks)| {
        ks.get("area")
            .and_then(|a| a.get("type"))
            .and_then(|t| t.as_str())
            .filter(|t| t.starts_with("datashift"))
            .map(str::to_string)
    })
}
