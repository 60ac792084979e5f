//! cryptsetup's unlock options of `open` (and its `luksOpen` form) that are about the
//! passphrase check rather than the mapping: `--unbound` (test a passphrase against an
//! unbound LUKS2 keyslot), `--serialize-memory-hard-pbkdf` (one Argon2 derivation at a
//! time on the machine, cryptsetup's own lock) and `--link-vk-to-keyring` (the unlocked
//! volume key added to a kernel keyring, cryptsetup 2.7).

use super::{CliError, WithCode, EXIT_PARAMS};
use ucrypt::keyring::KeyringLink;

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
        let Some(spec) = &self.link_vk_to_keyring else {
            return Ok(());
        };
        let link = KeyringLink::parse(spec).code(EXIT_PARAMS)?;
        let id = link.add_unlocked(unlocked).code(EXIT_PARAMS)?;
        linked(&link, id);
        Ok(())
    }
}

/// The `--debug` line of a linked key.
fn linked(link: &KeyringLink, id: i64) {
    super::debug(format_args!(
        "Volume key linked to keyring {} as {}:{} (key id {id}).",
        link.keyring, link.key_type, link.description
    ));
}

/// Checks a `--link-vk-to-keyring` value's form before anything else runs.
///
/// # Errors
/// A malformed value (exit 1).
pub(crate) fn check_link_spec(spec: &str) -> Result<(), CliError> {
    KeyringLink::parse(spec).map(|_| ()).code(EXIT_PARAMS)
}
