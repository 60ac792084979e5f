//! [`CryptDevice`]: a safe owner of one libcryptsetup `struct crypt_device`.
//!
//! Every call goes through [`CryptDevice::call`], which clears the captured library log,
//! runs the call and turns a negative errno into [`FormatError::Cryptsetup`] carrying the
//! library's own error lines (cryptsetup's wording). Secrets cross the boundary only as
//! borrowed slices; what comes back (volume keys) lands in [`VolumeKey`] or `Zeroizing`.

use crate::ffi;
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::Once;
use ucrypt_crypto::VolumeKey;
use ucrypt_format::luks2::ActivationFlags;
use ucrypt_format::{FormatError, HeaderType, VolumeInfo};
use zeroize::Zeroizing;

thread_local! {
    /// Messages libcryptsetup logged on this thread since the last [`take_log`]. The library
    /// logs through one global callback; keeping the buffer per thread keeps concurrent
    /// devices on different threads apart.
    static LOG: RefCell<Vec<(i32, String)>> = const { RefCell::new(Vec::new()) };
}

/// Whether [`set_debug`] turned the library's debug output on.
static DEBUG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The global log callback: stores error and normal lines; debug lines are printed on
/// stderr with cryptsetup's `# ` prefix when [`set_debug`] asked for them, dropped
/// otherwise (libcryptsetup never puts passphrases or keys in its debug lines).
///
/// # Safety
/// Called by libcryptsetup with a NUL-terminated `msg` (or NULL).
unsafe extern "C" fn log_cb(level: libc::c_int, msg: *const libc::c_char, _usr: *mut libc::c_void) {
    if msg.is_null() {
        return;
    }
    if level < 0 {
        if DEBUG.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: as below.
            let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
            eprintln!("# {}", text.trim_end_matches('\n'));
        }
        return;
    }
    // SAFETY: libcryptsetup passes a valid NUL-terminated string that lives for this call.
    let text = unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned();
    LOG.with(|l| l.borrow_mut().push((level, text)));
}

pub(crate) fn take_log() -> Vec<(i32, String)> {
    LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

/// The library's error lines, joined into one sentence list.
pub(crate) fn errors_of(log: &[(i32, String)]) -> String {
    log.iter()
        .filter(|(lvl, _)| *lvl == ffi::CRYPT_LOG_ERROR)
        .map(|(_, m)| m.trim().trim_end_matches('.').to_string())
        .filter(|m| !m.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

static INIT: Once = Once::new();

/// cryptsetup's `--debug` (`json` false) and `--debug-json`: libcryptsetup's debug lines
/// (and with `json` the LUKS2 JSON it reads) on stderr, each starting with `# `.
pub fn set_debug(json: bool) {
    global_init();
    DEBUG.store(true, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: a global setting; the log callback is installed by global_init.
    unsafe {
        ffi::crypt_set_debug_level(if json {
            ffi::CRYPT_DEBUG_JSON
        } else {
            ffi::CRYPT_DEBUG_ALL
        })
    };
}

/// cryptsetup's `--disable-external-tokens`: libcryptsetup loads no token plugins
/// (`crypt_token_external_disable`); tokens of types it does not know are then unusable.
pub fn disable_external_tokens() {
    EXTERNAL_TOKENS_DISABLED.store(true, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: a global setting, called before any token is read.
    unsafe { ffi::crypt_token_external_disable() };
}

/// Whether [`disable_external_tokens`] was called: token types handled outside
/// libcryptsetup (clevis) are then not tried either.
pub fn external_tokens_disabled() -> bool {
    EXTERNAL_TOKENS_DISABLED.load(std::sync::atomic::Ordering::Relaxed)
}

static EXTERNAL_TOKENS_DISABLED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// cryptsetup's `--disable-keyring`: libcryptsetup keeps volume keys out of the kernel
/// keyring (`crypt_volume_key_keyring(NULL, 0)`; ucrypt never hands keys to dm-crypt, so
/// this changes nothing it does, but the library is set as cryptsetup sets it).
pub fn disable_volume_key_keyring() {
    // SAFETY: a global setting (NULL device).
    unsafe { ffi::crypt_volume_key_keyring(ptr::null_mut(), 0) };
}

/// cryptsetup 2.7's `--external-tokens-path DIR`: where libcryptsetup loads token plugins
/// from (`crypt_token_set_external_path`, looked up at run time: libcryptsetup 2.6 has
/// no such call and loads plugins from its compiled-in directory only).
///
/// # Errors
/// The library is older than 2.7 (no such call), or it refused the path (not absolute).
pub fn set_external_tokens_path(dir: &Path) -> Result<(), FormatError> {
    type SetPath = unsafe extern "C" fn(*const libc::c_char) -> libc::c_int;
    global_init();
    // SAFETY: dlsym with RTLD_DEFAULT on a NUL-terminated name; libcryptsetup is linked in.
    let sym = unsafe {
        libc::dlsym(
            libc::RTLD_DEFAULT,
            c"crypt_token_set_external_path".as_ptr(),
        )
    };
    if sym.is_null() {
        return Err(FormatError::Rule(format!(
            "--external-tokens-path needs libcryptsetup 2.7 or later; this libcryptsetup loads \
             token plugins only from its compiled-in directory ({})",
            external_tokens_dir()
        )));
    }
    // SAFETY: the symbol is libcryptsetup 2.7's `int crypt_token_set_external_path(const char *)`.
    let set: SetPath = unsafe { std::mem::transmute::<*mut libc::c_void, SetPath>(sym) };
    let c = path_cstring(dir)?;
    take_log();
    // SAFETY: `c` is NUL-terminated and outlives the call (the library copies it).
    let r = unsafe { set(c.as_ptr()) };
    let log = take_log();
    if r < 0 {
        return Err(FormatError::Cryptsetup {
            op: format!("setting the external tokens path {}", dir.display()),
            device: String::new(),
            errno: -r,
            detail: errors_of(&log),
        });
    }
    Ok(())
}

/// Turns libcryptsetup's metadata locking off for the process (`crypt_metadata_locking(NULL,
/// 0)`), as cryptsetup's `--disable-locks`.
pub fn disable_metadata_locking() {
    global_init();
    // SAFETY: the device argument is unused by this global setting.
    unsafe { ffi::crypt_metadata_locking(ptr::null_mut(), 0) };
}

/// The directory libcryptsetup loads token plugins from (`crypt_token_external_path`).
pub fn external_tokens_dir() -> String {
    // SAFETY: returns NULL or a static string of the library.
    unsafe { opt_string(ffi::crypt_token_external_path()) }.unwrap_or_else(|| "none".into())
}

/// `CRYPT_ACTIVATE_ALLOW_UNBOUND_KEY`.
const ALLOW_UNBOUND_KEY: u32 = 1 << 16;

/// Installs the log callback and makes metadata locking work for an unprivileged or
/// container user: libcryptsetup locks in `/run/cryptsetup`; when that cannot be created,
/// locking is turned off (plain image files are not shared with udev or the kernel).
fn global_init() {
    INIT.call_once(|| {
        // SAFETY: setting the default (NULL device) log callback; `log_cb` has the
        // required signature and never unwinds.
        unsafe { ffi::crypt_set_log_callback(ptr::null_mut(), Some(log_cb), ptr::null_mut()) };
        if std::fs::create_dir_all("/run/cryptsetup").is_err() {
            // SAFETY: the device argument is unused by this global setting.
            unsafe { ffi::crypt_metadata_locking(ptr::null_mut(), 0) };
        }
        init_crypto_backend();
    });
}

/// Brings libcryptsetup's crypto backend up once, on one thread, before any device exists.
///
/// The library initialises its backend lazily behind an unsynchronised flag; with OpenSSL 3
/// it creates its library context first and loads the providers into it afterwards. Two
/// threads opening devices at once can therefore see the context before it has a provider,
/// and a call such as `crypt_set_pbkdf_type` fails with "Requested hash sha256 is not
/// supported" (seen in CI with parallel tests). No public call only initialises, so this
/// asks for a PBKDF benchmark of a type that does not exist: the library initialises its
/// backend first and then refuses the type at once, without benchmarking anything.
fn init_crypto_backend() {
    const NO_SUCH_KDF: &CStr = c"ucrypt-init-only";
    let mut params = ffi::crypt_pbkdf_type {
        type_: NO_SUCH_KDF.as_ptr(),
        hash: c"sha256".as_ptr(),
        time_ms: 1,
        iterations: 0,
        max_memory_kb: 0,
        parallel_threads: 0,
        flags: 0,
    };
    // SAFETY: a NULL device is allowed (the library uses its default context); `params` and
    // its strings outlive the call; no password (NULL, 0), no salt, no progress callback.
    let r = unsafe {
        ffi::crypt_benchmark_pbkdf(
            ptr::null_mut(),
            &mut params,
            ptr::null(),
            0,
            ptr::null(),
            0,
            32,
            None,
            ptr::null_mut(),
        )
    };
    // The refusal of the made-up type is the expected outcome; a failing backend shows up
    // again, with the library's own message, on the first real call.
    debug_assert!(r < 0);
    let _ = take_log();
}

fn cstring(what: &str, s: &str) -> Result<CString, FormatError> {
    CString::new(s).map_err(|_| FormatError::Rule(format!("{what} \"{s}\" contains a NUL byte")))
}

fn path_cstring(p: &Path) -> Result<CString, FormatError> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| FormatError::Rule(format!("path {} contains a NUL byte", p.display())))
}

/// Copies a C string the library returned (NULL → None).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that stays valid during this call.
unsafe fn opt_string(p: *const libc::c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: per this function's contract.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// libcryptsetup's C name of a header type (`CRYPT_LUKS2`...).
fn c_name(t: HeaderType) -> &'static CStr {
    match t {
        HeaderType::Luks1 => c"LUKS1",
        HeaderType::Luks2 => c"LUKS2",
        HeaderType::Plain => c"PLAIN",
        HeaderType::Tcrypt => c"TCRYPT",
        HeaderType::Bitlk => c"BITLK",
        HeaderType::Fvault2 => c"FVAULT2",
        HeaderType::Loopaes => c"LOOPAES",
    }
}

/// How many keyslots a header type has (`crypt_keyslot_max`: LUKS1 8, LUKS2 32, others 0).
pub fn keyslot_max(t: HeaderType) -> u32 {
    // SAFETY: a static NUL-terminated type name; the call only compares it.
    let n = unsafe { ffi::crypt_keyslot_max(c_name(t).as_ptr()) };
    u32::try_from(n).unwrap_or(0)
}

/// The persistent activation flag bits libcryptsetup reports (`CRYPT_ACTIVATE_*`) as the
/// format layer's [`ActivationFlags`].
pub fn activation_flags(act: u32) -> ActivationFlags {
    ActivationFlags {
        allow_discards: act & crate::ACTIVATE_ALLOW_DISCARDS != 0,
        same_cpu_crypt: act & crate::ACTIVATE_SAME_CPU_CRYPT != 0,
        submit_from_crypt_cpus: act & crate::ACTIVATE_SUBMIT_FROM_CRYPT_CPUS != 0,
        no_read_workqueue: act & crate::ACTIVATE_NO_READ_WORKQUEUE != 0,
        no_write_workqueue: act & crate::ACTIVATE_NO_WRITE_WORKQUEUE != 0,
    }
}

/// A PBKDF for new keyslots (`crypt_set_pbkdf_type`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pbkdf {
    /// `pbkdf2`, `argon2i` or `argon2id`.
    pub kind: String,
    /// Hash for PBKDF2 (and the LUKS2 digest); default sha256.
    pub hash: Option<String>,
    /// Fixed iteration count (time cost for Argon2): no benchmark.
    pub iterations: Option<u32>,
    /// Target unlock time in ms when benchmarking (default 2000).
    pub time_ms: Option<u32>,
    /// Argon2 memory cost in KiB (default 1048576).
    pub memory_kb: Option<u32>,
    /// Argon2 threads (default 4).
    pub parallel: Option<u32>,
}

/// What to give `crypt_format` for a new LUKS header.
#[derive(Debug, Clone, Default)]
pub struct LuksFormat {
    /// LUKS1 or LUKS2.
    pub luks2: bool,
    /// Cipher spec as cryptsetup takes it (`aes-xts-plain64`).
    pub cipher: String,
    /// Volume key size in bytes.
    pub key_bytes: usize,
    /// Header UUID (default: random).
    pub uuid: Option<String>,
    /// LUKS1 header hash / LUKS2 digest hash (default sha256).
    pub hash: Option<String>,
    /// Encryption sector size (LUKS2 only; None: libcryptsetup chooses).
    pub sector_size: Option<u32>,
    /// LUKS2 label.
    pub label: Option<String>,
    /// LUKS2 subsystem label.
    pub subsystem: Option<String>,
    /// Data device when the header is detached.
    pub data_device: Option<std::path::PathBuf>,
    /// Data alignment in 512-byte sectors (None: default).
    pub align_sectors: Option<u64>,
}

/// Keyslot state (`crypt_keyslot_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyslotStatus {
    /// No such slot.
    Invalid,
    /// Free.
    Inactive,
    /// In use.
    Active,
    /// In use, and the last one that opens the volume.
    ActiveLast,
    /// In use, but holds a key not bound to the data segment (LUKS2).
    Unbound,
}

/// LUKS2 token state (`crypt_token_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenStatus {
    /// No such token id (out of range, or not LUKS2).
    Invalid,
    /// Free.
    Inactive,
    /// In use, of a type libcryptsetup handles itself (`luks2-keyring`).
    Internal,
    /// In use, of a reserved (`luks2-` prefixed) type libcryptsetup has no handler for.
    InternalUnknown,
    /// In use, of a user type with a loaded plugin.
    External,
    /// In use, of a user type with no plugin (`systemd-tpm2` without the plugin...).
    ExternalUnknown,
}

impl TokenStatus {
    /// Whether the token id holds a token.
    pub fn in_use(self) -> bool {
        !matches!(self, TokenStatus::Invalid | TokenStatus::Inactive)
    }
}

/// Splits `aes-xts-plain64` into (`aes`, `xts-plain64`) as `crypt_parse_name_and_mode`.
///
/// # Errors
/// [`FormatError::Rule`] for an empty cipher.
pub fn split_cipher(spec: &str) -> Result<(String, String), FormatError> {
    if spec.is_empty() || spec.starts_with('-') {
        return Err(FormatError::Rule(format!(
            "cipher \"{spec}\" is not <cipher>-<mode>-<iv> (e.g. aes-xts-plain64)"
        )));
    }
    Ok(match spec.split_once('-') {
        Some((c, m)) => (c.to_string(), m.to_string()),
        None => (spec.to_string(), "cbc-plain".to_string()),
    })
}

/// What [`CryptDevice::reencrypt_init`] sets up (cryptsetup reencrypt's options).
#[derive(Debug, Clone)]
pub struct ReencryptInit {
    /// What is done: re-key, encrypt or decrypt.
    pub mode: ReencryptMode,
    /// The new cipher spec (`aes-xts-plain64`); ignored when decrypting.
    pub cipher: String,
    /// The new encryption sector size.
    pub sector_size: u32,
    /// `checksum`, `journal` or `none`.
    pub resilience: String,
    /// The checksum hash (`sha256` when None).
    pub hash: Option<String>,
    /// Largest hotzone in 512-byte sectors (0: the library's default).
    pub max_hotzone_sectors: u64,
    /// `--device-size` in 512-byte sectors (0: the whole data area).
    pub device_size_sectors: u64,
    /// A data shift in 512-byte sectors (0: none). With it, encryption runs backward
    /// with resilience `datashift`, as cryptsetup's `--reduce-device-size`.
    pub data_shift_sectors: u64,
    /// `CRYPT_REENCRYPT_MOVE_FIRST_SEGMENT`: the library copies the first data-shift
    /// bytes of the data to the end of the device (their backup while the header is
    /// written over them) before it writes the metadata.
    pub move_first_segment: bool,
}

/// `crypt_reencrypt_mode_info` with the direction cryptsetup's CLI pairs it with (without a
/// data shift): re-keying and encryption forward, decryption backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReencryptMode {
    /// A new volume key (`reencrypt`).
    #[default]
    Reencrypt,
    /// Plaintext to ciphertext (`encrypt`): the old side is a linear segment.
    Encrypt,
    /// Ciphertext to plaintext (`decrypt`): the new side is a linear segment.
    Decrypt,
}

/// One libcryptsetup device context (header device, optionally a separate data device).
///
/// Not `Send`: libcryptsetup contexts are used from the thread that made them.
pub struct CryptDevice {
    cd: NonNull<ffi::crypt_device>,
    name: String,
    /// The header device (for the pure-Rust keyslot fallback).
    header: std::path::PathBuf,
}

impl Drop for CryptDevice {
    fn drop(&mut self) {
        // SAFETY: `cd` came from crypt_init* and is freed exactly once, here.
        unsafe { ffi::crypt_free(self.cd.as_ptr()) };
    }
}

impl std::fmt::Debug for CryptDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CryptDevice")
            .field("device", &self.name)
            .finish()
    }
}

impl CryptDevice {
    /// `crypt_init`: a context on `device` (header and data on the same device).
    ///
    /// # Errors
    /// The device does not exist or cannot be opened (`ENOENT`, `ENOTBLK`...).
    pub fn init(device: &Path) -> Result<Self, FormatError> {
        Self::init_with(device, None)
    }

    /// `crypt_init_data_device`: header on `header`, encrypted data on `data` (cryptsetup
    /// `--header`).
    ///
    /// # Errors
    /// As [`CryptDevice::init`], for either path.
    pub fn init_detached(header: &Path, data: &Path) -> Result<Self, FormatError> {
        Self::init_with(header, Some(data))
    }

    fn init_with(device: &Path, data: Option<&Path>) -> Result<Self, FormatError> {
        global_init();
        let name = device.display().to_string();
        let dev = path_cstring(device)?;
        let data_c = data.map(path_cstring).transpose()?;
        let mut cd: *mut ffi::crypt_device = ptr::null_mut();
        take_log();
        // SAFETY: `cd` is a valid out-pointer; both paths are NUL-terminated and outlive
        // the call (libcryptsetup copies them).
        let r = unsafe {
            match &data_c {
                None => ffi::crypt_init(&mut cd, dev.as_ptr()),
                Some(d) => ffi::crypt_init_data_device(&mut cd, dev.as_ptr(), d.as_ptr()),
            }
        };
        let log = take_log();
        let Some(cd) = NonNull::new(cd).filter(|_| r >= 0) else {
            return Err(FormatError::DeviceUnavailable {
                device: name,
                errno: -r.min(-1),
                detail: errors_of(&log),
            });
        };
        Ok(CryptDevice {
            cd,
            name,
            header: device.to_path_buf(),
        })
    }

    /// The device path this context was opened on.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// The libcryptsetup context, for calls made outside this module (token plugins
    /// called back into the library with it).
    pub(crate) fn as_ptr(&self) -> *mut ffi::crypt_device {
        self.cd.as_ptr()
    }

    /// Runs one libcryptsetup call; a negative return becomes an error naming `op`.
    fn call(
        &mut self,
        op: &str,
        f: impl FnOnce(*mut ffi::crypt_device) -> i32,
    ) -> Result<i32, FormatError> {
        self.call_logged(op, f).map(|(r, _)| r)
    }

    /// As [`CryptDevice::call`], also returning what the library logged at its normal
    /// level (what cryptsetup prints on stdout, e.g. luksFormat's warning that the
    /// keyslots area is very small).
    fn call_logged(
        &mut self,
        op: &str,
        f: impl FnOnce(*mut ffi::crypt_device) -> i32,
    ) -> Result<(i32, Vec<String>), FormatError> {
        take_log();
        let r = f(self.cd.as_ptr());
        let log = take_log();
        if r < 0 {
            return Err(FormatError::Cryptsetup {
                op: op.to_string(),
                device: self.name.clone(),
                errno: -r,
                detail: errors_of(&log),
            });
        }
        let normal = log
            .into_iter()
            .filter(|(l, _)| *l == ffi::CRYPT_LOG_NORMAL)
            .map(|(_, m)| m)
            .collect();
        Ok((r, normal))
    }

    /// `crypt_load`: reads the header. `None` accepts LUKS1 or LUKS2.
    ///
    /// # Errors
    /// `EINVAL` when no (valid) header of that type is on the device.
    pub fn load(&mut self, kind: Option<HeaderType>) -> Result<(), FormatError> {
        let t = kind.map_or(ptr::null(), |k| c_name(k).as_ptr());
        // SAFETY: `t` is NULL or a static C string; NULL params is allowed for LUKS.
        self.call("loading the header", |cd| unsafe {
            ffi::crypt_load(cd, t, ptr::null_mut())
        })?;
        Ok(())
    }

    /// `crypt_set_pbkdf_type` for the keyslots added next.
    ///
    /// # Errors
    /// Unknown PBKDF or hash, or costs out of range.
    pub fn set_pbkdf(&mut self, p: &Pbkdf) -> Result<(), FormatError> {
        let kind = cstring("PBKDF", &p.kind)?;
        let hash = cstring("hash", p.hash.as_deref().unwrap_or("sha256"))?;
        let argon = p.kind.starts_with("argon2");
        let params = ffi::crypt_pbkdf_type {
            type_: kind.as_ptr(),
            hash: hash.as_ptr(),
            time_ms: p.time_ms.unwrap_or(2000),
            iterations: p.iterations.unwrap_or(0),
            max_memory_kb: if argon {
                p.memory_kb.unwrap_or(1_048_576)
            } else {
                0
            },
            parallel_threads: if argon { p.parallel.unwrap_or(4) } else { 0 },
            flags: if p.iterations.is_some() {
                ffi::CRYPT_PBKDF_NO_BENCHMARK
            } else {
                0
            },
        };
        // SAFETY: `params` and its strings outlive the call; the library copies them.
        self.call("setting the PBKDF", |cd| unsafe {
            ffi::crypt_set_pbkdf_type(cd, &params)
        })?;
        Ok(())
    }

    /// Runs the Argon2 benchmark for the next keyslot now, on the context's own PBKDF
    /// parameters, exactly as libcryptsetup runs it inside keyslot creation
    /// (`crypt_benchmark_pbkdf_internal`: same password, salt and key size), so that the
    /// keyslot call reuses the result ("Reusing PBKDF values") and only derives and
    /// writes. Splitting it off lets a caller interrupt the benchmark, which writes
    /// nothing. PBKDF2 is left alone (the library re-runs its one-second benchmark
    /// whatever was done before), as are forced iteration counts.
    ///
    /// # Errors
    /// Parameters the library refuses.
    pub fn prebenchmark_pbkdf(&mut self, volume_key_bytes: usize) -> Result<(), FormatError> {
        // SAFETY: valid context; the result is NULL or points into the context.
        let p = unsafe { ffi::crypt_get_pbkdf_type(self.cd.as_ptr()) };
        if p.is_null() {
            return Ok(());
        }
        // SAFETY: `p` points to the context's live PBKDF parameters.
        let (kind, flags, iterations) = unsafe {
            (
                opt_string((*p).type_).unwrap_or_default(),
                (*p).flags,
                (*p).iterations,
            )
        };
        if !kind.starts_with("argon2")
            || flags & ffi::CRYPT_PBKDF_NO_BENCHMARK != 0
            || iterations != 0
        {
            return Ok(());
        }
        let p = p.cast_mut();
        // SAFETY: `p` is the context's own PBKDF struct, which the library itself updates
        // in place the same way; password and salt are static buffers of the sizes given.
        self.call("benchmarking the PBKDF", |cd| unsafe {
            ffi::crypt_benchmark_pbkdf(
                cd,
                p,
                c"foobarfo".as_ptr(),
                8,
                c"0123456789abcdef0123456789abcdef".as_ptr(),
                32,
                volume_key_bytes,
                None,
                ptr::null_mut(),
            )
        })?;
        Ok(())
    }

    /// `crypt_format` with LUKS1 or LUKS2 parameters. `volume_key` None: a random key.
    ///
    /// # Errors
    /// Bad cipher or sizes, a device too small, or a device the library refuses.
    pub fn format_luks(
        &mut self,
        f: &LuksFormat,
        volume_key: Option<&VolumeKey>,
    ) -> Result<(), FormatError> {
        let (cipher, mode) = split_cipher(&f.cipher)?;
        let cipher = cstring("cipher", &cipher)?;
        let mode = cstring("cipher mode", &mode)?;
        let uuid = f.uuid.as_deref().map(|u| cstring("UUID", u)).transpose()?;
        let hash = f.hash.as_deref().map(|h| cstring("hash", h)).transpose()?;
        let label = f
            .label
            .as_deref()
            .map(|l| cstring("label", l))
            .transpose()?;
        let subsystem = f
            .subsystem
            .as_deref()
            .map(|l| cstring("subsystem", l))
            .transpose()?;
        let data_device = f.data_device.as_deref().map(path_cstring).transpose()?;
        let ptr_of = |c: &Option<CString>| c.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        let align = usize::try_from(f.align_sectors.unwrap_or(0)).unwrap_or(0);
        let mut p1 = ffi::crypt_params_luks1 {
            hash: ptr_of(&hash),
            data_alignment: align,
            data_device: ptr_of(&data_device),
        };
        let mut p2 = ffi::crypt_params_luks2 {
            pbkdf: ptr::null(),
            integrity: ptr::null(),
            integrity_params: ptr::null(),
            data_alignment: align,
            data_device: ptr_of(&data_device),
            sector_size: f.sector_size.unwrap_or(0),
            label: ptr_of(&label),
            subsystem: ptr_of(&subsystem),
        };
        let (kind, params): (HeaderType, *mut libc::c_void) = if f.luks2 {
            (
                HeaderType::Luks2,
                (&mut p2 as *mut ffi::crypt_params_luks2).cast(),
            )
        } else {
            if f.sector_size.is_some_and(|s| s != 512) {
                return Err(FormatError::Rule(format!(
                    "sector size {} needs LUKS2 (LUKS1 supports only 512)",
                    f.sector_size.unwrap_or(0)
                )));
            }
            (
                HeaderType::Luks1,
                (&mut p1 as *mut ffi::crypt_params_luks1).cast(),
            )
        };
        let vk = volume_key.map_or(ptr::null(), |k| k.as_bytes().as_ptr().cast());
        let uuid_p = ptr_of(&uuid);
        let key_bytes = f.key_bytes;
        // SAFETY: every pointer is NULL or points to data alive until the call returns;
        // `params` matches `kind`'s struct; `vk` has `key_bytes` bytes when non-NULL.
        let (_, notes) = self.call_logged("formatting", |cd| unsafe {
            if volume_key.is_some_and(|k| k.len() != key_bytes) {
                return -libc::EINVAL;
            }
            ffi::crypt_format(
                cd,
                c_name(kind).as_ptr(),
                cipher.as_ptr(),
                mode.as_ptr(),
                uuid_p,
                vk,
                key_bytes,
                params,
            )
        })?;
        // cryptsetup prints the library's notes (log_std) on stdout.
        for n in notes {
            print!("{n}");
        }
        Ok(())
    }

    /// `crypt_format(CRYPT_PLAIN)` with a passphrase hash, so that
    /// [`CryptDevice::volume_key`] applies cryptsetup's plain-mode hashing.
    ///
    /// # Errors
    /// Bad cipher, key size or hash name.
    pub fn format_plain(
        &mut self,
        cipher: &str,
        key_bytes: usize,
        hash: &str,
        sizes: (u64, u64, u64, u32),
    ) -> Result<(), FormatError> {
        let (c, m) = split_cipher(cipher)?;
        let c = cstring("cipher", &c)?;
        let m = cstring("cipher mode", &m)?;
        let h = cstring("hash", hash)?;
        let (offset, skip, size, sector_size) = sizes;
        let mut p = ffi::crypt_params_plain {
            hash: h.as_ptr(),
            offset,
            skip,
            size,
            sector_size,
        };
        // SAFETY: strings and params outlive the call; NULL volume key = none yet.
        self.call("setting up plain mode", |cd| unsafe {
            ffi::crypt_format(
                cd,
                c_name(HeaderType::Plain).as_ptr(),
                c.as_ptr(),
                m.as_ptr(),
                ptr::null(),
                ptr::null(),
                key_bytes,
                (&mut p as *mut ffi::crypt_params_plain).cast(),
            )
        })?;
        Ok(())
    }

    fn slot_arg(slot: Option<u32>) -> libc::c_int {
        slot.and_then(|s| libc::c_int::try_from(s).ok())
            .unwrap_or(ffi::CRYPT_ANY_SLOT)
    }

    fn slot_ret(r: i32) -> u32 {
        u32::try_from(r).unwrap_or(0)
    }

    /// `crypt_keyslot_add_by_volume_key`: a new keyslot for `passphrase`, holding
    /// `volume_key` (None: the key of the header just formatted). Returns the slot.
    ///
    /// # Errors
    /// No free slot, the slot in use, or a volume key that does not match the header.
    pub fn add_keyslot_by_volume_key(
        &mut self,
        slot: Option<u32>,
        volume_key: Option<&VolumeKey>,
        passphrase: &[u8],
    ) -> Result<u32, FormatError> {
        let (vk, vk_len) =
            volume_key.map_or((ptr::null(), 0), |k| (k.as_bytes().as_ptr(), k.len()));
        // SAFETY: buffers are valid for the lengths given for the duration of the call.
        let r = self.call("adding a keyslot", |cd| unsafe {
            ffi::crypt_keyslot_add_by_volume_key(
                cd,
                Self::slot_arg(slot),
                vk.cast(),
                vk_len,
                passphrase.as_ptr().cast(),
                passphrase.len(),
            )
        })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_keyslot_add_by_key` with `CRYPT_VOLUME_KEY_NO_SEGMENT` and no key: a new,
    /// random volume key of `key_bytes` in a keyslot for `passphrase`, bound to no segment
    /// (the new key of a reencryption). Returns the slot.
    ///
    /// # Errors
    /// No free slot, the slot in use, a bad key size.
    pub fn add_keyslot_new_unbound_key(
        &mut self,
        slot: Option<u32>,
        key_bytes: usize,
        passphrase: &[u8],
    ) -> Result<u32, FormatError> {
        // SAFETY: the passphrase buffer is valid for its length during the call; a NULL
        // volume key asks the library to generate one.
        let r = self.call("adding a keyslot for the new volume key", |cd| unsafe {
            ffi::crypt_keyslot_add_by_key(
                cd,
                Self::slot_arg(slot),
                ptr::null(),
                key_bytes,
                passphrase.as_ptr().cast(),
                passphrase.len(),
                ffi::CRYPT_VOLUME_KEY_NO_SEGMENT,
            )
        })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_keyslot_add_by_key` with `CRYPT_VOLUME_KEY_NO_SEGMENT`: a new unbound keyslot
    /// (cryptsetup `luksAddKey --unbound`) for `passphrase`, holding `key` or, when None, a
    /// new random key of `key_bytes`. Returns the slot.
    ///
    /// # Errors
    /// No free slot, the slot in use, a bad key size, not LUKS2.
    pub fn add_unbound_keyslot(
        &mut self,
        slot: Option<u32>,
        key: Option<&[u8]>,
        key_bytes: usize,
        passphrase: &[u8],
    ) -> Result<u32, FormatError> {
        let kp = key.map_or(ptr::null(), <[u8]>::as_ptr);
        // SAFETY: the key (when given, of `key_bytes`) and passphrase buffers are valid
        // for their lengths during the call; a NULL key asks the library for a random one.
        let r = self.call("adding an unbound keyslot", |cd| unsafe {
            ffi::crypt_keyslot_add_by_key(
                cd,
                Self::slot_arg(slot),
                kp.cast(),
                key_bytes,
                passphrase.as_ptr().cast(),
                passphrase.len(),
                ffi::CRYPT_VOLUME_KEY_NO_SEGMENT,
            )
        })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_keyslot_add_by_keyslot_context` with the volume key as the existing context
    /// and LUKS2 token `token` as the new one (cryptsetup `luksAddKey --new-token-id`): the
    /// new keyslot's passphrase is what the token gives (a `luks2-keyring` token: the
    /// kernel keyring's key), and the token is assigned to the new keyslot. Returns the slot.
    ///
    /// # Errors
    /// The token is missing or unusable (`ENOENT`, `ENOANO` for a PIN), no free slot.
    pub fn add_keyslot_by_token(
        &mut self,
        slot: Option<u32>,
        volume_key: &VolumeKey,
        token: u32,
    ) -> Result<u32, FormatError> {
        /// Frees a keyslot context however the call ends.
        struct Kc(*mut ffi::crypt_keyslot_context);
        impl Drop for Kc {
            fn drop(&mut self) {
                if !self.0.is_null() {
                    // SAFETY: allocated by crypt_keyslot_context_init_*, freed once.
                    unsafe { ffi::crypt_keyslot_context_free(self.0) };
                }
            }
        }
        let (mut kc, mut kc_new) = (Kc(ptr::null_mut()), Kc(ptr::null_mut()));
        let (vk, vk_len) = (volume_key.as_bytes().as_ptr(), volume_key.len());
        // SAFETY: the key buffer is valid for its length (the library copies it); `kc.0`
        // is an out-pointer.
        self.call("using the volume key", |cd| unsafe {
            ffi::crypt_keyslot_context_init_by_volume_key(cd, vk.cast(), vk_len, &mut kc.0)
        })?;
        let t = Self::token_arg(Some(token));
        // SAFETY: valid context, no type, no PIN; `kc_new.0` is an out-pointer.
        self.call(&format!("reading token {token}"), |cd| unsafe {
            ffi::crypt_keyslot_context_init_by_token(
                cd,
                t,
                ptr::null(),
                ptr::null(),
                0,
                ptr::null_mut(),
                &mut kc_new.0,
            )
        })?;
        let s = Self::slot_arg(slot);
        // SAFETY: both contexts are live for the call.
        let r = self
            .call("adding a keyslot", |cd| unsafe {
                ffi::crypt_keyslot_add_by_keyslot_context(
                    cd,
                    ffi::CRYPT_ANY_SLOT,
                    kc.0,
                    s,
                    kc_new.0,
                    0,
                )
            })
            .map_err(|e| match e {
                FormatError::Cryptsetup {
                    op,
                    device,
                    errno,
                    detail,
                } if errno == libc::ENOENT && detail.is_empty() => FormatError::Cryptsetup {
                    op,
                    device,
                    errno,
                    detail: format!(
                        "token {token} does not exist or gave no passphrase (for a \
                         luks2-keyring token: is its key in the kernel keyring?)"
                    ),
                },
                other => other,
            })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_set_metadata_size` for the LUKS2 header formatted next (cryptsetup
    /// `--luks2-metadata-size`, `--luks2-keyslots-size`; 0 keeps the default).
    ///
    /// # Errors
    /// Sizes the library refuses (metadata: 16 KiB..4 MiB, a power of two; keyslots area:
    /// a multiple of 4 KiB up to 128 MiB).
    pub fn set_metadata_size(&mut self, metadata: u64, keyslots: u64) -> Result<(), FormatError> {
        // SAFETY: plain integer arguments on a valid context.
        self.call("setting the LUKS2 metadata size", |cd| unsafe {
            ffi::crypt_set_metadata_size(cd, metadata, keyslots)
        })?;
        Ok(())
    }

    /// `crypt_set_rng_type`: the volume key of the header formatted next comes from
    /// /dev/random (`random` true, cryptsetup `--use-random`) or /dev/urandom.
    pub fn set_rng(&mut self, random: bool) {
        // SAFETY: plain integer arguments on a valid context.
        unsafe { ffi::crypt_set_rng_type(self.cd.as_ptr(), i32::from(random)) };
    }

    /// `crypt_keyslot_set_encryption`: the cipher and key size (bytes) of the LUKS2
    /// keyslot areas written next (cryptsetup `--keyslot-cipher`, `--keyslot-key-size`).
    ///
    /// # Errors
    /// Not LUKS2, or a cipher spec the library refuses.
    pub fn set_keyslot_encryption(
        &mut self,
        cipher: &str,
        key_bytes: usize,
    ) -> Result<(), FormatError> {
        let c = cstring("keyslot cipher", cipher)?;
        // SAFETY: `c` is NUL-terminated and outlives the call (the library copies it).
        self.call("setting the keyslot cipher", |cd| unsafe {
            ffi::crypt_keyslot_set_encryption(cd, c.as_ptr(), key_bytes)
        })?;
        Ok(())
    }

    /// The key held by unbound keyslot `slot` (cryptsetup `luksDump --unbound -S N`):
    /// `crypt_volume_key_get` on that keyslot, its size from `crypt_keyslot_get_key_size`.
    ///
    /// # Errors
    /// `EPERM` for a wrong passphrase; the slot's key size unknown.
    pub fn unbound_key(&mut self, slot: u32, passphrase: &[u8]) -> Result<VolumeKey, FormatError> {
        let s = Self::slot_arg(Some(slot));
        // SAFETY: plain integer arguments on a valid context.
        let size = self.call(&format!("reading keyslot {slot}'s key size"), |cd| unsafe {
            ffi::crypt_keyslot_get_key_size(cd, s)
        })?;
        let size = usize::try_from(size).unwrap_or(0).max(1);
        let mut buf = Zeroizing::new(vec![0u8; size]);
        let mut len: libc::size_t = size;
        // SAFETY: `buf` has `len` writable bytes; the passphrase is valid for its length.
        self.call("unlocking the unbound key", |cd| unsafe {
            ffi::crypt_volume_key_get(
                cd,
                s,
                buf.as_mut_ptr().cast(),
                &mut len,
                passphrase.as_ptr().cast(),
                passphrase.len(),
            )
        })?;
        buf.truncate(len.min(size));
        Ok(VolumeKey::new(std::mem::take(&mut *buf)))
    }

    /// `crypt_reencrypt_init_by_passphrase` with `CRYPT_REENCRYPT_INITIALIZE_ONLY`, offline,
    /// mode `reencrypt`, direction `forward`: writes the initial LUKS2 reencryption metadata
    /// (reencrypt keyslot, backup segments, digests, requirement) exactly as cryptsetup
    /// does, without touching data. `old_slot` None: any keyslot `passphrase` opens.
    /// Returns the reencrypt keyslot.
    ///
    /// # Errors
    /// `EPERM` for a passphrase that opens neither keyslot; `EBUSY` when a reencryption is
    /// already initialised; the library's refusals (sector size, cipher, resilience).
    pub fn reencrypt_init(
        &mut self,
        old_slot: Option<u32>,
        new_slot: Option<u32>,
        passphrase: &[u8],
        p: &ReencryptInit,
    ) -> Result<u32, FormatError> {
        let decrypt = p.mode == ReencryptMode::Decrypt;
        let (cipher, mode) = if decrypt {
            (None, None)
        } else {
            let (c, m) = split_cipher(&p.cipher)?;
            (
                Some(cstring("cipher", &c)?),
                Some(cstring("cipher mode", &m)?),
            )
        };
        let ptr_of = |c: &Option<CString>| c.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        let (cipher_p, mode_p) = (ptr_of(&cipher), ptr_of(&mode));
        let resilience = cstring("resilience", &p.resilience)?;
        let hash = cstring("hash", p.hash.as_deref().unwrap_or("sha256"))?;
        let luks2 = ffi::crypt_params_luks2 {
            pbkdf: ptr::null(),
            integrity: ptr::null(),
            integrity_params: ptr::null(),
            data_alignment: 0,
            data_device: ptr::null(),
            sector_size: p.sector_size,
            label: ptr::null(),
            subsystem: ptr::null(),
        };
        let params = ffi::crypt_params_reencrypt {
            mode: match p.mode {
                ReencryptMode::Reencrypt => ffi::CRYPT_REENCRYPT_REENCRYPT,
                ReencryptMode::Encrypt => ffi::CRYPT_REENCRYPT_ENCRYPT,
                ReencryptMode::Decrypt => ffi::CRYPT_REENCRYPT_DECRYPT,
            },
            // cryptsetup's: decryption backward, except with a moved first segment
            // (the header exported, the data shifted towards the start: forward);
            // encryption with a data shift backward.
            direction: if (decrypt && !p.move_first_segment)
                || (!decrypt && p.data_shift_sectors > 0)
            {
                ffi::CRYPT_REENCRYPT_BACKWARD
            } else {
                ffi::CRYPT_REENCRYPT_FORWARD
            },
            resilience: resilience.as_ptr(),
            hash: hash.as_ptr(),
            data_shift: p.data_shift_sectors,
            max_hotzone_size: p.max_hotzone_sectors,
            device_size: p.device_size_sectors,
            // cryptsetup's decryption passes none (the new side has no sector size).
            luks2: if decrypt { ptr::null() } else { &luks2 },
            flags: ffi::CRYPT_REENCRYPT_INITIALIZE_ONLY
                | if p.move_first_segment {
                    ffi::CRYPT_REENCRYPT_MOVE_FIRST_SEGMENT
                } else {
                    0
                },
        };
        // SAFETY: every pointer (strings, params and the luks2 params they point to, the
        // passphrase) is valid for the duration of the call; the library copies what it
        // keeps. A NULL name is offline reencryption.
        let r = self.call("initialising the reencryption", |cd| unsafe {
            ffi::crypt_reencrypt_init_by_passphrase(
                cd,
                ptr::null(),
                passphrase.as_ptr().cast(),
                passphrase.len(),
                Self::slot_arg(old_slot),
                Self::slot_arg(new_slot),
                cipher_p,
                mode_p,
                &params,
            )
        })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_keyslot_add_by_passphrase`: unlock with `old`, add `new`. Returns the slot.
    ///
    /// # Errors
    /// `EPERM` when `old` opens no keyslot; no free slot.
    pub fn add_keyslot_by_passphrase(
        &mut self,
        slot: Option<u32>,
        old: &[u8],
        new: &[u8],
    ) -> Result<u32, FormatError> {
        // SAFETY: buffers are valid for the lengths given for the duration of the call.
        let r = self.call("adding a keyslot", |cd| unsafe {
            ffi::crypt_keyslot_add_by_passphrase(
                cd,
                Self::slot_arg(slot),
                old.as_ptr().cast(),
                old.len(),
                new.as_ptr().cast(),
                new.len(),
            )
        })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_keyslot_change_by_passphrase`: replaces the passphrase of the slot `old`
    /// opens (or `old_slot`), writing the new one to `new_slot` (None: same slot when
    /// possible). Returns the new slot.
    ///
    /// # Errors
    /// `EPERM` when `old` opens no keyslot.
    pub fn change_keyslot(
        &mut self,
        old_slot: Option<u32>,
        new_slot: Option<u32>,
        old: &[u8],
        new: &[u8],
    ) -> Result<u32, FormatError> {
        // SAFETY: buffers are valid for the lengths given for the duration of the call.
        let r = self.call("changing a keyslot", |cd| unsafe {
            ffi::crypt_keyslot_change_by_passphrase(
                cd,
                Self::slot_arg(old_slot),
                Self::slot_arg(new_slot),
                old.as_ptr().cast(),
                old.len(),
                new.as_ptr().cast(),
                new.len(),
            )
        })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_keyslot_destroy`: wipes one keyslot.
    ///
    /// # Errors
    /// A slot number out of range or a free slot.
    pub fn destroy_keyslot(&mut self, slot: u32) -> Result<(), FormatError> {
        let s = Self::slot_arg(Some(slot));
        // SAFETY: plain integer arguments on a valid context.
        self.call(&format!("destroying keyslot {slot}"), |cd| unsafe {
            ffi::crypt_keyslot_destroy(cd, s)
        })?;
        Ok(())
    }

    /// `crypt_keyslot_status`.
    pub fn keyslot_status(&mut self, slot: u32) -> KeyslotStatus {
        let s = Self::slot_arg(Some(slot));
        // SAFETY: plain integer arguments on a valid context.
        match unsafe { ffi::crypt_keyslot_status(self.cd.as_ptr(), s) } {
            ffi::CRYPT_SLOT_INACTIVE => KeyslotStatus::Inactive,
            2 => KeyslotStatus::Active,
            3 => KeyslotStatus::ActiveLast,
            4 => KeyslotStatus::Unbound,
            _ => KeyslotStatus::Invalid,
        }
    }

    /// `crypt_activate_by_passphrase(cd, NULL, ...)`: checks `passphrase` without creating
    /// any mapping. Returns the slot it opened. When the library needs the kernel for the
    /// keyslot cipher, the pure-Rust unlock ([`ucrypt_format::luks1`], [`ucrypt_format::luks2`]) checks it.
    ///
    /// # Errors
    /// `EPERM` (or [`FormatError::BadPassphrase`] from the fallback) when no keyslot (or not
    /// `slot`) opens with it.
    pub fn check_passphrase(
        &mut self,
        slot: Option<u32>,
        passphrase: &[u8],
    ) -> Result<u32, FormatError> {
        self.check_passphrase_allowing(slot, passphrase, slot.is_some())
    }

    /// [`CryptDevice::check_passphrase`] with unbound keyslots allowed or not
    /// (`CRYPT_ACTIVATE_ALLOW_UNBOUND_KEY`; cryptsetup `open --test-passphrase --unbound`
    /// allows them in any keyslot).
    ///
    /// # Errors
    /// As [`CryptDevice::check_passphrase`].
    pub fn check_passphrase_allowing(
        &mut self,
        slot: Option<u32>,
        passphrase: &[u8],
        unbound: bool,
    ) -> Result<u32, FormatError> {
        match self.check_passphrase_lib(slot, passphrase, unbound) {
            Err(e) if Self::kernel_needed(&e) => self
                .native_unlock(slot, passphrase, unbound, e)
                .map(|(s, _)| s),
            other => other,
        }
    }

    /// True when a libcryptsetup error means "this needs the kernel" (AF_ALG or a temporary
    /// dm-crypt mapping for a keyslot cipher OpenSSL lacks), not a wrong passphrase.
    fn kernel_needed(e: &FormatError) -> bool {
        matches!(e, FormatError::Cryptsetup { errno, .. } if *errno != libc::EPERM && *errno != libc::ENOMEM)
    }

    /// The pure-Rust keyslot unlock ([`ucrypt_format::luks1`], [`ucrypt_format::luks2`]) for LUKS headers
    /// whose keyslot cipher libcryptsetup cannot use here. When ucrypt cannot either (an
    /// unknown cipher, hash or KDF), the library's error `lib_err` is returned.
    fn native_unlock(
        &mut self,
        slot: Option<u32>,
        passphrase: &[u8],
        allow_unbound: bool,
        lib_err: FormatError,
    ) -> Result<(u32, VolumeKey), FormatError> {
        let r = match self.info().kind {
            Some(HeaderType::Luks1) => ucrypt_format::luks1::unlock(&self.header, slot, passphrase),
            Some(HeaderType::Luks2) => {
                let meta = self.luks2_metadata()?;
                ucrypt_format::luks2::unlock(&self.header, &meta, slot, passphrase, allow_unbound)
            }
            _ => return Err(lib_err),
        };
        let lib_no_keyslot =
            matches!(lib_err, FormatError::Cryptsetup { errno, .. } if errno == libc::ENOENT);
        match r {
            Err(FormatError::NotSupported(_) | FormatError::Crypto(_)) => Err(lib_err),
            // The library found no usable keyslot (an inactive --key-slot, or a passphrase
            // of an unbound keyslot without --unbound) and neither does ucrypt: the
            // library's answer stands (exit 1 as cryptsetup's "No usable keyslot is
            // available."), not a wrong passphrase.
            Err(FormatError::BadPassphrase { .. }) if lib_no_keyslot => Err(match lib_err {
                FormatError::Cryptsetup {
                    op, device, errno, ..
                } => FormatError::Cryptsetup {
                    op,
                    device,
                    errno,
                    detail: match slot {
                        Some(s) => format!(
                            "no usable keyslot is available (keyslot {s} is inactive or does \
                             not open with this passphrase)"
                        ),
                        None => "no usable keyslot is available (no active keyslot opens with \
                                 this passphrase; an unbound one is tried only with --unbound \
                                 or --key-slot)"
                            .into(),
                    },
                },
                other => other,
            }),
            other => other,
        }
    }

    fn check_passphrase_lib(
        &mut self,
        slot: Option<u32>,
        passphrase: &[u8],
        unbound: bool,
    ) -> Result<u32, FormatError> {
        // SAFETY: NULL name = check only; the buffer is valid for its length.
        let r = self.call("checking the passphrase", |cd| unsafe {
            ffi::crypt_activate_by_passphrase(
                cd,
                ptr::null(),
                Self::slot_arg(slot),
                passphrase.as_ptr().cast(),
                passphrase.len(),
                // An explicit slot may be unbound (LUKS2): checking it is allowed, as
                // `cryptsetup open --test-passphrase --key-slot N` (or `--unbound`) does;
                // nothing is mapped.
                if unbound { ALLOW_UNBOUND_KEY } else { 0 },
            )
        })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_volume_key_get`, then `crypt_volume_key_verify` (so a LUKS2 key that is not
    /// bound to the data segment is refused). Returns the slot and the key. When the library
    /// needs the kernel for the keyslot cipher (Serpent, Twofish, LRW...), the pure-Rust
    /// unlock ([`ucrypt_format::luks1`], [`ucrypt_format::luks2`]) derives the key instead.
    ///
    /// # Errors
    /// `EPERM` (or [`FormatError::BadPassphrase`] from the fallback) for a wrong passphrase; `EPERM` also when the unlocked key is not the data
    /// segment's key.
    pub fn volume_key(
        &mut self,
        slot: Option<u32>,
        passphrase: &[u8],
    ) -> Result<(u32, VolumeKey), FormatError> {
        match self.volume_key_lib(slot, passphrase) {
            Err(e) if Self::kernel_needed(&e) => self.native_unlock(slot, passphrase, false, e),
            other => other,
        }
    }

    fn volume_key_lib(
        &mut self,
        slot: Option<u32>,
        passphrase: &[u8],
    ) -> Result<(u32, VolumeKey), FormatError> {
        let size = self.info().key_bytes.max(1);
        let mut buf = Zeroizing::new(vec![0u8; size]);
        let mut len: libc::size_t = size;
        // SAFETY: `buf` has `len` writable bytes; the library writes at most `len` and
        // updates it; the passphrase buffer is valid for its length.
        let r = self.call("unlocking the volume key", |cd| unsafe {
            ffi::crypt_volume_key_get(
                cd,
                Self::slot_arg(slot),
                buf.as_mut_ptr().cast(),
                &mut len,
                passphrase.as_ptr().cast(),
                passphrase.len(),
            )
        })?;
        let len = len.min(size);
        if self
            .info()
            .kind
            .is_some_and(|k| matches!(k, HeaderType::Luks1 | HeaderType::Luks2))
        {
            let p = buf.as_ptr();
            // SAFETY: `p` holds `len` initialised bytes.
            self.call("verifying the volume key", |cd| unsafe {
                ffi::crypt_volume_key_verify(cd, p.cast(), len)
            })
            .map_err(|e| match e {
                FormatError::Cryptsetup { device, .. } => FormatError::Refused(format!(
                    "{device}: keyslot {r} holds a key that is not bound to the data segment (unbound keyslot); it cannot open the volume"
                )),
                other => other,
            })?;
        }
        buf.truncate(len);
        Ok((Self::slot_ret(r), VolumeKey::new(std::mem::take(&mut *buf))))
    }

    /// `crypt_volume_key_verify`: whether `key` is the volume key of the loaded LUKS header
    /// (its digest matches; for LUKS2, the digest of the data segment).
    ///
    /// # Errors
    /// [`FormatError::Cryptsetup`] with `EPERM` when it is not; other library errors as
    /// they come.
    pub fn verify_volume_key(&mut self, key: &[u8]) -> Result<(), FormatError> {
        let (p, len) = (key.as_ptr(), key.len());
        // SAFETY: `p` holds `len` initialised bytes for the duration of the call.
        self.call("verifying the volume key", |cd| unsafe {
            ffi::crypt_volume_key_verify(cd, p.cast(), len)
        })
        .map(|_| ())
        .map_err(|e| match e {
            // EPERM (exit 2, as cryptsetup's "Volume key does not match the volume.").
            FormatError::Cryptsetup {
                op, device, errno, ..
            } if errno == libc::EPERM => FormatError::Cryptsetup {
                op,
                device,
                errno,
                detail: "the given volume key does not match the header's digest".into(),
            },
            other => other,
        })
    }

    /// Header facts (`crypt_get_*`, and for LUKS2 the persistent activation flags of
    /// `crypt_persistent_flags_get`), as the format layer's [`VolumeInfo`].
    pub fn info(&mut self) -> VolumeInfo {
        let cd = self.cd.as_ptr();
        // SAFETY: getters on a valid context; returned strings are owned by the context
        // and copied at once.
        let kind =
            unsafe { opt_string(ffi::crypt_get_type(cd)) }.and_then(|t| HeaderType::from_name(&t));
        let mut act = 0u32;
        if kind == Some(HeaderType::Luks2) {
            // SAFETY: a valid context and out-pointer; on failure `act` stays 0 (the
            // flags are read again, with the error reported, by `persistent_flags`).
            unsafe {
                ffi::crypt_persistent_flags_get(cd, ffi::CRYPT_FLAGS_ACTIVATION, &mut act);
            }
        }
        // SAFETY: as above.
        unsafe {
            VolumeInfo {
                kind,
                cipher: opt_string(ffi::crypt_get_cipher(cd)).unwrap_or_default(),
                cipher_mode: opt_string(ffi::crypt_get_cipher_mode(cd)).unwrap_or_default(),
                uuid: opt_string(ffi::crypt_get_uuid(cd)),
                label: opt_string(ffi::crypt_get_label(cd)).filter(|l| !l.is_empty()),
                data_offset: ffi::crypt_get_data_offset(cd),
                iv_offset: ffi::crypt_get_iv_offset(cd),
                key_bytes: usize::try_from(ffi::crypt_get_volume_key_size(cd)).unwrap_or(0),
                sector_size: u32::try_from(ffi::crypt_get_sector_size(cd)).unwrap_or(512),
                flags: activation_flags(act),
            }
        }
    }

    /// `crypt_persistent_flags_get`: (activation flags, requirement flags). Both 0 for
    /// LUKS1.
    ///
    /// # Errors
    /// Only for a context without a loaded header.
    pub fn persistent_flags(&mut self) -> Result<(u32, u32), FormatError> {
        if self.info().kind != Some(HeaderType::Luks2) {
            return Ok((0, 0));
        }
        let mut act = 0u32;
        let mut req = 0u32;
        // SAFETY: valid out-pointers.
        self.call("reading persistent flags", |cd| unsafe {
            ffi::crypt_persistent_flags_get(cd, ffi::CRYPT_FLAGS_ACTIVATION, &mut act)
        })?;
        // SAFETY: valid out-pointers.
        self.call("reading requirement flags", |cd| unsafe {
            ffi::crypt_persistent_flags_get(cd, ffi::CRYPT_FLAGS_REQUIREMENTS, &mut req)
        })?;
        Ok((act, req))
    }

    /// `crypt_persistent_flags_set` for the activation flags (LUKS2 only: cryptsetup's
    /// `open --persistent` and `refresh --persistent`), replacing the stored set.
    ///
    /// # Errors
    /// Not a LUKS2 header (cryptsetup refuses `--persistent` there too), or the library's
    /// error writing the header.
    pub fn set_persistent_activation_flags(&mut self, flags: u32) -> Result<(), FormatError> {
        if self.info().kind != Some(HeaderType::Luks2) {
            return Err(FormatError::Rule(
                "--persistent stores activation flags in LUKS2 headers only".into(),
            ));
        }
        // SAFETY: the context is valid; the flags are passed by value.
        self.call("storing persistent activation flags", |cd| unsafe {
            ffi::crypt_persistent_flags_set(cd, ffi::CRYPT_FLAGS_ACTIVATION, flags)
        })?;
        Ok(())
    }

    /// `crypt_get_metadata_size`: (metadata area, keyslots area) in bytes (LUKS2).
    ///
    /// # Errors
    /// Not a LUKS2 context.
    pub fn metadata_size(&mut self) -> Result<(u64, u64), FormatError> {
        let mut m = 0u64;
        let mut k = 0u64;
        // SAFETY: valid out-pointers.
        self.call("reading metadata size", |cd| unsafe {
            ffi::crypt_get_metadata_size(cd, &mut m, &mut k)
        })?;
        Ok((m, k))
    }

    /// `crypt_dump`: the header as cryptsetup's `luksDump` prints it.
    ///
    /// # Errors
    /// No header loaded.
    pub fn dump(&mut self) -> Result<String, FormatError> {
        take_log();
        // SAFETY: valid context; output goes to the log callback.
        let r = unsafe { ffi::crypt_dump(self.cd.as_ptr()) };
        let log = take_log();
        if r < 0 {
            return Err(FormatError::Cryptsetup {
                op: "dumping the header".into(),
                device: self.name.clone(),
                errno: -r,
                detail: errors_of(&log),
            });
        }
        Ok(log
            .into_iter()
            .filter(|(l, _)| *l == ffi::CRYPT_LOG_NORMAL || *l == ffi::CRYPT_LOG_VERBOSE)
            .map(|(_, m)| m)
            .collect())
    }

    /// `crypt_dump_json`: the LUKS2 JSON metadata.
    ///
    /// # Errors
    /// `EINVAL` for LUKS1 ("not supported for this device type").
    pub fn dump_json(&mut self) -> Result<String, FormatError> {
        let mut p: *const libc::c_char = ptr::null();
        // SAFETY: valid out-pointer; the string stays owned by the context.
        self.call("dumping JSON metadata", |cd| unsafe {
            ffi::crypt_dump_json(cd, &mut p, 0)
        })?;
        // SAFETY: set by the successful call, valid until the next call on this context.
        Ok(unsafe { opt_string(p) }.unwrap_or_default())
    }

    /// [`Self::dump_json`] parsed into the typed LUKS2 metadata.
    ///
    /// # Errors
    /// As [`Self::dump_json`]; [`FormatError::Header`] when the JSON does not parse.
    pub fn luks2_metadata(&mut self) -> Result<ucrypt_format::luks2::Metadata, FormatError> {
        let json = zeroize::Zeroizing::new(self.dump_json()?);
        ucrypt_format::luks2::Metadata::parse(&json)
    }

    /// `crypt_header_backup` to `file` (must not exist).
    ///
    /// # Errors
    /// The file exists or cannot be written; no header.
    pub fn header_backup(&mut self, file: &Path) -> Result<(), FormatError> {
        let f = path_cstring(file)?;
        // SAFETY: NULL type = the loaded LUKS type; path valid during the call.
        self.call("backing up the header", |cd| unsafe {
            ffi::crypt_header_backup(cd, ptr::null(), f.as_ptr())
        })?;
        Ok(())
    }

    /// `crypt_header_restore` from `file`.
    ///
    /// # Errors
    /// Not a valid header backup, or one that does not match the device.
    pub fn header_restore(&mut self, file: &Path) -> Result<(), FormatError> {
        let f = path_cstring(file)?;
        // SAFETY: NULL type = any LUKS; path valid during the call.
        self.call("restoring the header", |cd| unsafe {
            ffi::crypt_header_restore(cd, ptr::null(), f.as_ptr())
        })?;
        Ok(())
    }

    /// `crypt_set_data_offset`: the data offset (512-byte sectors) the next
    /// [`CryptDevice::format_luks`] uses, as cryptsetup's `luksFormat --offset`.
    ///
    /// # Errors
    /// An offset not a multiple of 8 sectors (4 KiB), which the library refuses.
    pub fn set_data_offset(&mut self, sectors: u64) -> Result<(), FormatError> {
        // SAFETY: a plain integer argument on a valid context.
        self.call("setting the data offset", |cd| unsafe {
            ffi::crypt_set_data_offset(cd, sectors)
        })?;
        Ok(())
    }

    /// `crypt_set_uuid` (None: a new random UUID).
    ///
    /// # Errors
    /// A malformed UUID.
    pub fn set_uuid(&mut self, uuid: Option<&str>) -> Result<(), FormatError> {
        let u = uuid.map(|u| cstring("UUID", u)).transpose()?;
        let p = u.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        // SAFETY: NULL or a valid C string.
        self.call("setting the UUID", |cd| unsafe {
            ffi::crypt_set_uuid(cd, p)
        })?;
        Ok(())
    }

    /// `crypt_convert`: rewrites the loaded header as `to` (LUKS1 <-> LUKS2), in place.
    ///
    /// # Errors
    /// What the library refuses (keyslots or features the target format cannot hold).
    pub fn convert(&mut self, to: HeaderType) -> Result<(), FormatError> {
        let t = c_name(to).as_ptr();
        // SAFETY: a static C string; NULL params is allowed for LUKS conversions.
        self.call(&format!("converting the header to {to}"), |cd| unsafe {
            ffi::crypt_convert(cd, t, ptr::null_mut())
        })?;
        Ok(())
    }

    /// `crypt_repair`: lets libcryptsetup fix what it can of a damaged LUKS header (call on
    /// a context whose `load` failed or succeeded).
    ///
    /// # Errors
    /// What cannot be repaired.
    pub fn repair(&mut self, kind: Option<HeaderType>) -> Result<(), FormatError> {
        let t = kind.map_or(ptr::null(), |k| c_name(k).as_ptr());
        // SAFETY: NULL or a static C string; NULL params.
        self.call("repairing the header", |cd| unsafe {
            ffi::crypt_repair(cd, t, ptr::null_mut())
        })?;
        Ok(())
    }

    /// `crypt_keyslot_set_priority` (LUKS2): -1 invalid, 0 ignore, 1 normal, 2 prefer.
    ///
    /// # Errors
    /// Not LUKS2, or no such keyslot.
    pub fn set_keyslot_priority(&mut self, slot: u32, priority: i32) -> Result<(), FormatError> {
        let s = Self::slot_arg(Some(slot));
        let op = format!("setting the priority of keyslot {slot}");
        self.call(&op, |cd| {
            // SAFETY: plain integer arguments on a valid context.
            unsafe { ffi::crypt_keyslot_set_priority(cd, s, priority) }
        })?;
        Ok(())
    }

    /// `crypt_set_label` (LUKS2).
    ///
    /// # Errors
    /// Not LUKS2.
    pub fn set_label(
        &mut self,
        label: Option<&str>,
        subsystem: Option<&str>,
    ) -> Result<(), FormatError> {
        let l = label.map(|u| cstring("label", u)).transpose()?;
        let s = subsystem.map(|u| cstring("subsystem", u)).transpose()?;
        let lp = l.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        let sp = s.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        // SAFETY: NULL or valid C strings.
        self.call("setting the label", |cd| unsafe {
            ffi::crypt_set_label(cd, lp, sp)
        })?;
        Ok(())
    }

    fn token_arg(token: Option<u32>) -> libc::c_int {
        token
            .and_then(|t| libc::c_int::try_from(t).ok())
            .unwrap_or(ffi::CRYPT_ANY_TOKEN)
    }

    /// `crypt_token_status`: the state of token `token` and its type.
    pub fn token_status(&mut self, token: u32) -> (TokenStatus, Option<String>) {
        let Ok(t) = libc::c_int::try_from(token) else {
            return (TokenStatus::Invalid, None);
        };
        let mut kind: *const libc::c_char = ptr::null();
        // SAFETY: valid context and out-pointer; the type string is owned by the context
        // and copied before the next call.
        let status = unsafe { ffi::crypt_token_status(self.cd.as_ptr(), t, &mut kind) };
        take_log();
        let status = match status {
            ffi::CRYPT_TOKEN_INACTIVE => TokenStatus::Inactive,
            ffi::CRYPT_TOKEN_INTERNAL => TokenStatus::Internal,
            ffi::CRYPT_TOKEN_INTERNAL_UNKNOWN => TokenStatus::InternalUnknown,
            ffi::CRYPT_TOKEN_EXTERNAL => TokenStatus::External,
            ffi::CRYPT_TOKEN_EXTERNAL_UNKNOWN => TokenStatus::ExternalUnknown,
            ffi::CRYPT_TOKEN_INVALID => TokenStatus::Invalid,
            _ => TokenStatus::Invalid,
        };
        // SAFETY: NULL or a NUL-terminated string owned by the context.
        (status, unsafe { opt_string(kind) })
    }

    /// `crypt_token_json_get`: token `token`'s JSON object, as stored.
    ///
    /// # Errors
    /// `EINVAL`/`ENOENT` for a free or invalid token id.
    pub fn token_json(&mut self, token: u32) -> Result<String, FormatError> {
        let t = Self::token_arg(Some(token));
        let mut p: *const libc::c_char = ptr::null();
        // SAFETY: valid out-pointer; the string stays owned by the context.
        self.call(&format!("reading token {token}"), |cd| unsafe {
            ffi::crypt_token_json_get(cd, t, &mut p)
        })?;
        // SAFETY: set by the successful call, valid until the next call on this context.
        Ok(unsafe { opt_string(p) }.unwrap_or_default())
    }

    /// `crypt_token_json_set`: stores `json` as token `token` (None: the first free id),
    /// or removes the token when `json` is None. Returns the token id.
    ///
    /// # Errors
    /// JSON that is not a valid token object (no "type" string or "keyslots" array),
    /// a reserved `luks2-` type libcryptsetup does not know, no room in the metadata.
    pub fn set_token_json(
        &mut self,
        token: Option<u32>,
        json: Option<&str>,
    ) -> Result<u32, FormatError> {
        let t = Self::token_arg(token);
        let j = json.map(|j| cstring("token JSON", j)).transpose()?;
        let jp = j.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        let op = match (json, token) {
            (None, Some(id)) => format!("removing token {id}"),
            _ => "storing a token".to_string(),
        };
        // SAFETY: NULL or a valid C string that outlives the call.
        let r = self.call(&op, |cd| unsafe { ffi::crypt_token_json_set(cd, t, jp) })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_token_luks2_keyring_set`: a `luks2-keyring` token (the passphrase is read from
    /// the kernel keyring entry `key_description` when opening) as token `token` (None: the
    /// first free id). Returns the token id.
    ///
    /// # Errors
    /// Not LUKS2, no room, an id out of range.
    pub fn add_keyring_token(
        &mut self,
        token: Option<u32>,
        key_description: &str,
    ) -> Result<u32, FormatError> {
        let t = Self::token_arg(token);
        let desc = cstring("key description", key_description)?;
        let params = ffi::crypt_token_params_luks2_keyring {
            key_description: desc.as_ptr(),
        };
        // SAFETY: `params` and its string outlive the call; the library copies them.
        let r = self.call("adding a luks2-keyring token", |cd| unsafe {
            ffi::crypt_token_luks2_keyring_set(cd, t, &params)
        })?;
        Ok(Self::slot_ret(r))
    }

    /// `crypt_token_assign_keyslot`: token `token` may unlock `slot` (None: every active
    /// keyslot).
    ///
    /// # Errors
    /// A free token or keyslot.
    pub fn assign_token(&mut self, token: u32, slot: Option<u32>) -> Result<(), FormatError> {
        let (t, s) = (Self::token_arg(Some(token)), Self::slot_arg(slot));
        // SAFETY: plain integer arguments on a valid context.
        self.call(&format!("assigning token {token}"), |cd| unsafe {
            ffi::crypt_token_assign_keyslot(cd, t, s)
        })?;
        Ok(())
    }

    /// `crypt_token_unassign_keyslot`: token `token` no longer names `slot` (None: any).
    ///
    /// # Errors
    /// A free token or keyslot.
    pub fn unassign_token(&mut self, token: u32, slot: Option<u32>) -> Result<(), FormatError> {
        let (t, s) = (Self::token_arg(Some(token)), Self::slot_arg(slot));
        // SAFETY: plain integer arguments on a valid context.
        self.call(&format!("unassigning token {token}"), |cd| unsafe {
            ffi::crypt_token_unassign_keyslot(cd, t, s)
        })?;
        Ok(())
    }

    /// `crypt_token_is_assigned`: Ok(true) when token `token` names keyslot `slot`,
    /// Ok(false) when it does not (or either is free).
    ///
    /// # Errors
    /// Other library errors (an id out of range, not LUKS2).
    pub fn token_is_assigned(&mut self, token: u32, slot: u32) -> Result<bool, FormatError> {
        let (t, s) = (Self::token_arg(Some(token)), Self::slot_arg(Some(slot)));
        // SAFETY: plain integer arguments on a valid context.
        match self.call("checking a token's keyslots", |cd| unsafe {
            ffi::crypt_token_is_assigned(cd, t, s)
        }) {
            Ok(_) => Ok(true),
            Err(FormatError::Cryptsetup { errno, .. }) if errno == libc::ENOENT => Ok(false),
            Err(e) => Err(e),
        }
    }
}
