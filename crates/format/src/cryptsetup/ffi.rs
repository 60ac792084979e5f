//! Hand-written declarations for the part of libcryptsetup (2.6, `libcryptsetup.h`) that
//! ucrypt calls. Written by hand instead of bindgen so the build needs no clang; every
//! struct below mirrors the header's layout field by field (`#[repr(C)]`).
//!
//! Only [`super::device`] calls these; it documents each call's contract.

#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_void, size_t};

/// Opaque `struct crypt_device`.
#[repr(C)]
pub struct crypt_device {
    _private: [u8; 0],
}

/// `struct crypt_pbkdf_type`.
#[repr(C)]
pub struct crypt_pbkdf_type {
    pub type_: *const c_char,
    pub hash: *const c_char,
    pub time_ms: u32,
    pub iterations: u32,
    pub max_memory_kb: u32,
    pub parallel_threads: u32,
    pub flags: u32,
}

/// `struct crypt_params_luks1`.
#[repr(C)]
pub struct crypt_params_luks1 {
    pub hash: *const c_char,
    pub data_alignment: size_t,
    pub data_device: *const c_char,
}

/// `struct crypt_params_luks2`.
#[repr(C)]
pub struct crypt_params_luks2 {
    pub pbkdf: *const crypt_pbkdf_type,
    pub integrity: *const c_char,
    pub integrity_params: *const c_void,
    pub data_alignment: size_t,
    pub data_device: *const c_char,
    pub sector_size: u32,
    pub label: *const c_char,
    pub subsystem: *const c_char,
}

/// `struct crypt_params_plain`.
#[repr(C)]
pub struct crypt_params_plain {
    pub hash: *const c_char,
    pub offset: u64,
    pub skip: u64,
    pub size: u64,
    pub sector_size: u32,
}

/// `CRYPT_ANY_SLOT`.
pub const CRYPT_ANY_SLOT: c_int = -1;
/// `CRYPT_PBKDF_NO_BENCHMARK`.
pub const CRYPT_PBKDF_NO_BENCHMARK: u32 = 1 << 1;
/// `CRYPT_LOG_ERROR`.
pub const CRYPT_LOG_ERROR: c_int = 1;
/// `CRYPT_LOG_NORMAL`.
pub const CRYPT_LOG_NORMAL: c_int = 0;
/// `CRYPT_LOG_VERBOSE`.
pub const CRYPT_LOG_VERBOSE: c_int = 2;
/// `crypt_flags_type::CRYPT_FLAGS_ACTIVATION`.
pub const CRYPT_FLAGS_ACTIVATION: c_int = 0;
/// `crypt_flags_type::CRYPT_FLAGS_REQUIREMENTS`.
pub const CRYPT_FLAGS_REQUIREMENTS: c_int = 1;

/// Log callback type.
pub type LogFn = unsafe extern "C" fn(level: c_int, msg: *const c_char, usrptr: *mut c_void);

#[link(name = "cryptsetup")]
extern "C" {
    pub fn crypt_init(cd: *mut *mut crypt_device, device: *const c_char) -> c_int;
    pub fn crypt_init_data_device(
        cd: *mut *mut crypt_device,
        device: *const c_char,
        data_device: *const c_char,
    ) -> c_int;
    pub fn crypt_free(cd: *mut crypt_device);
    pub fn crypt_set_log_callback(cd: *mut crypt_device, log: Option<LogFn>, usrptr: *mut c_void);
    pub fn crypt_metadata_locking(cd: *mut crypt_device, enable: c_int) -> c_int;
    pub fn crypt_load(
        cd: *mut crypt_device,
        requested_type: *const c_char,
        params: *mut c_void,
    ) -> c_int;
    pub fn crypt_format(
        cd: *mut crypt_device,
        type_: *const c_char,
        cipher: *const c_char,
        cipher_mode: *const c_char,
        uuid: *const c_char,
        volume_key: *const c_char,
        volume_key_size: size_t,
        params: *mut c_void,
    ) -> c_int;
    pub fn crypt_set_pbkdf_type(cd: *mut crypt_device, pbkdf: *const crypt_pbkdf_type) -> c_int;
    pub fn crypt_keyslot_add_by_volume_key(
        cd: *mut crypt_device,
        keyslot: c_int,
        volume_key: *const c_char,
        volume_key_size: size_t,
        passphrase: *const c_char,
        passphrase_size: size_t,
    ) -> c_int;
    pub fn crypt_keyslot_add_by_passphrase(
        cd: *mut crypt_device,
        keyslot: c_int,
        passphrase: *const c_char,
        passphrase_size: size_t,
        new_passphrase: *const c_char,
        new_passphrase_size: size_t,
    ) -> c_int;
    pub fn crypt_keyslot_change_by_passphrase(
        cd: *mut crypt_device,
        keyslot_old: c_int,
        keyslot_new: c_int,
        passphrase: *const c_char,
        passphrase_size: size_t,
        new_passphrase: *const c_char,
        new_passphrase_size: size_t,
    ) -> c_int;
    pub fn crypt_keyslot_destroy(cd: *mut crypt_device, keyslot: c_int) -> c_int;
    pub fn crypt_keyslot_status(cd: *mut crypt_device, keyslot: c_int) -> c_int;
    pub fn crypt_keyslot_max(type_: *const c_char) -> c_int;
    pub fn crypt_activate_by_passphrase(
        cd: *mut crypt_device,
        name: *const c_char,
        keyslot: c_int,
        passphrase: *const c_char,
        passphrase_size: size_t,
        flags: u32,
    ) -> c_int;
    pub fn crypt_volume_key_get(
        cd: *mut crypt_device,
        keyslot: c_int,
        volume_key: *mut c_char,
        volume_key_size: *mut size_t,
        passphrase: *const c_char,
        passphrase_size: size_t,
    ) -> c_int;
    pub fn crypt_volume_key_verify(
        cd: *mut crypt_device,
        volume_key: *const c_char,
        volume_key_size: size_t,
    ) -> c_int;
    pub fn crypt_get_type(cd: *mut crypt_device) -> *const c_char;
    pub fn crypt_get_cipher(cd: *mut crypt_device) -> *const c_char;
    pub fn crypt_get_cipher_mode(cd: *mut crypt_device) -> *const c_char;
    pub fn crypt_get_uuid(cd: *mut crypt_device) -> *const c_char;
    pub fn crypt_get_label(cd: *mut crypt_device) -> *const c_char;
    pub fn crypt_get_data_offset(cd: *mut crypt_device) -> u64;
    pub fn crypt_get_iv_offset(cd: *mut crypt_device) -> u64;
    pub fn crypt_get_volume_key_size(cd: *mut crypt_device) -> c_int;
    pub fn crypt_get_sector_size(cd: *mut crypt_device) -> c_int;
    pub fn crypt_get_metadata_size(
        cd: *mut crypt_device,
        metadata_size: *mut u64,
        keyslots_size: *mut u64,
    ) -> c_int;
    pub fn crypt_persistent_flags_get(
        cd: *mut crypt_device,
        type_: c_int,
        flags: *mut u32,
    ) -> c_int;
    pub fn crypt_dump(cd: *mut crypt_device) -> c_int;
    pub fn crypt_dump_json(cd: *mut crypt_device, json: *mut *const c_char, flags: u32) -> c_int;
    pub fn crypt_header_backup(
        cd: *mut crypt_device,
        requested_type: *const c_char,
        backup_file: *const c_char,
    ) -> c_int;
    pub fn crypt_header_restore(
        cd: *mut crypt_device,
        requested_type: *const c_char,
        backup_file: *const c_char,
    ) -> c_int;
    pub fn crypt_set_uuid(cd: *mut crypt_device, uuid: *const c_char) -> c_int;
    pub fn crypt_set_label(
        cd: *mut crypt_device,
        label: *const c_char,
        subsystem: *const c_char,
    ) -> c_int;
}
