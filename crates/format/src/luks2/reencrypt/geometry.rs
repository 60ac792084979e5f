//! Where the hotzone is: offsets, lengths and progress in both directions, with and without
//! a data shift.

use super::*;

impl Reencrypt {
    /// The bytes the data pass covers: with a data shift, the data before the moved copy
    /// less the shift; otherwise `device_size` (the data area).
    pub fn data_length(&self, device_size: u64) -> u64 {
        if let Some((shift, _)) = self.decrypt_shifted() {
            // The device less the shift: its last `shift` bytes held nothing.
            return device_size.saturating_sub(shift);
        }
        match (&self.moved, &self.resilience) {
            (Some(m), Resilience::Datashift { shift }) => Self::shifted_length(m, *shift),
            _ => device_size,
        }
    }

    /// The data shift (bytes) and its moved copy, for an encryption with a data shift.
    pub(super) fn shifted(&self) -> Option<(u64, &Moved)> {
        match (&self.resilience, &self.moved) {
            (Resilience::Datashift { shift }, Some(m)) if self.mode == Mode::Encrypt => {
                Some((*shift, m))
            }
            _ => None,
        }
    }

    /// The data shift (bytes) and its moved segment, for a decryption with a data shift
    /// (cryptsetup 2.6's `--decrypt` of a device whose header was attached).
    ///
    /// ```text
    ///  device  [old ciphertext 0..S (moved)][gap][old ciphertext S.. from `shift` + S]
    ///  hotzones [S, S + shift), [S + shift, ...) forward: plaintext at x from old at
    ///           shift + x; then [0, S) in place (the moved segment's own resilience)
    /// ```
    pub fn decrypt_shifted(&self) -> Option<(u64, u64)> {
        match (&self.resilience, &self.moved) {
            (Resilience::Datashift { shift }, Some(m)) if self.mode == Mode::Decrypt => {
                Some((*shift, m.size))
            }
            _ => None,
        }
    }

    /// The resilience that protects the hotzone at `offset`: the moved segment's own
    /// (checksum or journal) for a decryption's last hotzone, rewritten in place.
    pub fn resilience_at(&self, offset: u64) -> &Resilience {
        match (&self.moved_resilience, self.decrypt_shifted()) {
            (Some(r), Some(_)) if offset == 0 => r,
            _ => &self.resilience,
        }
    }

    /// The bytes a decryption with a data shift covers before its moved segment's hotzone
    /// (which [`Reencrypt::next_hotzone`] gives once they are done); the data length
    /// otherwise.
    pub fn shifted_part(&self, device_size: u64) -> u64 {
        match self.decrypt_shifted() {
            Some((_, s)) => device_size.saturating_sub(s),
            None => device_size,
        }
    }

    /// The device offset of the old data of data-area byte `at` (the start of a hotzone):
    /// with a data shift, the moved copy for the hotzone at 0.
    pub fn old_offset(&self, at: u64) -> u64 {
        match self.shifted() {
            Some((_, m)) if at == 0 => m.offset,
            _ => match &self.moved {
                Some(m) if at == 0 && self.mode == Mode::Decrypt => m.offset,
                _ => self.old.offset + at,
            },
        }
    }

    /// The hotzone length cryptsetup's resilience allows at `offset`, at most `max` bytes,
    /// aligned to the larger sector size (and the checksum block).
    pub fn hotzone_length(&self, offset: u64, device_size: u64, max: u64) -> u64 {
        let mut align = u64::from(self.old.sector_size.max(self.new.sector_size));
        let mut cap = max;
        match &self.resilience {
            Resilience::Checksum { hash, sector_size } => {
                let hlen = Hash::from_name(hash).map(|h| h.size()).unwrap_or(32) as u64;
                cap = cap.min(self.area.1 / hlen * u64::from(*sector_size));
                align = align.max(u64::from(*sector_size));
            }
            Resilience::Journal => cap = cap.min(self.area.1),
            Resilience::Datashift { shift } => cap = *shift,
            Resilience::None => {}
        }
        let cap = (cap / align * align).max(align);
        cap.min(device_size.saturating_sub(offset))
    }

    /// Whether the run goes from the end of the data area to its start.
    pub fn backward(&self) -> bool {
        self.direction == Direction::Backward
    }

    /// The next hotzone once `done` bytes are done: (offset, length) as cryptsetup's
    /// `reencrypt_offset` places it (forward: at `done`; backward: ending where the done
    /// part at the end begins).
    pub fn next_hotzone(&self, done: u64, device_size: u64, max: u64) -> (u64, u64) {
        if let Some((shift, s)) = self.decrypt_shifted() {
            // reencrypt_offset_forward_moved and reencrypt_context_update: a shift at a
            // time after the moved segment (the last one shorter), then the moved one.
            return if done + s >= device_size {
                (0, s)
            } else {
                let at = s + done;
                (at, shift.min(device_size - at))
            };
        }
        if let Some((shift, _)) = self.shifted() {
            // cryptsetup's reencrypt_offset_backward_moved: the hotzone is the shift (the
            // hotzone size asked for does not apply), the one before the moved copy's may
            // be shorter, the last is the moved copy's.
            let left = device_size.saturating_sub(done);
            return if left <= shift {
                (0, shift)
            } else if left - shift < shift {
                (shift, left - shift)
            } else {
                (left - shift, shift)
            };
        }
        if self.backward() {
            let left = device_size.saturating_sub(done);
            let len = self.hotzone_length(0, left, max);
            (left - len, len)
        } else {
            (done, self.hotzone_length(done, device_size, max))
        }
    }

    /// Bytes done once the hotzone `[offset, offset + length)` is.
    pub fn done_after(&self, offset: u64, length: u64, device_size: u64) -> u64 {
        if let Some((_, s)) = self.decrypt_shifted() {
            return if offset == 0 {
                device_size
            } else {
                offset + length - s
            };
        }
        if self.shifted().is_some() {
            return device_size.saturating_sub(offset);
        }
        if self.backward() {
            device_size - offset
        } else {
            offset + length
        }
    }

    /// Bytes done before the hotzone `[offset, offset + length)`.
    pub fn done_before(&self, offset: u64, length: u64, device_size: u64) -> u64 {
        if let Some((_, s)) = self.decrypt_shifted() {
            return if offset == 0 {
                device_size - s
            } else {
                offset - s
            };
        }
        if let Some((shift, _)) = self.shifted() {
            return if offset == 0 {
                device_size.saturating_sub(shift)
            } else {
                device_size.saturating_sub(offset + length)
            };
        }
        if self.backward() {
            device_size - offset - length
        } else {
            offset
        }
    }

    /// The size of a segment from `at` to the end: `dynamic`, or fixed in fixed-length mode.
    pub(super) fn rest(&self, at: u64, device_size: u64) -> Option<u64> {
        self.fixed_length.then_some(device_size - at)
    }
}
