//! `tcw`: placeholder until implemented.
#![allow(missing_docs, unused_variables, dead_code)]
use crate::lane::Lane;
use crate::CryptoError;

pub const WHITENING_SIZE: usize = 16;

pub struct Tcw;

impl Tcw {
    pub fn new(cipher: &str, subkey: &[u8], iv_seed: &[u8], whitening: &[u8]) -> Result<Self, CryptoError> {
        Err(CryptoError::Unsupported("tcw".into()))
    }
}

impl Lane for Tcw {
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {}
    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {}
}
