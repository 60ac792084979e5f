//! CBC with ciphertext stealing, as the kernel's `cts(cbc(cipher))` (crypto/cts.c, the
//! CBC-CS3 variant), written in a dm-crypt table only in the crypto API form
//! `capi:cts(cbc(aes))-plain64`. A sector is always a whole number of blocks, and for those
//! the kernel's CTS is plain CBC with the last two ciphertext blocks swapped (one block:
//! plain CBC). Built on [`Cbc`]; no crate offers the kernel's variant over a run-time chosen
//! cipher. Proven by the kernel golden vector `aes-cts-cbc-plain64-k256`
//! (`testdata/golden/make-kernel-ciphers.sh`).

use super::cbc::Cbc;
use super::Mode;
use crate::CryptoError;

/// `cts(cbc(cipher))` for whole-block data.
pub struct Cts {
    cbc: Cbc,
}

impl Cts {
    /// Keys the cipher.
    ///
    /// # Errors
    /// As [`Cbc::new`]; [`CryptoError::Unsupported`] for ciphers of less than 8-byte blocks.
    pub fn new(cipher: &str, key: &[u8]) -> Result<Self, CryptoError> {
        let cbc = Cbc::new(cipher, key)?;
        if cbc.cipher().block_size() < 8 {
            return Err(CryptoError::Unsupported(format!("cts(cbc({cipher}))")));
        }
        Ok(Cts { cbc })
    }

    fn swap_last_two(&self, data: &mut [u8]) {
        let bs = self.cbc.cipher().block_size();
        if data.len() >= 2 * bs {
            let (head, last) = data.split_at_mut(data.len() - bs);
            let at = head.len() - bs;
            head[at..].swap_with_slice(last);
        }
    }
}

impl Mode for Cts {
    fn iv_size(&self) -> usize {
        self.cbc.iv_size()
    }
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.cbc.encrypt(iv, data);
        self.swap_last_two(data);
    }
    fn decrypt(&self, iv: &[u8], data: &mut [u8]) {
        self.swap_last_two(data);
        self.cbc.decrypt(iv, data);
    }
}
