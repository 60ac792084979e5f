//! A LUKS2 token's secret, the passphrase of the keyslots it is assigned to, read once.
//!
//! libcryptsetup 2.6 gives a token's volume key only through a keyslot context, and
//! `crypt_volume_key_get_by_keyslot_context` runs the token's handler twice for it: once
//! for the passphrase (`get_passphrase`, which it then leaves unused for LUKS2) and once
//! more inside `LUKS2_token_unlock_key`. A FIDO2 key would then want two touches, a
//! PKCS#11 card two logins. Here the handler runs once and the caller opens the keyslots
//! with what it gave ([`CryptDevice::volume_key`]), which also hands the caller the
//! passphrase itself (a reencryption puts it in the new keyslot, as cryptsetup does).
//!
//! The handlers are libcryptsetup's: the built-in `luks2-keyring` (the passphrase is the
//! `user` key named by the token's `key_description`) and the external plugins,
//! `libcryptsetup-token-TYPE.so` in libcryptsetup's plugin directory, loaded and called
//! as `crypt_token_load_external` and `token_open` do: the `CRYPTSETUP_TOKEN_1.0` symbols,
//! the plugin's `validate` first, `open_pin` with a PIN and `open` without, the buffer
//! given back to the plugin's `buffer_free`. Errors keep libcryptsetup's meanings:
//! `ENOENT` unusable here (no handler, invalid, refused), `ENOANO` a PIN is needed or
//! wrong, `EAGAIN` its device is missing, `EPERM` (`luks2-keyring`) its key is not in the
//! kernel keyring; an external handler's `EINVAL`, `EPERM` or
//! positive return is `ENOENT`, as libcryptsetup's `translate_errno` makes them.
#![allow(unsafe_code)]

use crate::device::{errors_of, take_log, CryptDevice};
use crate::ffi;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::Mutex;
use ucrypt_format::FormatError;
use zeroize::Zeroizing;

/// A keyslot's priority (`crypt_keyslot_priority`): which keyslots a token (or a
/// passphrase) tries when none is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyslotPriority {
    /// No such keyslot (or not LUKS2).
    Invalid,
    /// Used only when named (by keyslot, or its token by id).
    Ignore,
    /// The default.
    Normal,
    /// Tried before the normal ones.
    Prefer,
}

type OpenFn = unsafe extern "C" fn(
    *mut ffi::crypt_device,
    c_int,
    *mut *mut c_char,
    *mut libc::size_t,
    *mut c_void,
) -> c_int;
type OpenPinFn = unsafe extern "C" fn(
    *mut ffi::crypt_device,
    c_int,
    *const c_char,
    libc::size_t,
    *mut *mut c_char,
    *mut libc::size_t,
    *mut c_void,
) -> c_int;
type ValidateFn = unsafe extern "C" fn(*mut ffi::crypt_device, *const c_char) -> c_int;
type BufferFreeFn = unsafe extern "C" fn(*mut c_void, libc::size_t);

/// An external token plugin's entry points. The library handle is never closed:
/// libcryptsetup keeps its own plugins loaded until the process ends, and a plugin may
/// have left state (threads, atexit handlers) that must outlive the call.
#[derive(Clone, Copy)]
struct Plugin {
    open: OpenFn,
    open_pin: Option<OpenPinFn>,
    validate: Option<ValidateFn>,
    buffer_free: Option<BufferFreeFn>,
}

/// Plugins loaded so far, by token type (None: no usable plugin of that type).
static PLUGINS: Mutex<Vec<(String, Option<Plugin>)>> = Mutex::new(Vec::new());

/// libcryptsetup's rule for external token names (`external_token_name_valid`).
fn plugin_name_valid(kind: &str) -> bool {
    !kind.is_empty()
        && kind.len() <= 64
        && kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !kind.starts_with("luks2-")
}

/// `symbol@CRYPTSETUP_TOKEN_1.0` in `handle`, or null.
///
/// # Safety
/// `handle` is a live handle from `dlopen`.
unsafe fn symbol(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: per the contract; both strings are NUL-terminated.
    unsafe { libc::dlvsym(handle, name.as_ptr(), c"CRYPTSETUP_TOKEN_1.0".as_ptr()) }
}

/// Loads the plugin for token type `kind` as `crypt_token_load_external` does.
fn load_plugin(kind: &str) -> Option<Plugin> {
    if crate::external_tokens_disabled() || !plugin_name_valid(kind) {
        return None;
    }
    let mut plugins = PLUGINS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, p)) = plugins.iter().find(|(k, _)| k == kind) {
        return *p;
    }
    let path = format!(
        "{}/libcryptsetup-token-{kind}.so",
        crate::external_tokens_dir()
    );
    let plugin = CString::new(path).ok().and_then(|path| {
        // SAFETY: dlopen of a NUL-terminated path; the handle is checked for null.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY) };
        if h.is_null() {
            return None;
        }
        // SAFETY: `h` is live (never closed); each symbol, when present, has the type
        // libcryptsetup.h declares for it (crypt_token_open_func and its siblings).
        unsafe {
            // libcryptsetup requires `version` too (it is only logged).
            let open = symbol(h, c"cryptsetup_token_open");
            let version = symbol(h, c"cryptsetup_token_version");
            if open.is_null() || version.is_null() {
                return None;
            }
            let opt = |name: &CStr| {
                let p = symbol(h, name);
                (!p.is_null()).then_some(p)
            };
            Some(Plugin {
                open: std::mem::transmute::<*mut c_void, OpenFn>(open),
                open_pin: opt(c"cryptsetup_token_open_pin")
                    .map(|p| std::mem::transmute::<*mut c_void, OpenPinFn>(p)),
                validate: opt(c"cryptsetup_token_validate")
                    .map(|p| std::mem::transmute::<*mut c_void, ValidateFn>(p)),
                buffer_free: opt(c"cryptsetup_token_buffer_free")
                    .map(|p| std::mem::transmute::<*mut c_void, BufferFreeFn>(p)),
            })
        }
    });
    plugins.push((kind.to_string(), plugin));
    plugin
}

impl CryptDevice {
    /// `crypt_keyslot_get_priority`.
    pub fn keyslot_priority(&mut self, slot: u32) -> KeyslotPriority {
        let Ok(s) = c_int::try_from(slot) else {
            return KeyslotPriority::Invalid;
        };
        // SAFETY: plain integer arguments on a valid context.
        let p = unsafe { ffi::crypt_keyslot_get_priority(self.as_ptr(), s) };
        take_log();
        match p {
            0 => KeyslotPriority::Ignore,
            1 => KeyslotPriority::Normal,
            2 => KeyslotPriority::Prefer,
            _ => KeyslotPriority::Invalid,
        }
    }

    /// The secret token `token` (of type `kind`) holds: the passphrase of its keyslots,
    /// from its handler, called exactly once (with `pin` if given). See the module
    /// documentation for the handlers and their errors.
    ///
    /// # Errors
    /// `FormatError::Cryptsetup` with `ENOENT` (no handler here, the handler refused the
    /// token, a PIN given to a handler that takes none), `ENOANO`, `EAGAIN`, or another
    /// errno of the handler.
    pub fn token_secret(
        &mut self,
        token: u32,
        kind: &str,
        pin: Option<&[u8]>,
    ) -> Result<Zeroizing<Vec<u8>>, FormatError> {
        let op = format!("opening token {token} ({kind})");
        let device = self.device_name().to_string();
        let fail = |errno: i32, detail: String| FormatError::Cryptsetup {
            op: op.clone(),
            device: device.clone(),
            errno,
            detail,
        };
        if kind == "luks2-keyring" {
            // The built-in handler's `keyring_open`: a key that cannot be read is EPERM
            // (libcryptsetup does not translate its own handler's errors), a token
            // without a description EINVAL; it takes no PIN.
            if pin.is_some() {
                return Err(fail(libc::ENOENT, String::new()));
            }
            let json = self.token_json(token)?;
            let desc = ucrypt_format::luks2::json::Json::parse(&json)
                .ok()
                .and_then(|j| j.get("key_description")?.as_str().map(str::to_string))
                .ok_or_else(|| fail(libc::EINVAL, "no key_description".into()))?;
            return ucrypt_crypto::keyring::read_user_secret(&desc)
                .map_err(|e| fail(libc::EPERM, e.to_string()));
        }
        let Some(plugin) = load_plugin(kind) else {
            return Err(fail(libc::ENOENT, String::new()));
        };
        let t = c_int::try_from(token).map_err(|_| fail(libc::EINVAL, String::new()))?;
        let cd = self.as_ptr();
        take_log();
        if let Some(validate) = plugin.validate {
            let json = CString::new(self.token_json(token)?)
                .map_err(|_| fail(libc::ENOENT, String::new()))?;
            // SAFETY: a live context and the token's NUL-terminated JSON.
            if unsafe { validate(cd, json.as_ptr()) } != 0 {
                let log = take_log();
                return Err(fail(libc::ENOENT, errors_of(&log)));
            }
        }
        let mut buf: *mut c_char = std::ptr::null_mut();
        let mut len: libc::size_t = 0;
        let r = match (pin, plugin.open_pin) {
            (Some(_), None) => -libc::ENOENT,
            // SAFETY: a live context; the PIN is valid for its length (the plugin copies
            // what it keeps); `buf` and `len` are out-pointers the plugin fills on success.
            (Some(p), Some(open_pin)) => unsafe {
                open_pin(
                    cd,
                    t,
                    p.as_ptr().cast(),
                    p.len(),
                    &mut buf,
                    &mut len,
                    std::ptr::null_mut(),
                )
            },
            // SAFETY: as above, without a PIN.
            (None, _) => unsafe { (plugin.open)(cd, t, &mut buf, &mut len, std::ptr::null_mut()) },
        };
        let log = take_log();
        // libcryptsetup's translate_errno for external handlers.
        let r = if r > 0 || r == -libc::EINVAL || r == -libc::EPERM {
            -libc::ENOENT
        } else {
            r
        };
        if r < 0 || buf.is_null() {
            return Err(fail(if r < 0 { -r } else { libc::ENOENT }, errors_of(&log)));
        }
        // SAFETY: on success the plugin gave `len` readable bytes at `buf`, which are
        // copied and then handed back to the plugin's buffer_free (or zeroed and freed
        // with free(3), libcryptsetup's default).
        let secret = unsafe {
            let secret = Zeroizing::new(std::slice::from_raw_parts(buf.cast::<u8>(), len).to_vec());
            match plugin.buffer_free {
                Some(free) => free(buf.cast(), len),
                None => {
                    std::ptr::write_bytes(buf, 0, len);
                    libc::free(buf.cast());
                }
            }
            secret
        };
        Ok(secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_follow_libcryptsetups_rule() {
        assert!(plugin_name_valid("systemd-tpm2"));
        assert!(plugin_name_valid("my_token-2"));
        for bad in ["", "../x", "a/b", "a.b", "luks2-keyring", &"x".repeat(65)] {
            assert!(!plugin_name_valid(bad), "{bad}");
        }
    }
}
