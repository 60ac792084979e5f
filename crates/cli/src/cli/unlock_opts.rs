//! cryptsetup's unlock options of `open` (and its `luksOpen` form) that are about the
//! passphrase check rather than the mapping: `--unbound` (test a passphrase against an
//! unbound LUKS2 keyslot), `--serialize-memory-hard-pbkdf` (one Argon2 derivation at a
//! time on the machine, cryptsetup's own lock) and `--link-vk-to-keyring` (the unlocked
//! volume key added to a kernel keyring, cryptsetup 2.7).

use super::{CliError, WithCode, EXIT_PARAMS};

/// The options, flattened into `open` and `luksOpen`.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct UnlockOpts {
    /// With --test-passphrase: the passphrase may open an unbound LUKS2 keyslot (one that
    /// holds no volume key of the data, as `luksAddKey --unbound` makes).
    #[arg(
        long,
        requires = "test_passphrase",
        conflicts_with = "link_vk_to_keyring"
    )]
    pub(crate) unbound: bool,
    /// Take cryptsetup's global lock (/run/cryptsetup/memory-hard-access) while the
    /// passphrase is derived, so that parallel unlocks run their memory-hard PBKDFs one at
    /// a time (the OOM workaround of cryptsetup's flag of the same name).
    #[arg(long)]
    pub(crate) serialize_memory_hard_pbkdf: bool,
    /// KEYRING::KEY: add the unlocked volume key to a kernel keyring (KEYRING: @u, @s, @p,
    /// @t, @us, @g, a numeric id or a keyring's name; KEY: a description, optionally
    /// prefixed with %TYPE:, type user by default), as cryptsetup 2.7's option of this name.
    #[arg(long, value_name = "KEYRING::KEY")]
    pub(crate) link_vk_to_keyring: Option<String>,
}

/// cryptsetup's memory-hard PBKDF lock: libcryptsetup flocks this file (`crypt_write_lock`
/// on resource `memory-hard-access` in its lock directory).
const SERIALIZE_LOCK: &str = "/run/cryptsetup/memory-hard-access";

/// Held while a passphrase is derived; the lock goes with the file when dropped.
pub(crate) struct SerializeLock(#[allow(dead_code)] Option<std::fs::File>);

impl UnlockOpts {
    /// With `--serialize-memory-hard-pbkdf`: waits for and takes the global lock.
    ///
    /// # Errors
    /// The lock file cannot be created or locked (exit 1, as cryptsetup's "Failed to acquire
    /// global memory-hard access serialization lock").
    pub(crate) fn serialize(&self) -> Result<SerializeLock, CliError> {
        if !self.serialize_memory_hard_pbkdf {
            return Ok(SerializeLock(None));
        }
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let file = std::fs::create_dir_all("/run/cryptsetup")
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(SERIALIZE_LOCK)
            })
            .and_then(|f| {
                super::debug(format_args!(
                    "Taking global memory-hard access serialization lock {SERIALIZE_LOCK}."
                ));
                // SAFETY: flock on a descriptor this function owns.
                if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                    Ok(f)
                } else {
                    Err(std::io::Error::last_os_error())
                }
            })
            .map_err(|e| {
                anyhow::anyhow!(
                    "failed to acquire the global memory-hard access serialization lock \
                     {SERIALIZE_LOCK}: {e}"
                )
            })
            .code(EXIT_PARAMS)?;
        Ok(SerializeLock(Some(file)))
    }

    /// `--unbound` is for LUKS only (cryptsetup: "Option --unbound is allowed only for open
    /// of luks device.").
    ///
    /// # Errors
    /// `--unbound` with another type (exit 1).
    pub(crate) fn check_kind(&self, kind: ucrypt::VolumeType) -> Result<(), CliError> {
        use ucrypt::VolumeType::{Luks, Luks1, Luks2};
        if self.unbound && !matches!(kind, Luks | Luks1 | Luks2) {
            return Err(anyhow::anyhow!(
                "option --unbound is allowed only for open of LUKS devices"
            ))
            .code(EXIT_PARAMS);
        }
        Ok(())
    }

    /// With `--link-vk-to-keyring`: adds the volume key of `unlocked` to the keyring.
    ///
    /// # Errors
    /// As [`UnlockOpts::link`].
    pub(crate) fn link_unlocked(&self, unlocked: &ucrypt::Unlocked) -> Result<(), CliError> {
        if self.link_vk_to_keyring.is_none() {
            return Ok(());
        }
        match &unlocked.first_line().key {
            ucrypt_format::KeySource::Hex(k) => self.link(k.as_bytes()),
            ucrypt_format::KeySource::Keyring { .. } => Err(anyhow::anyhow!(
                "the volume key is already in a kernel keyring; nothing to link"
            ))
            .code(EXIT_PARAMS),
        }
    }

    /// With `--link-vk-to-keyring`: adds `key` to the keyring it names.
    ///
    /// # Errors
    /// A malformed value or a keyring that does not exist (exit 1), or the kernel's refusal.
    pub(crate) fn link(&self, key: &[u8]) -> Result<(), CliError> {
        let Some(spec) = &self.link_vk_to_keyring else {
            return Ok(());
        };
        let link = KeyringLink::parse(spec)?;
        let keyring = link.keyring_id()?;
        let ty = std::ffi::CString::new(link.key_type.as_str()).map_err(|_| invalid())?;
        let desc = std::ffi::CString::new(link.description.as_str()).map_err(|_| invalid())?;
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
            return Err(anyhow::anyhow!(
                "cannot link the volume key to keyring {} as {}:{}: {}",
                link.keyring,
                link.key_type,
                link.description,
                std::io::Error::last_os_error()
            ))
            .code(EXIT_PARAMS);
        }
        super::debug(format_args!(
            "Volume key linked to keyring {} as {}:{} (key id {r}).",
            link.keyring, link.key_type, link.description
        ));
        Ok(())
    }
}

/// Checks a `--link-vk-to-keyring` value's form before anything else runs.
///
/// # Errors
/// A malformed value (exit 1).
pub(crate) fn check_link_spec(spec: &str) -> Result<(), CliError> {
    KeyringLink::parse(spec).map(|_| ())
}

/// A malformed `--link-vk-to-keyring` value (exit 1, as cryptsetup's EINVAL).
fn invalid() -> CliError {
    anyhow::anyhow!("invalid --link-vk-to-keyring value (expected KEYRING::KEY)").into()
}

/// A parsed `--link-vk-to-keyring` value (cryptsetup's rules: `::` separates the keyring
/// from the key; a `%type:` prefix on the keyring is ignored; the key type defaults to
/// `user`).
#[derive(Debug, PartialEq, Eq)]
struct KeyringLink {
    keyring: String,
    key_type: String,
    description: String,
}

impl KeyringLink {
    fn parse(spec: &str) -> Result<KeyringLink, CliError> {
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
    fn keyring_id(&self) -> Result<libc::c_long, CliError> {
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
            return Err(anyhow::anyhow!(
                "no keyring named {} in this process's keyrings: {}",
                self.keyring,
                std::io::Error::last_os_error()
            ))
            .code(EXIT_PARAMS);
        }
        Ok(r)
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
