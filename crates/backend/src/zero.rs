//! A device of zeros that swallows writes, like dm-zero (`drivers/md/dm-zero.c`).
//!
//! dm-zero "returns blocks of zeros on reads" and "discards" writes
//! (`Documentation/admin-guide/device-mapper/zero.rst`). It costs no memory and no I/O,
//! which makes it the control in benchmarks: encrypting onto a `ZeroBackend` measures the
//! crypto and the engine with storage taken out. Reads after writes still return zeros,
//! so of the conformance suite (`testing`) it passes the check that needs no data
//! read back (zero-length requests); the others fail by design.

use crate::{
    check_range, emulate, Backend, BackendError, BackendInfo, Caps, Hints, Io, IoKind, Support,
};

/// Reads zeros, accepts and drops writes. See the [module docs](self).
#[derive(Debug)]
pub struct ZeroBackend {
    info: BackendInfo,
}

impl ZeroBackend {
    /// A zero device of `size_bytes`.
    pub fn new(size_bytes: u64) -> Self {
        Self {
            info: BackendInfo {
                size_bytes,
                logical_block: 512,
                physical_block: 4096,
                optimal_block: 4096,
                caps: Caps {
                    // Nothing is ever stored, so nothing needs writing back.
                    flush: Support::None,
                    // dm-zero accepts discards (and so write-zeroes) and ignores them.
                    discard: Support::Native,
                    write_zeroes: Support::Native,
                    read_only: false,
                },
            },
        }
    }
}

impl Backend for ZeroBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    /// Reads zeroes; writes, discards and write-zeroes vanish.
    fn submit(&self, io: Io<'_>) -> Result<(), BackendError> {
        check_range(io.offset, io.kind.len(), self.info.size_bytes)?;
        match io.kind {
            IoKind::Read(buf) => buf.fill(0),
            IoKind::Write(_) | IoKind::WriteOwned(_) => {}
            IoKind::Discard(_) | IoKind::WriteZeroes(_) => {}
            IoKind::Lend { .. } | IoKind::Modify { .. } | IoKind::Holes { .. } => {
                return emulate::fallback(self, io)
            }
        }
        Ok(())
    }

    /// A no-op (caps say [`Support::None`]).
    fn flush(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn hints(&self) -> Hints {
        Hints {
            local: true,
            ..Hints::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WriteOp;

    #[test]
    fn reads_zeros_even_after_writes() {
        let z = ZeroBackend::new(1 << 20);
        z.write_at(&[0xaa; 4096], 4096, true).unwrap();
        z.submit_writes(&[WriteOp {
            offset: 0,
            buf: &[0xbb; 8192],
            fua: false,
        }])
        .unwrap();
        let mut buf = vec![0xffu8; 16384];
        z.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn rejects_requests_past_the_end() {
        let z = ZeroBackend::new(1 << 20);
        let mut buf = [0u8; 512];
        assert!(matches!(
            z.read_at(&mut buf, (1 << 20) - 511),
            Err(BackendError::OutOfRange { .. })
        ));
        assert!(matches!(
            z.write_at(&buf, 1 << 20, false),
            Err(BackendError::OutOfRange { .. })
        ));
        assert!(matches!(
            z.discard(u64::MAX, 2),
            Err(BackendError::OutOfRange { .. })
        ));
        assert!(matches!(
            z.write_zeroes(0, (1 << 20) + 1, false),
            Err(BackendError::OutOfRange { .. })
        ));
    }

    #[test]
    fn accepts_flush_discard_and_write_zeroes() {
        let z = ZeroBackend::new(1 << 20);
        z.flush().unwrap();
        z.discard(0, 1 << 20).unwrap();
        z.write_zeroes(512, 1024, true).unwrap();
        assert_eq!(z.info().size_bytes, 1 << 20);
        assert_eq!(z.info().caps.flush, Support::None);
    }

    /// The conformance check that needs no data read back: zero-length requests (the
    /// others, range checks included, verify written data, which dm-zero drops by design;
    /// its range checks are `rejects_requests_past_the_end` above).
    #[test]
    fn passes_the_conformance_checks_that_apply() {
        let z = ZeroBackend::new(1 << 20);
        crate::testing::accepts_zero_length(&z);
    }

    #[test]
    fn reads_of_any_length_return_zeros() {
        let z = ZeroBackend::new(u64::MAX);
        let mut buf = vec![1u8; 3];
        z.read_at(&mut buf, u64::MAX - 3).unwrap();
        assert_eq!(buf, [0, 0, 0]);
    }
}
