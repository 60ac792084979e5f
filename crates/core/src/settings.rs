//! Process-wide switches a program sets once, before its first operation: libcryptsetup's
//! debug output, keyring, metadata locks and token plugins; mapped reads of image files;
//! Ceph's client identity and librbd's write-through. The command line sets them from its
//! global options; a program embedding the library sets those it needs.

use std::path::{Path, PathBuf};

/// Turns on libcryptsetup's debug messages (`json`: with its JSON metadata dumps).
pub fn set_cryptsetup_debug(json: bool) {
    ucrypt_cryptsetup::set_debug(json);
}

/// Where libcryptsetup looks for external token plugins.
pub fn external_tokens_dir() -> String {
    ucrypt_cryptsetup::external_tokens_dir()
}

/// Volume keys are not loaded into the kernel keyring (cryptsetup's `--disable-keyring`).
pub fn disable_volume_key_keyring() {
    ucrypt_cryptsetup::disable_volume_key_keyring();
}

/// libcryptsetup takes no metadata locks (cryptsetup's `--disable-locks`).
pub fn disable_metadata_locking() {
    ucrypt_cryptsetup::disable_metadata_locking();
}

/// No external token plugins are loaded (cryptsetup's `--disable-external-tokens`).
pub fn disable_external_tokens() {
    ucrypt_cryptsetup::disable_external_tokens();
}

/// Loads external token plugins from `dir` (cryptsetup's `--external-tokens-path`).
///
/// # Errors
/// The libcryptsetup in use cannot change the path, or refuses `dir`.
pub fn set_external_tokens_path(dir: &Path) -> crate::Result<()> {
    Ok(ucrypt_cryptsetup::set_external_tokens_path(dir)?)
}

/// Lets image files be read through a mapping: installs the SIGBUS handler that turns a
/// read past a file truncated under the mapping into an I/O error (without it files are
/// read with `pread`).
///
/// # Errors
/// The handler cannot be installed.
pub fn install_sigbus_handler() -> std::io::Result<()> {
    ucrypt_backend::install_sigbus_handler()
}

/// How `rbd:` devices reach the Ceph cluster when their URI does not say.
#[derive(Debug, Clone, Default)]
pub struct CephClient {
    /// `ceph.conf` to read (librados' search path when `None`).
    pub conf: Option<PathBuf>,
    /// Client id without `client.` (`admin` when `None`), like `rbd --id`.
    pub id: Option<String>,
    /// Keyring file (from the configuration when `None`).
    pub keyring: Option<PathBuf>,
}

/// Sets the Ceph client of `rbd:` devices opened from now on.
pub fn set_ceph_client(c: CephClient) {
    ucrypt_backend::rbd::set_defaults(ucrypt_backend::rbd::RbdDefaults {
        conf: c.conf,
        id: c.id,
        keyring: c.keyring,
    });
}

/// librbd acknowledges a write only once every OSD has it (for a device that outlives
/// its server: ublk, kernel NBD).
pub fn set_rbd_writethrough(on: bool) {
    ucrypt_backend::rbd::set_writethrough(on);
}
