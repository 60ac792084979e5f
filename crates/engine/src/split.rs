//! Cutting a byte range into a partial head sector, whole body sectors and a partial tail
//! sector. Written once (nbdkit's luks filter writes this three times) and property-tested.

/// A byte range split at sector boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Partial first sector: (sector start in bytes, offset inside it, length).
    pub head: Option<Partial>,
    /// Whole sectors: byte offset of the first and total length (a multiple of the size).
    pub body: Option<(u64, u64)>,
    /// Partial last sector.
    pub tail: Option<Partial>,
}

/// Part of one sector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partial {
    /// Byte offset of the sector.
    pub sector_start: u64,
    /// Offset of the range inside the sector.
    pub skip: usize,
    /// Length of the range inside the sector.
    pub len: usize,
}

/// Splits `[offset, offset + len)` for sectors of `sector` bytes (a power of two).
pub fn split(offset: u64, len: u64, sector: u64) -> Split {
    let mut out = Split {
        head: None,
        body: None,
        tail: None,
    };
    if len == 0 {
        return out;
    }
    let end = offset + len;
    let mask = sector - 1;
    let first_whole = (offset + mask) & !mask;
    let last_whole = end & !mask;
    let one_sector = offset & !mask == (end - 1) & !mask;
    if one_sector && (offset & mask != 0 || end & mask != 0) {
        out.head = Some(Partial {
            sector_start: offset & !mask,
            skip: (offset & mask) as usize,
            len: len as usize,
        });
        return out;
    }
    if offset & mask != 0 {
        out.head = Some(Partial {
            sector_start: offset & !mask,
            skip: (offset & mask) as usize,
            len: (first_whole - offset) as usize,
        });
    }
    if last_whole > first_whole {
        out.body = Some((first_whole, last_whole - first_whole));
    }
    if end & mask != 0 {
        out.tail = Some(Partial {
            sector_start: last_whole,
            skip: 0,
            len: (end - last_whole) as usize,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn aligned_range_is_all_body() {
        assert_eq!(
            split(4096, 8192, 4096),
            Split {
                head: None,
                body: Some((4096, 8192)),
                tail: None
            }
        );
    }

    #[test]
    fn range_inside_one_sector_is_a_head() {
        let s = split(10, 20, 512);
        assert_eq!(
            s.head,
            Some(Partial {
                sector_start: 0,
                skip: 10,
                len: 20
            })
        );
        assert_eq!((s.body, s.tail), (None, None));
    }

    proptest! {
        #[test]
        fn pieces_cover_the_range_exactly_once(offset in 0u64..100_000, len in 0u64..50_000, shift in 9u32..17) {
            let sector = 1u64 << shift;
            let s = split(offset, len, sector);
            let mut pieces: Vec<(u64, u64)> = Vec::new();
            if let Some(h) = s.head {
                prop_assert!(h.skip + h.len <= sector as usize && h.len > 0);
                prop_assert_eq!(h.sector_start % sector, 0);
                pieces.push((h.sector_start + h.skip as u64, h.len as u64));
            }
            if let Some((o, l)) = s.body {
                prop_assert!(o % sector == 0 && l % sector == 0 && l > 0);
                pieces.push((o, l));
            }
            if let Some(t) = s.tail {
                prop_assert!(t.skip == 0 && t.len > 0 && (t.len as u64) < sector);
                pieces.push((t.sector_start, t.len as u64));
            }
            let mut pos = offset;
            for (o, l) in pieces {
                prop_assert_eq!(o, pos);
                pos += l;
            }
            prop_assert_eq!(pos, offset + len);
        }
    }
}
