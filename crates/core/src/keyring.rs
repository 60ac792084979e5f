//! Adding a volume key to a kernel keyring (`--link-vk-to-keyring KEYRING::KEY`, cryptsetup
//! 2.7's option): the value's form (cryptsetup's rules: `::` separates the keyring from the
//! key; a `%type:` prefix on the keyring is ignored; the key type defaults to `user`) and the
//! `add_key(2)` call.

use crate::error::{Error, Result};
use crate::Unlocked;

/// A parsed `--link-vk-to-keyring` value.
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct KeyringLink {
    /// `@u`, `@s`, `@p`, `@t`, `@us`, `@g`, a number or a keyring's name.
    pub keyring: String,
    /// The key's type (`user` by default, `logon`...).
    pub key_type: String,
    /// The key's description.
    pub description: String,
}

/// A malformed value (cryptsetup's EINVAL).
fn invalid() -> Error {
    Error::Invalid("invalid --link-vk-to-keyring value (expected KEYRING::KEY)".into())
}

impl KeyringLink {
    /// Parses `KEYRING::KEY` (`KEY` optionally `%TYPE:DESCRIPTION`).
    ///
    /// # Errors
    /// A malformed value.
    pub fn parse(spec: &str) -> Result<KeyringLink> {
        let (keyring, key) = spec.split_once("::").ok_or_else(invalid)?;
        let (key_type, description) = match key.strip_prefix('%') {
            Some(typed) => {
                let (t, d) = typed.split_once(':').ok_or_else(invalid)?;
                (t.to_string(), d.to_string())
            }
            None => ("user".to_string(), key.to_string()),
        };
        let keyring = match keyring.strip_prefix('%') {
            Some(typed) => typed.split_once(':').ok_or_else(invalid)?.1,
            None => keyring,
        };
        if keyring.is_empty() || description.is_empty() || key_type.is_empty() {
            return Err(invalid());
        }
        Ok(KeyringLink {
            keyring: keyring.to_string(),
            key_type,
            description,
        })
    }

    /// The keyring's serial: a special keyring (`@u`...), a number, or a keyring of that
    /// name found in the process's keyrings (`request_key`, no upcall).
    fn keyring_id(&self) -> Result<libc::c_long> {
        let special = match self.keyring.as_str() {
            "@t" => Some(-1),
            "@p" => Some(-2),
            "@s" => Some(-3),
            "@u" => Some(-4),
            "@us" => Some(-5),
            "@g" => Some(-6),
            _ => None,
        };
        if let Some(id) = special {
            return Ok(id);
        }
        let number = match self.keyring.strip_prefix("0x") {
            Some(hex) => libc::c_long::from_str_radix(hex, 16).ok(),
            None => self.keyring.parse().ok(),
        };
        if let Some(id) = number {
            return Ok(id);
        }
        let name = std::ffi::CString::new(self.keyring.as_str()).map_err(|_| invalid())?;
        // SAFETY: request_key(2) with NUL-terminated type and description, no callout
        // information and no destination keyring.
        let r = unsafe {
            libc::syscall(
                libc::SYS_request_key,
                c"keyring".as_ptr(),
                name.as_ptr(),
                std::ptr::null::<libc::c_char>(),
                0,
            )
        };
        if r < 0 {
            return Err(Error::Invalid(format!(
                "no keyring named {} in this process's keyrings: {}",
                self.keyring,
                std::io::Error::last_os_error()
            )));
        }
        Ok(r)
    }

    /// Adds `key` to the keyring; returns the new key's serial.
    ///
    /// # Errors
    /// A keyring that does not exist, or the kernel's refusal.
    pub fn add(&self, key: &[u8]) -> Result<i64> {
        let keyring = self.keyring_id()?;
        let ty = std::ffi::CString::new(self.key_type.as_str()).map_err(|_| invalid())?;
        let desc = std::ffi::CString::new(self.description.as_str()).map_err(|_| invalid())?;
        // SAFETY: add_key(2) with NUL-terminated type and description and a payload valid
        // for its length; the kernel copies the payload.
        let r = unsafe {
            libc::syscall(
                libc::SYS_add_key,
                ty.as_ptr(),
                desc.as_ptr(),
                key.as_ptr(),
                key.len(),
                keyring,
            )
        };
        if r < 0 {
            return Err(Error::Invalid(format!(
                "cannot link the volume key to keyring {} as {}:{}: {}",
                self.keyring,
                self.key_type,
                self.description,
                std::io::Error::last_os_error()
            )));
        }
        Ok(r)
    }

    /// Adds the volume key of `unlocked` (its top table's first line) to the keyring.
    ///
    /// # Errors
    /// As [`KeyringLink::add`]; a key that is itself in a keyring has nothing to link.
    pub fn add_unlocked(&self, unlocked: &Unlocked) -> Result<i64> {
        match &unlocked.first_line().key {
            ucrypt_format::KeySource::Hex(k) => self.add(k.as_bytes()),
            ucrypt_format::KeySource::Keyring { .. } => Err(Error::Invalid(
                "the volume key is already in a kernel keyring; nothing to link".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KeyringLink;

    fn parse(s: &str) -> Option<(String, String, String)> {
        KeyringLink::parse(s)
            .ok()
            .map(|l| (l.keyring, l.key_type, l.description))
    }

    #[test]
    fn link_values_parse_as_cryptsetups() {
        let t = |a: &str, b: &str, c: &str| Some((a.into(), b.into(), c.into()));
        assert_eq!(parse("@u::vk"), t("@u", "user", "vk"));
        assert_eq!(parse("@s::%logon:cs:vk"), t("@s", "logon", "cs:vk"));
        assert_eq!(parse("%keyring:mine::vk"), t("mine", "user", "vk"));
        assert_eq!(parse("%:mine::vk"), t("mine", "user", "vk"));
        assert_eq!(parse("123::vk"), t("123", "user", "vk"));
        assert_eq!(parse("@u:vk"), None);
        assert_eq!(parse("@u::"), None);
        assert_eq!(parse("::vk"), None);
        assert_eq!(parse("@u::%logon"), None);
    }
}
