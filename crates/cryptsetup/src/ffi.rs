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

/// Opaque `struct crypt_keyslot_context` (libcryptsetup 2.6).
#[repr(C)]
pub struct crypt_keyslot_context {
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

/// `struct crypt_token_params_luks2_keyring`.
#[repr(C)]
pub struct crypt_token_params_luks2_keyring {
    pub key_description: *const c_char,
}

/// `struct crypt_params_reencrypt` (`mode` and `direction` are C enums: `int`).
#[repr(C)]
pub struct crypt_params_reencrypt {
    pub mode: c_int,
    pub direction: c_int,
    pub resilience: *const c_char,
    pub hash: *const c_char,
    pub data_shift: u64,
    pub max_hotzone_size: u64,
    pub device_size: u64,
    pub luks2: *const crypt_params_luks2,
    pub flags: u32,
}

/// `CRYPT_REENCRYPT_INITIALIZE_ONLY`.
pub const CRYPT_REENCRYPT_INITIALIZE_ONLY: u32 = 1;
/// `CRYPT_REENCRYPT_MOVE_FIRST_SEGMENT`.
pub const CRYPT_REENCRYPT_MOVE_FIRST_SEGMENT: u32 = 1 << 1;
/// `CRYPT_REENCRYPT_REENCRYPT` (`crypt_reencrypt_mode_info`).
pub const CRYPT_REENCRYPT_REENCRYPT: c_int = 0;
/// `CRYPT_REENCRYPT_ENCRYPT`.
pub const CRYPT_REENCRYPT_ENCRYPT: c_int = 1;
/// `CRYPT_REENCRYPT_DECRYPT`.
pub const CRYPT_REENCRYPT_DECRYPT: c_int = 2;
/// `CRYPT_REENCRYPT_FORWARD` (`crypt_reencrypt_direction_info`).
pub const CRYPT_REENCRYPT_FORWARD: c_int = 0;
/// `CRYPT_REENCRYPT_BACKWARD`.
pub const CRYPT_REENCRYPT_BACKWARD: c_int = 1;
/// `CRYPT_VOLUME_KEY_NO_SEGMENT`.
pub const CRYPT_VOLUME_KEY_NO_SEGMENT: u32 = 1;

/// `CRYPT_ANY_SLOT`.
pub const CRYPT_ANY_SLOT: c_int = -1;
/// `CRYPT_ANY_TOKEN`.
pub const CRYPT_ANY_TOKEN: c_int = -1;
/// `crypt_keyslot_info::CRYPT_SLOT_INACTIVE`.
pub const CRYPT_SLOT_INACTIVE: c_int = 1;
/// `crypt_token_info::CRYPT_TOKEN_INVALID` (the enum, as `crypt_token_status` returns it).
pub const CRYPT_TOKEN_INVALID: c_int = 0;
/// `crypt_token_info::CRYPT_TOKEN_INACTIVE`.
pub const CRYPT_TOKEN_INACTIVE: c_int = 1;
/// `crypt_token_info::CRYPT_TOKEN_INTERNAL`.
pub const CRYPT_TOKEN_INTERNAL: c_int = 2;
/// `crypt_token_info::CRYPT_TOKEN_INTERNAL_UNKNOWN`.
pub const CRYPT_TOKEN_INTERNAL_UNKNOWN: c_int = 3;
/// `crypt_token_info::CRYPT_TOKEN_EXTERNAL`.
pub const CRYPT_TOKEN_EXTERNAL: c_int = 4;
/// `crypt_token_info::CRYPT_TOKEN_EXTERNAL_UNKNOWN`.
pub const CRYPT_TOKEN_EXTERNAL_UNKNOWN: c_int = 5;
/// `CRYPT_PBKDF_NO_BENCHMARK`.
pub const CRYPT_PBKDF_NO_BENCHMARK: u32 = 1 << 1;
/// `CRYPT_DEBUG_ALL`.
pub const CRYPT_DEBUG_ALL: c_int = -1;
/// `CRYPT_DEBUG_JSON`.
pub const CRYPT_DEBUG_JSON: c_int = -2;
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
    pub fn crypt_get_pbkdf_type(cd: *mut crypt_device) -> *const crypt_pbkdf_type;
    pub fn crypt_benchmark_pbkdf(
        cd: *mut crypt_device,
        pbkdf: *mut crypt_pbkdf_type,
        password: *const c_char,
        password_size: size_t,
        salt: *const c_char,
        salt_size: size_t,
        volume_key_size: size_t,
        progress: Option<unsafe extern "C" fn(time_ms: u32, usrptr: *mut c_void) -> c_int>,
        usrptr: *mut c_void,
    ) -> c_int;
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
    pub fn crypt_keyslot_add_by_key(
        cd: *mut crypt_device,
        keyslot: c_int,
        volume_key: *const c_char,
        volume_key_size: size_t,
        passphrase: *const c_char,
        passphrase_size: size_t,
        flags: u32,
    ) -> c_int;
    pub fn crypt_reencrypt_init_by_passphrase(
        cd: *mut crypt_device,
        name: *const c_char,
        passphrase: *const c_char,
        passphrase_size: size_t,
        keyslot_old: c_int,
        keyslot_new: c_int,
        cipher: *const c_char,
        cipher_mode: *const c_char,
        params: *const crypt_params_reencrypt,
    ) -> c_int;
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
    pub fn crypt_persistent_flags_set(cd: *mut crypt_device, type_: c_int, flags: u32) -> c_int;
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
    pub fn crypt_set_data_offset(cd: *mut crypt_device, data_offset: u64) -> c_int;
    pub fn crypt_convert(cd: *mut crypt_device, type_: *const c_char, params: *mut c_void)
        -> c_int;
    pub fn crypt_repair(cd: *mut crypt_device, type_: *const c_char, params: *mut c_void) -> c_int;
    pub fn crypt_keyslot_get_priority(cd: *mut crypt_device, keyslot: c_int) -> c_int;
    pub fn crypt_keyslot_set_priority(
        cd: *mut crypt_device,
        keyslot: c_int,
        priority: c_int,
    ) -> c_int;
    pub fn crypt_set_label(
        cd: *mut crypt_device,
        label: *const c_char,
        subsystem: *const c_char,
    ) -> c_int;
    pub fn crypt_token_json_get(
        cd: *mut crypt_device,
        token: c_int,
        json: *mut *const c_char,
    ) -> c_int;
    pub fn crypt_token_json_set(cd: *mut crypt_device, token: c_int, json: *const c_char) -> c_int;
    /// Returns a `crypt_token_info` enum value (an `int` in the C ABI).
    pub fn crypt_token_status(
        cd: *mut crypt_device,
        token: c_int,
        type_: *mut *const c_char,
    ) -> c_int;
    pub fn crypt_token_luks2_keyring_set(
        cd: *mut crypt_device,
        token: c_int,
        params: *const crypt_token_params_luks2_keyring,
    ) -> c_int;
    pub fn crypt_token_assign_keyslot(cd: *mut crypt_device, token: c_int, keyslot: c_int)
        -> c_int;
    pub fn crypt_token_unassign_keyslot(
        cd: *mut crypt_device,
        token: c_int,
        keyslot: c_int,
    ) -> c_int;
    pub fn crypt_keyslot_context_init_by_token(
        cd: *mut crypt_device,
        token: c_int,
        type_: *const c_char,
        pin: *const c_char,
        pin_size: size_t,
        usrptr: *mut c_void,
        kc: *mut *mut crypt_keyslot_context,
    ) -> c_int;
    pub fn crypt_keyslot_context_free(kc: *mut crypt_keyslot_context);
    pub fn crypt_token_is_assigned(cd: *mut crypt_device, token: c_int, keyslot: c_int) -> c_int;
    pub fn crypt_keyslot_context_init_by_volume_key(
        cd: *mut crypt_device,
        volume_key: *const c_char,
        volume_key_size: size_t,
        kc: *mut *mut crypt_keyslot_context,
    ) -> c_int;
    pub fn crypt_keyslot_add_by_keyslot_context(
        cd: *mut crypt_device,
        keyslot_existing: c_int,
        kc: *mut crypt_keyslot_context,
        keyslot_new: c_int,
        new_kc: *mut crypt_keyslot_context,
        flags: u32,
    ) -> c_int;
    pub fn crypt_keyslot_set_encryption(
        cd: *mut crypt_device,
        cipher: *const c_char,
        key_size: size_t,
    ) -> c_int;
    pub fn crypt_keyslot_get_key_size(cd: *mut crypt_device, keyslot: c_int) -> c_int;
    pub fn crypt_set_debug_level(level: c_int);
    pub fn crypt_set_metadata_size(
        cd: *mut crypt_device,
        metadata_size: u64,
        keyslots_size: u64,
    ) -> c_int;
    pub fn crypt_set_rng_type(cd: *mut crypt_device, rng_type: c_int);
    pub fn crypt_token_external_disable();
    pub fn crypt_token_external_path() -> *const c_char;
    pub fn crypt_volume_key_keyring(cd: *mut crypt_device, enable: c_int) -> c_int;
}

/// The declarations above against the installed `libcryptsetup.h`: a C program compiled at
/// test time prints every mirrored struct's size, alignment and field offsets and every
/// mirrored constant; each must equal the Rust side. (The functions' signatures are not
/// checked here: the crate's tests call each of them against real headers.)
#[cfg(test)]
mod layout {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::BTreeMap;
    use std::mem::{align_of, offset_of, size_of};

    /// (name, value on the Rust side); the C program prints the same names.
    fn rust_side() -> Vec<(String, i64)> {
        let mut v: Vec<(String, i64)> = Vec::new();
        macro_rules! st {
            ($t:ident { $($f:ident $(= $c:ident)?),* }) => {{
                v.push((format!("sizeof {}", stringify!($t)), size_of::<$t>() as i64));
                v.push((format!("alignof {}", stringify!($t)), align_of::<$t>() as i64));
                $(
                    #[allow(unused_variables)] // shadowed when the C name differs
                    let c_name = stringify!($f);
                    $( let c_name = stringify!($c); )?
                    v.push((format!("offsetof {}.{}", stringify!($t), c_name), offset_of!($t, $f) as i64));
                )*
            }};
        }
        st!(crypt_pbkdf_type { type_ = type, hash, time_ms, iterations, max_memory_kb, parallel_threads, flags });
        st!(crypt_params_luks1 {
            hash,
            data_alignment,
            data_device
        });
        st!(crypt_params_luks2 {
            pbkdf,
            integrity,
            integrity_params,
            data_alignment,
            data_device,
            sector_size,
            label,
            subsystem
        });
        st!(crypt_params_reencrypt {
            mode,
            direction,
            resilience,
            hash,
            data_shift,
            max_hotzone_size,
            device_size,
            luks2,
            flags
        });
        st!(crypt_params_plain {
            hash,
            offset,
            skip,
            size,
            sector_size
        });
        st!(crypt_token_params_luks2_keyring { key_description });
        // An enum returned by value must be an `int` for the declarations above.
        v.push((
            "sizeoftype crypt_token_info".into(),
            size_of::<c_int>() as i64,
        ));
        for (name, value) in [
            ("CRYPT_ANY_SLOT", i64::from(CRYPT_ANY_SLOT)),
            ("CRYPT_ANY_TOKEN", i64::from(CRYPT_ANY_TOKEN)),
            ("CRYPT_DEBUG_ALL", i64::from(CRYPT_DEBUG_ALL)),
            ("CRYPT_DEBUG_JSON", i64::from(CRYPT_DEBUG_JSON)),
            ("CRYPT_SLOT_INACTIVE", i64::from(CRYPT_SLOT_INACTIVE)),
            ("CRYPT_TOKEN_INVALID", i64::from(CRYPT_TOKEN_INVALID)),
            ("CRYPT_TOKEN_INACTIVE", i64::from(CRYPT_TOKEN_INACTIVE)),
            ("CRYPT_TOKEN_INTERNAL", i64::from(CRYPT_TOKEN_INTERNAL)),
            (
                "CRYPT_TOKEN_INTERNAL_UNKNOWN",
                i64::from(CRYPT_TOKEN_INTERNAL_UNKNOWN),
            ),
            ("CRYPT_TOKEN_EXTERNAL", i64::from(CRYPT_TOKEN_EXTERNAL)),
            (
                "CRYPT_TOKEN_EXTERNAL_UNKNOWN",
                i64::from(CRYPT_TOKEN_EXTERNAL_UNKNOWN),
            ),
            (
                "CRYPT_PBKDF_NO_BENCHMARK",
                i64::from(CRYPT_PBKDF_NO_BENCHMARK),
            ),
            ("CRYPT_LOG_ERROR", i64::from(CRYPT_LOG_ERROR)),
            (
                "CRYPT_REENCRYPT_INITIALIZE_ONLY",
                i64::from(CRYPT_REENCRYPT_INITIALIZE_ONLY),
            ),
            (
                "CRYPT_REENCRYPT_REENCRYPT",
                i64::from(CRYPT_REENCRYPT_REENCRYPT),
            ),
            (
                "CRYPT_REENCRYPT_FORWARD",
                i64::from(CRYPT_REENCRYPT_FORWARD),
            ),
            (
                "CRYPT_VOLUME_KEY_NO_SEGMENT",
                i64::from(CRYPT_VOLUME_KEY_NO_SEGMENT),
            ),
            ("CRYPT_LOG_NORMAL", i64::from(CRYPT_LOG_NORMAL)),
            ("CRYPT_LOG_VERBOSE", i64::from(CRYPT_LOG_VERBOSE)),
            ("CRYPT_FLAGS_ACTIVATION", i64::from(CRYPT_FLAGS_ACTIVATION)),
            (
                "CRYPT_FLAGS_REQUIREMENTS",
                i64::from(CRYPT_FLAGS_REQUIREMENTS),
            ),
            (
                "CRYPT_ACTIVATE_ALLOW_DISCARDS",
                i64::from(crate::ACTIVATE_ALLOW_DISCARDS),
            ),
            (
                "CRYPT_ACTIVATE_SAME_CPU_CRYPT",
                i64::from(crate::ACTIVATE_SAME_CPU_CRYPT),
            ),
            (
                "CRYPT_ACTIVATE_SUBMIT_FROM_CRYPT_CPUS",
                i64::from(crate::ACTIVATE_SUBMIT_FROM_CRYPT_CPUS),
            ),
            (
                "CRYPT_ACTIVATE_NO_READ_WORKQUEUE",
                i64::from(crate::ACTIVATE_NO_READ_WORKQUEUE),
            ),
            (
                "CRYPT_ACTIVATE_NO_WRITE_WORKQUEUE",
                i64::from(crate::ACTIVATE_NO_WRITE_WORKQUEUE),
            ),
            (
                "CRYPT_REQUIREMENT_OFFLINE_REENCRYPT",
                i64::from(crate::REQUIREMENT_OFFLINE_REENCRYPT),
            ),
            (
                "CRYPT_REQUIREMENT_ONLINE_REENCRYPT",
                i64::from(crate::REQUIREMENT_ONLINE_REENCRYPT),
            ),
            (
                "CRYPT_REQUIREMENT_UNKNOWN",
                i64::from(crate::REQUIREMENT_UNKNOWN),
            ),
        ] {
            v.push((format!("const {name}"), value));
        }
        v
    }

    /// The C program printing the same names from the header.
    fn c_program(names: &[(String, i64)]) -> String {
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <stdalign.h>\n\
             #include <libcryptsetup.h>\nint main(void) {\n",
        );
        for (name, _) in names {
            let (kind, what) = name.split_once(' ').unwrap();
            let expr = match kind {
                "sizeof" => format!("(long long)sizeof(struct {what})"),
                "sizeoftype" => format!("(long long)sizeof({what})"),
                "alignof" => format!("(long long)alignof(struct {what})"),
                "offsetof" => {
                    let (t, f) = what.split_once('.').unwrap();
                    format!("(long long)offsetof(struct {t}, {f})")
                }
                _ => format!("(long long)({what})"),
            };
            c.push_str(&format!("  printf(\"{name}=%lld\\n\", {expr});\n"));
        }
        c.push_str("  return 0;\n}\n");
        c
    }

    #[test]
    fn declarations_match_libcryptsetup_h() {
        if !ucrypt_testkit::require("cc")
            || !ucrypt_testkit::require_that(
                std::path::Path::new("/usr/include/libcryptsetup.h").exists(),
                "libcryptsetup.h not installed (libcryptsetup-dev)",
            )
        {
            return;
        }
        let want = rust_side();
        let dir = std::env::temp_dir().join(format!("ucrypt-ffi-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
        std::fs::write(&src, c_program(&want)).unwrap();
        let cc = std::process::Command::new("cc")
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(
            cc.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let got: BTreeMap<String, i64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect();
        assert_eq!(got.len(), want.len());
        let wrong: Vec<String> = want
            .iter()
            .filter(|(k, v)| got.get(k) != Some(v))
            .map(|(k, v)| format!("{k}: Rust {v}, libcryptsetup.h {:?}", got.get(k)))
            .collect();
        assert!(wrong.is_empty(), "ffi declarations differ: {wrong:#?}");
    }
}
