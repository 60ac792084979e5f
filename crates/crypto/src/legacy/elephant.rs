//! `elephant`: placeholder until implemented.
#![allow(missing_docs, unused_variables, dead_code)]
use crate::lane::Lane;
use crate::CryptoError;


pub struct Elephant;

impl Elephant {
    pub fn new(cipher: &str, subkey: &[u8], elephant_key: &[u8], sector_size: crate::SectorSize) -> Result<Self, CryptoError> {
        Err(CryptoError::Unsupported("elephant".into()))
    }
}

impl Lane for Elephant {
    fn encrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {}
    fn decrypt(&self, iv_first: u64, iv_step: u64, data: &mut [u8]) {}
}
