//! Writing the segment list cryptsetup expects at each step: hot, post and final headers,
//! and the old key's keyslots taken away at the end.

use super::*;

/// A segment object the way `json_segment_create_crypt` (or `json_segment_create_linear`
/// for a linear side) builds it.
fn crypt_segment(side: &Side, at: u64, length: Option<u64>, hot: bool) -> Json {
    if side.linear {
        let mut m = vec![
            ("type".to_string(), Json::str("linear")),
            ("offset".to_string(), Json::u64_text(side.offset + at)),
            (
                "size".to_string(),
                length.map_or_else(|| Json::str("dynamic"), Json::u64_text),
            ),
        ];
        if hot {
            m.push(("flags".into(), Json::Arr(vec![Json::str(FLAG_HOT)])));
        }
        return Json::Obj(m);
    }
    let mut m = vec![
        ("type".to_string(), Json::str("crypt")),
        ("offset".to_string(), Json::u64_text(side.offset + at)),
        (
            "size".to_string(),
            length.map_or_else(|| Json::str("dynamic"), Json::u64_text),
        ),
        (
            "iv_tweak".to_string(),
            Json::u64_text(side.iv_tweak + (at >> 9)),
        ),
        ("encryption".to_string(), Json::str(&side.encryption)),
        (
            "sector_size".to_string(),
            Json::int(u64::from(side.sector_size)),
        ),
    ];
    if hot {
        m.push(("flags".into(), Json::Arr(vec![Json::str(FLAG_HOT)])));
    }
    Json::Obj(m)
}

fn requirements_json(config: &Json) -> Vec<Json> {
    match config.get("requirements").and_then(|r| r.get("mandatory")) {
        Some(Json::Arr(a)) => a.clone(),
        _ => Vec::new(),
    }
}

impl Reencrypt {
    /// Replaces the segments (and their digest bindings) with `list`, then the backup
    /// segments, binding in cryptsetup's order. Re-keying: the hotzone to both keys first,
    /// then every other segment in id order. Encryption and decryption (one key,
    /// `reencrypt_assign_segments_simple`): the key's backup segment first, then every
    /// crypt segment in id order.
    fn set_segments(&self, json: &mut Json, list: Vec<(Json, Option<u32>)>, hot: Option<usize>) {
        let mut segs: Vec<(String, Json)> = Vec::new();
        let mut bind: Vec<(u32, Option<u32>)> = Vec::new();
        let n = list.len() as u32;
        if self.mode != Mode::Reencrypt {
            if self.new.linear {
                bind.push((n, self.old.digest));
            } else {
                bind.push((n + 1, self.new.digest));
            }
            if self.decrypt_shifted().is_some() {
                // reencrypt_add_moved_segment: the moved segment (crypt, old key) next.
                bind.push((n + 2, self.old.digest));
            }
            let key = self.old.digest.or(self.new.digest);
            for (i, (seg, _)) in list.into_iter().enumerate() {
                if seg.get("type").and_then(Json::as_str) == Some("crypt") {
                    bind.push((i as u32, key));
                }
                segs.push((i.to_string(), seg));
            }
        } else {
            if let Some(h) = hot {
                bind.push((h as u32, self.new.digest));
                bind.push((h as u32, self.old.digest));
            }
            for (i, (seg, d)) in list.into_iter().enumerate() {
                if Some(i) != hot {
                    bind.push((i as u32, d));
                }
                segs.push((i.to_string(), seg));
            }
            bind.push((n, self.old.digest));
            bind.push((n + 1, self.new.digest));
        }
        segs.push((n.to_string(), self.backup_old.clone()));
        segs.push(((n + 1).to_string(), self.backup_new.clone()));
        if let Some(m) = &self.moved {
            // reencrypt_add_moved_segment: after the other two (linear: no digest).
            segs.push(((n + 2).to_string(), m.json.clone()));
        }
        json.set("segments", Json::Obj(segs));
        if let Some(Json::Obj(digests)) = json.get_mut("digests") {
            for (k, d) in digests.iter_mut() {
                let id: u32 = k.parse().unwrap_or(u32::MAX);
                let mut mine: Vec<Json> = Vec::new();
                // With --keep-key both sides bind the one digest: once per segment, as
                // LUKS2_digest_segment_assign leaves an assigned segment alone.
                for (seg, _) in bind.iter().filter(|(_, dd)| *dd == Some(id)) {
                    let v = Json::str(&seg.to_string());
                    if !mine.contains(&v) {
                        mine.push(v);
                    }
                }
                d.set("segments", Json::Arr(mine));
            }
        }
    }

    /// The segments while `[offset, offset + length)` is rewritten.
    pub fn set_hot(&self, json: &mut Json, offset: u64, length: u64, device_size: u64) {
        let mut list = Vec::new();
        if let Some((_, s)) = self.decrypt_shifted() {
            // reencrypt_make_hot_segments_decrypt_shift: the moved segment and the
            // plaintext done before the hotzone, the hotzone, the old data after it (a
            // shift higher); for the moved segment's hotzone, the plaintext after it.
            if offset > 0 {
                list.push((self.moved_crypt(), self.old.digest));
                if offset > s {
                    list.push((self.linear_new(s, Some(offset - s)), None));
                }
            }
            let hot = list.len();
            list.push((crypt_segment(&self.new, offset, Some(length), true), None));
            if offset == 0 {
                if device_size > s {
                    list.push((self.linear_new(s, None), None));
                }
            } else if offset + length < device_size {
                let at = offset + length;
                list.push((
                    crypt_segment(&self.old, at, self.rest(at, device_size), false),
                    self.old.digest,
                ));
            }
            self.set_segments(json, list, Some(hot));
            return;
        }
        if let Some((shift, _)) = self.shifted() {
            // reencrypt_make_hot_segments_encrypt_shift: the plaintext left before the
            // hotzone, the hotzone, the part already encrypted after it.
            let left = if offset == 0 {
                device_size.min(shift)
            } else {
                offset + length
            };
            if offset > 0 {
                list.extend(self.shifted_plaintext(offset));
            }
            let hot = list.len();
            list.push((
                crypt_segment(&self.new, offset, Some(length), true),
                self.new.digest,
            ));
            let done = device_size - left;
            if done > 0 {
                list.push((
                    crypt_segment(&self.new, left, Some(done), false),
                    self.new.digest,
                ));
            }
            self.set_segments(json, list, Some(hot));
            return;
        }
        if self.backward() {
            if offset > 0 {
                list.push((
                    crypt_segment(&self.old, 0, Some(offset), false),
                    self.old.digest,
                ));
            }
            let hot = list.len();
            list.push((
                crypt_segment(&self.new, offset, Some(length), true),
                self.new.digest,
            ));
            if offset + length < device_size {
                list.push((
                    crypt_segment(
                        &self.new,
                        offset + length,
                        self.rest(offset + length, device_size),
                        false,
                    ),
                    self.new.digest,
                ));
            }
            self.set_segments(json, list, Some(hot));
            return;
        }
        if offset > 0 {
            list.push((
                crypt_segment(&self.new, 0, Some(offset), false),
                self.new.digest,
            ));
        }
        let hot = list.len();
        list.push((
            crypt_segment(&self.new, offset, Some(length), true),
            self.new.digest,
        ));
        if offset + length < device_size {
            list.push((
                crypt_segment(
                    &self.old,
                    offset + length,
                    self.rest(offset + length, device_size),
                    false,
                ),
                self.old.digest,
            ));
        }
        self.set_segments(json, list, Some(hot));
    }

    /// The segments once `done` bytes are under the new key (`[0, done)` forward, the last
    /// `done` bytes backward).
    pub fn set_done(&self, json: &mut Json, done: u64, device_size: u64) {
        let mut list = Vec::new();
        if let Some((_, s)) = self.decrypt_shifted() {
            // _dec_create_segments_shift_after: the moved segment, the plaintext done
            // after it (`dynamic` once it reaches the end), the old data left; once the
            // moved segment is done, one linear segment.
            if done >= device_size {
                list.push((self.linear_new(0, None), None));
            } else {
                list.push((self.moved_crypt(), self.old.digest));
                let left = device_size - s - done;
                if done > 0 {
                    let size = (left > 0).then_some(done);
                    list.push((self.linear_new(s, size), None));
                }
                if left > 0 {
                    let at = s + done;
                    list.push((
                        crypt_segment(&self.old, at, self.rest(at, device_size), false),
                        self.old.digest,
                    ));
                }
            }
            self.set_segments(json, list, None);
            return;
        }
        if self.shifted().is_some() {
            // _enc_create_segments_shift_after: the plaintext left, then one segment
            // under the new key (`dynamic` once nothing is left).
            let left = device_size - done;
            if left == 0 {
                list.push((crypt_segment(&self.new, 0, None, false), self.new.digest));
            } else {
                list.extend(self.shifted_plaintext(left));
                if done > 0 {
                    list.push((
                        crypt_segment(&self.new, left, Some(done), false),
                        self.new.digest,
                    ));
                }
            }
            self.set_segments(json, list, None);
            return;
        }
        if self.backward() && done > 0 && done < device_size {
            let left = device_size - done;
            list.push((
                crypt_segment(&self.old, 0, Some(left), false),
                self.old.digest,
            ));
            list.push((
                crypt_segment(&self.new, left, self.rest(left, device_size), false),
                self.new.digest,
            ));
        } else if done >= device_size {
            list.push((crypt_segment(&self.new, 0, None, false), self.new.digest));
        } else if done == 0 {
            list.push((crypt_segment(&self.old, 0, None, false), self.old.digest));
        } else {
            list.push((
                crypt_segment(&self.new, 0, Some(done), false),
                self.new.digest,
            ));
            list.push((
                crypt_segment(&self.old, done, self.rest(done, device_size), false),
                self.old.digest,
            ));
        }
        self.set_segments(json, list, None);
    }

    /// The moved segment of a decryption with a data shift as a live segment: its backup
    /// without the flag.
    fn moved_crypt(&self) -> Json {
        let mut seg = self
            .moved
            .as_ref()
            .map(|m| m.json.clone())
            .unwrap_or(Json::Null);
        seg.remove("flags");
        seg
    }

    /// A linear segment of the new side from data-area byte `at` (`dynamic` without a
    /// size).
    fn linear_new(&self, at: u64, size: Option<u64>) -> Json {
        Json::Obj(vec![
            ("type".to_string(), Json::str("linear")),
            ("offset".to_string(), Json::u64_text(self.new.offset + at)),
            (
                "size".to_string(),
                size.map_or_else(|| Json::str("dynamic"), Json::u64_text),
            ),
        ])
    }

    /// With a data shift, the linear segments of the first `left` plaintext bytes: the
    /// moved copy (logical `[0, shift)`), then the rest where it always was.
    fn shifted_plaintext(&self, left: u64) -> Vec<(Json, Option<u32>)> {
        let Some((shift, m)) = self.shifted() else {
            return Vec::new();
        };
        let linear = |offset: u64, size: u64| {
            Json::Obj(vec![
                ("type".to_string(), Json::str("linear")),
                ("offset".to_string(), Json::u64_text(offset)),
                ("size".to_string(), Json::u64_text(size)),
            ])
        };
        let mut out = vec![(linear(m.offset, m.size), None)];
        if left > shift {
            out.push((linear(self.old.offset + shift, left - shift), None));
        }
        out
    }

    /// The keyslots of the old key (destroyed at the end), with their areas.
    pub fn old_keyslots(&self, json: &Json) -> Vec<(u32, u64, u64)> {
        let mut out = Vec::new();
        let Some(digests) = json.get("digests") else {
            return out;
        };
        let Some(old) = self.old.digest.filter(|&d| Some(d) != self.new.digest) else {
            // No old key, or the same key kept (--keep-key): no keyslot goes.
            return out;
        };
        let Some(d) = digests.get(&old.to_string()) else {
            return out;
        };
        for ks in ids(d.get("keyslots")) {
            if ks == self.keyslot {
                continue;
            }
            if let Some(area) = json
                .get("keyslots")
                .and_then(|k| k.get(&ks.to_string()))
                .and_then(|k| k.get("area"))
            {
                if let (Some(o), Some(s)) = (
                    area.get("offset").and_then(Json::as_u64),
                    area.get("size").and_then(Json::as_u64),
                ) {
                    out.push((ks, o, s));
                }
            }
        }
        out
    }

    /// Removes keyslot `id` as `crypt_keyslot_destroy` does (after its area was wiped):
    /// the object, its place in digests and tokens, and digests left with neither keyslots
    /// nor segments.
    pub fn destroy_keyslot(json: &mut Json, id: u32) {
        if let Some(k) = json.get_mut("keyslots") {
            k.remove(&id.to_string());
        }
        let drop_id = |a: &mut Json| {
            if let Json::Arr(v) = a {
                v.retain(|x| x.as_u64() != Some(u64::from(id)));
            }
        };
        for section in ["digests", "tokens"] {
            if let Some(Json::Obj(m)) = json.get_mut(section) {
                for (_, o) in m.iter_mut() {
                    if let Some(a) = o.get_mut("keyslots") {
                        drop_id(a);
                    }
                }
            }
        }
        if let Some(Json::Obj(m)) = json.get_mut("digests") {
            m.retain(|(_, d)| {
                !(ids(d.get("keyslots")).is_empty() && ids(d.get("segments")).is_empty())
            });
        }
    }

    /// The last metadata change: backup segments, the requirement and the reencrypt
    /// keyslot go (its area must have been wiped), segment 0 alone stays, bound to the new
    /// key.
    pub fn finish(&self, json: &mut Json) {
        let seg0 = crypt_segment(&self.new, 0, None, false);
        json.set("segments", Json::Obj(vec![("0".into(), seg0)]));
        if let Some(Json::Obj(digests)) = json.get_mut("digests") {
            for (k, d) in digests.iter_mut() {
                let mine = if self.new.digest.is_some_and(|d| k.parse() == Ok(d)) {
                    vec![Json::str("0")]
                } else {
                    Vec::new()
                };
                d.set("segments", Json::Arr(mine));
            }
        }
        if let Some(config) = json.get_mut("config") {
            let left: Vec<Json> = requirements_json(config)
                .into_iter()
                .filter(|r| r.as_str() != Some(REQUIREMENT) && r.as_str() != Some(REQUIREMENT_V3))
                .collect();
            if left.is_empty() {
                config.remove("requirements");
            } else if let Some(r) = config.get_mut("requirements") {
                r.set("mandatory", Json::Arr(left));
            }
        }
        if self.shifted().is_some() {
            // reencrypt_teardown_ok's LUKS2_set_keyslots_size: the keyslots area runs to
            // the data offset (less both metadata copies, at most 128 MiB, 4 KiB units).
            let json_size = json
                .get("config")
                .and_then(|c| c.get("json_size"))
                .and_then(Json::as_u64);
            if let Some(js) = json_size {
                let min = 2 * (js + 4096);
                if let Some(size) = self.new.offset.checked_sub(min) {
                    let size = size.min(0x800_0000);
                    if let Some(config) = json.get_mut("config") {
                        config.set("keyslots_size", Json::u64_text(size - size % 4096));
                    }
                }
            }
        }
        Self::destroy_keyslot(json, self.keyslot);
    }
}
