//! The LUKS anti-forensic splitter (Clemens Fruhwirth's AF, as in cryptsetup's `lib/luks1/af.c`):
//! a key of `n` bytes is stored as `stripes` blocks of `n` bytes; merging XORs the blocks
//! with a hash diffusion between them, so losing any single stripe loses the key.

use crate::kdf::Hash;
use crate::FormatError;
use zeroize::Zeroizing;

/// Diffuses `buf` in place: each digest-sized chunk `i` becomes `H(be32(i) || chunk)`; a
/// final partial chunk takes the first bytes of its digest.
fn diffuse(hash: Hash, buf: &mut [u8]) {
    let ds = hash.size();
    for (i, chunk) in buf.chunks_mut(ds).enumerate() {
        let d = hash.digest(&[&(i as u32).to_be_bytes(), chunk]);
        let n = chunk.len();
        chunk.copy_from_slice(&d[..n]);
    }
}

/// Merges `stripes` blocks of `key_bytes` each from `material` into the key.
///
/// # Errors
/// [`FormatError::Header`] when `material` is shorter than `key_bytes * stripes` or
/// `stripes` is zero.
pub fn merge(
    material: &[u8],
    key_bytes: usize,
    stripes: u32,
    hash: Hash,
) -> Result<Zeroizing<Vec<u8>>, FormatError> {
    let need = key_bytes.checked_mul(stripes as usize);
    if stripes == 0 || need.is_none_or(|n| n > material.len()) {
        return Err(FormatError::Header {
            what: "AF-split key material".into(),
            reason: format!(
                "{} bytes cannot hold {stripes} stripes of {key_bytes} bytes (need at least one stripe)",
                material.len()
            ),
        });
    }
    let mut buf = Zeroizing::new(vec![0u8; key_bytes]);
    let mut blocks = material.chunks(key_bytes).take(stripes as usize);
    for _ in 1..stripes {
        let b = blocks.next().unwrap_or_default();
        buf.iter_mut().zip(b).for_each(|(x, y)| *x ^= y);
        diffuse(hash, &mut buf);
    }
    let last = blocks.next().unwrap_or_default();
    buf.iter_mut().zip(last).for_each(|(x, y)| *x ^= y);
    Ok(buf)
}

/// Splits `key` into `stripes` blocks with `random` filling the first `stripes - 1`
/// (the inverse of [`merge`]; used by tests and keyslot writers).
///
/// # Panics
/// If `random` is shorter than `(stripes - 1) * key.len()` (a caller bug).
pub fn split(key: &[u8], stripes: u32, hash: Hash, random: &[u8]) -> Zeroizing<Vec<u8>> {
    let n = key.len();
    let mut out = Zeroizing::new(Vec::with_capacity(n * stripes as usize));
    let mut buf = Zeroizing::new(vec![0u8; n]);
    for i in 0..(stripes as usize).saturating_sub(1) {
        let r = &random[i * n..(i + 1) * n];
        out.extend_from_slice(r);
        buf.iter_mut().zip(r).for_each(|(x, y)| *x ^= y);
        diffuse(hash, &mut buf);
    }
    buf.iter_mut().zip(key).for_each(|(x, y)| *x ^= y);
    out.extend_from_slice(&buf);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_then_merge_round_trips_with_partial_digest_chunks() {
        let key: Vec<u8> = (0..50u8).collect(); // 50 = 2 x 20 + 10 for SHA-1
        let random: Vec<u8> = (0..50 * 9).map(|i| (i * 7 % 251) as u8).collect();
        for h in [Hash::Sha1, Hash::Sha256, Hash::Whirlpool] {
            let m = split(&key, 10, h, &random);
            assert_eq!(&merge(&m, 50, 10, h).unwrap()[..], &key[..]);
        }
        assert!(merge(&[0u8; 10], 50, 10, Hash::Sha1).is_err());
    }
}
