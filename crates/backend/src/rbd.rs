//! [`RbdBackend`]: ciphertext in a Ceph RBD image, through librbd. A table line (or any
//! command that takes a device) names it `rbd:POOL/IMAGE`, optionally followed by
//! QEMU-style `:conf=PATH`, `:id=NAME` and `:keyring=PATH`; what is not given there comes
//! from [`set_defaults`] (the CLI's `--ceph-conf`, `--ceph-id`, `--keyring`) and then from
//! librados' own search (`$CEPH_CONF`, `/etc/ceph/ceph.conf`, `$CEPH_ARGS`).
//!
//! ```text
//!  Volume ──► RbdBackend ──► rbd_aio_read / rbd_aio_write / rbd_aio_flush / rbd_aio_discard
//!                             (one completion per request; every caller thread has its own
//!                              request in flight, a batch of writes is all in flight at once)
//! ```
//!
//! ## Why librbd is loaded at run time (dlopen), with hand-written declarations
//! The crates that wrap librbd (`librbd-sys` 0.1, `ceph-rbd` 0.2, `ceph-rust`) are
//! unmaintained or generate bindings with bindgen from the Ceph headers at build time;
//! ucrypt needs 22 functions. They are declared here by hand from
//! `rbd/librbd.h` and `rados/librados.h` of Ceph 16 (stable C ABI since Ceph 0.x for every
//! function used) and resolved with `libloading` from `librbd.so.1` / `librados.so.2` when
//! the first `rbd:` device is opened. So building ucrypt needs no Ceph packages, a binary
//! without the libraries installed runs everything else, and an `rbd:` device on such a
//! machine fails with a message naming the missing library.
//!
//! ## Exclusive access
//! A read-write open takes librbd's exclusive lock in managed mode
//! (`rbd_lock_acquire(RBD_LOCK_MODE_EXCLUSIVE)`): while this process holds it, librbd does
//! not hand the lock over to another client that asks for it, so a second writer (another
//! ucrypt, `rbd map`, QEMU) cannot write and a second ucrypt open fails with `EBUSY`
//! ([`BackendError::Open`]). A lock left by a process that died is broken by the next
//! client once the dead client's watch has expired (`osd_client_watch_timeout`, 30 s by
//! default). Read-only opens (`rbd_open_read_only`) take no lock and cannot write.
//!
//! ## Durability: librbd's cache modes
//! A write's completion means what librbd's cache makes it mean; ucrypt sets none of its
//! options (a `ceph.conf` or `$CEPH_ARGS` does). With librbd's defaults (Ceph 16:
//! `rbd_cache = true`, `rbd_cache_policy = writearound`,
//! `rbd_cache_writethrough_until_flush = true`) an image handle starts in writethrough (a
//! write completes when the OSD has it) and switches to write-around at its first flush:
//! a write then completes as soon as it is sent (at most `rbd_cache_max_dirty`, 24 MiB,
//! in flight), reads and writes overlapping it wait for it, a flush waits for all of them,
//! and a write that fails makes the next flush fail. So the guarantees ucrypt gives its
//! clients hold in both modes: a flush (`rbd_aio_flush`) covers every completed write on
//! this image handle, a FUA write is a write followed by that flush, and a read never
//! sees a sector older than a completed write. With `rbd_cache = false` every write
//! completes only when the OSD has it. A named instance whose device outlives its server
//! (ublk, kernel NBD: `open --recover`) forces that write-through mode
//! ([`set_writethrough`]): there a completed write must already be on an OSD, since the
//! kernel goes on with the recovered device as if nothing had happened. (The mode decides 4 KiB write rates:
//! BENCHMARKING.md, "Ceph RBD".)

use crate::{
    check_range, emulate, AsyncDone, AsyncIo, AsyncOp, Backend, BackendError, BackendInfo, Caps,
    Hints, Io, IoKind, Support, WriteOp,
};
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// The prefix that names an RBD device.
pub const PREFIX: &str = "rbd:";

/// How to reach the cluster, where the device string does not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RbdDefaults {
    /// `ceph.conf` to read (librados' search path when `None`).
    pub conf: Option<PathBuf>,
    /// Client id without `client.` (`admin` when `None`), like `rbd --id`.
    pub id: Option<String>,
    /// Keyring file (from the configuration when `None`).
    pub keyring: Option<PathBuf>,
}

static DEFAULTS: Mutex<Option<RbdDefaults>> = Mutex::new(None);

/// Sets the cluster options every later `rbd:` open uses unless its device string names
/// its own (the command line's `--ceph-conf`, `--ceph-id`, `--keyring`).
pub fn set_defaults(d: RbdDefaults) {
    *DEFAULTS.lock().unwrap_or_else(|p| p.into_inner()) = Some(d);
}

fn defaults() -> RbdDefaults {
    DEFAULTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default()
}

/// A parsed `rbd:POOL/IMAGE[:conf=PATH][:id=NAME][:keyring=PATH]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    /// Pool name.
    pub pool: String,
    /// Image name.
    pub image: String,
    /// Options given in the device string (override [`set_defaults`]).
    pub opts: RbdDefaults,
}

impl RbdSpec {
    /// Parses a device string.
    ///
    /// # Errors
    /// [`BackendError::Other`] naming what is wrong (no `rbd:`, no pool or image, an
    /// unknown option).
    pub fn parse(device: &str) -> Result<RbdSpec, BackendError> {
        let bad = |why: &str| {
            BackendError::Other(format!(
                "RBD device {device:?}: {why} (expected rbd:POOL/IMAGE[:conf=PATH][:id=NAME][:keyring=PATH])"
            ))
        };
        let rest = device
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("does not start with rbd:"))?;
        let mut parts = rest.split(':');
        let name = parts.next().unwrap_or("");
        let (pool, image) = name
            .split_once('/')
            .ok_or_else(|| bad("no pool: name it as POOL/IMAGE"))?;
        if pool.is_empty() || image.is_empty() {
            return Err(bad("empty pool or image name"));
        }
        if image.contains('/') || image.contains('@') {
            return Err(bad(
                "namespaces and snapshots (POOL/NS/IMAGE, IMAGE@SNAP) are not supported",
            ));
        }
        let mut opts = RbdDefaults::default();
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| bad(&format!("option {p:?} is not KEY=VALUE")))?;
            if v.is_empty() {
                return Err(bad(&format!("option {k} has an empty value")));
            }
            match k {
                "conf" => opts.conf = Some(v.into()),
                "id" => opts.id = Some(v.to_string()),
                "keyring" => opts.keyring = Some(v.into()),
                _ => return Err(bad(&format!("unknown option {k:?} (conf, id, keyring)"))),
            }
        }
        if pool.contains('\0') || image.contains('\0') {
            return Err(bad("NUL in a name"));
        }
        Ok(RbdSpec {
            pool: pool.to_string(),
            image: image.to_string(),
            opts,
        })
    }
}

// ---- the C API (librados.h / librbd.h of Ceph 16), declared by hand -------------------

type RadosT = *mut c_void;
type IoctxT = *mut c_void;
type ImageT = *mut c_void;
type CompletionT = *mut c_void;
type Callback = Option<unsafe extern "C" fn(CompletionT, *mut c_void)>;

/// `rbd_image_info_t` (librbd.h; the three last fields are deprecated but still there).
#[repr(C)]
struct ImageInfo {
    size: u64,
    obj_size: u64,
    num_objs: u64,
    order: c_int,
    block_name_prefix: [c_char; 24],
    parent_pool: i64,
    parent_name: [c_char; 96],
}

/// `RBD_LOCK_MODE_EXCLUSIVE`.
const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

struct Api {
    rados_create: unsafe extern "C" fn(*mut RadosT, *const c_char) -> c_int,
    rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    rados_conf_parse_env: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
    rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
    rados_shutdown: unsafe extern "C" fn(RadosT),
    rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int,
    rados_ioctx_destroy: unsafe extern "C" fn(IoctxT),
    rbd_open: unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    rbd_open_read_only:
        unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    rbd_close: unsafe extern "C" fn(ImageT) -> c_int,
    rbd_stat: unsafe extern "C" fn(ImageT, *mut ImageInfo, usize) -> c_int,
    rbd_lock_acquire: unsafe extern "C" fn(ImageT, c_int) -> c_int,
    rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, Callback, *mut CompletionT) -> c_int,
    rbd_aio_wait_for_complete: unsafe extern "C" fn(CompletionT) -> c_int,
    rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    rbd_aio_release: unsafe extern "C" fn(CompletionT),
    rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
    rbd_aio_write: unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int,
    rbd_aio_flush: unsafe extern "C" fn(ImageT, CompletionT) -> c_int,
    rbd_aio_discard: unsafe extern "C" fn(ImageT, u64, u64, CompletionT) -> c_int,
    rbd_aio_write_zeroes:
        unsafe extern "C" fn(ImageT, u64, usize, CompletionT, c_int, c_int) -> c_int,
    // The libraries stay loaded for the life of the process (the pointers above point
    // into them).
    _rados: libloading::Library,
    _rbd: libloading::Library,
}

fn load() -> Result<Api, String> {
    // SAFETY: loading Ceph's client libraries runs their initialisers, which only set up
    // their own state.
    let rados = unsafe { libloading::Library::new("librados.so.2") }
        .map_err(|e| format!("cannot load librados.so.2 ({e}); install librados2/librbd1"))?;
    // SAFETY: as above.
    let rbd = unsafe { libloading::Library::new("librbd.so.1") }
        .map_err(|e| format!("cannot load librbd.so.1 ({e}); install librbd1"))?;
    macro_rules! sym {
        ($lib:expr, $name:literal) => {
            // SAFETY: the symbol is declared in the field's type exactly as in the Ceph
            // 16 headers; the library outlives the pointer (kept in `Api`).
            *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{} lacks {}: {e}", stringify!($lib), $name))?
        };
    }
    Ok(Api {
        rados_create: sym!(rados, "rados_create"),
        rados_conf_read_file: sym!(rados, "rados_conf_read_file"),
        rados_conf_parse_env: sym!(rados, "rados_conf_parse_env"),
        rados_conf_set: sym!(rados, "rados_conf_set"),
        rados_connect: sym!(rados, "rados_connect"),
        rados_shutdown: sym!(rados, "rados_shutdown"),
        rados_ioctx_create: sym!(rados, "rados_ioctx_create"),
        rados_ioctx_destroy: sym!(rados, "rados_ioctx_destroy"),
        rbd_open: sym!(rbd, "rbd_open"),
        rbd_open_read_only: sym!(rbd, "rbd_open_read_only"),
        rbd_close: sym!(rbd, "rbd_close"),
        rbd_stat: sym!(rbd, "rbd_stat"),
        rbd_lock_acquire: sym!(rbd, "rbd_lock_acquire"),
        rbd_aio_create_completion: sym!(rbd, "rbd_aio_create_completion"),
        rbd_aio_wait_for_complete: sym!(rbd, "rbd_aio_wait_for_complete"),
        rbd_aio_get_return_value: sym!(rbd, "rbd_aio_get_return_value"),
        rbd_aio_release: sym!(rbd, "rbd_aio_release"),
        rbd_aio_read: sym!(rbd, "rbd_aio_read"),
        rbd_aio_write: sym!(rbd, "rbd_aio_write"),
        rbd_aio_flush: sym!(rbd, "rbd_aio_flush"),
        rbd_aio_discard: sym!(rbd, "rbd_aio_discard"),
        rbd_aio_write_zeroes: sym!(rbd, "rbd_aio_write_zeroes"),
        _rados: rados,
        _rbd: rbd,
    })
}

fn api() -> Result<&'static Api, BackendError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| BackendError::Other(format!("rbd: devices need Ceph's client libraries: {e}")))
}

/// A Ceph RBD image as a [`Backend`]. See the module docs.
pub struct RbdBackend {
    api: &'static Api,
    cluster: RadosT,
    ioctx: IoctxT,
    image: ImageT,
    name: PathBuf,
    info: BackendInfo,
}

// SAFETY: librbd image handles, io contexts and cluster handles may be used from any
// thread, concurrently (librbd serialises internally; aio is its designed use); the
// handles are only closed in `Drop`, with `&mut self`.
unsafe impl Send for RbdBackend {}
// SAFETY: as above.
unsafe impl Sync for RbdBackend {}

/// How to open an image.
#[derive(Debug, Clone, Copy, Default)]
pub struct RbdOptions {
    /// `rbd_open_read_only`: no lock, no writes.
    pub read_only: bool,
    /// librbd's cache in write-through whatever the configuration says (see
    /// [`set_writethrough`]): a write completes only once an OSD has it.
    pub writethrough: bool,
}

static WRITETHROUGH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every later `rbd:` open of this process write-through (as
/// [`RbdOptions::writethrough`]). A server whose device outlives it (a ublk or kernel-NBD
/// instance, which `open --recover` gives to a new server) must not acknowledge a write
/// that lives only in its own memory: with librbd's write-around or write-back cache the
/// kernel would keep believing a write that died with the process, and no journal replay
/// follows a recovery.
pub fn set_writethrough(on: bool) {
    WRITETHROUGH.store(on, std::sync::atomic::Ordering::SeqCst);
}

fn os(ret: i64) -> std::io::Error {
    std::io::Error::from_raw_os_error(ret.unsigned_abs().min(i32::MAX as u64) as i32)
}

fn cstr(s: &str, what: &str) -> Result<CString, BackendError> {
    CString::new(s).map_err(|_| BackendError::Other(format!("{what} contains a NUL byte")))
}

impl RbdBackend {
    /// Connects to the cluster and opens `device` (`rbd:POOL/IMAGE...`); a read-write open
    /// takes the image's exclusive lock.
    ///
    /// # Errors
    /// A malformed device string, missing libraries, an unreachable cluster, a missing
    /// pool or image ([`BackendError::Open`] with the OS error), an image locked by another
    /// client (`EBUSY`), or one without the exclusive-lock feature for a read-write open.
    pub fn open(device: &str, opts: RbdOptions) -> Result<RbdBackend, BackendError> {
        let spec = RbdSpec::parse(device)?;
        let api = api()?;
        let d = defaults();
        let conf = spec.opts.conf.clone().or(d.conf);
        let id = spec.opts.id.clone().or(d.id);
        let keyring = spec.opts.keyring.clone().or(d.keyring);
        let name = PathBuf::from(device);
        let open_err = |what: &str, ret: c_int| BackendError::Open {
            path: name.clone(),
            source: std::io::Error::new(
                os(ret.into()).kind(),
                format!("{what}: {}", os(ret.into())),
            ),
        };
        let mut b = RbdBackend {
            api,
            cluster: std::ptr::null_mut(),
            ioctx: std::ptr::null_mut(),
            image: std::ptr::null_mut(),
            name: name.clone(),
            info: BackendInfo {
                size_bytes: 0,
                logical_block: 512,
                physical_block: 4096,
                optimal_block: 4 << 20,
                caps: Caps {
                    flush: Support::Native,
                    discard: Support::Native,
                    write_zeroes: Support::Native,
                    read_only: opts.read_only,
                },
            },
        };
        let id_c = id.as_deref().map(|s| cstr(s, "--ceph-id")).transpose()?;
        // SAFETY: a valid out-pointer and a NUL-terminated id (or NULL for "admin").
        let r = unsafe {
            (api.rados_create)(
                &mut b.cluster,
                id_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            b.cluster = std::ptr::null_mut();
            return Err(open_err("rados_create", r));
        }
        let set = |b: &RbdBackend, k: &str, v: &str| -> Result<(), BackendError> {
            let (kc, vc) = (cstr(k, k)?, cstr(v, k)?);
            // SAFETY: a live, not yet connected cluster handle and NUL-terminated strings.
            let r = unsafe { (api.rados_conf_set)(b.cluster, kc.as_ptr(), vc.as_ptr()) };
            if r < 0 {
                return Err(open_err(&format!("setting {k}"), r));
            }
            Ok(())
        };
        // An unreachable cluster fails after 30 s instead of librados' 300 (a ceph.conf
        // that sets it wins: it is read next).
        set(&b, "client_mount_timeout", "30")?;
        let conf_c = conf
            .as_ref()
            .map(|p| cstr(&p.display().to_string(), "--ceph-conf"))
            .transpose()?;
        // SAFETY: a live cluster handle; a NUL-terminated path or NULL (search path).
        let r = unsafe {
            (api.rados_conf_read_file)(
                b.cluster,
                conf_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            let what = match &conf {
                Some(p) => format!("reading Ceph configuration {}", p.display()),
                None => "finding a Ceph configuration ($CEPH_CONF, /etc/ceph/ceph.conf; or give --ceph-conf)".to_string(),
            };
            return Err(open_err(&what, r));
        }
        // SAFETY: a live cluster handle; NULL means $CEPH_ARGS.
        let r = unsafe { (api.rados_conf_parse_env)(b.cluster, std::ptr::null()) };
        if r < 0 {
            return Err(open_err("parsing $CEPH_ARGS", r));
        }
        if let Some(k) = &keyring {
            set(&b, "keyring", &k.display().to_string())?;
        }
        if opts.writethrough || WRITETHROUGH.load(std::sync::atomic::Ordering::SeqCst) {
            // After ceph.conf and $CEPH_ARGS, which cannot turn it back. No cache at all:
            // a write completes when the OSD has it, whatever the cache policy would be.
            set(&b, "rbd_cache", "false")?;
        }
        // SAFETY: a configured cluster handle.
        let r = unsafe { (api.rados_connect)(b.cluster) };
        if r < 0 {
            return Err(open_err("connecting to the Ceph cluster", r));
        }
        let pool = cstr(&spec.pool, "the pool name")?;
        // SAFETY: a connected cluster, a NUL-terminated pool name, a valid out-pointer.
        let r = unsafe { (api.rados_ioctx_create)(b.cluster, pool.as_ptr(), &mut b.ioctx) };
        if r < 0 {
            b.ioctx = std::ptr::null_mut();
            return Err(open_err(&format!("pool {}", spec.pool), r));
        }
        let image = cstr(&spec.image, "the image name")?;
        // SAFETY: a live io context, a NUL-terminated name, a valid out-pointer, no snapshot.
        let r = unsafe {
            if opts.read_only {
                (api.rbd_open_read_only)(b.ioctx, image.as_ptr(), &mut b.image, std::ptr::null())
            } else {
                (api.rbd_open)(b.ioctx, image.as_ptr(), &mut b.image, std::ptr::null())
            }
        };
        if r < 0 {
            b.image = std::ptr::null_mut();
            return Err(open_err(&format!("image {}/{}", spec.pool, spec.image), r));
        }
        // SAFETY: an all-zero ImageInfo is a valid value of this plain C struct.
        let mut st: ImageInfo = unsafe { std::mem::zeroed() };
        // SAFETY: an open image and an out-struct of the size passed.
        let r = unsafe { (api.rbd_stat)(b.image, &mut st, std::mem::size_of::<ImageInfo>()) };
        if r < 0 {
            return Err(open_err("rbd_stat", r));
        }
        b.info.size_bytes = st.size;
        if st.obj_size.is_power_of_two() && st.obj_size <= u64::from(u32::MAX) {
            b.info.optimal_block = st.obj_size as u32;
        }
        if !opts.read_only {
            // SAFETY: an open image.
            let r = unsafe { (api.rbd_lock_acquire)(b.image, RBD_LOCK_MODE_EXCLUSIVE) };
            if r < 0 {
                let e = -r;
                return Err(if e == libc::EINVAL {
                    BackendError::Open {
                        path: name,
                        source: std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            "the image lacks the exclusive-lock feature, so a second writer \
                             could not be kept out (rbd feature enable POOL/IMAGE \
                             exclusive-lock), or open it read-only",
                        ),
                    }
                } else if e == libc::EROFS || e == libc::EBUSY || e == libc::EAGAIN {
                    BackendError::Open {
                        path: name,
                        source: std::io::Error::new(
                            std::io::ErrorKind::ResourceBusy,
                            format!(
                                "the image is in use: another client holds its exclusive \
                                 lock ({}; see rbd lock ls / rbd status)",
                                os(r.into())
                            ),
                        ),
                    }
                } else {
                    open_err("taking the exclusive lock", r)
                });
            }
        }
        Ok(b)
    }

    /// Runs one aio request: `submit` queues it on the completion it is given; waits for it.
    fn aio(
        &self,
        op: &'static str,
        offset: u64,
        submit: impl FnOnce(CompletionT) -> c_int,
    ) -> Result<i64, BackendError> {
        let c = self.start(op, offset, submit)?;
        self.finish(op, offset, c)
    }

    fn start(
        &self,
        op: &'static str,
        offset: u64,
        submit: impl FnOnce(CompletionT) -> c_int,
    ) -> Result<CompletionT, BackendError> {
        let mut c: CompletionT = std::ptr::null_mut();
        // SAFETY: no callback, no argument; a valid out-pointer.
        let r = unsafe { (self.api.rbd_aio_create_completion)(std::ptr::null_mut(), None, &mut c) };
        if r < 0 {
            return Err(self.io_err(op, offset, r.into()));
        }
        let r = submit(c);
        if r < 0 {
            // SAFETY: a completion librbd did not take (the submit failed).
            unsafe { (self.api.rbd_aio_release)(c) };
            return Err(self.io_err(op, offset, r.into()));
        }
        Ok(c)
    }

    fn finish(&self, op: &'static str, offset: u64, c: CompletionT) -> Result<i64, BackendError> {
        // SAFETY: a completion of a submitted request; released once, here.
        let ret = unsafe {
            (self.api.rbd_aio_wait_for_complete)(c);
            let ret = (self.api.rbd_aio_get_return_value)(c);
            (self.api.rbd_aio_release)(c);
            ret
        };
        if ret < 0 {
            return Err(self.io_err(op, offset, ret as i64));
        }
        Ok(ret as i64)
    }

    fn io_err(&self, op: &'static str, offset: u64, ret: i64) -> BackendError {
        BackendError::Io {
            op,
            offset,
            path: self.name.clone(),
            source: os(ret),
        }
    }

    fn check_writable(&self) -> Result<(), BackendError> {
        if self.info.caps.read_only {
            Err(BackendError::ReadOnly)
        } else {
            Ok(())
        }
    }

    fn write_start(&self, buf: &[u8], offset: u64) -> Result<CompletionT, BackendError> {
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        self.start("write", offset, |c| {
            // SAFETY: an open image; `buf` outlives the request (the caller waits for
            // the completion before returning).
            unsafe {
                (self.api.rbd_aio_write)(self.image, offset, buf.len(), buf.as_ptr().cast(), c)
            }
        })
    }

    fn write_finish(&self, c: CompletionT, len: usize, offset: u64) -> Result<(), BackendError> {
        let n = self.finish("write", offset, c)?;
        if n >= 0 && n as usize != len && n != 0 {
            return Err(BackendError::Other(format!(
                "short write to {} at {offset}: {n} of {len} bytes",
                self.name.display()
            )));
        }
        Ok(())
    }
}

impl RbdBackend {
    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BackendError> {
        check_range(offset, buf.len() as u64, self.info.size_bytes)?;
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len();
        let ptr = buf.as_mut_ptr();
        let n = self.aio("read", offset, |c| {
            // SAFETY: an open image; `buf` is borrowed mutably until the request completes
            // (aio waits for it).
            unsafe { (self.api.rbd_aio_read)(self.image, offset, len, ptr.cast(), c) }
        })?;
        if n as usize != len {
            return Err(BackendError::Other(format!(
                "short read from {} at {offset}: {n} of {len} bytes",
                self.name.display()
            )));
        }
        Ok(())
    }

    fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<(), BackendError> {
        self.check_writable()?;
        if buf.is_empty() {
            return Ok(());
        }
        let c = self.write_start(buf, offset)?;
        self.write_finish(c, buf.len(), offset)?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn discard_range(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check_writable()?;
        check_range(offset, len, self.info.size_bytes)?;
        self.aio("discard", offset, |c| {
            // SAFETY: an open image.
            unsafe { (self.api.rbd_aio_discard)(self.image, offset, len, c) }
        })
        .map(|_| ())
    }

    fn zero_range(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
        self.check_writable()?;
        check_range(offset, len, self.info.size_bytes)?;
        // librbd takes a size_t length; split to be safe on any target.
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(1 << 30);
            self.aio("write_zeroes", at, |c| {
                // SAFETY: an open image; no flags.
                unsafe { (self.api.rbd_aio_write_zeroes)(self.image, at, n as usize, c, 0, 0) }
            })?;
            at += n;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }
}

impl Backend for RbdBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        match io.kind {
            IoKind::Read(buf) => self.read(buf, io.offset),
            IoKind::Write(buf) => self.write(buf, io.offset, io.fua),
            IoKind::Discard(len) => self.discard_range(io.offset, len),
            IoKind::WriteZeroes(len) => self.zero_range(io.offset, len, io.fua),
            _ => emulate::fallback(self, io),
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        if self.info.caps.read_only {
            return Ok(());
        }
        self.aio("flush", 0, |c| {
            // SAFETY: an open image.
            unsafe { (self.api.rbd_aio_flush)(self.image, c) }
        })
        .map(|_| ())
    }

    /// Every write of the batch is queued before the first is waited for: a plug of
    /// writes is in flight at once (librbd sends them to the OSDs in parallel).
    fn submit_writes(&self, batch: &[WriteOp<'_>]) -> Result<(), BackendError> {
        self.check_writable()?;
        let mut pending = Vec::with_capacity(batch.len());
        let mut first_err = None;
        for w in batch {
            if w.buf.is_empty() {
                continue;
            }
            match self.write_start(w.buf, w.offset) {
                Ok(c) => pending.push((c, w.buf.len(), w.offset)),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        // Wait for everything queued, even after an error: the buffers are borrowed.
        for (c, len, off) in pending {
            if let Err(e) = self.write_finish(c, len, off) {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if batch.iter().any(|w| w.fua) {
            self.flush()?;
        }
        Ok(())
    }

    /// Reads and writes go to librbd as they are (`rbd_aio_read` / `rbd_aio_write`) and
    /// `io.done` runs in librbd's completion callback. Refused (for the synchronous path
    /// to report): empty, out-of-range, and writes to a read-only image.
    fn submit_async(self: std::sync::Arc<Self>, io: AsyncIo) -> Result<(), AsyncIo> {
        if io.len == 0
            || io.len > io.buf.len()
            || check_range(io.offset, io.len as u64, self.info.size_bytes).is_err()
            || (io.op == AsyncOp::Write && self.info.caps.read_only)
        {
            return Err(io);
        }
        self.submit_pending(io);
        Ok(())
    }

    fn hints(&self) -> Hints {
        Hints {
            async_submit: true,
            ..Hints::default()
        }
    }
}

/// An asynchronous request in librbd's hands: its completion's callback argument. Holds
/// no reference to the backend (see [`Backend::submit_async`]: a backend dropped on
/// librbd's callback thread would close the image from inside librbd).
struct Pending {
    api: &'static Api,
    op: AsyncOp,
    offset: u64,
    len: usize,
    buf: Vec<u8>,
    name: PathBuf,
    done: AsyncDone,
}

impl Pending {
    /// The request's outcome from librbd's return value.
    fn result(&self, ret: isize) -> Result<(), BackendError> {
        let op = match self.op {
            AsyncOp::Read => "read",
            AsyncOp::Write => "write",
        };
        if ret < 0 {
            return Err(BackendError::Io {
                op,
                offset: self.offset,
                path: self.name.clone(),
                source: os(ret as i64),
            });
        }
        // librbd returns the bytes read, and for writes the length (or 0).
        let n = ret as usize;
        if n != self.len && !(self.op == AsyncOp::Write && n == 0) {
            return Err(BackendError::Other(format!(
                "short {op} of {} at {}: {n} of {} bytes",
                self.name.display(),
                self.offset,
                self.len
            )));
        }
        Ok(())
    }
}

/// librbd's completion callback for [`RbdBackend::submit_async`]: takes the request back,
/// releases the completion and runs the caller's completion (on librbd's thread).
unsafe extern "C" fn async_complete(c: CompletionT, arg: *mut c_void) {
    // SAFETY: `arg` is the `Box<Pending>` leaked by `submit_async` for this completion,
    // which librbd calls back exactly once.
    let p = unsafe { Box::from_raw(arg.cast::<Pending>()) };
    // SAFETY: the completion of a finished request; released once, here (rbd-nbd and
    // QEMU release in the callback too).
    let ret = unsafe {
        let ret = (p.api.rbd_aio_get_return_value)(c);
        (p.api.rbd_aio_release)(c);
        ret
    };
    let result = p.result(ret);
    let Pending { buf, done, .. } = *p;
    // A panic must not unwind into librbd (C frames): it is reported and the request is
    // lost (its caller's own bookkeeping never learns it ended).
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(buf, result))).is_err() {
        eprintln!("ucrypt: an RBD completion panicked");
    }
}

impl RbdBackend {
    /// Submits `io` to librbd with [`async_complete`] as its callback; a failure to submit
    /// is reported through `io.done`.
    fn submit_pending(&self, io: AsyncIo) {
        let AsyncIo {
            op,
            offset,
            len,
            mut buf,
            done,
            ..
        } = io;
        let ptr = buf.as_mut_ptr();
        let p = Box::into_raw(Box::new(Pending {
            api: self.api,
            op,
            offset,
            len,
            buf,
            name: self.name.clone(),
            done,
        }));
        let fail = |r: c_int| {
            // SAFETY: librbd did not take the request: the box is still ours.
            let p = unsafe { Box::from_raw(p) };
            let result = p.result(r as isize);
            let Pending { buf, done, .. } = *p;
            done(buf, result);
        };
        let mut c: CompletionT = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the argument lives until the callback takes it.
        let r =
            unsafe { (self.api.rbd_aio_create_completion)(p.cast(), Some(async_complete), &mut c) };
        if r < 0 {
            return fail(r);
        }
        // SAFETY: an open image; the buffer (owned by the Pending, whose heap allocation
        // does not move) lives until the callback, which frees it after librbd is done.
        let r = unsafe {
            match op {
                AsyncOp::Read => (self.api.rbd_aio_read)(self.image, offset, len, ptr.cast(), c),
                AsyncOp::Write => {
                    (self.api.rbd_aio_write)(self.image, offset, len, ptr.cast_const().cast(), c)
                }
            }
        };
        if r < 0 {
            // SAFETY: a completion librbd did not take (the submit failed: librbd 16
            // reports errors through the completion, so this is only a guard).
            unsafe { (self.api.rbd_aio_release)(c) };
            fail(r);
        }
    }
}

impl Drop for RbdBackend {
    fn drop(&mut self) {
        // SAFETY: handles this value opened, closed once in reverse order; rbd_close
        // flushes and releases the exclusive lock.
        unsafe {
            if !self.image.is_null() {
                (self.api.rbd_close)(self.image);
            }
            if !self.ioctx.is_null() {
                (self.api.rados_ioctx_destroy)(self.ioctx);
            }
            if !self.cluster.is_null() {
                (self.api.rados_shutdown)(self.cluster);
            }
        }
    }
}

impl std::fmt::Debug for RbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdBackend")
            .field("device", &self.name)
            .field("info", &self.info)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_strings_parse_or_say_why_not() {
        let s = RbdSpec::parse("rbd:pool/img").unwrap();
        assert_eq!((s.pool.as_str(), s.image.as_str()), ("pool", "img"));
        assert_eq!(s.opts, RbdDefaults::default());
        let s = RbdSpec::parse("rbd:p/i:conf=/etc/c.conf:id=u:keyring=/k").unwrap();
        assert_eq!(
            s.opts.conf.as_deref(),
            Some(std::path::Path::new("/etc/c.conf"))
        );
        assert_eq!(s.opts.id.as_deref(), Some("u"));
        assert_eq!(s.opts.keyring.as_deref(), Some(std::path::Path::new("/k")));
        for (bad, why) in [
            ("rbd:img", "no pool"),
            ("rbd:/img", "empty"),
            ("rbd:p/", "empty"),
            ("rbd:p/ns/i", "namespaces"),
            ("rbd:p/i@s", "snapshots"),
            ("rbd:p/i:conf", "KEY=VALUE"),
            ("rbd:p/i:key=secret", "unknown option"),
            ("rbd:p/i:id=", "empty value"),
            ("/dev/x", "rbd:"),
        ] {
            let e = RbdSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
