//! The FUSE front end: the decrypted volume as one regular file, `DIR/NAME`.
//!
//! For users without root or without the `nbd`/`ublk` modules (what bdemount, luksdemount
//! and dislocker-fuse do): `losetup`, `mkfs`, `debugfs`, `fuse2fs` and `qemu-img` open the
//! file like any image. The kernel side is `/dev/fuse`; the mount goes through the `fuser`
//! crate (a pure-Rust implementation of the FUSE protocol that mounts with `mount(2)` as
//! root and through the setuid `fusermount3` helper otherwise).
//!
//! The file system holds exactly two inodes: the root directory (inode 1) and the file
//! (inode 2). Reads and writes go straight to the export (for a `Volume`: decrypted and
//! encrypted by the engine; requests smaller than a sector are read-modify-written there),
//! `fsync` flushes it, `fallocate` maps `PUNCH_HOLE` (with `allow_discards`; refused
//! otherwise) and `ZERO_RANGE` to write zeroes: a punched hole reads back as zeroes, as
//! fallocate(2) promises, never as the decryption of discarded ciphertext. The file's size
//! is the export's and cannot change through the file (truncate to another size fails with
//! `EPERM`); it follows the export when the instance is resized.
//! Open files are counted: [`Attachment::in_use`] is true while any is open (a loop device
//! holds its backing file open, so a mounted loop device counts).

use crate::{AttachOptions, Attachment, DeviceError, Export, FrontendKind};
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, SessionACL, WriteFlags,
};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use ucrypt_backend::{emulate, BackendError, IoCtx};

/// Inode of the mount's root directory (FUSE's fixed root).
const ROOT: INodeNo = INodeNo(1);
/// Inode of the volume file.
const FILE: INodeNo = INodeNo(2);
/// How long the kernel may cache attributes: short, so a resize shows up quickly.
const TTL: Duration = Duration::from_secs(1);
/// Kernel request threads (each with its own `/dev/fuse` clone).
const THREADS: usize = 4;

/// What the mounted file system shares with [`FuseAttachment`].
struct State {
    export: Export,
    name: String,
    read_only: bool,
    /// Open file handles on the volume file.
    open_files: AtomicUsize,
    uid: u32,
    gid: u32,
    created: SystemTime,
    logical_block: u32,
}

/// The `fuser` file system: a directory with one file.
struct VolumeFs(Arc<State>);

impl VolumeFs {
    fn attr(&self, ino: INodeNo) -> FileAttr {
        let s = &self.0;
        let (kind, perm, size, nlink) = if ino == ROOT {
            (FileType::Directory, 0o700, 0, 2)
        } else {
            let perm = if s.read_only { 0o400 } else { 0o600 };
            (FileType::RegularFile, perm, s.export.info().size_bytes, 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: s.created,
            mtime: s.created,
            ctime: s.created,
            crtime: s.created,
            kind,
            perm,
            nlink,
            uid: s.uid,
            gid: s.gid,
            rdev: 0,
            blksize: s.logical_block.max(512),
            flags: 0,
        }
    }

    /// The byte range `offset..offset+len` clipped to the volume (`None`: past its end).
    fn clip(&self, offset: u64, len: u64) -> Option<u64> {
        let size = self.0.export.info().size_bytes;
        (offset < size).then(|| len.min(size - offset))
    }
}

/// The errno a backend failure becomes.
fn errno(e: &BackendError) -> Errno {
    match e {
        BackendError::ReadOnly => Errno::EROFS,
        BackendError::OutOfRange { .. } => Errno::ENOSPC,
        BackendError::Unsupported(_) => Errno::EOPNOTSUPP,
        BackendError::Misaligned { .. } => Errno::EINVAL,
        _ => Errno::EIO,
    }
}

impl Filesystem for VolumeFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == OsStr::new(&self.0.name) {
            reply.entry(&TTL, &self.attr(FILE), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == ROOT || ino == FILE {
            reply.attr(&TTL, &self.attr(ino));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The volume's size, owner and mode are fixed; `O_TRUNC` opens of existing images
        // and tools that "truncate" to the current size keep working, anything else is
        // refused rather than silently ignored. Time updates are accepted and dropped.
        let current = self.0.export.info().size_bytes;
        if ino != FILE && ino != ROOT {
            return reply.error(Errno::ENOENT);
        }
        if size.is_some_and(|s| s != current) || mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.0.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        self.0.open_files.fetch_add(1, Ordering::SeqCst);
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if ino == FILE {
            // Saturating: a release without an open (cannot happen) must not wrap.
            let _ = self
                .0
                .open_files
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let Some(len) = self.clip(offset, u64::from(size)) else {
            return reply.data(&[]); // at or past the end: EOF
        };
        let mut buf = vec![0u8; len as usize];
        match self.0.export.read_at(&mut buf, offset) {
            Ok(()) => reply.data(&buf),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.0.read_only {
            return reply.error(Errno::EROFS);
        }
        // A block device does not grow: writes past the end fail like on one.
        match self.clip(offset, data.len() as u64) {
            Some(n) if n == data.len() as u64 => {}
            _ => return reply.error(Errno::ENOSPC),
        }
        let sync = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        match self.0.export.write_at(data, offset, sync) {
            Ok(()) => reply.written(u32::try_from(data.len()).unwrap_or(u32::MAX)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): nothing is cached here (writes reached the export before they were
        // answered), so there is nothing to push; durability is fsync's job.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.0.export.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.0.read_only {
            return reply.error(Errno::EROFS);
        }
        match self.clip(offset, length) {
            Some(n) if n == length => {}
            _ if mode & libc::FALLOC_FL_KEEP_SIZE != 0 => {}
            _ => return reply.error(Errno::ENOSPC),
        }
        let Some(len) = self.clip(offset, length) else {
            return reply.ok();
        };
        let result = if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
            // fallocate(2): after PUNCH_HOLE the range reads as zeroes, and the loop driver
            // sends a block device's write-zeroes this way. A discard of the ciphertext
            // would leave noise (the plaintext of whatever the device then holds) and skip
            // partial sectors, so the hole is encrypted zeroes, partial sectors
            // read-modify-written. Without allow_discards the request is refused instead
            // (as dm-crypt refuses discards): the kernel then writes the zeroes itself.
            emulate::punch_hole(&*self.0.export, offset, len, false, IoCtx::default())
        } else if mode & libc::FALLOC_FL_ZERO_RANGE != 0 {
            emulate::write_zeroes(&*self.0.export, offset, len, false, IoCtx::default())
        } else if mode & !libc::FALLOC_FL_KEEP_SIZE == 0 {
            Ok(()) // plain preallocation: every byte of a volume is allocated
        } else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (FILE, FileType::RegularFile, self.0.name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            // `add` returns true when the buffer is full.
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// The volume mounted as `DIR/NAME`.
pub struct FuseAttachment {
    state: Arc<State>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
    node: PathBuf,
    /// We created the mount point, so detaching removes it.
    created_dir: bool,
}

impl std::fmt::Debug for FuseAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseAttachment")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Whether FUSE can be used here: `/dev/fuse` opens read-write (as root, or for users the
/// device's mode allows; unprivileged mounts also need `fusermount3`).
pub fn available() -> Result<(), DeviceError> {
    let unavailable = |why: String| DeviceError::Unavailable {
        frontend: "fuse",
        why,
    };
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| unavailable(format!("/dev/fuse: {e}")))?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && which("fusermount3").is_none() && which("fusermount").is_none() {
        return Err(unavailable(
            "mounting as a user needs fusermount3 (package fuse3)".into(),
        ));
    }
    Ok(())
}

/// The first `name` on `$PATH`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Mounts a file system at `dir` (created if missing) holding one file, `dir/<opts.name>`,
/// the contents of `export`. Returns once the mount is up.
///
/// # Errors
/// [`DeviceError::Unavailable`] without `/dev/fuse`; [`DeviceError::Io`] when the mount
/// point cannot be created or the mount fails (for instance, `dir` is already a mount).
pub fn attach(
    export: Export,
    dir: &Path,
    opts: &AttachOptions,
) -> Result<Box<dyn Attachment>, DeviceError> {
    available()?;
    if opts.name.is_empty() || opts.name.contains('/') || opts.name == "." || opts.name == ".." {
        return Err(DeviceError::Unavailable {
            frontend: "fuse",
            why: format!("{:?} cannot be a file name", opts.name),
        });
    }
    let created_dir = !dir.exists();
    if created_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| DeviceError::io(format!("creating {}", dir.display()), e))?;
    }
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let state = Arc::new(State {
        logical_block: opts.logical_block,
        export,
        name: opts.name.clone(),
        read_only: opts.read_only,
        open_files: AtomicUsize::new(0),
        uid,
        gid,
        created: SystemTime::now(),
    });
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("ucrypt:{}", opts.name)),
        MountOption::Subtype("ucrypt".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
        if opts.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    config.acl = SessionACL::Owner;
    config.n_threads = Some(THREADS);
    config.clone_fd = true;
    let session = match fuser::spawn_mount(VolumeFs(Arc::clone(&state)), dir, &config) {
        Ok(s) => s,
        Err(e) => {
            if created_dir {
                let _ = std::fs::remove_dir(dir);
            }
            return Err(DeviceError::io(
                format!("mounting FUSE at {}", dir.display()),
                e,
            ));
        }
    };
    Ok(Box::new(FuseAttachment {
        node: dir.join(&opts.name),
        state,
        session: Some(session),
        mountpoint: dir.to_path_buf(),
        created_dir,
    }))
}

impl FuseAttachment {
    fn unmount(&mut self) -> Result<(), DeviceError> {
        if let Some(s) = self.session.take() {
            s.umount_and_join().map_err(|e| {
                DeviceError::io(format!("unmounting {}", self.mountpoint.display()), e)
            })?;
        }
        if self.created_dir {
            let _ = std::fs::remove_dir(&self.mountpoint);
            self.created_dir = false;
        }
        Ok(())
    }
}

impl Attachment for FuseAttachment {
    fn kind(&self) -> FrontendKind {
        FrontendKind::Fuse
    }

    fn node(&self) -> &Path {
        &self.node
    }

    fn in_use(&self) -> Result<bool, DeviceError> {
        Ok(self.state.open_files.load(Ordering::SeqCst) > 0)
    }

    fn detach(mut self: Box<Self>) -> Result<(), DeviceError> {
        let flushed = self.state.export.flush();
        if self.in_use()? {
            // Held open: the unmount below is lazy, and the session would wait for the
            // last user. Abort the connection first, as `umount -f` does: the users' I/O
            // fails from now on (the contract: detaching a busy device fails its users'
            // I/O), and the session ends at once.
            abort_connection(&self.mountpoint);
        }
        self.unmount()?;
        flushed.map_err(|e| {
            DeviceError::io("flushing the volume", std::io::Error::other(e.to_string()))
        })
    }

    fn can_resize(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// The size is read from the export at each `getattr`; the kernel's cached attributes
    /// (and pages: past a shrunk end they are stale) are dropped so that `stat` shows the
    /// new size at once, not after the attribute timeout.
    fn resize(&self, _size_bytes: u64) -> Result<(), DeviceError> {
        let Some(session) = &self.session else {
            return Ok(());
        };
        match session.notifier().inval_inode(FILE, 0, 0) {
            // The kernel has not looked the file up yet: nothing cached.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.map_err(|e| {
                DeviceError::io(
                    format!("telling the kernel the new size of {}", self.node.display()),
                    e,
                )
            }),
        }
    }
}

/// Aborts the FUSE connection mounted at `dir` through the FUSE control file system
/// (`/sys/fs/fuse/connections/N/abort`, writable by the mount's owner), falling back to
/// `umount2(MNT_FORCE)`, which aborts it too (root only).
fn abort_connection(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    if let Ok(md) = std::fs::metadata(dir) {
        let dev = md.dev();
        // FUSE mounts get anonymous devices (major 0): the connection is named by minor.
        if libc::major(dev) == 0 {
            let abort = format!("/sys/fs/fuse/connections/{}/abort", libc::minor(dev));
            if std::fs::write(abort, b"1").is_ok() {
                return;
            }
        }
    }
    if let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
        // SAFETY: `c` is a valid NUL-terminated path that umount2 only reads.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_FORCE) };
    }
}

impl Drop for FuseAttachment {
    fn drop(&mut self) {
        // Dropping without detach: FUSE has no recovery, so the node goes away.
        let _ = self.unmount();
    }
}
