//! `lmk`: placeholder until implemented.
#![allow(missing_docs, unused_variables, dead_code)]
use crate::lane::Lane;
use crate::CryptoError;


pub struct Lmk;

impl Lmk {
    pub fn new(cipher: &str, subkey: &[u8], seed: Option<&[u8]>) -> Result<Self, CryptoError> {
        Err(CryptoError::Unsupported("lmk".into()))
    }
}

impl Lane for Lmk {
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {}
    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {}
}
