//! cryptsetup's unlock options of `open` (and its `luksOpen` form) that are about the
//! passphrase check rather than the mapping: `--unbound` (test a passphrase against an
//! unbound LUKS2 keyslot), `--serialize-memory-hard-pbkdf` (one Argon2 derivation at a
//! time on the machine, cryptsetup's own lock) and `--link-vk-to-keyring` (the unlocked
//! volume key added to a kernel keyring, cryptsetup 2.7). What they do is the library's
//! (`ucrypt::unlock::Request`).

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

/// Checks a `--link-vk-to-keyring` value's form before anything else runs.
///
/// # Errors
/// A malformed value (exit 1).
pub(crate) fn check_link_spec(spec: &str) -> Result<(), CliError> {
    KeyringLink::parse(spec).map(|_| ()).code(EXIT_PARAMS)
}
