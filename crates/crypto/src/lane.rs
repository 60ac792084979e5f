//! A lane is one subkey's worth of dm-crypt: an IV generator plus a chaining mode, or a
//! legacy cipher. [`DmCipher`] holds one lane per key (dm-crypt's keycount) and walks a run
//! of sectors, computing each sector's IV number and lane exactly as dm-crypt 6.1 does:
//!
//! ```text
//! cc_sector  = dm_sector + iv_offset                    (512-byte units, wrapping)
//! lane       = cc_sector & (keycount - 1)               (before the large-sector shift)
//! iv_sector  = cc_sector >> log2(sector_size / 512)     (only with iv_large_sectors)
//! ```

use crate::iv::IvGenerator;
use crate::mode::aws_xts::AwsXts;
use crate::mode::vaes_xts::VaesXts;
use crate::mode::Mode;
use crate::{Sector512, SectorCipher, SectorParams, SectorSize};

/// The largest IV any mode uses (Adiantum's 32 bytes).
pub(crate) const MAX_IV: usize = 32;

/// One subkey's sector transform.
pub trait Lane: Send + Sync {
    /// Encrypts whole sectors of the cipher's sector size; sector k of `data` has IV number
    /// `iv_first + k * iv_step` (wrapping).
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]);
    /// Decrypts, with the same numbering as [`Lane::encrypt`].
    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]);
    /// Decrypts `src` into `dst`; the default copies, then decrypts in place.
    fn decrypt_from(&self, iv_first: u64, iv_step: u64, src: &[u8], dst: &mut [u8]) {
        dst.copy_from_slice(src);
        self.decrypt(iv_first, iv_step, dst);
    }
    /// Whether the calls below [`Lane::encrypt`] and [`Lane::decrypt`] may leave key
    /// material in their stack frames, so [`DmCipher`] burns the stack after each request
    /// (see [`BURN_AFTER_USE_BYTES`]). True unless checked otherwise: RustCrypto's AES
    /// (the generic modes' and IV generators') spills its round keys there on every call.
    fn leaves_key_in_stack(&self) -> bool {
        true
    }
}

/// Bytes of stack [`DmCipher`] overwrites after a request when a lane
/// [`Lane::leaves_key_in_stack`]: RustCrypto's AES under `mode/cbc.rs` with ESSIV left
/// pieces of the key and of ESSIV's key 3.4 to 10.3 KiB below the caller (AES-256,
/// 512- and 4096-byte sectors, test build: `no_key_left_in_the_stack_after_a_request`),
/// in every thread that served a request, found by lifecycle's key-scan test after
/// luksSuspend; 16 KiB is half as deep again. About 150 ns a request (2048 volatile
/// 8-byte stores; measured 2026-12-03 on the 2-vCPU EPYC, load 4).
const BURN_AFTER_USE_BYTES: usize = 16 * 1024;

type BurnOnReturn = crate::secret::BurnOnReturn<{ BURN_AFTER_USE_BYTES / 8 }>;

/// The ordinary lane: IV generator + mode.
pub(crate) struct ModeLane {
    pub mode: Box<dyn Mode>,
    pub iv: Option<Box<dyn IvGenerator>>,
    pub iv_size: usize,
    pub sector_bytes: usize,
}

impl ModeLane {
    fn run(&self, iv_first: u64, iv_step: u64, data: &mut [u8], encrypt: bool) {
        let mut iv = [0u8; MAX_IV];
        let iv = &mut iv[..self.iv_size];
        let mut n = iv_first;
        for sector in data.chunks_exact_mut(self.sector_bytes) {
            if let Some(g) = &self.iv {
                g.fill(n, iv);
            }
            if encrypt {
                self.mode.encrypt(iv, sector);
            } else {
                self.mode.decrypt(iv, sector);
            }
            n = n.wrapping_add(iv_step);
        }
    }
}

impl Lane for ModeLane {
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        let Some(g) = self.iv.as_ref().filter(|_| self.iv_size > 0) else {
            return self.run(iv_first, iv_step, data, true);
        };
        // IVs for a group of sectors, then the mode encrypts the group (CBC interleaves).
        const GROUP: usize = crate::mode::cbc::LANES;
        let mut ivs = [0u8; GROUP * MAX_IV];
        let mut n = iv_first;
        for group in data.chunks_mut(GROUP * self.sector_bytes) {
            let k = group.len() / self.sector_bytes;
            for iv in ivs[..k * self.iv_size].chunks_exact_mut(self.iv_size) {
                g.fill(n, iv);
                n = n.wrapping_add(iv_step);
            }
            self.mode.encrypt_sectors(
                &ivs[..k * self.iv_size],
                self.iv_size,
                group,
                self.sector_bytes,
            );
        }
    }
    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        self.run(iv_first, iv_step, data, false);
    }
}

/// The hot path, aes-xts-plain64 with a 512-bit key: one context slot per run, IV written
/// inline, no virtual call per sector.
pub(crate) struct AwsXtsPlain64Lane {
    pub xts: AwsXts,
    pub sector_bytes: usize,
}

impl AwsXtsPlain64Lane {
    #[inline]
    fn run(&self, iv_first: u64, iv_step: u64, data: &mut [u8], encrypt: bool) {
        self.xts.with_slot(|slot| {
            let mut iv = [0u8; 16];
            let mut n = iv_first;
            for sector in data.chunks_exact_mut(self.sector_bytes) {
                iv[..8].copy_from_slice(&n.to_le_bytes());
                if encrypt {
                    slot.encrypt(&iv, sector);
                } else {
                    slot.decrypt(&iv, sector);
                }
                n = n.wrapping_add(iv_step);
            }
        });
    }
}

impl Lane for AwsXtsPlain64Lane {
    /// AWS-LC's XTS leaves no key in the stack (lifecycle's key-scan tests).
    fn leaves_key_in_stack(&self) -> bool {
        false
    }
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        self.run(iv_first, iv_step, data, true);
    }
    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        self.run(iv_first, iv_step, data, false);
    }
    fn decrypt_from(&self, iv_first: u64, iv_step: u64, src: &[u8], dst: &mut [u8]) {
        assert_eq!(src.len(), dst.len(), "BUG: decrypt_from lengths differ");
        self.xts.with_slot(|slot| {
            let mut iv = [0u8; 16];
            let mut n = iv_first;
            for (s, d) in src
                .chunks_exact(self.sector_bytes)
                .zip(dst.chunks_exact_mut(self.sector_bytes))
            {
                iv[..8].copy_from_slice(&n.to_le_bytes());
                slot.decrypt_to(&iv, s, d);
                n = n.wrapping_add(iv_step);
            }
        });
    }
}

/// aes-xts-plain64 with a 256- or 384-bit key on a VAES CPU: the IV written inline, no
/// virtual call per sector.
pub(crate) struct VaesXtsPlain64Lane {
    pub xts: VaesXts,
    pub sector_bytes: usize,
}

impl Lane for VaesXtsPlain64Lane {
    /// ucrypt's VAES XTS reads its round keys from the key's locked box and keeps no copy
    /// in its frames (lifecycle's key-scan tests).
    fn leaves_key_in_stack(&self) -> bool {
        false
    }
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        self.xts
            .plain64_units(iv_first, iv_step, data, self.sector_bytes, false);
    }
    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {
        self.xts
            .plain64_units(iv_first, iv_step, data, self.sector_bytes, true);
    }
    fn decrypt_from(&self, iv_first: u64, iv_step: u64, src: &[u8], dst: &mut [u8]) {
        self.xts
            .plain64_units_decrypt_to(iv_first, iv_step, src, dst, self.sector_bytes);
    }
}

/// A dm-crypt mapping's sector cipher: lanes plus IV numbering.
pub(crate) struct DmCipher {
    lanes: Vec<Box<dyn Lane>>,
    params: SectorParams,
    /// Some lane [`Lane::leaves_key_in_stack`]: burn after each request.
    burn_after_use: bool,
}

impl DmCipher {
    pub(crate) fn new(lanes: Vec<Box<dyn Lane>>, params: SectorParams) -> Self {
        let burn_after_use = lanes.iter().any(|l| l.leaves_key_in_stack());
        DmCipher {
            lanes,
            params,
            burn_after_use,
        }
    }

    /// Checks that `len` bytes at `first` are whole sectors and returns dm-crypt's numbering
    /// of the run: (cc_sector of the first, the IV shift, the IV step per sector).
    fn numbering(&self, first: Sector512, len: usize) -> (u64, u32, u64) {
        let ss = self.params.sector_size;
        let unit = ss.sectors512();
        assert!(
            len % ss.len() == 0 && first.0 % unit == 0,
            "BUG: sector run not aligned to sector size {ss}"
        );
        let cc_first = first.0.wrapping_add(self.params.iv_offset);
        if self.params.iv_large_sectors {
            (cc_first, ss.shift(), 1)
        } else {
            (cc_first, 0, unit)
        }
    }

    fn run(&self, first: Sector512, data: &mut [u8], encrypt: bool) {
        let ss = self.params.sector_size;
        let unit = ss.sectors512();
        let (cc_first, shift, step) = self.numbering(first, data.len());
        if self.lanes.len() == 1 {
            let lane = &self.lanes[0];
            if encrypt {
                lane.encrypt(cc_first >> shift, step, data);
            } else {
                lane.decrypt(cc_first >> shift, step, data);
            }
            return;
        }
        // Several keys: the lane changes with every sector, so go one sector at a time.
        let mask = self.lanes.len() as u64 - 1;
        let mut cc = cc_first;
        for sector in data.chunks_exact_mut(ss.len()) {
            let lane = &self.lanes[(cc & mask) as usize];
            if encrypt {
                lane.encrypt(cc >> shift, step, sector);
            } else {
                lane.decrypt(cc >> shift, step, sector);
            }
            cc = cc.wrapping_add(unit);
        }
    }
}

impl SectorCipher for DmCipher {
    fn sector_size(&self) -> SectorSize {
        self.params.sector_size
    }
    fn encrypt(&self, first: Sector512, data: &mut [u8]) {
        let _burn = BurnOnReturn::new(self.burn_after_use);
        self.run(first, data, true);
    }
    fn decrypt(&self, first: Sector512, data: &mut [u8]) {
        let _burn = BurnOnReturn::new(self.burn_after_use);
        self.run(first, data, false);
    }
    fn decrypt_from(&self, first: Sector512, src: &[u8], dst: &mut [u8]) {
        let _burn = BurnOnReturn::new(self.burn_after_use);
        if self.lanes.len() != 1 {
            // Several keys: the lane changes with every sector; the in-place path does it.
            dst.copy_from_slice(src);
            self.run(first, dst, false);
            return;
        }
        let (cc_first, shift, step) = self.numbering(first, src.len());
        self.lanes[0].decrypt_from(cc_first >> shift, step, src, dst);
    }
}

/// `cipher_null`: the identity, with no per-sector work at all.
pub(crate) struct Identity(pub SectorSize);

impl SectorCipher for Identity {
    fn sector_size(&self) -> SectorSize {
        self.0
    }
    fn is_identity(&self) -> bool {
        true
    }
    fn encrypt(&self, first: Sector512, data: &mut [u8]) {
        debug_assert!(data.len() % self.0.len() == 0 && first.0 % self.0.sectors512() == 0);
    }
    fn decrypt(&self, first: Sector512, data: &mut [u8]) {
        debug_assert!(data.len() % self.0.len() == 0 && first.0 % self.0.sectors512() == 0);
    }
}
