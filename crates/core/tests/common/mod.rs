//! What several of the library's integration tests share.

use std::path::{Path, PathBuf};
use ucrypt::luks::{CryptDevice, LuksFormat, Pbkdf};

/// A LUKS image of `bytes` made by libcryptsetup (aes-xts-plain64, 512-bit key, PBKDF2 at
/// 1000 iterations), LUKS2 or LUKS1, with a keyslot per passphrase (slot i for passphrase i).
pub fn luks_image(dir: &Path, luks2: bool, bytes: u64, passphrases: &[&[u8]]) -> PathBuf {
    let img = ucrypt_testkit::image(dir, "luks.img", bytes);
    let mut cd = CryptDevice::init(&img).unwrap();
    cd.set_pbkdf(&Pbkdf {
        kind: "pbkdf2".into(),
        iterations: Some(1000),
        ..Pbkdf::default()
    })
    .unwrap();
    cd.format_luks(
        &LuksFormat {
            luks2,
            cipher: "aes-xts-plain64".into(),
            key_bytes: 64,
            ..LuksFormat::default()
        },
        None,
    )
    .unwrap();
    for (i, p) in passphrases.iter().enumerate() {
        let slot = cd
            .add_keyslot_by_volume_key(Some(u32::try_from(i).unwrap()), None, p)
            .unwrap();
        assert_eq!(slot as usize, i);
    }
    img
}
