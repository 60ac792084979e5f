//! Keys from the kernel keyring, as dm-crypt's `:<size>:<type>:<description>` key form
//! names them: the two syscalls (`request_key`, `keyctl(KEYCTL_READ)`) behind a safe call,
//! here beside the other `unsafe` of the key handling ([`crate::secret`]) so that the format
//! layer stays free of `unsafe`.
//!
//! dm-crypt asks the kernel for the key; ucrypt, in userspace, can only read `user` keys
//! (`keyctl add user <desc> <bytes> @u`).
#![allow(unsafe_code)]

use crate::VolumeKey;
use zeroize::Zeroize;

/// Why a keyring key could not be read (messages name the key, never its bytes).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum KeyringError {
    /// The description cannot be passed to the kernel.
    #[error("key description contains a NUL byte")]
    Nul,
    /// `request_key` found no such key.
    #[error("user key \"{description}\" not found in the keyring ({reason})")]
    NotFound {
        /// The key description.
        description: String,
        /// The kernel's error.
        reason: String,
    },
    /// `keyctl(KEYCTL_READ)` refused.
    #[error("cannot read user key \"{description}\" ({reason})")]
    Unreadable {
        /// The key description.
        description: String,
        /// The kernel's error.
        reason: String,
    },
    /// The key has another length than the table says.
    #[error("user key \"{description}\" is {got} bytes, the table says {expected}")]
    Length {
        /// The key description.
        description: String,
        /// Its length.
        got: usize,
        /// The table's length.
        expected: usize,
    },
}

/// Reads the `user` key `description` from the keyrings the process can search.
///
/// # Errors
/// [`KeyringError`] when the key is missing, unreadable, or not `expected_len` bytes.
pub fn read_user_key(description: &str, expected_len: usize) -> Result<VolumeKey, KeyringError> {
    let ty = c"user";
    let desc = std::ffi::CString::new(description).map_err(|_| KeyringError::Nul)?;
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
        return Err(KeyringError::NotFound {
            description: description.to_string(),
            reason: std::io::Error::last_os_error().to_string(),
        });
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
        let reason = std::io::Error::last_os_error().to_string();
        buf.zeroize();
        return Err(KeyringError::Unreadable {
            description: description.to_string(),
            reason,
        });
    }
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    if n != expected_len {
        buf.zeroize();
        return Err(KeyringError::Length {
            description: description.to_string(),
            got: n,
            expected: expected_len,
        });
    }
    buf.truncate(n);
    Ok(VolumeKey::new(buf))
}

/// Reads the `user` key `description`, whatever its length (a passphrase, as a LUKS2
/// `luks2-keyring` token names one), into a buffer zeroed when dropped.
///
/// # Errors
/// [`KeyringError`] when the key is missing or unreadable.
pub fn read_user_secret(description: &str) -> Result<zeroize::Zeroizing<Vec<u8>>, KeyringError> {
    let desc = std::ffi::CString::new(description).map_err(|_| KeyringError::Nul)?;
    // SAFETY: as in read_user_key.
    let serial = unsafe {
        libc::syscall(
            libc::SYS_request_key,
            c"user".as_ptr(),
            desc.as_ptr(),
            std::ptr::null::<u8>(),
            0,
        )
    };
    if serial < 0 {
        return Err(KeyringError::NotFound {
            description: description.to_string(),
            reason: std::io::Error::last_os_error().to_string(),
        });
    }
    let unreadable = || KeyringError::Unreadable {
        description: description.to_string(),
        reason: std::io::Error::last_os_error().to_string(),
    };
    // The length first (a read into no buffer returns it), then the bytes; a key that
    // grows in between is read again.
    let mut buf = zeroize::Zeroizing::new(Vec::new());
    loop {
        // SAFETY: keyctl(KEYCTL_READ) writes at most buf.len() bytes into buf (a null
        // pointer with length 0 only asks for the length).
        let n = unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                libc::KEYCTL_READ,
                serial,
                if buf.is_empty() {
                    std::ptr::null_mut()
                } else {
                    buf.as_mut_ptr()
                },
                buf.len(),
            )
        };
        let n = usize::try_from(n).map_err(|_| unreadable())?;
        if n <= buf.len() {
            buf.truncate(n);
            return Ok(buf);
        }
        buf.zeroize();
        *buf = vec![0u8; n];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_key_and_a_nul_in_the_description_are_named() {
        let e = read_user_key("ucrypt-test-no-such-key-\u{1}", 32).unwrap_err();
        assert!(matches!(e, KeyringError::NotFound { .. }), "{e}");
        assert!(e.to_string().contains("ucrypt-test-no-such-key"), "{e}");
        assert_eq!(read_user_key("a\0b", 32).unwrap_err(), KeyringError::Nul);
    }
}
