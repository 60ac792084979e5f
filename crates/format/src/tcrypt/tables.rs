//! The key derivations and cipher chains TrueCrypt and VeraCrypt use, in the order
//! cryptsetup tries them.

use super::*;

/// The hash of a PBKDF2 variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcHash {
    /// RIPEMD-160.
    Ripemd160,
    /// SHA-512.
    Sha512,
    /// Whirlpool.
    Whirlpool,
    /// SHA-1 (legacy TrueCrypt).
    Sha1,
    /// SHA-256.
    Sha256,
    /// BLAKE2s-256.
    Blake2s256,
    /// Streebog-512 (GOST R 34.11-2012).
    Stribog512,
}

impl TcHash {
    /// cryptsetup's name.
    pub fn name(self) -> &'static str {
        match self {
            TcHash::Ripemd160 => "ripemd160",
            TcHash::Sha512 => "sha512",
            TcHash::Whirlpool => "whirlpool",
            TcHash::Sha1 => "sha1",
            TcHash::Sha256 => "sha256",
            TcHash::Blake2s256 => "blake2s-256",
            TcHash::Stribog512 => "stribog512",
        }
    }

    fn pbkdf2(self, password: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        use pbkdf2::pbkdf2_hmac as p;
        match self {
            TcHash::Ripemd160 => p::<ripemd::Ripemd160>(password, salt, iterations, out),
            TcHash::Sha512 => p::<sha2::Sha512>(password, salt, iterations, out),
            TcHash::Whirlpool => p::<whirlpool::Whirlpool>(password, salt, iterations, out),
            TcHash::Sha1 => p::<sha1::Sha1>(password, salt, iterations, out),
            TcHash::Sha256 => p::<sha2::Sha256>(password, salt, iterations, out),
            TcHash::Blake2s256 => {
                // BLAKE2 has no eager block buffer: the generic HMAC construction.
                // Any key length is valid for HMAC, so this cannot fail.
                let _ = pbkdf2::pbkdf2::<hmac::SimpleHmac<blake2::Blake2s256>>(
                    password, salt, iterations, out,
                );
            }
            TcHash::Stribog512 => p::<streebog::Streebog512>(password, salt, iterations, out),
        }
    }
}

/// One KDF variant of the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfEntry {
    /// Only with legacy modes (SHA-1).
    pub legacy: bool,
    /// VeraCrypt only.
    pub veracrypt: bool,
    /// `None`: Argon2id.
    pub hash: Option<TcHash>,
    /// PBKDF2 iterations, or Argon2 time cost.
    pub iterations: u32,
    /// Argon2 memory in KiB.
    pub memory_kib: u32,
    /// With a PIM: iterations = const + mult x PIM.
    pub pim_const: u32,
    /// See `pim_const`.
    pub pim_mult: u32,
}

const fn pb(legacy: bool, vera: bool, h: TcHash, it: u32, pc: u32, pm: u32) -> KdfEntry {
    KdfEntry {
        legacy,
        veracrypt: vera,
        hash: Some(h),
        iterations: it,
        memory_kib: 0,
        pim_const: pc,
        pim_mult: pm,
    }
}

/// The KDF variants in cryptsetup's search order.
pub const KDFS: &[KdfEntry] = &[
    pb(false, false, TcHash::Ripemd160, 2000, 0, 0),
    pb(false, false, TcHash::Ripemd160, 1000, 0, 0),
    pb(false, false, TcHash::Sha512, 1000, 0, 0),
    pb(false, false, TcHash::Whirlpool, 1000, 0, 0),
    pb(true, false, TcHash::Sha1, 2000, 0, 0),
    pb(false, true, TcHash::Sha512, 500_000, 15000, 1000),
    pb(false, true, TcHash::Whirlpool, 500_000, 15000, 1000),
    pb(false, true, TcHash::Sha256, 500_000, 15000, 1000),
    pb(false, true, TcHash::Sha256, 200_000, 0, 2048),
    KdfEntry {
        legacy: false,
        veracrypt: true,
        hash: None,
        iterations: 6,
        memory_kib: 425_984,
        pim_const: 0,
        pim_mult: 0,
    },
    pb(false, true, TcHash::Blake2s256, 500_000, 15000, 1000),
    pb(false, true, TcHash::Blake2s256, 200_000, 0, 2048),
    pb(false, true, TcHash::Ripemd160, 655_331, 15000, 1000),
    pb(false, true, TcHash::Ripemd160, 327_661, 0, 2048),
    pb(false, true, TcHash::Stribog512, 500_000, 15000, 1000),
];

impl KdfEntry {
    /// The name matched by a `--hash` hint (the hash, or `argon2id`).
    pub fn name(&self) -> &'static str {
        self.hash.map_or("argon2id", TcHash::name)
    }

    /// The relative cost of one derivation, for progress estimates: PBKDF2 iterations, or
    /// Argon2's time cost × 2 × memory KiB (about as long as that many PBKDF2 iterations).
    pub fn cost(&self, pim: Option<u32>) -> u64 {
        let (it, mem) = self.costs(pim);
        match self.hash {
            Some(_) => u64::from(it),
            None => u64::from(it) * 2 * u64::from(mem),
        }
    }

    /// (iterations or time cost, memory KiB) for an optional PIM.
    pub fn costs(&self, pim: Option<u32>) -> (u32, u32) {
        match (pim, self.hash) {
            (Some(p), None) if p <= 31 => {
                ((p.max(1) - 1) / 3 + 3, 1024 * (64 + (p.max(1) - 1) * 32))
            }
            (Some(p), None) => (p.saturating_sub(18).max(1), 1024 * 1024),
            (Some(p), Some(_)) => (
                self.pim_const
                    .saturating_add(self.pim_mult.saturating_mul(p)),
                0,
            ),
            (None, _) => (self.iterations, self.memory_kib),
        }
    }

    pub(super) fn derive(
        &self,
        password: &[u8],
        salt: &[u8],
        pim: Option<u32>,
    ) -> Result<Zeroizing<[u8; HDR_KEY_LEN]>, FormatError> {
        let (it, mem) = self.costs(pim);
        let mut key = Zeroizing::new([0u8; HDR_KEY_LEN]);
        match self.hash {
            Some(h) => h.pbkdf2(password, salt, it, &mut key[..]),
            None => crate::kdf::argon2(
                crate::kdf::Argon2Kind::Id,
                crate::kdf::Argon2Cost {
                    time: it,
                    memory_kib: mem,
                    lanes: 1,
                },
                password,
                salt,
                &mut key[..],
            )?,
        }
        Ok(key)
    }
}

/// The chaining of a cipher chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainMode {
    /// `xts-plain64`.
    Xts,
    /// `lrw-benbi` (TrueCrypt 4.x).
    Lrw,
    /// `cbc-tcw`: single-cipher CBC of TrueCrypt < 4.1.
    CbcTcw,
    /// `cbci-tcrypt`: TrueCrypt's outer-CBC cascades (each block through every cipher);
    /// no kernel mapping, served as one `a+b+c-cbc-tcw` layer.
    Cbci,
    /// `cbc-tcrypt`: TrueCrypt's inner-CBC chains with little-endian Blowfish; no kernel
    /// mapping, served as one `cbc-tcw` layer per cipher.
    CbcTcrypt,
}

impl ChainMode {
    /// cryptsetup's mode name.
    pub fn name(self) -> &'static str {
        match self {
            ChainMode::Xts => "xts-plain64",
            ChainMode::Lrw => "lrw-benbi",
            ChainMode::CbcTcw => "cbc-tcw",
            ChainMode::Cbci => "cbci-tcrypt",
            ChainMode::CbcTcrypt => "cbc-tcrypt",
        }
    }
}

/// One cipher of a chain: where its keys sit in the 256-byte key area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alg {
    /// Kernel cipher name.
    pub name: &'static str,
    /// Key bytes as the dm-crypt layer takes them.
    pub key_size: usize,
    /// Block (IV) size.
    pub iv_size: usize,
    /// Offset of the (first) key.
    pub key_offset: usize,
    /// Offset of the second XTS half, or of the CBC IV seed.
    pub iv_offset: usize,
    /// CBC: IV seed + whitening bytes after the key.
    pub key_extra: usize,
}

/// A cipher chain: cryptsetup's long name, mode and per-cipher keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Algs {
    /// Legacy (TrueCrypt < 5) mode.
    pub legacy: bool,
    /// Volume key bytes of the whole chain.
    pub chain_key_size: usize,
    /// cryptsetup's name (`aes-twofish-serpent`).
    pub long_name: &'static str,
    /// Chaining.
    pub mode: ChainMode,
    /// The ciphers, cryptsetup order (the last is the outermost on disk).
    pub ciphers: &'static [Alg],
}

const fn a(name: &'static str, ks: usize, ivs: usize, ko: usize, io: usize, ke: usize) -> Alg {
    Alg {
        name,
        key_size: ks,
        iv_size: ivs,
        key_offset: ko,
        iv_offset: io,
        key_extra: ke,
    }
}

const fn ch(
    legacy: bool,
    size: usize,
    long_name: &'static str,
    mode: ChainMode,
    ciphers: &'static [Alg],
) -> Algs {
    Algs {
        legacy,
        chain_key_size: size,
        long_name,
        mode,
        ciphers,
    }
}

use ChainMode::{CbcTcrypt, CbcTcw, Cbci, Lrw, Xts};

/// Every cipher chain, in cryptsetup's search order.
pub const CHAINS: &[Algs] = &[
    ch(false, 64, "aes", Xts, &[a("aes", 64, 16, 0, 32, 0)]),
    ch(false, 64, "serpent", Xts, &[a("serpent", 64, 16, 0, 32, 0)]),
    ch(false, 64, "twofish", Xts, &[a("twofish", 64, 16, 0, 32, 0)]),
    ch(
        false,
        128,
        "twofish-aes",
        Xts,
        &[a("twofish", 64, 16, 0, 64, 0), a("aes", 64, 16, 32, 96, 0)],
    ),
    ch(
        false,
        192,
        "serpent-twofish-aes",
        Xts,
        &[
            a("serpent", 64, 16, 0, 96, 0),
            a("twofish", 64, 16, 32, 128, 0),
            a("aes", 64, 16, 64, 160, 0),
        ],
    ),
    ch(
        false,
        128,
        "aes-serpent",
        Xts,
        &[a("aes", 64, 16, 0, 64, 0), a("serpent", 64, 16, 32, 96, 0)],
    ),
    ch(
        false,
        192,
        "aes-twofish-serpent",
        Xts,
        &[
            a("aes", 64, 16, 0, 96, 0),
            a("twofish", 64, 16, 32, 128, 0),
            a("serpent", 64, 16, 64, 160, 0),
        ],
    ),
    ch(
        false,
        128,
        "serpent-twofish",
        Xts,
        &[
            a("serpent", 64, 16, 0, 64, 0),
            a("twofish", 64, 16, 32, 96, 0),
        ],
    ),
    ch(
        false,
        64,
        "camellia",
        Xts,
        &[a("camellia", 64, 16, 0, 32, 0)],
    ),
    ch(
        false,
        64,
        "kuznyechik",
        Xts,
        &[a("kuznyechik", 64, 16, 0, 32, 0)],
    ),
    ch(
        false,
        128,
        "kuznyechik-camellia",
        Xts,
        &[
            a("kuznyechik", 64, 16, 0, 64, 0),
            a("camellia", 64, 16, 32, 96, 0),
        ],
    ),
    ch(
        false,
        128,
        "twofish-kuznyechik",
        Xts,
        &[
            a("twofish", 64, 16, 0, 64, 0),
            a("kuznyechik", 64, 16, 32, 96, 0),
        ],
    ),
    ch(
        false,
        128,
        "serpent-camellia",
        Xts,
        &[
            a("serpent", 64, 16, 0, 64, 0),
            a("camellia", 64, 16, 32, 96, 0),
        ],
    ),
    ch(
        false,
        128,
        "aes-kuznyechik",
        Xts,
        &[
            a("aes", 64, 16, 0, 64, 0),
            a("kuznyechik", 64, 16, 32, 96, 0),
        ],
    ),
    ch(
        false,
        192,
        "camellia-serpent-kuznyechik",
        Xts,
        &[
            a("camellia", 64, 16, 0, 96, 0),
            a("serpent", 64, 16, 32, 128, 0),
            a("kuznyechik", 64, 16, 64, 160, 0),
        ],
    ),
    ch(false, 48, "aes", Lrw, &[a("aes", 48, 16, 32, 0, 0)]),
    ch(false, 48, "serpent", Lrw, &[a("serpent", 48, 16, 32, 0, 0)]),
    ch(false, 48, "twofish", Lrw, &[a("twofish", 48, 16, 32, 0, 0)]),
    ch(
        false,
        96,
        "twofish-aes",
        Lrw,
        &[a("twofish", 48, 16, 32, 0, 0), a("aes", 48, 16, 64, 0, 0)],
    ),
    ch(
        false,
        144,
        "serpent-twofish-aes",
        Lrw,
        &[
            a("serpent", 48, 16, 32, 0, 0),
            a("twofish", 48, 16, 64, 0, 0),
            a("aes", 48, 16, 96, 0, 0),
        ],
    ),
    ch(
        false,
        96,
        "aes-serpent",
        Lrw,
        &[a("aes", 48, 16, 32, 0, 0), a("serpent", 48, 16, 64, 0, 0)],
    ),
    ch(
        false,
        144,
        "aes-twofish-serpent",
        Lrw,
        &[
            a("aes", 48, 16, 32, 0, 0),
            a("twofish", 48, 16, 64, 0, 0),
            a("serpent", 48, 16, 96, 0, 0),
        ],
    ),
    ch(
        false,
        96,
        "serpent-twofish",
        Lrw,
        &[
            a("serpent", 48, 16, 32, 0, 0),
            a("twofish", 48, 16, 64, 0, 0),
        ],
    ),
    ch(true, 64, "aes", CbcTcw, &[a("aes", 32, 16, 32, 0, 32)]),
    ch(
        true,
        64,
        "serpent",
        CbcTcw,
        &[a("serpent", 32, 16, 32, 0, 32)],
    ),
    ch(
        true,
        64,
        "twofish",
        CbcTcw,
        &[a("twofish", 32, 16, 32, 0, 32)],
    ),
    ch(
        true,
        96,
        "twofish-aes",
        Cbci,
        &[a("twofish", 32, 16, 32, 0, 0), a("aes", 32, 16, 64, 0, 32)],
    ),
    ch(
        true,
        128,
        "serpent-twofish-aes",
        Cbci,
        &[
            a("serpent", 32, 16, 32, 0, 0),
            a("twofish", 32, 16, 64, 0, 0),
            a("aes", 32, 16, 96, 0, 32),
        ],
    ),
    ch(
        true,
        96,
        "aes-serpent",
        Cbci,
        &[a("aes", 32, 16, 32, 0, 0), a("serpent", 32, 16, 64, 0, 32)],
    ),
    ch(
        true,
        128,
        "aes-twofish-serpent",
        Cbci,
        &[
            a("aes", 32, 16, 32, 0, 0),
            a("twofish", 32, 16, 64, 0, 0),
            a("serpent", 32, 16, 96, 0, 32),
        ],
    ),
    ch(
        true,
        96,
        "serpent-twofish",
        Cbci,
        &[
            a("serpent", 32, 16, 32, 0, 0),
            a("twofish", 32, 16, 64, 0, 32),
        ],
    ),
    ch(true, 40, "cast5", CbcTcw, &[a("cast5", 16, 8, 32, 0, 24)]),
    ch(
        true,
        48,
        "des3_ede",
        CbcTcw,
        &[a("des3_ede", 24, 8, 32, 0, 24)],
    ),
    ch(
        true,
        80,
        "blowfish_le",
        CbcTcrypt,
        &[a("blowfish_le", 56, 8, 32, 0, 24)],
    ),
    ch(
        true,
        120,
        "blowfish_le-aes",
        CbcTcrypt,
        &[
            a("blowfish_le", 56, 8, 32, 0, 0),
            a("aes", 32, 16, 88, 0, 32),
        ],
    ),
    ch(
        true,
        152,
        "serpent-blowfish_le-aes",
        CbcTcrypt,
        &[
            a("serpent", 32, 16, 32, 0, 0),
            a("blowfish_le", 56, 8, 64, 0, 0),
            a("aes", 32, 16, 120, 0, 32),
        ],
    ),
];

/// The layer key of `alg` from a 192/256-byte key area, as cryptsetup copies it.
pub(super) fn layer_key(alg: &Alg, mode: ChainMode, keys: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(alg.key_size + alg.key_extra));
    match mode {
        Xts => {
            let h = alg.key_size / 2;
            out.extend_from_slice(&keys[alg.key_offset..alg.key_offset + h]);
            out.extend_from_slice(&keys[alg.iv_offset..alg.iv_offset + h]);
        }
        Lrw => {
            let h = alg.key_size - 16;
            out.extend_from_slice(&keys[alg.key_offset..alg.key_offset + h]);
            out.extend_from_slice(&keys[..16]);
        }
        CbcTcw | Cbci | CbcTcrypt => {
            out.extend_from_slice(&keys[alg.key_offset..alg.key_offset + alg.key_size]);
            out.extend_from_slice(&keys[alg.iv_offset..alg.iv_offset + alg.key_extra]);
        }
    }
    out
}
