//! Keys from the kernel keyring, as dm-crypt's `:<size>:<type>:<description>` key form.
//!
//! dm-crypt asks the kernel for the key; ucrypt, in userspace, can only read `user` keys
//! (`keyctl add user <desc> <bytes> @u`). A `logon` key is by design unreadable from
//! userspace, so such a table cannot be served by ucrypt: the error says so.
#![allow(unsafe_code)]

use crate::FormatError;
use ucrypt_crypto::VolumeKey;
use zeroize::Zeroize;

/// Reads the `user` key `description` from the keyrings the process can search.
///
/// # Errors
/// [`FormatError::Key`] when the key is missing, unreadable, or not `expected_len` bytes.
pub fn read_user_key(description: &str, expected_len: usize) -> Result<VolumeKey, FormatError> {
    let ty = c"user";
    let desc = std::ffi::CString::new(description)
        .map_err(|_| FormatError::Key("key description contains a NUL byte".into()))?;
    // SAFETY: request_key(2) with valid NUL-terminated strings, no callout info and
    // destination keyring 0 (none); it only reads its arguments.
    let serial = unsafe {
        libc::syscall(
            libc::SYS_request_key,
            ty.as_ptr(),
            desc.as_ptr(),
            std::ptr::null::<u8>(),
            0,
        )
    };
    if serial < 0 {
        let err = std::io::Error::last_os_error();
        return Err(FormatError::Key(format!(
            "user key \"{description}\" not found in the keyring ({err})"
        )));
    }
    let mut buf = vec![0u8; expected_len.max(1) + 1];
    // SAFETY: keyctl(KEYCTL_READ) writes at most buf.len() bytes into buf, which is live and
    // writable for that length; it returns the key's full length.
    let n = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            libc::KEYCTL_READ,
            serial,
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        buf.zeroize();
        return Err(FormatError::Key(format!(
            "cannot read user key \"{description}\" ({err})"
        )));
    }
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    if n != expected_len {
        buf.zeroize();
        return Err(FormatError::Key(format!(
            "user key \"{description}\" is {n} bytes, the table says {expected_len}"
        )));
    }
    buf.truncate(n);
    Ok(VolumeKey::new(buf))
}
