//! `journal_crypt`: the journal encrypted on disk as the kernel's dm-integrity encrypts it.
//! The journal is kept in plain text in memory; sections are encrypted on their way to the
//! disk and the whole journal is decrypted when it is read for a replay. Section MACs
//! (`journal_mac`) are computed over the plain text, before encryption.
//!
//! Two kinds, chosen by the cipher's block size as the kernel chooses them:
//! - **stream** (`ctr(aes)`, `chacha20`: block size 1): the journal is XORed with a keystream,
//!   the encryption of zeros with an all-zero IV over the journal's whole pages
//!   (`journal_pages × 4096` bytes) and 32 bytes more; those 32 bytes encrypt the four
//!   commit ids ([`ucrypt_format::integrity::encrypted_commit_ids`]).
//! - **block** (`cbc(aes)`, `xts(aes)`, `ecb(aes)`): each section is encrypted as one
//!   request with its own IV, the first IV-size bytes of the encryption (all-zero IV) of
//!   `le32(section)` padded with zeros to the IV size rounded up to the block size. The
//!   commit ids are the kernel's defaults.
//!
//! The ciphers are `ucrypt-crypto`'s modes over RustCrypto's AES (and the other block
//! ciphers it has); any other cipher name is refused by name.

use std::fmt;
use ucrypt_crypto::mode::{ChainMode, Mode};
use ucrypt_format::integrity::{encrypted_commit_ids, CommitIds, JournalShape, COMMIT_IDS};
use zeroize::Zeroizing;

/// The cipher names accepted, for messages.
pub const JOURNAL_CRYPT_NAMES: &str = "ctr(aes), chacha20 (stream ciphers), cbc(aes), xts(aes), \
     ecb(aes) (block ciphers; another block cipher in place of aes, e.g. serpent), or \
     integritysetup's spelling ctr-aes, cbc-aes, xts-aes";

/// A `journal_crypt` cipher name as the kernel takes it: `MODE(CIPHER)` or `chacha20`;
/// integritysetup's `MODE-CIPHER` spelling is accepted too and given back in the kernel's.
///
/// # Errors
/// A name ucrypt does not implement for the journal, with the names it does.
pub fn kernel_cipher_name(name: &str) -> Result<String, String> {
    parse(name).map(|(mode, cipher)| match mode {
        ChainMode::Chacha20 => "chacha20".to_string(),
        m => format!("{}({cipher})", m.name()),
    })
}

fn parse(name: &str) -> Result<(ChainMode, String), String> {
    let refuse = || {
        Err(format!(
            "journal encryption \"{name}\" is not supported (ucrypt has {JOURNAL_CRYPT_NAMES})"
        ))
    };
    if name == "chacha20" {
        return Ok((ChainMode::Chacha20, String::new()));
    }
    let (mode, cipher) = if let Some(rest) = name.strip_suffix(')') {
        match rest.split_once('(') {
            Some((m, c)) if !c.contains(['(', ')']) => (m, c),
            _ => return refuse(),
        }
    } else {
        match name.split_once('-') {
            Some((m, c)) if !c.contains('-') => (m, c),
            _ => return refuse(),
        }
    };
    let Ok(mode) = ChainMode::parse(mode) else {
        return refuse();
    };
    match mode {
        ChainMode::Ctr | ChainMode::Cbc | ChainMode::Xts | ChainMode::Ecb if !cipher.is_empty() => {
            Ok((mode, cipher.to_string()))
        }
        _ => refuse(),
    }
}

enum Kind {
    /// The keystream over the journal's bytes (XORed in both directions).
    Stream(Zeroizing<Vec<u8>>),
    /// Each section with its IV.
    Block {
        mode: Box<dyn Mode>,
        iv_size: usize,
        /// Section i's IV at `ivs[i * iv_size..]`.
        ivs: Vec<u8>,
    },
}

/// A keyed `journal_crypt` for one journal's shape. See the [module docs](self).
pub struct JournalCrypt {
    name: String,
    kind: Kind,
    ids: CommitIds,
    section_bytes: usize,
}

impl fmt::Debug for JournalCrypt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalCrypt")
            .field("cipher", &self.name)
            .finish_non_exhaustive()
    }
}

impl JournalCrypt {
    /// Keys `name` (a kernel or integritysetup cipher name) with `key` for a journal of
    /// `shape`.
    ///
    /// # Errors
    /// A cipher ucrypt does not implement, or a key of the wrong length for it.
    pub fn new(name: &str, key: &[u8], shape: &JournalShape) -> Result<JournalCrypt, String> {
        let (mode, cipher) = parse(name)?;
        let kernel = kernel_cipher_name(name)?;
        let built = mode
            .build(&cipher, key)
            .map_err(|e| format!("journal encryption {kernel}: {e}"))?;
        let section_bytes = shape.section_sectors as usize * 512;
        let journal_bytes = shape.sections as usize * section_bytes;
        let iv_size = built.iv_size();
        match mode {
            ChainMode::Ctr | ChainMode::Chacha20 => {
                // The kernel's journal_pages: the journal rounded up to whole 4 KiB pages.
                let pages = journal_bytes.div_ceil(4096);
                let mut ks = Zeroizing::new(vec![0u8; pages * 4096 + 32]);
                let iv = vec![0u8; iv_size];
                built.encrypt(&iv, &mut ks);
                let mut tail = [0u8; 32];
                tail.copy_from_slice(&ks[pages * 4096..]);
                let ids = encrypted_commit_ids(&tail);
                ks.truncate(journal_bytes);
                Ok(JournalCrypt {
                    name: kernel,
                    kind: Kind::Stream(ks),
                    ids,
                    section_bytes,
                })
            }
            _ => {
                let block = match mode {
                    ChainMode::Ecb => 1,
                    _ => iv_size.max(1),
                };
                // crypt_len = roundup(ivsize, blocksize): the IV sizes here are one block.
                let crypt_len = iv_size.div_ceil(block) * block;
                let mut ivs = vec![0u8; shape.sections as usize * iv_size];
                let zero_iv = vec![0u8; iv_size];
                for i in 0..shape.sections {
                    let mut data = vec![0u8; crypt_len.max(4)];
                    data[..4].copy_from_slice(&i.to_le_bytes());
                    data.truncate(crypt_len);
                    if crypt_len > 0 {
                        built.encrypt(&zero_iv, &mut data);
                    }
                    let at = i as usize * iv_size;
                    ivs[at..at + iv_size].copy_from_slice(&data[..iv_size]);
                }
                Ok(JournalCrypt {
                    name: kernel,
                    kind: Kind::Block {
                        mode: built,
                        iv_size,
                        ivs,
                    },
                    ids: COMMIT_IDS,
                    section_bytes,
                })
            }
        }
    }

    /// The kernel's name of the cipher (`ctr(aes)`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The journal's commit ids under this cipher.
    pub fn commit_ids(&self) -> CommitIds {
        self.ids
    }

    /// Encrypts section `section`'s bytes in place (`data` is exactly one section).
    pub fn encrypt_section(&self, section: u32, data: &mut [u8]) {
        self.apply(section, data, true);
    }

    /// Decrypts section `section`'s bytes in place.
    pub fn decrypt_section(&self, section: u32, data: &mut [u8]) {
        self.apply(section, data, false);
    }

    fn apply(&self, section: u32, data: &mut [u8], encrypt: bool) {
        debug_assert_eq!(data.len(), self.section_bytes);
        match &self.kind {
            Kind::Stream(ks) => {
                let at = section as usize * self.section_bytes;
                for (d, k) in data.iter_mut().zip(&ks[at..at + self.section_bytes]) {
                    *d ^= k;
                }
            }
            Kind::Block { mode, iv_size, ivs } => {
                let at = section as usize * iv_size;
                let iv = &ivs[at..at + iv_size];
                if encrypt {
                    mode.encrypt(iv, data);
                } else {
                    mode.decrypt(iv, data);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_in_both_spellings_and_refusals_by_name() {
        assert_eq!(kernel_cipher_name("ctr-aes").unwrap(), "ctr(aes)");
        assert_eq!(kernel_cipher_name("cbc(aes)").unwrap(), "cbc(aes)");
        assert_eq!(kernel_cipher_name("xts-aes").unwrap(), "xts(aes)");
        assert_eq!(kernel_cipher_name("chacha20").unwrap(), "chacha20");
        for bad in [
            "salsa20",
            "lrw(aes)",
            "cbc(aes",
            "adiantum-aes",
            "gcm(aes)",
            "cbc()",
        ] {
            let e = kernel_cipher_name(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("not supported"), "{e}");
        }
    }

    fn shape() -> JournalShape {
        JournalShape {
            entry_size: 16,
            entries_per_sector: 7,
            section_entries: 56,
            section_sectors: 64,
            sections: 3,
            entries: 168,
            sectors_per_block: 1,
            tag_size: 4,
            mac: false,
        }
    }

    #[test]
    fn sections_round_trip_and_differ() {
        for (name, key) in [
            ("ctr(aes)", 32),
            ("chacha20", 32),
            ("cbc(aes)", 16),
            ("xts(aes)", 64),
            ("ecb(aes)", 32),
        ] {
            let key: Vec<u8> = (0..key as u8).collect();
            let c = JournalCrypt::new(name, &key, &shape()).unwrap();
            let plain = vec![0x5au8; 64 * 512];
            let mut a = plain.clone();
            let mut b = plain.clone();
            c.encrypt_section(0, &mut a);
            c.encrypt_section(1, &mut b);
            assert!(a != plain, "{name}");
            // ECB has no IV: equal sections give equal ciphertexts, as in the kernel.
            assert!(
                a != b || name == "ecb(aes)",
                "{name}: two sections share a ciphertext"
            );
            c.decrypt_section(0, &mut a);
            assert!(a == plain, "{name}");
        }
    }

    #[test]
    fn stream_ciphers_encrypt_the_commit_ids_block_ciphers_keep_them() {
        let key = [7u8; 32];
        let ctr = JournalCrypt::new("ctr(aes)", &key, &shape()).unwrap();
        assert_ne!(ctr.commit_ids(), COMMIT_IDS);
        let cbc = JournalCrypt::new("cbc(aes)", &key, &shape()).unwrap();
        assert_eq!(cbc.commit_ids(), COMMIT_IDS);
        assert!(JournalCrypt::new("cbc(aes)", &[0u8; 7], &shape()).is_err());
    }
}
