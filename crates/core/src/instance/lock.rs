//! Exclusive access to an image: what keeps a second read-write `open`, or a `luksFormat`,
//! off a volume that is being served.
//!
//! The locks are open-file-description byte-range locks (`F_OFD_SETLK`) on two bytes far
//! past any image's end, as QEMU locks its images: they belong to the open file (a forked
//! server keeps them, the kernel drops them when the last descriptor closes, however the
//! process died) and, unlike `flock`, they never meet libcryptsetup's own `flock` metadata
//! locks, so `cryptsetup luksDump` of an image in use still works. Only read locks are
//! taken (they need only a read-only descriptor); exclusion comes from testing for other
//! holders with `F_OFD_GETLK`:
//!
//! - byte [`ANY`]: read-locked by every mapping; a header-changing command or an exclusive
//!   mapping refuses when another holder has it.
//! - byte [`EXCL`]: read-locked by exclusive mappings; a `--shared` mapping refuses when
//!   another holder has it.
//!
//! Taking a byte and testing the other is two calls: two mappings starting at once could
//! each test before the other took its byte, and both win. So the pair runs under a
//! write lock on byte [`GATE`] of a second, read-write descriptor of the image (regular
//! files the caller may write; a block device is not opened for writing, which would make
//! udev probe it again on close). Without the gate, each takes its own bytes before it
//! tests the other's, so at most one of two racers can win, and a loser retries a few
//! times after a random pause, in case the other lost too.
//!
//! A kernel device (ublk, kernel NBD) that a dead instance left on the image holds it
//! too, although its server's locks died with it ([`runtime::dead_holder`]).
//!
//! Block devices are also opened with `O_EXCL` for exclusive mappings: the kernel then
//! refuses other exclusive openers (mounts, `cryptsetup open`, another `O_EXCL`), and we
//! refuse a device that is mounted or held.

use super::runtime;
use super::runtime::lock_byte;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The "some mapping holds it" byte (2^62: beyond any image, below `OFF_MAX`).
const ANY: i64 = 1 << 62;
/// The "an exclusive mapping holds it" byte.
const EXCL: i64 = ANY + 1;
/// The byte write-locked while a mapping takes its bytes and tests the others'.
const GATE: i64 = ANY + 2;
/// Tries of a mapping that lost a race without the gate.
const UNGATED_TRIES: u32 = 8;

/// Why an image could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another mapping or process has it.
    #[error("{path} is in use by {holder}")]
    InUse {
        /// The image.
        path: String,
        /// Who: "ucrypt open NAME, pid N", or a description.
        holder: String,
    },
    /// Opening or locking failed.
    #[error("locking {path}")]
    Io {
        /// The image.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// How a mapping holds its image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Alone (read-write mappings, and read-only ones without `--shared`).
    Exclusive,
    /// Together with other shared mappings (`--shared`).
    Shared,
}

/// Locks held on one image; dropped with the mapping.
#[derive(Debug)]
pub struct ImageLock {
    _file: File,
    _excl: Option<File>,
}

/// Whether a holder other than `f`'s open file description read-locks byte `at`.
fn others_hold(f: &File, at: i64) -> io::Result<bool> {
    let fl = lock_byte(f, at, libc::F_OFD_GETLK, libc::F_WRLCK)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// Whether `device` is a local path we can lock (remote `nbd://` devices are not).
fn local(device: &Path) -> bool {
    !crate::remote_header::is_remote(device)
}

fn open_for_lock(device: &Path) -> Result<File, LockError> {
    File::open(device).map_err(|source| LockError::Io {
        path: device.display().to_string(),
        source,
    })
}

/// The gate of `device` (see the module documentation), held while the returned file
/// lives; `None` when the image is not a regular file we may open for writing.
fn take_gate(device: &Path) -> Option<File> {
    let is_file = std::fs::metadata(device).is_ok_and(|m| m.file_type().is_file());
    if !is_file {
        return None;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(device)
        .ok()?;
    // Holders keep it for two fcntl calls: poll (F_OFD_SETLKW cannot time out).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match lock_byte(&f, GATE, libc::F_OFD_SETLK, libc::F_WRLCK) {
            Ok(_) => return Some(f),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {}
            Err(_) => return None,
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A pause of 5 to 40 ms, different in each racer (no random generator needed: the
/// clock's nanoseconds and the pid differ).
fn random_pause() {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mix = nanos ^ std::process::id().wrapping_mul(2_654_435_761);
    std::thread::sleep(std::time::Duration::from_millis(5 + u64::from(mix % 36)));
}

/// Takes the mapping locks on `device`. `None` for remote devices (their server decides).
///
/// # Errors
/// [`LockError::InUse`] naming the holder; I/O errors.
pub fn lock_image(device: &Path, mode: LockMode) -> Result<Option<ImageLock>, LockError> {
    lock_image_with(device, mode, Race::default())
}

/// How a test widens the race between taking our bytes and testing the others'.
#[derive(Clone, Copy, Default)]
struct Race {
    /// A pause between the two.
    pause: std::time::Duration,
    /// Do without the gate, as for an image we may not write.
    no_gate: bool,
}

fn lock_image_with(
    device: &Path,
    mode: LockMode,
    race: Race,
) -> Result<Option<ImageLock>, LockError> {
    if !local(device) {
        return Ok(None);
    }
    let io = |source| LockError::Io {
        path: device.display().to_string(),
        source,
    };
    let mut tries = 0;
    let file = loop {
        tries += 1;
        let file = open_for_lock(device)?;
        let gate = if race.no_gate {
            None
        } else {
            take_gate(device)
        };
        // Our bytes first, then the test: see the module documentation.
        lock_byte(&file, ANY, libc::F_OFD_SETLK, libc::F_RDLCK).map_err(io)?;
        if mode == LockMode::Exclusive {
            lock_byte(&file, EXCL, libc::F_OFD_SETLK, libc::F_RDLCK).map_err(io)?;
        }
        if !race.pause.is_zero() {
            std::thread::sleep(race.pause);
        }
        let conflict = match mode {
            LockMode::Exclusive => others_hold(&file, ANY).map_err(io)?,
            LockMode::Shared => others_hold(&file, EXCL).map_err(io)?,
        };
        let gated = gate.is_some();
        drop(gate);
        if !conflict {
            break file;
        }
        drop(file);
        if gated || tries >= UNGATED_TRIES {
            return Err(LockError::InUse {
                path: device.display().to_string(),
                holder: holder(device),
            });
        }
        random_pause();
    };
    // Its lock died with its server, but a kernel device a dead instance left still
    // serves the image: a second one would write beside the first one's held I/O.
    if let Some((name, debris)) = runtime::dead_holder(device) {
        let nodes: Vec<String> = debris
            .devices
            .iter()
            .map(|d| d.node.display().to_string())
            .collect();
        return Err(LockError::InUse {
            path: device.display().to_string(),
            holder: format!(
                "{}, left by instance {name} whose server died (`ucrypt open --recover {} \
                 {name}` serves it again, `ucrypt close {name}` removes it)",
                nodes.join(", "),
                debris.image_or_placeholder()
            ),
        });
    }
    let mut excl = None;
    if mode == LockMode::Exclusive {
        let md = file.metadata().map_err(io)?;
        if md.file_type().is_block_device() {
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_EXCL)
                .open(device)
            {
                Ok(f) => excl = Some(f),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    return Err(LockError::InUse {
                        path: device.display().to_string(),
                        holder: "the kernel (mounted, or held open exclusively)".into(),
                    })
                }
                Err(e) => return Err(io(e)),
            }
        }
    }
    Ok(Some(ImageLock {
        _file: file,
        _excl: excl,
    }))
}

/// For header-changing commands (`luksFormat`, keyslot commands, `luksHeaderRestore`,
/// `luksUUID --uuid`): refuses when any mapping holds `device`. The returned lock keeps
/// new mappings out until the command is done.
///
/// # Errors
/// [`LockError::InUse`]; I/O errors other than a missing device (the command itself
/// reports that).
pub fn lock_for_header_change(device: &Path) -> Result<Option<ImageLock>, LockError> {
    if !local(device) || !device.exists() {
        return Ok(None);
    }
    lock_image(device, LockMode::Exclusive).map(|l| {
        l.map(|mut l| {
            // The command must not keep an O_EXCL open: libcryptsetup opens the device
            // itself, and for a block device that open would then fail.
            l._excl = None;
            l
        })
    })
}

/// Who holds `device`: the first live instance serving it, or a description.
pub fn holder(device: &Path) -> String {
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let Some(target) = id(device) else {
        return "another process".into();
    };
    for (paths, pid) in runtime::list() {
        let Some(d) = paths.read_description() else {
            continue;
        };
        let same = id(&PathBuf::from(&d.device)) == Some(target)
            || d.header
                .as_deref()
                .is_some_and(|h| id(Path::new(h)) == Some(target));
        if same {
            return format!("ucrypt open {}, pid {pid}", paths.name);
        }
    }
    "another process (a ucrypt open of another user, or one still starting)".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_excludes_everything_and_shared_shares() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        std::fs::write(&img, vec![0u8; 4096]).unwrap();
        let a = lock_image(&img, LockMode::Exclusive).unwrap();
        assert!(matches!(
            lock_image(&img, LockMode::Exclusive),
            Err(LockError::InUse { .. })
        ));
        assert!(matches!(
            lock_image(&img, LockMode::Shared),
            Err(LockError::InUse { .. })
        ));
        assert!(lock_for_header_change(&img).is_err());
        drop(a);
        let s1 = lock_image(&img, LockMode::Shared).unwrap();
        let s2 = lock_image(&img, LockMode::Shared).unwrap();
        assert!(lock_image(&img, LockMode::Exclusive).is_err());
        assert!(lock_for_header_change(&img).is_err());
        drop((s1, s2));
        let h = lock_for_header_change(&img).unwrap();
        drop(h);
        lock_image(&img, LockMode::Exclusive).unwrap();
    }

    /// Racers started together by a barrier, each on its own descriptions (OFD locks do
    /// not care about processes), with a pause between taking their bytes and testing the
    /// others' to widen the race: an exclusive one never wins beside another mapping, and
    /// someone wins each round. With the gate (a writable image) and without it (own
    /// bytes first, then the test, retries).
    #[test]
    fn mappings_started_together_never_both_win() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        std::fs::write(&img, vec![0u8; 4096]).unwrap();
        let mut modes = [
            LockMode::Exclusive,
            LockMode::Shared,
            LockMode::Shared,
            LockMode::Exclusive,
        ];
        for no_gate in [false, true] {
            let race = Race {
                pause: std::time::Duration::from_millis(3),
                no_gate,
            };
            for round in 0..24 {
                // The last one to reach the barrier usually goes first: each kind in turn.
                modes.rotate_left(1);
                let barrier = std::sync::Barrier::new(modes.len());
                let won: Vec<(LockMode, Option<ImageLock>)> = std::thread::scope(|s| {
                    let racers: Vec<_> = modes
                        .iter()
                        .map(|&mode| {
                            let (barrier, img) = (&barrier, &img);
                            s.spawn(move || {
                                barrier.wait();
                                (mode, lock_image_with(img, mode, race).ok().flatten())
                            })
                        })
                        .collect();
                    racers.into_iter().map(|r| r.join().unwrap()).collect()
                });
                let winners: Vec<LockMode> = won
                    .iter()
                    .filter(|(_, l)| l.is_some())
                    .map(|(m, _)| *m)
                    .collect();
                let what = if no_gate { "no gate" } else { "gate" };
                assert!(!winners.is_empty(), "{what}, round {round}: nobody won");
                if winners.contains(&LockMode::Exclusive) {
                    assert_eq!(
                        winners,
                        [LockMode::Exclusive],
                        "{what}, round {round}: an exclusive mapping won beside another"
                    );
                }
            }
        }
    }
}
