//! Reading keyslot R, the segments and the digests into a [`Reencrypt`]: which sides exist,
//! how far the run got, and how the hotzone is protected.

use super::*;

/// The digest ids whose `segments` list `seg`.
fn digests_of_segment(json: &Json, seg: u32) -> Vec<u32> {
    json.get("digests")
        .map(|d| {
            d.members()
                .iter()
                .filter(|(_, v)| ids(v.get("segments")).contains(&seg))
                .filter_map(|(k, _)| k.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the header carries the reencryption requirement (either version).
pub fn in_reencryption(json: &Json) -> bool {
    requirements(json)
        .iter()
        .any(|r| r == REQUIREMENT || r == REQUIREMENT_V3)
}

fn requirements(json: &Json) -> Vec<String> {
    match json
        .get("config")
        .and_then(|c| c.get("requirements"))
        .and_then(|r| r.get("mandatory"))
    {
        Some(Json::Arr(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

fn side_of(json: &Json, id: u32, seg: &Json, want_linear: bool) -> Result<Side, FormatError> {
    let path = format!("segments.{id}");
    let kind = str_of(seg, "type", &path)?;
    if kind != if want_linear { "linear" } else { "crypt" } {
        return Err(bad(format!(
            "{path} is a {kind} backup segment, which this reencryption mode does not have"
        )));
    }
    let digests = digests_of_segment(json, id);
    if want_linear {
        if !digests.is_empty() {
            return Err(bad(format!(
                "linear {path} is bound to digests {digests:?}"
            )));
        }
        return Ok(Side {
            offset: u64_of(seg, "offset", &path)?,
            iv_tweak: 0,
            encryption: "cipher_null-ecb".into(),
            sector_size: 512,
            digest: None,
            linear: true,
        });
    }
    let digest = match digests.as_slice() {
        [d] => *d,
        _ => {
            return Err(bad(format!(
                "{path} should be bound to one digest, is bound to {digests:?}"
            )))
        }
    };
    let sector_size = u64_of(seg, "sector_size", &path)?;
    Ok(Side {
        offset: u64_of(seg, "offset", &path)?,
        iv_tweak: u64_of(seg, "iv_tweak", &path)?,
        encryption: str_of(seg, "encryption", &path)?.to_string(),
        sector_size: u32::try_from(sector_size)
            .ok()
            .filter(|s| s.is_power_of_two() && (512..=4096).contains(s))
            .ok_or_else(|| bad(format!("{path}.sector_size {sector_size} is not 512..4096")))?,
        digest: Some(digest),
        linear: false,
    })
}

impl Reencrypt {
    /// Reads the reencryption state of a header whose data area holds `device_size` bytes
    /// (the device size less the data offset).
    ///
    /// # Errors
    /// [`FormatError::Header`] for metadata that does not have cryptsetup's shape;
    /// [`FormatError::NotSupported`] for a data shift other than `--encrypt
    /// --reduce-device-size`'s (moved segment, backward) and cryptsetup < 2.4's metadata.
    pub fn load(json: &Json, device_size: u64) -> Result<Reencrypt, FormatError> {
        let reqs = requirements(json);
        let version = if reqs.iter().any(|r| r == REQUIREMENT_V3) {
            3
        } else {
            2
        };
        if !in_reencryption(json) {
            if reqs.iter().any(|r| r == "online-reencrypt") {
                return Err(unsupported(
                    "the requirement \"online-reencrypt\" of cryptsetup < 2.4 (resume it with that cryptsetup)".into(),
                ));
            }
            return Err(bad(format!(
                "config.requirements.mandatory does not contain \"{REQUIREMENT}\": no reencryption in progress"
            )));
        }
        let keyslots = field(json, "keyslots", "")?;
        let mut found = keyslots
            .members()
            .iter()
            .filter(|(_, k)| k.get("type").and_then(Json::as_str) == Some("reencrypt"));
        let (kid, ks) = found
            .next()
            .ok_or_else(|| bad("no keyslot of type \"reencrypt\"".into()))?;
        if found.next().is_some() {
            return Err(bad("more than one keyslot of type \"reencrypt\"".into()));
        }
        let keyslot: u32 = kid
            .parse()
            .map_err(|_| bad(format!("keyslot id {kid:?} is not a number")))?;
        let path = format!("keyslots.{kid}");
        let mode = str_of(ks, "mode", &path)?;
        let direction = str_of(ks, "direction", &path)?;
        let mode = Mode::parse(mode).ok_or_else(|| unsupported(format!("mode \"{mode}\"")))?;
        let direction = Direction::parse(direction)
            .ok_or_else(|| unsupported(format!("direction \"{direction}\"")))?;
        let area = field(ks, "area", &path)?;
        let apath = format!("{path}.area");
        let area_pos = (
            u64_of(area, "offset", &apath)?,
            u64_of(area, "size", &apath)?,
        );
        let resilience = match str_of(area, "type", &apath)? {
            "none" => Resilience::None,
            "journal" => Resilience::Journal,
            "checksum" => Self::checksum_of(area, &apath)?,
            "datashift" | "datashift-checksum" | "datashift-journal" => Resilience::Datashift {
                shift: u64_of(area, "shift_size", &apath)?,
            },
            other => return Err(unsupported(format!("resilience \"{other}\""))),
        };
        // The moved segment's hotzone of a decryption with a data shift is rewritten in
        // place: cryptsetup's secondary resilience.
        let moved_resilience = match str_of(area, "type", &apath)? {
            "datashift-checksum" => Some(Self::checksum_of(area, &apath)?),
            "datashift-journal" => Some(Resilience::Journal),
            _ => None,
        };
        let segments = field(json, "segments", "")?;
        let mut backup_old = None;
        let mut backup_new = None;
        let mut moved = None;
        let mut live: Vec<(u32, &Json)> = Vec::new();
        for (k, seg) in segments.members() {
            let id: u32 = k
                .parse()
                .map_err(|_| bad(format!("segment id {k:?} is not a number")))?;
            if has_flag(seg, FLAG_PREVIOUS) {
                backup_old = Some((id, seg));
            } else if has_flag(seg, FLAG_FINAL) {
                backup_new = Some((id, seg));
            } else if has_flag(seg, FLAG_MOVED) {
                moved = Some((id, seg));
            } else {
                live.push((id, seg));
            }
        }
        let (oid, oseg) = backup_old.ok_or_else(|| bad("no backup-previous segment".into()))?;
        let (nid, nseg) = backup_new.ok_or_else(|| bad("no backup-final segment".into()))?;
        let old = side_of(json, oid, oseg, mode == Mode::Encrypt)?;
        let new = side_of(json, nid, nseg, mode == Mode::Decrypt)?;
        let moved = match (&resilience, moved) {
            (Resilience::Datashift { shift }, Some((id, seg))) => Some(Self::moved_of(
                json, mode, direction, *shift, &old, &new, id, seg,
            )?),
            (Resilience::Datashift { .. }, None) => {
                return Err(unsupported(
                    "a data shift without a moved segment (--reduce-device-size with a \
                     detached header, or re-keying with a data shift)"
                        .into(),
                ))
            }
            (_, Some(_)) => {
                return Err(bad(
                    "a backup-moved-segment without the datashift resilience".into(),
                ))
            }
            (_, None) => None,
        };
        if moved.is_some() {
            // The data shift's offsets were checked by moved_of.
        } else if old.offset != new.offset
            || (!old.linear && !new.linear && old.iv_tweak != new.iv_tweak)
        {
            return Err(unsupported(
                "old and new data at different offsets (data shift)".into(),
            ));
        }
        // One digest on both sides is `--keep-key` (a new cipher or sector size, the same
        // key); none on either is no reencryption at all.
        if old.digest.is_none() && new.digest.is_none() {
            return Err(bad("neither backup segment is encrypted".into()));
        }
        live.sort_by_key(|(id, _)| *id);
        let backward = direction == Direction::Backward;
        if moved_resilience.is_some() != (moved.is_some() && mode == Mode::Decrypt) {
            return Err(bad(format!(
                "resilience \"{}\" with mode \"{mode}\"",
                str_of(area, "type", &apath)?
            )));
        }
        let progress = match &moved {
            Some(m) if mode == Mode::Decrypt => {
                Self::progress_decrypt_shifted(&live, &new, m, &resilience, device_size)?
            }
            Some(m) => Self::progress_shifted(json, &live, &new, m, &resilience)?,
            None => Self::progress_of(json, &live, &old, &new, device_size, backward)?,
        };
        Ok(Reencrypt {
            keyslot,
            mode,
            direction,
            area: area_pos,
            resilience,
            old,
            new,
            backup_old: oseg.clone(),
            backup_new: nseg.clone(),
            progress,
            moved_resilience,
            version,
            fixed_length: false,
            moved,
        })
    }

    /// Where a decryption with a data shift stands (`device_size` is the whole data
    /// device: the new side starts at 0). Bytes done count the plaintext written after
    /// the moved segment (`[S, S + done)`), then the moved segment itself last: the sum of
    /// the live linear segments, `dynamic` meaning all of it.
    fn progress_decrypt_shifted(
        live: &[(u32, &Json)],
        new: &Side,
        m: &Moved,
        resilience: &Resilience,
        device_size: u64,
    ) -> Result<Progress, FormatError> {
        let Resilience::Datashift { shift } = resilience else {
            return Err(bad("a moved segment without a data shift".into()));
        };
        let len = device_size.saturating_sub(*shift);
        if let Some((id, hot)) = live.iter().find(|(_, s)| has_flag(s, FLAG_HOT)) {
            let path = format!("segments.{id}");
            let offset = u64_of(hot, "offset", &path)?
                .checked_sub(new.offset)
                .ok_or_else(|| bad(format!("{path} starts before the data area")))?;
            let length = u64_of(hot, "size", &path)?;
            let fits = if offset == 0 {
                length == m.size
            } else {
                offset >= m.size && length <= *shift && offset + length <= len
            };
            if length == 0 || !fits {
                return Err(bad(format!(
                    "hotzone [{offset}, +{length}) is not one of a {shift}-byte data shift \
                     over {len} bytes"
                )));
            }
            return Ok(Progress::Crashed { offset, length });
        }
        let mut done = 0u64;
        for (id, seg) in live {
            if seg.get("type").and_then(Json::as_str) != Some("linear") {
                continue;
            }
            let path = format!("segments.{id}");
            done += match field(seg, "size", &path)? {
                Json::Str(t) if t == "dynamic" => {
                    // Everything from the linear segment's start to the end.
                    let at = u64_of(seg, "offset", &path)?.saturating_sub(new.offset);
                    if at == 0 {
                        len
                    } else {
                        len.saturating_sub(m.size)
                    }
                }
                _ => u64_of(seg, "size", &path)?,
            };
        }
        if done > len {
            return Err(bad(format!(
                "segments {:?} are not one of cryptsetup's data-shift layouts",
                live.iter().map(|(id, _)| *id).collect::<Vec<_>>()
            )));
        }
        Ok(Progress::Clean { done })
    }

    /// The `checksum` resilience of a keyslot area (`hash`, `sector_size`).
    fn checksum_of(area: &Json, apath: &str) -> Result<Resilience, FormatError> {
        let hash = str_of(area, "hash", apath)?.to_string();
        Hash::from_name(&hash)?;
        let ss = u64_of(area, "sector_size", apath)?;
        Ok(Resilience::Checksum {
            hash,
            sector_size: u32::try_from(ss)
                .ok()
                .filter(|s| s.is_power_of_two() && *s >= 512)
                .ok_or_else(|| {
                    bad(format!(
                        "{apath}.sector_size {ss} is not a power of two >= 512"
                    ))
                })?,
        })
    }

    /// The moved segment of a data shift, checked against the two layouts cryptsetup
    /// makes (and ucrypt runs): `--encrypt --reduce-device-size` (mode encrypt, backward,
    /// a linear copy of the first plaintext at the device's end) and cryptsetup 2.6's
    /// `--decrypt` of a device whose header is attached (mode decrypt, forward, the first
    /// ciphertext copied to the device's head, a crypt segment under the old key).
    #[allow(clippy::too_many_arguments)]
    fn moved_of(
        json: &Json,
        mode: Mode,
        direction: Direction,
        shift: u64,
        old: &Side,
        new: &Side,
        id: u32,
        seg: &Json,
    ) -> Result<Moved, FormatError> {
        let path = format!("segments.{id}");
        if mode == Mode::Decrypt && direction == Direction::Forward {
            // [moved ciphertext, size S][gap][old data from `shift`] -> plaintext from 0.
            let offset = u64_of(seg, "offset", &path)?;
            let size = u64_of(seg, "size", &path)?;
            let same = str_of(seg, "type", &path)? == "crypt"
                && u64_of(seg, "iv_tweak", &path)? == old.iv_tweak
                && str_of(seg, "encryption", &path)? == old.encryption
                && u64_of(seg, "sector_size", &path)? == u64::from(old.sector_size)
                && digests_of_segment(json, id) == old.digest.into_iter().collect::<Vec<_>>();
            if !same {
                return Err(bad(format!(
                    "{path} (the moved segment) is not the old key's first data"
                )));
            }
            if shift == 0 || shift % 512 != 0 || size == 0 || size > shift {
                return Err(bad(format!(
                    "data shift {shift} and moved segment size {size} are not cryptsetup's"
                )));
            }
            if new.offset + shift != old.offset || offset != new.offset {
                return Err(bad(format!(
                    "data shift {shift}: old data at {}, new at {}, moved copy at {offset} do \
                     not fit together",
                    old.offset, new.offset
                )));
            }
            return Ok(Moved {
                offset,
                size,
                json: seg.clone(),
            });
        }
        if mode != Mode::Encrypt || direction != Direction::Backward {
            return Err(unsupported(format!(
                "a data shift in mode \"{mode}\", direction \"{direction}\" (only \
                 --encrypt --reduce-device-size and --decrypt of an attached header are)"
            )));
        }
        if str_of(seg, "type", &path)? != "linear" {
            return Err(bad(format!("{path} (the moved segment) is not linear")));
        }
        let offset = u64_of(seg, "offset", &path)?;
        let size = u64_of(seg, "size", &path)?;
        if shift == 0 || shift % 512 != 0 || size == 0 || size > shift {
            return Err(bad(format!(
                "data shift {shift} and moved segment size {size} are not cryptsetup's"
            )));
        }
        if old.offset + shift != new.offset || new.iv_tweak != 0 || offset < shift {
            return Err(bad(format!(
                "data shift {shift}: old data at {}, new at {}, moved copy at {offset} do \
                 not fit together",
                old.offset, new.offset
            )));
        }
        Ok(Moved {
            offset,
            size,
            json: seg.clone(),
        })
    }

    /// The length of the data an encryption with a data shift encrypts: what lay before
    /// the moved copy, less the shift (the device's last `shift` bytes hold the copy).
    pub(super) fn shifted_length(m: &Moved, shift: u64) -> u64 {
        m.offset - shift
    }

    /// Where an encryption with a data shift stands: the plaintext left is the sum of the
    /// live linear segments (the moved copy among them), the hotzone the segment flagged.
    fn progress_shifted(
        json: &Json,
        live: &[(u32, &Json)],
        new: &Side,
        m: &Moved,
        resilience: &Resilience,
    ) -> Result<Progress, FormatError> {
        let Resilience::Datashift { shift } = resilience else {
            return Err(bad("a moved segment without a data shift".into()));
        };
        let len = Self::shifted_length(m, *shift);
        let fixed = |seg: &Json, id: u32| -> Result<u64, FormatError> {
            u64_of(seg, "size", &format!("segments.{id}"))
        };
        if let Some((id, hot)) = live.iter().find(|(_, s)| has_flag(s, FLAG_HOT)) {
            let path = format!("segments.{id}");
            let offset = u64_of(hot, "offset", &path)?
                .checked_sub(new.offset)
                .ok_or_else(|| bad(format!("{path} starts before the data area")))?;
            let length = fixed(hot, *id)?;
            if length == 0 || length > *shift || offset + length > len.max(*shift) {
                return Err(bad(format!(
                    "hotzone [{offset}, +{length}) is not one of a {shift}-byte data shift \
                     over {len} bytes"
                )));
            }
            return Ok(Progress::Crashed { offset, length });
        }
        let mut left = 0u64;
        for (id, seg) in live {
            match seg.get("type").and_then(Json::as_str) {
                Some("linear") => left += fixed(seg, *id)?,
                Some("crypt")
                    if digests_of_segment(json, *id)
                        == new.digest.into_iter().collect::<Vec<_>>() => {}
                _ => {
                    return Err(bad(format!(
                        "segments.{id} is neither plaintext nor under the new key"
                    )))
                }
            }
        }
        if live.is_empty() || left > len {
            return Err(bad(format!(
                "segments {:?} are not one of cryptsetup's data-shift layouts",
                live.iter().map(|(id, _)| *id).collect::<Vec<_>>()
            )));
        }
        Ok(Progress::Clean { done: len - left })
    }

    fn progress_of(
        json: &Json,
        live: &[(u32, &Json)],
        old: &Side,
        new: &Side,
        device_size: u64,
        backward: bool,
    ) -> Result<Progress, FormatError> {
        let at = |seg: &Json, id: u32| -> Result<u64, FormatError> {
            let off = u64_of(seg, "offset", &format!("segments.{id}"))?;
            off.checked_sub(new.offset)
                .ok_or_else(|| bad(format!("segments.{id} starts before the data area")))
        };
        let size = |seg: &Json, id: u32| -> Result<Option<u64>, FormatError> {
            let s = field(seg, "size", &format!("segments.{id}"))?;
            if s.as_str() == Some("dynamic") {
                Ok(None)
            } else {
                s.as_u64().map(Some).ok_or_else(|| {
                    bad(format!("segments.{id}.size is not a number or \"dynamic\""))
                })
            }
        };
        if let Some((id, hot)) = live.iter().find(|(_, s)| has_flag(s, FLAG_HOT)) {
            let offset = at(hot, *id)?;
            let length = size(hot, *id)?
                .ok_or_else(|| bad(format!("hotzone segments.{id} has no fixed size")))?;
            if length == 0 || offset + length > device_size {
                return Err(bad(format!(
                    "hotzone [{offset}, +{length}) does not lie in the {device_size}-byte data area"
                )));
            }
            return Ok(Progress::Crashed { offset, length });
        }
        // A segment of `side`: linear, or crypt bound to the side's digest alone.
        let is = |id: u32, seg: &Json, side: &Side| match side.digest {
            None => seg.get("type").and_then(Json::as_str) == Some("linear"),
            Some(d) => {
                seg.get("type").and_then(Json::as_str) == Some("crypt")
                    && digests_of_segment(json, id) == vec![d]
            }
        };
        match live {
            [(id, s)] if is(*id, s, old) && at(s, *id)? == 0 => Ok(Progress::Clean { done: 0 }),
            [(id, s)] if is(*id, s, new) && at(s, *id)? == 0 => {
                Ok(Progress::Clean { done: device_size })
            }
            // Backward: the part before the boundary is still old, the rest new.
            [(a, sa), (b, sb)] if backward && is(*a, sa, old) && is(*b, sb, new) => {
                let left = size(sa, *a)?
                    .ok_or_else(|| bad(format!("segments.{a} (old part) has no fixed size")))?;
                if at(sa, *a)? != 0 || at(sb, *b)? != left || left > device_size {
                    return Err(bad(format!(
                        "segments.{a} and segments.{b} do not meet at byte {left}"
                    )));
                }
                Ok(Progress::Clean {
                    done: device_size - left,
                })
            }
            [(a, sa), (b, sb)] if !backward && is(*a, sa, new) && is(*b, sb, old) => {
                let done = size(sa, *a)?
                    .ok_or_else(|| bad(format!("segments.{a} (done part) has no fixed size")))?;
                if at(sa, *a)? != 0 || at(sb, *b)? != done || done > device_size {
                    return Err(bad(format!(
                        "segments.{a} and segments.{b} do not meet at byte {done}"
                    )));
                }
                Ok(Progress::Clean { done })
            }
            _ => Err(bad(format!(
                "segments {:?} are not one of cryptsetup's reencryption layouts",
                live.iter().map(|(id, _)| *id).collect::<Vec<_>>()
            ))),
        }
    }
}
