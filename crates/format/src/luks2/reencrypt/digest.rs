//! The third digest: pbkdf2 over the reencryption parameters and both keys, which
//! authenticates keyslot R so a tampered header cannot steer the data pass.

use super::*;

impl Reencrypt {
    /// The data the reencryption digest covers (cryptsetup's
    /// `reencrypt_assembly_verification_data`, version 2).
    ///
    /// # Errors
    /// [`FormatError::Header`] when a covered field has the wrong JSON type.
    pub fn verification_data(
        &self,
        json: &Json,
        old_key: &[u8],
        new_key: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, FormatError> {
        let mut out = Zeroizing::new(vec![b'v', b'0' + self.version]);
        if self.old.digest.is_some() {
            out.extend_from_slice(old_key);
        }
        if self.new.digest.is_some() && self.new.digest != self.old.digest {
            out.extend_from_slice(new_key);
        }
        let ks = json
            .get("keyslots")
            .and_then(|k| k.get(&self.keyslot.to_string()))
            .ok_or_else(|| bad("reencrypt keyslot vanished".into()))?;
        let area = field(ks, "area", "keyslot")?;
        let s = |o: &Json, k: &str, out: &mut Vec<u8>| -> Result<(), FormatError> {
            out.extend_from_slice(str_of(o, k, "reencryption digest data")?.as_bytes());
            Ok(())
        };
        let n64 = |o: &Json, k: &str, out: &mut Vec<u8>| -> Result<(), FormatError> {
            match field(o, k, "reencryption digest data")? {
                Json::Str(t) if t == "dynamic" && k == "size" => out.extend_from_slice(b"dynamic"),
                Json::Str(t) => out.extend_from_slice(
                    &t.parse::<u64>()
                        .map_err(|_| bad(format!("field \"{k}\" = {t:?} is not a number")))?
                        .to_be_bytes(),
                ),
                _ => return Err(bad(format!("field \"{k}\" is not a decimal string"))),
            }
            Ok(())
        };
        let n32 = |o: &Json, k: &str, out: &mut Vec<u8>| -> Result<(), FormatError> {
            match field(o, k, "reencryption digest data")? {
                Json::Num(n) => {
                    let v = n
                        .as_u64()
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| bad(format!("field \"{k}\" is not a 32-bit number")))?;
                    out.extend_from_slice(&v.to_be_bytes());
                    Ok(())
                }
                _ => Err(bad(format!("field \"{k}\" is not a JSON number"))),
            }
        };
        s(ks, "mode", &mut out)?;
        s(ks, "direction", &mut out)?;
        s(area, "type", &mut out)?;
        n64(area, "offset", &mut out)?;
        n64(area, "size", &mut out)?;
        // Both of datashift-checksum: the checksum's fields, then the shift.
        if matches!(self.resilience, Resilience::Checksum { .. })
            || matches!(self.moved_resilience, Some(Resilience::Checksum { .. }))
        {
            s(area, "hash", &mut out)?;
            n32(area, "sector_size", &mut out)?;
        }
        if let Resilience::Datashift { .. } = self.resilience {
            n64(area, "shift_size", &mut out)?;
        }
        let moved = self.moved.as_ref().map(|m| &m.json);
        for seg in [Some(&self.backup_old), Some(&self.backup_new), moved]
            .into_iter()
            .flatten()
        {
            s(seg, "type", &mut out)?;
            n64(seg, "offset", &mut out)?;
            n64(seg, "size", &mut out)?;
            if seg.get("type").and_then(Json::as_str) == Some("linear") {
                continue;
            }
            n64(seg, "iv_tweak", &mut out)?;
            s(seg, "encryption", &mut out)?;
            n32(seg, "sector_size", &mut out)?;
        }
        Ok(out)
    }

    /// Checks the reencryption digest with both volume keys: the parameters were written
    /// by someone who held the keys (cryptsetup's answer to CVE-2021-4122).
    ///
    /// # Errors
    /// [`FormatError::Header`] when the digest is missing or does not match.
    pub fn verify(&self, json: &Json, old_key: &[u8], new_key: &[u8]) -> Result<(), FormatError> {
        let data = self.verification_data(json, old_key, new_key)?;
        let meta = super::super::Metadata::parse(&json.to_compact())?;
        let what = format!("LUKS2 reencrypt keyslot {}", self.keyslot);
        let mut any = false;
        for (_, d) in meta.digests_of_keyslot(self.keyslot) {
            any = true;
            if super::super::digest_matches(d, &data, &what)? {
                return Ok(());
            }
        }
        Err(bad(if any {
            "the reencryption digest does not match its parameters (metadata altered or not \
             written with these keys); refusing to continue"
                .into()
        } else {
            "the reencryption digest is missing".into()
        }))
    }
}
